"""``PutGate``: ``MessageStore.put_message``'s ASYNC_FLUSH path in one call.

An open writable ASYNC_FLUSH store's instance calls ``k.PutGate.put``
directly (the core then runs no Python code on a put). The gate must keep
every promise of ``put_message``: the store's state routes a put to the
step-by-step path, results and the store's bookkeeping match what is
written, a closed or collected store refuses, and a subclass's own
``put_message`` is left alone. Each test runs with both kernels.
"""

from __future__ import annotations

import collections
import gc
import itertools
import signal
import threading
import time
import weakref

import pytest

from conftest import ListClock
from rmqstore import Message, MessageStore, StoreConfig, _kernels
from rmqstore.exceptions import (
    DiskFullError,
    FlushError,
    StoreClosedError,
    StoreReadOnlyError,
)

T0 = 1_700_000_000_000
CFG = StoreConfig(  # small files: 1 MiB CommitLog files, 1000-unit queue files, small index files
    mapped_file_size_commit_log=1 << 20,
    mapped_file_size_consume_queue=20_000,
    max_hash_slot_num=64,
    max_index_num=4096,
    clean_service_enable=False,
)


def _open(path, impl, config=CFG, **kw):
    s = MessageStore.open(path, config, **kw)
    assert type(s._put_gate).__module__ == ("rmqstore._core" if impl == "cython" else "rmqstore._pure.gates")
    return s


def test_an_open_store_puts_through_its_gate(tmp_path, impl):
    s = _open(tmp_path / "s", impl, clock=ListClock(range(T0, T0 + 100)))
    assert s._put_gate is not None and "put_message" not in vars(s)  # StoreCore's, through the gate
    results = [s.put_message(Message("T", b"m%d" % i, queue_id=i % 2, keys=f"k{i}")) for i in range(6)]
    assert [r.store_timestamp for r in results] == list(range(T0, T0 + 6))
    assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2, 2]
    assert [r.wrote_offset for r in results[1:]] == [r.wrote_offset + r.wrote_bytes for r in results[:-1]]
    # the store's bookkeeping, as put_message step by step leaves it
    assert s._written_end == results[-1].wrote_offset + results[-1].wrote_bytes == s.commitlog.max_offset()
    assert s._last_store_ts == s._last_logics_ts == T0 + 5
    assert s._queue_offsets[("T", 0)] == s._queue_offsets[("T", 1)] == 3
    assert [m.body for m in s.get_messages("T", 1, 0).messages] == [b"m1", b"m3", b"m5"]
    assert [m.body for m in s.query_messages("T", "k4")] == [b"m4"]
    s.close()
    assert "put_message" not in vars(s) and s._put_gate is None
    with pytest.raises(StoreClosedError):
        s.put_message(Message("T", b"late"))


def test_the_default_clock_is_the_wall_clock_in_ms(tmp_path, impl):
    with _open(tmp_path / "s", impl) as s:
        s.put_message(Message("T", b"first"))  # a new queue: step by step
        before = time.time_ns() // 1_000_000
        r = s.put_message(Message("T", b"gate"))
        after = time.time_ns() // 1_000_000
        assert before <= r.store_timestamp <= after
        assert s.get_message(r.wrote_offset).store_timestamp == r.store_timestamp


@pytest.mark.parametrize("state", ["_disk_full", "_pending", "_write_error", "declined"])
def test_the_store_state_routes_a_put_step_by_step(tmp_path, impl, state):
    """What put_message checks before the one-call path sends the put to
    ``_put_one`` (with the store time already taken when the Appender
    declined); everything else never reaches it."""
    s = _open(tmp_path / "s", impl, clock=ListClock(range(T0, T0 + 100)))
    try:
        s.put_message(Message("T", b"bind"))
        calls = []
        step = s._put_one
        s._put_one = lambda msg, store_ts=None: calls.append(store_ts) or step(msg, store_ts)  # type: ignore[method-assign]
        s.put_message(Message("T", b"fast"))
        assert calls == []
        if state == "_disk_full":
            s._disk_full, s._disk_ratio, s._disk_next_check = True, 0.99, float("inf")  # (no re-probe)
            with pytest.raises(DiskFullError):
                s.put_message(Message("T", b"full"))
        elif state == "_pending":  # records appended but not yet dispatched: the steps keep the order
            kept, s._pending = s._pending, collections.deque([object()])
            s._put_one = lambda msg, store_ts=None: calls.append(store_ts)  # type: ignore[method-assign]
            try:
                s.put_message(Message("T", b"behind"))
            finally:
                s._pending = kept
            assert len(calls) == 1
        elif state == "_write_error":
            s._write_error = OSError(5, "injected")
            with pytest.raises(FlushError):
                s.put_message(Message("T", b"failed"))
            s._write_error = None
        else:  # a message the Appender leaves to the steps: a queue it has not bound
            r = s.put_message(Message("T", b"new queue", queue_id=3))
            assert calls == [r.store_timestamp] and r.queue_offset == 0
        if state != "declined":
            assert calls[-1] is None  # declined before the clock was read
    finally:
        s._disk_full = False
        s.close()


def test_a_subclass_put_message_is_its_own(tmp_path, impl):
    seen = []

    class Audited(MessageStore):
        def put_message(self, msg):
            seen.append(msg.body)
            return super().put_message(msg)

    with Audited.open(tmp_path / "s", CFG) as s:
        assert "put_message" not in vars(s) and s._put_gate is not None
        for i in range(3):
            s.put_message(Message("T", b"a%d" % i))
        assert seen == [b"a0", b"a1", b"a2"]
        assert [m.body for m in s.get_messages("T", 0, 0).messages] == seen


def test_the_gate_reads_the_state_of_the_store_it_has(tmp_path, impl):
    """The gate reads and writes the store's StoreState, which the store's
    attributes name: a waiter counted through the store (``_waiting``) makes
    every put wake the waiters, and the put's bookkeeping is what the store
    then reads; another store's state is its own."""
    woken = []

    class Watched(MessageStore):
        def _wake_waiters(self):
            woken.append(self._written_end)

    with _open(tmp_path / "plain", impl) as plain, Watched.open(tmp_path / "s", CFG) as s:
        assert type(s._state) is _kernels.StoreState and s._state is not plain._state
        s.put_message(Message("T", b"bind"))  # (a new queue: step by step)
        assert woken == []
        s._waiting = 1
        assert s._state.waiting == 1 and plain._state.waiting == 0
        for i in range(3):
            plain.put_message(Message("T", b"p%d" % i))
            r = s.put_message(Message("T", b"w%d" % i))
            assert woken[-1] == r.wrote_offset + r.wrote_bytes == s._written_end == s._state.written_end
        assert len(woken) == 3 and s._last_store_ts == s._state.last_store_ts == r.store_timestamp
        s._waiting = 0
        s.put_message(Message("T", b"quiet"))
        assert len(woken) == 3


def test_sync_flush_puts_go_through_the_gate_and_return_on_disk(tmp_path, impl):
    """Under SYNC_FLUSH the gate's Appender writes the record alone and the
    gate returns once it is on disk and dispatched (RocketMQ 5.3.2+: only
    flushed records are dispatched); only the first put of a queue goes
    step by step."""
    with _open(tmp_path / "s", impl, config=CFG.replace(flush_disk_type="SYNC_FLUSH")) as s:
        assert "put_message" not in vars(s) and s._put_gate is not None and not s._fast.dispatch
        stepped = []
        put_one = s._put_one
        s._put_one = lambda *a: stepped.append(a[0].body) or put_one(*a)
        for i in range(6):
            r = s.put_message(Message("T", b"m%d" % i, keys=f"k{i}"))
            assert r.queue_offset == i
            assert s._flushed_where >= r.wrote_offset + r.wrote_bytes and not s._pending
            assert [m.body for m in s.get_messages("T", 0, i).messages] == [b"m%d" % i]
            assert [m.body for m in s.query_messages("T", f"k{i}")] == [b"m%d" % i]
        assert stepped == [b"m0"]  # a new queue (bound then to the file made for it ahead)


def test_read_only_stores_have_no_put_gate(tmp_path, impl):
    MessageStore.open(tmp_path / "s", CFG).close()
    with MessageStore.open(tmp_path / "s", CFG, read_only=True) as s:
        assert "put_message" not in vars(s) and s._put_gate is None
        with pytest.raises(StoreReadOnlyError):
            s.put_message(Message("T", b"refused"))


def test_a_kept_bound_method_refuses_after_close(tmp_path, impl):
    """A bound ``put_message`` kept past close goes to the careful path,
    which raises StoreClosedError. The gate holds its store weakly: a gate
    kept past close keeps no closed store alive, and refuses once it is
    gone."""
    s = _open(tmp_path / "s", impl)
    s.put_message(Message("T", b"bind"))
    put, gate = s.put_message, s._put_gate
    assert put(Message("T", b"kept")).queue_offset == 1
    s.close()
    with pytest.raises(StoreClosedError):
        put(Message("T", b"after close"))
    ref = weakref.ref(s)
    del s, put
    gc.collect()
    assert ref() is None  # the kept gate (a live root) does not hold the store
    with pytest.raises(StoreClosedError, match="gone"):
        gate.put(Message("T", b"after collection"))
    with MessageStore.open(tmp_path / "s", CFG) as again:
        assert [m.body for m in again.get_messages("T", 0, 0).messages] == [b"bind", b"kept"]


def test_threads_share_the_gate(tmp_path, impl):
    """Puts from several threads take the store's append lock: every queue
    offset once, records back to back, each body where its result says."""
    n, threads = 300, 4
    with _open(tmp_path / "s", impl) as s:
        for q in range(2):
            s.put_message(Message("T", b"bind", queue_id=q))
        results: list = []

        def produce(t):
            got = [s.put_message(Message("T", b"t%d-%d" % (t, i), queue_id=i % 2)) for i in range(n)]
            results.extend(got)

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert len(results) == n * threads
        for q in range(2):
            offsets = sorted(r.queue_offset for r in results if s.get_message(r.wrote_offset).queue_id == q)
            assert offsets == list(range(1, n * threads // 2 + 1))
        spans = sorted((r.wrote_offset, r.wrote_bytes) for r in results)
        assert all(a + n_ == b for (a, n_), (b, _) in itertools.pairwise(spans))
        assert s._written_end == spans[-1][0] + spans[-1][1]


# --- the append lock ---------------------------------------------------------------------


def test_the_append_lock_is_reentrant_and_owned(impl):
    """AppendLock (the core's own, so that the gate takes it in C; the twin's
    is threading.RLock): its owner takes it again, others neither take nor
    release it, and it is free once released as often as taken."""
    lock = _kernels.AppendLock()
    seen: list = []

    def elsewhere(action):
        t = threading.Thread(target=lambda: seen.append(action()))
        t.start()
        t.join(10)

    def release():
        try:
            lock.release()
        except RuntimeError:
            return "refused"
        return "released"

    assert lock.acquire() and lock.acquire()
    with lock as entered:
        assert entered
    elsewhere(lambda: lock.acquire(False))
    elsewhere(release)
    assert seen == [False, "refused"]
    lock.release()
    elsewhere(lambda: lock.acquire(False))  # still held once
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()

    def take_and_give():
        got = lock.acquire(False)
        lock.release()
        return got

    elsewhere(take_and_give)
    assert seen == [False, "refused", False, True]


def test_a_waiter_gets_the_append_lock_once_released(impl):
    lock = _kernels.AppendLock()
    order: list = []
    lock.acquire()

    def waiter():
        with lock:
            order.append("waiter")

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)  # it waits meanwhile: nothing else lets it in
    order.append("owner")
    lock.release()
    t.join(10)
    assert order == ["owner", "waiter"]


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_a_signal_ends_a_wait_for_the_append_lock(impl):
    """A thread waiting for the lock runs signal handlers, as RLock waiters
    do: a handler's exception (here as KeyboardInterrupt would) ends the
    wait, and the lock is not left taken by it."""

    class Interrupted(Exception):
        pass

    lock = _kernels.AppendLock()
    waiting, held, done = threading.Event(), threading.Event(), threading.Event()

    def handler(signum, frame):
        if waiting.is_set():  # (a signal before the wait began is ignored; the sender repeats)
            raise Interrupted

    def holder():
        with lock:
            held.set()
            done.wait(10)

    def sender(main):
        while not done.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.05)

    previous = signal.signal(signal.SIGUSR1, handler)
    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    s = threading.Thread(target=sender, args=(threading.get_ident(),))
    try:
        s.start()
        with pytest.raises(Interrupted):
            waiting.set()
            lock.acquire()
        waiting.clear()
        with pytest.raises(RuntimeError):  # the wait ended without the lock: the holder has it still
            lock.release()
        assert held.is_set() and not done.is_set()
    finally:
        done.set()
        s.join(10)
        t.join(10)
        signal.signal(signal.SIGUSR1, previous)
    assert lock.acquire(False)
    lock.release()


def test_a_store_puts_under_the_kernels_append_lock(tmp_path, impl):
    with _open(tmp_path / "s", impl) as s:
        assert type(s._lock) is type(_kernels.AppendLock())
        with s._lock:  # held here: another thread's put waits for it
            t = threading.Thread(target=lambda: s.put_message(Message("T", b"waits")))
            t.start()
            time.sleep(0.05)
            assert s.get_max_offset_in_queue("T", 0) == 0
        t.join(10)
        assert s.get_max_offset_in_queue("T", 0) == 1


def test_a_put_inside_a_put_is_refused_and_the_outer_one_completes(tmp_path, impl):
    """The store's lock is reentrant (RocketMQ's), so a put that Python code
    inside a put starts on the same thread (here the store's clock; a
    finalizer or a signal handler in real life) reaches the Appender, which
    refuses it with a RuntimeError: the outer batch is written whole and
    exactly, nothing of the inner one is, and the store goes on."""
    inner: list = []
    armed = [0]
    times = iter(range(T0, T0 + 100))

    def clock():
        if armed[0]:  # the clock of the batch's first and second messages
            armed[0] -= 1
            saved, armed[0] = armed[0], 0  # (the inner put reads the clock too)
            try:
                s.put_message(Message("T", b"inner"))
                inner.append("written")
            except RuntimeError as e:
                inner.append(str(e))
            armed[0] = saved
        return next(times)

    s = _open(tmp_path / "s", impl, clock=clock)
    try:
        s.put_message(Message("T", b"first"))  # the queue's and files' first put
        armed[0] = 2
        results = s.put_messages([Message("T", b"b%d" % i, keys=f"k{i}") for i in range(4)])
        assert len(inner) == 2 and all("inside another put" in e for e in inner), inner
        assert [m.body for m in s.get_messages("T", 0, 0).messages] == [b"first", b"b0", b"b1", b"b2", b"b3"]
        assert [r.queue_offset for r in results] == [1, 2, 3, 4]
        assert [m.body for m in s.query_messages("T", "k2")] == [b"b2"]
        assert s.put_message(Message("T", b"after")).queue_offset == 5
    finally:
        s.close()


def test_transactions_and_delays_go_through_the_gate(tmp_path, impl):
    """Transactional records and SCHEDULE_TOPIC_XXXX delays are the
    Appender's once their queue is bound: no put after the first of each
    queue goes step by step, and the files are byte for byte what a
    SYNC_FLUSH store (every put step by step, dispatched by the Python
    layer's rules) writes for the same puts; the logics time follows only
    the records that got a unit."""
    from test_store import _files

    def msgs():
        for i in range(40):
            kind = i % 5
            if kind == 0:
                yield Message("Tx", b"half%d" % i, queue_id=0, keys=f"p{i}", sys_flag=0x4)
            elif kind == 1:
                yield Message("Tx", b"commit%d" % i, queue_id=0, keys=f"c{i}", tags="T", sys_flag=0x8)
            elif kind == 2:
                yield Message("Tx", b"rollback%d" % i, queue_id=0, keys=f"r{i}", sys_flag=0xC)
            elif kind == 3:
                yield Message("SCHEDULE_TOPIC_XXXX", b"later%d" % i, queue_id=2, tags="T",
                              properties={"DELAY": str(i % 20), "REAL_TOPIC": "Tx", "REAL_QID": "0"})
            else:
                yield Message("Tx", b"plain%d" % i, queue_id=0, unique_key=f"u{i}")

    stepped = []
    with MessageStore.open(tmp_path / "fast", CFG, clock=ListClock(range(T0, T0 + 100))) as s:
        put_one = s._put_one
        s._put_one = lambda *a: stepped.append(a[0].topic) or put_one(*a)
        results = [s.put_message(m) for m in msgs()]
        assert s._last_logics_ts == T0 + 39  # a plain record, the last
        s.put_message(Message("Tx", b"half", queue_id=0, sys_flag=0x4))
        assert s._last_store_ts == T0 + 40 and s._last_logics_ts == T0 + 39
    # the first puts of each queue: a prepared record makes no queue, the commit after it does
    assert stepped == ["Tx", "Tx", "SCHEDULE_TOPIC_XXXX"]
    assert [r.queue_offset for r in results[:5]] == [0, 0, 0, 0, 1]
    with MessageStore.open(tmp_path / "steps", CFG.replace(flush_disk_type="SYNC_FLUSH"),
                           clock=ListClock(range(T0, T0 + 100))) as s:
        assert [s.put_message(m) for m in msgs()] == results
        s.put_message(Message("Tx", b"half", queue_id=0, sys_flag=0x4))
    with MessageStore.open(tmp_path / "batch", CFG, clock=ListClock(range(T0, T0 + 100))) as s:
        assert s.put_messages(list(msgs())) == results
        assert s._last_logics_ts == T0 + 39
        s.put_messages([Message("Tx", b"half", queue_id=0, sys_flag=0x4)])
        assert s._last_logics_ts == T0 + 39
    assert _files(tmp_path / "fast") == _files(tmp_path / "steps") == _files(tmp_path / "batch")


@pytest.mark.parametrize("shape", ["many", "columns"])
def test_sync_flush_batches_go_through_the_appender(tmp_path, impl, shape):
    """Under SYNC_FLUSH a batch is the Appender's too (records only, one
    sync, then dispatched): once its queue has a file no message of it goes
    step by step, and the call returns with everything dispatched."""
    with _open(tmp_path / "s", impl, config=CFG.replace(flush_disk_type="SYNC_FLUSH"),
               clock=ListClock(range(T0, T0 + 10_000))) as s:
        s.put_message(Message("T", b"first", queue_id=0))  # a new queue: step by step
        stepped = []
        append_stepped = s._append_stepped
        s._append_stepped = lambda *a: stepped.append(a) or append_stepped(*a)
        bodies = [b"b%d" % i for i in range(300)]
        if shape == "many":
            results = s.put_messages([Message("T", b, queue_id=0, keys=f"k{i}") for i, b in enumerate(bodies)])
            offsets = [r.queue_offset for r in results]
        else:
            r = s.put_message_columns("T", bodies, 0, keys=[f"k{i}" for i in range(300)])
            offsets = r.queue_offsets.tolist()
            assert len(set(s.get_message(int(p)).store_timestamp for p in r.physical_offsets)) == 1
        assert stepped == [] and not s._pending and s._pending_keys == 0
        assert offsets == list(range(1, 301))
        assert s._flushed_where >= s.max_physical_offset
        got = s.get_messages("T", 0, 1, 300).messages
        assert [m.body for m in got] == bodies
        assert [m.body for m in s.query_messages("T", "k299")] == [b"b299"]


@pytest.mark.parametrize("mode", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_new_files_and_queues_go_through_the_appender(tmp_path, impl, mode):
    """A message the Appender declines for a file it is not bound to (the
    store's first record, a CommitLog roll, a new queue, a queue's next
    file) is asked again once the store has made and bound that file. What
    still goes step by step: records at an index roll (a record's keys may
    straddle two index files, which the Appender does not write; under
    SYNC_FLUSH, every record whose keys the last index file cannot take
    until the group commit dispatches). Every put shape; the files are byte
    for byte the step-by-step path's."""
    from test_store import _files

    cfg = CFG.replace(flush_disk_type=mode, mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=20 * 50,
                      max_index_num=100)

    def work(s):
        s.put_message(Message("T", b"first", queue_id=0))  # the store's first record
        for q in range(1, 4):
            s.put_message(Message("T", b"one", queue_id=q, keys=f"k{q}"))
        s.put_messages([Message("U", b"many%d" % q, queue_id=q, keys="m") for q in range(3)])
        s.put_message_columns("V", [b"col"] * 6, [0, 1, 2, 0, 1, 2], keys=["c"] * 6)
        for i in range(120):  # queue T/0 into its third file; CommitLog and index rolls
            s.put_message(Message("T", b"x%d" % i, queue_id=0, keys=f"x{i}"))
        s.put_messages([Message("T", b"y%d" % i, queue_id=0, keys=f"y{i}") for i in range(120)])

    with _open(tmp_path / "s", impl, config=cfg, clock=ListClock(range(T0, T0 + 1000))) as s:
        stepped = []
        append_stepped = s._append_stepped
        s._append_stepped = lambda *a: stepped.append(a[0][6]) or append_stepped(*a)  # (the body)
        work(s)
        assert len(s.commitlog.queue.files) > 4 and len(s._cqs[("T", 0)].queue.files) == 5
        assert len(s.index.files) == 3
        assert not [b for b in stepped if not b.startswith((b"x", b"y"))]  # no new queue's, not the first
        if mode == "ASYNC_FLUSH":
            assert len(stepped) == 2  # the two index rolls
        assert [m.body for m in s.get_messages("V", 2, 0).messages] == [b"col", b"col"]
        assert [m.body for m in s.query_messages("T", "x119")] == [b"x119"]
    with _open(tmp_path / "steps", impl, config=cfg, clock=ListClock(range(T0, T0 + 1000))) as s:
        # every declined message step by step, as before the Appender was asked again
        s._append_declined = lambda prepared, ts: s._append_stepped(prepared, ts)  # type: ignore[method-assign]
        s._bind_queue = lambda topic, queue_id: None  # type: ignore[method-assign]
        work(s)
    assert _files(tmp_path / "s") == _files(tmp_path / "steps")
