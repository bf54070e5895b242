"""kill -9 proofs: every acknowledged put survives a SIGKILL, and recovery
leaves queues, index and CommitLog consistent with each other.

Each round forks a child from the test process (rmqstore is already imported,
so it starts in milliseconds). The child opens the store (recovery runs),
then three producer threads put a random mix of single messages and batches
and report every put only after it returned (``crash_child.py``). The parent
kills the child with SIGKILL at a random moment (sometimes while it is still
recovering), reopens the store writable and checks:

* every acknowledged message is there, byte-equal, at its queue offset and
  physical offset, findable by key, unique key, msgId and time;
* whether acknowledged or not: every queue is dense from offset 0, every
  stored message is one a producer could have written (its body is a function
  of its key), the index answers each new message's keys with exactly that
  message, and ``iter_messages()`` yields exactly the messages the queues hold;
* nothing verified in earlier rounds changed: the CommitLog bytes before the
  previous round's end and the ConsumeQueue units before each queue's
  previous end are byte-identical.

Rounds accumulate on the same directories, so stores that were recovered
(after a clean close, or after a simulated crash of the verifying process)
are appended to and recovered again.

Knobs: ``RMQSTORE_CRASH_RUNS`` (default 100) rounds per flush mode;
``RMQSTORE_CRASH_SEED`` fixes the seed (printed in every failure).
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import signal
import time
import traceback
import zlib

import pytest

import crash_child as cc
from conftest import no_hang
from rmqstore import CorruptedFileError, GetMessageStatus, MessageStore, StoreConfig

RUNS = max(1, int(os.environ.get("RMQSTORE_CRASH_RUNS", "100")))

# BUG (test_recovery.py::test_states_a_kill_leaves_behind[empty-new-index-file]
# and [empty-checkpoint], strict xfails): a kill between creating a new index
# file (or the checkpoint) and giving it its size leaves a 0-byte file, and
# every later open raises CorruptedFileError for it: the store cannot be opened
# after a plain kill -9. While that bug stands, a round that hits it removes
# that empty file (it holds nothing) and opens again; everything else is still
# checked, and the summary counts the hits. Set to False together with removing
# those xfail markers once it is fixed.
TOLERATE_EMPTY_FILES_LEFT_BY_A_KILL = False
DIRS_PER_TEST = 2

# the flush thread runs every few ms (RocketMQ: 500/1000 ms), so kills also
# land in its CommitLog, ConsumeQueue and checkpoint flushes
FAST_FLUSH = dict(
    flush_interval_commit_log=5,
    flush_commit_log_thorough_interval=30,
    flush_interval_consume_queue=7,
    flush_consume_queue_thorough_interval=40,
)
CONFIGS = {
    # CommitLog files of 64 KiB, 64 units per ConsumeQueue file, 255 index
    # entries per index file: every kind of file rolls several times a round
    "small-files": dict(
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 64,
        max_hash_slot_num=64,
        max_index_num=256,
        **FAST_FLUSH,
    ),
    "larger-files": dict(
        mapped_file_size_commit_log=256 * 1024,
        mapped_file_size_consume_queue=20 * 256,
        max_hash_slot_num=256,
        max_index_num=1024,
        **FAST_FLUSH,
    ),
}


def _base_seed(name: str) -> int:
    env = os.environ.get("RMQSTORE_CRASH_SEED")
    if env:
        return int(env)
    if os.environ.get("CI"):
        return zlib.crc32(name.encode())
    return random.SystemRandom().randrange(1 << 32)


# --- one child ----------------------------------------------------------------------------------


class ChildRun:
    """Outcome of one forked producer: acks received, error lines, how it ended."""

    def __init__(self):
        self.acks: list = []
        self.errors: list = []
        self.ready = False
        self.killed = False
        self.exit_status = None
        self.partial = b""
        self.timed_out = False


def run_and_kill(root, config, seed: int, round_tag: str, rnd: random.Random, early=None, delay=None) -> ChildRun:
    """Fork a producer, kill it with SIGKILL at a random moment, collect its acks.

    *early*: count the delay from the fork rather than from the child's
    ``ready`` (so the kill may hit the child's recovery)."""
    # three kinds of rounds: killed early (counting from the fork, so possibly
    # during the child's recovery); a short burst of producers that never
    # pause (the kill lands inside a put); producers pausing between puts for
    # longer (more rolled files per round, yet a bounded amount to verify)
    kind = rnd.random()
    if early is None:
        early = kind < 0.12
    pause = 0.0 if kind < 0.56 else 0.008
    if delay is None:
        if early:
            delay = rnd.uniform(0.0, 0.03)
        else:
            delay = rnd.uniform(0.005, 0.04) if kind < 0.56 else rnd.uniform(0.04, 0.15)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(rfd)
            code = cc.run_child(root, config, seed, round_tag, wfd, pause=pause)
        except BaseException:
            try:
                msg = ("E " + traceback.format_exc().replace("\n", " | "))[: cc.PIPE_BUF - 2] + "\n"
                os.write(wfd, msg.encode(errors="replace"))
            except BaseException:
                pass
            code = 2
        finally:
            os._exit(code)
    os.close(wfd)
    run = ChildRun()
    buf = bytearray()
    start = time.monotonic()
    kill_at = start + delay if early else None
    give_up = start + 30.0
    try:
        while True:
            now = time.monotonic()
            if kill_at is not None and now >= kill_at:
                break
            if now >= give_up:
                run.timed_out = True
                break
            timeout = 0.05 if kill_at is None else max(0.0, kill_at - now)
            readable, _, _ = select.select([rfd], [], [], timeout)
            if readable:
                data = os.read(rfd, 1 << 16)
                if not data:  # the child exited by itself
                    break
                buf += data
                if not run.ready and b"ready\n" in buf:
                    run.ready = True
                    if kill_at is None:
                        kill_at = time.monotonic() + delay
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    run.killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    run.exit_status = status
    while True:  # acks written before death: complete lines (each batch was one atomic write)
        data = os.read(rfd, 1 << 16)
        if not data:
            break
        buf += data
    os.close(rfd)
    *lines, run.partial = bytes(buf).split(b"\n")
    for line in lines:
        text = line.decode()
        if text.startswith("A "):
            run.acks.append(cc.parse_ack(text))
        elif text.startswith("E "):
            run.errors.append(text)
        elif text == "ready":
            run.ready = True
        else:
            raise AssertionError(f"unexpected line from the child: {text!r}")
    return run


# --- what the parent knows about a directory ----------------------------------------------------


def _prefix_digest(paths_by_start, file_size, end) -> str:
    """sha1 of the logical byte stream [0, end) of a segment queue."""
    h = hashlib.sha1()
    pos = 0
    for start, path in paths_by_start:
        if pos >= end:
            break
        assert start == pos, f"segment {path} starts at {start}, expected {pos}"
        with open(path, "rb") as fh:
            h.update(fh.read(min(file_size, end - start)))
        pos = start + file_size
    assert pos >= end or end == 0, f"data ends at {pos} before {end}"
    return h.hexdigest()


def _segments(directory):
    try:
        names = sorted(n for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []
    return [(int(n), os.path.join(directory, n)) for n in names]


class History:
    """What earlier rounds proved about one store directory."""

    def __init__(self, root, config: StoreConfig):
        self.root = str(root)
        self.config = config
        self.cl_end = 0
        self.cl_digest = _prefix_digest([], 0, 0)
        self.qmax: dict = {}
        self.cq_digest: dict = {}
        self.known: dict = {}  # (topic, qid, qoff) -> (phy, key, store_ts, msg_id)
        self.acked: list = []
        self.rounds = 0
        self.acked_total = 0
        self.killed_before_ready = 0
        self.empty_files = 0  # tolerated under TOLERATE_EMPTY_FILES_LEFT_BY_A_KILL
        self.t_child = self.t_open = self.t_verify = 0.0

    def cl_prefix_digest(self, end):
        segments = _segments(os.path.join(self.root, "commitlog"))
        return _prefix_digest(segments, self.config.mapped_file_size_commit_log, end)

    def cq_prefix_digest(self, topic, qid, units):
        d = os.path.join(self.root, "consumequeue", topic, str(qid))
        return _prefix_digest(_segments(d), self.config.mapped_file_size_consume_queue, units * 20)


def _check_found(store, topic, qid, qoff, phy, key, ts, msg_id, ctx, by_uniq=True):
    """The full retrieval check of one message known to be stored: by queue
    offset, msgId, key (and unique key) and time."""
    res = store.get_messages(topic, qid, qoff, 1)
    assert res.status is GetMessageStatus.FOUND and len(res.messages) == 1, (ctx, key, res.status)
    m = res.messages[0]
    assert (m.physical_offset, m.queue_offset, m.keys, m.store_timestamp) == (phy, qoff, key, ts), (ctx, key, m)
    assert m.msg_id == msg_id
    by_id = store.look_message_by_msg_id(msg_id)
    assert by_id is not None and by_id.physical_offset == phy, (ctx, key, msg_id)
    assert [x.physical_offset for x in store.query_messages(topic, key)] == [phy], (ctx, "by key", key)
    if by_uniq:
        by_key = store.query_messages(topic, cc.unique_key_of(key))
        assert [x.physical_offset for x in by_key] == [phy], (ctx, "by uniq", key)
    assert store.get_offset_in_queue_by_time(topic, qid, ts, "lower") <= qoff, (ctx, "by time", key, ts)
    return m


def verify(store: MessageStore, hist: History, run: ChildRun, rnd: random.Random, ctx: str, full: bool) -> None:
    """Check the store recovered after *run* against *hist*, then extend *hist*.
    Incremental rounds check what is new since the previous round plus samples
    of the old part (proven byte-identical); *full* rounds check everything."""
    cfg = hist.config
    # 1. nothing proven earlier has changed
    assert store.min_physical_offset == 0
    assert store.max_physical_offset >= hist.cl_end, (ctx, store.max_physical_offset, hist.cl_end)
    assert hist.cl_prefix_digest(hist.cl_end) == hist.cl_digest, f"{ctx}: CommitLog bytes before {hist.cl_end} changed"
    queues = store.queues()
    assert set(queues) <= set(cc.QUEUES), (ctx, queues)
    assert set(hist.qmax) <= set(queues), (ctx, "a queue vanished", set(hist.qmax) - set(queues))
    for (topic, qid), n in hist.qmax.items():
        assert store.get_max_offset_in_queue(topic, qid) >= n, (ctx, topic, qid)
        assert hist.cq_prefix_digest(topic, qid, n) == hist.cq_digest[(topic, qid)], (
            f"{ctx}: ConsumeQueue {topic}/{qid} units below {n} changed"
        )

    # 2. every queue dense from 0 (the part below the previous end is proven
    # unchanged by 1., so only *full* rounds pull it again); every new message
    # is one a producer wrote; old ones are where they were
    pulled: dict = {}  # phy -> key
    new_msgs = []
    for topic, qid in queues:
        assert store.get_min_offset_in_queue(topic, qid) == 0, (ctx, topic, qid)
        mx = store.get_max_offset_in_queue(topic, qid)
        old = hist.qmax.get((topic, qid), 0)
        spots = [0, old - 1] if old else []  # cheap look at the old part in incremental rounds
        for off in spots:
            res = store.get_messages(topic, qid, off, 1)
            phy, key, _ts, _id = hist.known[(topic, qid, off)]
            assert [(m.physical_offset, m.keys) for m in res.messages] == [(phy, key)], (ctx, topic, qid, off)
        off = 0 if full else old
        while off < mx:
            res = store.get_messages(topic, qid, off, 32)
            assert res.status is GetMessageStatus.FOUND and res.messages, (ctx, topic, qid, off, mx, res.status)
            for m in res.messages:
                assert m.queue_offset == off, (ctx, topic, qid, off, m)
                assert m.physical_offset not in pulled, (ctx, "two units for one record", m)
                if off < old:
                    phy, key, _ts, _id = hist.known[(topic, qid, off)]
                    assert (m.physical_offset, m.keys) == (phy, key), (ctx, topic, qid, off, m)
                else:
                    cc.check_message(m)
                    assert m.physical_offset >= hist.cl_end, (ctx, "new unit points into old data", m)
                    new_msgs.append(m)
                pulled[m.physical_offset] = m.keys
                off += 1
            assert res.next_begin_offset == off, (ctx, res.next_begin_offset, off)
        assert store.get_messages(topic, qid, mx, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE

    # 3. queues and CommitLog agree exactly
    iterated = []
    end = hist.cl_end
    for m in store.iter_messages(0 if full else hist.cl_end):
        iterated.append(m.physical_offset)
        end = m.physical_offset + m.store_size
    assert len(iterated) == len(set(iterated)) and set(iterated) == set(pulled), (
        f"{ctx}: CommitLog has {len(iterated)} records, queues {len(pulled)}; "
        f"only in CommitLog {sorted(set(iterated) - set(pulled))[:5]}, "
        f"only in queues {sorted(set(pulled) - set(iterated))[:5]}"
    )
    mpo = store.max_physical_offset
    assert end <= mpo and (mpo - end < cfg.mapped_file_size_commit_log), (ctx, end, mpo)
    # docs/recovery.md#pitfall-stale-bytes-after-truncation: nothing but zeros after the recovered end of the last file
    # (and in the segments after it: made ahead, docs/format.md#files-made-ahead, all zero)
    segs = _segments(os.path.join(hist.root, "commitlog"))
    if segs:
        size = cfg.mapped_file_size_commit_log
        assert any(start <= mpo <= start + size for start, _path in segs), (ctx, segs[-1][0], mpo)
        for start, path in segs:
            if start + size <= mpo:
                continue
            with open(path, "rb") as fh:
                fh.seek(max(0, mpo - start))
                tail = fh.read()
            assert not any(tail), f"{ctx}: non-zero bytes after the recovered end {mpo} in {path}"

    # 4. every acknowledged message: this round's in full, earlier rounds' by position
    by_pos = {}
    for m in new_msgs:
        by_pos[(m.topic, m.queue_id, m.queue_offset)] = m
    for a in run.acks:
        m = by_pos.get((a.topic, a.queue_id, a.queue_offset))
        assert m is not None, (
            f"{ctx}: acknowledged {a} lost (queue max {store.get_max_offset_in_queue(a.topic, a.queue_id)})")
        assert (m.physical_offset, m.store_size, m.store_timestamp, m.keys, m.msg_id) == (
            a.physical_offset, a.size, a.store_timestamp, a.key, a.msg_id
        ), (ctx, a, m)
        assert cc.body_sha1(m.body) == a.sha1, (ctx, a)
        _check_found(store, a.topic, a.queue_id, a.queue_offset, a.physical_offset, a.key, a.store_timestamp, a.msg_id,
                     ctx, by_uniq=rnd.random() < 0.25)
    for a in hist.acked:
        phy, key, _ts, _id = hist.known[(a.topic, a.queue_id, a.queue_offset)]
        assert (phy, key) == (a.physical_offset, a.key), (ctx, "earlier ack", a)

    # 5. the index answers each new message's key with exactly that message
    # (and its unique key, sampled: one more index walk per message)
    acked_keys = {a.key for a in run.acks}
    for m in new_msgs:
        if m.keys in acked_keys:
            continue  # already checked
        assert [x.physical_offset for x in store.query_messages(m.topic, m.keys)] == [m.physical_offset], (ctx, m)
        if rnd.random() < 0.25:
            by_key = store.query_messages(m.topic, m.unique_key)
            assert [x.physical_offset for x in by_key] == [m.physical_offset], (ctx, m)
        assert store.look_message_by_msg_id(m.msg_id).physical_offset == m.physical_offset
    # ... and still answers for a sample of older ones (a larger one in full rounds)
    old_ones = rnd.sample(sorted(hist.known), min(300 if full else 20, len(hist.known)))
    for (topic, qid, qoff) in old_ones:
        phy, key, ts, msg_id = hist.known[(topic, qid, qoff)]
        _check_found(store, topic, qid, qoff, phy, key, ts, msg_id, ctx)

    # 6. remember what this round proved
    for m in new_msgs:
        hist.known[(m.topic, m.queue_id, m.queue_offset)] = (m.physical_offset, m.keys, m.store_timestamp, m.msg_id)
    hist.cl_end = mpo
    hist.cl_digest = hist.cl_prefix_digest(mpo)
    for topic, qid in queues:
        n = store.get_max_offset_in_queue(topic, qid)
        hist.qmax[(topic, qid)] = n
        hist.cq_digest[(topic, qid)] = hist.cq_prefix_digest(topic, qid, n)
    hist.acked.extend(run.acks)
    hist.acked_total += len(run.acks)


def open_after_kill(hist: History, config: StoreConfig, ctx: str) -> MessageStore:
    for _attempt in range(4):
        try:
            with no_hang(60):
                return MessageStore.open(hist.root, config=config, store_host=cc.STORE_HOST)
        except CorruptedFileError as e:
            if not (TOLERATE_EMPTY_FILES_LEFT_BY_A_KILL and _empty_file_left_by_a_kill(hist.root, e.path)):
                raise
            path = e.path
        print(f"{ctx}: known bug: empty file {path} left by the kill; removed")
        hist.empty_files += 1
        os.unlink(path)
    raise AssertionError(f"{ctx}: still refused after removing empty files")


def _empty_file_left_by_a_kill(root, path) -> bool:
    if path is None or not os.path.isfile(path) or os.path.getsize(path) != 0:
        return False
    path = os.path.abspath(path)
    if path == os.path.abspath(os.path.join(root, "checkpoint")):
        return True
    index_dir = os.path.abspath(os.path.join(root, "index"))
    return os.path.dirname(path) == index_dir and os.path.basename(path) == max(
        n for n in os.listdir(index_dir) if n.isdigit()
    )


def crash_rounds(tmp_path, mode: str, config_name: str, rounds: int, name: str):
    seed = _base_seed(name)
    config = StoreConfig(flush_disk_type=mode, **CONFIGS[config_name])
    hists = [History(tmp_path / f"store{i}", config) for i in range(DIRS_PER_TEST)]
    master = random.Random(seed)
    started = time.monotonic()
    for r in range(rounds):
        hist = hists[r % len(hists)]
        round_seed = master.randrange(1 << 32)
        rnd = random.Random(round_seed)
        ctx = f"{name} round {r} (dir {r % len(hists)}, seed {seed}, round seed {round_seed})"
        try:
            t_fork = time.monotonic()
            run = run_and_kill(hist.root, config, round_seed, f"r{r}", rnd)
            assert not run.errors, f"the child failed: {run.errors[0]}"
            assert run.killed, f"the child was not killed but ended with status {run.exit_status}"
            assert not run.timed_out, "the child did not open the store within 30 s"
            if not run.ready:
                hist.killed_before_ready += 1
                assert not run.acks
            t0 = time.monotonic()
            store = open_after_kill(hist, config, ctx)
            t1 = time.monotonic()
            try:
                with no_hang(60):
                    verify(store, hist, run, rnd, ctx, full=(r >= rounds - len(hists) or r % 20 == 19))
            except BaseException:
                store.close()
                raise
            if rnd.random() < 0.2:
                store._crash()  # the verifying process dies too: the next child recovers a crash
            else:
                store.close()
            hist.rounds += 1
            hist.t_child += t0 - t_fork
            hist.t_open += t1 - t0
            hist.t_verify += time.monotonic() - t1
        except AssertionError as e:
            raise AssertionError(f"{ctx}: {e}") from e
        except Exception as e:
            raise AssertionError(f"{ctx}: {type(e).__name__}: {e}") from e
    elapsed = time.monotonic() - started
    summary = ", ".join(
        f"dir{i}: {h.rounds} rounds, {h.acked_total} acked, {len(h.known)} stored, "
        f"{h.killed_before_ready} killed before ready, {h.empty_files} empty files left by a kill (bug); "
        f"child {h.t_child:.1f} s, open {h.t_open:.1f} s, verify {h.t_verify:.1f} s" for i, h in enumerate(hists)
    )
    print(f"{name}: seed {seed}, {rounds} rounds in {elapsed:.1f} s; {summary}")
    # the rounds really wrote and acknowledged something
    assert sum(h.acked_total for h in hists) > 0
    return hists


def _rounds_for(config_name):
    names = sorted(CONFIGS)
    share = RUNS // len(names) + (1 if names.index(config_name) < RUNS % len(names) else 0)
    return max(1, share)


@pytest.mark.slow
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_kill9_async_flush(tmp_path, config_name):
    crash_rounds(tmp_path, "ASYNC_FLUSH", config_name, _rounds_for(config_name), f"ASYNC_FLUSH/{config_name}")


@pytest.mark.slow
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_kill9_sync_flush(tmp_path, config_name):
    crash_rounds(tmp_path, "SYNC_FLUSH", config_name, _rounds_for(config_name), f"SYNC_FLUSH/{config_name}")


@pytest.mark.slow
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_kill9_no_flush(tmp_path, config_name):
    """NO_FLUSH syncs nothing, and a killed process still loses nothing
    acknowledged (the page cache holds it): a quarter of the rounds, and
    at least 4 (a round killed before its child is ready acks nothing, and
    the rounds together must ack something)."""
    rounds = max(4, _rounds_for(config_name) // 4)
    crash_rounds(tmp_path, "NO_FLUSH", config_name, rounds, f"NO_FLUSH/{config_name}")


def test_crash_harness_round_trip(tmp_path):
    """The ack protocol itself: a child that is not killed early acks messages
    that are then all found, and acks are whole lines."""
    config = StoreConfig(**CONFIGS["small-files"])
    hist = History(tmp_path / "s", config)
    rnd = random.Random(5)
    run = run_and_kill(hist.root, config, 5, "r0", rnd, early=False, delay=0.1)
    assert not run.errors and run.killed and run.ready
    assert run.acks and not run.partial
    with MessageStore.open(hist.root, config=config, store_host=cc.STORE_HOST) as store:
        verify(store, hist, run, rnd, "protocol", full=True)
