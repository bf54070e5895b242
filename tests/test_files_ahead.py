"""Files made ahead (docs/format.md#files-made-ahead): the next CommitLog
segment, ConsumeQueue file and index file are made and warmed by a service
thread before a roll needs them; a kill -9 with a file made ahead but never
used leaves a store that opens with every record; a follower never mistakes
the file made ahead for the writer's; and ``warm_pages`` never changes a byte.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import signal
import sys
import threading
import time

import pytest

from conftest import no_hang
from rmqstore import Message, MessageStore, StoreConfig
from rmqstore import _kernels as k
from rmqstore.storage.mapped_file import MappedFileQueue

SEG = 1 << 20  # 1 MiB CommitLog segments: a roll every ~2,400 puts of 400 B
BODY = bytes(range(256)) + bytes(100)


def _config(**kw) -> StoreConfig:
    base = {"mapped_file_size_commit_log": SEG, "mapped_file_size_consume_queue": 1000 * 20,
            "max_hash_slot_num": 100, "max_index_num": 400, "flush_least_pages_when_warm_maped_file": 16}
    return StoreConfig(**{**base, **kw})


_SMAPS = pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")


def _segments(root) -> list:
    d = os.path.join(root, "commitlog")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def _inodes(root) -> list:
    """The CommitLog segments' inodes, in offset order (a file made again has another)."""
    return [os.stat(os.path.join(root, "commitlog", n)).st_ino for n in _segments(root)]


def _wait_for(pred, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the service thread")
        time.sleep(0.01)


def _put(store, n: int, start: int = 0, queues: int = 2) -> list:
    return [store.put_message(Message("Ahead", BODY, queue_id=i % queues, keys=f"k{i}"))
            for i in range(start, start + n)]


def _message(store, queue_id: int, offset: int):
    (m,) = store.get_messages("Ahead", queue_id, offset, 1).messages
    return m


@pytest.mark.parametrize("warm", [True, False])
def test_the_next_segment_is_made_before_the_roll_and_the_roll_takes_it(tmp_path, warm):
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config(warm_maped_file_enable=warm)) as store:
        _put(store, 1)
        _wait_for(lambda: len(_segments(root)) == 2)  # the next one, as RocketMQ keeps it
        time.sleep(0.2)
        assert len(_segments(root)) == 2  # (a small store: one spare, not two)
        spare = os.path.join(root, "commitlog", f"{SEG:020d}")
        ino = os.stat(spare).st_ino
        with open(spare, "rb") as f:
            assert f.read() == bytes(SEG)  # made ahead: reserved, all zero
        results = []
        while not results or results[-1].wrote_offset < SEG // 2:
            results += _put(store, 100, len(results))
        _wait_for(lambda: len(_segments(root)) == 3)  # past half: the one after the next too
        while results[-1].wrote_offset < SEG:
            results += _put(store, 100, len(results))
        assert os.stat(spare).st_ino == ino  # the roll switched to it, made nothing
        n = len(results) + 1  # (and the first put)
    # a clean close deletes the file made ahead: no segment past the data
    assert _segments(root) == [f"{0:020d}", f"{SEG:020d}"]
    with MessageStore.open(root, _config(), read_only=True) as ro:
        assert ro.get_max_offset_in_queue("Ahead", 0) + ro.get_max_offset_in_queue("Ahead", 1) == n
        assert ro.max_physical_offset == results[-1].wrote_offset + results[-1].wrote_bytes


@pytest.mark.parametrize("warm", [True, False])
def test_an_empty_store_has_its_first_segment_and_the_next_made_before_the_first_put(tmp_path, warm):
    # the first put writes the first one: made at the open, it has no spare
    # yet, and the thread would make and warm one beside the first puts
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config(warm_maped_file_enable=warm)) as store:
        _wait_for(lambda: len(_segments(root)) == 2)
        made = _inodes(root)
        first = _put(store, 1)[0]
        assert first.wrote_offset == 0
        time.sleep(0.2)
        assert _inodes(root) == made
    assert _segments(root) == [f"{0:020d}"]  # (the close deleted the spare)


def test_a_store_closed_before_its_first_put_leaves_no_segment(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config()):
        _wait_for(lambda: len(_segments(root)) == 2)
    assert _segments(root) == []
    with MessageStore.open(root, _config()) as store:
        assert _put(store, 1)[0].wrote_offset == 0


def test_sync_flush_with_warm_up_rolls_into_the_files_made_ahead(tmp_path):
    root = str(tmp_path / "s")
    cfg = _config(flush_disk_type="SYNC_FLUSH")
    with MessageStore.open(root, cfg) as store:
        _put(store, 1)
        _wait_for(lambda: len(_segments(root)) == 2)
        results = store.put_messages([Message("Ahead", BODY, queue_id=i % 2, keys=f"k{i}") for i in range(1, 3000)])
        assert results[-1].wrote_offset >= SEG
    with MessageStore.open(root, cfg, read_only=True) as ro:
        assert ro.max_physical_offset == results[-1].wrote_offset + results[-1].wrote_bytes
        assert [m.keys for m in ro.query_messages("Ahead", "k2999", 4)] == ["k2999"]


def test_without_the_service_no_file_is_made_ahead(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config(make_files_ahead=False)) as store:
        _put(store, 1)
        time.sleep(0.3)
        assert _segments(root) == [f"{0:020d}"]
        assert not [n for n in os.listdir(os.path.join(root, "index")) if n.endswith(".tmp")]


def test_a_queue_past_half_and_the_index_past_half_get_their_next_file(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config()) as store:
        _put(store, 300, queues=1)  # the index past 200 of its 400 entries, queue 0 below half of 1000 units
        idir = os.path.join(root, "index")
        _wait_for(lambda: any(n.endswith(".tmp") for n in os.listdir(idir)))
        qdir = os.path.join(root, "consumequeue", "Ahead", "0")
        time.sleep(0.2)
        assert os.listdir(qdir) == [f"{0:020d}"]
        _put(store, 220, 300, queues=1)  # queue 0 past half
        _wait_for(lambda: len(os.listdir(qdir)) == 2)
        assert sorted(os.listdir(qdir)) == [f"{0:020d}", f"{20000:020d}"]
        results = _put(store, 700, 520, queues=1)  # into the queue's second file and the index's second
        assert results[-1].queue_offset == 1219
        assert len(store.query_messages("Ahead", "k1100", 10)) == 1
    with MessageStore.open(root, _config(), read_only=True) as ro:
        assert ro.get_max_offset_in_queue("Ahead", 0) == 1220
        assert [m.keys for m in ro.query_messages("Ahead", "k1219", 10)] == ["k1219"]


def test_the_index_file_a_roll_leaves_is_flushed_by_the_service_then_counted_full(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config()) as store:
        _put(store, 420)  # past the first index file's 399 entries
        assert len(store.index.files) == 2
        first_end = store.index.files[0].end_timestamp
        _wait_for(lambda: not store.index.rolled)
        assert store.index.last_full_end_timestamp == first_end
        if k.IMPLEMENTATION == "cython" and os.path.exists("/proc/self/smaps"):
            # it takes no more entries: unmapped before its sync (a read of
            # its header since maps that page back)
            assert _rss_pages(store.index.files[0].path) <= 1
        assert [m.keys for m in store.query_messages("Ahead", "k7")] == ["k7"]  # (k7 is in the first file)


def test_a_put_makes_the_file_itself_when_the_service_cannot(tmp_path, monkeypatch, caplog):
    real = MappedFileQueue.create_segment

    def failing_in_the_service(self, start, *args, **kw):
        if threading.current_thread().name.startswith("rmqstore-allocate"):
            raise OSError(28, "No space left on device (test)")
        return real(self, start, *args, **kw)

    monkeypatch.setattr(MappedFileQueue, "create_segment", failing_in_the_service)
    root = str(tmp_path / "s")
    with caplog.at_level(logging.WARNING, logger="rmqstore.allocate"), MessageStore.open(root, _config()) as store:
        results = _put(store, 2600)  # rolls: every segment made by the put that needs it
        assert results[-1].wrote_offset >= SEG
        _wait_for(lambda: "could not make a file ahead" in caplog.text)
        assert "No space left on device (test)" in caplog.text
    with MessageStore.open(root, _config(), read_only=True) as ro:
        assert sum(ro.get_max_offset_in_queue("Ahead", q) for q in (0, 1)) == 2600


def _child_puts_then_dies(root: str, n: int, w: int, segments: int = 3) -> None:
    try:
        store = MessageStore.open(root, _config())
        _put(store, n)
        deadline = time.monotonic() + 10
        while len(_segments(root)) < segments and time.monotonic() < deadline:
            time.sleep(0.01)
        store.flush()
        os.write(w, b"ok" if len(_segments(root)) >= segments else b"no")
        os.kill(os.getpid(), signal.SIGKILL)
    finally:
        os._exit(1)


def _killed_after_puts(root: str, n: int, segments: int = 3) -> None:
    """A child process puts *n* messages, waits for *segments* CommitLog
    segments, flushes and is killed (-9); returns once it is gone."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child_puts_then_dies(root, n, w, segments)
    os.close(w)
    with no_hang(60):
        said = os.read(r, 2)
        os.close(r)
        _, status = os.waitpid(pid, 0)
    assert said == b"ok" and os.WIFSIGNALED(status)


def test_a_kill_with_a_file_made_ahead_but_unused_loses_nothing(tmp_path):
    root = str(tmp_path / "s")
    n = 1500  # past half of segment 0: the next two are made
    _killed_after_puts(root, n)
    assert len(_segments(root)) == 3  # the files made ahead survived the kill, all zero
    assert os.path.exists(os.path.join(root, "abort"))
    with MessageStore.open(root, _config(), read_only=True) as ro:  # a reader before any writer: same answer
        assert sum(ro.get_max_offset_in_queue("Ahead", q) for q in (0, 1)) == n
    with MessageStore.open(root, _config(make_files_ahead=False)) as store:
        assert store.get_max_offset_in_queue("Ahead", 0) == n // 2
        assert store.get_max_offset_in_queue("Ahead", 1) == n // 2
        m = _message(store, 1, n // 2 - 1)
        assert m.keys == f"k{n - 1}" and m.body == BODY
        assert _segments(root) == [f"{0:020d}"]  # recovery deleted the segment past the end
        end = store.max_physical_offset
        r2 = _put(store, 1, n)[0]
        assert r2.wrote_offset == end


def test_a_kill_before_the_first_put_leaves_an_empty_store(tmp_path):
    root = str(tmp_path / "s")
    _killed_after_puts(root, 0, segments=2)
    assert len(_segments(root)) == 2  # both made ahead, all zero
    with MessageStore.open(root, _config(), read_only=True) as ro:
        assert ro.max_physical_offset == 0 and ro.get_max_offset_in_queue("Ahead", 0) == 0
    with MessageStore.open(root, _config(make_files_ahead=False)) as store:
        assert _segments(root) == [f"{0:020d}"]  # recovery deleted the segment past the end
        assert _put(store, 1)[0].wrote_offset == 0
    with MessageStore.open(root, _config(), read_only=True) as ro:
        assert _message(ro, 0, 0).keys == "k0"


def test_a_follower_opened_before_the_first_file_reads_the_writers_records(tmp_path):
    root = tmp_path / "s"
    root.mkdir()
    with MessageStore.open(str(root), _config(), read_only=True) as follower, \
            MessageStore.open(str(root), _config()) as store:
        results = _put(store, 10)
        _wait_for(lambda: len(_segments(str(root))) == 2)  # segment 0 and the one made ahead
        follower.refresh()
        end = results[-1].wrote_offset + results[-1].wrote_bytes
        assert follower.max_physical_offset == end
        assert follower.get_max_offset_in_queue("Ahead", 1) == 5
        assert _message(follower, 1, 4).keys == "k9"
        more = _put(store, 2600, 10)  # into the segment made ahead, and past it
        follower.refresh()
        assert follower.max_physical_offset == more[-1].wrote_offset + more[-1].wrote_bytes
        assert _message(follower, 1, 1304).keys == "k2609"


# --- warm_pages ---------------------------------------------------------------------


@pytest.fixture
def mapped(tmp_path):
    path = tmp_path / "f"
    size = 64 * mmap.PAGESIZE
    with open(path, "wb") as f:
        f.truncate(size)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, size)
    yield mm
    mm.close()
    os.close(fd)


def test_warm_pages_changes_no_byte(impl, mapped):
    data = os.urandom(len(mapped) // 2)
    mapped[100:100 + len(data)] = data
    before = bytes(mapped)
    assert k.warm_pages(mapped, 0, len(mapped)) in (True, False)
    assert k.warm_pages(mapped, 7, 5) is True  # empty range
    assert k.warm_pages(mapped, -10, 10**12) in (True, False)  # clipped to the buffer
    assert bytes(mapped) == before


def test_warm_pages_loses_no_write_made_meanwhile(impl, mapped):
    stop = threading.Event()

    def warm():
        while not stop.is_set():
            k.warm_pages(mapped, 0, len(mapped))

    t = threading.Thread(target=warm)
    t.start()
    try:
        expect = bytearray(len(mapped))
        for i in range(0, len(mapped), 997):
            b = os.urandom(13)
            mapped[i:i + 13] = b
            expect[i:i + 13] = b
    finally:
        stop.set()
        t.join()
    assert bytes(mapped) == bytes(expect[: len(mapped)])


def test_warm_pages_refuses_a_read_only_buffer(impl, mapped):
    with pytest.raises(BufferError):
        k.warm_pages(b"abc", 0, 3)
    ro = mmap.mmap(mapped.fileno(), 0, access=mmap.ACCESS_READ) if hasattr(mapped, "fileno") else None
    if ro is not None:
        with pytest.raises(BufferError):
            k.warm_pages(ro, 0, 10)
        ro.close()


# --- sync_pages, and what a flush syncs ------------------------------------------------


def test_sync_pages_changes_no_byte_and_says_whether_it_synced(impl, mapped):
    mapped[100:9000] = os.urandom(8900)
    before = bytes(mapped)
    synced = k.IMPLEMENTATION == "cython"  # (the twin cannot release the GIL around msync)
    assert k.sync_pages(mapped, 100, 9000) is synced
    assert k.sync_pages(mapped, -10, 10**12) is synced  # clipped to the buffer
    assert bytes(mapped) == before
    with pytest.raises(TypeError):
        k.sync_pages(3, 0, 1)
    with pytest.raises(TypeError):
        k.sync_pages(mapped, 0.5, 1)


def _rss_pages(path) -> int:
    """Pages of *path* this process maps now (Rss in /proc/self/smaps)."""
    path, kb, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if not head[0].endswith(":"):  # a mapping: address range, mode, offset, device, inode[, path]
                inside = len(head) > 5 and head[5] == path
            elif inside and head[0] == "Rss:":
                kb += int(head[1])
    return kb * 1024 // mmap.PAGESIZE


@_SMAPS
def test_release_pages_unmaps_the_whole_pages_and_keeps_every_byte(impl, tmp_path):
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(64 * mmap.PAGESIZE)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 64 * mmap.PAGESIZE)
    try:
        data = os.urandom(32 * mmap.PAGESIZE)
        mm[: len(data)] = data
        mapped = _rss_pages(path)
        assert mapped >= 32
        released = k.IMPLEMENTATION == "cython"  # (the twin's madvise would hold the GIL)
        # pages 1..19: the page holding byte 10 and the one holding the end are partly outside
        assert k.release_pages(mm, 10, 20 * mmap.PAGESIZE + 5) is released
        assert _rss_pages(path) == (mapped - 19 if released else mapped)
        assert k.release_pages(mm, 10, 20) is True  # no whole page: nothing to do
        assert k.release_pages(mm, -10, 10**12) is released  # clipped to the buffer
        assert bytes(mm[: len(data)]) == data  # mapped again, from the page cache
        mm[5 * mmap.PAGESIZE:5 * mmap.PAGESIZE + 3] = b"new"  # and written again
        os.fsync(fd)
        with open(path, "rb") as f:
            assert f.read(len(data)) == data[: 5 * mmap.PAGESIZE] + b"new" + data[5 * mmap.PAGESIZE + 3:]
    finally:
        mm.close()
        os.close(fd)


def test_release_pages_takes_only_a_files_mapping(impl):
    # (the advice would zero the bytes of a private or heap buffer)
    for buf in (bytearray(3 * mmap.PAGESIZE), b"abc", memoryview(bytearray(10))):
        with pytest.raises(TypeError):
            k.release_pages(buf, 0, len(buf))
    with pytest.raises(TypeError):
        k.release_pages(mmap.mmap(-1, mmap.PAGESIZE), 0.5, 1)


@pytest.fixture
def segment(tmp_path, monkeypatch):
    """A 64-page MappedFile, and the ``(start, end)`` spans its syncs ask for
    (None: the whole file)."""
    from rmqstore.storage import mapped_file

    spans = []
    real = mapped_file._sync

    def sync(mf, start=0, end=None):
        spans.append(None if end is None else (start, end))
        real(mf, start, end)

    monkeypatch.setattr(mapped_file, "_sync", sync)
    mf = mapped_file.MappedFile(tmp_path / f"{0:020d}", 64 * mmap.PAGESIZE, create=True)
    yield mf, spans
    mf.close()


def _append(mf, n: int) -> None:
    mf.mm[mf.wrote_position:mf.wrote_position + n] = os.urandom(n)
    mf.wrote_position += n


def test_a_least_pages_flush_syncs_the_whole_pages_appended_and_leaves_the_one_being_written(impl, segment):
    mf, spans = segment
    page = mmap.PAGESIZE
    _append(mf, 100)
    assert not mf.flush(1)  # no whole page yet
    _append(mf, 2 * page)
    assert mf.flush(1)
    assert spans == [(0, 2 * page)] and mf.flushed_position == 2 * page
    _append(mf, 10)
    assert mf.flush(0)  # a complete flush: every byte appended, from where the last one stopped
    assert spans[1] == (2 * page, 2 * page + 110) and mf.flushed_position == 2 * page + 110
    assert not mf.flush(0)  # nothing new


def test_a_full_file_is_flushed_to_its_end_whatever_the_least_pages(impl, segment):
    mf, spans = segment
    _append(mf, mf.file_size - 5)
    assert mf.flush(1)
    _append(mf, 5)
    assert mf.flush(10**6)
    assert spans[-1][1] == mf.file_size and mf.flushed_position == mf.file_size


def test_a_failed_flush_moves_nothing(impl, segment, monkeypatch):
    from rmqstore.storage import mapped_file

    mf, _ = segment
    _append(mf, 3 * mmap.PAGESIZE)

    def fail(*a):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(mapped_file, "_sync", fail)
    with pytest.raises(OSError):
        mf.flush(1)
    assert mf.flushed_position == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's write-back and fault counts")
def test_a_flush_leaves_the_pages_warmed_ahead_writable(impl, tmp_path):
    """The point of syncing a range: pages the warm-up made writable past the
    write position are not written back (as zeros) and write-protected by
    the flush, so the puts that later fill them take no page fault; a sync
    of the whole file (the control) costs a fault a page."""
    import resource

    from rmqstore.storage.mapped_file import MappedFile, _sync_file

    if k.IMPLEMENTATION != "cython":
        pytest.skip("the twin syncs the whole file (no range sync without holding the GIL)")

    def faults_writing(first: int, last: int) -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for p in range(first, last):  # a byte a page
            mf.mm[p * mmap.PAGESIZE] = 1
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    mf = MappedFile(tmp_path / f"{0:020d}", 256 * mmap.PAGESIZE, create=True)
    try:
        k.warm_pages(mf.mm, 0, mf.file_size)
        _append(mf, 8 * mmap.PAGESIZE)
        assert mf.flush(4)
        after_flush = faults_writing(16, 128)
        _sync_file(mf)
        after_whole_sync = faults_writing(128, 256)
    finally:
        mf.close()
    if after_whole_sync < 64:
        pytest.skip(f"this file system does not write-protect pages it writes back ({after_whole_sync} faults)")
    assert after_flush < 16


@_SMAPS
def test_a_flush_unmaps_the_whole_pages_it_syncs_and_no_page_warmed_ahead(impl, tmp_path):
    """The pages a flush syncs are written for good: unmapped before the
    sync (``release_pages``), they need no TLB shootdown on a putting
    thread's CPU as they are cleaned; the page being written and the pages
    warmed ahead stay mapped."""
    from rmqstore.storage.mapped_file import MappedFile

    if k.IMPLEMENTATION != "cython":
        pytest.skip("the twin neither syncs a range nor releases one")
    mf = MappedFile(tmp_path / f"{0:020d}", 64 * mmap.PAGESIZE, create=True)
    try:
        k.warm_pages(mf.mm, 0, mf.file_size)
        mapped = _rss_pages(mf.path)
        assert mapped == 64
        data = os.urandom(10 * mmap.PAGESIZE + 100)
        mf.mm[: len(data)] = data
        mf.wrote_position = len(data)
        assert mf.flush(1)  # pages 0..9
        assert _rss_pages(mf.path) == 54
        assert mf.flush(0)  # the page being written: synced, kept
        assert _rss_pages(mf.path) == 54
        assert bytes(mf.mm[: len(data)]) == data
    finally:
        mf.close()


def _read_around(root) -> dict:
    """How this process maps the files under *root*: name (relative) ->
    False when a fault there reads around (the default), True when the
    mapping is advised random (``rr`` in /proc/self/smaps' VmFlags)."""
    root = os.path.realpath(root) + os.sep
    out, name = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head[0].endswith(":"):
                if head[0] == "VmFlags:" and name is not None:
                    out[name] = "rr" in head[1:]
            else:  # a mapping: address range, mode, offset, device, inode[, path]
                name = head[5][len(root):] if len(head) > 5 and head[5].startswith(root) else None
    return out


@_SMAPS
def test_a_file_made_here_faults_in_a_page_at_a_time_until_its_writer_leaves_it(impl, tmp_path):
    """A new file is all zeros: read-around on its first fault would fill a
    whole read-ahead window of them on the put's time. Without warm-up a
    file made here keeps read-around off while it is written, and gets it
    back when the writer rolls past it; files a reopen maps have it."""
    root = str(tmp_path / "s")
    cq0 = os.path.join("consumequeue", "Ahead", "0", f"{0:020d}")
    first, second = os.path.join("commitlog", f"{0:020d}"), os.path.join("commitlog", f"{SEG:020d}")
    with MessageStore.open(root, _config(warm_maped_file_enable=False)) as store:
        _put(store, 1)
        _wait_for(lambda: second in _read_around(root))  # the spare, made ahead
        maps = _read_around(root)
        index = [n for n in maps if n.startswith("index")]
        assert maps[first] and maps[second] and maps[cq0] and index and all(maps[n] for n in index)
        results = _put(store, 100)
        while results[-1].wrote_offset < SEG:
            results += _put(store, 100, len(results))
        maps = _read_around(root)
        assert maps[first] is False  # left behind: read-around again (its readers, once it is evicted)
        assert maps[second] is True  # written now
    with MessageStore.open(root, _config(warm_maped_file_enable=False)) as store:
        maps = _read_around(root)
        assert maps[first] is False and maps[cq0] is False  # files with data: as the kernel maps them


@_SMAPS
def test_warm_up_gives_read_around_back_to_the_files_it_made_and_to_a_new_queues_first_file(impl, tmp_path):
    """With warm-up (the default) the service warms what it made, and also
    the file a put made for a new queue, from the write position on; each
    then reads around again."""
    root = str(tmp_path / "s")
    cq3 = os.path.join("consumequeue", "Ahead", "3", f"{0:020d}")
    with MessageStore.open(root, _config()) as store:
        store.put_message(Message("Ahead", BODY, queue_id=3, keys="k"))  # a new queue: its file made by the put
        assert cq3 in _read_around(root)
        _wait_for(lambda: not any(_read_around(root).values()))
        assert store.get_messages("Ahead", 3, 0, 1).messages[0].keys == "k"


def test_settle_is_idempotent_and_quiet_on_a_closed_file(tmp_path):
    from rmqstore.storage.mapped_file import MappedFile, settle

    mf = MappedFile(tmp_path / f"{0:020d}", 16 * mmap.PAGESIZE, create=True)
    assert mf.fresh is hasattr(mmap, "MADV_RANDOM")
    mf.close()
    settle(mf)  # (clean-up or an undo closed it before the service got to it)
    settle(mf)
    assert mf.fresh is False


def test_clean_up_deletes_old_segments_never_the_current_one_or_the_one_made_ahead(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config(clean_service_enable=False)) as store:
        results = _put(store, 6500)  # two rolls, and past half of the third segment
        _wait_for(lambda: len(_segments(root)) == 5)
        current = _segments(root)[2]
        report = store.delete_expired(force=True)
        assert report.deleted == 2
        assert _segments(root) == [current, f"{3 * SEG:020d}", f"{4 * SEG:020d}"]
        assert store.get_message(results[-1].wrote_offset).keys == "k6499"
        more = _put(store, 3000, 6500)  # into the segment made ahead
        assert more[-1].wrote_offset >= 3 * SEG
        assert store.get_message(more[-1].wrote_offset).keys == "k9499"


def test_a_store_renamed_while_open_is_not_made_again_under_its_old_path(tmp_path, caplog):
    old, new = tmp_path / "s", tmp_path / "moved"

    def put_plain(store, n):  # no keys (no index entries), queue 0: its file fills, nothing rolls
        for _ in range(n):
            store.put_message(Message("Ahead", BODY, queue_id=0))

    with caplog.at_level(logging.WARNING, logger="rmqstore.allocate"), MessageStore.open(old, _config()) as store:
        put_plain(store, 300)
        _wait_for(lambda: len(_segments(str(old))) == 2)
        os.rename(old, new)
        try:
            put_plain(store, 250)  # past half of the queue's file: the thread wants its next one
            _wait_for(lambda: "could not make a file ahead" in caplog.text)
            assert not old.exists()  # nothing made under the path the store left
        finally:
            os.rename(new, old)  # (the open files work by their paths)
        assert store.get_max_offset_in_queue("Ahead", 0) == 550


# --- the disk turn and the directory entries a put leaves to the flush -------------------


def test_warm_up_and_the_flush_threads_syncs_never_run_at_once(tmp_path, monkeypatch):
    # each warm-up step and each sync of the flush thread holds the store's
    # disk turn; while another holder has it, the warm-up waits
    from rmqstore.service import allocate

    seen = []
    real_warm = allocate.k.warm_pages

    def warm(mm, start, end):
        seen.append(("warm", store._disk_turn.locked()))
        return real_warm(mm, start, end)

    monkeypatch.setattr(allocate.k, "warm_pages", warm)
    real_flush = MappedFileQueue.flush

    def flush(q, least_pages=0):
        if threading.current_thread().name.startswith("rmqstore-flush"):
            seen.append(("flush", store._disk_turn.locked()))
        return real_flush(q, least_pages)

    monkeypatch.setattr(MappedFileQueue, "flush", flush)
    root = str(tmp_path / "s")
    cfg = _config(flush_interval_commit_log=10, flush_interval_consume_queue=10, flush_commit_log_least_pages=0)
    with MessageStore.open(root, cfg) as store:
        _put(store, 1)
        _wait_for(lambda: {"warm", "flush"} <= {what for what, _ in seen})
        with store._disk_turn:  # (as if the flush thread were syncing)
            before = sum(what == "warm" for what, _ in seen)
            results = _put(store, 1500)  # past half a segment: the one after the next is made
            _wait_for(lambda: len(_segments(root)) == 3)
            time.sleep(0.3)
            assert sum(what == "warm" for what, _ in seen) == before  # made, not warmed: it waits its turn
        _wait_for(lambda: sum(what == "warm" for what, _ in seen) > before)
        assert results[-1].status.name == "PUT_OK"
    assert all(held for _, held in seen)


def test_a_queues_new_file_has_its_directory_synced_by_the_next_flush_not_by_the_put(tmp_path, monkeypatch):
    from rmqstore.storage import mapped_file

    synced = []
    real = mapped_file.fsync_dir
    monkeypatch.setattr(mapped_file, "fsync_dir", lambda path: (synced.append(os.path.basename(path)), real(path)))
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config(make_files_ahead=False, flush_interval_consume_queue=60_000)) as store:
        synced.clear()
        store.put_message(Message("Ahead", BODY, queue_id=7))
        # the CommitLog's first segment, made by the put, is synced at once
        assert synced == ["commitlog"]
        cq = store._cqs[("Ahead", 7)]
        assert cq.queue.dir_unsynced and os.path.isdir(cq.queue.directory)
        store.flush()
        assert synced == ["commitlog", "7"] and not cq.queue.dir_unsynced
        store.flush()
        assert synced == ["commitlog", "7"]  # once


def test_a_failed_directory_sync_is_raised_and_tried_again_by_the_next_flush(tmp_path, monkeypatch):
    from rmqstore.storage import mapped_file

    q = MappedFileQueue(str(tmp_path / "q"), 4096, sync_creation=False)
    q.last_for_append(0)
    assert q.dir_unsynced

    def fails(path):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(mapped_file, "fsync_dir", fails)
    with pytest.raises(OSError):
        q.flush()
    assert q.dir_unsynced
    made_meanwhile = []

    def a_put_makes_a_file_during_the_sync(path):
        made_meanwhile.append(path)
        q.dir_unsynced = True  # (what create_segment does)

    monkeypatch.setattr(mapped_file, "fsync_dir", a_put_makes_a_file_during_the_sync)
    q.flush()
    assert made_meanwhile and q.dir_unsynced  # that file's entry waits for the next flush
    monkeypatch.setattr(mapped_file, "fsync_dir", lambda path: None)
    q.flush()
    assert not q.dir_unsynced
    q.close()


def _index_dir_syncs(monkeypatch) -> list:
    """Record (thread name) of each sync of an index directory."""
    from rmqstore.storage import index as index_module

    calls = []
    real = index_module.fsync_dir

    def recording(path):
        calls.append(threading.current_thread().name)
        return real(path)

    monkeypatch.setattr(index_module, "fsync_dir", recording)
    return calls


def _index_names(root) -> list:
    return sorted(os.listdir(os.path.join(root, "index")))


def test_an_index_roll_publishes_its_spare_and_the_service_syncs_it(tmp_path, monkeypatch):
    calls = _index_dir_syncs(monkeypatch)
    root = str(tmp_path / "s")
    with MessageStore.open(root, _config()) as store:
        index = store.index
        results = _put(store, 1200)  # 400-entry files: rolls
        assert len([n for n in _index_names(root) if not n.endswith(".tmp")]) >= 3  # renamed on the put
        assert not any(name == "MainThread" for name in calls)  # no sync on the put
        _wait_for(lambda: not index.published and not index.rolled)
        assert calls and all(name.startswith("rmqstore-allocate") for name in calls)
        keys = [f"k{i}" for i in range(0, 1200, 97)]
        for key, i in zip(keys, range(0, 1200, 97)):
            assert [m.physical_offset for m in store.query_messages("Ahead", key)] == [results[i].wrote_offset]


def test_without_the_service_an_index_roll_syncs_on_the_put(tmp_path, monkeypatch):
    calls = _index_dir_syncs(monkeypatch)
    with MessageStore.open(str(tmp_path / "s"), _config(make_files_ahead=False)) as store:
        _put(store, 1200)
        assert calls.count("MainThread") >= 3 and not store.index.published


def test_no_flush_close_syncs_what_rolls_published(tmp_path, monkeypatch):
    calls = _index_dir_syncs(monkeypatch)
    # (the turn held: the service cannot sync them; released, it may before
    # the close does: either way, synced)
    with MessageStore.open(str(tmp_path / "s"), _config(flush_disk_type="NO_FLUSH")) as store, store._disk_turn:
        _put(store, 1200)
        index = store.index
        assert index.published
        n = len(calls)
    assert not index.published and len(calls) > n


def test_sync_published_keeps_the_files_listed_when_a_sync_fails(tmp_path, monkeypatch):
    from rmqstore.storage import index as index_module

    with MessageStore.open(str(tmp_path / "s"), _config()) as store:
        index = store.index
        with store._disk_turn:
            _put(store, 1200)
            published = list(index.published)
            assert published

            def fails(path):
                raise OSError(errno.EIO, "injected")

            monkeypatch.setattr(index_module, "fsync_dir", fails)
            with pytest.raises(OSError):
                index.sync_published()
            assert index.published == published
            monkeypatch.undo()
            index.sync_published()
            index.sync_published()  # (nothing left: a no-op)
            assert not index.published


@pytest.mark.parametrize("lost", ["rename", "header"])
def test_a_crash_before_the_service_syncs_a_published_index_file_loses_no_key(tmp_path, lost):
    # a power loss can undo the rename or the header of a file a roll
    # published (its syncs not done yet); recovery indexes its records again
    from rmqstore.storage.index import IndexService, _new_header

    root = str(tmp_path / "s")
    cfg = _config(message_index_safe=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(IndexService, "sync_published", lambda self: None)  # the service never syncs it
        store = MessageStore.open(root, cfg)
        results = _put(store, 700)
        newest = store.index.published[-1].path
        store._crash()
    assert os.path.exists(newest)
    if lost == "rename":
        os.rename(newest, newest + ".tmp")
    else:
        with open(newest, "r+b") as f:
            f.write(_new_header(0, 0))
    with MessageStore.open(root, cfg) as store:
        for i in range(0, 700, 7):
            assert [m.physical_offset for m in store.query_messages("Ahead", f"k{i}")] == [results[i].wrote_offset]
