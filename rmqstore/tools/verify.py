"""``verify``: :func:`verify_store` reads every file of a store (read-only
mappings; it never opens anything writable and never calls
``MessageStore.open``) and returns the list of :class:`Problem` found, each
with the file (relative to the store root) and the byte offset in that file.
The CommitLog walk keeps what it reached in a :class:`_RecordTable`, a window
of at most ``window`` records: each time it fills, the ConsumeQueue units and
index entries that point into it are checked against it (one cursor per queue
and per index file, as both are written in CommitLog order) and it is
emptied, so memory is bounded by the number of queues and files, not records
(``_Verifier``)."""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from typing import NamedTuple

from .. import _kernels as k
from ..config import StoreConfig
from ..dispatch import gets_consume_queue_unit, index_keys, tags_code
from ..exceptions import CorruptedFileError, RmqStoreError
from ..format.layout import (
    CHECKPOINT_FILE_SIZE,
    CQ_STORE_UNIT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    POS_PHYSICALOFFSET,
    PRE_BLANK_SIZE,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    REC_PROP_CRC,
    REC_STATUS_TEXT,
    RECORD_SIZE_SLACK,
    TRANSACTION_MASK,
)
from ..service.offsets import CONSUMER_OFFSET_FILE, _read_offset_file
from ..storage.checkpoint import field_problems as checkpoint_field_problems
from ..storage.index import header_problem, index_file_size, infer_index_geometry
from ..storage.walker import PHY_MISMATCH, Segment, find_valid_record, list_segments, validate_record
from ..store.lock import StoreLock
from ._common import _I32, _I64, _INDEX_HEADER, _common_size, _first_nonzero, _nonzero_end, _queue_dirs, _rel
from .inference import _header_geometry

_INDEX_ENTRY = struct.Struct(">iqii")

_STATUS_TEXT = dict(REC_STATUS_TEXT)
_STATUS_TEXT[PHY_MISMATCH] = "PHYSICALOFFSET field disagrees with the record's position"

#: smallest tags code that is a ConsumeQueue extension address (docs/format.md#tags-code)
_CQ_EXT_ADDRESS_MAX = -(1 << 31) - 1


class Problem(NamedTuple):
    """One finding of :func:`verify_store`.

    Attributes:
        file (str): path relative to the store root, ``/``-separated.
        offset (int): byte offset in that file.
        problem (str): what is wrong.
        severity (str): ``"error"`` (data is wrong or lost) or ``"warning"``.
    """

    file: str
    offset: int
    problem: str
    severity: str

    def __str__(self) -> str:
        return f"{self.severity} {self.file}@{self.offset}: {self.problem}"


def _key_hashes(topic: str, props: dict) -> frozenset:
    """Key hashes of a record: ``topic#UNIQ_KEY``, ``topic#k`` per KEYS piece (docs/format.md#building-the-index)."""
    keys = index_keys(props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS))
    return frozenset(k.index_key_hash(f"{topic}#{x}") for x in keys)


class _Rec(NamedTuple):
    file: str  # commitlog/<segment>
    pos: int
    phys: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    tags_code: int
    key_hashes: frozenset


class _RecordTable:
    """The records the CommitLog walk reached, added in physical-offset
    order, kept as columns (``array``): ~60 bytes a record, where a
    :class:`_Rec` in a dict took ~700 (a 100 GB CommitLog holds ~250M
    records). :meth:`get` and iteration make the ``_Rec`` again."""

    def __init__(self):
        # _Rec's fields by record; topic and file by number (names)
        self.phys, self.pos, self.queue_offset, self.tags_code = array("q"), array("q"), array("q"), array("q")
        self.size, self.queue_id, self.sys_flag = array("i"), array("i"), array("i")
        self.topic, self.file = array("i"), array("i")
        self.key_hashes = array("i")  # every record's, in order; record i's end at keys_end[i]
        self.keys_end = array("q")
        self.names: list = []  # topics and file names, by number
        self._numbers: dict = {}

    def _number(self, name: str) -> int:
        n = self._numbers.get(name)
        if n is None:
            n = self._numbers[name] = len(self.names)
            self.names.append(name)
        return n

    def add(self, rec: _Rec) -> None:
        if self.phys and rec.phys <= self.phys[-1]:
            raise ValueError(f"record at {rec.phys} added after the one at {self.phys[-1]}")
        self.phys.append(rec.phys)
        self.pos.append(rec.pos)
        self.size.append(rec.size)
        self.topic.append(self._number(rec.topic))
        self.queue_id.append(rec.queue_id)
        self.queue_offset.append(rec.queue_offset)
        self.sys_flag.append(rec.sys_flag)
        self.tags_code.append(rec.tags_code)
        self.file.append(self._number(rec.file))
        self.key_hashes.extend(rec.key_hashes)
        self.keys_end.append(len(self.key_hashes))

    def _rec(self, i: int) -> _Rec:
        return _Rec(
            self.names[self.file[i]], self.pos[i], self.phys[i], self.size[i], self.names[self.topic[i]],
            self.queue_id[i], self.queue_offset[i], self.sys_flag[i], self.tags_code[i],
            frozenset(self.key_hashes[self.keys_end[i - 1] if i else 0 : self.keys_end[i]]),
        )

    def get(self, phys: int):
        """The record at physical offset *phys*, or None."""
        i = bisect.bisect_left(self.phys, phys)
        return self._rec(i) if i < len(self.phys) and self.phys[i] == phys else None

    def __len__(self) -> int:
        return len(self.phys)

    def __iter__(self):
        return (self._rec(i) for i in range(len(self.phys)))


#: ConsumeQueue units read at once by a queue's cursor (a cursor waits with one chunk read)
_UNIT_CHUNK = 4096


def _chunked_units(f):
    """The units of a mapped ConsumeQueue file in order, read a chunk at a time."""
    step = _UNIT_CHUNK * CQ_STORE_UNIT_SIZE
    for a in range(0, f.size, step):
        yield from k.cq_units(f.buf, a, min(f.size, a + step))


def _index_count(path: str) -> int:
    """The indexCount of an index file's header (0 when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_INDEX_HEADER.size)
    except OSError:
        return 0
    return _INDEX_HEADER.unpack(head)[5] if len(head) == _INDEX_HEADER.size else 0


#: records the verifier keeps at once (~60 bytes each: ~60 MB); the
#: environment variable RMQSTORE_VERIFY_WINDOW sets another number
WINDOW_RECORDS = 1 << 20


def _window() -> int:
    try:
        return max(1, int(os.environ.get("RMQSTORE_VERIFY_WINDOW", WINDOW_RECORDS)))
    except ValueError:
        return WINDOW_RECORDS


class _Verifier:
    def __init__(self, root: str, config: StoreConfig | None, live: bool = False, progress=None,
                 window: int | None = None):
        self.root = root
        self.window = window or _window()
        self.progress = progress  # progress(bytes walked, bytes in all) after each CommitLog segment
        # a writer holds the store: what it writes while the check runs (units
        # and index entries past the CommitLog end seen, a tail not yet
        # dispatched, the checkpoint) is not damage
        self.live = live
        self.cfg = config if config is not None else StoreConfig()
        self.explicit_max = None if config is None else config.max_message_size + RECORD_SIZE_SLACK
        self._found: list = []  # (order key, Problem): the phases' problems, sorted as if run one by one
        self._key: tuple = (0,)  # the order key of problems reported now
        self._cq_cursors: list = []  # per queue: [its next unit to check or None, the unit iterator]
        self._ix_cursors: list = []  # per index file: the same for its entries
        self.segments: list = []  # Segment per CommitLog segment, by start offset
        self.fs = 0
        self.cl_min = 0
        self.cl_end = 0
        self.records = _RecordTable()  # the records reached by the walk
        self.seg_by_start: dict = {}
        self._lookup_cache: dict = {}
        self.queues: dict = {}  # (topic, qid) -> (file size, {file start: Segment})
        self.abort = os.path.exists(os.path.join(root, "abort"))
        self._open: list = []

    # -- reporting

    def error(self, file, offset, text) -> None:
        self._found.append((self._key, Problem(file, int(offset), text, "error")))

    def warning(self, file, offset, text) -> None:
        self._found.append((self._key, Problem(file, int(offset), text, "warning")))

    @property
    def problems(self) -> list:
        """Every problem found, in the order of the phases (CommitLog walk,
        ConsumeQueues queue by queue, records missing from their queue,
        index files, checkpoint and abort, consumer offsets), whatever
        window found it."""
        return [p for _key, p in sorted(self._found, key=lambda kp: kp[0])]

    def _map(self, path, start=0):
        ro = Segment(path, _rel(self.root, path), start, follow_links=True)
        self._open.append(ro)
        return ro

    def close(self) -> None:
        for ro in self._open:
            ro.close()
        self._open = []

    def max_size(self) -> int:
        return self.explicit_max if self.explicit_max is not None else max(self.fs, 1)

    # -- CommitLog

    def _segments(self, directory: str, kind: str):
        """The numbered files of a segment directory, their sizes and the size
        most of them have; reports foreign names, an empty last file and empty
        files. None when there is nothing to check."""
        files, other = list_segments(directory)
        for name in other:
            self.warning(_rel(self.root, os.path.join(directory, name)), 0,
                         f"not a {kind} (name is not a number); ignored")
        if files and os.path.getsize(files[-1][2]) == 0:
            self.warning(_rel(self.root, files[-1][2]), 0, f"empty last {kind} (a writable open removes it)")
            files = files[:-1]
        if not files:
            return None
        sizes = [os.path.getsize(p) for _, _, p in files]
        fs = _common_size(sizes)
        if fs == 0:
            for (_, _, path), size in zip(files, sizes):
                if size == 0:
                    self.error(_rel(self.root, path), 0, f"empty {kind}")
            kept = [(n, f) for n, f in zip(sizes, files) if n]
            sizes = [n for n, _ in kept]
            files = [f for _, f in kept]
            if not files:
                return None
            fs = _common_size(sizes)
        return files, sizes, fs

    def commitlog(self) -> None:
        found = self._segments(os.path.join(self.root, "commitlog"), "CommitLog segment")
        if found is None:
            return
        files, sizes, fs = found
        self.fs = fs
        prev = None
        for (start, _name, path), size in zip(files, sizes):
            rel = _rel(self.root, path)
            if size != fs:
                self.error(rel, min(size, fs), f"segment has {size} bytes, the other segments {fs}")
            if fs and start % fs:
                self.error(rel, 0, f"segment name {start} is not a multiple of the segment size {fs}")
            elif prev is not None and start != prev + fs:
                self.error(rel, 0, f"segment starts at {start}, expected {prev + fs} after the previous segment")
            prev = start
            try:
                self.segments.append(self._map(path, start))
            except OSError as e:
                self.error(rel, 0, f"cannot read the segment: {e}")
        # segments made ahead (docs/format.md#files-made-ahead) hold nothing
        # yet: the last one with data is the last one written
        while len(self.segments) > 1 and _nonzero_end(self.segments[-1].buf, 0, self.segments[-1].size) == 0:
            self.segments.pop().close()
        if not self.segments:
            return
        self.cl_min = self.segments[0].start
        self.seg_by_start = {seg.start: seg for seg in self.segments}
        total, done = sum(seg.size for seg in self.segments), 0
        for i, seg in enumerate(self.segments):
            last = i == len(self.segments) - 1
            end, clean = self._walk(seg, last)
            done += seg.size
            if self.progress is not None:
                self.progress(done, total)
            if last:
                # after damage, records further on are still looked up one by one
                self.cl_end = seg.start + (end if clean else _nonzero_end(seg.buf, end, seg.size))

    def _walk(self, seg: Segment, is_last: bool):
        """Walk the records of one segment. Returns ``(end, clean)``: where its
        data ends (the segment size after a blank record) and whether it ended
        normally (blank record, or zeros in the last segment)."""
        buf, n, fs, rel = seg.buf, seg.size, self.fs, seg.rel
        max_size = self.max_size()
        pos = 0
        while True:
            if pos >= n:
                if not is_last and n == fs:
                    self.error(rel, pos, "segment ends without a blank (END_OF_FILE) record")
                return pos, True
            st, fields = validate_record(buf, pos, n, seg.start + pos, max_size)
            if st > 0:
                self._add_record(seg, pos, st, fields)
                pos += st
                continue
            if st == 0:
                blank = _I32.unpack_from(buf, pos)[0]
                if blank != fs - pos:
                    self.warning(rel, pos,
                                 f"blank record's TOTALSIZE is {blank}, but {fs - pos} bytes are left in the segment")
                return fs, True
            phys = seg.start + pos
            if not any(buf[pos : pos + 8]):
                if not is_last:
                    self.error(rel, pos, f"zeros at physical offset {phys} where a record or the blank record "
                                         "should be: a hole in a segment that is not the last")
                    return pos, False
                q = -1 if self.live else _first_nonzero(buf, pos, n)  # (live: the writer is writing past here now)
                if q >= 0:
                    found = find_valid_record(buf, pos, n, seg.start, max_size, prop_crc_tail=True, blank_end=fs,
                                              ranges=seg.data_ranges(pos))
                    if found is not None and found[1] > 0:
                        self.error(rel, pos, f"zeros at physical offset {phys}, but valid records follow at "
                                             f"position {found[0]}: a hole (recovery would discard everything "
                                             "after it)")
                        return pos, False
                    else:
                        self.warning(rel, q, f"non-zero bytes after the end of written data (physical offset "
                                             f"{seg.start + q}): stale or garbage data")
                return pos, True
            if is_last and self.live:
                return pos, True  # (the record the live writer is writing now)
            why = _STATUS_TEXT.get(st, f"invalid record (status {st})")
            if st == PHY_MISMATCH:
                stored = _I64.unpack_from(buf, pos + POS_PHYSICALOFFSET)[0]
                why = f"PHYSICALOFFSET field holds {stored}, but the record is at {phys}"
            elif st == REC_PROP_CRC:
                why = "__CRC32# property differs from the record's CRC"
            self.error(rel, pos, f"invalid record at physical offset {phys}: {why}")
            return pos, False

    def _make_rec(self, seg: Segment, pos: int, size: int, fields) -> _Rec:
        props = k.parse_properties(fields[16])
        topic = fields[15]
        return _Rec(
            seg.rel, pos, seg.start + pos, size, topic, fields[3], fields[5], fields[7],
            tags_code(topic, props, fields[10], self.cfg), _key_hashes(topic, props),
        )

    def _add_record(self, seg, pos, size, fields) -> None:
        self.records.add(self._make_rec(seg, pos, size, fields))
        if len(self.records) >= self.window:
            hi = seg.start + pos + size
            # (what the flush takes lies below hi: within the CommitLog, whose end the walk has not reached yet)
            self.cl_end = max(self.cl_end, hi)
            key = self._key
            self.flush(hi)
            self._key = key

    def flush(self, hi: int | None = None) -> None:
        """Check what points into the records walked so far against them
        and forget them: the units and index entries (by their cursors)
        that lie wholly below physical offset *hi*, and the walked records'
        own units. *hi* None: everything left, once the walk is done."""
        for cursors, check in ((self._cq_cursors, self._check_unit), (self._ix_cursors, self._check_entry)):
            for cur in cursors:
                item = cur[0]
                while item is not None and (hi is None or item[-2] + item[-1] <= hi):
                    self._key = item[0]
                    check(*item[1:])
                    item = cur[0] = next(cur[1], None)
        self.missing_units()
        self.records = _RecordTable()
        self._lookup_cache.clear()
        self._key = (0,)

    def lookup(self, phys: int):
        """The valid record starting at *phys* (reached by the walk, or checked
        on its own when the walk of its segment stopped before it), or None."""
        rec = self.records.get(phys)
        if rec is not None or not self.segments or phys < self.cl_min:
            return rec
        if phys in self._lookup_cache:
            return self._lookup_cache[phys]
        rec = None
        seg = self.seg_by_start.get(phys - phys % self.fs) if self.fs else None
        if seg is not None:
            pos = phys - seg.start
            if pos < seg.size:
                st, fields = validate_record(seg.buf, pos, seg.size, phys, self.max_size())
                if st > 0:
                    rec = self._make_rec(seg, pos, st, fields)
        self._lookup_cache[phys] = rec
        return rec

    # -- ConsumeQueues

    def consume_queues(self) -> None:
        """Map every ConsumeQueue and check its files (before the walk); its
        units are checked as the walk reaches what they point at."""
        for seq, (topic, qid, qdir) in enumerate(_queue_dirs(self.root)):
            self._key = (1, seq, -1)
            units = self._queue(topic, qid, qdir, seq)
            if units is not None:
                self._cq_cursors.append([next(units, None), units])
        self._key = (0,)

    def _queue(self, topic: str, qid: int, qdir: str, seq: int):
        U = CQ_STORE_UNIT_SIZE
        found = self._segments(qdir, "ConsumeQueue file")
        if found is None:
            return
        files, sizes, fs = found
        mapped: dict = {}
        prev = None
        for (start, _name, path), size in zip(files, sizes):
            rel = _rel(self.root, path)
            if size != fs:
                self.error(rel, min(size, fs), f"ConsumeQueue file has {size} bytes, the other files {fs}")
            elif size % U:
                self.error(rel, size - size % U, f"ConsumeQueue file size {size} is not a multiple of {U}")
            if start % fs:
                self.error(rel, 0, f"file name {start} is not a multiple of the file size {fs}")
            elif prev is not None and start != prev + fs:
                self.error(rel, 0, f"file starts at {start}, expected {prev + fs} after the previous file")
            prev = start
            try:
                mapped[start] = self._map(path, start)
            except OSError as e:
                self.error(rel, 0, f"cannot read the file: {e}")
        self.queues[(topic, qid)] = (fs, mapped)
        return self._queue_units(topic, qid, mapped, seq)

    def _queue_units(self, topic: str, qid: int, mapped: dict, seq: int):
        """The units of one queue to check against the records, in queue
        order, as ``(order key, f, upos, q, topic, qid, phy, tags, size)``
        (the sort key of their problems first, the target's offset and size
        last); the placeholders and stale units in between are reported
        here."""
        U = CQ_STORE_UNIT_SIZE
        real_seen = False
        zero_seen = False
        stale_reported = False
        for start in sorted(mapped):
            f = mapped[start]
            for j, unit in enumerate(_chunked_units(f)):
                upos = j * U
                phy, size, tags = unit
                q = (start + upos) // U
                self._key = (1, seq, q)
                if phy == 0 and size == 0 and tags == 0:
                    zero_seen = True
                    continue
                if zero_seen:
                    if self.live:
                        break  # (the live writer filled the queue on past the zeros read)
                    if not stale_reported:
                        self.warning(f.rel, upos, f"non-zero unit (queue offset {q}) after an all-zero unit: stale "
                                                  "units after the end of the queue (recovery drops them)")
                        stale_reported = True
                    continue
                if phy == 0 and size == PRE_BLANK_SIZE and tags == 0:
                    if real_seen:
                        self.error(f.rel, upos,
                                   f"pre-blank placeholder at queue offset {q} after the queue's first real unit")
                    continue
                real_seen = True
                yield (1, seq, q), f, upos, q, topic, qid, tags, phy, size

    def _check_unit(self, f, upos, q, topic, qid, tags, phy, size) -> None:
        where = f"unit for queue offset {q} ({size} bytes at physical offset {phy})"
        if phy < 0 or size <= 0:
            self.error(f.rel, upos, f"invalid {where}: recovery cuts the queue here")
            return
        if phy < self.cl_min:
            return  # expired: the CommitLog no longer holds it
        if phy + size > self.cl_end:
            if not self.live:
                self.error(f.rel, upos, f"{where} points beyond the CommitLog end ({self.cl_end})")
            return
        rec = self.lookup(phy)
        if rec is None:
            self.error(f.rel, upos, f"{where} points where no valid record starts")
            return
        tran = rec.sys_flag & TRANSACTION_MASK
        if (rec.size != size or rec.topic != topic or rec.queue_id != qid or rec.queue_offset != q
                or not gets_consume_queue_unit(rec.sys_flag)):
            self.error(f.rel, upos, f"{where} points at a record of {rec.size} bytes for {rec.topic}/{rec.queue_id} "
                                    f"queue offset {rec.queue_offset} (transaction type {tran})")
            return
        if tags > _CQ_EXT_ADDRESS_MAX and tags != rec.tags_code:
            self.error(f.rel, upos, f"{where} has tags code {tags}, dispatch computes {rec.tags_code}")

    def missing_units(self) -> None:
        """Every NOT_TYPE/COMMIT record of the window must be the target of the unit at its queue offset."""
        U = CQ_STORE_UNIT_SIZE
        hint = " (the store was not shut down cleanly: recovery dispatches it again)" if self.abort else ""
        for rec in self.records:
            if not gets_consume_queue_unit(rec.sys_flag):
                continue
            self._key = (2, rec.phys)
            what = (f"message missing from ConsumeQueue: {rec.topic}/{rec.queue_id} queue offset {rec.queue_offset} "
                    f"(record at physical offset {rec.phys}, {rec.file}@{rec.pos})")
            entry = self.queues.get((rec.topic, rec.queue_id))
            if self.live and entry is None:
                continue  # (a live writer's new queue, made after the queues were listed)
            if entry is None or rec.queue_offset < 0:
                self.error(rec.file, rec.pos, f"{what}: no such queue{hint}" if entry is None else what)
                continue
            fs, mapped = entry
            logical = rec.queue_offset * U
            start = logical - logical % fs
            upos = logical - start
            f = mapped.get(start)
            if self.live and (f is None or upos + U > f.size or k.cq_get(f.buf, upos)[:2] == (0, 0)):
                continue  # (not dispatched yet by the live writer)
            if f is None:
                path = os.path.join(self.root, "consumequeue", rec.topic, str(rec.queue_id), f"{start:020d}")
                self.error(_rel(self.root, path), upos, f"{what}: the queue has no such file{hint}")
                continue
            if upos + U > f.size:
                self.error(f.rel, upos, f"{what}: the file ends before the unit{hint}")
                continue
            phy, size, _tags = k.cq_get(f.buf, upos)
            if phy != rec.phys or size != rec.size:
                self.error(f.rel, upos, f"{what}: the unit holds ({phy}, {size}){hint}")

    # -- index

    def index(self) -> None:
        d = os.path.join(self.root, "index")
        files, _other = list_segments(d)
        if not files:
            return
        sizes = [os.path.getsize(p) for _, _, p in files]
        common = _common_size(sizes)
        good = []
        for (_, _, path), size in zip(files, sizes):
            if size != common:
                self.error(_rel(self.root, path), min(size, common),
                           f"index file has {size} bytes, the others {common}")
            else:
                good.append(path)
        try:
            s, n = infer_index_geometry(good)
        except (RmqStoreError, ValueError, OSError) as e:
            geo = _header_geometry(good, common)
            if geo is None:
                path = getattr(e, "path", None) or good[0]
                self.error(_rel(self.root, path), getattr(e, "offset", None) or 0,
                           f"cannot determine the index geometry: {e}")
                return
            s, n = geo
        if self.live:
            # the newest file being written (its header, slots and entries move
            # apart), and after it those made ahead, empty yet
            while good and _index_count(good[-1]) <= 1:
                good.pop()
            good = good[:-1]
        for seq, path in enumerate(good):
            self._key = (3, seq, -1)
            try:
                f = self._map(path)
            except OSError as e:
                self.error(_rel(self.root, path), 0, f"cannot read the index file: {e}")
                continue
            entries = self._index_file(f, s, n, seq)
            if entries is not None:
                self._ix_cursors.append([next(entries, None), entries])
        self._key = (0,)

    def _index_file(self, f: Segment, s: int, n: int, seq: int):
        """Check one index file's header, slots and chains; return an
        iterator of its entries to check against the records (see
        :meth:`_index_entries`), None when the file cannot be read as one."""
        buf, rel = f.buf, f.rel
        if f.size != index_file_size(s, n):
            self.error(rel, 0,
                       f"index file has {f.size} bytes, {index_file_size(s, n)} expected for {s} slots x {n} entries")
            return None
        _bt, _et, begin_phy, end_phy, slot_count, raw_count = _INDEX_HEADER.unpack_from(buf, 0)
        count = raw_count if raw_count > 0 else 1
        if raw_count < 0 or raw_count > n:
            self.error(rel, 36, f"indexCount {raw_count} outside [1, {n}]")
            count = min(max(count, 1), n)
        # (a store reads around such a file: a writable open rebuilds it when it is the newest)
        found = header_problem(buf, s, n)
        header_at = found[0] if found is not None else None
        if found is not None and header_at != 36:
            self.error(rel, header_at, f"index header contradicts the file: {found[1]}")
        base = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * s
        entry = _INDEX_ENTRY.unpack_from
        visited = bytearray(count)
        used = 0
        with memoryview(buf) as mv:
            for slot, (v,) in enumerate(struct.iter_unpack(">i", mv[INDEX_HEADER_SIZE:base])):
                if v == 0:
                    continue
                used += 1
                if v < 0 or v >= count:
                    self.error(rel, INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * slot,
                               f"hash slot {slot} holds entry {v}, outside [1, indexCount={count})")
                    continue
                # bounded chain walk (each entry once): every entry on it must hash to this slot
                e = v
                while 0 < e < count and not visited[e]:
                    visited[e] = 1
                    h, _phy, _diff, p = entry(buf, base + INDEX_ENTRY_SIZE * e)
                    if h >= 0 and h % s != slot:
                        self.error(rel, base + INDEX_ENTRY_SIZE * e,
                                   f"index entry {e} on the chain of hash slot {slot} has key hash {h}, "
                                   f"which belongs to slot {h % s}")
                        break
                    if p >= e:
                        break  # reported with the entry below
                    e = p
            if used != slot_count and header_at != 32:
                self.warning(rel, 32, f"hashSlotCount is {slot_count}, but {used} hash slots are in use")
            if any(buf[base : base + INDEX_ENTRY_SIZE]):
                self.warning(rel, base, "index entry 0 (never used) is not zero")
            last_phy = None
            entries = mv[base + INDEX_ENTRY_SIZE : base + INDEX_ENTRY_SIZE * count]
            try:
                for i, (h, phy, diff, prev) in enumerate(_INDEX_ENTRY.iter_unpack(entries), 1):
                    self._key = (3, seq, i)
                    self._index_entry(rel, base + INDEX_ENTRY_SIZE * i, i, h, phy, diff, prev, last_phy)
                    last_phy = phy
            finally:
                entries.release()
        self._key = (3, seq, count)
        if count > 1:
            first_phy = entry(buf, base + INDEX_ENTRY_SIZE)[1]
            if begin_phy != first_phy and header_at != 16:
                self.warning(rel, 16, f"beginPhyOffset is {begin_phy}, but the first entry points at {first_phy}")
            if end_phy != last_phy and header_at != 24:
                self.warning(rel, 24, f"endPhyOffset is {end_phy}, but the last entry points at {last_phy}")
            unreached = [i for i in range(1, count) if not visited[i]]
            if unreached:
                i = unreached[0]
                self.warning(rel, base + INDEX_ENTRY_SIZE * i,
                             f"{len(unreached)} index entries (the first: entry {i}) are not reachable from their "
                             "hash slot: key lookups miss them")
        q = _first_nonzero(buf, base + INDEX_ENTRY_SIZE * count, f.size)
        if q >= 0:
            self.warning(rel, q, f"non-zero bytes in the entry area after indexCount={count}: stale entries")
        return self._index_entries(f, base, count, seq)

    @staticmethod
    def _index_entries(f: Segment, base: int, count: int, seq: int):
        """The entries of an index file to check against the records, as
        ``(order key, rel, offset in the file, entry number, key hash, phy, 1)``
        (the 1: a size, so the cursor takes the entry once *phy* was walked)."""
        entry = _INDEX_ENTRY.unpack_from
        for i in range(1, count):
            off = base + INDEX_ENTRY_SIZE * i
            h, phy, _diff, _prev = entry(f.buf, off)
            yield (3, seq, i), f.rel, off, i, h, phy, 1

    def _index_entry(self, rel, off, i, h, phy, diff, prev, last_phy) -> None:
        """An entry's own fields."""
        if h < 0:
            self.error(rel, off, f"index entry {i} has a negative key hash {h}")
        if prev < 0 or prev >= i:
            self.error(rel, off, f"index entry {i} links to previous entry {prev}, outside [0, {i})")
        if diff < 0:
            self.error(rel, off, f"index entry {i} has a negative time difference {diff}")
        if last_phy is not None and phy < last_phy:
            self.warning(rel, off, f"index entry {i} points at physical offset {phy}, before the previous "
                                   f"entry's {last_phy} (entries are added in CommitLog order)")

    def _check_entry(self, rel, off, i, h, phy, _size) -> None:
        """An entry against the record it points at."""
        if phy < self.cl_min:
            return  # expired
        if phy >= self.cl_end:
            if not self.live:
                self.error(rel, off, f"index entry {i} points at physical offset {phy}, beyond the CommitLog end "
                                     f"({self.cl_end})")
            return
        rec = self.lookup(phy)
        if rec is None:
            self.error(rel, off, f"index entry {i} points at physical offset {phy}, where no valid record starts")
        elif h not in rec.key_hashes:
            self.error(rel, off, f"index entry {i} (key hash {h}) points at a record of {rec.topic} at physical "
                                 f"offset {phy} that has no key with this hash")

    # -- checkpoint, abort

    def misc(self) -> None:
        cp = os.path.join(self.root, "checkpoint")
        if not os.path.exists(cp):
            self.warning("checkpoint", 0, "checkpoint file is missing")
        else:
            size = os.path.getsize(cp)
            if size < 40:
                self.error("checkpoint", size,
                           f"checkpoint holds {size} bytes; its five fields need 40 ({CHECKPOINT_FILE_SIZE} expected)")
            elif size != CHECKPOINT_FILE_SIZE:
                self.warning("checkpoint", min(size, CHECKPOINT_FILE_SIZE),
                             f"checkpoint holds {size} bytes, {CHECKPOINT_FILE_SIZE} expected")
            if size >= 40:
                with open(cp, "rb") as fh:
                    fields = struct.unpack(">qqqqq", fh.read(40))
                # (a store reads such a field as 0: recovery then starts earlier;
                # a live writer's fields run ahead of what was checked)
                end = None if self.live else self.cl_end
                for offset, _name, text in checkpoint_field_problems(fields, end):
                    self.error("checkpoint", offset, text)
        if self.live:
            self.warning("lock", 0, f"a writer holds the store: checked what it had written up to CommitLog "
                                    f"physical offset {self.cl_end}; what it writes meanwhile, and its newest index "
                                    "file, are not checked")
        elif self.abort:
            self.warning("abort", 0, "store was not shut down cleanly "
                         "(abort file present; the next writable open runs abnormal recovery)")

    # -- consumer offsets

    def consumer_offsets(self) -> None:
        """``config/consumerOffset.json`` and its ``.bak``: a file that does not
        parse is an error where a store would refuse the offsets (no good
        file to fall back on), a warning where it reads the other one."""
        path = os.path.join(self.root, CONSUMER_OFFSET_FILE)
        bak = path + ".bak"
        state, why = {}, {}
        for p in (path, bak):
            try:
                parsed, st = _read_offset_file(p)
                state[p] = "good" if parsed is not None else ("empty" if st is not None else "missing")
            except (CorruptedFileError, OSError) as e:
                state[p], why[p] = "bad", str(e)
        if state[path] == "bad":
            if state[bak] == "good":
                self.warning(_rel(self.root, path), 0, f"{why[path]}; a store reads its .bak")
            else:
                self.error(_rel(self.root, path), 0, f"{why[path]}; no good .bak: a store refuses the offsets")
        if state[bak] == "bad":
            if state[path] == "good":
                self.warning(_rel(self.root, bak), 0, why[bak])
            else:
                self.error(_rel(self.root, bak), 0,
                           f"{why[bak]}; the file itself is {state[path]}: a store refuses the offsets")


def verify_store(root, config: StoreConfig | None = None, progress=None) -> list:
    """Check every file of the store in *root* without writing anything.

    Returns a list of :class:`Problem` (empty for a healthy store). *config*
    only supplies the delay-level table and ``max_message_size`` (without it,
    any record that fits in a segment is accepted); file sizes and the index
    geometry come from the files. *progress*, if given, is called as
    ``progress(bytes done, bytes in all)`` after each CommitLog segment is
    walked (the long part).

    Raises:
        FileNotFoundError, NotADirectoryError, PermissionError: *root* is not a
            readable directory.
    """
    root = os.path.abspath(os.fspath(root))
    if not os.path.exists(root):
        raise FileNotFoundError(f"no store directory at {root}")
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root} is not a directory")
    os.listdir(root)  # PermissionError when unreadable
    v = _Verifier(root, config, live=StoreLock.is_held(root), progress=progress)
    try:
        v.consume_queues()  # (mapped and their files checked; units checked as the walk reaches their records)
        v.index()
        v.commitlog()
        v.flush()
        v.misc()
        v.consumer_offsets()
    finally:
        v.close()
    return v.problems
