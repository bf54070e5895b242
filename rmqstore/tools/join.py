"""Join stores written side by side into one store (``join_stores``).

Part stores, each written from empty by the store's own put path (so every
check and rule ran when their messages went in), are laid end to end into a
new store that holds what putting all their messages, part after part, into
one store would have written: records copied to their new physical offsets
with their QUEUEOFFSET and PHYSICALOFFSET fields rewritten (neither is
covered by the body CRC), END_OF_FILE blanks where a record does not fit
the rest of a segment, each ConsumeQueue the parts' units in order with
their physical offsets moved, and IndexFiles built anew from the parts'
entries (docs/format.md#joining-stores). The Spark writer's overwrite
works this way: each task fills a part, and the commit joins them.
"""

from __future__ import annotations

import mmap
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _kernels as k
from ..config import NO_FLUSH
from ..exceptions import ConfigError, CorruptedFileError
from ..format.layout import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    CQ_STORE_UNIT_SIZE,
    CQ_UNIT_FIELDS,
    END_FILE_MIN_BLANK_LENGTH,
    INDEX_ENTRY_FIELDS,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    POS_BORNHOST,
    POS_PHYSICALOFFSET,
    POS_QUEUEOFFSET,
    REC_BLANK,
    SCHEDULE_TOPIC,
    STOP_END,
    is_offset_name,
)
from ..storage.index import build_index_file, new_file_names
from ..storage.mapped_file import allocate_file

__all__ = ["join_stores", "part_config"]

_UNIT = np.dtype(CQ_UNIT_FIELDS)
_ENTRY = np.dtype(INDEX_ENTRY_FIELDS)
_BYTE8 = np.arange(8, dtype=np.int64)
#: a part's CommitLog segments need not be the target's: big enough for any record, small enough not to
#: reserve a target-sized file per task
_PART_SEGMENT = 64 * 1024 * 1024


def part_config(config):
    """The StoreConfig a part store for *config*'s target is written with:
    the target's rules, with small files (no 1 GiB segment or 420 MB index
    file reserved per part), nothing made ahead or warmed, and nothing
    synced (NO_FLUSH: a part is written again if lost; the join syncs the
    target)."""
    seg = config.mapped_file_size_commit_log
    if seg > _PART_SEGMENT and config.max_message_size + 65536 + END_FILE_MIN_BLANK_LENGTH < _PART_SEGMENT:
        seg = _PART_SEGMENT
    return config.replace(
        mapped_file_size_commit_log=seg,
        max_hash_slot_num=min(config.max_hash_slot_num, 1 << 16),
        max_index_num=min(config.max_index_num, 1 << 18),
        make_files_ahead=False,
        warm_maped_file_enable=False,
        flush_disk_type=NO_FLUSH,
    )


def join_stores(parts, target: str, config=None, keep_store_times: bool = True) -> dict:
    """Lay the stores in *parts* end to end into a new store at *target*.

    Args:
        parts (list[str]): closed store directories, in the order their
            messages go in; each was written from empty (queue offsets and
            physical offsets from 0) with ``part_config(config)``, and none
            has ``__CRC32#`` properties (``enabled_append_prop_crc``: that
            CRC covers the offsets this rewrites).
        target (str): a directory that does not exist yet; it is removed
            again when the join fails.
        config (StoreConfig | None): the target's settings (file sizes,
            index geometry, ``message_index_enable``); default StoreConfig().
        keep_store_times (bool): keep each record's store timestamp (ms).
            False makes them non-decreasing across the joined parts (each
            the largest so far, as a store's clock gives a sequential
            writer); delayed messages' delivery times move with them.

    Returns:
        ``{"records", "bytes", "queues", "index_files", "seconds"}``.

    Raises:
        FileExistsError: *target* exists.
        ConfigError: *config* appends ``__CRC32#``.
        CorruptedFileError: a part's record or ConsumeQueue unit does not
            validate (the part was not written whole).
    """
    from ..config import StoreConfig

    cfg = config if config is not None else StoreConfig()
    if cfg.enabled_append_prop_crc:
        raise ConfigError("stores with enabled_append_prop_crc cannot be joined: __CRC32# covers the offsets")
    t0 = time.monotonic()
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    os.mkdir(target)  # FileExistsError when it is there
    try:
        return _Join(target, cfg, keep_store_times).run(parts, t0)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


class _Join:
    def __init__(self, target: str, cfg, keep_store_times: bool):
        self.target = target
        self.cfg = cfg
        self.keep = keep_store_times
        self.seg = cfg.mapped_file_size_commit_log
        self.pos = 0  # the target's next physical offset
        self.last_ts = -(1 << 62)
        self.records = 0
        self.queues: dict = {}  # (topic, queue id) -> [unit arrays]
        self.bases: dict = {}  # (topic, queue id) -> units so far
        self.segments: dict = {}  # segment number -> its descriptor
        # full segments are synced and closed on a thread of their own (fdatasync
        # releases the GIL) while the next parts are copied: the disk is the bound
        self.syncer = ThreadPoolExecutor(1, thread_name_prefix="rmqstore-join-sync")
        self.syncing: list = []
        self.index = _IndexWriter(os.path.join(target, "index"), cfg) if cfg.message_index_enable else None
        part = part_config(cfg)
        self.part_slots, self.part_num = part.max_hash_slot_num, part.max_index_num

    def run(self, parts, t0: float) -> dict:
        from ..store import MessageStore

        try:
            for part in parts:
                self._part(part)
                self._retire(self.pos // self.seg)
        finally:
            self._close_segments()
        self._write_queues()
        files = self.index.finish(self.records) if self.index is not None else 0
        # an open and a clean close: the store's own checks of its last files, and its checkpoint
        MessageStore.open(self.target, config=self.cfg.replace(make_files_ahead=False)).close()
        return {"records": self.records, "bytes": self.pos, "queues": len(self.queues), "index_files": files,
                "seconds": round(time.monotonic() - t0, 3)}

    # --- one part

    def _part(self, part: str) -> None:
        sources: list = []  # (part segment base, mmap)
        try:
            cols = self._records(part, sources)
            n = cols["physical_offset"].size
            if n == 0:
                return
            phy = cols["physical_offset"]
            size = cols["store_size"].astype(np.int64)
            at, blanks = self._layout(size)
            ts = cols["store_timestamp"]
            if self.keep:
                new_ts = ts
            else:
                new_ts = np.maximum.accumulate(np.maximum(ts, self.last_ts))
                self.last_ts = int(new_ts[-1])
            qo = self._queues(part, phy, at, new_ts - ts)
            self._write(sources, phy, size, at, qo, new_ts, ts, cols["sys_flag"])
            for start, length in blanks:
                self._blank(start, length)
            if self.index is not None:
                self._index(part, phy, at, new_ts)
            self.records += n
        finally:
            for _base, mm in sources:
                mm.close()

    def _records(self, part: str, sources: list) -> dict:
        """Offsets, sizes, sys flags and store times of every record of *part*, in order."""
        d = os.path.join(part, "commitlog")
        names = sorted(n for n in os.listdir(d) if is_offset_name(n)) if os.path.isdir(d) else []
        got: dict = {"physical_offset": [], "store_size": [], "sys_flag": [], "store_timestamp": []}
        for name in names:
            path = os.path.join(d, name)
            base = int(name)
            with open(path, "rb") as f:
                length = os.fstat(f.fileno()).st_size
                if length == 0:
                    continue
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            sources.append((base, mm))
            pos, stop, cols = k.decode_columns(mm, 0, length, base, length, False, False, False, False, False)
            if stop not in (REC_BLANK, STOP_END):
                raise CorruptedFileError(f"part record does not validate (code {stop})", path, pos)
            for key, values in got.items():
                values.append(cols[key])
        return {key: (np.concatenate(v) if v else np.zeros(0, np.int64)) for key, v in got.items()}

    def _layout(self, sizes: np.ndarray) -> tuple:
        """Target offsets of records of *sizes* from ``self.pos``, and the
        END_OF_FILE blanks ``(offset, length)`` before the segments a
        record does not fit (one must leave 8 bytes in its segment)."""
        out = np.empty(sizes.size, dtype=np.int64)
        ends = np.cumsum(sizes)  # each record's end, counted from the part's first record
        blanks = []
        i, pos, seg = 0, self.pos, self.seg
        while i < sizes.size:
            seg_end = (pos // seg + 1) * seg
            done = int(ends[i - 1]) if i else 0  # (ends[j] - done: record j's end from *pos*)
            # the records from i on that end at least 8 bytes before the segment does
            fit = int(np.searchsorted(ends[i:], seg_end - END_FILE_MIN_BLANK_LENGTH - pos + done, side="right"))
            out[i:i + fit] = pos + ends[i:i + fit] - sizes[i:i + fit] - done
            i += fit
            if fit:
                pos += int(ends[i - 1]) - done
            if i < sizes.size:
                if fit == 0 and pos % seg == 0:
                    raise ConfigError(f"a {int(sizes[i])}-byte record does not fit a {seg}-byte CommitLog segment")
                blanks.append((pos, seg_end - pos))
                pos = seg_end
        self.pos = pos
        return out, blanks

    def _queues(self, part: str, phy: np.ndarray, at: np.ndarray, moved: np.ndarray) -> np.ndarray:
        """Take *part*'s ConsumeQueue units, moved to the target's offsets;
        return each record's target queue offset (-1: the record has no unit)."""
        qo = np.full(phy.size, -1, dtype=np.int64)
        root = os.path.join(part, "consumequeue")
        for topic in sorted(os.listdir(root)) if os.path.isdir(root) else ():
            for qid in sorted(os.listdir(os.path.join(root, topic)), key=lambda q: int(q)):
                units = _read_units(os.path.join(root, topic, qid))
                if units.size == 0:
                    continue
                r = np.searchsorted(phy, units["phy"])
                if (r >= phy.size).any() or (phy[np.minimum(r, phy.size - 1)] != units["phy"]).any():
                    raise CorruptedFileError(f"a unit of {topic}/{qid} points at no record",
                                             os.path.join(root, topic, qid), 0)
                key = (topic, int(qid))
                base = self.bases.get(key, 0)
                qo[r] = base + np.arange(units.size, dtype=np.int64)
                moved_units = units.copy()
                moved_units["phy"] = at[r]
                if topic == SCHEDULE_TOPIC:  # a delayed unit's tags code is its delivery time
                    moved_units["tags"] = units["tags"] + moved[r]
                self.queues.setdefault(key, []).append(moved_units)
                self.bases[key] = base + units.size
        return qo

    # --- the target's CommitLog

    def _segment(self, no: int) -> int:
        """The descriptor of target segment *no*, made (full size, reserved) on first use."""
        fd = self.segments.get(no)
        if fd is None:
            d = os.path.join(self.target, "commitlog")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"{no * self.seg:020d}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                allocate_file(fd, self.seg, path)  # (reserved, as the store's own: no SIGBUS on a full disk later)
            except BaseException:
                os.close(fd)
                raise
            self.segments[no] = fd
        return fd

    def _write(self, sources: list, phy: np.ndarray, size: np.ndarray, at: np.ndarray, qo: np.ndarray,
               new_ts: np.ndarray, ts: np.ndarray, sys_flag: np.ndarray) -> None:
        """Copy the records to their target offsets, rewriting each one's
        PHYSICALOFFSET, its QUEUEOFFSET when it has a unit (the part's count
        plus the queue's base), and its STORETIMESTAMP where that moved."""
        # runs of records consecutive both in one part segment and in one target
        # segment: each is copied out once, patched in memory, written once
        bases = np.array([b for b, _ in sources], dtype=np.int64)
        src = np.searchsorted(bases, phy, side="right") - 1
        dst = at // self.seg
        cut = np.flatnonzero((src[1:] != src[:-1]) | (dst[1:] != dst[:-1])) + 1
        for i, j in zip(np.concatenate(([0], cut)).tolist(), np.concatenate((cut, [phy.size])).tolist()):
            base, mm = sources[int(src[i])]
            lo = int(phy[i]) - base
            hi = int(phy[j - 1] + size[j - 1]) - base
            run = np.frombuffer(mm, dtype=np.uint8, count=hi - lo, offset=lo).copy()
            local = phy[i:j] - phy[i]
            _put_longs(run, local + POS_PHYSICALOFFSET, at[i:j])
            has = qo[i:j] >= 0
            _put_longs(run, local[has] + POS_QUEUEOFFSET, qo[i:j][has])
            moved = new_ts[i:j] != ts[i:j]
            if moved.any():
                # the store timestamp follows the born host, 8 bytes (IPv4) or 20 (IPv6)
                v6 = (sys_flag[i:j][moved] & BORNHOST_V6_FLAG) != 0
                _put_longs(run, local[moved] + POS_BORNHOST + np.where(v6, 20, 8), new_ts[i:j][moved])
            no = int(dst[i])
            _pwrite_all(self._segment(no), run, int(at[i]) - no * self.seg)

    def _blank(self, start: int, length: int) -> None:
        no = start // self.seg
        blank = length.to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
        _pwrite_all(self._segment(no), blank, start - no * self.seg)

    def _retire(self, below: int) -> None:
        """Hand segments numbered below *below* (complete: the layout is past them) to the sync thread."""
        for no in sorted(n for n in self.segments if n < below):
            self.syncing.append(self.syncer.submit(_sync_and_close, self.segments.pop(no)))

    def _close_segments(self) -> None:
        """Sync and close every segment; raise the first error a sync met."""
        self._retire(1 << 62)
        self.syncer.shutdown(wait=True)
        errors = [f.exception() for f in self.syncing]
        self.syncing.clear()
        for e in errors:
            if e is not None:
                raise e

    # --- ConsumeQueues and the index

    def _write_queues(self) -> None:
        per_file = self.cfg.mapped_file_size_consume_queue // CQ_STORE_UNIT_SIZE
        for (topic, qid), chunks in self.queues.items():
            units = np.concatenate(chunks).astype(_UNIT, copy=False)  # (concatenate may make fields native-endian)
            d = os.path.join(self.target, "consumequeue", topic, str(qid))
            os.makedirs(d, exist_ok=True)
            for i in range(0, units.size, per_file):
                path = os.path.join(d, f"{i * CQ_STORE_UNIT_SIZE:020d}")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    allocate_file(fd, self.cfg.mapped_file_size_consume_queue, path)
                    os.pwrite(fd, units[i:i + per_file].tobytes(), 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def _index(self, part: str, phy: np.ndarray, at: np.ndarray, new_ts: np.ndarray) -> None:
        d = os.path.join(part, "index")
        for name in sorted(n for n in os.listdir(d) if is_offset_name(n)) if os.path.isdir(d) else ():
            entries = _read_entries(os.path.join(d, name), self.part_slots, self.part_num)
            if entries.size == 0:
                continue
            r = np.searchsorted(phy, entries["phy"])
            if (r >= phy.size).any() or (phy[np.minimum(r, phy.size - 1)] != entries["phy"]).any():
                raise CorruptedFileError("an index entry points at no record", os.path.join(d, name), 0)
            assert self.index is not None
            self.index.add(entries["hash"].astype(np.int64), at[r], new_ts[r])


def _sync_and_close(fd: int) -> None:
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _put_longs(buf: np.ndarray, positions: np.ndarray, values: np.ndarray) -> None:
    """Write *values* as big-endian int64 at byte *positions* of *buf*."""
    if positions.size:
        buf[positions[:, None] + _BYTE8] = values.astype(">i8").view(np.uint8).reshape(-1, 8)


def _read_units(d: str) -> np.ndarray:
    """A part ConsumeQueue's units, up to its first empty one."""
    names = sorted(n for n in os.listdir(d) if is_offset_name(n))
    chunks = []
    for name in names:
        with open(os.path.join(d, name), "rb") as f:
            units = np.frombuffer(f.read(), dtype=_UNIT)
        empty = np.flatnonzero(units["size"] == 0)
        if empty.size:
            chunks.append(units[:empty[0]])
            break
        chunks.append(units)
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=_UNIT)


def _read_entries(path: str, slots: int, index_num: int) -> np.ndarray:
    """The entries of a part's index file, in the order they were put."""
    from ..storage.index import index_file_size

    with open(path, "rb") as f:
        data = f.read()
    if len(data) != index_file_size(slots, index_num):
        raise CorruptedFileError(f"a part's index file is {len(data)} bytes, not the part geometry's", path, 0)
    count = int.from_bytes(data[36:40], "big", signed=True)
    if not 1 <= count <= index_num:
        raise CorruptedFileError(f"a part's index file counts {count} entries", path, 36)
    # entry 0 is never used
    first = INDEX_HEADER_SIZE + slots * INDEX_HASH_SLOT_SIZE + INDEX_ENTRY_SIZE
    return np.frombuffer(data, dtype=_ENTRY, count=count - 1, offset=first)


class _IndexWriter:
    """IndexFiles written whole, ``max_index_num - 1`` entries each, each
    file's header starting from the previous file's last entry; named by
    the time they are written, ascending."""

    def __init__(self, directory: str, cfg):
        self.directory = directory
        self.slots = cfg.max_hash_slot_num
        self.num = cfg.max_index_num
        self.pending: list = []  # [(hashes, phys, times)]
        self.pending_n = 0
        self.files = 0
        self.last_name = ""
        self.prev = (0, 0)

    def add(self, hashes: np.ndarray, phys: np.ndarray, times: np.ndarray) -> None:
        self.pending.append((hashes, phys, times))
        self.pending_n += hashes.size
        per_file = self.num - 1
        if self.pending_n >= per_file:
            h, p, t = (np.concatenate(c) for c in zip(*self.pending))
            cut = (h.size // per_file) * per_file
            for i in range(0, cut, per_file):
                self._file(h[i:i + per_file], p[i:i + per_file], t[i:i + per_file])
            self.pending = [(h[cut:], p[cut:], t[cut:])]
            self.pending_n = h.size - cut

    def _file(self, h, p, t) -> None:
        data = build_index_file(h, p, t, self.slots, self.num, *self.prev)
        if h.size:
            self.prev = (int(p[-1]), int(t[-1]))
        name = self.last_name = new_file_names(1, self.last_name)[0]
        os.makedirs(self.directory, exist_ok=True)
        with open(os.path.join(self.directory, name), "wb") as f:
            f.write(data)
            os.fsync(f.fileno())
        self.files += 1

    def finish(self, records: int) -> int:
        """Write the last file (a store with records has one, if only a header); return how many were written."""
        if self.pending_n or (not self.files and records):
            h, p, t = (np.concatenate(c) for c in zip(*self.pending)) if self.pending else (np.zeros(0, np.int64),) * 3
            self._file(h, p, t)
        return self.files
