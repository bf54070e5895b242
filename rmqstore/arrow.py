"""CommitLog records as Apache Arrow columns, without Spark.

Reads one or more store directories (one per broker) into ``pyarrow``
record batches: the bulk decoder (``_kernels.decode_columns``) turns
consecutive CommitLog records into numpy columns, and the columns become
Arrow arrays over the same buffers (``Array.from_buffers``), so no Python
object is made per message. The Spark data source (``rmqstore.spark``) and
the rebuild jobs sit on top of this module; it needs ``pyarrow`` and
``numpy`` (the ``rmqstore[spark]`` extra) and the core never imports it.

Work is cut into :class:`Split`\\ s: one per CommitLog file, cut further only
at physical offsets known to start a record (ConsumeQueue units, each
checked with ``check_record`` and its stored PHYSICALOFFSET). A
:class:`ScanFilter` prunes files and splits (topic and queue via the
ConsumeQueues, physical offsets, store time) and then filters rows exactly.

A store directory may be a URI (``s3://bucket/store``, ``hdfs://...``;
:mod:`rmqstore.storage.uri`): its files are then read by byte ranges,
a split's range at once (*split_bytes* of memory per reading task), never
a whole CommitLog file to plan.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

try:
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"rmqstore.arrow needs pyarrow: pip install 'rmqstore[spark]' ({e})") from e

from . import _kernels as k
from .exceptions import CorruptedFileError
from .format.layout import (
    BLANK_MAGIC_CODE,
    CQ_STORE_UNIT_SIZE,
    HOST_COLUMNS,
    KEY_COLUMNS,
    KEY_SEPARATOR,
    POS_PHYSICALOFFSET,
    PRE_BLANK_SIZE,
    REC_BLANK,
    REC_STATUS_TEXT,
    is_offset_name,
)
from .storage import uri
from .storage.consumequeue import queue_dirs
from .storage.walker import data_ranges, find_valid_record, list_segments, map_readonly

__all__ = [
    "COLUMNS",
    "LOOKUP_COLUMNS",
    "NARROW_COLUMNS",
    "ScanFilter",
    "Split",
    "arrow_schema",
    "broker_name",
    "iter_batches",
    "lookup_splits",
    "min_offset",
    "range_splits",
    "read_split",
    "read_table",
    "scan_end",
    "store_splits",
]

#: every column, in schema order
COLUMNS = (
    "broker", "physical_offset", "topic", "queue_id", "queue_offset", "store_timestamp", "born_timestamp",
    "born_host", "store_host", "sys_flag", "flag", "reconsume_times", "tags", "keys", "unique_key", "msg_id",
    "properties", "body", "store_size", "prepared_transaction_offset", "body_crc",
)
#: the narrow schema: everything but the body and the property map
NARROW_COLUMNS = tuple(c for c in COLUMNS if c not in ("properties", "body"))

_TS = pa.timestamp("us", tz="UTC")
_TYPES = {
    "broker": pa.string(), "physical_offset": pa.int64(), "topic": pa.string(), "queue_id": pa.int32(),
    "queue_offset": pa.int64(), "store_timestamp": _TS, "born_timestamp": _TS, "born_host": pa.string(),
    "store_host": pa.string(), "sys_flag": pa.int32(), "flag": pa.int32(), "reconsume_times": pa.int32(),
    "tags": pa.string(), "keys": pa.string(), "unique_key": pa.string(), "msg_id": pa.string(),
    "properties": pa.map_(pa.string(), pa.string()), "body": pa.binary(), "store_size": pa.int32(),
    "prepared_transaction_offset": pa.int64(), "body_crc": pa.int32(),
}
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
#: |ms| beyond this overflows microseconds in int64: such a timestamp reads as null
_MAX_MS = (1 << 63) // 1000 - 1
#: records decoded per batch by default
DEFAULT_BATCH_ROWS = 65536


def arrow_schema(columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema of *columns* (default :data:`COLUMNS`), every field
    nullable; timestamps are ``timestamp[us, UTC]``, the property map is
    ``map<string, string>``. Raises ValueError for an unknown column."""
    cols = COLUMNS if columns is None else tuple(columns)
    bad = [c for c in cols if c not in _TYPES]
    if bad:
        raise ValueError(f"unknown column(s) {bad}; known: {', '.join(COLUMNS)}")
    return pa.schema([pa.field(c, _TYPES[c]) for c in cols])


def broker_name(store_dir: str) -> str:
    """The broker a store directory belongs to: its base name, or its parent's
    when the directory is called ``store`` (RocketMQ's default
    ``${user.home}/store``, so ``/data/broker-a/store`` is ``broker-a``; the
    same for a URI's path)."""
    if uri.is_uri(store_dir):
        names = uri.names(store_dir)
        return names[-2] if names[-1:] == ["store"] and len(names) > 1 else names[-1]
    path = os.path.abspath(os.fspath(store_dir)).rstrip(os.sep)
    base = os.path.basename(path)
    if base == "store":
        parent = os.path.basename(os.path.dirname(path))
        return parent or base
    return base


@dataclass(frozen=True)
class ScanFilter:
    """Row conditions a scan applies exactly (and uses to skip files).

    Attributes:
        topics (frozenset[str] | None): keep only these topics.
        queue_ids (frozenset[int] | None): keep only these queue ids.
        min_physical_offset, max_physical_offset (int | None): inclusive
            bounds on the record's physical offset (bytes).
        min_store_timestamp, max_store_timestamp (int | None): inclusive
            bounds on STORETIMESTAMP, ms since epoch.

    Pruning by topic and queue reads the ConsumeQueues, which have no unit
    for prepared and rollback transaction records (docs/recovery.md#dispatch): such a record is
    found only in a file that also holds a unit of a selected queue. Pruning
    by store time assumes store timestamps do not decrease along the
    CommitLog (as RocketMQ's own lookups by time do).
    """

    topics: frozenset | None = None
    queue_ids: frozenset | None = None
    min_physical_offset: int | None = None
    max_physical_offset: int | None = None
    min_store_timestamp: int | None = None
    max_store_timestamp: int | None = None

    def is_empty(self) -> bool:
        return self == ScanFilter()

    def intersect(self, other: ScanFilter) -> ScanFilter:
        """Both filters at once."""

        def both_sets(a, b):
            return b if a is None else (a if b is None else a & b)

        def lo(a, b):
            return b if a is None else (a if b is None else max(a, b))

        def hi(a, b):
            return b if a is None else (a if b is None else min(a, b))

        return ScanFilter(
            both_sets(self.topics, other.topics), both_sets(self.queue_ids, other.queue_ids),
            lo(self.min_physical_offset, other.min_physical_offset),
            hi(self.max_physical_offset, other.max_physical_offset),
            lo(self.min_store_timestamp, other.min_store_timestamp),
            hi(self.max_store_timestamp, other.max_store_timestamp),
        )


class Split(NamedTuple):
    """A byte range of one CommitLog file that starts at a record.

    Attributes:
        broker (str): value of the ``broker`` column.
        path (str): the CommitLog file (a path, or a URI).
        file_offset (int): physical offset of the file's first byte (its name).
        start (int): position in the file where the first record starts.
        end (int): position the split stops at (the next split's start, or
            the file size).
    """

    broker: str
    path: str
    file_offset: int
    start: int
    end: int


@dataclass
class _Segment:
    path: str
    offset: int
    size: int
    first_ts: int = -1  # store time of the file's first record, -1 if none
    units: np.ndarray | None = field(default=None, repr=False)


def _segments(store_dir: str) -> list:
    """The non-empty CommitLog segments of a store (:func:`walker.list_segments`), by offset."""
    if uri.is_uri(store_dir):
        d = uri.join(store_dir, "commitlog")
        return sorted((_Segment(uri.join(d, name), int(name), size) for name, is_dir, size in uri.list_dir(d)
                       if not is_dir and is_offset_name(name) and size > 0), key=lambda s: s.offset)
    files, _strays = list_segments(os.path.join(store_dir, "commitlog"))
    out = []
    for start, _name, path in files:
        size = os.path.getsize(path)
        if size > 0:
            out.append(_Segment(path, start, size))
    return out


def _map(path: str):
    """The file mapped read-only (b"" when empty): :func:`walker.map_readonly`."""
    return map_readonly(path, follow_links=True)


@contextlib.contextmanager
def _window(path: str, start: int, end: int) -> Iterator[tuple]:
    """``(buffer, base)``: bytes of a CommitLog file holding ``[start, end)``,
    where ``buffer[i]`` is the file's byte ``base + i``. A local file is
    mapped whole (base 0); a URI's file is read as that range (base *start*)."""
    if uri.is_uri(path):
        yield uri.read_range(path, start, end), start
        return
    buf = _map(path)
    try:
        yield buf, 0
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def _under(base: str, *names: str) -> str:
    """*names* under directory *base*, a local path or a URI."""
    return uri.join(base, *names) if uri.is_uri(base) else os.path.join(base, *names)


def _is_dir(path: str) -> bool:
    """Whether *path*, a local path or a URI, is a directory."""
    return uri.is_dir(path) if uri.is_uri(path) else os.path.isdir(path)


def _record_time(path: str, pos: int, phy: int, file_size: int) -> int | None:
    """Store time of the valid record (body CRC checked) whose PHYSICALOFFSET
    is *phy* at position *pos* of a CommitLog file, or None when none starts there."""
    if pos < 0 or pos + 36 > file_size:
        return None
    if uri.is_uri(path):  # (read the record alone: most fit in one request's first 64 KiB)
        buf = uri.read_range(path, pos, min(file_size, pos + 65536))
        total = _I32.unpack_from(buf)[0]
        if total < 36 or pos + total > file_size:
            return None
        if total > len(buf):
            buf = uri.read_range(path, pos, pos + total)
        return k.read_store_timestamp(buf, 0) if _starts_record(buf, 0, phy, file_size) else None
    with _window(path, pos, file_size) as (buf, _base):
        return k.read_store_timestamp(buf, pos) if _starts_record(buf, pos, phy, file_size) else None


def _starts_record(buf, pos: int, phy: int, max_size: int) -> bool:
    """Whether a valid record (body CRC checked) whose PHYSICALOFFSET is *phy* starts at *pos*."""
    if pos < 0 or pos + 36 > len(buf):
        return False
    if k.check_record(buf, pos, len(buf), True, False, max_size) <= 0:
        return False
    return _I64.unpack_from(buf, pos + POS_PHYSICALOFFSET)[0] == phy


_UNIT = struct.Struct(">qiq")
_INF = 1 << 63


class _QueueFiles:
    """The ConsumeQueue files of one queue, searched by physical offset without
    reading them whole: units are in CommitLog order, so a unit's physical
    offset is a sort key once pre-blank placeholders (at the head) count as
    -1 and invalid units (the zeros after the last one) as +infinity."""

    def __init__(self, paths: list):
        self.paths = paths
        self._bounds: dict = {}  # file index -> (first key, last key) of its valid units
        self._held: tuple = (-1, b"")  # (file index, bytes) of a URI's file last read

    @staticmethod
    def _key(buf, i: int) -> int:
        phy, size, tags = _UNIT.unpack_from(buf, i * CQ_STORE_UNIT_SIZE)
        if size <= 0 or phy < 0:
            return _INF
        if phy == 0 and size == PRE_BLANK_SIZE and tags == 0:
            return -1
        return phy

    def _search(self, buf, n: int, target: int) -> int:
        """First unit index whose key is >= *target* (n if none)."""
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._key(buf, mid) < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _with(self, i: int, fn):
        if uri.is_uri(self.paths[i]):  # (a queue file is small: read whole, the last one kept)
            if self._held[0] != i:
                self._held = (i, uri.read_all(self.paths[i]))
            data = self._held[1]
            return fn(data, len(data) // CQ_STORE_UNIT_SIZE)
        buf = _map(self.paths[i])
        try:
            return fn(buf, len(buf) // CQ_STORE_UNIT_SIZE)
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()

    def bounds(self, i: int) -> tuple:
        """(smallest, largest) physical offset of file *i*'s units, or (-1, -1)."""
        if i not in self._bounds:
            def find(buf, n):
                first = self._search(buf, n, 0)
                end = self._search(buf, n, _INF)
                if first >= end:
                    return -1, -1
                return self._key(buf, first), self._key(buf, end - 1)

            self._bounds[i] = self._with(i, find)
        return self._bounds[i]

    def first_at_or_after(self, target: int) -> int:
        """Smallest unit physical offset >= *target*, or -1."""
        for i in range(len(self.paths)):
            _lo, hi = self.bounds(i)
            if hi < target:
                continue

            def find(buf, n):
                j = self._search(buf, n, target)
                key = self._key(buf, j) if j < n else _INF
                return -1 if key == _INF else key

            return self._with(i, find)
        return -1

    def last(self) -> int:
        """Largest unit physical offset, or -1."""
        for i in range(len(self.paths) - 1, -1, -1):
            hi = self.bounds(i)[1]
            if hi >= 0:
                return hi
        return -1


def _queues(store_dir: str) -> dict:
    """``{(topic, queue_id): _QueueFiles}`` of the store's ConsumeQueues."""
    if uri.is_uri(store_dir):
        return _uri_queues(store_dir)
    out: dict = {}
    for topic, qid, qdir in queue_dirs(store_dir):
        paths = [p for _, _, p in list_segments(qdir)[0] if os.path.getsize(p) >= CQ_STORE_UNIT_SIZE]
        if paths:
            out[(topic, qid)] = _QueueFiles(paths)
    return out


def _uri_queues(store_dir: str) -> dict:
    """:func:`_queues` of a store named by URI."""
    out: dict = {}
    base = uri.join(store_dir, "consumequeue")
    for topic, is_dir, _size in uri.list_dir(base):
        if not is_dir:
            continue
        for qid, q_is_dir, _ in uri.list_dir(uri.join(base, topic)):
            if not q_is_dir or not qid.isdigit() or qid != str(int(qid)):
                continue
            qdir = uri.join(base, topic, qid)
            files = sorted((int(n), uri.join(qdir, n)) for n, d, size in uri.list_dir(qdir)
                           if not d and is_offset_name(n) and size >= CQ_STORE_UNIT_SIZE)
            if files:
                out[(topic, int(qid))] = _QueueFiles([p for _, p in files])
    return out


def store_splits(
    store_dir,
    broker: str | None = None,
    split_bytes: int = 128 << 20,
    scan_filter: ScanFilter | None = None,
) -> list:
    """Plan the :class:`Split`\\ s of one store.

    Each CommitLog file is one split; a file larger than *split_bytes*
    (bytes) is cut near every multiple of it, at the next record a
    ConsumeQueue unit points at, once that record validates there (body CRC
    and stored physical offset; no ConsumeQueues: no cut). With
    *scan_filter*, files and splits that cannot hold a matching record are
    left out (see :class:`ScanFilter` for what that relies on). The
    ConsumeQueues are binary-searched, never read whole.

    Raises FileNotFoundError when *store_dir* is not a directory.
    """
    store_dir = os.fspath(store_dir)
    if not _is_dir(store_dir):
        raise FileNotFoundError(f"no store directory at {uri.shown(store_dir)}")
    broker = broker_name(store_dir) if broker is None else broker
    f = scan_filter or ScanFilter()
    segs = _segments(store_dir)
    if not segs:
        return []
    by_queue = f.topics is not None or f.queue_ids is not None
    queues = _queues(store_dir) if by_queue or any(s.size > split_bytes for s in segs) else {}
    wanted_files: set | None = None
    covered_end = -1
    if by_queue:
        # files past the queues' last unit are never pruned by queue (a lagging dispatch)
        covered_end = max((q.last() for q in queues.values()), default=-1)
        chosen = [q for (topic, qid), q in queues.items()
                  if (f.topics is None or topic in f.topics) and (f.queue_ids is None or qid in f.queue_ids)]
        wanted_files = set()
        for s in segs:
            for q in chosen:
                phy = q.first_at_or_after(s.offset)
                if 0 <= phy < s.offset + s.size:
                    wanted_files.add(s.offset)
                    break
    for s in segs:
        t = _record_time(s.path, 0, s.offset, s.size)
        s.first_ts = -1 if t is None else t
    out = []
    for i, s in enumerate(segs):
        if wanted_files is not None and s.offset not in wanted_files and s.offset <= covered_end:
            continue
        next_ts = segs[i + 1].first_ts if i + 1 < len(segs) else -1
        if not _may_hold(f, s.offset, s.offset + s.size, s.first_ts, next_ts):
            continue
        cut_at = _cuts(s, list(queues.values()), split_bytes) if s.size > split_bytes and queues else [(0, -1)]
        cuts = [c for c, _t in cut_at]
        times = [t if c else s.first_ts for c, t in cut_at]
        for j, c in enumerate(cuts):
            end = cuts[j + 1] if j + 1 < len(cuts) else s.size
            t_next = times[j + 1] if j + 1 < len(cuts) else next_ts
            if _may_hold(f, s.offset + c, s.offset + end, times[j], t_next):
                out.append(Split(broker, s.path, s.offset, c, end))
    return out


def _cuts(seg: _Segment, queues: list, split_bytes: int) -> list:
    """``[(position, store time)]`` in *seg* to cut at, the first ``(0, -1)``:
    for every multiple of *split_bytes*, the first record at or after it
    that a unit of some queue points at and that validates."""
    cuts = [(0, -1)]
    for target in range(split_bytes, seg.size, split_bytes):
        found = sorted(p for p in (q.first_at_or_after(seg.offset + target) for q in queues) if p >= 0)
        for phy in found:
            pos = phy - seg.offset
            if pos >= seg.size:
                break
            t = _record_time(seg.path, pos, phy, seg.size) if pos > cuts[-1][0] else None
            if t is not None:
                cuts.append((pos, t))
                break
    return cuts


def _may_hold(f: ScanFilter, lo: int, hi: int, first_ts: int, next_ts: int) -> bool:
    """Whether physical range [lo, hi), whose first record was stored at
    *first_ts* and the range after it starts at *next_ts* (-1: unknown),
    can hold a record *f* keeps."""
    if f.min_physical_offset is not None and hi <= f.min_physical_offset:
        return False
    if f.max_physical_offset is not None and lo > f.max_physical_offset:
        return False
    if f.min_store_timestamp is not None and next_ts >= 0 and next_ts < f.min_store_timestamp:
        return False
    if f.max_store_timestamp is not None and first_ts >= 0 and first_ts > f.max_store_timestamp:
        return False
    return True


# --- decoding -------------------------------------------------------------------------------------


def _buf(arr: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.ascontiguousarray(arr))


def _validity(valid: np.ndarray | None, n: int):
    """(bitmap buffer or None, null count) of a bool mask (True = present)."""
    if valid is None:
        return None, 0
    nulls = n - int(np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _string(cols: dict, name: str, n: int, binary: bool = False) -> pa.Array:
    bitmap, nulls = _validity(cols.get(name + "_valid"), n)
    typ = pa.binary() if binary else pa.string()
    return pa.Array.from_buffers(
        typ, n, [bitmap, _buf(cols[name + "_offsets"]), _buf(cols[name + "_data"])], nulls
    )


def _timestamp(ms: np.ndarray) -> pa.Array:
    n = ms.size
    bad = (ms > _MAX_MS) | (ms < -_MAX_MS)
    if bad.any():
        us = np.where(bad, 0, ms) * 1000
        bitmap, nulls = _validity(~bad, n)
        return pa.Array.from_buffers(_TS, n, [bitmap, _buf(us)], nulls)
    return pa.Array.from_buffers(_TS, n, [None, _buf(ms * 1000)], 0)


def _constant_string(value: str, n: int) -> pa.Array:
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    data = np.tile(np.frombuffer(raw, dtype=np.uint8), n) if raw else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(pa.string(), n, [None, _buf(offsets), _buf(data)], 0)


def _column(name: str, cols: dict, n: int, broker: str) -> pa.Array:
    if name == "broker":
        return _constant_string(broker, n)
    if name in ("store_timestamp", "born_timestamp"):
        return _timestamp(cols[name])
    if name == "body":
        return _string(cols, "body", n, binary=True)
    if name == "properties":
        keys = _string(cols, "property_key", int(cols["property_key_offsets"].size - 1))
        values = _string(cols, "property_value", int(cols["property_value_offsets"].size - 1))
        return pa.MapArray.from_arrays(pa.array(cols["properties_offsets"]), keys, values)
    typ = _TYPES[name]
    if pa.types.is_string(typ):
        return _string(cols, name, n)
    return pa.Array.from_buffers(typ, n, [None, _buf(cols[name])], 0)


def _batch(cols: dict, columns: Sequence[str], schema: pa.Schema, broker: str) -> pa.RecordBatch:
    n = int(cols["physical_offset"].size)
    return pa.RecordBatch.from_arrays([_column(c, cols, n, broker) for c in columns], schema=schema)


def _row_mask(cols: dict, f: ScanFilter) -> np.ndarray | None:
    """Rows of a decoded chunk *f* keeps (None: all of them)."""
    mask = None

    def both(m, cond):
        return cond if m is None else (m & cond)

    if f.min_physical_offset is not None:
        mask = both(mask, cols["physical_offset"] >= f.min_physical_offset)
    if f.max_physical_offset is not None:
        mask = both(mask, cols["physical_offset"] <= f.max_physical_offset)
    if f.min_store_timestamp is not None:
        mask = both(mask, cols["store_timestamp"] >= f.min_store_timestamp)
    if f.max_store_timestamp is not None:
        mask = both(mask, cols["store_timestamp"] <= f.max_store_timestamp)
    if f.queue_ids is not None:
        mask = both(mask, np.isin(cols["queue_id"], np.fromiter(f.queue_ids, np.int64)))
    if f.topics is not None:
        n = int(cols["physical_offset"].size)
        topic = _string(cols, "topic", n)
        hit = pc.is_in(topic, value_set=pa.array(sorted(f.topics), pa.string()))
        mask = both(mask, hit.to_numpy(zero_copy_only=False))
    return mask


log = logging.getLogger("rmqstore.arrow")

#: what a reader does at a damaged record (docs: ``onCorrupt``)
ON_CORRUPT = ("fail", "skip", "stop")


def _check_on_corrupt(on_corrupt: str) -> None:
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt must be one of {', '.join(ON_CORRUPT)}, got {on_corrupt!r}")


def _next_valid(buf, path: str, pos: int, file_offset: int, check_crc: bool):
    """Where the next valid record (or END_OF_FILE record) after *pos*
    starts in *buf*, bytes of one CommitLog file from physical offset
    *file_offset* to the file's end: ``(position, size)``, size 0 for the
    blank record; None when nothing valid follows (the end of its data).
    In a local file only the ranges the file system says hold data are
    searched."""
    size = len(buf)
    ranges = None
    if not uri.is_uri(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            ranges = list(data_ranges(fd, pos, size))
        finally:
            os.close(fd)
    return find_valid_record(buf, pos, size, file_offset, size, check_crc=check_crc, prop_crc_tail=True,
                             blank_end=size, ranges=ranges)


def _blank_at(buf, pos: int) -> bool:
    """Whether an END_OF_FILE record filling the rest of the file is at *pos* (or *pos* is its end)."""
    n = len(buf)
    if pos + 8 > n:
        return pos == n
    total, magic = struct.unpack_from(">ii", buf, pos)
    return magic == BLANK_MAGIC_CODE and total == n - pos


def _damage(file_offset: int, pos: int, stop: int) -> str:
    why = "zeros where a record should be, with valid records after them" if stop == REC_BLANK else (
        REC_STATUS_TEXT.get(stop, stop))
    return f"damaged record at physical offset {file_offset + pos} ({why}; `rmqstore verify` lists every problem)"


def read_split(
    split: Split,
    columns: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    scan_filter: ScanFilter | None = None,
    check_crc: bool = True,
    on_corrupt: str = "fail",
    end_offset: int | None = None,
    stats: dict | None = None,
) -> Iterator[pa.RecordBatch]:
    """Decode one split into record batches of at most *batch_rows* rows.

    Args:
        split (Split): from :func:`store_splits`.
        columns (sequence of str | None): output columns (default :data:`COLUMNS`).
        scan_filter (ScanFilter | None): rows to keep.
        check_crc (bool): verify body CRCs (and ``__CRC32#`` when present);
            on by default, as the store's own reads.
        on_corrupt (str): at a damaged record (one that does not validate,
            or zeros with valid records after them): ``"fail"`` raises,
            ``"skip"`` reads on from the next valid record (logged, and
            counted in *stats*), ``"stop"`` ends the split there (logged).
        end_offset (int | None): physical offset to stop at (a live store's
            known end), in addition to the split's end.
        stats (dict | None): ``skipped_records`` (damaged regions skipped)
            and ``skipped_bytes`` are added to it.

    Raises:
        CorruptedFileError: a damaged record (``on_corrupt="fail"``), with
            the file and its position in it.
        ValueError: an unknown *on_corrupt*.
    """
    _check_on_corrupt(on_corrupt)
    cols_out = COLUMNS if columns is None else tuple(columns)
    schema = arrow_schema(cols_out)
    f = scan_filter if scan_filter is not None and not scan_filter.is_empty() else None
    with_body = "body" in cols_out
    with_props = "properties" in cols_out
    # (the decoder leaves out the string columns no one asked for)
    with_hosts = not set(HOST_COLUMNS).isdisjoint(cols_out)
    with_keys = not set(KEY_COLUMNS).isdisjoint(cols_out)
    end = split.end
    if end_offset is not None:
        end = max(split.start, min(end, end_offset - split.file_offset))
    # a URI's split is read as its range: past its end, the next split's
    # first record validated when planned, so zeros up to there are damage
    size = uri.file_size(split.path) if uri.is_uri(split.path) else None
    tail_unseen = size is not None and end < size
    with _window(split.path, split.start, end) as (buf, base):
        # positions below are in buf; the file's are base more
        file_offset = split.file_offset + base
        pos = split.start - base
        end -= base
        while pos < end:
            nxt, stop, cols = k.decode_columns(
                buf, pos, end, file_offset, batch_rows, with_body, with_props, check_crc, with_hosts, with_keys
            )
            n = int(cols["physical_offset"].size)
            if n:
                mask = _row_mask(cols, f) if f is not None else None
                b = _batch(cols, cols_out, schema, split.broker)
                if mask is not None:
                    b = b.filter(pa.array(mask))
                if b.num_rows:
                    yield b
            if stop == REC_BLANK and _blank_at(buf, nxt):
                return  # END_OF_FILE: the rest of the file is filler
            if stop < 0 or stop == REC_BLANK:
                # an invalid record, or zeros: the end of the data unless valid records follow
                found = _next_valid(buf, split.path, nxt + (stop < 0), file_offset, check_crc)
                if found is None and stop == REC_BLANK and not tail_unseen:
                    return
                what = _damage(file_offset, nxt, stop)
                if on_corrupt == "fail":
                    raise CorruptedFileError(what + " (onCorrupt=skip reads past it)", uri.shown(split.path),
                                             base + nxt)
                if on_corrupt == "stop":
                    log.warning("%s: %s; the split ends there (onCorrupt=stop)", uri.shown(split.path), what)
                    return
                resume = found[0] if found is not None else len(buf)
                if stats is not None:
                    stats["skipped_records"] = stats.get("skipped_records", 0) + 1
                    stats["skipped_bytes"] = stats.get("skipped_bytes", 0) + min(resume, end) - nxt
                log.warning("%s: %s; skipped %d byte(s) (onCorrupt=skip)", uri.shown(split.path), what,
                            min(resume, end) - nxt)
                if found is None or found[1] == 0:
                    return
                nxt = resume
            elif nxt <= pos:
                return
            pos = nxt


def iter_batches(
    store_dirs,
    columns: Sequence[str] | None = None,
    brokers: Sequence[str] | None = None,
    scan_filter: ScanFilter | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    split_bytes: int = 128 << 20,
    check_crc: bool = True,
    on_corrupt: str = "fail",
) -> Iterator[pa.RecordBatch]:
    """Every record of the stores in *store_dirs* (a path or a list, one per
    broker), in CommitLog order store by store, as record batches.

    *brokers* names the stores for the ``broker`` column (default
    :func:`broker_name` of each path). Other arguments as :func:`read_split`.
    Raises FileNotFoundError for a missing store, CorruptedFileError as
    :func:`read_split`, ValueError for an unknown column or a broker list
    of the wrong length.
    """
    dirs = _as_list(store_dirs)
    names = _broker_names(dirs, brokers)
    for d, b in zip(dirs, names):
        for split in store_splits(d, b, split_bytes, scan_filter):
            yield from read_split(split, columns, batch_rows, scan_filter, check_crc, on_corrupt)


def read_table(store_dirs, columns: Sequence[str] | None = None, **kwargs: Any) -> pa.Table:
    """:func:`iter_batches` collected into one ``pyarrow.Table`` (for stores
    that fit in memory)."""
    cols = COLUMNS if columns is None else tuple(columns)
    return pa.Table.from_batches(list(iter_batches(store_dirs, cols, **kwargs)), schema=arrow_schema(cols))


def _as_list(store_dirs) -> list:
    if isinstance(store_dirs, (str, bytes, os.PathLike)):
        return [os.fspath(store_dirs)]
    return [os.fspath(d) for d in store_dirs]


def _broker_names(dirs: list, brokers: Iterable[str] | None) -> list:
    if brokers is None:
        return [broker_name(d) for d in dirs]
    names = list(brokers)
    if len(names) != len(dirs):
        raise ValueError(f"{len(names)} broker names for {len(dirs)} store directories")
    return names



# --- live stores ----------------------------------------------------------------------------------


def min_offset(store_dir) -> int:
    """Physical offset of the first CommitLog byte still stored (0 without files)."""
    segs = _segments(os.fspath(store_dir))
    return segs[0].offset if segs else 0


def scan_end(store_dir, start: int, on_corrupt: str = "stop", max_records: int | None = None) -> int:
    """Physical offset just past the last valid record at or after *start*
    (a record boundary), crossing END_OF_FILE blank records: the end a
    reader of a live store may go to. Records are checked with their body
    CRC, so one still being written ends the scan. A record that does not
    validate with valid data after it (in its file, or a later file that
    holds records) is damage, not a write in progress: *on_corrupt*
    ``"stop"`` ends the scan there (logged), ``"skip"`` goes on after it,
    ``"fail"`` raises CorruptedFileError naming file and position. With
    *max_records*, the scan ends after that many records (a streaming
    batch's limit)."""
    _check_on_corrupt(on_corrupt)
    budget = -1 if max_records is None else max_records
    segs = _segments(os.fspath(store_dir))
    offset = start
    i = 0
    while i < len(segs):
        s = segs[i]
        if offset >= s.offset + s.size:
            i += 1
            continue
        if offset < s.offset:
            offset = s.offset
        # (a URI's file is read from the offset on: positions in buf are base less)
        with _window(s.path, offset - s.offset, s.size) as (buf, base):
            pos = offset - s.offset - base
            while True:
                step = 65536 if budget < 0 else min(65536, budget)
                nxt, stop, cols = k.decode_columns(buf, pos, s.size - base, s.offset + base, step, False, False, True)
                pos = nxt
                if budget >= 0:
                    budget -= int(cols["physical_offset"].size)
                    if budget == 0:
                        return s.offset + base + pos
                if stop != 1:
                    break
            offset = s.offset + base + pos
            if stop == REC_BLANK and _blank_at(buf, pos):
                if i + 1 < len(segs):
                    offset = s.offset + s.size  # the file is full: go on with the next one
                    i += 1
                    continue
                return offset
            # an invalid record or zeros: a write in progress, or damage when valid data follows
            found = _next_valid(buf, s.path, pos + (stop < 0), s.offset + base, True)
            pos += base
            if found is not None:
                found = (found[0] + base, found[1])
        later = i + 1 < len(segs) and _holds_records(segs[i + 1].path)
        if found is None and not later:
            return offset
        what = _damage(s.offset, pos, stop)
        if on_corrupt == "fail":
            raise CorruptedFileError(what + " (onCorrupt=skip reads past it)", uri.shown(s.path), pos)
        if on_corrupt == "stop":
            log.warning("%s: %s; reading stops there (onCorrupt=stop)", uri.shown(s.path), what)
            return offset
        log.warning("%s: %s; skipped (onCorrupt=skip)", uri.shown(s.path), what)
        if found is not None and found[1] > 0:
            offset = s.offset + found[0]
        else:
            offset = s.offset + s.size
            i += 1
    return offset


def _holds_records(path: str) -> bool:
    """Whether a CommitLog file holds data (a file made ahead is all zeros: a record would start at 0)."""
    if uri.is_uri(path):
        return any(uri.read_range(path, 0, 8))
    with open(path, "rb") as fh:
        return any(fh.read(8))


#: columns whose equality a lookup through the store's indexes answers (:func:`lookup_splits`)
LOOKUP_COLUMNS = ("keys", "unique_key", "msg_id")


def lookup_splits(store_dir, broker: str, column: str, values: Iterable[str],
                  scan_filter: ScanFilter | None = None) -> list:
    """:class:`Split`\\ s that hold every record whose *column* may equal one
    of *values*, found through the store's indexes instead of a scan: for
    ``unique_key`` each value, for ``keys`` the first of the space-separated
    keys of each value, is looked up in the IndexFile in each topic (the
    topics of *scan_filter*, else every topic with a ConsumeQueue;
    ``MessageStore.query_messages``: every real match, UNIQ_KEY or one of
    KEYS); for ``msg_id`` the record at the physical offset each offset
    msgId names. Each record found is a split of its own, in physical
    offset order, each once; the records past the last one the index
    covers (a writer's unindexed tail, a crash, an index turned off) are
    added as splits to scan. The rows are a superset of the matches (a
    record that holds the key among others, a msgId's record whose id
    differs): the caller filters them exactly, as Spark does. A ``keys``
    value with no key in it (spaces only) cannot be looked up: the splits
    are then the whole scan's (:func:`store_splits`), and so are a store
    named by URI's (its indexes are not read remotely). Records RocketMQ
    does not index (transaction rollbacks), and those of a topic with no
    ConsumeQueue (only prepared transaction records) unless *scan_filter*
    names it, are found by a scan only.

    Raises FileNotFoundError when *store_dir* is not a directory, ValueError
    for a *column* not in :data:`LOOKUP_COLUMNS`, CorruptedFileError from
    the store's read-only open.
    """
    from .store import MessageStore

    if column not in LOOKUP_COLUMNS:
        raise ValueError(f"a lookup column is one of {', '.join(LOOKUP_COLUMNS)}, got {column!r}")
    store_dir = os.fspath(store_dir)
    if uri.is_uri(store_dir):
        return store_splits(store_dir, broker, scan_filter=scan_filter)
    if not os.path.isdir(store_dir):
        raise FileNotFoundError(f"no store directory at {store_dir}")
    f = scan_filter or ScanFilter()
    found: dict = {}  # physical offset -> record size
    with MessageStore.open(store_dir, read_only=True) as st:
        if column == "msg_id":
            for v in values:
                m = st.look_message_by_msg_id(v)
                if m is not None:
                    found[m.physical_offset] = m.store_size
        else:
            probes = set()
            for v in values:
                key = next((t for t in v.split(KEY_SEPARATOR) if t), None) if column == "keys" else v
                if not key:
                    return store_splits(store_dir, broker, scan_filter=f)
                probes.add(key)
            topics = sorted({t for t, _q in st.queues()} if f.topics is None else f.topics)
            for topic in topics:
                for key in sorted(probes):
                    for m in st.query_messages(topic, key, max_count=_ALL):
                        found[m.physical_offset] = m.store_size
        files = st.index.files
        indexed_to = files[-1].end_phy_offset if files else -1
        tail = st.commitlog.min_offset() if indexed_to < 0 else None
        if tail is None:
            last = st.get_message(indexed_to)
            tail = indexed_to + last.store_size if last is not None else st.commitlog.min_offset()
        end = st.max_physical_offset
    segs = _segments(store_dir)
    starts = [s.offset for s in segs]
    out = []
    for phy in sorted(found):
        if phy >= tail:
            continue  # (read by the tail's scan)
        s = segs[bisect.bisect_right(starts, phy) - 1]
        out.append(Split(broker, s.path, s.offset, phy - s.offset, phy - s.offset + found[phy]))
    return (out + range_splits(store_dir, broker, tail, end)) if tail < end else out


_ALL = (1 << 31) - 1  # (query_messages' largest max_count: every match)


def range_splits(store_dir, broker: str, start: int, end: int) -> list:
    """:class:`Split`\\ s covering physical offsets [*start*, *end*), both
    record boundaries (from :func:`scan_end`)."""
    out = []
    for s in _segments(os.fspath(store_dir)):
        lo, hi = max(start, s.offset), min(end, s.offset + s.size)
        if lo < hi:
            out.append(Split(broker, s.path, s.offset, lo - s.offset, hi - s.offset))
    return out
