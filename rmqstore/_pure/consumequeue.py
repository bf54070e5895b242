"""ConsumeQueue kernels: writing and reading 20-byte units
(docs/format.md#consumequeue-unit), the recovery scan, and the binary search
by store time (docs/format.md#time-search) with its CommitLog view reader."""

from __future__ import annotations

import struct

from ..format.layout import CQ_STORE_UNIT_SIZE, PRE_BLANK_SIZE
from .codec import _I32, _I64, _fields, _jdiv, read_store_timestamp

_CQ_UNIT = struct.Struct(">qiq")


def _check_unit_pos(buf, pos: int) -> None:
    n = len(buf)
    if pos < 0 or pos + CQ_STORE_UNIT_SIZE > n:
        raise ValueError(f"no ConsumeQueue unit at {pos} in a buffer of {n} bytes")


# --- ConsumeQueue ---------------------------------------------------------


def cq_put(buf, pos: int, physical_offset: int, size: int, tags_code: int) -> None:
    """Write one 20-byte ConsumeQueue unit at *pos* (docs/format.md#consumequeue-unit).
    Raises ValueError for a position outside *buf*."""
    _fields((physical_offset, 64), (size, 32), (tags_code, 64))
    _check_unit_pos(buf, pos)
    # size last: a unit torn by a crash has size 0 and is invalid
    _I64.pack_into(buf, pos, physical_offset)
    _I64.pack_into(buf, pos + 12, tags_code)
    _I32.pack_into(buf, pos + 8, size)


def cq_get(buf, pos: int) -> tuple:
    """Read the unit at *pos*: ``(physical_offset, size, tags_code)``.
    Raises ValueError for a position outside *buf*."""
    _check_unit_pos(buf, pos)
    return _CQ_UNIT.unpack_from(buf, pos)


def cq_units(buf, start: int, end: int) -> list:
    """Every unit in ``buf[start:end]`` (whole units only) as tuples."""
    end = min(end, len(buf))
    if start < 0 or start >= end:
        return []
    end -= (end - start) % CQ_STORE_UNIT_SIZE
    return list(_CQ_UNIT.iter_unpack(memoryview(buf)[start:end]))


def cq_scan(buf, start: int, end: int, phy_limit=None) -> tuple:
    """Recovery scan of one ConsumeQueue file (docs/recovery.md#consumequeue-recovery).

    From *start*, walk units while they are valid (physical offset >= 0 and
    size > 0) and, when *phy_limit* is an int, point below it (the truncation
    of docs/recovery.md#cutting-a-consumequeue). Returns ``(valid_end, max_physical_end)``: the position after
    the last valid unit, and offset + size of the last valid unit that is not
    a pre-blank placeholder (-1 if none; docs/recovery.md#pitfall-pre-blank-units-served).
    """
    end = min(end, len(buf))
    p = max(start, 0)
    max_end = -1
    unpack = _CQ_UNIT.unpack_from
    while p + CQ_STORE_UNIT_SIZE <= end:
        phy, size, tags = unpack(buf, p)
        if phy < 0 or size <= 0 or (phy_limit is not None and phy >= phy_limit):
            break
        if not (phy == 0 and size == PRE_BLANK_SIZE and tags == 0):
            max_end = phy + size
        p += CQ_STORE_UNIT_SIZE
    return p, max_end


def cq_search_time(
    buf, file_start: int, low: int, range_: int, timestamp: int, upper: bool, min_physical_offset: int, time_at
) -> int:
    """Binary search of one ConsumeQueue file by store time (RocketMQ 5.1.1+
    ``binarySearchInQueueByTime``, docs/format.md#time-search) returning a queue offset.

    *low* is the first position to consider, *range_* the readable length of
    the file in bytes; ``time_at(physical_offset, size)`` returns a record's
    store timestamp or -1. *time_at* may instead be a CommitLog view
    ``(buffers, file_size, base, lo, hi)`` (a list of the segments' buffers,
    the first one's physical offset *base*, the readable range [lo, hi)),
    which the kernel probes itself, as ``read_store_timestamp`` would, with
    no call per probe. *upper* selects BoundaryType UPPER (else LOWER).
    The caller clamps the answer to the queue's [min, max] offsets.
    """
    _fields((file_start, 64))
    if type(time_at) is tuple:
        time_at = _view_reader(*time_at)
    U = CQ_STORE_UNIT_SIZE
    range_ = min(range_, len(buf))
    range_ -= range_ % U
    if range_ < U or low > range_ - U:
        return _jdiv(file_start, U)
    if low < 0:
        raise ValueError(f"low {low} is negative")
    unpack = _CQ_UNIT.unpack_from

    def time_of(p):
        phy, size, _ = unpack(buf, p)
        return time_at(phy, size)

    ceiling = range_ - U
    floor = low
    high = ceiling
    left = right = target = -1
    if time_of(ceiling) < timestamp:
        return _jdiv(file_start + ceiling + (0 if upper else U), U)
    if time_of(floor) > timestamp:
        return 0 if upper else _jdiv(file_start, U)
    while high >= low:
        mid = (low + high) // (2 * U) * U
        phy, size, _ = unpack(buf, mid)
        if phy < min_physical_offset:
            low = mid + U
            left = mid
            continue
        t = time_at(phy, size)
        if t < 0:
            return 0
        if t == timestamp:
            target = mid
            break
        if t > timestamp:
            high = mid - U
            right = mid
        else:
            low = mid + U
            left = mid
    if target != -1:
        if upper:
            while target + U <= ceiling and time_of(target + U) == timestamp:
                target += U
        else:
            while target - U >= floor and time_of(target - U) == timestamp:
                target -= U
        result = target
    else:
        result = left if upper else right
    return _jdiv(file_start + result, U)


def _check_view(bufs, file_size, base, lo, hi) -> None:
    """A CommitLog view ``(bufs, file_size, base, lo, hi)`` as kernels take it."""
    if type(bufs) is not list:
        raise TypeError("a CommitLog view holds a list of buffers")
    _fields((file_size, 64), (base, 64), (lo, 64), (hi, 64))
    if file_size <= 0:
        raise ValueError(f"file size {file_size} is not positive")


def _view_reader(bufs, file_size, base, lo, hi):
    _check_view(bufs, file_size, base, lo, hi)

    def time_at(phy, size):
        if phy < lo or phy + size > hi or phy < base:
            return -1
        i = (phy - base) // file_size
        if i >= len(bufs):
            return -1
        return read_store_timestamp(bufs[i], phy - base - i * file_size)

    return time_at
