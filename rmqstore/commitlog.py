"""The CommitLog: every message record, back to back, in segments of one size (docs/format.md#commitlog-record).

This module owns appending (with END_OF_FILE blank records and file rolling,
docs/format.md#blank-record), reading records by physical offset, and the recovery scan that
finds where valid data ends (docs/recovery.md#recovery). Dispatch to ConsumeQueues and the
IndexFile is the store's business (``rmqstore.store``).
"""

from __future__ import annotations

import logging
import struct

from . import _kernels as k
from .exceptions import CorruptedFileError
from .format.layout import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    POS_PHYSICALOFFSET,
    REC_STATUS_TEXT,
    RECORD_SIZE_SLACK,
)
from .storage.mapped_file import MappedFileQueue
from .storage.walker import find_valid_record

__all__ = ["CommitLog"]

log = logging.getLogger("rmqstore.commitlog")

_BLANK = struct.Struct(">ii")
_PROBE = 16 * 1024 * 1024  # how far past a stop recovery looks for more data
_CHUNK = 1 << 16
_ZEROS = bytes(_CHUNK)


def _data_after(mf, pos: int, last: bool = False):
    """Within ``_PROBE`` bytes from *pos*: the position of the first non-zero
    byte (or, with *last*, just past the last one); None when all zero."""
    end = min(mf.file_size, pos + _PROBE)
    found = None
    p = pos
    while p < end:
        q = min(end, p + _CHUNK)
        chunk = mf.mm[p:q]
        if chunk != _ZEROS[: q - p]:
            if not last:
                return p + next(i for i, b in enumerate(chunk) if b)
            found = p + len(chunk.rstrip(b"\0"))
        p = q
    return found
_I64 = struct.Struct(">q")


class CommitLog(k.CommitLogBase):
    """The CommitLog segments of one store.

    Args:
        directory (str): ``<root>/commitlog``.
        file_size (int | None): segment size in bytes; None infers it from the
            files (read-only opens of foreign stores).
        max_message_size (int): body limit; records may be 64 KiB larger.
        read_only (bool): never write.
    """

    __slots__ = ("_last_ts", "_view_buffers", "damaged", "read_only")  # (queue, max_record_size: CommitLogBase's)
    queue: MappedFileQueue

    def __init__(self, directory, file_size, max_message_size: int, read_only: bool = False):
        self.queue = MappedFileQueue(directory, file_size, read_only)
        self._view_buffers: tuple | None = None  # (first, last, buffers) behind segment_view
        self.max_record_size = max_message_size + RECORD_SIZE_SLACK
        self.read_only = read_only
        self._last_ts: dict = {}  # segment start -> its last record's store time (retention)
        #: read-only: damage recovery read around, {physical offset: where valid records resume}
        self.damaged: dict = {}

    @property
    def file_size(self) -> int:
        return self.queue.file_size

    def load(self) -> None:
        self.queue.load()

    def min_offset(self) -> int:
        """Physical offset of the first byte still stored."""
        return self.queue.min_offset()

    def max_offset(self) -> int:
        """Physical offset one past the last written byte."""
        return self.queue.max_offset()

    # --- appending ---------------------------------------------------------------

    def append(
        self, size, queue_id, flag, queue_offset, sys_flag, born_timestamp, born_host, store_timestamp,
        store_host, reconsume_times, prepared_transaction_offset, body, topic, properties, append_crc,
    ) -> int:
        """Append one record of *size* bytes (already computed by the caller with
        ``record_size``); returns its physical offset. When it does not fit in the
        current segment with 8 bytes to spare, the segment is closed with a
        blank record and the record goes to the next one (docs/format.md#blank-record), a
        spare when :meth:`reserve` made it; a next segment made here is made
        before the blank record is written, so a failure writes nothing."""
        mf = self.segment_for(size)
        pos = mf.wrote_position
        phy = mf.file_from_offset + pos
        k.write_record(
            mf.mm, pos, queue_id, flag, queue_offset, phy, sys_flag, born_timestamp, born_host,
            store_timestamp, store_host, reconsume_times, prepared_transaction_offset, body, topic,
            properties, append_crc,
        )
        mf.wrote_position = pos + size
        return phy

    def segment_for(self, size: int):
        """The segment a record of *size* bytes goes into: the last one, or,
        when the record does not fit there with 8 bytes to spare, the next
        one (a roll: the last is closed with a blank record,
        docs/format.md#blank-record). The next segment is a spare when
        :meth:`reserve` made it, else made here before the blank record is
        written, so that a failure writes nothing. A store's first segment
        is taken the same way."""
        q = self.queue
        mf = q.last_for_append(0)
        if size + END_FILE_MIN_BLANK_LENGTH > mf.file_size - mf.wrote_position:
            nxt = q.next_file()
            self._close_segment(mf)
            q.files.append(nxt)
            mf = nxt
        return mf

    def reserve(self, total: int, biggest: int, count: int) -> None:
        """Make the segments *count* records of *total* bytes, none over
        *biggest*, may roll into (spares), before the first is written.
        An upper bound: a segment takes more than ``file_size - biggest - 8``
        bytes of records before a record no longer fits, and at least one."""
        if count <= 0:
            return
        q = self.queue
        fs = q.file_size
        last = q.last
        need, room = (1, fs) if last is None else (0, fs - last.wrote_position)
        room -= END_FILE_MIN_BLANK_LENGTH
        if total > room:
            left = total - max(0, room - biggest)
            per = fs - biggest - END_FILE_MIN_BLANK_LENGTH
            need += count if per <= 0 else min(count, left // per + 1)
        q.reserve_files(need)

    def undo_to(self, offset: int, extent: int) -> list:
        """Drop what was appended at or after physical *offset* (a put that
        failed after writing): segments that start after it are deleted, the
        one holding it is zeroed from there up to *extent* bytes past it (at
        least its write position) and its write position moved back. Returns
        the deleted segments (for ``forget``)."""
        q = self.queue
        gone = []
        while q.files and q.files[-1].file_from_offset > offset:
            mf = q.files.pop()
            gone.append(mf)
            mf.destroy()
        if gone and q.spares:  # they followed the segments just deleted
            q.drop_spares()
        if q.files:
            mf = q.files[-1]
            pos = offset - mf.file_from_offset
            if pos < mf.file_size:
                mf.rewind(pos, pos + extent)
                gone.append(mf)  # (no longer full: its cached facts are stale)
        return gone

    def fits_in_new_segment(self, size: int) -> bool:
        """Whether a record of *size* bytes can be stored (docs/recovery.md#pitfall-record-larger-than-a-file)."""
        return size + END_FILE_MIN_BLANK_LENGTH <= self.queue.file_size

    @staticmethod
    def _close_segment(mf) -> None:
        free = mf.file_size - mf.wrote_position
        if free >= END_FILE_MIN_BLANK_LENGTH:
            _BLANK.pack_into(mf.mm, mf.wrote_position, free, BLANK_MAGIC_CODE)
        mf.wrote_position = mf.file_size

    # --- reading ------------------------------------------------------------------

    def _locate(self, offset: int):
        """(segment, position, readable limit) for *offset*, or None."""
        mf = self.queue.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        limit = mf.wrote_position
        if pos >= limit or offset < self.min_offset():
            return None
        return mf, pos, limit

    def read(self, offset: int, with_body: bool = True, strict: bool = False):
        """Decode the record at physical *offset*.

        Returns the field tuple of ``decode_record`` or None when no valid record
        starts there. With *strict* (offsets taken from a ConsumeQueue) an
        invalid record raises :class:`CorruptedFileError` instead.
        """
        loc = self._locate(offset)
        if loc is None:
            if strict:
                raise CorruptedFileError(
                    f"physical offset {offset} is outside the CommitLog [{self.min_offset()}, {self.max_offset()})",
                    self.queue.directory, offset,
                )
            return None
        mf, pos, limit = loc
        status = k.check_record(mf.mm, pos, limit, True, False, self.max_record_size)
        if status <= 0 or _I64.unpack_from(mf.mm, pos + POS_PHYSICALOFFSET)[0] != offset:
            if strict:
                why = REC_STATUS_TEXT.get(status, "blank record" if status == 0 else "physical offset field mismatch")
                raise CorruptedFileError(f"no valid record: {why}", mf.path, pos)
            return None
        return k.decode_record(mf.mm, pos, with_body)

    def store_timestamp_at(self, offset: int, size: int) -> int:
        """STORETIMESTAMP of the record at *offset* (RocketMQ ``pickupStoreTimestamp``):
        -1 unless ``[offset, offset + size)`` lies within the stored data."""
        if offset < self.min_offset() or offset + size > self.max_offset():
            return -1
        loc = self._locate(offset)
        if loc is None:
            return -1
        return k.read_store_timestamp(loc[0].mm, loc[1])

    def record_reader(self, strict: bool = True):
        """A fast ``read(offset, strict=strict)`` for many reads in a row (a
        pull, a key lookup): segments and bounds are bound once, each read is
        one index computation and one kernel call (``read_record``). Valid
        until the next append or file change, so take one per call. The reader
        returns the field tuple of ``decode_record``; where no valid record
        starts it raises :class:`CorruptedFileError` (*strict*) or returns None."""
        files = list(self.queue.files)
        if not files:  # (a read-only store without segments has no file size either)
            return lambda offset: self.read(offset, strict=strict)
        fs = self.file_size
        first = files[0].file_from_offset // fs
        nfiles = len(files)
        max_size = self.max_record_size
        read = k.read_record

        def read_at(offset: int):
            i = offset // fs - first
            if 0 <= i < nfiles:
                mf = files[i]
                fields = read(mf.mm, offset - mf.file_from_offset, mf.wrote_position, offset, max_size, True)
                if type(fields) is tuple:
                    return fields
            return self.read(offset, strict=strict)  # None, or raises with the reason

        return read_at

    def segment_view(self) -> tuple:
        """The CommitLog for kernels that read many records by physical
        offset: ``(buffers, file_size, first segment's offset, min offset,
        max offset)``. ``cq_search_time`` probes store timestamps through it
        with no Python call per probe (``consumequeue.view_time`` is the same
        read in Python) and ``decode_columns_at`` decodes a pull's records.
        Valid until the next append or file change, so take one per call."""
        files = self.queue.files
        if not files:
            return ([], 1, 0, 0, 0)  # nothing stored: every probe answers -1
        first, last = files[0], files[-1]
        cached = self._view_buffers
        if cached is None or cached[0] is not first or cached[1] is not last or len(cached[2]) != len(files):
            cached = self._view_buffers = (first, last, [mf.mm for mf in files])
        hi = last.file_from_offset + last.wrote_position
        lo = first.file_from_offset  # min_offset(), inlined: this runs per lookup
        return (cached[2], self.file_size, lo, lo, hi)

    def iter_offsets(self, start_offset: int = 0):
        """Yield ``(physical_offset, size)`` of every valid record from
        *start_offset* (rounded up to the first segment) to the end of written
        data, crossing blank records and the damage a read-only open read
        around (``damaged``). Raises CorruptedFileError at a record that
        does not validate before the written end."""
        files = self.queue.files
        if not files:
            return
        offset = max(start_offset, files[0].file_from_offset)
        damaged = self.damaged
        while True:
            if damaged and offset in damaged:  # read around it (a read-only open found it)
                offset = damaged[offset]
                continue
            mf = self.queue.find(offset)
            if mf is None:
                return
            pos = offset - mf.file_from_offset
            limit = mf.wrote_position
            if pos >= limit:
                if mf is files[-1] or limit < mf.file_size:
                    return
                offset = mf.file_from_offset + mf.file_size
                continue
            status = k.check_record(mf.mm, pos, limit, False, False, self.max_record_size)
            if status == 0 or limit - pos < END_FILE_MIN_BLANK_LENGTH:
                offset = mf.file_from_offset + mf.file_size
                continue
            if status < 0:
                raise CorruptedFileError(f"bad record: {REC_STATUS_TEXT[status]}", mf.path, pos)
            yield offset, status
            offset += status

    # --- recovery -------------------------------------------------------------------

    def scan_valid(self, start_index: int, check_crc: bool, verify_prop_crc: int, on_run=None, start_pos: int = 0,
                   stop_index=None):
        """Recovery scan (docs/recovery.md#normal-recovery) from segment *start_index*: walk
        records while they validate (length formula, magic, CRC when asked —
        *verify_prop_crc* as for ``check_record`` — and the stored physical
        offset equal to the position, docs/recovery.md#pitfall-stored-offsets-trusted), crossing blank records. Each run
        of valid records is walked by one kernel call (``scan_records``) and
        handed to ``on_run(segment, start, end)`` (positions in the segment).

        Returns ``(process_offset, stop_reason)``: the physical offset just past
        the last valid record, and None or a text saying why the scan stopped
        before the end of written data. *start_pos*: where in the first
        segment to start (a record boundary); *stop_index*: a segment the
        scan ends at (exclusive) instead of the last one.
        """
        if stop_index is None:
            stop_index = len(self.queue.files)
        files = self.queue.files
        if not files:
            return 0, None
        i = start_index
        mf = files[i]
        pos = start_pos
        reason = None
        while True:
            end = k.scan_records(
                mf.mm, pos, mf.file_size, mf.file_from_offset, check_crc, verify_prop_crc, self.max_record_size
            )[0]
            if end > pos:
                if on_run is not None:
                    on_run(mf, pos, end)
                pos = end
            # judge the record the walk stopped at
            status = k.check_record(mf.mm, pos, mf.file_size, check_crc, verify_prop_crc, self.max_record_size)
            if status > 0:  # valid, but not where its PHYSICALOFFSET says
                reason = "physical offset field disagrees with the record's position"
                break
            if status == 0 or (status < 0 and mf.file_size - pos < END_FILE_MIN_BLANK_LENGTH):
                if i + 1 >= stop_index:
                    if i + 1 < len(files):  # (ended where asked: the next segment's start)
                        mf, pos = files[i + 1], 0
                    break
                i += 1
                mf = files[i]
                pos = 0
                continue
            if any(mf.mm[pos : pos + 8]):
                reason = REC_STATUS_TEXT.get(status, "bad record")
            elif i + 1 < len(files) and any(_data_after(f, 0) is not None for f in files[i + 1 :]):
                reason = "zeroed bytes inside a segment that later segments follow"
            else:  # (later segments holding nothing were made ahead and never used)
                data = _data_after(mf, pos)
                if data is not None:  # zeros are the end of data only when nothing follows them
                    reason = f"zeroed record header followed by data at position {data}"
            break
        if reason is not None:
            log.warning("CommitLog recovery stops at %s position %d: %s", mf.path, pos, reason)
        return mf.file_from_offset + pos, reason

    def find_valid_record(self, offset: int, check_crc: bool, verify_prop_crc: int):
        """The physical offset of the first record after *offset*, in its
        segment or a later one, that validates as recovery validates it
        (*check_crc*, *verify_prop_crc* as for :meth:`scan_valid`) and whose
        PHYSICALOFFSET field names its own position; None when there is
        none. So recovery can tell a torn end (nothing valid follows) from
        damage with records behind it. Candidates are found by their magic
        code, only where the file system says data may be
        (:meth:`MappedFile.data_ranges`): a preallocated tail costs nothing."""
        files = self.queue.files
        mf = self.queue.find(offset)
        if mf is None:
            return None
        i = files.index(mf)
        pos = offset - mf.file_from_offset + 1
        while True:
            found = find_valid_record(
                mf.mm, pos, mf.file_size, mf.file_from_offset, self.max_record_size,
                check_crc=check_crc, verify_prop_crc=verify_prop_crc, ranges=mf.data_ranges(pos),
            )
            if found is not None:
                return mf.file_from_offset + found[0]
            i += 1
            if i >= len(files):
                return None
            mf, pos = files[i], 0

    def data_end_estimate(self, offset: int) -> int:
        """Physical offset past the last non-zero byte at or after *offset*:
        whole later segments count as data, the segment holding *offset* is
        probed up to ``_PROBE`` bytes. For reports of what a truncation drops."""
        files = self.queue.files
        mf = self.queue.find(offset)
        if mf is None:
            return offset
        if mf is not files[-1]:
            return files[-1].file_from_offset + self.file_size
        end = _data_after(mf, offset - mf.file_from_offset, last=True)
        return offset if end is None else mf.file_from_offset + end

    def first_record_timestamp(self, index: int) -> int:
        """Store time of the first record of segment *index* if that record
        validates fully, else -1 (abnormal recovery start choice, docs/recovery.md#abnormal-recovery)."""
        mf = self.queue.files[index]
        status = k.check_record(mf.mm, 0, mf.file_size, True, False, self.max_record_size)
        if status <= 0 or _I64.unpack_from(mf.mm, POS_PHYSICALOFFSET)[0] != mf.file_from_offset:
            return -1
        return k.read_store_timestamp(mf.mm, 0)

    def truncate(self, offset: int) -> None:
        """Drop every byte from physical *offset* on (docs/recovery.md#pitfall-stale-bytes-after-truncation)."""
        self.queue.truncate_dirty(offset)

    def flushed_offset(self) -> int:
        """Physical offset up to which every segment is known to be on disk."""
        for mf in self.queue.files:
            if mf.flushed_position < mf.file_size:
                return mf.file_from_offset + mf.flushed_position
        return self.queue.max_offset()

    def flush(self, least_pages: int = 0) -> None:
        """Force appended records to disk (``least_pages`` as RocketMQ's flush services)."""
        self.queue.flush(least_pages)

    # --- retention and follow mode (docs/recovery.md#retention) ----------------------

    def last_record_timestamp(self, mf) -> int:
        """STORETIMESTAMP of the last record of segment *mf* (the one before the
        blank record or the written end), -1 when it holds none. Walks record
        headers by TOTALSIZE only (no CRC); the answer for a full segment is
        cached on first use, as such a segment never changes."""
        cache = self._last_ts
        key = mf.file_from_offset
        if key in cache:
            return cache[key]
        mm, limit = mf.mm, mf.wrote_position
        pos, last = 0, -1
        while limit - pos >= END_FILE_MIN_BLANK_LENGTH:
            status = k.check_record(mm, pos, limit, False, False, self.max_record_size)
            if status <= 0:
                break
            last = pos
            pos += status
        ts = k.read_store_timestamp(mm, last) if last >= 0 else -1
        if limit >= mf.file_size:
            cache[key] = ts
        return ts

    def file_timestamp(self, mf) -> int:
        """The time retention ages segment *mf* by, ms since epoch: its last
        record's store time, or the file's mtime when it holds no record
        (RocketMQ uses the mtime alone, which copying a store resets: docs/recovery.md#pitfall-retention-by-mtime)."""
        ts = self.last_record_timestamp(mf)
        return ts if ts > 0 else mf.last_modified_ms()

    def forget(self, mfs) -> None:
        """Drop cached facts about deleted segments."""
        for mf in mfs:
            self._last_ts.pop(mf.file_from_offset, None)

    def follow(self, check_crc: bool = False, verify_prop_crc: int = 0) -> bool:
        """Read-only follow mode: advance the written end over records another
        process appended since the last call, mapping segments it created.
        A record counts once it validates as in recovery (*check_crc* and
        *verify_prop_crc* as for ``scan_valid``, and its PHYSICALOFFSET equal
        to its position); the writer stores TOTALSIZE and the magic code last,
        so a record caught mid-write is not seen yet, and a corrupt one stops
        the end where recovery would. Returns whether the end moved."""
        q = self.queue
        if not q.files and not q.follow_files():
            return False
        moved = False
        while True:
            mf = q.files[-1]
            pos, limit = mf.wrote_position, mf.file_size
            mm = mf.mm
            base = mf.file_from_offset
            while True:
                status = k.check_record(mm, pos, limit, check_crc, verify_prop_crc, self.max_record_size)
                if status <= 0:
                    break
                if _I64.unpack_from(mm, pos + POS_PHYSICALOFFSET)[0] != base + pos:
                    status = -1  # not this position's record (docs/recovery.md#pitfall-stored-offsets-trusted)
                    break
                pos += status
            if pos != mf.wrote_position:
                mf.wrote_position = pos
                moved = True
            # a blank record (or no room for one) ends the segment; the data
            # goes on in the next one once the writer has created it
            full = status == 0 or limit - pos < END_FILE_MIN_BLANK_LENGTH
            if not full or not q.map_new_segments():
                break
            mf.wrote_position = limit
            moved = True
        return moved

    def close(self) -> None:
        self.queue.close()
