"""Closed means closed: calls racing ``close()``.

Threads hammer one read API (or the clean-up) of a store while the main
thread closes it. Every call must either return a correct answer or raise
StoreClosedError: never a ValueError from a closed mmap, an IndexError, a
BufferError, a hang or a crash. ``close()`` must return (readers drain; a
long poll is woken) and stay idempotent.

Each scenario runs ``RMQSTORE_RACE_ROUNDS`` rounds (default 20) with each
kernel implementation; set it higher to hunt for rare interleavings.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import sys
import threading
import time
import traceback

import pytest

from conftest import no_hang
from rmqstore import GetMessageStatus, Message, MessageStore, StoreClosedError, StoreConfig
from rmqstore.message import offset_msg_id

ROUNDS = max(1, int(os.environ.get("RMQSTORE_RACE_ROUNDS", "20")))
THREADS = 3
CFG = dict(  # 4 KiB CommitLog files (several of them), 10 units per ConsumeQueue file, small index files
    mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=200, max_hash_slot_num=16, max_index_num=64,
    clean_service_enable=False,
)
N = 120  # messages: ~3 KiB of CommitLog per 30, so four files
T0 = 1_700_000_000_000


class Expect:
    """What a store filled by _make holds, to check answers against."""

    def __init__(self, s):
        self.by_phy = {}
        self.by_queue = {0: [], 1: []}
        for m in s.iter_messages():
            self.by_phy[m.physical_offset] = m.body
            self.by_queue[m.queue_id].append(m.body)
        self.phys = sorted(self.by_phy)
        self.host = s._store_host_raw


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A closed store of N messages over queues 0 and 1 (tags A/B, keys k<i % 20>)."""
    path = tmp_path_factory.mktemp("race") / "template"
    clock = iter(range(T0, T0 + 10 * N))
    with MessageStore.open(path, StoreConfig(**CFG), clock=lambda: next(clock)) as s:
        for i in range(N):
            s.put_message(Message("T", b"m%03d" % i, queue_id=i % 2, tags="AB"[i % 3 == 0], keys=f"k{i % 20}"))
        expect = Expect(s)
    assert len(expect.phys) == N and len(os.listdir(path / "commitlog")) >= 3
    return path, expect


def _check_pull(r, expect, queue_id, offset, tags=None):
    assert r.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                        GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.MESSAGE_WAS_REMOVING,
                        GetMessageStatus.OFFSET_TOO_SMALL), r.status
    bodies = expect.by_queue[queue_id]
    for m in r.messages:
        assert m.queue_id == queue_id and bodies[m.queue_offset] == m.body, m
        if tags is not None:
            assert m.tags == tags


def _pull(s, e, rnd):
    q = rnd.randrange(2)
    off = rnd.randrange(N // 2)
    _check_pull(s.get_messages("T", q, off, 8), e, q, off)


def _pull_tags(s, e, rnd):
    q = rnd.randrange(2)
    _check_pull(s.get_messages("T", q, rnd.randrange(N // 2), 8, "A"), e, q, 0, "A")


def _pull_wait(s, e, rnd):  # a long poll at the end of the queue: close must wake it
    r = s.get_messages("T", 0, N // 2, 4, wait_ms=60_000)
    assert not r.messages


def _get_message(s, e, rnd):
    phy = rnd.choice(e.phys)
    m = s.get_message(phy)
    assert m is None or m.body == e.by_phy[phy]  # None: cleaned up


def _look(s, e, rnd):
    phy = rnd.choice(e.phys)
    m = s.look_message_by_msg_id(offset_msg_id(e.host, phy))
    assert m is None or m.body == e.by_phy[phy]


def _views(s, e, rnd):
    q = rnd.randrange(2)
    r = s.get_message_views("T", q, rnd.randrange(N // 2), 8)
    bodies = e.by_queue[q]
    for qo, body in zip(r.units["queue_offset"].tolist(), r.bodies()):
        assert bytes(body) == bodies[qo]  # (the view pins the mapping: readable after close too)


def _columns(s, e, rnd):
    q = rnd.randrange(2)
    r = s.get_message_columns("T", q, rnd.randrange(N // 2), 8)
    c = r.columns
    offs, data = c["body_offsets"].tolist(), c["body_data"].tobytes()
    for i, qo in enumerate(c["queue_offset"].tolist()):
        assert data[offs[i] : offs[i + 1]] == e.by_queue[q][qo]


def _query(s, e, rnd):
    key = f"k{rnd.randrange(20)}"
    for m in s.query_messages("T", key):
        assert e.by_phy[m.physical_offset] == m.body and key in m.keys.split()


def _query_offsets(s, e, rnd):
    for phy in s.query_offsets("T", f"k{rnd.randrange(20)}"):
        assert phy in e.by_phy


def _by_time(s, e, rnd):
    assert 0 <= s.get_offset_in_queue_by_time("T", rnd.randrange(2), T0 + rnd.randrange(10 * N),
                                              rnd.choice(("lower", "upper"))) <= N // 2


def _iterate(s, e, rnd):
    for i, m in enumerate(s.iter_messages(rnd.choice(e.phys))):
        assert e.by_phy[m.physical_offset] == m.body
        if i > 10:
            break


def _queue_offsets(s, e, rnd):
    q = rnd.randrange(2)
    assert 0 <= s.get_min_offset_in_queue("T", q) <= s.get_max_offset_in_queue("T", q) == N // 2


def _consume(s, e, rnd):
    with s.consumer(f"G{threading.get_ident()}", "T", batch=4) as c:
        for i, m in enumerate(c):
            assert e.by_queue[m.queue_id][m.queue_offset] == m.body
            if i > 10:
                break


def _committed(s, e, rnd):
    s.get_committed_offset("G", "T", rnd.randrange(2))


def _maintenance(s, e, rnd):
    if rnd.random() < 0.5:
        s.delete_expired(force=True)
    else:
        s.run_maintenance()


READERS = {
    "get_messages": _pull, "get_messages_tags": _pull_tags, "get_messages_wait": _pull_wait,
    "get_message": _get_message, "look_message_by_msg_id": _look, "get_message_views": _views,
    "get_message_columns": _columns, "query_messages": _query, "query_offsets": _query_offsets,
    "get_offset_in_queue_by_time": _by_time, "iter_messages": _iterate, "queue_offsets": _queue_offsets,
    "consumer": _consume, "get_committed_offset": _committed, "delete_expired": _maintenance,
}
READ_ONLY = ("get_messages", "get_messages_tags", "get_message", "get_message_views", "get_message_columns",
             "query_messages", "get_offset_in_queue_by_time", "iter_messages", "queue_offsets", "delete_expired")


def _race(s, expect, readers, seed, closer=None):
    """Run *readers* (functions) in threads on *s*, close it, and return the
    unexpected outcomes (formatted tracebacks)."""
    errors: list = []
    stop = threading.Event()
    started = threading.Barrier(len(readers) + 1)

    def run(fn, rnd):
        started.wait()
        calls = 0
        while not stop.is_set():
            was_closed = s.closed
            try:
                fn(s, expect, rnd)
                calls += 1
            except StoreClosedError:
                if not s.closed:
                    errors.append(f"{fn.__name__}: StoreClosedError while open")
                return
            except BaseException:  # noqa: BLE001 - the point of the test
                errors.append(f"{fn.__name__} after {calls} calls (closed={s.closed}):\n{traceback.format_exc()}")
                return
            if was_closed:
                errors.append(f"{fn.__name__} answered a call made after close")
                return

    rnd = random.Random(seed)
    threads = [threading.Thread(target=run, args=(fn, random.Random(rnd.random())), daemon=True) for fn in readers]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(rnd.random() * 0.01)
    (closer or s.close)()
    s.close()  # idempotent
    deadline = time.monotonic() + 15
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    hung = [t for t in threads if t.is_alive()]
    if hung:
        frames = sys._current_frames()
        errors.extend("hung:\n" + "".join(traceback.format_stack(frames[t.ident])) for t in hung if t.ident in frames)
    return errors


def _open_copy(template, dst, **cfg):
    path, _ = template
    shutil.copytree(path, dst)
    return MessageStore.open(dst, StoreConfig(**{**CFG, **cfg}), clock=lambda: T0 + 10 * N)


@pytest.mark.parametrize("api", sorted(READERS))
def test_reads_racing_close(tmp_path, template, impl, api):
    _, expect = template
    with no_hang(120):
        for rnd in range(ROUNDS):
            s = _open_copy(template, tmp_path / f"r{rnd}")
            errors = _race(s, expect, [READERS[api]] * THREADS, seed=rnd)
            assert not errors, f"round {rnd}:\n" + "\n".join(errors[:3])


def test_every_read_at_once_racing_close(tmp_path, template, impl):
    _, expect = template
    with no_hang(120):
        for rnd in range(ROUNDS):
            s = _open_copy(template, tmp_path / f"r{rnd}")
            errors = _race(s, expect, list(READERS.values()), seed=1000 + rnd)
            assert not errors, f"round {rnd}:\n" + "\n".join(errors[:3])


def test_the_cleaner_racing_close(tmp_path, template, impl, caplog):
    """The clean-up service deletes a file per millisecond (every file
    expired, every hour a delete hour) while readers read and the store
    closes: no round may fail, no reader see anything but answers or
    StoreClosedError."""
    _, expect = template
    caplog.set_level(logging.WARNING, logger="rmqstore")
    cleaner = dict(clean_service_enable=True, clean_resource_initial_delay=0, clean_resource_interval=1,
                   file_reserved_time=0, delete_when=";".join(map(str, range(24))), delete_file_batch_max=1,
                   delete_commit_log_files_interval=0, delete_consume_queue_files_interval=0)
    readers = [READERS[name] for name in ("get_messages", "get_message", "get_message_views", "query_messages",
                                          "get_offset_in_queue_by_time", "iter_messages", "get_message_columns")]
    with no_hang(120):
        for rnd in range(ROUNDS):
            s = _open_copy(template, tmp_path / f"r{rnd}", **cleaner)
            errors = _race(s, expect, readers, seed=2000 + rnd)
            assert not errors, f"round {rnd}:\n" + "\n".join(errors[:3])
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failed, [r.getMessage() + (r.exc_text or "") for r in failed[:3]]


@pytest.mark.parametrize("api", READ_ONLY)
def test_read_only_reads_racing_close(tmp_path, template, impl, api):
    """Follow mode: reads that map new files and re-scan racing close."""
    path, expect = template

    def refresh(s, e, rnd):
        s.refresh()

    fn = READERS[api]
    with no_hang(120):
        for rnd in range(ROUNDS):
            s = MessageStore.open(path, read_only=True, config=StoreConfig(**CFG))
            readers = [fn] * THREADS + [refresh]
            if api == "delete_expired":
                readers = [lambda s, e, r: s.run_maintenance(), refresh]
            errors = _race(s, expect, readers, seed=3000 + rnd)
            assert not errors, f"round {rnd}:\n" + "\n".join(errors[:3])


def test_close_waits_for_a_reader_inside(tmp_path, template, impl):
    """A reader holding its reference keeps close() from unmapping; close
    returns once it leaves, and later calls raise StoreClosedError."""
    s = _open_copy(template, tmp_path / "s")
    s._refs.hold()
    closed = threading.Event()
    t = threading.Thread(target=lambda: (s.close(), closed.set()), daemon=True)
    with no_hang(20):
        t.start()
        time.sleep(0.1)
        assert not closed.is_set()
        # the files are still mapped for the reader inside
        assert all(not mf.closed for mf in s.commitlog.queue.files)
        s._refs.release()
        t.join(10)
        assert closed.is_set()
    for call in (lambda: s.get_messages("T", 0, 0), lambda: s.get_message(0), lambda: s.query_offsets("T", "k1"),
                 lambda: s.get_message_columns("T", 0, 0), lambda: list(s.iter_messages()),
                 lambda: s._refs.hold()):
        with pytest.raises(StoreClosedError):
            call()


def test_crash_hook_still_drops_the_store(tmp_path, template, impl):
    s = _open_copy(template, tmp_path / "s")
    s._crash()
    assert s.closed
    with pytest.raises(StoreClosedError):
        s.get_messages("T", 0, 0)
    s.close()  # a no-op after _crash
    with MessageStore.open(tmp_path / "s", StoreConfig(**CFG)) as again:
        assert not again.last_exit_ok
        assert len(again.get_messages("T", 0, 0, 100).messages) == N // 2


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_close_does_not_deadlock_with_puts(tmp_path, impl, flush):
    """close() takes the flush lock before the append lock, as a SYNC_FLUSH
    group commit does (it used to take them the other way round and wait
    forever for a leader that waited for it). The puts' own outcomes
    racing close are the put path's; here close must return."""
    cfg = StoreConfig(**{**CFG, "mapped_file_size_commit_log": 1 << 20, "flush_disk_type": flush})
    with no_hang(120):
        for rnd in range(ROUNDS):
            s = MessageStore.open(tmp_path / f"r{rnd}", cfg)
            stop = threading.Event()

            def put():
                while not stop.is_set():
                    try:
                        s.put_message(Message("T", b"x"))
                    except Exception:  # noqa: BLE001 - closed under it
                        return

            threads = [threading.Thread(target=put, daemon=True) for _ in range(THREADS)]
            for t in threads:
                t.start()
            time.sleep(random.Random(rnd).random() * 0.01)
            closer = threading.Thread(target=s.close, daemon=True)
            closer.start()
            closer.join(30)
            stop.set()
            assert not closer.is_alive(), f"round {rnd}: close() did not return"
            for t in threads:
                t.join(10)
            with MessageStore.open(tmp_path / f"r{rnd}", cfg) as again:
                assert again.get_messages("T", 0, 0, 1).status in (GetMessageStatus.FOUND,
                                                                   GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
@pytest.mark.parametrize("shape", ["one", "many"])
def test_puts_racing_close_are_all_or_nothing(tmp_path, flush, shape):
    """Producers put while the main thread closes the store: every put that
    returned is in the store after a reopen, and every put that raised
    (StoreClosedError, nothing else) is not; a SYNC_FLUSH put whose record
    close flushed and dispatched returns PUT_OK."""
    for rnd in range(ROUNDS):
        root = tmp_path / f"r{rnd}"
        s = MessageStore.open(root, StoreConfig(flush_disk_type=flush, **CFG))
        acked, refused, odd = [], [], []
        seq = iter(range(10**9))

        def producer():
            while True:
                batch = [b"p%09d" % next(seq) for _ in range(1 if shape == "one" else 5)]
                try:
                    if shape == "one":
                        s.put_message(Message("T", batch[0], queue_id=len(batch[0]) % 2, keys="k"))
                    else:
                        s.put_messages([Message("T", b, queue_id=i % 2, keys="k") for i, b in enumerate(batch)])
                    acked.extend(batch)
                except StoreClosedError:
                    refused.extend(batch)
                    return
                except Exception as e:  # noqa: BLE001 (anything else fails the test)
                    odd.append("".join(traceback.format_exception(e)))
                    return

        threads = [threading.Thread(target=producer) for _ in range(THREADS)]
        for t in threads:
            t.start()
        time.sleep(0.001 + rnd % 5 * 0.002)
        with no_hang(30):
            s.close()
            for t in threads:
                t.join()
        assert not odd, odd[0]
        with MessageStore.open(root, read_only=True) as ro:
            stored = [m.body for m in ro.iter_messages()]
        assert sorted(stored) == sorted(acked)
        assert not set(stored) & set(refused)


def test_deferred_consumer_commits_racing_close(tmp_path):
    """A consumer committing with sync=False (its offsets' background persist
    starting) while the store closes: close returns, nothing else raised."""
    with MessageStore.open(tmp_path / "s", StoreConfig(**CFG)) as s0:
        for i in range(20):
            s0.put_message(Message("T", b"m%d" % i))
    for rnd in range(ROUNDS * 5):
        s = MessageStore.open(tmp_path / "s", StoreConfig(**CFG))
        errors = []

        def commit():
            try:
                s.commit_offset("G", "T", 0, rnd % 20 + 1, sync=False)
            except StoreClosedError:
                pass
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=commit)
        t.start()
        with no_hang(30):
            s.close()
            t.join()
        assert not errors, errors
