"""The one read-only walker of CommitLog files (docs/format.md#commitlog-record).

Everything that reads store files without the store's writer goes through
here: ``rmqstore.tools`` (verify, salvage, recover), ``rmqstore.arrow`` and
``rmqstore.spark`` on top of it, and the CommitLog's search for valid records
behind damage (``CommitLog.find_valid_record``). It offers

* :func:`list_segments`: the segment files of a directory (names of ASCII
  digits, docs/format.md#file-names), in offset order, and the stray entries;
* :func:`map_readonly` / :class:`Segment`: a file mapped read-only;
* :func:`validate_record` and :func:`iter_records`: record-by-record
  validation (body CRC, the stored PHYSICALOFFSET, a trailing ``__CRC32#``);
* :func:`find_valid_record`: the single resynchronising search for the next
  valid record after damage, skipping what the file system reports as holes.

Nothing here writes, and nothing keeps a file descriptor open.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from collections.abc import Iterator

from .. import _kernels as k
from ..exceptions import CorruptedFileError
from ..format.layout import (
    BLANK_MAGIC_CODE,
    CRC32_RESERVED_LEN,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    POS_PHYSICALOFFSET,
    PROPERTY_CRC32,
    REC_BAD_SIZE,
    REC_PROP_CRC,
    is_offset_name,
)

__all__ = [
    "PHY_MISMATCH",
    "Segment",
    "data_ranges",
    "find_valid_record",
    "iter_records",
    "list_segments",
    "map_readonly",
    "validate_record",
]

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_CRC_PREFIX = PROPERTY_CRC32.encode("ascii") + b"\x01"
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_RECORD_MAGICS = (_I32.pack(MESSAGE_MAGIC_CODE), _I32.pack(MESSAGE_MAGIC_CODE_V2))
_BLANK_MAGIC = _I32.pack(BLANK_MAGIC_CODE)

#: status (beside the REC_* codes of ``check_record``) of a record whose
#: PHYSICALOFFSET field disagrees with its position (docs/recovery.md#pitfall-stored-offsets-trusted)
PHY_MISMATCH = -100

Buffer = mmap.mmap | bytes


# --- listing --------------------------------------------------------------------------------------


def list_segments(directory) -> tuple:
    """The segment files of *directory* (a CommitLog, a ConsumeQueue or the
    index directory).

    Returns ``(files, strays)``: ``files`` is ``[(start, name, path)]`` of the
    regular files whose name is ASCII digits (``start`` = ``int(name)``, the
    file's first logical offset), sorted by start; ``strays`` the sorted names
    of other entries that are not directories (for the caller to warn about:
    they are never read). A missing directory, or a file in its place, lists
    nothing. Symbolic links to regular files are listed (reading one never
    writes through it)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    files, strays = [], []
    for name in names:
        path = os.path.join(directory, name)
        if is_offset_name(name) and os.path.isfile(path):
            files.append((int(name), name, path))
        elif not os.path.isdir(path):
            strays.append(name)
    files.sort()
    return files, sorted(strays)


# --- mapping --------------------------------------------------------------------------------------


def _open(path, follow_links: bool) -> int:
    flags = os.O_RDONLY | _CLOEXEC
    if not follow_links:
        flags |= _NOFOLLOW
    try:
        return os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links and os.path.islink(path):
            raise CorruptedFileError("a symbolic link in place of a store file", os.fspath(path)) from None
        raise


def map_readonly(path, follow_links: bool = False) -> Buffer:
    """The whole file at *path* mapped read-only (``mmap.ACCESS_READ``), or
    ``b""`` for an empty file; the caller closes an ``mmap``. The file
    descriptor is closed before this returns.

    With *follow_links* False (the default) the file is opened with
    ``O_NOFOLLOW``: a symbolic link in its place raises
    :class:`CorruptedFileError` naming it. Other failures raise ``OSError``."""
    fd = _open(path, follow_links)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
    finally:
        os.close(fd)


class Segment:
    """One file mapped read-only.

    Attributes:
        path (str): the file.
        rel (str): its name in reports (e.g. relative to the store root).
        start (int): logical offset of its first byte (the file name).
        size (int): bytes.
        buf (mmap.mmap | bytes): the mapping, ``b""`` for an empty file.

    Raises what :func:`map_readonly` raises. Closing is idempotent; the
    object is also a context manager.
    """

    __slots__ = ("path", "rel", "start", "size", "buf")

    def __init__(self, path, rel: str | None = None, start: int = 0, follow_links: bool = False):
        self.path = os.fspath(path)
        self.rel = self.path if rel is None else rel
        self.start = start
        self.buf = map_readonly(self.path, follow_links)
        self.size = len(self.buf)

    def data_ranges(self, start: int) -> list:
        """:func:`data_ranges` of the file from *start* (opens it briefly)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | _CLOEXEC)
        except OSError:
            return [(start, self.size)] if start < self.size else []
        try:
            return list(data_ranges(fd, start, self.size))
        finally:
            os.close(fd)

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap) and not self.buf.closed:
            self.buf.close()

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def data_ranges(fd: int, start: int, size: int) -> Iterator[tuple]:
    """Yield ``(lo, hi)``: the byte ranges of the open file *fd* from *start*
    up to *size* that may hold data, as the file system tells them
    (``SEEK_DATA``/``SEEK_HOLE``: holes and unwritten preallocated blocks hold
    none), or the whole rest where it cannot say. For searches that must not
    read (and fault in) a preallocated, never written tail."""
    pos = start
    while pos < size:
        try:
            lo = os.lseek(fd, pos, os.SEEK_DATA)
            hi = os.lseek(fd, lo, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data from pos on
                return
            yield pos, size  # the file system cannot tell: all of it
            return
        except AttributeError:  # pragma: no cover - no SEEK_DATA on this system
            yield pos, size
            return
        if lo >= size:
            return
        yield lo, min(hi, size)
        pos = hi


# --- records --------------------------------------------------------------------------------------


def prop_crc(buf, pos: int, size: int, props: bytes):
    """``None`` when the record of *size* bytes at *pos* has properties
    (*props*) that do not end with a ``__CRC32#`` entry
    (docs/format.md#crc32-property), else ``(stored, computed)``."""
    n = len(props)
    if n < CRC32_RESERVED_LEN:
        return None
    tail = props[n - CRC32_RESERVED_LEN :]
    digits = tail[9:19]
    if tail[:9] != _CRC_PREFIX or tail[19] != 2 or not digits.isdigit():
        return None
    if n > CRC32_RESERVED_LEN and props[n - CRC32_RESERVED_LEN - 1] != 2:
        return None
    return int(digits[::-1]), k.masked_crc32(buf, pos, pos + size - CRC32_RESERVED_LEN)


def validate_record(buf, pos: int, limit: int, phys: int, max_size: int):
    """Validate the record at *pos* of *buf* (not past *limit*) as recovery
    with CRC checking does, plus its stored PHYSICALOFFSET against *phys*
    (docs/recovery.md#pitfall-stored-offsets-trusted) and a trailing ``__CRC32#``.

    Returns ``(status, fields)``: the record size and the ``decode_record``
    tuple of a valid record, ``(0, None)`` for a blank (END_OF_FILE) record,
    or a negative REC_* code (or :data:`PHY_MISMATCH`) and None."""
    st = k.check_record(buf, pos, limit, True, False, max_size)
    if st <= 0:
        return st, None
    if _I64.unpack_from(buf, pos + POS_PHYSICALOFFSET)[0] != phys:
        return PHY_MISMATCH, None
    try:
        fields = k.decode_record(buf, pos, False)
    except ValueError:
        return REC_BAD_SIZE, None  # cannot happen after check_record accepted it
    crc = prop_crc(buf, pos, st, fields[16])
    if crc is not None and crc[0] != crc[1]:
        return REC_PROP_CRC, None
    return st, fields


def iter_records(buf, pos: int, limit: int, file_from: int, max_size: int) -> Iterator[tuple]:
    """Yield ``(pos, size, fields)`` for the consecutive records from *pos*
    that :func:`validate_record` accepts (physical offset ``file_from + pos``);
    stops at the first one it does not, or at *limit*. The caller judges the
    stop (the position after the last record yielded) itself."""
    while pos < limit:
        st, fields = validate_record(buf, pos, limit, file_from + pos, max_size)
        if st <= 0:
            return
        yield pos, st, fields
        pos += st


def find_valid_record(
    buf,
    start: int,
    limit: int,
    file_from: int,
    max_size: int,
    *,
    check_crc: bool = True,
    verify_prop_crc: int = 0,
    prop_crc_tail: bool = False,
    blank_end: int | None = None,
    ranges=None,
):
    """The first position *q* >= *start* in *buf* (a record's 4-byte magic
    code ending by *limit*) where a record starts that validates and whose
    PHYSICALOFFSET field is ``file_from + q``: the resynchronising search
    after damage, by magic code (``find``), nearest first.

    Args:
        check_crc, verify_prop_crc: as for the ``check_record`` kernel.
        prop_crc_tail (bool): also compare a trailing ``__CRC32#`` property
            with the record (:func:`validate_record`).
        blank_end (int | None): also accept a blank (END_OF_FILE) record whose
            TOTALSIZE reaches exactly this position (the segment size).
        ranges (iterable | None): ``(lo, hi)`` ranges that may hold data
            (:func:`data_ranges`), searched in order; None searches all of
            ``[start, limit)``. Holes cost nothing.
        max_size (int): largest record accepted, in bytes.

    Returns ``(q, status)`` (status: record size, 0 for the blank record) or
    None when nothing valid follows."""
    magics = _RECORD_MAGICS + (_BLANK_MAGIC,) if blank_end is not None else _RECORD_MAGICS
    for lo, hi in ((start, limit),) if ranges is None else ranges:
        lo = max(lo, start)
        hi = min(hi + 4, limit)
        found = [buf.find(m, lo + 4, hi) for m in magics]
        while True:
            live = [c for c in found if c >= 0]
            if not live:
                break
            c = min(live)
            j = found.index(c)
            q = c - 4
            if j == 2:
                if _I32.unpack_from(buf, q)[0] == blank_end - q:
                    return q, 0
            elif prop_crc_tail:
                st, _ = validate_record(buf, q, limit, file_from + q, max_size)
                if st > 0:
                    return q, st
            else:
                st = k.check_record(buf, q, limit, check_crc, verify_prop_crc, max_size)
                if st > 0 and _I64.unpack_from(buf, q + POS_PHYSICALOFFSET)[0] == file_from + q:
                    return q, st
            found[j] = buf.find(magics[j], c + 1, hi)
    return None
