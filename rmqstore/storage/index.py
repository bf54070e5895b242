"""IndexFile and IndexService: the message key index (docs/format.md#indexfile).

An IndexFile is a hash table in a file: 40-byte header, ``hash_slot_num``
4-byte slots holding the newest entry of each slot, ``index_num`` 20-byte
entries chained newest to oldest. Keys are ``topic#key``. The checks of a
file against its header, and the inference of the geometry of existing
files, are in ``index_checks``.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import sys
import time

from .. import _kernels as k
from ..dispatch import gets_index_entries, index_keys
from ..exceptions import ConfigError, CorruptedFileError
from ..format.layout import (
    INDEX_ENTRY_FIELDS,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    is_offset_name,
)
from .index_checks import _ENTRY, _HEADER, header_problem, index_file_size, infer_index_geometry
from .index_checks import _geometry_fits as _geometry_fits
from .mapped_file import _NOFOLLOW, advise_fresh, allocate_file, fsync_dir, open_no_follow, settle

__all__ = [
    "IndexFile", "IndexService", "build_index_file", "header_problem", "index_file_size", "keys_of",
    "new_file_names",
]

log = logging.getLogger("rmqstore.index")


def _new_header(end_phy_offset: int, end_timestamp: int) -> bytes:
    """The header of a new index file: begin = end = the previous file's end
    values (when positive), no slot used, index count 1."""
    head = bytearray(INDEX_HEADER_SIZE)
    if end_phy_offset > 0:
        struct.pack_into(">qq", head, 16, end_phy_offset, end_phy_offset)
    if end_timestamp > 0:
        struct.pack_into(">qq", head, 0, end_timestamp, end_timestamp)
    struct.pack_into(">i", head, 36, 1)
    return bytes(head)


def new_file_names(count: int, after: str = "") -> list:
    """*count* ascending index file names from now: ``yyyyMMddHHmmssSSS``
    in local time, +1 for each next one; all after the name *after* (two
    files in one millisecond, or a clock step back, go on from it)."""
    now = time.time()
    first = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
    if first <= after:
        first = str(int(after) + 1)
    return [str(int(first) + i) for i in range(count)]


def build_index_file(hashes, phys, times, hash_slot_num: int, index_num: int,
                     prev_end_phy: int = 0, prev_end_ts: int = 0) -> bytearray:
    """The bytes of a whole new IndexFile holding the given entries, in one
    go: what ``index_put`` of each entry, in order, would leave in a file
    made with ``_new_header(prev_end_phy, prev_end_ts)``.

    *hashes* (int, ``index_key_hash`` of ``topic#key``), *phys* (physical
    offsets) and *times* (store timestamps, ms since epoch) are equal-length
    sequences or numpy arrays, at most ``index_num - 1`` entries (a file's
    entry 0 is never used). *prev_end_phy*/*prev_end_ts* are the previous
    file's end values (0 for a store's first file). Raises ValueError when
    the entries do not fit. The layout rules are docs/format.md#indexfile.
    """
    import numpy as np

    h = np.asarray(hashes, dtype=np.int64)
    p = np.asarray(phys, dtype=np.int64)
    t = np.asarray(times, dtype=np.int64)
    n = h.size
    if not (n == p.size == t.size) or n > index_num - 1:
        raise ValueError(f"{n} entries do not fit an index file of {index_num - 1}")
    buf = bytearray(index_file_size(hash_slot_num, index_num))
    buf[:INDEX_HEADER_SIZE] = _new_header(prev_end_phy, prev_end_ts)
    if n == 0:
        return buf
    number = np.arange(1, n + 1, dtype=np.int64)  # entry numbers: a new file counts from 1
    slot = h % hash_slot_num
    order = np.argsort(slot, kind="stable")
    ordered = slot[order]
    # an entry chains to the entry before it in the same slot (0 ends a chain)
    same = np.zeros(n, dtype=bool)
    same[1:] = ordered[1:] == ordered[:-1]
    prev = np.empty(n, dtype=np.int64)
    prev[order] = np.where(same, np.concatenate(([0], number[order][:-1])), 0)
    # time diffs in whole seconds from the file's begin timestamp (the first
    # entry's; for the first entry itself the header's), Java's int division,
    # 0 while the begin timestamp is not positive
    begin = np.full(n, t[0])
    begin[0] = prev_end_ts
    diff = t - begin
    secs = np.where(diff >= 0, diff // 1000, -((-diff) // 1000))
    secs = np.where(begin <= 0, 0, np.clip(secs, 0, 2**31 - 1))
    entries = np.zeros(n, dtype=INDEX_ENTRY_FIELDS)
    entries["hash"], entries["phy"], entries["time_diff"], entries["prev"] = h, p, secs, prev
    first = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * hash_slot_num + INDEX_ENTRY_SIZE
    buf[first:first + INDEX_ENTRY_SIZE * n] = entries.tobytes()
    # each used slot holds the newest entry of its chain
    newest = np.ones(n, dtype=bool)
    newest[:-1] = ordered[1:] != ordered[:-1]
    table = np.zeros(hash_slot_num, dtype=">i4")
    table[ordered[newest]] = number[order][newest]
    buf[INDEX_HEADER_SIZE:INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * hash_slot_num] = table.tobytes()
    struct.pack_into(">qqqqii", buf, 0, int(t[0]), int(t[-1]), int(p[0]), int(p[-1]),
                     int(np.count_nonzero(prev == 0)), n + 1)
    return buf


class IndexFile(k.IndexRegion):
    """One ``index/<yyyyMMddHHmmssSSS>`` file, mapped whole.

    Args:
        path (str): the file.
        hash_slot_num (int), index_num (int): its geometry.
        read_only (bool): map read-only.
        create (bool): create it, all zeros, with begin/end values taken from
            the previous file's *end_phy_offset* / *end_timestamp* (docs/format.md#index-put).
    """

    __slots__ = ("damaged", "fresh", "name", "path", "read_only")  # (mm and the geometry: IndexRegion's)

    def __init__(self, path, hash_slot_num, index_num, read_only=False, create=False, end_phy_offset=0, end_timestamp=0,
                 spare=False):
        self.path = str(path)
        self.name = os.path.basename(self.path)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.read_only = read_only
        #: its header contradicts it (``header_problem``): read around, its end offset unused
        self.damaged = False
        size = index_file_size(hash_slot_num, index_num)
        if create:
            self._create(size, end_phy_offset, end_timestamp, spare)
            if spare:
                self.path += ".tmp"  # until publish(): no reader lists it
        flags = os.O_RDONLY if read_only else os.O_RDWR | _NOFOLLOW
        fd = open_no_follow(self.path, flags | getattr(os, "O_CLOEXEC", 0))
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise CorruptedFileError(
                    f"index file has {actual} bytes, expected {size} ({hash_slot_num} slots, {index_num} entries)",
                    self.path, actual,
                )
            self.mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE)
            #: made here: mapped without read-around until warmed or rolled (mapped_file.settle)
            self.fresh = create and not read_only and advise_fresh(self.mm)
        finally:
            os.close(fd)  # the mapping keeps the file

    def _create(self, size: int, end_phy_offset: int, end_timestamp: int, spare: bool) -> None:
        """Build the new file under a temporary name and rename it into place,
        so a crash can never leave a short or empty index file behind (a
        *spare* keeps the temporary name until :meth:`publish`)."""
        tmp = self.path + ".tmp"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = open_no_follow(tmp, flags, 0o644)
        except FileExistsError:  # a creation a crash interrupted, never published: ours to replace
            os.unlink(tmp)
            fd = open_no_follow(tmp, flags, 0o644)
        try:
            allocate_file(fd, size, tmp)  # reserved: a full disk fails here, not as SIGBUS later
            os.pwrite(fd, _new_header(end_phy_offset, end_timestamp), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        if not spare:
            os.rename(tmp, self.path)

    def publish(self, path, end_phy_offset: int, end_timestamp: int, sync: bool = True) -> None:
        """A spare file made ahead becomes index file *path*: its header set
        as a file made now would have it (synced unless *sync* is False:
        :meth:`sync_header` later), then renamed into place."""
        self.mm[:INDEX_HEADER_SIZE] = _new_header(end_phy_offset, end_timestamp)
        if sync:
            self.sync_header()
        os.rename(self.path, path)
        self.path = str(path)
        self.name = os.path.basename(self.path)

    def sync_header(self) -> None:
        """Force the page holding the header to disk (the GIL released where
        the implementation can: ``sync_pages``); a closed file (deleted by
        clean-up meanwhile) is skipped. Raises OSError."""
        if self.mm.closed or self.read_only:
            return
        if not k.sync_pages(self.mm, 0, INDEX_HEADER_SIZE):
            self.mm.flush(0, min(mmap.PAGESIZE, len(self.mm)))

    def header(self) -> dict:
        """The header fields (docs/format.md#index-header); ``index_count`` as stored (entries + 1)."""
        b, e, bp, ep, slots, count = _HEADER.unpack_from(self.mm, 0)
        return {
            "begin_timestamp": b, "end_timestamp": e, "begin_phy_offset": bp, "end_phy_offset": ep,
            "hash_slot_count": slots, "index_count": count,
        }

    @property
    def begin_timestamp(self) -> int:
        return _HEADER.unpack_from(self.mm, 0)[0]

    @property
    def end_timestamp(self) -> int:
        return _HEADER.unpack_from(self.mm, 0)[1]

    @property
    def end_phy_offset(self) -> int:
        return _HEADER.unpack_from(self.mm, 0)[3]

    @property
    def index_count(self) -> int:
        c = _HEADER.unpack_from(self.mm, 0)[5]
        return c if c > 0 else 1

    def is_write_full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key: str, physical_offset: int, store_timestamp: int) -> bool:
        """``IndexFile.putKey``: False when full."""
        return k.index_put(self.mm, self.hash_slot_num, self.index_num, key, physical_offset, store_timestamp)

    def truncate_entries(self, physical_offset: int, store_timestamp_at) -> int:
        """Remove the entries (newest first) whose physical offset is at or past
        *physical_offset*, restoring each slot to the entry's predecessor, and
        rewrite the header's end values (end time from ``store_timestamp_at(phy)``).
        RocketMQ never does this (docs/recovery.md#pitfall-index-not-truncated). Returns the number of entries left."""
        mm, s = self.mm, self.hash_slot_num
        base = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * s
        n = min(self.index_count, self.index_num) - 1
        slot_count = _HEADER.unpack_from(mm, 0)[4]
        while n >= 1:
            key_hash, phy, diff, prev = _ENTRY.unpack_from(mm, base + n * INDEX_ENTRY_SIZE)
            if phy < physical_offset:
                break
            slot_pos = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * (abs(key_hash) % s)
            if struct.unpack_from(">i", mm, slot_pos)[0] == n:
                restored = prev if 0 < prev < n else 0
                struct.pack_into(">i", mm, slot_pos, restored)
                if restored == 0:
                    slot_count -= 1
            mm[base + n * INDEX_ENTRY_SIZE : base + (n + 1) * INDEX_ENTRY_SIZE] = bytes(INDEX_ENTRY_SIZE)
            n -= 1
        struct.pack_into(">i", mm, 32, max(slot_count, 0))
        struct.pack_into(">i", mm, 36, n + 1)
        if n >= 1:
            _, phy, diff, _ = _ENTRY.unpack_from(mm, base + n * INDEX_ENTRY_SIZE)
            ts = store_timestamp_at(phy)
            if ts < 0:
                ts = self.begin_timestamp + diff * 1000
            struct.pack_into(">q", mm, 8, ts)
            struct.pack_into(">q", mm, 24, phy)
        mm.flush()
        return n

    def trailing_entries_at(self, physical_offset: int) -> int:
        """Number of entries at the end of this file whose physical offset is
        *physical_offset*."""
        base = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * self.hash_slot_num
        n = min(self.index_count, self.index_num) - 1
        c = 0
        while n >= 1 and _ENTRY.unpack_from(self.mm, base + n * INDEX_ENTRY_SIZE)[1] == physical_offset:
            c += 1
            n -= 1
        return c

    def header_problem(self, settled: bool = True):
        """:func:`header_problem` of this file."""
        return header_problem(self.mm, self.hash_slot_num, self.index_num, settled)

    def is_consistent(self) -> bool:
        """Structural check of a file that may have been torn by a crash: header
        counts in range, entries 1..indexCount-1 with non-negative key hashes,
        non-decreasing physical offsets and earlier predecessors, slots pointing
        at entries of their own slot, and the header's end offset equal to the
        last entry's."""
        mm, s = self.mm, self.hash_slot_num
        _, _, _, end_phy, slot_count, count = _HEADER.unpack_from(mm, 0)
        count = max(count, 1)
        if count > self.index_num or slot_count < 0:
            return False
        base = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * s
        last = -1
        with memoryview(mm) as mv:
            entries = mv[base + INDEX_ENTRY_SIZE : base + count * INDEX_ENTRY_SIZE]
            try:
                for n, (key_hash, phy, diff, prev) in enumerate(_ENTRY.iter_unpack(entries), 1):
                    if key_hash < 0 or phy < last or not 0 <= prev < n or diff < 0:
                        return False
                    last = phy
            finally:
                entries.release()
            slots = mv[INDEX_HEADER_SIZE:base]
            try:
                used = 0
                for slot, (v,) in enumerate(struct.iter_unpack(">i", slots)):
                    if v == 0:
                        continue
                    used += 1
                    if not 0 < v < count or _ENTRY.unpack_from(mm, base + v * INDEX_ENTRY_SIZE)[0] % s != slot:
                        return False
            finally:
                slots.release()
        return used == slot_count and (count == 1 or last == end_phy)

    def flush(self) -> None:
        """Force the whole file to disk (``MessageStore.flush``, close): by
        ``msync`` with the GIL released where the implementation can
        (``sync_pages``); ``mmap.flush`` holds the GIL for the whole
        write-back (~50 ms for an index file after 300,000 puts here), which
        stalls every other thread of the process, puts included. A closed
        file (deleted by clean-up meanwhile) is skipped. Raises OSError."""
        if self.mm.closed or self.read_only:
            return
        if not k.sync_pages(self.mm, 0, len(self.mm)):
            self.mm.flush()

    def flush_released(self, full: bool = False) -> None:
        """:meth:`flush` for a service thread: on Linux through the file's
        own descriptor, whose sync releases the GIL (``mmap.flush`` holds it
        for the whole write-back, stalling every put meanwhile; Linux has
        one page cache, so the sync covers what the mapping wrote). *full*:
        the file takes no more entries (a roll left it), so its pages are
        unmapped first (``release_pages``) and the sync need not interrupt
        a putting thread's CPU for each of them; a read maps them back."""
        if self.mm.closed or self.read_only:
            return
        if not sys.platform.startswith("linux"):
            self.mm.flush()
            return
        if full:
            k.release_pages(self.mm, 0, len(self.mm))
        fd = open_no_follow(self.path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap; idempotent. While a sync or a warm-up on another thread
        holds the mapping (the GIL released), Python refuses to unmap it:
        it is then left to that call, and unmapped when this object goes."""
        if not self.mm.closed:
            try:
                self.mm.close()
            except BufferError:
                pass

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


keys_of = index_keys  # the old name of dispatch.index_keys


class IndexService(k.IndexServiceBase):
    """All index files of a store (RocketMQ ``IndexService``).

    Args:
        directory (str): ``<root>/index``.
        hash_slot_num, index_num (int | None): geometry; None (read-only opens)
            infers it from the files.
        read_only (bool): never write.
        max_msgs_num_batch (int): cap on the offsets one :meth:`query_offsets` answers (default 64).
    """

    __slots__ = (
        "_last_name", "directory", "hash_slot_num", "index_num", "keys_added", "last_full_end_timestamp",
        "junk", "published", "read_only", "rolled", "spares", "sync_rolls",
        # (files, max_msgs_num_batch: IndexServiceBase's)
    )

    def __init__(self, directory, hash_slot_num, index_num, read_only=False, max_msgs_num_batch=64):
        self.directory = str(directory)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.read_only = read_only
        self.max_msgs_num_batch = max_msgs_num_batch
        self.files: list = []
        self._last_name = ""
        #: end timestamp of the newest full file (the checkpoint's indexMsgTimestamp)
        self.last_full_end_timestamp = 0
        #: keys put since the service was created (for recovery reports)
        self.keys_added = 0
        #: files a roll left for a service thread to flush (:meth:`flush_rolled`),
        #: with their end timestamps; None: a roll flushes the file itself
        self.rolled: list | None = None
        #: whether a file a roll left full is synced (False: NO_FLUSH)
        self.sync_rolls = True
        #: spares a roll published while a service thread runs (``rolled`` a
        #: list), whose header page and directory entry that thread syncs
        #: (:meth:`sync_published`), not the put
        self.published: list = []
        #: files made ahead (:meth:`reserve`), under temporary names until a roll takes them
        self.spares: list = []
        #: files :meth:`load` found to be leftovers, removed by :meth:`remove_junk`
        self.junk: list = []

    def remove_junk(self) -> None:
        """Delete what :meth:`load` listed in ``junk``: temporary files of
        creations a crash interrupted, a newest file of the wrong size
        (recovery indexes its records again). Load itself writes nothing,
        so an open that fails leaves them; a writer calls this once it has
        decided to write."""
        for path in self.junk:
            log.warning("removing %s (an index file a crash left unfinished)", path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.junk = []

    def load(self) -> None:
        """Map every index file, ordered by (end physical offset, name) rather
        than by name alone, which a clock step can misorder (docs/recovery.md#pitfall-index-names-by-local-time)."""
        try:
            entries = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            entries = []
        paths = []
        for n in entries:
            path = os.path.join(self.directory, n)
            if is_offset_name(n) and os.path.isfile(path):
                paths.append(path)
            elif not (n.endswith(".tmp") and is_offset_name(n[:-4])):
                log.warning("skipping %s: not an index file of this store", path)
        if not self.read_only:
            for n in entries:
                if n.endswith(".tmp") and is_offset_name(n[:-4]):  # a creation a crash interrupted (or a spare)
                    self.junk.append(os.path.join(self.directory, n))
            if paths and self.hash_slot_num is not None:
                want = index_file_size(self.hash_slot_num, self.index_num)
                newest = paths[-1]
                size = os.path.getsize(newest)
                older = {os.path.getsize(p) for p in paths[:-1]}
                if size != want and (size == 0 or older == {want}):
                    # only the newest file is damaged (older ones fit the config;
                    # with none, only an empty one counts: a wrong size is then a
                    # config mismatch): drop it, recovery re-indexes its records
                    self.junk.append(newest)
                    paths.pop()
        else:
            paths = [p for p in paths if os.path.getsize(p) > 0]
        if not paths:
            return
        if not self.read_only and self.hash_slot_num is not None:
            want = index_file_size(self.hash_slot_num, self.index_num)
            sizes = {os.path.getsize(p) for p in paths}
            if len(sizes) == 1 and want not in sizes:
                raise ConfigError(
                    f"index files have {sizes.pop()} bytes but max_hash_slot_num={self.hash_slot_num} "
                    f"and max_index_num={self.index_num} make {want}"
                )
        # read-only, the newest file may be one a writer process is putting keys into
        live = paths[-1] if self.read_only else None
        if self.hash_slot_num is None or self.index_num is None or (
            self.read_only
            and any(os.path.getsize(p) != index_file_size(self.hash_slot_num, self.index_num) for p in paths)
        ):
            self.hash_slot_num, self.index_num = infer_index_geometry(
                paths, self.hash_slot_num, self.index_num, live
            )
        files = [IndexFile(p, self.hash_slot_num, self.index_num, read_only=self.read_only) for p in paths]
        self._check_headers(files)
        while not self.read_only and files and files[-1].damaged:
            # newer than every sound file, where new keys would go: recovery
            # indexes its records again from the CommitLog
            f = files.pop()
            log.warning("removing index file %s, its header contradicts it; its records are indexed again", f.path)
            f.destroy()
            fsync_dir(self.directory)
        # a damaged file's end offset says nothing: it goes first, never where keys are added
        files.sort(key=lambda f: (-1 if f.damaged else f.end_phy_offset, f.name))
        self.files = files
        self._last_name = max((f.name for f in files), default="")

    def _check_headers(self, files: list) -> None:
        """Mark ``damaged`` (and report) the files, given oldest name first,
        whose header contradicts the file (``IndexFile.header_problem``). They
        are read around: queries still walk their chains (bounded), and one
        file's header can never end a query before the other files are
        searched (see :meth:`query_offsets`). Read-only, the newest file may
        be one a writer process is filling: it gets only the checks a
        concurrent put cannot break."""
        for f in files:
            found = f.header_problem(settled=not self.read_only or f is not files[-1])
            if found is not None:
                log.warning("index file %s: %s (offset %d)", f.path, found[1], found[0])
                f.damaged = True

    # --- writing ----------------------------------------------------------------

    def _new_file_name(self) -> str:
        name = self._last_name = new_file_names(1, self._last_name)[0]
        return name

    def writable_file(self):
        """The index file keys go into: the last one while it has room, else
        a new one (a roll; a spare :meth:`reserve` made, published under its
        name now, else made here), which becomes the last. A store's first
        file is taken the same way."""
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_write_full():
            return last
        end_phy = last.end_phy_offset if last else 0
        end_ts = last.end_timestamp if last else 0
        path = os.path.join(self.directory, self._new_file_name())
        # with a service thread, a spare's syncs are its work, not the put's:
        # a crash that beats them leaves the file under its temporary name
        # (junk) or its header as made (an empty file), and recovery indexes
        # its records again, as after losing any unsynced index page
        deferred = bool(self.spares) and self.rolled is not None
        if self.spares:
            f = self.spares[0]
            f.publish(path, end_phy, end_ts, sync=not deferred)
            del self.spares[0]
        else:
            os.makedirs(self.directory, exist_ok=True)
            f = IndexFile(path, self.hash_slot_num, self.index_num, create=True, end_phy_offset=end_phy,
                          end_timestamp=end_ts)
        if deferred:
            self.published.append(f)
        else:
            fsync_dir(self.directory)
        if last is not None:
            settle(last)  # (one made here, never warmed: left now)
            if self.rolled is not None:
                self.rolled.append((last, end_ts))  # flushed by the service thread, off the put
            else:
                if self.sync_rolls:
                    last.flush()
                self.last_full_end_timestamp = end_ts
        self.files.append(f)
        return f

    def flush_rolled(self) -> None:
        """Flush the files rolls left behind (:attr:`rolled`), oldest first,
        and only then count each as full (``last_full_end_timestamp``, which
        the checkpoint records): a service thread's work, without the append
        lock. A file clean-up deleted meanwhile is skipped. Raises OSError
        from a sync; the file stays listed for the next call. The files
        rolls published are synced first (:meth:`sync_published`)."""
        self.sync_published()
        rolled = self.rolled
        while rolled:
            f, end_ts = rolled[0]
            try:
                if self.sync_rolls:
                    f.flush_released(full=True)
            except FileNotFoundError:
                pass  # deleted by clean-up: nothing left to flush
            rolled.pop(0)
            if end_ts > self.last_full_end_timestamp:
                self.last_full_end_timestamp = end_ts

    def make_spare(self, name: str, make_dirs: bool = True):
        """Create a spare index file under a temporary name from *name* (see
        :meth:`new_spare_name`), without touching the service's lists: a
        service thread makes it without the append lock (and without
        making a missing directory: *make_dirs*) and hands it to
        :meth:`add_spare`. Raises what making a file raises."""
        if make_dirs:
            os.makedirs(self.directory, exist_ok=True)
        return IndexFile(os.path.join(self.directory, name), self.hash_slot_num, self.index_num,
                         create=True, spare=True)

    def new_spare_name(self) -> str:
        """A fresh file name for :meth:`make_spare` (append lock held)."""
        return self._new_file_name()

    def add_spare(self, f) -> bool:
        """Keep *f* (:meth:`make_spare`'s) as a spare unless one exists
        already (a put made its own meanwhile); else delete it. The append
        lock is held. Returns whether it was kept."""
        if self.spares:
            f.destroy()
            return False
        self.spares.append(f)
        return True

    def reserve(self, n_keys: int) -> None:
        """Make the files *n_keys* more keys may roll into, and the first file
        when there is none (spares, under
        temporary names until a roll takes them), before their records are
        written: a put makes every file it needs first. Raises what making
        a file raises; spares made before a failure stay."""
        last = self.files[-1] if self.files else None
        per = self.index_num - 1  # entries a file holds (index_count runs 1..index_num)
        free = (self.index_num - last.index_count if last is not None else 0) + per * len(self.spares)
        # (a store's first dispatch makes the first file, keys or not, as RocketMQ's does)
        while free < n_keys or (last is None and not self.spares):
            os.makedirs(self.directory, exist_ok=True)
            f = IndexFile(os.path.join(self.directory, self._new_file_name()), self.hash_slot_num, self.index_num,
                          create=True, spare=True)
            self.spares.append(f)
            free += per

    def drop_spares(self) -> None:
        """Delete the files made ahead."""
        spares, self.spares = self.spares, []
        for f in spares:
            f.destroy()

    def build_index(
        self, topic: str, physical_offset: int, store_timestamp: int, sys_flag: int, uniq_key, keys
    ) -> None:
        """Index one dispatched record (docs/format.md#building-the-index): ``topic#UNIQ_KEY`` first, then
        each non-empty space-separated key. Rollback records are not indexed.
        Keys the index already holds for this record are skipped, so dispatching
        a record again (recovery) neither duplicates (docs/recovery.md#pitfall-index-duplicate-entries) nor misses the
        keys a crash kept it from writing."""
        if not gets_index_entries(sys_flag):
            return
        todo = index_keys(uniq_key, keys)
        last = self.files[-1] if self.files else None
        if last is not None and todo:
            # fast path: the kernel checks the file's end offset and puts all keys
            done = k.index_put_keys(
                last.mm, last.hash_slot_num, last.index_num, topic + "#", todo, physical_offset, store_timestamp
            )
            if done == -1:
                return  # indexed already
            if done > 0:
                self.keys_added += done
            if done == len(todo):
                return
            # at the file's end offset, or the file filled up: the careful path
        if last is not None and physical_offset < last.end_phy_offset:
            return
        if last is not None and physical_offset == last.end_phy_offset:
            todo = todo[self._keys_already_indexed(physical_offset):]
        if not todo and last is not None:
            return  # nothing to add: do not roll to a new file for it
        f = self.writable_file()
        for key in todo:
            f = self._put(f, f"{topic}#{key}", physical_offset, store_timestamp)

    def _keys_already_indexed(self, physical_offset: int) -> int:
        """How many entries at the end of the index point at *physical_offset*
        (a record may straddle two files when the first fills up)."""
        n = 0
        for f in reversed(self.files[-2:]):
            if f.damaged:  # (its count says nothing)
                break
            c = f.trailing_entries_at(physical_offset)
            n += c
            if c < f.index_count - 1:
                break  # the record does not reach back into an older file
        return n

    def _put(self, f, key, phy, ts):
        self.keys_added += 1
        if f.put_key(key, phy, ts):
            return f
        f = self.writable_file()
        if not f.put_key(key, phy, ts):  # cannot happen with index_num > 1
            raise CorruptedFileError("a new index file refused a key", f.path)
        return f

    # --- reading ------------------------------------------------------------------

    def query_offsets(self, topic: str, key: str, max_num: int, begin: int, end: int) -> list:
        """``IndexService.queryOffset``: physical offsets whose key hash matches
        ``topic#key`` and whose index time is in [begin, end], newest file
        first, at most ``min(max_num, max_msgs_num_batch)``.

        RocketMQ stops at the first file that began before *begin* (the older
        ones ended before it). Here that file and the next older one must
        both say so (the newer began, the older ended, before *begin*), so a
        header that lies about its times can hide its own keys but never the
        keys of other files. On files written in time order (no clock step
        back) the answer is RocketMQ's."""
        max_num = min(max_num, self.max_msgs_num_batch)
        out: list = []
        full_key = f"{topic}#{key}"
        select, header = k.index_select, _HEADER.unpack_from
        newer_began_before = False
        for f in reversed(self.files):
            fb, fe = header(f.mm, 0)[:2]  # begin and end store times, one header read
            # IndexFile.isTimeMatched, then selectPhyOffset
            if (begin < fb and end > fe) or (fb <= begin <= fe) or (fb <= end <= fe):
                select(f.mm, f.hash_slot_num, f.index_num, full_key, max_num, begin, end, out)
            if len(out) >= max_num or (newer_began_before and fe < begin):
                break
            newer_began_before = fb < begin
        return out

    def truncate(self, physical_offset: int, store_timestamp_at) -> None:
        """After recovery cut the CommitLog at *physical_offset*: delete index
        files holding only later entries, and cut the entries of the file that
        straddles it, so new records are indexed again and no entry points
        past the end (docs/recovery.md#pitfall-index-not-truncated)."""
        while self.files:
            f = self.files[-1]
            if f.end_phy_offset < physical_offset:
                break
            if f.truncate_entries(physical_offset, store_timestamp_at) >= 1:
                break
            log.warning("deleting index file %s: all its entries lie past offset %d", f.path, physical_offset)
            self.files.pop().destroy()
            fsync_dir(self.directory)

    def newest_full_end_timestamp(self) -> int:
        """End store time (ms) of the newest full index file, 0 if none: what
        the checkpoint's indexMsgTimestamp names once that file is flushed.
        A damaged file's end time says nothing."""
        for f in reversed(self.files):
            if f.is_write_full() and not f.damaged:
                return f.end_timestamp
        return 0

    # --- retention and follow mode (docs/recovery.md#retention) ----------------------

    def expired_head_count(self, min_commit_log_offset: int) -> int:
        """How many files, oldest first and never the newest, index only
        records below *min_commit_log_offset* (``endPhyOffset < min``). A
        damaged file (its end offset unknown; it sorts first) goes with the
        first sound file after it."""
        n = damaged = 0
        for f in self.files[:-1]:
            if f.damaged:
                damaged += 1
                continue
            if f.end_phy_offset >= min_commit_log_offset:
                break
            n += damaged + 1
            damaged = 0
        return n

    def delete_first(self, count: int) -> list:
        """Unmap and delete the *count* oldest files (never the newest); the
        caller holds reader references exclusively and the dispatch lock.
        Returns their paths."""
        count = min(count, len(self.files) - 1)
        if count <= 0:
            return []
        gone = self.files[:count]
        for f in gone:
            f.close()
        del self.files[:count]
        if not self.read_only:
            for f in gone:
                try:
                    os.unlink(f.path)
                except FileNotFoundError:
                    pass
            fsync_dir(self.directory)
        return [f.path for f in gone]

    def follow(self) -> tuple:
        """Read-only follow mode: map index files another process created
        (they appear complete, by rename) and forget the ones it deleted.
        Returns ``(added, vanished)``: new :class:`IndexFile` objects appended
        to ``files``, and the count of leading files whose file is gone (the
        caller removes them with :meth:`delete_first` under exclusivity)."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if is_offset_name(n))
        except FileNotFoundError:
            return [], 0
        known = {f.name for f in self.files}
        added = []
        for n in names:
            if n in known:
                continue
            path = os.path.join(self.directory, n)
            try:
                if self.hash_slot_num is None or self.index_num is None:
                    self.hash_slot_num, self.index_num = infer_index_geometry([path], live=path)
                added.append(IndexFile(path, self.hash_slot_num, self.index_num, read_only=True))
            except (OSError, CorruptedFileError):
                continue
        added.sort(key=lambda f: (f.end_phy_offset, f.name))
        self.files.extend(added)
        present = set(names)
        vanished = 0
        for f in self.files[:-1]:
            if f.name in present:
                break
            vanished += 1
        return added, vanished

    def sync_published(self) -> None:
        """Sync the header page of each file in ``published``, then the
        directory (their names), and take them off the list; safe to run
        in two threads at once. Raises OSError; the files stay listed."""
        published = self.published
        if not published:
            return
        files = published[:]
        for f in files:
            f.sync_header()
        fsync_dir(self.directory)
        for f in files:
            try:
                published.remove(f)
            except ValueError:  # (the other caller took it)
                pass

    def flush(self) -> None:
        for f in self.files:
            f.flush()
        self.sync_published()
        if self.rolled:  # (every file is flushed now: the rolls' too)
            self.last_full_end_timestamp = max(self.last_full_end_timestamp, *(ts for _f, ts in self.rolled))
            self.rolled.clear()

    def close(self) -> None:
        for f in self.files:
            f.close()
        if self.spares:
            try:
                self.drop_spares()
            except OSError:  # (a store that cannot unlink must still close)
                log.warning("could not delete the index files made ahead in %s", self.directory, exc_info=True)
