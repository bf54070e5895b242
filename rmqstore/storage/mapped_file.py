"""Fixed-size memory-mapped segment files and the queues of them (docs/format.md#segment-queues).

A :class:`MappedFile` is one segment named by its start offset; a
:class:`MappedFileQueue` is a directory of equal-sized segments covering one
logical byte stream (the CommitLog, or one ConsumeQueue).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import sys
import threading
from collections.abc import Callable

from .. import _kernels as k
from .._kernels import MappedQueue, MappedRegion, ReferenceResource
from ..exceptions import ConfigError, CorruptedFileError, DiskFullError, StoreClosedError
from ..format.layout import is_offset_name
from .walker import data_ranges

__all__ = ["MappedFile", "MappedFileQueue", "ReferenceResource", "offset_to_file_name", "fsync_dir"]

log = logging.getLogger("rmqstore.mapped_file")

PAGE = 4096  # RocketMQ's OS_PAGE_SIZE, the unit of the least-pages rules
_OS_PAGE = mmap.PAGESIZE  # what the kernel maps, writes back and write-protects
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)


def offset_to_file_name(offset: int) -> str:
    """Segment file name: the start offset, zero-padded to at least 20 digits (docs/format.md#file-names)."""
    return f"{offset:020d}"


# A file the store has just made holds nothing but zeros, and the kernel's
# read-around on a page fault through its mapping would fill a whole
# read-ahead window with them (read_ahead_kb: 8 MiB, 1-2 ms, on a virtual
# disk) on the time of the put that writes there first. Until a warm-up
# faults the file in or the writer leaves it, its mapping is advised random
# (a fault maps the page it needs), then normal again: readers of the file,
# once the kernel has evicted it, get their read-ahead back.
_MADV_RANDOM = getattr(mmap, "MADV_RANDOM", None)
_MADV_NORMAL = getattr(mmap, "MADV_NORMAL", None)


def advise_fresh(mm) -> bool:
    """Advise the mapping *mm* of a file just made random (no read-around);
    returns whether it was (:func:`settle` undoes it)."""
    if _MADV_RANDOM is None or _MADV_NORMAL is None:
        return False
    try:
        mm.madvise(_MADV_RANDOM)
    except OSError:
        return False  # (a hint: a kernel that refuses it reads around as before)
    return True


def settle(f) -> None:
    """Give *f* (a MappedFile or an IndexFile whose ``fresh`` says
    :func:`advise_fresh` advised it) the kernel's normal read-ahead back:
    it is warmed, or its writer has left it. Idempotent."""
    if f.fresh:
        f.fresh = False
        try:
            f.mm.madvise(_MADV_NORMAL)
        except (OSError, ValueError):
            pass  # closed meanwhile (clean-up, an undo), or refused: a hint either way


def fsync_dir(path) -> None:
    """fsync a directory so a created/removed entry survives a crash."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MappedFile(MappedRegion):
    """One segment file mapped whole into memory: a ``MappedRegion`` (the
    fields the kernels read and write: ``mm``, ``file_from_offset``,
    ``file_size``, ``wrote_position``) with the file's lifecycle.

    Attributes:
        path (str): file path.
        file_from_offset (int): logical offset of byte 0 of the file.
        file_size (int): bytes.
        mm (mmap.mmap): the mapping (read-only when the file was opened so).
        wrote_position (int): bytes appended (relative to the file).
        flushed_position (int): bytes known to be forced to disk.
        first_created_in_queue (bool): created while its queue was empty (docs/format.md#pre-blank-unit).
        fresh (bool): made here and mapped without read-around, until
            :func:`settle` (docs/format.md#files-made-ahead).
    """

    __slots__ = (
        "path", "read_only", "_fd", "flushed_position", "first_created_in_queue",
        "available", "first_shutdown_ms", "_rewinds", "fresh",
    )

    def __init__(self, path, file_size: int, read_only: bool = False, create: bool = False):
        self.path = str(path)
        self.file_size = file_size
        self.read_only = read_only
        self.first_created_in_queue = False
        try:
            self.file_from_offset = int(os.path.basename(self.path))
        except ValueError:
            raise CorruptedFileError("segment file name is not a number", self.path) from None
        # a writer never follows a symbolic link: it would write outside the store
        flags = os.O_RDONLY if read_only else os.O_RDWR | _NOFOLLOW
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self._fd = open_no_follow(self.path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if create:
                allocate_file(self._fd, file_size, self.path)
            else:
                actual = os.fstat(self._fd).st_size
                if actual != file_size:
                    raise CorruptedFileError(
                        f"segment has {actual} bytes, expected {file_size}", self.path, actual
                    )
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            self.mm = mmap.mmap(self._fd, file_size, access=access, **_NO_FD_COPY)
            self.fresh = create and not read_only and advise_fresh(self.mm)
        except BaseException:
            os.close(self._fd)
            if create:
                _unlink_quietly(self.path)
            raise
        self.wrote_position = 0
        self.flushed_position = 0
        #: False once clean-up has shut the file down (RocketMQ ``isAvailable``)
        self.available = True
        #: ms (store clock) of the first shutdown attempt, 0 before
        self.first_shutdown_ms = 0
        self._rewinds = 0  # rewind() calls: a flush that raced one does not count

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def flush(self, least_pages: int = 0) -> bool:
        """Force appended bytes to disk (RocketMQ ``MappedFile.flush``): always
        when the file is full; else when at least *least_pages* 4 KiB pages
        are dirty (any dirty byte when 0). Returns whether it synced.

        Only the appended range is synced, and a least-pages flush stops at
        the last whole page: the page being written and the pages warmed
        ahead stay writable, so the next puts take no page fault (a page
        written back is write-protected until written again); a complete
        flush (*least_pages* 0) or a full file syncs every appended byte.
        The whole pages synced are unmapped first (``release_pages``): no
        one writes them again, and a read maps them back.
        Raises OSError from the sync: the caller decides what a failure means."""
        if self._fd < 0:
            raise StoreClosedError(f"{self.path} is closed")
        wrote = self.wrote_position  # captured first: bytes after it are not promised
        flushed = self.flushed_position
        rewinds = self._rewinds
        if self.read_only or wrote <= flushed:
            return False
        if least_pages > 0 and wrote < self.file_size:
            if wrote // PAGE - flushed // PAGE < least_pages:
                return False
            wrote = wrote // _OS_PAGE * _OS_PAGE
            if wrote <= flushed:  # (pages larger than 4 KiB: none whole yet)
                return False
        # the pages below *wrote* are written for good: unmapped first, the
        # sync need not interrupt a putting thread's CPU for each of them
        k.release_pages(self.mm, flushed, wrote)
        _sync(self, flushed, wrote)
        if self._rewinds == rewinds:  # else bytes below *wrote* were rewritten during the sync
            self.flushed_position = wrote
        return True

    def sync(self) -> None:
        """Force the whole file to disk now, releasing the GIL on Linux
        (a warm-up's step under SYNC_FLUSH). Raises StoreClosedError, OSError."""
        if self._fd < 0:
            raise StoreClosedError(f"{self.path} is closed")
        _sync(self)

    def rewind(self, position: int, extent: int) -> None:
        """Undo appends: zero ``[position, extent)`` (clipped to the file) and
        move the write position back to *position*; bytes already forced to
        disk are forced again as zeros, so no reopen finds them. For a put
        that failed after writing (``MessageStore``'s undo)."""
        extent = min(max(extent, self.wrote_position), self.file_size)
        if extent > position:
            self.mm[position:extent] = bytes(extent - position)
        synced = self.flushed_position > position
        self._rewinds += 1
        self.wrote_position = position
        self.flushed_position = min(self.flushed_position, position)
        if synced and not self.read_only:
            _sync(self)

    def zero_tail(self, position: int) -> bool:
        """Zero ``[position, file_size)`` where it is not zero yet, so stale bytes
        behind a truncation point are never read back (docs/recovery.md#pitfall-stale-bytes-after-truncation).
        Returns True if anything was written."""
        mm = self.mm
        wrote_any = False
        p = position
        while p < self.file_size:
            end = min(self.file_size, (p // _ZERO_CHUNK + 1) * _ZERO_CHUNK)
            if mm[p:end] != _ZEROS[: end - p]:
                mm[p:end] = _ZEROS[: end - p]
                wrote_any = True
            p = end
        if wrote_any:
            _sync(self)
        return wrote_any

    def data_ranges(self, start: int):
        """Yield ``(lo, hi)``: the byte ranges from *start* on that may hold
        data, as the file system tells them (``SEEK_DATA``/``SEEK_HOLE``:
        holes and unwritten preallocated blocks hold none), or the whole
        rest where it cannot say. For searches that must not read (and
        fault in) a preallocated, never written tail."""
        return data_ranges(self._fd, start, self.file_size)

    def close(self) -> None:
        """Unmap and close; idempotent.

        While a view of the mapping is still exported (a zero-copy read,
        ``get_message_views``) Python refuses to unmap it: the file is closed
        and the mapping left to the views, unmapped when the last of them is
        released, so no view ever reads freed pages."""
        if self._fd < 0:
            return
        try:
            self.mm.close()
        except BufferError:
            pass  # pinned by views: the mmap object unmaps itself when they are gone
        os.close(self._fd)
        self._fd = -1

    def last_modified_ms(self) -> int:
        """The file's modification time in ms since epoch (RocketMQ
        ``getLastModifiedTimestamp``), 0 when it cannot be read."""
        try:
            return os.stat(self.path).st_mtime_ns // 1_000_000
        except OSError:
            return 0

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        _unlink_quietly(self.path)

    def __repr__(self):
        return f"MappedFile({self.path!r}, wrote={self.wrote_position}, size={self.file_size})"


# mmap keeps a duplicate of the descriptor unless told not to (3.13+): one
# descriptor per mapped file, as RocketMQ's FileChannel, not two (a store
# maps a file per queue; ulimit -n is often 1024)
_NO_FD_COPY = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def _sync(mf, start: int = 0, end: int | None = None) -> None:
    """Force *mf*'s bytes ``[start, end)`` to disk, the whole file when *end*
    is None: a range by ``msync`` where the core can release the GIL around
    it (``sync_pages``), else the whole file."""
    if end is None or not k.sync_pages(mf.mm, start, end):
        _sync_file(mf)


if sys.platform.startswith("linux"):

    def _sync_file(mf) -> None:
        # fdatasync covers pages dirtied through the mapping (Linux has one page
        # cache) and, unlike mmap.flush, releases the GIL: producers keep
        # appending while a group commit waits for the disk
        os.fdatasync(mf._fd)

else:  # pragma: no cover - exercised on macOS only

    def _sync_file(mf) -> None:
        mf.mm.flush()


def allocate_file(fd: int, size: int, path: str) -> None:
    """Give a new segment its full size. posix_fallocate reserves the blocks, so a
    full disk is an error here rather than SIGBUS on a later write."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:
        pass
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(e.errno, f"no space for a {size}-byte segment", path) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
            raise
    os.ftruncate(fd, size)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_no_follow(path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for a file the store writes: *flags* should hold
    ``O_NOFOLLOW``; a symbolic link in the file's place is then a
    :class:`CorruptedFileError` naming it (the store never writes through
    one, so a link planted in a store directory cannot make it write
    elsewhere), not a bare ``ELOOP``."""
    try:
        return os.open(path, flags, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EEXIST) and flags & _NOFOLLOW and os.path.islink(path):
            raise CorruptedFileError("a symbolic link where the store keeps a file of its own; "
                                     "the store never writes through one", path) from None
        raise


def _unlink_quietly(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Making:
    """A segment a service thread is making ahead: its start offset, how
    many spares the queue keeps, the file once made (None until then, or
    after a failure), whether a put took it, and an event set when the
    creation is over."""

    __slots__ = ("start", "keep", "mf", "taken", "done")

    def __init__(self, start: int, keep: int = 1) -> None:
        self.start = start
        self.keep = keep
        self.mf: MappedFile | None = None
        self.taken = False
        self.done = threading.Event()


class MappedFileQueue(MappedQueue):
    """A directory of equal-sized segments (RocketMQ ``MappedFileQueue``).

    Args:
        directory (str): the folder holding the segments.
        file_size (int | None): bytes per segment; None (read-only only) takes
            the size of the files found.
        read_only (bool): map read-only and never create, delete or truncate.
        sync_creation (bool): a segment a put makes has its directory entry
            synced at once; False leaves that to the next :meth:`flush`
            (a queue that can be rebuilt, whose flush comes before anything
            that says its data is on disk: a ConsumeQueue). A service thread's
            segment is synced as it is made either way.

    Attributes:
        dir_unsynced (bool): a segment was made since the directory was last
            synced (*sync_creation* False); the next :meth:`flush` syncs it.
    """

    __slots__ = ("directory", "dir_unsynced", "junk", "making", "on_take", "read_only", "spares",
                 "sync_creation")  # (files, file_size: MappedQueue's)

    def __init__(self, directory, file_size, read_only: bool = False, sync_creation: bool = True):
        self.directory = str(directory)
        self.file_size = file_size
        self.read_only = read_only
        self.sync_creation = sync_creation
        self.dir_unsynced = False
        self.files: list = []
        #: segments made ahead (:meth:`reserve`), in order after the last
        #: file, not yet part of the queue: the next rolls take them
        self.spares: list = []
        #: files :meth:`load` found to be leftovers, removed by :meth:`remove_junk`
        self.junk: list = []
        #: the segment a service thread is making ahead (:meth:`begin_ahead`), or None
        self.making: Making | None = None
        #: called (no arguments) when a roll takes a spare: the service makes the next
        self.on_take: Callable[[], None] | None = None

    def remove_junk(self) -> None:
        """Delete what :meth:`load` listed in ``junk`` (a writer, once it writes)."""
        for path in self.junk:
            log.warning("removing empty segment %s (a creation a crash interrupted)", path)
            _unlink_quietly(path)
        self.junk = []

    # --- loading ------------------------------------------------------------

    def load(self) -> None:
        """Map every segment: sub-directories and non-numeric names are
        skipped, an empty last file (a creation a crash interrupted) is
        ignored, and every other file must have the queue's size. Writes
        nothing: the empty file is only listed in ``junk``, for the caller
        to remove once it has decided to write (:meth:`remove_junk`).

        Raises:
            CorruptedFileError: a segment has the wrong size, or segments overlap.
        """
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            names = []
        paths = []
        for name in names:
            path = os.path.join(self.directory, name)
            if not self.read_only and is_offset_name(name) and os.path.islink(path):
                raise CorruptedFileError("a symbolic link where the store keeps a segment of its own; "
                                         "the store never writes through one", path)
            if not is_offset_name(name) or not os.path.isfile(path):
                log.warning("skipping %s: not a segment of this store", path)
                continue
            paths.append(path)
        if paths and os.path.getsize(paths[-1]) == 0:
            if not self.read_only:
                self.junk.append(paths[-1])
            paths.pop()
        sizes = [os.path.getsize(p) for p in paths]
        if sizes:
            # the size most segments have: a damaged one is then named as such
            common = max(set(sizes), key=lambda n: (sizes.count(n), n))
            if self.file_size is None:
                if common <= 0:
                    raise CorruptedFileError("empty segment file", paths[0], 0)
                self.file_size = common
            elif len(set(sizes)) == 1 and common != self.file_size:
                raise ConfigError(
                    f"segments in {self.directory} have {common} bytes but the config says {self.file_size}"
                )
        try:
            self._map_all(paths)
        except BaseException:
            self.close()
            self.files = []
            raise

    def _map_all(self, paths) -> None:
        prev = None
        for path in paths:
            mf = MappedFile(path, self.file_size, read_only=self.read_only)
            mf.wrote_position = mf.flushed_position = self.file_size
            if mf.file_from_offset % self.file_size or (
                prev is not None and mf.file_from_offset != prev + self.file_size
            ):
                mf.close()
                raise CorruptedFileError(
                    f"segment start {mf.file_from_offset} does not follow the previous segment", path
                )
            prev = mf.file_from_offset
            self.files.append(mf)

    # --- lookup ---------------------------------------------------------------

    @property
    def first(self):
        return self.files[0] if self.files else None

    @property
    def last(self):
        return self.files[-1] if self.files else None

    def min_offset(self) -> int:
        """Start offset of the first segment, or 0 when the queue is empty."""
        return self.files[0].file_from_offset if self.files else 0

    def max_offset(self) -> int:
        """Logical end of written data: last start + its wrote position."""
        last = self.last
        return last.file_from_offset + last.wrote_position if last else 0

    def find(self, offset: int):
        """The segment covering *offset*, or None (docs/format.md#segment-queues)."""
        files = self.files
        if not files or offset < 0:
            return None
        i = offset // self.file_size - files[0].file_from_offset // self.file_size
        if 0 <= i < len(files):
            return files[i]
        return None

    # --- writing ----------------------------------------------------------------

    def last_for_append(self, start_offset: int = 0):
        """The last segment if it has room, else the next one, taken from the
        spares or made now: at ``start_offset`` rounded down when the queue
        is empty."""
        last = self.last
        if last is not None and not last.is_full():
            return last
        mf = self.next_file(start_offset)
        self.files.append(mf)
        return mf

    def _next_start(self, start_offset: int) -> int:
        """Where the segment after the last one (or the spares) starts."""
        tail = self.spares[-1] if self.spares else self.last
        if tail is None:
            return start_offset - start_offset % self.file_size
        return tail.file_from_offset + self.file_size

    def _make(self, start: int):
        """Segment *start*, made now, or taken from the service thread that
        is making it (waiting the few milliseconds a creation takes; the
        service needs no lock the caller may hold to finish). The caller
        holds the append lock."""
        m = self.making
        if m is not None and m.start == start and not m.taken:
            m.done.wait()
            if m.mf is not None:
                m.taken = True  # (the service leaves it to us: end_ahead)
                return m.mf
        return self.create_segment(start, sync_dir=self.sync_creation)

    def create_segment(self, start: int, make_dirs: bool = True, sync_dir: bool = True):
        """Create, reserve and map segment *start* and sync the directory
        entry (with *sync_dir* False, the next :meth:`flush` does:
        ``dir_unsynced``). Touches no list of the queue (a service thread
        calls it without the append lock, and with *make_dirs* False: a
        directory gone meanwhile, a store renamed while open, is not made
        again under the old path). Raises OSError (FileNotFoundError for a
        missing directory), DiskFullError, CorruptedFileError; a failure
        leaves no file."""
        if make_dirs:
            os.makedirs(self.directory, exist_ok=True)
        mf = MappedFile(os.path.join(self.directory, offset_to_file_name(start)), self.file_size, create=True)
        if not sync_dir:
            self.dir_unsynced = True
            return mf
        try:
            fsync_dir(self.directory)
        except BaseException:
            mf.destroy()
            raise
        return mf

    # --- making ahead (a service thread; docs/format.md#files-made-ahead) ----------------

    def begin_ahead(self, start: int, keep: int = 1) -> Making:
        """Say that segment *start* is being made by a service thread, which
        then calls :meth:`create_segment` without the append lock and
        :meth:`end_ahead` with it; a put that needs the segment meanwhile
        takes it (:meth:`_make`). It is kept while fewer than *keep* spares
        exist. The append lock is held."""
        m = Making(start, keep)
        self.making = m
        return m

    def end_ahead(self, m: Making):
        """The service thread's creation *m* is over (append lock held): the
        segment becomes a spare if it still follows the queue's last segment
        and no put took it; else it is deleted. Returns the segment (a spare,
        or the one a put took), or None when there is none to warm."""
        if self.making is m:
            self.making = None
        mf = m.mf
        if mf is None or m.taken:
            return mf
        if len(self.spares) < m.keep and self.covered_end() == m.start:
            self.spares.append(mf)
            return mf
        mf.destroy()
        return None

    def next_file(self, start_offset: int = 0):
        """The segment that follows the last one, not yet appended to
        ``files``: the first spare, or one made now (``start_offset``
        rounded down for an empty queue). Raises what making a file raises
        (OSError, DiskFullError), with the queue unchanged."""
        if self.last is not None:
            settle(self.last)  # (one made here and never warmed: its writer leaves it now)
        if self.spares:
            mf = self.spares.pop(0)
            if self.on_take is not None:
                self.on_take()
        else:
            mf = self._make(self._next_start(start_offset))
        mf.first_created_in_queue = not self.files
        return mf

    def covered_end(self) -> int:
        """Logical offset up to which segments (files and spares) exist; 0
        when there are none."""
        tail = self.spares[-1] if self.spares else self.last
        return 0 if tail is None else tail.file_from_offset + self.file_size

    def reserve(self, end_offset: int, start_offset: int = 0) -> None:
        """Make segments ahead (spares) until the queue's segments cover
        logical offsets up to *end_offset* (exclusive), the first of an
        empty queue at *start_offset* rounded down: a put makes every file
        it needs before it writes its first byte. Raises what making a file
        raises; spares made before the failure stay for later rolls."""
        if not self.files and not self.spares:
            if end_offset <= start_offset:
                return
            self.spares.append(self._make(start_offset - start_offset % self.file_size))
        while self.covered_end() < end_offset:
            self.spares.append(self._make(self.covered_end()))

    def reserve_files(self, count: int) -> None:
        """Make spares until *count* segments follow the last one."""
        while len(self.spares) < count:
            self.spares.append(self._make(self._next_start(0)))

    def drop_spares(self) -> None:
        """Delete the segments made ahead."""
        spares, self.spares = self.spares, []
        for mf in spares:
            mf.destroy()

    def truncate_dirty(self, offset: int) -> None:
        """Drop everything at or after logical *offset* (docs/format.md#segment-queues
        truncateDirtyFiles): later segments are deleted, the containing one gets
        its positions reset and its tail zeroed (docs/recovery.md#pitfall-stale-bytes-after-truncation).
        Spares are deleted too (they followed the old end)."""
        if self.spares:
            self.drop_spares()
        keep = []
        removed = False
        for mf in self.files:
            end = mf.file_from_offset + self.file_size
            if end <= offset:
                keep.append(mf)
                continue
            if mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                mf.wrote_position = mf.flushed_position = pos
                if not self.read_only:
                    mf.zero_tail(pos)
                keep.append(mf)
            elif self.read_only:
                mf.close()
            else:
                log.warning("deleting segment %s beyond offset %d", mf.path, offset)
                mf.destroy()
                removed = True
        self.files = keep
        if removed:
            fsync_dir(self.directory)

    def delete_last(self) -> None:
        """Remove the last segment (closing it only, when read-only) and the spares."""
        if self.spares:
            self.drop_spares()
        mf = self.files.pop()
        if self.read_only:
            mf.close()
        else:
            log.warning("deleting segment %s", mf.path)
            mf.destroy()
            fsync_dir(self.directory)

    # --- clean-up and follow mode -------------------------------------------------

    def delete_first(self, count: int = 1) -> list:
        """Remove the first *count* segments (never the last one): close and
        unlink each, then sync the directory. The caller holds the reader
        references exclusively (:class:`ReferenceResource`) and the locks of
        the queue's writer. Returns the removed :class:`MappedFile` objects.

        A mapping that views still pin stays readable to them (see
        :meth:`MappedFile.close`)."""
        files = self.files
        count = min(count, len(files) - 1)
        if count <= 0:
            return []
        gone = files[:count]
        for mf in gone:
            mf.available = False
            if not self.read_only:
                mf.flush(0)  # a crash must not lose what the CQ of a later file needs
        for mf in gone:
            mf.close()
        # in place: a writer appends to the same list object concurrently
        del files[:count]
        if not self.read_only:
            for mf in gone:
                _unlink_quietly(mf.path)
            fsync_dir(self.directory)
        return gone

    def vanished_head(self) -> int:
        """Read-only follow mode: how many leading segments another process
        deleted (their files are gone), never counting the last one."""
        n = 0
        for mf in self.files[:-1]:
            if os.path.exists(mf.path):
                break
            n += 1
        return n

    def follow_files(self) -> bool:
        """Read-only follow mode, for a queue with no segment mapped yet: load
        it if it was opened before its first segment existed (caught
        mid-creation: nothing, try again next time), else map a segment the
        writer created since. The last segment's wrote position starts at 0,
        for the caller to scan. Returns whether any segment is mapped now."""
        if self.file_size is None:
            try:
                self.load()
            except CorruptedFileError:
                self.files = []
                self.file_size = None
            if self.files:
                # only the first is taken for scanning: a writer keeps its next
                # segment made ahead, so the last file is not the one it writes
                # into and the one before it need not be full; the others are
                # mapped one at a time as the scans find each full
                for mf in self.files[1:]:
                    mf.close()
                del self.files[1:]
                self.files[0].wrote_position = 0
        else:
            self.map_new_segments()
        return bool(self.files)

    def map_new_segments(self) -> int:
        """Read-only follow mode: map the segment another process created
        after the last one known, if there is one (a segment still being
        created, not yet at full size, waits for the next call). One per call,
        so the caller scans each before the next. Returns how many were added
        (0 or 1); the wrote position of the new one is 0 until scanned."""
        if self.file_size is None:
            return 0
        last = self.last
        start = last.file_from_offset + self.file_size if last is not None else None
        if start is None:
            try:
                names = sorted(n for n in os.listdir(self.directory) if is_offset_name(n))
            except FileNotFoundError:
                return 0
            if not names:
                return 0
            start = int(names[0])
        added = 0
        while True:
            path = os.path.join(self.directory, offset_to_file_name(start))
            try:
                if os.path.getsize(path) != self.file_size:
                    break
                mf = MappedFile(path, self.file_size, read_only=True)
            except (OSError, CorruptedFileError):
                break  # not there, or caught mid-creation
            self.files.append(mf)
            added += 1
            break
        return added

    def flush(self, least_pages: int = 0) -> None:
        """Sync the directory if a segment was made without (``dir_unsynced``),
        then flush every segment with unflushed bytes (see
        ``MappedFile.flush``). Raises OSError."""
        if self.dir_unsynced:
            # cleared first: a segment a put makes during the sync sets it again
            self.dir_unsynced = False
            try:
                fsync_dir(self.directory)
            except BaseException:
                self.dir_unsynced = True
                raise
        for mf in self.files:
            if mf.flushed_position < mf.wrote_position:
                mf.flush(least_pages)

    def close(self) -> None:
        """Unmap every segment; spares, never written, are deleted."""
        for mf in self.files:
            mf.close()
        if self.spares:
            try:
                self.drop_spares()
            except OSError:  # (a store that cannot unlink must still close)
                log.warning("could not delete the segments made ahead in %s", self.directory, exc_info=True)

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []
        self.drop_spares()
