"""Flush modes, group commit, flush failures, checkpoint publishing, locking
across processes, threads, and index rebuilds after a crash (docs/format.md#checkpoint, docs/recovery.md#flush)."""

import errno
import mmap
import os
import signal
import struct
import threading
import time

import pytest

import rmqstore.storage.mapped_file as mapped_file
from rmqstore import ConfigError, FlushError, Message, MessageStore, StoreConfig, StoreLockedError

SMALL = dict(
    mapped_file_size_commit_log=64 * 1024,
    mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=32,
    max_index_num=128,
)


def msg(i, topic="T", queue_id=None, size=100):
    return Message(topic, f"m{i:06d}".encode() * (size // 7 + 1), queue_id=i % 4 if queue_id is None else queue_id,
                   keys=f"k{i}", unique_key=f"U{i:030d}")


def checkpoint_fields(root):
    return struct.unpack(">qqqqq", (root / "checkpoint").read_bytes()[:40])


@pytest.fixture
def counted_sync(monkeypatch):
    """Count CommitLog/ConsumeQueue syncs; optionally slow each one down."""
    calls = []
    real = mapped_file._sync
    state = {"delay": 0.0}

    def sync(mf, *span):
        calls.append(mf.path)
        if state["delay"]:
            time.sleep(state["delay"])
        real(mf, *span)

    monkeypatch.setattr(mapped_file, "_sync", sync)
    return calls, state


def test_sync_flush_put_returns_after_its_record_is_on_disk(tmp_path, counted_sync):
    calls, _ = counted_sync
    cfg = StoreConfig(flush_disk_type="SYNC_FLUSH", **SMALL)
    with MessageStore.open(tmp_path / "s", config=cfg) as s:
        calls.clear()
        for i in range(50):
            r = s.put_message(msg(i))
            # flushed before it returned, and dispatched after the flush
            assert s._flushed_where >= r.wrote_offset + r.wrote_bytes
            assert s.get_messages("T", i % 4, r.queue_offset, 1).messages[0].physical_offset == r.wrote_offset
        assert len([c for c in calls if "commitlog" in c]) >= 50
        rs = s.put_messages([msg(i) for i in range(50, 80)])
        assert s._flushed_where >= rs[-1].wrote_offset + rs[-1].wrote_bytes


def test_group_commit_shares_syncs_between_threads(tmp_path, counted_sync):
    calls, state = counted_sync
    cfg = StoreConfig(flush_disk_type="SYNC_FLUSH", **SMALL)
    threads, per_thread = 8, 25
    with MessageStore.open(tmp_path / "s", config=cfg) as s:
        calls.clear()
        state["delay"] = 0.01  # a slow disk: producers pile up behind each sync
        results, errors = [], []

        def produce(t):
            try:
                for i in range(per_thread):
                    r = s.put_message(msg(t * 1000 + i, queue_id=t % 4))
                    assert s._flushed_where >= r.wrote_offset + r.wrote_bytes
                    results.append(r)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        ts = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        state["delay"] = 0.0
        assert not errors
        assert len(results) == threads * per_thread
        cl_syncs = len({i for i, c in enumerate(calls) if "commitlog" in c})
        # one sync serves every producer waiting behind it: with 8 producers
        # and a slow disk about one sync per round of 8 puts (~30 here); a
        # convoy of waiters that each sync again would need close to 200
        assert cl_syncs <= threads * per_thread // 3, cl_syncs
        for q in range(4):
            got = s.get_messages("T", q, 0, 1000).messages
            assert [m.queue_offset for m in got] == list(range(len(got)))
        assert sum(s.get_max_offset_in_queue("T", q) for q in range(4)) == threads * per_thread


def test_failed_sync_is_never_put_ok_and_stops_writes(tmp_path, monkeypatch):
    cfg = StoreConfig(flush_disk_type="SYNC_FLUSH", **SMALL)
    root = tmp_path / "s"
    s = MessageStore.open(root, config=cfg)
    ok = s.put_message(msg(0))

    def broken(mf, *span):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(mapped_file, "_sync", broken)
    with pytest.raises(FlushError) as ei:
        s.put_message(msg(1))
    assert isinstance(ei.value, OSError) and ei.value.errno == errno.EIO
    monkeypatch.undo()  # the disk "recovers": the store must still refuse writes
    with pytest.raises(FlushError):
        s.put_message(msg(2))
    with pytest.raises(FlushError):
        s.put_messages([msg(3)])
    with pytest.raises(FlushError):
        s.flush()
    s.close()
    assert (root / "abort").exists()  # kept: the next open recovers
    with MessageStore.open(root, config=cfg) as s2:
        assert not s2.last_exit_ok
        assert s2.get_message(ok.wrote_offset).body == msg(0).body
        r = s2.put_message(msg(4))
        assert r.queue_offset >= 1


def test_failed_async_flush_stops_writes(tmp_path, monkeypatch):
    cfg = StoreConfig(flush_interval_commit_log=10, flush_commit_log_thorough_interval=10, **SMALL)
    s = MessageStore.open(tmp_path / "s", config=cfg)
    monkeypatch.setattr(mapped_file, "_sync", lambda mf, *_: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    s.put_message(msg(0))
    deadline = time.monotonic() + 30
    while s._write_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s._write_error is not None
    with pytest.raises(FlushError):
        s.put_message(msg(1))
    monkeypatch.undo()
    s.close()


def test_async_flusher_flushes_without_being_asked(tmp_path):
    cfg = StoreConfig(flush_interval_commit_log=10, flush_commit_log_thorough_interval=20,
                      flush_interval_consume_queue=10, flush_consume_queue_thorough_interval=20, **SMALL)
    root = tmp_path / "s"
    with MessageStore.open(root, config=cfg, clock=iter(range(1000, 10**6)).__next__) as s:
        rs = s.put_messages([msg(i) for i in range(40)])
        end = rs[-1].wrote_offset + rs[-1].wrote_bytes
        deadline = time.monotonic() + 30
        while (s._flushed_where < end or checkpoint_fields(root)[1] != rs[-1].store_timestamp) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s._flushed_where >= end
        physic, logics, *_ = checkpoint_fields(root)
        assert physic == logics == rs[-1].store_timestamp


@pytest.fixture
def synced_files(monkeypatch):
    """The regular files fsync'd or fdatasync'd, and the index files
    flushed, while the test runs (directories are left out: a file's
    creation syncs its directory in every mode)."""
    import rmqstore.storage.index as index_mod

    synced = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def sync(fd, real=real):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if not os.path.isdir(path):
                synced.append(path)
            return real(fd)

        monkeypatch.setattr(os, name, sync)
    real_flush = index_mod.IndexFile.flush

    def index_flush(f):
        synced.append(f.path)
        real_flush(f)

    monkeypatch.setattr(index_mod.IndexFile, "flush", index_flush)
    return synced


def _kind(path):
    """The store file *path* holds data of, None for a file being created
    (an index file's temporary name, ``abort``)."""
    parts = path.split(os.sep)
    if "consumequeue" in parts:
        return "consumequeue"
    if parts[-2] in ("commitlog", "index") and parts[-1].isdigit():
        return parts[-2]
    return "checkpoint" if parts[-1] == "checkpoint" else None


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors through /proc")
@pytest.mark.parametrize("mode", ["ASYNC_FLUSH", "NO_FLUSH"])
def test_no_flush_syncs_nothing_but_file_creation(tmp_path, impl, mode, counted_sync, synced_files):
    """NO_FLUSH: no CommitLog, ConsumeQueue, index or checkpoint sync, from
    the open to the close, with every kind of file rolling and the flush
    intervals at 10 ms; the closed store reopens whole and clean.
    ASYNC_FLUSH beside it, with the same settings, syncs each kind."""
    calls, _ = counted_sync
    fast = dict(flush_interval_commit_log=10, flush_commit_log_thorough_interval=10,
                flush_interval_consume_queue=10, flush_consume_queue_thorough_interval=10)
    cfg = StoreConfig(flush_disk_type=mode, make_files_ahead=False, **fast, **SMALL)
    root = tmp_path / "s"
    s = MessageStore.open(root, config=cfg, clock=iter(range(1000, 10**6)).__next__)
    rs = []
    for i in range(0, 2000, 100):
        rs += s.put_messages([msg(j) for j in range(i, i + 100)])
        time.sleep(0.02)  # the flush thread's turns
    s.close()
    synced = {_kind(p) for p in calls + synced_files} - {None}
    assert synced == (set() if mode == "NO_FLUSH" else {"commitlog", "consumequeue", "index", "checkpoint"})
    assert len(os.listdir(root / "commitlog")) > 5 and len(os.listdir(root / "index")) > 5
    assert checkpoint_fields(root)[:2] == (rs[-1].store_timestamp,) * 2
    with MessageStore.open(root, config=cfg) as s2:
        assert s2.last_exit_ok
        for j in (0, 999, 1999):
            got = s2.get_messages("T", j % 4, rs[j].queue_offset, 1).messages[0]
            assert (got.physical_offset, got.body) == (rs[j].wrote_offset, msg(j).body)
            assert rs[j].wrote_offset in [m.physical_offset for m in s2.query_messages("T", f"k{j}")]


def test_no_flush_flushes_when_asked_and_loses_nothing_to_a_killed_process(tmp_path, counted_sync):
    """``flush()`` syncs under NO_FLUSH too; a store dropped as ``kill -9``
    drops it (nothing synced) reopens with every record, its abort file
    making the open recover."""
    calls, _ = counted_sync
    cfg = StoreConfig(flush_disk_type="NO_FLUSH", **SMALL)
    root = tmp_path / "s"
    s = MessageStore.open(root, config=cfg)
    rs = s.put_messages([msg(i) for i in range(300)])
    assert calls == []
    s.flush()
    assert any("commitlog" in c for c in calls)
    rs += s.put_messages([msg(i) for i in range(300, 600)])
    s._crash()
    with MessageStore.open(root, config=cfg) as s2:
        assert not s2.last_exit_ok
        assert s2.max_physical_offset == rs[-1].wrote_offset + rs[-1].wrote_bytes
        assert [s2.get_message(r.wrote_offset).body for r in rs[::97]] == [msg(i).body for i in range(0, 600, 97)]


def test_an_unknown_flush_disk_type_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="ASYNC_FLUSH, SYNC_FLUSH or NO_FLUSH"):
        StoreConfig(flush_disk_type="NEVER")


def test_checkpoint_publishes_only_flushed_times(tmp_path):
    """docs/recovery.md#pitfall-checkpoint-ahead-of-disk: with the flush thread idle, puts do not move the checkpoint; a
    flush publishes the store time of the last flushed record."""
    hour = 3_600_000
    cfg = StoreConfig(flush_interval_commit_log=hour, flush_interval_consume_queue=hour, **SMALL)
    root = tmp_path / "s"
    clock = iter(range(5000, 10**6, 7)).__next__
    with MessageStore.open(root, config=cfg, clock=clock) as s:
        time.sleep(1.2)  # the checkpoint writer runs each second
        before = checkpoint_fields(root)
        rs = [s.put_message(msg(i)) for i in range(10)]
        time.sleep(1.2)
        assert checkpoint_fields(root)[:2] == before[:2]
        s.flush()
        assert checkpoint_fields(root)[:2] == (rs[-1].store_timestamp, rs[-1].store_timestamp)


def test_lock_excludes_another_process(tmp_path):
    root = tmp_path / "s"
    MessageStore.open(root, config=StoreConfig(**SMALL)).close()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: hold the store until killed
        try:
            os.close(r)
            MessageStore.open(root, config=StoreConfig(**SMALL))
            os.write(w, b"1")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
        with pytest.raises(StoreLockedError):
            MessageStore.open(root, config=StoreConfig(**SMALL))
        with MessageStore.open(root, read_only=True) as ro:  # readers need no lock
            assert ro.max_physical_offset == 0
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
    with MessageStore.open(root, config=StoreConfig(**SMALL)) as s:  # a dead holder frees it
        assert not s.last_exit_ok


def test_many_producer_and_reader_threads(tmp_path):
    n_prod, per, n_queues = 4, 300, 3
    stop = threading.Event()
    errors = []
    with MessageStore.open(tmp_path / "s", config=StoreConfig(**SMALL)) as s:

        def produce(t):
            try:
                for i in range(per):
                    if i % 10 == 0:
                        s.put_messages([msg(t * 10000 + i + j, topic=f"P{t}", queue_id=j % n_queues) for j in range(3)])
                    else:
                        s.put_message(msg(t * 10000 + i, topic=f"P{t}", queue_id=i % n_queues))
            except BaseException as e:  # pragma: no cover
                errors.append(e)

        def read():
            try:
                while not stop.is_set():
                    for t in range(n_prod):
                        for q in range(n_queues):
                            got = s.get_messages(f"P{t}", q, 0, 64).messages
                            assert [m.queue_offset for m in got] == list(range(len(got)))
                            for m in got:
                                assert m.topic == f"P{t}" and m.queue_id == q and m.body.startswith(b"m")
            except BaseException as e:  # pragma: no cover
                errors.append(e)

        readers = [threading.Thread(target=read) for _ in range(2)]
        producers = [threading.Thread(target=produce, args=(t,)) for t in range(n_prod)]
        for th in readers + producers:
            th.start()
        for th in producers:
            th.join()
        stop.set()
        for th in readers:
            th.join()
        assert not errors, errors[0]
        total = sum(s.get_max_offset_in_queue(f"P{t}", q) for t in range(n_prod) for q in range(n_queues))
        assert total == n_prod * (per + per // 10 * 2)
        offsets = [m.physical_offset for m in s.iter_messages()]
        assert len(offsets) == total and offsets == sorted(offsets)


def test_torn_index_file_is_rebuilt_after_a_crash(tmp_path):
    root = tmp_path / "s"
    cfg = StoreConfig(**SMALL)
    with MessageStore.open(root, config=cfg) as s:
        rs = [s.put_message(msg(i)) for i in range(150)]
    files = sorted((root / "index").iterdir())
    assert len(files) >= 2
    original = files[-1].read_bytes()
    s = MessageStore.open(root, config=cfg)
    s._crash()
    # a power loss lost some pages of the last index file
    base = 40 + 4 * 32
    data = bytearray(original)
    data[base + 20 * 5 : base + 20 * 9] = bytes(80)
    files[-1].write_bytes(bytes(data))
    with MessageStore.open(root, config=cfg) as s:
        assert s.recovery_report["index_keys_added"] > 0
        for i, r in enumerate(rs):
            assert [m.physical_offset for m in s.query_messages("T", f"k{i}")] == [r.wrote_offset]
            assert [m.physical_offset for m in s.query_messages("T", f"U{i:030d}")] == [r.wrote_offset]
    rebuilt = sorted((root / "index").iterdir())
    assert len(rebuilt) == len(files)
    assert rebuilt[-1].read_bytes() == original  # the rebuild writes the very same entries


def test_index_catches_up_with_records_it_lacks(tmp_path):
    """A crash after the CommitLog append but before indexing (simulated by
    cutting the index back) leaves records the index lacks: reopening indexes them."""
    root = tmp_path / "s"
    cfg = StoreConfig(**SMALL)
    with MessageStore.open(root, config=cfg) as s:
        rs = [s.put_message(msg(i)) for i in range(20)]
        s.index.truncate(rs[12].wrote_offset, lambda phy: s.commitlog.store_timestamp_at(phy, 1))
        assert s.query_offsets("T", "k15") == []
        s._crash()
    with MessageStore.open(root, config=cfg) as s:
        assert s.recovery_report["index_keys_added"] == 16  # 8 records x (UNIQ_KEY + KEYS)
        for i in range(20):
            assert [m.physical_offset for m in s.query_messages("T", f"k{i}")] == [rs[i].wrote_offset]


def test_crc_property_protects_header_fields_in_recovery(tmp_path):
    """With enabled_append_prop_crc, recovery checks the store's own __CRC32#
    entry too: a flipped QUEUEOFFSET byte (outside the body CRC) stops it."""
    root = tmp_path / "s"
    cfg = StoreConfig(enabled_append_prop_crc=True, **SMALL)
    with MessageStore.open(root, config=cfg) as s:
        rs = [s.put_message(msg(i, queue_id=0)) for i in range(10)]
        s._crash()
    seg = root / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    data[rs[7].wrote_offset + 27] ^= 0x01  # low byte of QUEUEOFFSET
    seg.write_bytes(bytes(data))
    with MessageStore.open(root, config=cfg) as s:
        assert s.max_physical_offset == rs[7].wrote_offset
        assert s.get_max_offset_in_queue("T", 0) == 7
    # without the store's CRC entries (feature off), the same flip goes unnoticed
    root2 = tmp_path / "s2"
    cfg2 = StoreConfig(**SMALL)
    with MessageStore.open(root2, config=cfg2) as s:
        rs = [s.put_message(msg(i, queue_id=0)) for i in range(10)]
        s._crash()
    seg = root2 / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    data[rs[7].wrote_offset + 27] ^= 0x01
    seg.write_bytes(bytes(data))
    with MessageStore.open(root2, config=cfg2) as s:
        assert s.max_physical_offset == rs[-1].wrote_offset + rs[-1].wrote_bytes


def test_recovery_writes_abort_before_touching_files(tmp_path, monkeypatch):
    """A crash during recovery leaves the abort file, so the next open recovers again."""
    root = tmp_path / "s"
    cfg = StoreConfig(**SMALL)
    with MessageStore.open(root, config=cfg) as s:
        for i in range(20):
            s.put_message(msg(i))
    assert not (root / "abort").exists()

    def boom(self, *a, **kw):
        raise RuntimeError("crash during recovery")

    monkeypatch.setattr(MessageStore, "_recover_index", boom)
    with pytest.raises(RuntimeError):
        MessageStore.open(root, config=cfg)
    monkeypatch.undo()
    assert (root / "abort").exists()
    with MessageStore.open(root, config=cfg) as s:
        assert not s.last_exit_ok
        assert sum(s.get_max_offset_in_queue("T", q) for q in range(4)) == 20


class _FlushSeen(mmap.mmap):
    """A shared mapping that counts its ``flush`` calls (a sync that holds the GIL)."""

    flush_calls = 0

    def flush(self, *args):
        self.flush_calls += 1
        return super().flush(*args)


def test_an_index_file_flush_releases_the_gil_where_the_core_can(tmp_path, impl):
    """``MessageStore.flush`` and close sync each index file whole: through
    the core's ``sync_pages`` (msync, the GIL released) rather than
    ``mmap.flush``, which would stall every other thread for the whole
    write-back; the pure twin, which cannot, keeps ``mmap.flush``."""
    from rmqstore.storage.index import IndexFile

    f = IndexFile(str(tmp_path / "20260101000000000"), 8, 16, create=True)
    fd = os.open(f.path, os.O_RDWR)
    try:
        seen = _FlushSeen(fd, len(f.mm))
    finally:
        os.close(fd)
    f.close()
    f.mm = seen
    seen[100:104] = b"abcd"
    f.flush()
    assert seen.flush_calls == (0 if impl == "cython" else 1)
    with open(f.path, "rb") as fh:
        fh.seek(100)
        assert fh.read(4) == b"abcd"
    f.close()
    assert seen.closed


def test_an_index_file_closed_while_another_thread_holds_its_mapping_is_left_to_it(tmp_path, impl):
    """Clean-up or a close may unmap an index file while another thread's
    GIL-free sync or warm-up holds its mapping: Python refuses to unmap it
    then, and the close leaves it to that call instead of failing."""
    from rmqstore.storage.index import IndexFile

    f = IndexFile(str(tmp_path / "20260101000000000"), 8, 16, create=True)
    held = memoryview(f.mm)  # (what a call with the GIL released holds meanwhile)
    f.close()
    assert not f.mm.closed
    held.release()
    f.close()
    assert f.mm.closed
    f.flush()  # (closed: nothing to sync)
