"""Consumers of one group in several processes: the writer's process and
read-only followers commit to the same ``config/consumerOffset.json``, none
of their commits lost, a follower killed with SIGKILL re-delivers at most
what it had not committed, and every message is processed."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import no_hang
from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.service.group import allocate_averagely

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(mapped_file_size_commit_log=1 << 18, mapped_file_size_consume_queue=20 * 256,
           max_hash_slot_num=64, max_index_num=512)
N = 150  # messages per queue
QUEUES = 4

FOLLOWER = textwrap.dedent("""
    import math, sys
    from rmqstore import MessageStore
    root, journal, queues, n = sys.argv[1], sys.argv[2], [int(q) for q in sys.argv[3].split(",")], int(sys.argv[4])
    done = {}
    with MessageStore.open(root, read_only=True) as store, open(journal, "a") as out:
        print("open", flush=True)
        c = store.consumer("G", "T", queue_ids=queues, wait_ms=math.inf)
        for m in c:
            out.write(f"{m.queue_id}:{m.queue_offset}\\n")
            out.flush()  # processed
            done[m.queue_id] = m.queue_offset + 1
            if all(done.get(q) == n for q in queues):
                c.commit()
                break
        c.close()
""")


def start_follower(root, journal, queues):
    p = subprocess.Popen(
        [sys.executable, "-c", FOLLOWER, str(root), str(journal), ",".join(map(str, queues)), str(N)],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    assert p.stdout.readline().strip() == "open"
    return p


def journal_of(path) -> list:
    with open(path) as fh:
        return [tuple(map(int, line.split(":"))) for line in fh if line.endswith("\n")]


@pytest.mark.parametrize("kill", [False, True], ids=["clean", "kill-9"])
def test_a_group_spread_over_processes_processes_everything_and_loses_no_commit(tmp_path, kill):
    root = tmp_path / "s"
    with no_hang(120), MessageStore.open(root, StoreConfig(**CFG)) as store:
        store.put_message(Message("T", b"first", queue_id=0))  # (the queue exists before the followers look)
        a = start_follower(root, tmp_path / "a.txt", [0, 1])
        b = start_follower(root, tmp_path / "b.txt", [2])
        mine = store.consumer("G", "T", queue_ids=[3], wait_ms=0)
        seen_here = []
        for i in range(1, N * QUEUES):
            store.put_message(Message("T", b"m%d" % i, queue_id=i % QUEUES))
            if i % 50 == 0:
                seen_here += [(m.queue_id, m.queue_offset) for m in mine]  # the writer's own member: queue 3
            if kill and i == N * QUEUES // 2:
                while len(journal_of(tmp_path / "a.txt")) < 20:
                    time.sleep(0.01)
                a.send_signal(signal.SIGKILL)
                a.wait()
                a = start_follower(root, tmp_path / "a.txt", [0, 1])  # a new member takes over its queues
        seen_here += [(m.queue_id, m.queue_offset) for m in mine]
        mine.close()
        assert a.wait(60) == 0 and b.wait(60) == 0
        assert store.consumer_offsets().get_all("G", "T") == {q: N for q in range(QUEUES)}
    with open(root / "config" / "consumerOffset.json") as fh:
        assert json.load(fh)["offsetTable"] == {"T@G": {str(q): N for q in range(QUEUES)}}
    processed = journal_of(tmp_path / "a.txt") + journal_of(tmp_path / "b.txt") + seen_here
    assert set(processed) == {(q, o) for q in range(QUEUES) for o in range(N)}  # at least once
    redelivered = len(processed) - QUEUES * N
    assert redelivered == 0 if not kill else redelivered <= 1  # the one in flight at the kill, at most


MEMBER = textwrap.dedent("""
    import math, os, sys, time
    from rmqstore import MessageStore
    root, journal = sys.argv[1], sys.argv[2]
    with MessageStore.open(root, read_only=True) as store, open(journal, "a") as out:
        c = store.consumer("G", "T", wait_ms=math.inf)
        print("open", flush=True)
        try:
            for m in c:
                out.write(f"B {m.queue_id} {m.queue_offset} {time.monotonic()}\\n")
                out.flush()
                time.sleep(0.002)  # processing
                out.write(f"E {m.queue_id} {m.queue_offset} {time.monotonic()}\\n")
                out.flush()
        except KeyboardInterrupt:
            pass
        finally:
            c.close()
""")


def start_member(root, journal):
    p = subprocess.Popen(
        [sys.executable, "-c", MEMBER, str(root), str(journal)], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    assert p.stdout.readline().strip() == "open"
    return p


def intervals(path, end_of_life) -> list:
    """``[((queue, offset), begin, end)]`` of a member's journal; a message it
    began and never ended (killed) lasts until *end_of_life*."""
    began, out = {}, []
    with open(path) as fh:
        for line in fh:
            if not line.endswith("\n"):
                continue
            kind, q, o, t = line.split()
            key = (int(q), int(o))
            if kind == "B":
                began[key] = float(t)
            else:
                out.append((key, began.pop(key), float(t)))
    out += [(key, t, end_of_life) for key, t in began.items()]
    return out


def test_members_share_a_group_rebalance_on_join_and_death_and_never_overlap(tmp_path):
    """Members join, one is killed with SIGKILL: the queues are divided
    among the live members, every message is processed, no message is in
    the hands of two live members at once, and only the killed member's
    in-flight message is processed twice."""
    root = tmp_path / "s"
    queues, per = 8, 120
    with no_hang(120), MessageStore.open(root, StoreConfig(**CFG)) as store:
        for q in range(queues):  # (every queue exists before the members divide them)
            store.put_message(Message("T", b"m", queue_id=q))
        journals = {n: tmp_path / f"{n}.txt" for n in "abc"}
        members = {n: start_member(root, journals[n]) for n in "ab"}
        killed_at = None
        for i in range(queues, queues * per):
            store.put_message(Message("T", b"m%d" % i, queue_id=i % queues))
            time.sleep(0.002)
            if i == queues * per // 3:
                members["c"] = start_member(root, journals["c"])  # joins: a and b hand queues over
            # b is killed in the last third once it is at work (puts go on
            # meanwhile: a member takes its share at its next look at the
            # group, ~1 s, and a drained queue gives it nothing to begin)
            if killed_at is None and i >= 2 * queues * per // 3 and journal_of_begins(journals["b"]):
                members["b"].send_signal(signal.SIGKILL)
                members["b"].wait()
                killed_at = time.monotonic()  # (its locks are released once it is reaped)
        assert killed_at is not None, "b never began a message of its share"
        offsets = store.consumer_offsets()
        deadline = time.monotonic() + 60
        while offsets.get_all("G", "T") != {q: per for q in range(queues)}:
            assert time.monotonic() < deadline, offsets.get_all("G", "T")
            time.sleep(0.05)
        stopped = time.monotonic()
        for n in "ac":
            members[n].send_signal(signal.SIGINT)
            assert members[n].wait(30) == 0
    spans = intervals(journals["a"], stopped) + intervals(journals["b"], killed_at) + intervals(journals["c"], stopped)
    done = [key for key, _b, _e in spans]
    assert set(done) == {(q, o) for q in range(queues) for o in range(per)}  # every message processed
    assert len(done) - len(set(done)) <= 1  # the killed member's in-flight message, at most
    by_key: dict = {}
    for key, b, e in spans:
        by_key.setdefault(key, []).append((b, e))
    for key, spans_of in by_key.items():
        spans_of.sort()
        for (_b1, e1), (b2, _e2) in itertools.pairwise(spans_of):
            assert e1 <= b2, f"{key} was processed by two members at once"
    assert {n for n in "ac" if intervals(journals[n], stopped)} == {"a", "c"}  # both had a share
    leases = root / "config" / "consumerLeases" / "T%40G"
    assert [f for f in os.listdir(leases) if f.startswith("member-")] == []  # b's removed by a live member


def journal_of_begins(path) -> bool:
    try:
        with open(path) as fh:
            return any(line.startswith("B") for line in fh)
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("n_queues,n_members,want", [
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),  # the first 8 % 3 members one more
    (3, 5, [[0], [1], [2], [], []]),  # members past the queues get none
    (4, 2, [[0, 1], [2, 3]]),
    (5, 1, [[0, 1, 2, 3, 4]]),
    (0, 2, [[], []]),
])
def test_allocate_averagely_is_rocketmqs(n_queues, n_members, want):
    members = [f"m{i}" for i in range(n_members)]
    got = [allocate_averagely(list(range(n_queues)), members, m) for m in members]
    assert got == want
    assert sorted(q for share in got for q in share) == list(range(n_queues))  # each queue once
    assert allocate_averagely(list(range(n_queues)), members, "stranger") == []


def test_members_in_one_process_divide_the_queues_and_take_over_on_close(tmp_path):
    with no_hang(30), MessageStore.open(tmp_path / "s", StoreConfig(**CFG)) as s:
        for q in range(4):
            for i in range(3):
                s.put_message(Message("T", b"%d-%d" % (q, i), queue_id=q))
        a = s.consumer("G", "T", wait_ms=0)
        b = s.consumer("G", "T", wait_ms=0)
        a._rebalance()  # (a looked before b joined: its next look, due in a second, made now;
        b._rebalance()  # b's look again once a let go, due in 50 ms)
        got_a = {(m.queue_id, m.queue_offset) for m in a}
        got_b = {(m.queue_id, m.queue_offset) for m in b}
        assert not got_a & got_b and got_a | got_b == {(q, i) for q in range(4) for i in range(3)}
        assert {q for q, _ in got_a} == set(a.committed()) and len(got_a) == len(got_b) == 6
        b.close()  # leaves: its queues go to a at a's next look
        for q in range(4):
            s.put_message(Message("T", b"late", queue_id=q))
        a._rebalance()
        assert sorted((m.queue_id, m.queue_offset) for m in a) == [(q, 3) for q in range(4)]
        a.close()
    leases = os.listdir(tmp_path / "s" / "config" / "consumerLeases" / "T%40G")
    assert sorted(leases) == [f"queue-{q}" for q in range(4)]  # members left: no member file stays
