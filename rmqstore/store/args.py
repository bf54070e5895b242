"""Argument checks shared by the store's calls: Java ints and longs, waits,
pull and query arguments."""

from __future__ import annotations

import datetime
import math
import operator
import time

from ..exceptions import ArgumentError, MessageTypeError

MAX_OFFSET = (1 << 63) - 1
# the ranges of RocketMQ's Java ints and longs: what an argument may hold
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), MAX_OFFSET
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _int_arg(name: str, value, lo: int, hi: int) -> int:
    """*value* as an int in [lo, hi]. Raises MessageTypeError for a bool, a
    float or anything else without ``__index__``, ArgumentError out of range."""
    if type(value) is not int:
        if isinstance(value, bool):
            raise MessageTypeError(f"{name} must be an int in [{lo}, {hi}], got a bool")
        try:
            value = operator.index(value)  # (numpy's ints too)
        except TypeError:
            raise MessageTypeError(f"{name} must be an int in [{lo}, {hi}], got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise ArgumentError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def time_ms(text) -> int:
    """ms since epoch from an int, an integer string or an ISO-8601 time
    (UTC when it names no zone), from the epoch to Java's Long.MAX_VALUE;
    exact (no float rounding of the milliseconds). A number in [1e9, 1e11)
    is refused: as ms it is early 1970, as seconds since epoch it is a date
    of this century, so it is seconds given by mistake. Raises ValueError
    saying what it accepts."""
    if isinstance(text, bool):
        raise ValueError(f"not a time: {text!r}")
    number = True  # (an ISO time names its date: never taken for seconds)
    if isinstance(text, int):
        ms = text
    else:
        text = str(text).strip()
        try:
            ms = int(text)
        except ValueError:
            number = False
            try:
                dt = datetime.datetime.fromisoformat(text)
            except ValueError as e:
                why = "" if str(e).startswith("Invalid isoformat") else f"{e}; "  # (that one only repeats the text)
                raise ValueError(
                    f"not a time: {text!r} ({why}give ms since epoch or ISO-8601, e.g. 2024-09-19T08:00:30)"
                ) from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=datetime.timezone.utc)
            ms = (dt - _EPOCH) // datetime.timedelta(milliseconds=1)
    if not 0 <= ms <= _I64_MAX:
        raise ValueError(f"time {text!r} is out of range (1970-01-01 up to {_I64_MAX} ms)")
    if number and _SECONDS_LIKE[0] <= ms < _SECONDS_LIKE[1]:
        iso = datetime.datetime.fromtimestamp(ms, datetime.timezone.utc).isoformat()
        raise ValueError(f"time {text!r} looks like seconds since epoch ({iso}), not ms: give {ms * 1000} "
                         f"or an ISO-8601 time")
    return ms


# Epoch ms in [1e9, 1e11) fall in 1970-01-12 .. 1973-03-03, which no store
# holds; as seconds they are 2001 .. 5138: such a number is a mistake.
_SECONDS_LIKE = (10**9, 10**11)


def _wait_arg(wait_ms):
    """A long poll's *wait_ms* (an int or a float, ms) in [0, 2**63-1]: no
    NaN, infinity or negative wait. Raises MessageTypeError, ArgumentError."""
    if type(wait_ms) is int and 0 <= wait_ms <= _I64_MAX:
        return wait_ms
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)):
        raise MessageTypeError(f"wait_ms must be an int or a float (ms), got {type(wait_ms).__name__}")
    if not (math.isfinite(wait_ms) and 0 <= wait_ms <= _I64_MAX):
        raise ArgumentError(f"wait_ms must be in [0, {_I64_MAX}] ms, got {wait_ms}")
    return wait_ms


def _pull_args(queue_id, offset, max_count) -> tuple:
    """A pull's queue id (a Java int), queue offset (a long: outside the
    queue it is a status, not an error) and count (1 .. 2**31-1)."""
    return (
        _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX),
        _int_arg("offset", offset, _I64_MIN, _I64_MAX),
        _int_arg("max_count", max_count, 1, _I32_MAX),
    )


def _query_args(max_count, begin, end) -> tuple:
    """A key query's count and [begin, end] store-time range (ms, longs)."""
    max_count = _int_arg("max_count", max_count, 1, _I32_MAX)
    begin = _int_arg("begin", begin, _I64_MIN, _I64_MAX)
    end = _int_arg("end", end, _I64_MIN, _I64_MAX)
    if begin > end:
        raise ArgumentError(f"begin ({begin}) must not be after end ({end})")
    return max_count, begin, end

