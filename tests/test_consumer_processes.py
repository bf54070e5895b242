"""Consumers of one group in several processes: the writer's process and
read-only followers commit to the same ``config/consumerOffset.json``, none
of their commits lost, a follower killed with SIGKILL re-delivers at most
what it had not committed, and every message is processed."""

from __future__ import annotations

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
