"""The read path: a pull's inner loop over ConsumeQueue units, keyed reads
for ``query_messages``, the whole-operation lookups and pulls
(``time_lookup``, ``query_keyed``, ``read_ext``, ``pull_views``,
``pull_messages``) under a reader reference, and the status ladder of a pull
(``pull_bounds``)."""

from __future__ import annotations

import operator
import struct

from .._status import GetMessageStatus
from ..format.layout import BORNHOST_V6_FLAG, CQ_STORE_UNIT_SIZE, PRE_BLANK_SIZE, STOREHOSTADDRESS_V6_FLAG
from .codec import _stored_topic, index_key_hash, parse_properties, read_record
from .consumequeue import _CQ_UNIT, _check_view
from .index import _chain, _check_index_buf

_I64_MIN = -(1 << 63)
_BEGIN_END = struct.Struct(">qq")  # an IndexFile header's begin and end store times

# --- the pull path ----------------------------------------------------------

def _check_ext_type(message_type) -> None:
    if not isinstance(message_type, type):
        raise TypeError("message_type must be a class")


def _ext(message_type, fields: tuple, topic: str):
    """``message_type(fields)`` with *topic* for the topic field (either
    implementation's MessageExt, or any class made that way)."""
    return message_type(fields[:15] + (topic, fields[16]))


def pull_units(
    cq_buf, start: int, end: int, view: tuple, topic: str, queue_id: int, queue_offset: int, max_count: int,
    min_physical_offset: int, max_size: int, message_type, out: list,
) -> tuple:
    """A pull's inner loop (RocketMQ ``getMessage`` without a filter) over the
    ConsumeQueue units in ``cq_buf[start:end]`` (whole units), the first at
    *queue_offset*, reading records through the CommitLog *view*
    (``CommitLog.segment_view()``): a pre-blank placeholder is skipped, a
    unit whose record starts below *min_physical_offset* (cleaned up) is
    skipped and noted, and every other record, checked to be the unit's
    (valid up to *max_size* bytes with its body CRC, its size, physical offset, queue offset,
    queue id and topic), is appended to *out* as ``message_type(fields)``
    (*message_type*: MessageExt, or a class with its ``__slots__`` and a
    constructor that only stores the fields in them; the core fills the
    slots without calling it), the topic field being *topic* itself, until
    *out* holds *max_count*.

    Returns ``(units_done, status, stopped)``: *status* is
    ``GetMessageStatus.FOUND`` when a message was appended,
    ``MESSAGE_WAS_REMOVING`` when a unit was cleaned up while *out* was
    still empty, else None (no change to the pull's status); *stopped* means the unit after the ones done
    needs the caller's careful path (no valid record where it points, or not
    its record: the caller raises), nothing having been appended for it.
    """
    _check_ext_type(message_type)
    if not isinstance(topic, str):
        raise TypeError("topic must be a str")
    _check_view(*view)
    n = len(memoryview(cq_buf))
    if start < 0 or end > n or start > end or (end - start) % CQ_STORE_UNIT_SIZE:
        raise ValueError(f"units [{start}, {end}) are not whole units of a {n}-byte buffer")
    topic_b = topic.encode("utf-8")
    done, status = 0, None
    for p in range(start, end, CQ_STORE_UNIT_SIZE):
        if len(out) >= max_count:
            break
        phy, size, tags = _CQ_UNIT.unpack_from(cq_buf, p)
        if size == PRE_BLANK_SIZE and phy == 0 and tags == 0:
            done += 1
            continue
        if phy < min_physical_offset:  # its record was cleaned up
            if not out:
                status = _MESSAGE_WAS_REMOVING
            done += 1
            continue
        found = _unit_record(view, phy, size, queue_offset + done, queue_id, topic_b, max_size)
        if found is None:
            return done, status, True
        out.append(_ext(message_type, found[2], topic))
        status = _FOUND
        done += 1
    return done, status, False


def _record_at(view: tuple, phy: int, max_size: int):
    """decode_record's fields of the valid record (body CRC checked, at most
    *max_size* bytes) at physical offset *phy* of a CommitLog *view*, or None:
    below its minimum (cleaned up), past its end, or no valid record there."""
    bufs, fs, base, lo, hi = view
    seg = (phy - base) // fs
    if phy < lo or phy >= hi or phy < base or seg >= len(bufs):
        return None
    seg_start = base + seg * fs
    fields = read_record(bufs[seg], phy - seg_start, min(fs, hi - seg_start), phy, max_size, True)
    return fields if type(fields) is tuple else None


def read_keyed(view: tuple, offsets: list, topic: str, key: str, max_size: int, message_type, out: list) -> None:
    """``query_messages``' reads (fixes RocketMQ #3613 hash collisions,
    docs/recovery.md#pitfall-index-hash-collisions): each physical offset of *offsets* once, in order, skipping
    those below the *view*'s minimum (cleaned up) or where no valid record
    of at most *max_size* bytes starts; a record whose topic is *topic* and
    whose UNIQ_KEY is *key* or one of whose space-separated KEYS is *key*
    (properties as ``parse_properties`` reads them, an absent KEYS counting
    as one empty key) is appended to *out* as ``message_type(fields)`` (see
    ``pull_units``). Returns None."""
    _check_ext_type(message_type)
    if not isinstance(topic, str) or not isinstance(key, str):
        raise TypeError("topic and key must be str")
    if type(offsets) is not list:
        raise TypeError("offsets must be a list of int")
    _check_view(*view)
    seen = set()
    for phy in offsets:
        phy = operator.index(phy)
        if phy not in seen:
            seen.add(phy)
            _keyed_record(view, phy, topic, key, max_size, None, message_type, out)


def _keyed_record(view: tuple, phy: int, topic: str, key: str, max_size: int, window, message_type, out: list):
    """Append the record at *phy* to *out* when it is still stored, valid,
    of *topic*, carries *key* and (*window* not None) was stored at a time
    in ``[window[0], window[1]]``: True if appended (the core's
    ``_keyed_record``)."""
    fields = _record_at(view, phy, max_size)
    if fields is None or (window is not None and not window[0] <= fields[10] <= window[1]) or fields[15] != topic:
        return False
    props = parse_properties(fields[16])
    if props.get("UNIQ_KEY") != key and key not in (props.get("KEYS") or "").split(" "):
        return False
    out.append(_ext(message_type, fields, fields[15]))
    return True


# --- whole lookups -----------------------------------------------------------


def time_lookup(cq, commitlog, timestamp: int, upper: bool, refs):
    """``cq.offset_by_time(timestamp, upper, commitlog.segment_view())`` (the
    queue offset ``get_offset_in_queue_by_time`` answers), under a reader
    reference: *refs* is the store's ``ReferenceResource`` (held here while
    reading) or None when the caller holds one.

    Returns None instead when the caller must hold a reference and call
    again with ``refs=None`` (the core's answer while clean-up holds the
    references exclusively; never here)."""
    return _held(refs, lambda: cq.offset_by_time(timestamp, upper, commitlog.segment_view()))


def _held(refs, read):
    """``read()`` under a reader reference from *refs* (None: the caller
    holds one), for the whole-operation kernels."""
    if refs is None:
        return read()
    refs.hold()
    try:
        return read()
    finally:
        refs.release()


def query_keyed(index, commitlog, topic: str, key: str, max_num: int, begin: int, end: int, message_type,
                out: list, refs):
    """``query_messages`` in one call (docs/recovery.md#lookups-by-key):
    appends to *out* the first *max_num* records, in the order the index
    chains of ``topic#key`` are walked (newest file first, newest entry
    first), that are still stored, valid (at most
    ``commitlog.max_record_size`` bytes, read through
    ``commitlog.segment_view()``), of topic *topic*, carry *key* (as
    :func:`read_keyed` reads them) and were stored at a time in [*begin*,
    *end*]; each record once. The walk is ``index.query_offsets``' without
    its cap (collisions and duplicates take no room) and with the window
    widened to [*begin* - 999, *end*] (the index keeps whole seconds).
    *refs* as in :func:`time_lookup`. Returns *out*, or None (nothing read)
    when the caller must hold a reference and call again with
    ``refs=None``. Raises TypeError unless *topic* and *key* are str."""
    if not isinstance(topic, str) or not isinstance(key, str):
        raise TypeError("topic and key must be str")
    return _held(refs, lambda: _query_keyed_in(index, commitlog, topic, key, max_num, begin, end, message_type, out))


def _query_keyed_in(index, commitlog, topic: str, key: str, max_num: int, begin: int, end: int, message_type,
                    out: list) -> list:
    # the chains of topic#key read as they are walked, so that no batch of
    # offsets caps the answer and nothing is read past the max_num-th match
    _check_ext_type(message_type)
    files = index.files
    if files is None:
        raise TypeError("an index without a files list")
    left = max_num
    if left <= 0:
        return out
    # an entry is timed in whole seconds, up to 999 ms before its record's
    # store time (docs/recovery.md#pitfall-index-time-resolution); clamped,
    # as every time the index holds is a long
    wlo = max(begin - 999, _I64_MIN)
    window = (begin, end)
    key_hash = index_key_hash(f"{topic}#{key}")
    view, max_size = None, 0
    kept: set = set()
    last = -1
    newer_began_before = False
    for f in reversed(files):
        buf, hsn, idx = f.mm, f.hash_slot_num, f.index_num
        _check_index_buf(buf, hsn, idx)
        fb, fe = _BEGIN_END.unpack_from(buf, 0)
        # IndexFile.isTimeMatched, then the chain
        if (wlo < fb and end > fe) or (fb <= wlo <= fe) or (fb <= end <= fe):
            for phy in _chain(buf, hsn, idx, key_hash, wlo, end, True):
                if phy == last:
                    continue  # (one record's keys, and re-indexed records, repeat in a row)
                last = phy
                if phy in kept:
                    continue  # each record once
                if view is None:
                    view, max_size = commitlog.segment_view(), commitlog.max_record_size
                if _keyed_record(view, phy, topic, key, max_size, window, message_type, out):
                    kept.add(phy)
                    left -= 1
                    if left == 0:
                        return out
        # RocketMQ stops at the first file that began before the window; here the next
        # older one must also have ended before it (a lying header hides no other file's keys)
        if newer_began_before and fe < wlo:
            break
        newer_began_before = fb < wlo
    return out


def read_ext(commitlog, physical_offset: int, message_type, out: list, refs):
    """``get_message`` in one call: the valid record (body CRC checked, at
    most ``commitlog.max_record_size`` bytes) that starts at CommitLog
    physical offset *physical_offset*, read through
    ``commitlog.segment_view()`` and appended to *out* as
    ``message_type(fields)`` (see ``pull_units``); nothing is appended below
    the minimum offset, past the end (any int, past int64 too) or where no
    valid record starts. *refs* as in :func:`time_lookup`. Returns *out*,
    or None (nothing read) when the caller must hold a reference and call
    again with ``refs=None``. Raises TypeError unless *physical_offset* is
    an int (``__index__``; a bool is not)."""
    _check_ext_type(message_type)
    if isinstance(physical_offset, bool):
        raise TypeError("physical_offset must be an int, not a bool")
    phy = operator.index(physical_offset)

    def read():
        fields = _record_at(commitlog.segment_view(), phy, commitlog.max_record_size)
        if fields is not None:
            out.append(message_type(fields))
        return out

    return _held(refs, read)


#: one unit of a zero-copy pull (``pull_views``), native byte order: queue
#: offset, physical offset, store timestamp, tags code, body offset in the
#: segment, body length, record size
VIEW_UNIT = struct.Struct("=qqqqqii")


def _unit_record(view: tuple, phy: int, size: int, queue_offset: int, queue_id: int, topic_b: bytes,
                 max_size: int):
    """The record a ConsumeQueue unit stands for (docs/recovery.md#pitfall-stored-offsets-trusted), as a pull reads it
    through a CommitLog *view*: ``(segment, position, fields)`` when a valid
    record (body CRC included) of *size* bytes starts at *phy* with that
    queue offset, queue id and stored topic *topic_b*; None otherwise."""
    bufs, fs, base, lo, hi = view
    seg = (phy - base) // fs
    if phy < lo or phy >= hi or phy < base or seg >= len(bufs):
        return None
    at = phy - base - seg * fs
    fields = read_record(bufs[seg], at, min(fs, hi - base - seg * fs), phy, max_size, True)
    if type(fields) is not tuple or fields[0] != size or fields[5] != queue_offset or fields[3] != queue_id or \
            _stored_topic(bufs[seg], at) != topic_b:
        return None
    return seg, at, fields


def pull_views(cq, commitlog, queue_offset: int, max_count: int, max_units: int, refs):
    """``get_messages`` without a filter, zero-copy (``get_message_views``):
    the messages of ConsumeQueue *cq* from *queue_offset* as positions in one
    CommitLog segment instead of copies. *refs* as in :func:`time_lookup`.

    The statuses and offsets are ``_pull_held``'s (RocketMQ ``getMessage``):
    placeholders and cleaned-up units are skipped, at most *max_count*
    messages, units read a ConsumeQueue file at a time until *max_units*
    have been visited; every record is checked to be its unit's (as
    :func:`pull_units`). The pull also ends before the first record in
    another segment than the first one found (the next pull starts there).

    Returns None (the caller must hold a reference and call again with
    ``refs=None``), or ``(status, next_queue_offset, min_offset, max_offset,
    segment, units)``: *status* a ``GetMessageStatus``, or None (stopped)
    when the first unit to read needs the caller's careful path (nothing
    found before it); *segment* the ``mmap`` of the segment holding the
    records (None when none); *units* ``VIEW_UNIT`` entries, one per message.
    A caller that exports *segment* (a memoryview) does so while it still
    holds its reader reference (so with ``refs=None``, under its own hold):
    an exported mapping is one the store's ``close()`` cannot unmap.
    """
    return _held(refs, lambda: _pull_queue(cq, commitlog, queue_offset, max_count, max_units, None, None, None))


def pull_messages(cq, commitlog, queue_offset: int, max_count: int, max_units: int, message_type, out: list, tags,
                  refs):
    """``get_messages`` in one call: :func:`pull_views`' statuses, offsets
    and checks, with the messages made as *message_type* (``MessageExt``)
    and appended to *out*, across CommitLog segments.

    *tags*: None for every message, else a tag filter ``(codes, names)``
    (a set of tags codes, a set of tag names; ``store._tag_filter``'s): a
    unit is read only when its tags code is one of *codes* (RocketMQ's
    ConsumeQueue filter), and its message kept only when its ``tags`` is
    one of *names* (the client's check, fixing hash collisions); a
    ConsumeQueue file's units are then read *max_count* at a time, as the
    store's careful path reads them. The core stops for a
    filter that is not sets of exact ints and strs (status None).

    Returns None (as :func:`pull_views`), or ``(status, next_queue_offset,
    min_offset, max_offset)``; *status* is None (stopped) at any unit the
    caller's careful path must read (what *out* got is then to be dropped:
    that path reads the pull again and raises)."""
    _check_ext_type(message_type)
    if type(out) is not list:
        raise TypeError("out must be a list")
    return _held(refs, lambda: _pull_queue(cq, commitlog, queue_offset, max_count, max_units, message_type,
                                           out, tags)[:4])


_FOUND = GetMessageStatus.FOUND
_NO_MATCHED_MESSAGE = GetMessageStatus.NO_MATCHED_MESSAGE
_MESSAGE_WAS_REMOVING = GetMessageStatus.MESSAGE_WAS_REMOVING
_NO_MATCHED_LOGIC_QUEUE = GetMessageStatus.NO_MATCHED_LOGIC_QUEUE


def _bounds(q: int, mn: int, mx: int) -> tuple:
    """The status ladder of a pull before any unit is read (RocketMQ
    ``getMessage``): ``(status, next_begin_offset)`` for queue offset *q* in
    a queue of min offset *mn* and max offset *mx*; status None (next *q*)
    when *q* is a unit to read."""
    if mx == 0:
        return GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0
    if q < mn:
        return GetMessageStatus.OFFSET_TOO_SMALL, mn
    if q == mx:
        return GetMessageStatus.OFFSET_OVERFLOW_ONE, q
    if q > mx:
        return GetMessageStatus.OFFSET_OVERFLOW_BADLY, mx
    return None, q


def pull_bounds(cq, queue_offset: int) -> tuple:
    """Where a pull of ConsumeQueue *cq* (None: no such queue) from
    *queue_offset* ends before reading any unit, as RocketMQ ``getMessage``
    decides: ``(status, next_begin_offset, min_offset, max_offset)``, the
    status a :class:`GetMessageStatus` (NO_MATCHED_LOGIC_QUEUE,
    NO_MESSAGE_IN_QUEUE, OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE or
    OFFSET_OVERFLOW_BADLY), or None with *queue_offset* when the pull reads
    units from there. The pulls (:func:`pull_messages`, :func:`pull_views`)
    and the store's careful paths all answer by this ladder; the core's
    answers the same."""
    if cq is None:
        return _NO_MATCHED_LOGIC_QUEUE, 0, 0, 0
    mn, mx = cq.min_offset_in_queue(), cq.max_offset_in_queue()
    status, nxt = _bounds(queue_offset, mn, mx)
    return status, nxt, mn, mx


def _pull_queue(cq, commitlog, q: int, max_count: int, max_units: int, message_type, out, tags) -> tuple:
    """pull_views (*message_type* None) or pull_messages (with *tags*).
    Statuses as RocketMQ ``getMessage``: :func:`_bounds`, then
    NO_MATCHED_MESSAGE, which a unit the filter drops (re)sets and one
    cleaned up turns into MESSAGE_WAS_REMOVING while nothing is kept, and
    FOUND once a message is kept."""
    views = message_type is None
    codes, names = (None, None) if tags is None else tags
    files = cq.queue.files
    mn = cq.min_logic_offset // CQ_STORE_UNIT_SIZE
    mx = (files[-1].file_from_offset + files[-1].wrote_position) // CQ_STORE_UNIT_SIZE if files else 0
    status, nxt = _bounds(q, mn, mx)
    if status is not None:
        return status, nxt, mn, mx, None, b""
    view = commitlog.segment_view()
    bufs, lo = view[0], view[3]
    max_size = commitlog.max_record_size
    topic_b = cq.topic.encode("utf-8")
    status, units, n, seg, visited = _NO_MATCHED_MESSAGE, bytearray(), 0, -1, 0
    while q < mx and n < max_count and visited < max_units:
        where = cq.unit_range(q, min(max_count if codes is not None else max_count - n, mx - q))
        if where is None or where[1] == where[2]:
            break
        buf, start, end = where
        for p in range(start, end, CQ_STORE_UNIT_SIZE):
            phy, size, tags_code = _CQ_UNIT.unpack_from(buf, p)
            if size == PRE_BLANK_SIZE and phy == 0 and tags_code == 0:
                pass  # a placeholder
            elif codes is not None and tags_code not in codes:
                if not n:
                    status = _NO_MATCHED_MESSAGE
            elif phy < lo:  # cleaned up
                if not n:
                    status = _MESSAGE_WAS_REMOVING
            else:
                found = _unit_record(view, phy, size, q, cq.queue_id, topic_b, max_size)
                if found is None:
                    return (status, q, mn, mx, bufs[seg], bytes(units)) if n and views else \
                        (None, q, mn, mx, None, b"")  # stopped
                i, at, fields = found
                kept = True
                if not views:
                    m = _ext(message_type, fields, cq.topic)
                    kept = names is None or m.tags in names  # (a tags code's collision)
                    if kept:
                        out.append(m)
                else:
                    if seg not in (-1, i):
                        return status, q, mn, mx, bufs[seg], bytes(units)  # the next segment: the next pull
                    seg = i
                    hosts = 48 + (20 if fields[7] & BORNHOST_V6_FLAG else 8) + \
                        (20 if fields[7] & STOREHOSTADDRESS_V6_FLAG else 8)
                    units += VIEW_UNIT.pack(q, phy, fields[10], tags_code, at + hosts + 24, len(fields[14]), size)
                if kept:
                    n += 1
                    status = _FOUND
                elif not n:
                    status = _NO_MATCHED_MESSAGE
            q += 1
            visited += 1
            if n >= max_count:
                break
    if not views:
        return status, q, mn, mx, None, b""
    return status, q, mn, mx, (bufs[seg] if n else None), bytes(units)
