"""Reads: pulls by queue offset (with long polling), views and columns, lookups by
physical offset, msgId, key and time."""

from __future__ import annotations

import time
from typing import Any

from .. import _kernels as k
from ..exceptions import ArgumentError, CorruptedFileError, MessageTypeError, StoreClosedError
from ..format.layout import CQ_UNIT_FIELDS, PRE_BLANK_SIZE, REC_STATUS_TEXT
from ..message import (
    GetColumnsResult,
    GetMessageResult,
    GetMessageStatus,
    GetViewsResult,
    MessageExt,
    _split_offset_msg_id,
)
from .args import _I32_MAX, _I32_MIN, _I64_MAX, _I64_MIN, MAX_OFFSET, _int_arg, _pull_args, _query_args, _wait_arg
from .put import Put

#: a long poll waits at most this many seconds at a time (threading's
#: timeouts stop at TIMEOUT_MAX; the loop around it waits on)
_WAIT_SLICE = 3600.0
_BOUNDARIES = {"lower": False, "upper": True}
# pull outcomes a long poll waits on: nothing there yet
_WAITABLE = frozenset(
    (
        GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
        GetMessageStatus.NO_MESSAGE_IN_QUEUE,
        GetMessageStatus.OFFSET_OVERFLOW_ONE,
        GetMessageStatus.NO_MATCHED_MESSAGE,
    )
)
# units visited by one pull at most when a tag filter matches nothing
# (RocketMQ's maxFilterMessageSize of 16000 bytes)
_MAX_FILTER_UNITS = 800


_new_tuple = tuple.__new__
def _view_units(packed: bytes):
    """pull_views' packed units as GetViewsResult.units (a read-only array over them)."""
    if _VIEW_DTYPE is None:
        _load_numpy()
    return _frombuffer(packed, _VIEW_DTYPE)


def _load_numpy() -> None:
    """numpy on first use (importing rmqstore does not import it)."""
    global _VIEW_DTYPE, _frombuffer
    import numpy as np

    _frombuffer = np.frombuffer
    _VIEW_DTYPE = np.dtype([
        ("queue_offset", "=i8"), ("physical_offset", "=i8"), ("store_timestamp", "=i8"), ("tags_code", "=i8"),
        ("body_offset", "=i8"), ("body_length", "=i4"), ("store_size", "=i4"),
    ])


_VIEW_DTYPE: Any = None
_frombuffer: Any = None


def _tag_filter(tags):
    if tags is None:
        return None
    if isinstance(tags, str):
        if tags.strip() == "*":
            return None
        names = [t.strip() for t in tags.split("||")]
    else:
        names = [str(t) for t in tags]
    kept = {t for t in names if t}
    return {k.java_hash(t) for t in kept}, kept


def _unit_mismatch(cq, queue_offset, phy, size, fields):
    mf = cq.queue.find(queue_offset * 20)
    return CorruptedFileError(
        f"ConsumeQueue {cq.topic}/{cq.queue_id} unit {queue_offset} ({size} bytes at physical offset {phy}) "
        f"points at a record of {fields[0]} bytes for {fields[15]}/{fields[3]} queue offset {fields[5]}",
        mf.path if mf else cq.queue.directory,
        (queue_offset * 20 - mf.file_from_offset) if mf else None,
    )


class Pull(Put):
    """The layer of the read calls: RocketMQ's ``getMessage`` (pulls, with
    long polling), ``lookMessageByOffset``, ``queryMessage`` and
    ``getOffsetInQueueByTime``, plus zero-copy views and columns."""

    def _wait_until(self, ready, timeout: float) -> bool:
        """Block until ``ready()`` (a check of the queues, called with no
        lock of the store's writing held) is true, the store closes or
        *timeout* seconds pass (``math.inf``: no limit); returns whether
        *ready* was seen true. In the writer's process a dispatch wakes the
        wait (the arrival condition: no polling); a read-only store has no
        signal from the writer process and looks every
        ``follow_poll_interval`` ms, taking in new queues at most once a
        second. A waker of its own (a consumer closed from another thread)
        makes *ready* true, then calls :meth:`_wake_waiters`."""
        deadline = time.monotonic() + timeout
        if self.read_only:
            pause = max(self.config.follow_poll_interval, 1) / 1000
            while True:
                try:
                    if self._closed:
                        return False
                    if time.monotonic() >= self._next_full_refresh:
                        self.refresh()
                    if ready():
                        return True
                except StoreClosedError:
                    if self._closed:  # (closed by another thread meanwhile: the wait ends)
                        return False
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(pause, left))
        with self._arrival:  # (a dispatch notifies under it after the units are in: none is missed)
            self._waiting += 1
            try:
                while True:
                    if self._closed:
                        return False
                    if ready():
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._arrival.wait(min(left, _WAIT_SLICE))
            finally:
                self._waiting -= 1

    def get_message(self, physical_offset: int):
        """The record starting at CommitLog physical offset *physical_offset*
        (an int, bytes) as a :class:`MessageExt`, or None when no valid record
        starts there: below the minimum offset, at or past the maximum, or not
        a record boundary (a record whose body CRC does not match is not
        valid: every read checks it). RocketMQ ``lookMessageByOffset``: any
        long (-2**63 .. 2**63-1) is a valid question, answered None where no
        record starts.

        Raises MessageTypeError unless *physical_offset* is an int (a bool is
        not); ArgumentError outside a long; StoreClosedError."""
        if self._closed:
            self._ensure_open()
        out: list = []
        try:  # (the kernel refuses what is not an int, a bool too: the checks cost a lookup nothing)
            if k.read_ext(self.commitlog, physical_offset, MessageExt, out, self._refs) is None:  # clean-up at work
                self._held(k.read_ext, self.commitlog, physical_offset, MessageExt, out)
        except TypeError:
            _int_arg("physical_offset", physical_offset, _I64_MIN, _I64_MAX)  # raises MessageTypeError
            raise
        if out:
            return out[0]
        if not _I64_MIN <= physical_offset <= _I64_MAX:  # (no record is past a long: checked only here)
            _int_arg("physical_offset", physical_offset, _I64_MIN, _I64_MAX)
        return None

    def iter_messages(self, start_offset: int = 0):
        """An iterator of every stored message in CommitLog order from physical
        offset *start_offset* (an int, 0 .. 2**63-1, a record boundary; blank
        records are skipped).

        Raises MessageTypeError, ArgumentError (at once, for *start_offset*),
        StoreClosedError; while iterating CorruptedFileError at a record that
        does not validate, StoreClosedError once the store is closed."""
        self._ensure_open()
        return self._iter_messages(_int_arg("start_offset", start_offset, 0, _I64_MAX))

    def _iter_messages(self, start_offset: int):
        offsets = self.commitlog.iter_offsets(start_offset)
        refs = self._refs
        at = start_offset
        while True:
            refs.hold()  # per step: a paused iterator must not block clean-up
            try:
                nxt = next(offsets, None)
                if nxt is None:
                    mn = self.commitlog.min_offset()
                    if at >= mn:
                        return
                    # clean-up deleted the file we were in: go on at the new start
                    at = mn
                    offsets = self.commitlog.iter_offsets(mn)
                    continue
                at = nxt[0]
                out: list = []
                k.read_ext(self.commitlog, at, MessageExt, out, None)
                if not out:  # raises CorruptedFileError with the reason
                    out.append(MessageExt(self.commitlog.read(at, strict=True)))
            finally:
                refs.release()
            yield out[0]

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """First queue offset whose message is still stored (0 for an unknown queue).

        Raises MessageTypeError, ArgumentError (*queue_id* outside a Java
        int), StoreClosedError."""
        self._ensure_open()
        if type(queue_id) is not int or not _I32_MIN <= queue_id <= _I32_MAX:
            queue_id = _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX)
        cq = self._cqs.get((topic, queue_id))
        return cq.min_offset_in_queue() if cq else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be written (0 for an unknown queue).

        Raises MessageTypeError, ArgumentError (*queue_id* outside a Java
        int), StoreClosedError."""
        self._ensure_open()
        if type(queue_id) is not int or not _I32_MIN <= queue_id <= _I32_MAX:
            queue_id = _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX)
        if self.read_only:
            self._follow_queue(topic, queue_id)
        cq = self._cqs.get((topic, queue_id))
        return cq.max_offset_in_queue() if cq else 0

    def _get_messages(
        self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags=None, wait_ms: int = 0
    ) -> GetMessageResult:
        """The careful path of :meth:`get_messages` (StoreCore's), for whatever
        its gate leaves: checks, errors, careful reads, follows and waits."""
        queue_id, offset, max_count = _pull_args(queue_id, offset, max_count)
        wait_ms = _wait_arg(wait_ms)
        result = self._pull(topic, queue_id, offset, max_count, tags)
        # follow mode: a writer process may have dispatched more since (past
        # the end as this reader last saw it is not past the end yet); a wait
        # below polls through _wait_until, which follows the queue too
        if self.read_only and not result.messages and (result.status in _WAITABLE
                                                       or result.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY) \
                and self._follow_queue(topic, queue_id):
            result = self._pull(topic, queue_id, offset, max_count, tags)
        if wait_ms <= 0 or result.messages or result.status not in _WAITABLE:
            return result
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if result.status is GetMessageStatus.NO_MATCHED_MESSAGE:
                offset = result.next_begin_offset  # filtered units are done with
            if not self._wait_until(lambda past=offset: self.get_max_offset_in_queue(topic, queue_id) > past,
                                    deadline - time.monotonic()):
                return result  # (the wait ran out, or close() woke it)
            result = self._pull(topic, queue_id, offset, max_count, tags)
            if result.messages or result.status not in _WAITABLE:
                return result

    def _pull(self, topic, queue_id, offset, max_count, tags) -> GetMessageResult:
        if self._closed:  # (inline: a call per pull is measurable)
            self._ensure_open()
        if type(offset) is int and type(max_count) is int:
            # one kernel call, the tag filter in it (no reader reference, see
            # pull_messages); tags that do not parse: the careful path raises
            try:
                wanted = None if tags is None else _tag_filter(tags)
                cq = self._cqs.get((topic, queue_id))
            except Exception:
                wanted = cq = None
            if cq is not None:
                units = max_count if max_count > _MAX_FILTER_UNITS else _MAX_FILTER_UNITS
                out: list = []
                found = k.pull_messages(cq, self.commitlog, offset, max_count, units, MessageExt, out, wanted,
                                        self._refs)
                if found is None:  # clean-up at work: wait for it, then read
                    found = self._held(k.pull_messages, cq, self.commitlog, offset, max_count, units, MessageExt, out,
                                       wanted)
                if found[0] is not None:  # (stopped: the careful path below reads it all again, and raises)
                    return _new_tuple(GetMessageResult, (found[0], out, *found[1:]))
        refs = self._refs
        refs.hold()  # one reader reference for the whole pull: clean-up waits for it
        try:
            return self._pull_held(topic, queue_id, offset, max_count, tags)
        finally:
            refs.release()

    def _pull_held(self, topic, queue_id, offset, max_count, tags) -> GetMessageResult:
        """The careful pull: the kernels' statuses (k.pull_bounds, then those
        of k.pull_units), reading step by step what they do not vouch for."""
        cq: Any = self._cqs.get((topic, queue_id))
        ended, nxt, mn, mx = k.pull_bounds(cq, offset)
        if ended is not None:
            return GetMessageResult(ended, [], nxt, mn, mx)
        wanted = _tag_filter(tags)
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        messages: list = []
        q = offset
        visited = 0
        cl_min = self.commitlog.min_offset()
        if wanted is None:  # every message: the units of each file in one kernel call
            view = self.commitlog.segment_view()
            max_size = self.commitlog.max_record_size
            stopped = False
            while q < mx and len(messages) < max_count and visited < max(_MAX_FILTER_UNITS, max_count):
                where = cq.unit_range(q, min(max_count - len(messages), mx - q))
                if where is None or where[1] == where[2]:
                    break
                buf, start, end = where
                done, event, stopped = k.pull_units(
                    buf, start, end, view, topic, queue_id, q, max_count, cl_min, max_size, MessageExt, messages
                )
                q += done
                visited += done
                if event is not None:
                    status = event
                if stopped:  # not a record the kernel can vouch for: read it step by step (raises)
                    break
            else:
                return GetMessageResult(status, messages, q, mn, mx)
            if not stopped:
                return GetMessageResult(status, messages, q, mn, mx)
        read = self.commitlog.record_reader()
        while q < mx and len(messages) < max_count and visited < max(_MAX_FILTER_UNITS, max_count):
            units = cq.get_units(q, max_count - len(messages) if wanted is None else max_count)
            if not units:
                break
            for unit in units:
                q += 1
                visited += 1
                phy, size, tags_code = unit
                if size == PRE_BLANK_SIZE and phy == 0 and tags_code == 0:
                    continue  # a pre-blank placeholder (is_pre_blank)
                # while nothing is kept (as the kernels): a unit the filter drops makes
                # NO_MATCHED_MESSAGE, one cleaned up MESSAGE_WAS_REMOVING
                if wanted is not None and tags_code not in wanted[0]:
                    if not messages:
                        status = GetMessageStatus.NO_MATCHED_MESSAGE
                    continue
                if phy < cl_min:
                    if not messages:
                        status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
                fields = read(phy)
                # the record must be the one the unit stands for (docs/recovery.md#pitfall-stored-offsets-trusted)
                if fields[0] != size or fields[5] != q - 1 or fields[3] != queue_id or fields[15] != topic:
                    raise _unit_mismatch(cq, q - 1, phy, size, fields)
                m = MessageExt(fields)
                if wanted is not None and m.tags not in wanted[1]:
                    if not messages:
                        status = GetMessageStatus.NO_MATCHED_MESSAGE
                    continue
                messages.append(m)
                status = GetMessageStatus.FOUND
                if len(messages) >= max_count:
                    break
        return GetMessageResult(status, messages, q, mn, mx)

    def get_message_columns(
        self, topic: str, queue_id: int, offset: int, max_count: int = 1024, with_body: bool = True,
        with_properties: bool = False,
    ) -> GetColumnsResult:
        """Bulk form of :meth:`get_messages`: up to *max_count* messages of
        (topic, queue_id) from queue offset *offset*, decoded by one kernel
        call into column arrays (``decode_columns_at``) instead of one
        :class:`MessageExt` each. For consumers that take many messages at a
        time; no tag filter and no waiting (use get_messages for those).

        Args:
            with_body (bool): include ``body_offsets``/``body_data``.
            with_properties (bool): include the property map columns
                (tags, keys and unique_key are always there).

        Returns a :class:`GetColumnsResult` with the statuses and offsets of
        get_messages (NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE,
        OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE, OFFSET_OVERFLOW_BADLY, FOUND,
        MESSAGE_WAS_REMOVING). *queue_id*, *offset* and *max_count* as in
        get_messages.

        Raises MessageTypeError, ArgumentError (as get_messages),
        StoreClosedError, and CorruptedFileError when a unit points at
        something that is not its record.
        """
        self._ensure_open()
        queue_id, offset, max_count = _pull_args(queue_id, offset, max_count)
        if self.read_only:
            self._follow_if_behind(topic, queue_id, offset)
        self._refs.hold()
        try:
            return self._columns_held(topic, queue_id, offset, max_count, with_body, with_properties)
        finally:
            self._refs.release()

    def _get_message_views(self, topic: str, queue_id: int, offset: int, max_count: int = 32) -> GetViewsResult:
        """The careful path of :meth:`get_message_views` (StoreCore's), for
        whatever its gate leaves: checks, errors, careful reads."""
        if self._closed:
            self._ensure_open()
        queue_id, offset, max_count = _pull_args(queue_id, offset, max_count)
        if self.read_only:
            self._follow_if_behind(topic, queue_id, offset)
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            ended, nxt, mn, mx = k.pull_bounds(cq, offset)
            assert ended is not None  # (NO_MATCHED_LOGIC_QUEUE)
            return GetViewsResult(ended, None, _view_units(b""), nxt, mn, mx)
        units = max_count if max_count > _MAX_FILTER_UNITS else _MAX_FILTER_UNITS
        refs = self._refs
        refs.hold()  # until the view exports the segment: then close() cannot unmap it
        try:
            found = k.pull_views(cq, self.commitlog, offset, max_count, units, None)  # (never None without refs)
            status, nxt, mn, mx, segment, packed = found  # type: ignore[misc]
            view = None if segment is None else memoryview(segment).toreadonly()
        finally:
            refs.release()
        if status is None:  # stopped: the careful path raises for a unit that is not its record
            careful = self.get_messages(topic, queue_id, offset, max_count)
            if careful.messages:
                m = careful.messages[0]
                raise CorruptedFileError(
                    f"the record of {topic}/{queue_id} queue offset {m.queue_offset} does not store the topic "
                    "as its UTF-8 bytes; read it with get_messages", self.commitlog.queue.directory,
                    m.physical_offset,
                )
            return GetViewsResult(careful.status, None, _view_units(b""), careful.next_begin_offset, mn, mx)
        # (the tuple made directly: a NamedTuple's own __new__ is a Python frame, per pull)
        return _new_tuple(GetViewsResult, (status, view, _view_units(packed), nxt, mn, mx))

    def _columns_held(self, topic, queue_id, offset, max_count, with_body, with_properties) -> GetColumnsResult:
        view = self.commitlog.segment_view()
        cq: Any = self._cqs.get((topic, queue_id))
        status, nxt, mn, mx = k.pull_bounds(cq, offset)  # (the statuses of every pull)
        phys: list = []
        sizes: Any = []
        qoffs: Any = []
        if status is None:
            import numpy as np

            status, q, cl_min = GetMessageStatus.NO_MATCHED_MESSAGE, offset, view[3]
            parts = []
            kept = 0
            while q < mx and kept < max_count:
                where = cq.unit_range(q, max_count - kept)
                if where is None or where[1] == where[2]:
                    break
                buf, start, end = where
                # the units as arrays (a copy, never a view of the mapping)
                u = np.frombuffer(buf[start:end], dtype=CQ_UNIT_FIELDS)
                placeholder = (u["size"] == PRE_BLANK_SIZE) & (u["phy"] == 0) & (u["tags"] == 0)
                cleaned = ~placeholder & (u["phy"] < cl_min)
                if cleaned.any():
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                keep = np.flatnonzero(~placeholder & ~cleaned)
                parts.append((u[keep], keep + q))
                kept += len(keep)
                q += len(u)
            if parts:
                units = np.concatenate([p[0] for p in parts])
                phys = units["phy"].tolist()
                sizes = units["size"].astype(np.int32)
                qoffs = np.concatenate([p[1] for p in parts])
            nxt = q
        count, stop, cols = k.decode_columns_at(view[0], view[1], view[2], phys, with_body, with_properties)
        if count < len(phys):
            raise CorruptedFileError(
                f"ConsumeQueue {topic}/{queue_id} unit {qoffs[count]} points at physical offset {phys[count]}, "
                f"where no valid record starts: {REC_STATUS_TEXT.get(stop, 'blank record')}",
                self.commitlog.queue.directory, phys[count],
            )
        if count:
            self._check_columns(cq, topic, queue_id, cols, sizes, qoffs)
            status = GetMessageStatus.FOUND
        return GetColumnsResult(status, cols, nxt, mn, mx)

    @staticmethod
    def _check_columns(cq, topic, queue_id, cols, sizes, qoffs) -> None:
        """Each record is the one its unit stands for (docs/recovery.md#pitfall-stored-offsets-trusted), on arrays."""
        import numpy as np

        topic_b = np.frombuffer(topic.encode("utf-8"), dtype=np.uint8)
        n, width = len(sizes), len(topic_b)
        toff = cols["topic_offsets"]
        same = (
            np.array_equal(cols["store_size"], sizes)
            and np.array_equal(cols["queue_offset"], qoffs)
            and bool((cols["queue_id"] == queue_id).all())
            and bool((np.diff(toff) == width).all())
            and bool((cols["topic_data"].reshape(n, width) == topic_b).all() if width else True)
        )
        if not same:
            i = next(
                i for i in range(n)
                if (cols["store_size"][i], cols["queue_offset"][i], cols["queue_id"][i])
                != (sizes[i], qoffs[i], queue_id)
                or cols["topic_data"][toff[i] : toff[i + 1]].tobytes() != topic_b.tobytes()
            )
            raise CorruptedFileError(
                f"ConsumeQueue {topic}/{queue_id} unit {qoffs[i]} ({sizes[i]} bytes) points at a record of "
                f"{cols['store_size'][i]} bytes for queue {cols['queue_id'][i]} offset {cols['queue_offset'][i]}",
                cq.queue.directory, int(cols["physical_offset"][i]),
            )

    def query_offsets(self, topic: str, key: str, max_count: int = 64, begin: int = 0, end: int = MAX_OFFSET) -> list:
        """Physical offsets the index holds for *key* in *topic* with index time in
        [begin, end] (ms), exactly as RocketMQ's ``IndexService.queryOffset``:
        newest first, at most ``min(max_count, max_msgs_num_batch)``, key-hash
        collisions and duplicates included (:meth:`query_messages` answers
        with the messages themselves, docs/recovery.md#lookups-by-key).

        Args:
            max_count (int): 1 .. 2**31-1.
            begin, end (int): ms since epoch, longs, begin <= end.

        Raises MessageTypeError, ArgumentError, StoreClosedError."""
        self._ensure_open()
        if not isinstance(key, str) or not isinstance(topic, str):
            raise MessageTypeError("topic and key must be str")
        max_count, begin, end = _query_args(max_count, begin, end)
        self._refs.hold()
        try:
            return self.index.query_offsets(topic, key, max_count, begin, end)
        finally:
            self._refs.release()

    def _query_messages(self, topic: str, key: str, max_count: int = 64, begin: int = 0, end: int = MAX_OFFSET) -> list:
        """The careful path of :meth:`query_messages` (StoreCore's), for
        whatever its gate leaves: checks, errors, a clean-up in the way."""
        if self._closed:  # (inline: a call per lookup is measurable)
            self._ensure_open()
        if not isinstance(key, str) or not isinstance(topic, str):
            raise MessageTypeError("topic and key must be str")
        max_count, begin, end = _query_args(max_count, begin, end)
        out: list = []
        if k.query_keyed(self.index, self.commitlog, topic, key, max_count, begin, end, MessageExt, out,
                         self._refs) is None:  # clean-up at work: wait for it, then read
            self._held(k.query_keyed, self.index, self.commitlog, topic, key, max_count, begin, end, MessageExt, out)
        return out

    def look_message_by_msg_id(self, msg_id: str):
        """The message with offset message id *msg_id* (docs/format.md#offset-msgid: store host
        and port, then physical offset, as 32 or 56 hex digits in either
        case), or None when the id is malformed, points nowhere, or names
        another store host. RocketMQ ``viewMessage`` by offset msgId."""
        if self._closed:
            self._ensure_open()
        try:
            host_raw, offset = _split_offset_msg_id(msg_id)
        except ValueError:
            return None
        m = self.get_message(offset)
        # (the record is at that offset: the same id unless another host stored it)
        return m if m is not None and m.store_host_raw == host_raw else None

    def _get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower") -> int:
        """The careful path of :meth:`get_offset_in_queue_by_time` (StoreCore's),
        for whatever its gate leaves: checks, errors, follow mode."""
        if self._closed:  # (inline: a call per lookup is measurable)
            self._ensure_open()
        upper = _BOUNDARIES.get(boundary) if type(boundary) is str else None  # (as given: no lower() per lookup)
        if upper is None:
            try:
                upper = _BOUNDARIES[boundary.lower()]
            except (KeyError, AttributeError):
                raise ArgumentError(f"boundary must be 'lower' or 'upper', got {boundary!r}") from None
        queue_id = _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX)
        timestamp = _int_arg("timestamp", timestamp, _I64_MIN, _I64_MAX)
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        found = k.time_lookup(cq, self.commitlog, timestamp, upper, self._refs)
        if found is None:  # clean-up at work: under a held reference
            found = self._held(k.time_lookup, cq, self.commitlog, timestamp, upper)
        return found
