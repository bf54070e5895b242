"""Pure-Python kernels: the twin of ``rmqstore/_core.pyx``.

Same names, same signatures, same results as the Cython core; selected with
``RMQSTORE_PURE_PYTHON=1`` (see ``rmqstore/_kernels.py``). Kernels work on raw
buffers (``mmap``, ``bytearray``, ``bytes``) at byte positions; they hold no
state, open no files and log nothing. Every read is bounds-checked against the
buffer (or a caller-given limit), so corrupt input can never read outside it;
chain walks are bounded, so they always end.

All multi-byte integers are big-endian (docs/format.md#conventions).
"""

from __future__ import annotations

import functools
import operator
import struct
import threading
import time
import weakref
import zlib
from typing import Any

from ._layout import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    CQ_STORE_UNIT_SIZE,
    CRC32_RESERVED_LEN,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    KEY_SEPARATOR,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    PRE_BLANK_SIZE,
    REC_BAD_MAGIC,
    REC_BAD_OFFSET,
    REC_BAD_SIZE,
    REC_BLANK,
    REC_BODY_CRC,
    REC_LENGTH_MISMATCH,
    REC_PROP_CRC,
    REC_TORN,
    REC_TRUNCATED,
    STOP_END,
    STOP_LIMIT,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
    TRANSACTION_NOT_TYPE,
)
from ._pure_message import MESSAGE_FIELDS, Message, MessageExt
from ._status import GetMessageStatus

__all__ = [
    "Message",
    "MessageExt",
    "MappedRegion",
    "MappedQueue",
    "CommitLogBase",
    "ConsumeQueueBase",
    "IndexRegion",
    "IndexServiceBase",
    "ReferenceResource",
    "StoreState",
    "StoreCore",
    "java_hash",
    "index_key_hash",
    "gets_consume_queue_unit",
    "tags_hash",
    "masked_crc32",
    "parse_properties",
    "record_size",
    "write_record",
    "append_dispatch",
    "encode_record",
    "check_record",
    "decode_record",
    "decode_columns",
    "decode_columns_at",
    "scan_records",
    "read_record",
    "read_store_timestamp",
    "cq_put",
    "cq_get",
    "cq_units",
    "cq_scan",
    "cq_search_time",
    "index_put",
    "index_put_keys",
    "index_select",
    "Appender",
    "AppendLock",
    "PutGate",
    "ReadGate",
    "pull_units",
    "pull_bounds",
    "read_keyed",
    "time_lookup",
    "query_keyed",
    "read_ext",
    "pull_views",
    "pull_messages",
]

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
_CQ_UNIT = struct.Struct(">qiq")
_INDEX_ENTRY = struct.Struct(">iqii")
_INDEX_HEADER = struct.Struct(">qqqqii")
_SIZE_MAGIC = struct.Struct(">ii")
_INT_MIN = -(1 << 31)
_INT_MAX = (1 << 31) - 1

# header up to and including BODYLENGTH, one Struct per (born, store) width
_HEADERS = {
    (bw, sw): struct.Struct(f">iiiiiqqiq{bw}sq{sw}siqi")
    for bw in (8, 20)
    for sw in (8, 20)
}


def _fields(*values_and_bits) -> None:
    """Check stored field values before anything is written (as the Cython
    core's conversions do): TypeError unless an int, OverflowError outside the
    field width."""
    for value, bits in values_and_bits:
        v = operator.index(value)
        if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
            raise OverflowError(f"{value} does not fit in a {bits}-bit field")


def _wrap32(v: int) -> int:
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def _check_unit_pos(buf, pos: int) -> None:
    n = len(buf)
    if pos < 0 or pos + CQ_STORE_UNIT_SIZE > n:
        raise ValueError(f"no ConsumeQueue unit at {pos} in a buffer of {n} bytes")


# --- hashing and checksums ------------------------------------------------


def java_hash(s: str) -> int:
    """Java ``String.hashCode()`` of *s*: 31-polynomial over UTF-16 code units.

    Characters outside the BMP count as two units (a surrogate pair).
    Returns a signed 32-bit int. Raises TypeError unless *s* is a str.
    """
    if not isinstance(s, str):
        raise TypeError(f"java_hash expects str, got {type(s).__name__}")
    h = 0
    if s.isascii():
        for c in s.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        data = s.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile key hash (``IndexFile.indexKeyHashMethod``): ``abs(java_hash)``,
    with 0 for ``Integer.MIN_VALUE`` (Java's ``Math.abs`` overflow). Always >= 0."""
    h = java_hash(key)
    return 0 if h == _INT_MIN else abs(h)


# --- dispatch rules (the put path's; rmqstore/dispatch.py has the same for the layers above) ---


def gets_consume_queue_unit(sys_flag: int) -> bool:
    """Whether a record with SYSFLAG *sys_flag* (an int) gets a ConsumeQueue
    unit (docs/recovery.md#dispatch): its transaction type (bits 2-3) is
    "not a transaction" or "commit"; prepared and rollback records get none.
    RocketMQ ``CommitLogDispatcherBuildConsumeQueue``. Raises TypeError
    unless *sys_flag* is an int."""
    tran = operator.index(sys_flag) & TRANSACTION_MASK
    return tran == TRANSACTION_NOT_TYPE or tran == TRANSACTION_COMMIT_TYPE


def tags_hash(tags) -> int:
    """The tags code of a unit outside ``SCHEDULE_TOPIC_XXXX`` (docs/format.md#tags-code):
    ``java_hash(tags)`` for a non-empty str, 0 for None or "". RocketMQ
    ``MessageExtBrokerInner.tagsString2tagsCode``. Raises TypeError for
    anything else."""
    if tags is None:
        return 0
    if not isinstance(tags, str):
        raise TypeError(f"java_hash expects str, got {type(tags).__name__}")
    return java_hash(tags) if tags else 0


def _index_keys(uniq, keys) -> list:
    """The keys a record is indexed under, in order (docs/format.md#building-the-index):
    its unique key, then each non-empty space-separated piece of its keys (str or None each)."""
    out = [uniq] if uniq else []
    if keys:
        out += [x for x in keys.split(KEY_SEPARATOR) if x]
    return out


def masked_crc32(data, start: int = 0, end: int = -1) -> int:
    """CRC-32 (IEEE, as ``zlib.crc32``) of ``data[start:end]`` masked with
    0x7FFFFFFF, as RocketMQ's ``UtilAll.crc32`` stores it. ``end=-1`` means the
    end of *data*. Raises ValueError for a range outside *data*."""
    n = len(data)
    if end < 0:
        end = n
    if not 0 <= start <= end <= n:
        raise ValueError(f"range [{start}, {end}) outside buffer of {n} bytes")
    with memoryview(data) as mv:
        return zlib.crc32(mv[start:end]) & 0x7FFFFFFF


# --- properties -----------------------------------------------------------


def parse_properties(blob) -> dict:
    """Decode a property blob exactly as RocketMQ's ``string2messageProperties``.

    Pairs are separated by 0x02 and split at their first 0x01; pairs with an
    empty name or value are dropped; a later duplicate wins. Returns a dict in
    stored order. Invalid UTF-8 is replaced (as Java's decoder does).
    """
    text = bytes(blob).decode("utf-8", "replace")
    out: dict = {}
    for seg in text.split("\x02"):
        i = seg.find("\x01")
        if i > 0 and i < len(seg) - 1:
            out[seg[:i]] = seg[i + 1 :]
    return out


# --- CommitLog records ----------------------------------------------------


def record_size(sys_flag: int, body_len: int, topic_len: int, props_len: int, v2: bool) -> int:
    """Length in bytes of a CommitLog record (RocketMQ ``calMsgLength``, docs/format.md#record-length)."""
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    return (
        68 + born + store + 4 + max(body_len, 0) + (2 if v2 else 1) + topic_len + 2 + max(props_len, 0)
    )


def _crc_digits(crc: int) -> bytes:
    return bytes(48 + (crc // 10**i) % 10 for i in range(10))


def _encoded_props_len(properties, append_crc: bool) -> int:
    n = len(properties)
    if append_crc:
        if n and properties[-1] != 2:
            n += 1
        n += CRC32_RESERVED_LEN
    return n


def write_record(
    buf,
    pos: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host,
    store_timestamp: int,
    store_host,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body,
    topic,
    properties,
    append_crc: bool,
) -> int:
    """Encode one CommitLog record into ``buf[pos:]`` (docs/format.md#commitlog-record) and return its size.

    *born_host* / *store_host* are the raw host fields (address bytes + i32
    port: 8 bytes for IPv4, 20 for IPv6) and must agree with the V6 bits of
    *sys_flag*; *topic* and *properties* are UTF-8 bytes; BODYCRC is computed
    here. v2 magic is used iff the topic is over 127 bytes. With *append_crc*
    the ``__CRC32#`` entry (docs/format.md#crc32-property) is appended over the finished record.

    Raises ValueError (nothing written) when the record does not fit in the
    buffer, a length is out of range or a host width disagrees with *sys_flag*.
    """
    _fields(
        (queue_id, 32), (flag, 32), (queue_offset, 64), (physical_offset, 64), (sys_flag, 32),
        (born_timestamp, 64), (store_timestamp, 64), (reconsume_times, 32), (prepared_transaction_offset, 64),
    )
    body, topic, properties = memoryview(body), memoryview(topic), memoryview(properties)
    bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    if len(born_host) != bw or len(store_host) != sw:
        raise ValueError("host field widths disagree with the sysflag V6 bits")
    topic_len = len(topic)
    if topic_len > MAX_TOPIC_LENGTH_V2:
        raise ValueError(f"topic of {topic_len} bytes is too long")
    v2 = topic_len > MAX_TOPIC_LENGTH_V1
    props_len = _encoded_props_len(properties, append_crc)
    if props_len > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties of {props_len} bytes exceed {MAX_PROPERTIES_LENGTH}")
    body_len = len(body)
    size = record_size(sys_flag, body_len, topic_len, props_len, v2)
    if size > _INT_MAX:
        raise ValueError(f"record of {size} bytes is too large")
    if pos < 0 or pos + size > len(buf):
        raise ValueError(f"record of {size} bytes does not fit at position {pos}")
    hdr = _HEADERS[(bw, sw)]
    # TOTALSIZE and the magic code go last (zeros until then), so a record torn
    # by a crash has no magic and recovery stops there
    head = _SIZE_MAGIC.pack(size, MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE)
    hdr.pack_into(
        buf,
        pos,
        0,
        0,
        0,  # BODYCRC, below: of the bytes written
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp,
        bytes(born_host),
        store_timestamp,
        bytes(store_host),
        reconsume_times,
        prepared_transaction_offset,
        body_len,
    )
    p = pos + hdr.size
    buf[p : p + body_len] = body
    if body_len:  # the CRC of what was written: a body changed meanwhile still makes a valid record
        with memoryview(buf) as mv:
            _I32.pack_into(buf, pos + 8, zlib.crc32(mv[p : p + body_len]) & 0x7FFFFFFF)
    p += body_len
    if v2:
        _I16.pack_into(buf, p, topic_len)
        p += 2
    else:
        buf[p] = topic_len
        p += 1
    buf[p : p + topic_len] = topic
    p += topic_len
    _I16.pack_into(buf, p, props_len)
    p += 2
    n = len(properties)
    buf[p : p + n] = properties
    p += n
    if append_crc:
        if n and properties[-1] != 2:
            buf[p] = 2
            p += 1
        with memoryview(buf) as mv:
            crc = zlib.crc32(mv[pos + 8 : p], zlib.crc32(head)) & 0x7FFFFFFF
        buf[p : p + CRC32_RESERVED_LEN] = b"__CRC32#\x01" + _crc_digits(crc) + b"\x02"
    buf[pos : pos + 8] = head
    return size


def append_dispatch(
    buf, pos: int, queue_id: int, flag: int, queue_offset: int, physical_offset: int, sys_flag: int,
    born_timestamp: int, born_host, store_timestamp: int, store_host, reconsume_times: int,
    prepared_transaction_offset: int, body, topic, properties, append_crc: bool,
    cq_buf, cq_pos: int, tags_code: int, index_buf, hash_slot_num: int, index_num: int, key_prefix: str, keys: list,
) -> int:
    """One put in one call (ASYNC_FLUSH's dispatch done at append time):
    ``write_record`` with the first 17 arguments, then the ConsumeQueue unit
    (``cq_put(cq_buf, cq_pos, physical_offset, size, tags_code)``), then, when
    *index_buf* is not None, ``index_put_keys(index_buf, hash_slot_num,
    index_num, key_prefix, keys, physical_offset, store_timestamp)``. Written
    in that order (what a crash leaves is a prefix recovery can finish).

    Returns the record size, or 0 with nothing written when the index file
    cannot take every key or its end physical offset is at or past
    *physical_offset* (the caller then takes the step-by-step path). Every
    check comes first: errors (as the three kernels raise them) write nothing.
    """
    _fields(
        (queue_id, 32), (flag, 32), (queue_offset, 64), (physical_offset, 64), (sys_flag, 32),
        (born_timestamp, 64), (store_timestamp, 64), (reconsume_times, 32), (prepared_transaction_offset, 64),
        (tags_code, 64),
    )
    if index_buf is not None:
        _check_keys(key_prefix, keys)
        if memoryview(index_buf).readonly:
            raise TypeError(f"argument must be read-write bytes-like object, not {type(index_buf).__name__}")
        _check_index_buf(index_buf, hash_slot_num, index_num)
        if physical_offset <= _I64.unpack_from(index_buf, 24)[0] or _index_count(index_buf) + len(keys) > index_num:
            return 0
    if memoryview(cq_buf).readonly:
        raise TypeError(f"argument must be read-write bytes-like object, not {type(cq_buf).__name__}")
    _check_unit_pos(cq_buf, cq_pos)
    size = write_record(
        buf, pos, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
        store_timestamp, store_host, reconsume_times, prepared_transaction_offset, body, topic, properties,
        append_crc,
    )
    cq_put(cq_buf, cq_pos, physical_offset, size, tags_code)
    if index_buf is not None:
        index_put_keys(index_buf, hash_slot_num, index_num, key_prefix, keys, physical_offset, store_timestamp)
    return size


def encode_record(
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host,
    store_timestamp: int,
    store_host,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body,
    topic,
    properties,
    append_crc: bool,
) -> bytes:
    """``write_record`` into a new buffer; returns the record's bytes."""
    _fields(
        (queue_id, 32), (flag, 32), (queue_offset, 64), (physical_offset, 64), (sys_flag, 32),
        (born_timestamp, 64), (store_timestamp, 64), (reconsume_times, 32), (prepared_transaction_offset, 64),
    )
    v2 = len(topic) > MAX_TOPIC_LENGTH_V1
    size = record_size(
        sys_flag, len(body), len(topic), _encoded_props_len(properties, append_crc), v2
    )
    out = bytearray(size)
    write_record(
        out, 0, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
        born_host, store_timestamp, store_host, reconsume_times,
        prepared_transaction_offset, body, topic, properties, append_crc,
    )
    return bytes(out)


def _find_crc_property(props: bytes):
    """The value of the last ``__CRC32#`` entry as an int, or None."""
    i = props.rfind(b"__CRC32#\x01")
    if i < 0 or (i > 0 and props[i - 1] != 2):
        return None
    digits = props[i + 9 : i + 19]
    if len(digits) != 10 or not digits.isdigit():
        return None
    return int(digits[::-1])


def check_record(buf, pos: int, limit: int, check_crc: bool, verify_prop_crc: int, max_size: int) -> int:
    """Validate the record at ``buf[pos:limit]`` (``checkMessageAndReturnSize``, docs/format.md#record-validation).

    Returns the record size (> 0) for a valid message, ``REC_BLANK`` (0) for
    the END_OF_FILE record, or a negative ``REC_*`` code (see ``_layout``).
    TOTALSIZE is checked against ``[MIN_RECORD_SIZE, max_size]`` and the bytes
    left before anything is read (docs/recovery.md#pitfall-unchecked-record-size). With *check_crc*, *verify_prop_crc*
    selects what is verified: 0 the body CRC; 1 the ``__CRC32#`` property
    instead, which must be present (RocketMQ's forceVerifyPropCRC); 2 the body
    CRC and, when the record ends with the store's ``__CRC32#`` entry, that too.
    With *check_crc* a non-empty property blob must also end with 0x02
    (``REC_TORN`` otherwise).
    """
    limit = min(limit, len(buf))
    remaining = limit - pos
    if pos < 0 or remaining < 8:
        return REC_TRUNCATED
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return REC_BLANK
    if magic == MESSAGE_MAGIC_CODE:
        tlw = 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        tlw = 2
    else:
        return REC_BAD_MAGIC
    if size < MIN_RECORD_SIZE or size > max_size:
        return REC_BAD_SIZE
    if size > remaining:
        return REC_TRUNCATED
    end = pos + size
    sys_flag = _I32.unpack_from(buf, pos + 36)[0]
    bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    p = pos + 68 + bw + sw  # BODYLENGTH
    if p + 4 > end:
        return REC_LENGTH_MISMATCH
    body_len = _I32.unpack_from(buf, p)[0]
    p += 4
    if body_len < 0 or p + body_len + tlw > end:
        return REC_BAD_SIZE if body_len < 0 else REC_LENGTH_MISMATCH
    body_start = p
    p += body_len
    topic_len = buf[p] if tlw == 1 else _I16.unpack_from(buf, p)[0]
    if tlw == 1 and topic_len > 127:
        return REC_BAD_SIZE  # Java reads a signed byte
    if topic_len < 0:
        return REC_BAD_SIZE
    p += tlw + topic_len
    if p + 2 > end:
        return REC_LENGTH_MISMATCH
    props_len = _I16.unpack_from(buf, p)[0]
    if props_len < 0:
        return REC_BAD_SIZE
    p += 2
    if p + props_len != end:
        return REC_LENGTH_MISMATCH
    if check_crc:
        # every RocketMQ writer ends a property blob with 0x02; without it the
        # record was cut short, which neither CRC may cover (topic, properties)
        if props_len > 0 and buf[end - 1] != 2:
            return REC_TORN
        if verify_prop_crc == 1:
            if props_len < CRC32_RESERVED_LEN:
                return REC_PROP_CRC
            stored = _find_crc_property(bytes(buf[p : end]))
            if stored is None or stored != masked_crc32(buf, pos, end - CRC32_RESERVED_LEN):
                return REC_PROP_CRC
        else:
            body_crc = _I32.unpack_from(buf, pos + 8)[0]
            if body_len > 0 and masked_crc32(buf, body_start, body_start + body_len) != body_crc:
                return REC_BODY_CRC
            if verify_prop_crc == 2:
                stored = _tail_crc_property(bytes(buf[p:end]))
                if stored is not None and stored != masked_crc32(buf, pos, end - CRC32_RESERVED_LEN):
                    return REC_PROP_CRC
    return size


def _tail_crc_property(props: bytes):
    """The value of a whole ``__CRC32#`` entry ending the blob (the store's own,
    appended last), or None."""
    t = len(props) - CRC32_RESERVED_LEN
    if t < 0 or (t > 0 and props[t - 1] != 2) or props[t : t + 9] != b"__CRC32#\x01" or props[-1] != 2:
        return None
    digits = props[t + 9 : t + 19]
    if not digits.isdigit():
        return None
    return int(digits[::-1])


def decode_record(buf, pos: int, with_body: bool) -> tuple:
    """Decode the record at *pos*, which ``check_record`` has accepted.

    Returns ``(total_size, magic, body_crc, queue_id, flag, queue_offset,
    physical_offset, sys_flag, born_timestamp, born_host, store_timestamp,
    store_host, reconsume_times, prepared_transaction_offset, body, topic,
    properties)``: hosts as raw field bytes (address + i32 port), body as bytes
    (None unless *with_body*), topic as str, properties as the raw blob bytes.
    Raises ValueError if the record is not well formed or leaves the buffer.
    """
    n = len(buf)
    if pos < 0 or pos + 8 > n:
        raise ValueError(f"no record at {pos}")
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or size < MIN_RECORD_SIZE or pos + size > n:
        raise ValueError(f"no valid record at {pos}")
    sys_flag = _I32.unpack_from(buf, pos + 36)[0]
    bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    hdr = _HEADERS[(bw, sw)]
    end = pos + size
    if pos + hdr.size > end:
        raise ValueError(f"record at {pos} is shorter than its header")
    f = hdr.unpack_from(buf, pos)
    body_len = f[14]
    p = pos + hdr.size
    if body_len < 0 or p + body_len > end:
        raise ValueError(f"record at {pos} has a bad body length")
    body = bytes(buf[p : p + body_len]) if with_body else None
    p += body_len
    if magic == MESSAGE_MAGIC_CODE:
        if p + 1 > end:
            raise ValueError(f"record at {pos} is truncated")
        topic_len = _I8.unpack_from(buf, p)[0]
        p += 1
    else:
        if p + 2 > end:
            raise ValueError(f"record at {pos} is truncated")
        topic_len = _I16.unpack_from(buf, p)[0]
        p += 2
    if topic_len < 0 or p + topic_len + 2 > end:
        raise ValueError(f"record at {pos} has a bad topic length")
    topic = bytes(buf[p : p + topic_len]).decode("utf-8", "replace")
    p += topic_len
    props_len = _I16.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len > end:
        raise ValueError(f"record at {pos} has a bad properties length")
    props = bytes(buf[p : p + props_len])
    return (
        size, magic, f[2], f[3], f[4], f[5], f[6], sys_flag, f[8], f[9], f[10], f[11],
        f[12], f[13], body, topic, props,
    )


# --- bulk decoding into columns --------------------------------------------

_FIXED_I64 = ("physical_offset", "queue_offset", "born_timestamp", "store_timestamp", "prepared_transaction_offset")
_FIXED_I32 = ("store_size", "queue_id", "flag", "sys_flag", "reconsume_times", "body_crc")
_STRINGS = ("topic", "born_host", "store_host", "msg_id", "tags", "keys", "unique_key")
_OPTIONAL = {b"TAGS": "tags", b"KEYS": "keys", b"UNIQ_KEY": "unique_key"}


def _split_properties(blob: bytes) -> dict:
    # parse_properties on bytes: 0x01/0x02 never occur inside a UTF-8
    # multi-byte sequence, so splitting raw bytes gives the same pairs
    out: dict = {}
    for seg in blob.split(b"\x02"):
        i = seg.find(b"\x01")
        if 0 < i < len(seg) - 1:
            out[seg[:i]] = seg[i + 1 :]
    return out


def _host_text(raw: bytes) -> bytes:
    port = _I32.unpack(raw[-4:])[0]
    addr = raw[:-4]
    if len(addr) == 4:
        return f"{addr[0]}.{addr[1]}.{addr[2]}.{addr[3]}:{port}".encode()
    groups = struct.unpack(">8H", addr)
    return ("[" + ":".join(f"{g:x}" for g in groups) + f"]:{port}").encode()


def _var_column(cols: dict, name: str, values: list) -> None:
    import numpy as np

    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    cols[name + "_offsets"] = offsets
    cols[name + "_data"] = np.frombuffer(b"".join(values), dtype=np.uint8).copy()


def decode_columns(
    buf, pos: int, end: int, base_offset: int, max_count: int, with_body: bool, with_properties: bool,
    check_crc: bool = False,
) -> tuple:
    """Decode consecutive CommitLog records of one file into columns.

    Reads records from byte *pos* of *buf* (one CommitLog file: mmap, bytes,
    memoryview) while they lie before *end*, at most *max_count* of them.
    *base_offset* is the physical offset of ``buf[0]`` (the file name); a
    record whose PHYSICALOFFSET differs from ``base_offset + position`` stops
    the scan with ``REC_BAD_OFFSET`` (pass -1 to skip that check). Every record
    is validated like ``check_record`` (with *check_crc*: body CRC, the store's
    ``__CRC32#`` when present, and the 0x02 terminator).

    Returns ``(next_pos, stop, cols)``. *stop* says why decoding ended at
    *next_pos*: ``STOP_LIMIT`` (1) max_count reached, ``STOP_END`` (2) *end*
    reached, ``REC_BLANK`` (0) an END_OF_FILE record or zeros (no more data in
    this file), or a negative ``REC_*`` code for an invalid record there.
    *cols* maps names to numpy arrays of n rows (n = records decoded):
    int64 physical_offset, queue_offset, born_timestamp, store_timestamp,
    prepared_transaction_offset; int32 store_size, queue_id, flag, sys_flag,
    reconsume_times, body_crc; Arrow-style string columns as ``<name>_offsets``
    (int32, n + 1) and ``<name>_data`` (uint8) for topic, born_host,
    store_host, msg_id (offset message id, docs/format.md#offset-msgid), tags, keys, unique_key
    (the last three with ``<name>_valid``, bool, False when the property is
    absent); with *with_body* ``body_offsets``/``body_data`` (the body as
    stored); with *with_properties* the property map as ``properties_offsets``
    (int32, n + 1, into the entries) and ``property_key_offsets``/
    ``property_key_data``, ``property_value_offsets``/``property_value_data``
    (RocketMQ's parsing rules: empty names or values dropped, a later
    duplicate replaces the earlier value in the earlier place). Strings are
    the stored bytes, not re-validated as UTF-8. Raises ValueError for
    positions outside the buffer or a negative *max_count*.
    """
    n_buf = len(buf)
    if pos < 0 or end < pos or pos > n_buf or max_count < 0:
        raise ValueError(f"bad range pos={pos} end={end} max_count={max_count} for a buffer of {n_buf} bytes")
    end = min(end, n_buf)
    out = _Columns(with_body, with_properties)
    stop = STOP_END
    while pos < end:
        if out.count >= max_count:
            stop = STOP_LIMIT
            break
        if end - pos >= 8 and _SIZE_MAGIC.unpack_from(buf, pos) == (0, 0):
            stop = REC_BLANK
            break
        code = check_record(buf, pos, end, check_crc, 2, end - pos)
        if code <= 0:
            stop = code
            break
        f = decode_record(buf, pos, with_body)
        if base_offset >= 0 and f[6] != base_offset + pos:
            stop = REC_BAD_OFFSET
            break
        out.add(buf, pos, f)
        pos += f[0]
    return pos, stop, out.columns()


def decode_columns_at(
    bufs: list, file_size: int, base: int, offsets: list, with_body: bool, with_properties: bool
) -> tuple:
    """``decode_columns`` for records at given physical offsets (a pull: the
    offsets of ConsumeQueue units) instead of consecutive ones.

    *bufs* are the CommitLog segments in order, each *file_size* bytes, the
    first at physical offset *base* (``CommitLog.segment_view()[:3]``);
    *offsets* a list of physical offsets. Each record is validated as a read
    does (``check_record`` with the body CRC, PHYSICALOFFSET equal to its offset).
    Returns ``(count, stop, cols)``: the first *count* offsets decoded into
    *cols* (as ``decode_columns``), *stop* ``STOP_END`` when all were, else
    the ``REC_*`` code of ``offsets[count]`` (``REC_BAD_OFFSET`` also for an
    offset outside the segments). Raises TypeError unless *bufs* and
    *offsets* are lists, ValueError for a file size that is not positive."""
    if type(bufs) is not list or type(offsets) is not list:
        raise TypeError("bufs and offsets must be lists")
    _fields((file_size, 64), (base, 64))
    if file_size <= 0:
        raise ValueError(f"file size {file_size} is not positive")
    out = _Columns(with_body, with_properties)
    for phy in offsets:
        _fields((phy, 64))
        i = (phy - base) // file_size
        if phy < base or i >= len(bufs):
            return out.count, REC_BAD_OFFSET, out.columns()
        buf, pos = bufs[i], phy - base - i * file_size
        f = read_record(buf, pos, len(buf), phy, len(buf), with_body)
        if type(f) is int:
            return out.count, f, out.columns()
        out.add(buf, pos, f)
    return out.count, STOP_END, out.columns()


class _Columns:
    """Rows of decoded records gathered into decode_columns' column arrays."""

    def __init__(self, with_body: bool, with_properties: bool):
        self.with_body, self.with_properties = with_body, with_properties
        self.count = 0
        self.i64: dict = {k: [] for k in _FIXED_I64}
        self.i32: dict = {k: [] for k in _FIXED_I32}
        self.strs: dict = {k: [] for k in _STRINGS}
        self.valid: dict = {k: [] for k in ("tags", "keys", "unique_key")}
        self.bodies: list = []
        self.prop_counts: list = []
        self.prop_keys: list = []
        self.prop_values: list = []

    def add(self, buf, pos: int, f: tuple) -> None:
        (size, _magic, body_crc, queue_id, flag, queue_offset, phy, sys_flag, born_ts, born_host, store_ts,
         store_host, reconsume, prepared, body, _topic, props) = f
        for k, v in zip(_FIXED_I64, (phy, queue_offset, born_ts, store_ts, prepared)):
            self.i64[k].append(v)
        for k, v in zip(_FIXED_I32, (size, queue_id, flag, sys_flag, reconsume, body_crc)):
            self.i32[k].append(v)
        pairs = _split_properties(props)
        strs = self.strs
        # the topic as stored, not decode_record's replaced text
        strs["topic"].append(_stored_topic(buf, pos))
        strs["born_host"].append(_host_text(born_host))
        strs["store_host"].append(_host_text(store_host))
        strs["msg_id"].append((store_host + _I64.pack(phy)).hex().upper().encode())
        for raw_name, col in _OPTIONAL.items():
            v = pairs.get(raw_name)
            self.valid[col].append(v is not None)
            strs[col].append(v if v is not None else b"")
        if self.with_body:
            self.bodies.append(body)
        if self.with_properties:
            self.prop_counts.append(len(pairs))
            self.prop_keys.extend(pairs.keys())
            self.prop_values.extend(pairs.values())
        self.count += 1

    def columns(self) -> dict:
        import numpy as np

        cols: dict = {k: np.array(v, dtype=np.int64) for k, v in self.i64.items()}
        cols.update({k: np.array(v, dtype=np.int32) for k, v in self.i32.items()})
        for k, v in self.strs.items():
            _var_column(cols, k, v)
        for k, v in self.valid.items():
            cols[k + "_valid"] = np.array(v, dtype=np.bool_)
        if self.with_body:
            _var_column(cols, "body", self.bodies)
        if self.with_properties:
            offsets = np.zeros(self.count + 1, dtype=np.int32)
            np.cumsum(self.prop_counts, out=offsets[1:])
            cols["properties_offsets"] = offsets
            _var_column(cols, "property_key", self.prop_keys)
            _var_column(cols, "property_value", self.prop_values)
        return cols


def _stored_topic(buf, pos: int) -> bytes:
    sys_flag = _I32.unpack_from(buf, pos + 36)[0]
    bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    p = pos + 68 + bw + sw
    body_len = _I32.unpack_from(buf, p)[0]
    p += 4 + body_len
    if _I32.unpack_from(buf, pos + 4)[0] == MESSAGE_MAGIC_CODE:
        tlen = buf[p]
        p += 1
    else:
        tlen = _I16.unpack_from(buf, p)[0]
        p += 2
    return bytes(buf[p : p + tlen])


def scan_records(
    buf, pos: int, end: int, base_offset: int, check_crc: bool, verify_prop_crc: int, max_size: int
) -> tuple:
    """Walk consecutive records of one CommitLog file from *pos* while they
    validate (``check_record`` with *check_crc*, *verify_prop_crc*,
    *max_size*, limited to *end*) and their PHYSICALOFFSET equals
    ``base_offset + position`` (not checked when *base_offset* is -1): the
    recovery scan of docs/recovery.md#recovery without a Python step per record.

    Returns ``(next_pos, status, count)``: where the walk stopped, why
    (``STOP_END`` when it reached *end*, ``REC_BLANK`` at an END_OF_FILE
    record, ``REC_BAD_OFFSET`` or another negative ``REC_*`` code at an
    invalid record) and how many records it passed. Raises ValueError for a
    range outside the buffer."""
    n = len(buf)
    if pos < 0 or end < pos or pos > n:
        raise ValueError(f"bad range pos={pos} end={end} for a buffer of {n} bytes")
    end = min(end, n)
    count = 0
    while pos < end:
        rc = check_record(buf, pos, end, check_crc, verify_prop_crc, max_size)
        if rc <= 0:
            return pos, rc, count
        if base_offset >= 0 and _I64.unpack_from(buf, pos + 28)[0] != base_offset + pos:
            return pos, REC_BAD_OFFSET, count
        pos += rc
        count += 1
    return pos, STOP_END, count


def read_record(buf, pos: int, limit: int, physical_offset: int, max_size: int, with_body: bool):
    """The record at *pos* if ``check_record(buf, pos, limit, True, 0,
    max_size)`` accepts it (its body CRC too: every read checks it, where
    RocketMQ only checks on recovery) and its PHYSICALOFFSET is
    *physical_offset*: the ``decode_record`` tuple. Otherwise the int status:
    ``REC_BLANK``, a negative ``REC_*`` code (``REC_BODY_CRC`` for a damaged
    body), or ``REC_BAD_OFFSET``. (A read by offset, as a pull does it, in
    one call.)"""
    _fields((physical_offset, 64))
    rc = check_record(buf, pos, limit, True, 0, max_size)
    if rc <= 0:
        return rc
    if _I64.unpack_from(buf, pos + 28)[0] != physical_offset:
        return REC_BAD_OFFSET
    return decode_record(buf, pos, with_body)


def read_store_timestamp(buf, pos: int) -> int:
    """STORETIMESTAMP of the record at *pos* (its position depends on the born
    host width). Returns -1 when the field lies outside the buffer."""
    n = len(buf)
    if pos < 0 or pos + 40 > n:
        return -1
    bw = 20 if _I32.unpack_from(buf, pos + 36)[0] & BORNHOST_V6_FLAG else 8
    p = pos + 48 + bw
    if p + 8 > n:
        return -1
    return _I64.unpack_from(buf, p)[0]


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


def _jdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


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


# --- IndexFile ------------------------------------------------------------


def _index_count(buf) -> int:
    c = _I32.unpack_from(buf, 36)[0]
    return c if c > 0 else 1


def index_put(buf, hash_slot_num: int, index_num: int, key: str, physical_offset: int, store_timestamp: int) -> bool:
    """Put *key* into the IndexFile held in *buf* (``IndexFile.putKey``, docs/format.md#index-put).

    Header, slot and entry are updated in place. Returns False when the file
    is full (``indexCount >= index_num``). Raises ValueError if *buf* is
    smaller than ``40 + 4*hash_slot_num + 20*index_num`` bytes.
    """
    _fields((physical_offset, 64), (store_timestamp, 64))
    _check_index_buf(buf, hash_slot_num, index_num)
    count = _index_count(buf)
    if count >= index_num:
        return False
    key_hash = index_key_hash(key)
    slot_pos = INDEX_HEADER_SIZE + (key_hash % hash_slot_num) * INDEX_HASH_SLOT_SIZE
    slot_value = _I32.unpack_from(buf, slot_pos)[0]
    if slot_value <= 0 or slot_value > count:
        slot_value = 0
    begin_ts = _I64.unpack_from(buf, 0)[0]
    if begin_ts <= 0:
        time_diff = 0
    else:
        time_diff = _jdiv(store_timestamp - begin_ts, 1000)
        time_diff = _INT_MAX if time_diff > _INT_MAX else max(time_diff, 0)
    entry_pos = INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE + count * INDEX_ENTRY_SIZE
    _INDEX_ENTRY.pack_into(buf, entry_pos, key_hash, physical_offset, time_diff, slot_value)
    _I32.pack_into(buf, slot_pos, count)
    if count <= 1:
        _I64.pack_into(buf, 16, physical_offset)
        _I64.pack_into(buf, 0, store_timestamp)
    if slot_value == 0:
        _I32.pack_into(buf, 32, _wrap32(_I32.unpack_from(buf, 32)[0] + 1))
    _I32.pack_into(buf, 36, _wrap32(count + 1))
    _I64.pack_into(buf, 24, physical_offset)
    _I64.pack_into(buf, 8, store_timestamp)
    return True


def index_put_keys(
    buf, hash_slot_num: int, index_num: int, prefix: str, keys: list, physical_offset: int, store_timestamp: int
) -> int:
    """Put ``prefix + key`` for each str in the list *keys*, in order, as
    ``index_put`` does (RocketMQ's ``topic#key`` entries of one record,
    docs/format.md#building-the-index). Stops at the first key the full file refuses; returns how many
    were stored. Writes nothing and returns -1 when *physical_offset* is below
    the header's end physical offset (the record is indexed already), -2
    when equal (it may be partly indexed: the caller decides). Raises
    TypeError unless *keys* is a list of str (checked before anything is
    written), ValueError as ``index_put``."""
    _fields((physical_offset, 64), (store_timestamp, 64))
    _check_keys(prefix, keys)
    _check_index_buf(buf, hash_slot_num, index_num)
    end_phy = _I64.unpack_from(buf, 24)[0]
    if physical_offset < end_phy:
        return -1
    if physical_offset == end_phy:
        return -2
    for i, key in enumerate(keys):
        if not index_put(buf, hash_slot_num, index_num, prefix + key, physical_offset, store_timestamp):
            return i
    return len(keys)


def _check_keys(prefix: str, keys: list) -> None:
    """Every key a str, before anything is written (TypeError otherwise)."""
    if type(keys) is not list:
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    java_hash(prefix)
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"java_hash expects str, got {type(key).__name__}")


def _check_index_buf(buf, hash_slot_num, index_num):
    need = INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE
    if hash_slot_num <= 0 or index_num <= 0 or len(buf) < need:
        raise ValueError(f"index buffer of {len(buf)} bytes is smaller than {need}")


def index_select(
    buf, hash_slot_num: int, index_num: int, key: str, max_num: int, begin: int, end: int, out: list
) -> None:
    """Append to *out* the physical offsets stored for *key* whose decoded time
    lies in [begin, end], newest first (``IndexFile.selectPhyOffset``, docs/format.md#index-lookup).

    Only the 32-bit key hash is compared (docs/recovery.md#pitfall-index-hash-collisions). Stops once ``len(out) >=
    max_num``. A corrupt chain cannot loop: the walk visits at most
    ``index_num`` entries and never leaves the entry area.
    """
    _check_index_buf(buf, hash_slot_num, index_num)
    count = _index_count(buf)
    key_hash = index_key_hash(key)
    slot_pos = INDEX_HEADER_SIZE + (key_hash % hash_slot_num) * INDEX_HASH_SLOT_SIZE
    n = _I32.unpack_from(buf, slot_pos)[0]
    if n <= 0 or n > count or count <= 1:
        return
    begin_ts = _I64.unpack_from(buf, 0)[0]
    base = INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE
    unpack = _INDEX_ENTRY.unpack_from
    for _ in range(index_num):
        if len(out) >= max_num or n >= index_num:
            break
        h, phy, diff, prev = unpack(buf, base + n * INDEX_ENTRY_SIZE)
        if diff < 0:
            break
        t = begin_ts + diff * 1000
        if h == key_hash and begin <= t <= end:
            out.append(phy)
        if prev <= 0 or prev > count or prev == n or t < begin:
            break
        n = prev


# --- the put path ---------------------------------------------------------


def _int(value, bits: int) -> int:
    """*value* as the field's integer (TypeError / OverflowError as _core's)."""
    v = operator.index(value)
    if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
        raise OverflowError(f"{v} does not fit in {bits} bits")
    return v


# the Message fields the put path reads
_SLOTS = MESSAGE_FIELDS


def _encoded(encoded) -> _Encoded | None:
    if encoded is not None and type(encoded) is not _Encoded:
        raise TypeError("encoded must be what check_all or check_columns returned")
    return encoded


def _for_columns(enc: _Encoded, topic, bodies) -> bool:
    """Whether check_columns made *enc* for this topic and bodies column."""
    return enc.topic is not None and enc.topic is topic and enc.of is bodies and len(enc.encodings) == len(bodies)


class _Encoded:
    """What Appender.check_all encoded of one list of messages (*of*, its
    items as a tuple), or check_columns of one set of columns (*of* the
    bodies list, *topic* theirs): _encode's tuple per item, None where none."""

    __slots__ = ("of", "encodings", "topic")

    def __init__(self, of, encodings: list, topic=None):
        self.of, self.encodings, self.topic = of, encodings, topic


def _placeholder_of(topic_b):
    """check_all's and check_columns' stand-in binding for the unbound
    queues of a topic: ``(topic_b, None, None)`` (no binding is it, so
    put_batch / put_columns encode its messages afresh once a queue is
    bound), None unless *topic_b* is bytes (the store refuses the topic)."""
    return (topic_b, None, None) if type(topic_b) is bytes else None


def _one_call_at_a_time(method):
    """An Appender put call refused while another one runs (the store makes
    them under its append lock, so on this thread): a put started by Python
    code inside one (a finalizer, a signal handler, the store's clock) gets
    a RuntimeError, as in the core (whose calls keep the files' positions in
    C until they end); the store's lock is reentrant (RocketMQ's), so only
    this catches it."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self._entered:
            raise RuntimeError("a put started inside another put of this store (from a finalizer, "
                               "a signal handler or the store's clock) is refused")
        self._entered = True
        try:
            return method(self, *args, **kwargs)
        finally:
            self._entered = False

    return call


class Appender:
    """ASYNC_FLUSH put path of one writable store: ``put(msg, store_timestamp)``
    validates and encodes a :class:`~rmqstore.message.Message`, writes its
    CommitLog record, its ConsumeQueue unit and its index keys
    (``append_dispatch``'s bytes and order) and returns the
    ``PutMessageResult`` in one call.

    The caller binds the files a put may write, all of them the last of
    their kind, and rebinds after anything else writes them:
    ``bind_commit_log(mapped_file)`` (attributes ``mm``, ``file_from_offset``,
    ``file_size``, ``wrote_position``), ``bind_index(index_file)`` (``mm``,
    ``hash_slot_num``, ``index_num``) and, per queue, ``bind_queue(topic,
    queue_id, topic_bytes, consume_queue, mapped_file)`` (the queue's
    ``max_physic_offset``; *topic_bytes* the validated UTF-8 topic, *None*
    for *mapped_file* unbinds). ``unbind()`` drops every binding. Positions
    are read from and written back to those objects on each put, and
    *queue_offsets* (the store's ``{(topic, queue_id): next queue offset}``)
    is read and advanced, so the Python layer's view stays exact.

    The queue offset a put takes is the index of the unit it writes (the
    queue file's offset plus write position, over 20), as ConsumeQueue
    layout defines it; *queue_offsets* is advanced to match.

    ``put`` returns None, having written nothing, whenever the store's
    step-by-step path must take the message: a message whose type is not
    exactly *message_type* (a subclass may redefine attributes) or with a
    slot never set, an unbound queue or no bound
    CommitLog file, a record that does not fit the file (a roll), a full
    index file, a transactional prepared/rollback message, a message with
    its own born/store host, or anything the step-by-step path rejects
    (types, sizes, a shorthand contradicting its property): that path
    raises the typed error. It raises only for bound files that are not
    writable or smaller than their size (TypeError, ValueError).

    Not thread-safe: its callers serialize their calls (the store's append
    lock). The core keeps a call's file bytes and positions in C and writes
    the positions back when the call ends; a put made from within a call
    (by *clock*, or a property of a bound file, writing to the same store)
    gets a RuntimeError from the core, and no collection runs within
    ``put_batch`` there (a finalizer could be such a put).

    Args (constructor):
        message_type (type): the Message class whose instances go the fast
            way (exactly that class, or either implementation's Message here;
            the core takes only its own Message).
        result_type (type): a tuple subclass built as ``(ok_status, msg_id,
            physical_offset, size, queue_offset, store_timestamp)``.
        ok_status: its first field.
        store_host (bytes): raw store host field (8 bytes, 20 for IPv6).
        append_crc (bool): append the ``__CRC32#`` property.
        max_message_size (int): bodies above this many bytes go the
            step-by-step way (which refuses them).
        index_enable (bool): index UNIQ_KEY and KEYS.
        queue_offsets (dict): shared with the caller, see above.
    """

    def __init__(self, message_type, result_type, ok_status, store_host, append_crc, max_message_size,
                 index_enable, queue_offsets, host_bytes=None):
        if not isinstance(message_type, type) or not isinstance(result_type, type) or \
                not issubclass(result_type, tuple):
            raise TypeError("message_type must be a class and result_type a tuple subclass")
        if type(store_host) is not bytes or len(store_host) not in (8, 20):
            raise ValueError("store_host must be the raw 8- or 20-byte host field")
        if not isinstance(queue_offsets, dict):
            raise TypeError("queue_offsets must be a dict")
        self._message_type: Any = message_type
        from .message import MESSAGE_TYPES  # (message imports this module)

        # either implementation's Message: the twin reads public attributes
        self._fast_types = frozenset((message_type, *MESSAGE_TYPES))
        self._result_type = result_type
        self._ok = ok_status
        self._store_host = store_host
        self._append_crc = bool(append_crc)
        self._max_message_size = operator.index(max_message_size)
        self._index_enable = bool(index_enable)
        self._entered = False  # inside a call (see _one_call_at_a_time)
        self._queue_offsets = queue_offsets
        self._host_bytes = host_bytes
        self._queues: dict = {}
        self._commit: Any = None  # the bound MappedFile
        self._index: Any = None  # the bound IndexFile

    def bind_commit_log(self, mapped_file) -> None:
        self._commit = mapped_file

    def bind_index(self, index_file) -> None:
        if index_file is not None:
            _check_index_buf(index_file.mm, index_file.hash_slot_num, index_file.index_num)
        self._index = index_file

    def bind_queue(self, topic, queue_id, topic_bytes, consume_queue, mapped_file) -> None:
        if type(topic_bytes) is not bytes:
            raise TypeError("topic_bytes must be bytes")
        if mapped_file is None:
            self._queues.pop((topic, queue_id), None)
        else:
            self._queues[(topic, queue_id)] = (topic_bytes, consume_queue, mapped_file)

    def unbind(self) -> None:
        self._queues.clear()
        self._commit = self._index = None

    def _properties(self, msg):
        """(blob, tags, keys, unique key) as Message.property_map and
        encode_properties make them, or None where those would raise."""
        tags, keys, uniq = msg.tags, msg.keys, msg.unique_key
        pairs = []
        seen = set()
        props = msg.properties
        if props is not None:
            if type(props) is not dict:
                return None
            for name, value in props.items():
                if type(name) is not str or type(value) is not str:
                    return None
                if name in ("TAGS", "KEYS", "UNIQ_KEY"):
                    given = {"TAGS": tags, "KEYS": keys, "UNIQ_KEY": uniq}[name]
                    if given is not None and given != value:
                        return None
                    seen.add(name)
                    if name == "TAGS":
                        tags = value
                    elif name == "KEYS":
                        keys = value
                    else:
                        uniq = value
                elif self._append_crc and name == "__CRC32#":
                    continue
                pairs.append((name, value))
        for name, value in (("TAGS", tags), ("KEYS", keys), ("UNIQ_KEY", uniq)):
            if value is not None and name not in seen:
                if type(value) is not str:
                    return None
                pairs.append((name, value))
        try:
            blob = "".join([f"{n}\x01{v}\x02" for n, v in pairs]).encode("utf-8")
        except UnicodeError:
            return None
        # an empty name or a separator inside one (the message's attributes
        # may have changed since it was made): the step-by-step path raises
        if blob.count(1) != len(pairs) or blob.count(2) != len(pairs) or not all(n for n, _ in pairs):
            return None
        if len(blob) > MAX_PROPERTIES_LENGTH:
            return None
        return blob, tags, keys, uniq

    def _encode(self, msg: Any, unbound=None):
        """What a put takes from the message alone, or None when it is not
        for this path: (key, bound, sys_flag, fields, blob, tags,
        index_keys, body, body_len, size), *bound* the queue's binding.
        With *unbound* (check_all's placeholders by topic), a message of an
        unbound queue is encoded against its topic's placeholder, and no
        CommitLog or index file need be bound."""
        if (self._commit is None and unbound is None) or type(msg) not in self._fast_types:
            return None  # (subclasses may redefine attributes: step by step)
        try:
            for name in _SLOTS:
                getattr(msg, name)
        except AttributeError:  # a slot never set
            return None
        # exact types only (the core reads the slots without a reference
        # of its own, so no user code may run mid-encode); others go step by step
        if not (type(msg.topic) is str and type(msg.queue_id) is int and type(msg.flag) is int and
                type(msg.reconsume_times) is int and type(msg.sys_flag) is int and
                type(msg.prepared_transaction_offset) is int and
                (msg.born_timestamp is None or type(msg.born_timestamp) is int) and
                (msg.tags is None or type(msg.tags) is str) and (msg.keys is None or type(msg.keys) is str) and
                (msg.unique_key is None or type(msg.unique_key) is str)):
            return None
        key = (msg.topic, msg.queue_id)
        bound = self._queues.get(key)
        if bound is None and unbound is not None:
            bound = unbound.get(msg.topic)
        born, store = self._host(msg.born_host), self._host(msg.store_host)
        if bound is None or born is None or store is None:
            return None
        try:
            sys_flag = _int(msg.sys_flag, 32) & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
            fields = (
                _int(msg.queue_id, 32), _int(msg.flag, 32), _int(msg.reconsume_times, 32),
                _int(msg.prepared_transaction_offset, 64),
                None if msg.born_timestamp is None else _int(msg.born_timestamp, 64),
            )
        except (TypeError, OverflowError):
            return None
        if not gets_consume_queue_unit(sys_flag):
            return None  # transactional prepared / rollback: no queue unit, step by step
        if len(born) == 20:
            sys_flag |= BORNHOST_V6_FLAG
        if len(store) == 20:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        encoded = self._properties(msg)
        if encoded is None:
            return None
        blob, tags, keys, uniq = encoded
        props_field = _encoded_props_len(blob, self._append_crc)
        if props_field > MAX_PROPERTIES_LENGTH:
            return None
        index_keys: list = []
        if self._index_enable:
            if self._index is None and unbound is None:
                return None
            index_keys = _index_keys(uniq, keys)
        body = msg.body
        try:
            if type(body) is not bytes:  # one snapshot of a mutable body: its size and bytes agree
                body = bytes(memoryview(body))
            body_len = len(body)
        except (TypeError, BufferError):
            return None
        topic_b = bound[0]
        size = record_size(sys_flag, body_len, len(topic_b), props_field, len(topic_b) > MAX_TOPIC_LENGTH_V1)
        return key, bound, sys_flag, fields + (born, store), blob, tags, index_keys, body, body_len, size

    def _host(self, host):
        """The raw host a message's born_host / store_host stands for: the
        store's for None, ``host_bytes(host)`` for a str (8 or 20 bytes),
        else None (the step-by-step path encodes it, or raises its error)."""
        if host is None:
            return self._store_host
        if type(host) is not str or self._host_bytes is None:
            return None
        try:
            raw = self._host_bytes(host)
        except Exception:  # noqa: BLE001 (whatever it raises, the step-by-step path raises in order)
            return None
        return raw if type(raw) is bytes and len(raw) in (8, 20) else None

    def _checked(self, msg: Any, unbound=None, file_size=0):
        """_encode's tuple for a message :meth:`check` takes, else None (with
        check_all's *unbound*, a record must fit *file_size* where no
        CommitLog file is bound)."""
        e = self._encode(msg, unbound)
        limit = self._commit.file_size if self._commit is not None else file_size
        return e if e is not None and e[8] <= self._max_message_size and e[9] + 8 <= limit else None

    def check(self, msg: Any) -> bool:
        """True when ``put`` takes *msg* wherever the files stand, that is:
        the message is valid and fits in an empty CommitLog file (for
        callers that validate a batch before writing any of it)."""
        return self._checked(msg) is not None

    def check_all(self, msgs, topic_bytes=None, file_size=None) -> tuple:
        """:meth:`check` of each message of the list *msgs* (TypeError unless
        a list): ``(the indices it refuses, in order, what it encoded)``.
        Pass the second to :meth:`put_batch` on the same list, which then
        encodes each message no second time: a message is read once, when
        checked.

        With *topic_bytes* (a callable) and *file_size* (ints; both or
        neither, else TypeError), a message is checked as if its queue and
        the CommitLog file were bound: against the topic's UTF-8 bytes as
        ``topic_bytes(topic)`` gives them (called once per topic of an
        unbound queue; anything but bytes: the store refuses the topic, and
        so does this) and a CommitLog file of *file_size* bytes. What it
        takes that way is valid (the step-by-step path would take it too),
        and put_batch encodes it afresh once its queue is bound: a batch's
        first message of a new queue goes step by step, which binds the
        queue, and the rest of that queue's messages follow in put_batch."""
        if type(msgs) is not list:
            raise TypeError("msgs must be a list")
        if (topic_bytes is None) != (file_size is None):
            raise TypeError("topic_bytes and file_size go together")
        unbound: dict | None = None if topic_bytes is None else {}
        size = 0 if file_size is None else operator.index(file_size)
        encodings = []
        for m in msgs:
            e = self._checked(m, unbound, size)
            # a new queue's topic: learnt, then checked again
            if e is None and unbound is not None and self._placeholder(m, topic_bytes, unbound):
                e = self._checked(m, unbound, size)
            encodings.append(e)
        enc = _Encoded(tuple(msgs), encodings)
        return [i for i, e in enumerate(enc.encodings) if e is None], enc

    def plan(self, encoded, always=False):
        """What the messages *encoded* (:meth:`check_all` or
        :meth:`check_columns`' second result) need of the files, for the
        store to make every file a batch needs before it writes any of it:
        ``[total record bytes, the largest record's bytes, records,
        {(topic, queue_id): records}, index keys]`` over the messages it
        encoded (the store adds the others). None, unless *always*, when
        the bound files take them all as they stand (no roll, no new queue
        or file), as the next put call would find them; call it under the
        lock the puts take."""
        enc = _encoded(encoded)
        if enc is None:
            raise TypeError("encoded must be what check_all or check_columns returned")
        total = biggest = count = n_keys = 0
        counts: dict = {}
        fits = self._commit is not None
        for e in enc.encodings:
            if e is None:
                continue
            key, bound, size = e[0], e[1], e[9]
            total += size
            biggest = max(biggest, size)
            count += 1
            n_keys += len(e[6])
            counts[key] = counts.get(key, 0) + 1
            if self._queues.get(key) is not bound:  # a new queue, or rebound since
                fits = False
        if fits:
            for key, n in counts.items():
                cmf = self._queues[key][2]
                pos = cmf.wrote_position
                room = (cmf.file_size - pos) // CQ_STORE_UNIT_SIZE if 0 < pos <= cmf.file_size else 0
                if n > room:
                    fits = False
                    break
        if fits:
            fits = total + 8 <= self._commit.file_size - self._commit.wrote_position  # END_FILE_MIN_BLANK_LENGTH
        if fits and self._index_enable and n_keys:
            index = self._index
            fits = index is not None and _index_count(index.mm) + n_keys <= index.index_num
        return None if fits and not always else [total, biggest, count, counts, n_keys]

    def _placeholder(self, msg, topic_bytes, unbound: dict) -> bool:
        """After check_all refused *msg*: when its queue (an exact str topic,
        an exact int queue id) is not bound, a placeholder binding for its
        topic in *unbound*, made once per topic (:func:`_placeholder_of`);
        True when it made one (check the message again)."""
        if type(msg) not in self._fast_types:
            return False
        topic, queue_id = getattr(msg, "topic", None), getattr(msg, "queue_id", None)
        if type(topic) is not str or type(queue_id) is not int:
            return False
        if topic in unbound or (topic, queue_id) in self._queues:
            return False
        unbound[topic] = _placeholder_of(topic_bytes(topic))
        return unbound[topic] is not None

    def _bound(self, e):
        """*e* (an encoding kept by check_all / check_columns) while its
        queue is bound as when it was made, else None."""
        return e if e is not None and self._queues.get(e[0]) is e[1] else None

    @_one_call_at_a_time
    def put_batch(self, msgs, start, clock, results: list, encoded=None):
        """:meth:`put` of ``msgs[start:]`` (a list) in order, each stamped by
        one reading of *clock* (None: the wall clock, ms since the epoch)
        taken before its put, each result appended to *results*. Stops at
        the first message ``put`` declines and returns ``(its index, the
        reading it got)`` for the step-by-step path to use;
        ``(len(msgs), None)`` when none declines, ``(start, None)`` with no
        bound CommitLog file. One put call's semantics per message: the
        core holds the files' bytes once for the whole batch.

        *encoded* (None, or :meth:`check_all`'s second result for this
        list): a message still at its index whose queue is bound as it was
        when checked is written as it was encoded then; any other is
        encoded afresh. TypeError for anything else."""
        if type(msgs) is not list:
            raise TypeError("msgs must be a list")
        enc = _encoded(encoded)
        if enc is not None and (enc.topic is not None or len(enc.of) != len(msgs)):
            enc = None  # (another list's)
        i = operator.index(start)
        if self._commit is None or i >= len(msgs):
            return i, None
        while i < len(msgs):
            ts = _wall_ms() if clock is None else clock()
            msg = msgs[i]
            e = self._bound(enc.encodings[i]) if enc is not None and msg is enc.of[i] else None
            if e is None:
                e = self._encode(msg)
            r = None if e is None else self._write(e, ts)
            if r is None:
                return i, ts
            results.append(r)
            i += 1
        return i, None

    @_one_call_at_a_time
    def put(self, msg: Any, store_timestamp):
        e = self._encode(msg)
        return None if e is None else self._write(e, store_timestamp)

    def _write(self, e: tuple, store_timestamp):
        """put of what _encode made of a message."""
        key, (topic_b, cq, cmf), sys_flag, fields, blob, tags, index_keys, body, body_len, size = e
        if self._index_enable and self._index is None:
            return None
        queue_id, flag, reconsume, prepared, born_ts, born_host, store_host = fields
        try:
            store_ts = _int(store_timestamp, 64)
        except (TypeError, OverflowError):
            return None
        if born_ts is None:
            born_ts = store_ts
        if body_len > self._max_message_size:
            return None
        mf = self._commit
        pos = mf.wrote_position
        if pos < 0 or size + 8 > mf.file_size - pos:  # END_FILE_MIN_BLANK_LENGTH
            return None
        # the next queue offset is the next unit's index, as the last file's
        # position says (queue_offsets holds the same; it is written back)
        cq_pos = cmf.wrote_position
        if cq_pos <= 0 or cq_pos > cmf.file_size - CQ_STORE_UNIT_SIZE or cq_pos % CQ_STORE_UNIT_SIZE:
            return None
        qo = (cmf.file_from_offset + cq_pos) // CQ_STORE_UNIT_SIZE
        phy = mf.file_from_offset + pos
        if phy + size <= cq.max_physic_offset:
            return None
        if len(mf.mm) < mf.file_size or len(cmf.mm) < cmf.file_size:
            raise ValueError("a bound file is smaller than its file size")
        index = self._index if self._index_enable else None
        wrote = append_dispatch(
            mf.mm, pos, queue_id, flag, qo, phy, sys_flag, born_ts, born_host, store_ts, store_host, reconsume,
            prepared,
            body, topic_b, blob, self._append_crc, cmf.mm, cq_pos, tags_hash(tags),
            None if index is None else index.mm, 0 if index is None else index.hash_slot_num,
            0 if index is None else index.index_num, key[0] + "#", index_keys,
        )
        if not wrote:
            return None  # the index file cannot take every key here
        mf.wrote_position = pos + size
        cmf.wrote_position = cq_pos + CQ_STORE_UNIT_SIZE
        cq.max_physic_offset = phy + size
        self._queue_offsets[key] = qo + 1
        msg_id = (store_host + _I64.pack(phy)).hex().upper()
        return tuple.__new__(self._result_type, (self._ok, msg_id, phy, size, qo, store_ts))


    # columns: one Message per row, through check and put

    def _row(self, topic, bodies, queue_ids, tags, keys, unique_keys, i):
        body, qid = bodies[i], queue_ids[i]
        values = [None if c is None else c[i] for c in (tags, keys, unique_keys)]
        if type(body) not in (bytes, bytearray, memoryview) or type(qid) is not int:
            return None
        if any(v is not None and type(v) is not str for v in values):
            return None
        try:
            return self._message_type(topic, body, queue_id=qid, tags=values[0], keys=values[1],
                                      unique_key=values[2])
        except (TypeError, ValueError):  # the typed errors Message raises derive from these
            return None

    def check_columns(self, topic, bodies, queue_ids, tags, keys, unique_keys, start, encoded=None,
                      topic_bytes=None, file_size=None) -> tuple:
        """:meth:`check` over rows ``start..`` of columns (lists of one length:
        *bodies* bytes-like, *queue_ids* ints, *tags*/*keys*/*unique_keys*
        None or lists of str/None), each row the Message of those fields:
        returns ``(the index of the first row check refuses, or len(bodies)
        when none; what it encoded)``. Pass the second back to go on after
        a refused row (*encoded*: this call adds to it), and then to
        :meth:`put_columns`, which encodes no row twice. TypeError for
        columns that are not such lists.

        *topic_bytes* and *file_size*: as for :meth:`check_all` (rows of an
        unbound queue checked against ``topic_bytes(topic)``, asked once per
        call for a str topic, and a CommitLog file of *file_size* bytes
        where none is bound); put_columns writes such rows once their queue
        is bound."""
        _check_columns(bodies, queue_ids, tags, keys, unique_keys)
        if (topic_bytes is None) != (file_size is None):
            raise TypeError("topic_bytes and file_size go together")
        enc = _encoded(encoded)
        if enc is None or not _for_columns(enc, topic, bodies):
            enc = _Encoded(bodies, [None] * len(bodies), topic)
        unbound: dict | None = None
        if topic_bytes is not None:
            unbound = {topic: _placeholder_of(topic_bytes(topic) if type(topic) is str else None)}
        size = 0 if file_size is None else operator.index(file_size)
        i = operator.index(start)
        while i < len(bodies):
            m = self._row(topic, bodies, queue_ids, tags, keys, unique_keys, i)
            e = None if m is None else self._checked(m, unbound, size)
            if e is None:
                break
            if enc.encodings[i] is None:
                enc.encodings[i] = e
            i += 1
        return i, enc

    @_one_call_at_a_time
    def put_columns(self, topic, bodies, queue_ids, tags, keys, unique_keys, start, store_timestamp,
                    physical_offsets, sizes, queue_offsets, encoded=None) -> int:
        """:meth:`put` of rows ``start..`` of columns (see :meth:`check_columns`),
        all with *store_timestamp* (RocketMQ stamps a batch once), each
        result's physical offset, size and queue offset stored at its row of
        the three int64 arrays; stops at the first row ``put`` declines and
        returns its index (len(bodies) when none). ValueError for output
        arrays shorter than the columns. *encoded*: check_columns' for these
        columns (rows it kept are written as encoded then, while their queue
        is bound as it was), or None."""
        _check_columns(bodies, queue_ids, tags, keys, unique_keys)
        enc = _encoded(encoded)
        if enc is not None and not _for_columns(enc, topic, bodies):
            enc = None
        n = len(bodies)
        outs = [memoryview(a).cast("B") for a in (physical_offsets, sizes, queue_offsets)]
        if any(len(o) < n * 8 for o in outs):
            raise ValueError("the output arrays must hold len(bodies) int64 values")
        po, so, oo = (o.cast("q") for o in outs)
        i = operator.index(start)
        while i < n:
            e = None if enc is None else self._bound(enc.encodings[i])
            if e is None:
                m = self._row(topic, bodies, queue_ids, tags, keys, unique_keys, i)
                e = None if m is None else self._encode(m)
            r = None if e is None else self._write(e, store_timestamp)
            if r is None:
                break
            po[i], so[i], oo[i] = r[2], r[3], r[4]
            i += 1
        return i


class AppendLock:
    """The store's append lock (RocketMQ's ``PutMessageReentrantLock``):
    reentrant, with ``acquire(blocking=True)``, ``release()`` and the
    context manager protocol; ``release`` by a thread that does not hold it
    raises RuntimeError. The twin wraps ``threading.RLock``. The core's is
    its own, so that its ``PutGate`` takes it in C (``RLock.acquire`` parses
    its arguments on every call); a thread waiting for it releases the GIL
    and runs signal handlers, as ``RLock`` waiters do."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def acquire(self, blocking=True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()


class MappedRegion:
    """A mapped segment as the kernels read and write it: ``mm`` (the
    mapping, any buffer), ``file_from_offset`` (offset of its byte 0 in its
    log), ``file_size`` (bytes) and ``wrote_position`` (bytes appended,
    relative to the file). ``MappedFile`` is a MappedRegion with the file's
    lifecycle; the core has the same class, with C fields."""

    __slots__ = ("mm", "file_from_offset", "file_size", "wrote_position")

    def __init__(self, mm=None, file_from_offset=0, file_size=0, wrote_position=0) -> None:
        self.mm: Any = mm
        self.file_from_offset: int = operator.index(file_from_offset)
        self.file_size: int = operator.index(file_size)
        self.wrote_position: int = operator.index(wrote_position)


class MappedQueue:
    """The segments of one log as the kernels walk them: ``files`` (a list
    of :class:`MappedRegion`, in offset order) and ``file_size`` (bytes per
    segment; None for a read-only queue not yet sized). ``MappedFileQueue``
    (RocketMQ's ``MappedFileQueue``) is a MappedQueue with a directory; the
    core has the same class, with C fields."""

    __slots__ = ("files", "file_size")

    def __init__(self) -> None:
        self.files: list = []
        self.file_size: Any = None


class CommitLogBase:
    """A CommitLog as the read kernels use it: ``queue`` (its
    :class:`MappedQueue`) and ``max_record_size`` (the largest record, in
    bytes, a check accepts). ``CommitLog`` is a CommitLogBase with recovery
    and the walks; the core has the same class, with C fields."""

    __slots__ = ("queue", "max_record_size")

    def __init__(self) -> None:
        self.queue: Any = None
        self.max_record_size = 0


class ConsumeQueueBase:
    """A ConsumeQueue as the kernels use it: ``queue`` (its
    :class:`MappedQueue`), ``min_logic_offset`` (byte offset of the first
    valid unit), ``max_physic_offset`` (physical offset past the last
    unit's record, -1: none; the put kernel advances it), ``topic`` and
    ``queue_id``. ``ConsumeQueue`` is a ConsumeQueueBase with recovery and
    the searches; the core has the same class, with C fields."""

    __slots__ = ("queue", "min_logic_offset", "max_physic_offset", "topic", "queue_id")

    def __init__(self) -> None:
        self.queue: Any = None
        self.min_logic_offset = self.max_physic_offset = self.queue_id = 0
        self.topic: Any = None


class IndexRegion:
    """An IndexFile as the kernels use it: ``mm`` (the mapping) and its
    geometry, ``hash_slot_num`` and ``index_num``. ``IndexFile`` is an
    IndexRegion with a path and a header; the core has the same class, with
    C fields."""

    __slots__ = ("mm", "hash_slot_num", "index_num")

    def __init__(self) -> None:
        self.mm: Any = None
        self.hash_slot_num = self.index_num = 0


class IndexServiceBase:
    """The index as a lookup uses it: ``files`` (:class:`IndexRegion`
    objects, oldest first) and ``max_msgs_num_batch`` (the most offsets one
    lookup reads, RocketMQ's ``maxMsgsNumBatch``). ``IndexService`` is an
    IndexServiceBase with rolling and recovery; the core has the same
    class, with C fields."""

    __slots__ = ("files", "max_msgs_num_batch")

    def __init__(self) -> None:
        self.files: list = []
        self.max_msgs_num_batch = 0


class ReferenceResource:
    """Reader references over a store's mapped files (RocketMQ's
    ``ReferenceResource``, taken per read operation instead of per file).

    A reader calls :meth:`hold` before it looks up files and :meth:`release`
    after its last byte is copied out (one pair per pull or lookup, never per
    message). Clean-up calls :meth:`acquire_exclusive`: new holds wait, and
    the clean-up proceeds once the references held drain to zero, so no file
    is removed from a queue or unmapped while a reader may be inside it. When
    they do not drain in time the clean-up gives up for this round
    (RocketMQ's failed ``destroy``) and retries later. There is no forced
    unmapping: Python refuses to unmap memory a view still exports
    (BufferError), and a mapping closed between two reads of a pull would
    make that pull fail; the forcible interval only unlinks the file early
    (see ``retention``).

    The store's ``close()`` calls :meth:`shutdown` before it unmaps: from
    then on every :meth:`hold` raises StoreClosedError (holds waiting for a
    clean-up too), clean-ups are refused, and it waits for the readers
    inside to leave.

    Holds are not re-entrant: a thread must not hold twice at once (a
    clean-up waiting between the two would wait for this thread until its
    timeout). The core has the same class and methods, its count and flags
    in C fields.
    """

    __slots__ = ("_lock", "_cond", "_refs", "_exclusive", "_cleaning", "_closed")

    def __init__(self) -> None:
        # a plain Lock (C-level ``with``) on the fast paths; the Condition over
        # the same lock only where someone must wait or be woken
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._refs = 0
        self._exclusive = False  # new holds wait (a clean-up is in, or the store closed)
        self._cleaning = False  # a clean-up owns the exclusivity
        self._closed = False

    @property
    def ref_count(self) -> int:
        """References held right now."""
        return self._refs

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._closed

    @property
    def exclusive_held(self) -> bool:
        """Whether a clean-up or close holds the references exclusively
        (new holds wait, or raise once closed)."""
        return self._exclusive

    def hold(self) -> None:
        """Take one reader reference (waits while a clean-up works).
        Raises StoreClosedError once :meth:`shutdown` was called."""
        with self._lock:
            if not self._exclusive:  # (never clear once closed: see shutdown)
                self._refs += 1
                return
            while self._exclusive and not self._closed:
                self._cond.wait()
            if self._closed:
                from .exceptions import StoreClosedError

                raise StoreClosedError("the store is closed")
            self._refs += 1

    def release(self) -> None:
        """Drop one reader reference; the last one lets a waiting clean-up in."""
        with self._lock:
            self._refs -= 1
            if self._refs <= 0:
                self._refs = 0
                if self._exclusive:
                    self._cond.notify_all()

    def acquire_exclusive(self, timeout: float) -> bool:
        """Block new holds and wait up to *timeout* seconds for held references
        to drain. Returns True when exclusive (then :meth:`release_exclusive`
        must follow), False when readers stayed inside or the store closed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._exclusive:  # another clean-up: queue behind it
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return False
                self._cond.wait(left)
            if self._closed:
                return False
            self._exclusive = self._cleaning = True
            while self._refs > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._end_cleaning()
                    return False
                self._cond.wait(left)
            return True

    def release_exclusive(self) -> None:
        with self._cond:
            self._end_cleaning()

    def _end_cleaning(self) -> None:
        # (lock held) once closed, holds stay blocked for good
        self._cleaning = False
        if not self._closed:
            self._exclusive = False
        self._cond.notify_all()

    def shutdown(self, timeout: float) -> bool:
        """Close the references for good: every later :meth:`hold` raises
        StoreClosedError, waiting ones included, and clean-ups are refused.
        Then wait up to *timeout* seconds for a clean-up that is in and for
        the readers inside to leave. Idempotent. Returns whether they left
        (False: the caller unmaps with readers inside, which Python's mmap
        survives: a mapping a buffer still exports stays mapped)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._cleaning:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._exclusive = True
            while self._refs > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return not self._cleaning



class StoreState:
    """The state of a store that its put and read gates check and update on
    every call: ``closed``, ``disk_full`` (RocketMQ's DISK_FULL running
    flag), ``pending`` (records appended but not yet dispatched: a
    collection, truthy when any), ``write_error`` (a failed flush, or None),
    ``waiting`` (pulls waiting for new messages), ``written_end`` (physical
    offset past the last record), ``last_store_ts`` and ``last_logics_ts``
    (ms since epoch: the last record's store time, and the last dispatched
    one's). The store keeps one and reads and writes its fields; the core
    has the same class, with C fields."""

    __slots__ = ("closed", "disk_full", "pending", "write_error", "waiting", "written_end", "last_store_ts",
                 "last_logics_ts")

    def __init__(self) -> None:
        self.closed = self.disk_full = False
        self.pending: Any = None
        self.write_error: Any = None
        self.waiting = self.written_end = self.last_store_ts = self.last_logics_ts = 0


class PutGate:
    """``MessageStore.put_message``'s ASYNC_FLUSH path in one call: the
    store's state checks, its append lock, the store clock, :meth:`Appender.put`
    and the store's bookkeeping after it. The store's ``put_message``
    (:class:`StoreCore`'s) calls it (the core's then runs no Python code on
    a put). What the gate reads and writes is the store's :class:`StoreState`
    *state* (``disk_full``, ``closed``, ``pending``, ``write_error``,
    ``waiting``; ``written_end``, ``last_store_ts``, ``last_logics_ts``),
    under the store's append *lock*; what it declines goes to
    ``store._put_one``, as ``put_message`` did it step by step.

    *clock*: None for the store's default, ``time.time_ns() // 1_000_000``
    (ms since the epoch, read in C by the core), else a callable returning
    the store time in ms. The gate keeps a weak reference to the store
    (the store's dict holds the gate); ``detach()`` (on close) drops the
    Appender and all it holds of the store, so that a bound ``put`` kept
    past close keeps nothing alive and goes to ``_put_one``, which raises
    StoreClosedError (as the gate does once the store is gone)."""

    def __init__(self, store, state, lock, appender, clock) -> None:
        if type(state) is not StoreState:
            raise TypeError("state must be a StoreState")
        self._store = weakref.ref(store)
        self._state = state
        self._lock = lock
        self._appender = appender
        self._clock = _wall_ms if clock is None else clock

    def detach(self) -> None:
        self._appender = self._lock = None

    def put(self, msg):
        """``MessageStore.put_message(msg)``: the :class:`PutMessageResult`;
        raises what the step-by-step path raises."""
        fast, lock = self._appender, self._lock  # at once: detach may clear them
        store = self._store()
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from .exceptions import StoreClosedError

            raise StoreClosedError("the store of this put_message is gone (closed)")
        st = self._state
        if fast is not None and not st.disk_full:
            with lock:
                if not st.closed and not st.pending and st.write_error is None:
                    store_ts = self._clock()
                    result = fast.put(msg, store_ts)
                    if result is None:  # not for the one-call path: step by step
                        return store._put_one(msg, store_ts)
                    st.written_end = result[2] + result[3]
                    st.last_store_ts = st.last_logics_ts = store_ts
                    if st.waiting:  # read after the unit is in: a waiter that missed it sees it
                        store._wake_waiters()
                    return result
        return store._put_one(msg)


def _careful(store: StoreCore) -> Any:
    """*store* as the MessageStore (a StoreCore subclass) whose careful
    paths a StoreCore method calls: ``_put_one``, ``_get_messages`` ..."""
    return store


class StoreCore:
    """The part of :class:`~rmqstore.store.MessageStore` that the kernels
    own: ``put_message`` and the four read methods, each the common case in
    one kernel call through the store's gates (``_put_gate``, a
    :class:`PutGate`, and ``_read_gate``, a :class:`ReadGate`; None where
    the store has none or once it is closed), else the store's careful path
    (``_put_one``, ``_get_offset_in_queue_by_time``, ``_query_messages``,
    ``_get_messages``, ``_get_message_views``), which decides everything
    the gates leave: errors, waits, follows, new files. ``MessageStore`` is
    a StoreCore; a subclass that overrides one of these methods has its
    own. The core has the same class, its methods in C."""

    __slots__ = ("_put_gate", "_read_gate")

    def __init__(self) -> None:
        self._put_gate: Any = None
        self._read_gate: Any = None

    def put_message(self, msg):
        """Append *msg* to the CommitLog and dispatch it to its ConsumeQueue and
        the index before returning (RocketMQ ``putMessage`` + reput). Under
        SYNC_FLUSH it returns only once the record is on disk; concurrent
        producers share one sync (group commit).

        All or nothing: every file the record needs (a CommitLog segment,
        its queue's directory and file, an index file) is made before its
        first byte is written, and a failure after that (an interrupt
        included) undoes the record, so whatever this raises nothing of the
        message is stored and the store goes on; retrying stores no
        duplicate. The one exception is FlushError under SYNC_FLUSH (below).

        Returns a :class:`PutMessageResult` with status PUT_OK.

        Raises:
            MessageTypeError, IllegalMessageError, MessageTooLargeError,
            PropertiesSizeExceededError: bad input.
            StoreReadOnlyError, StoreClosedError: the store cannot take writes.
            FlushError: the sync failed (SYNC_FLUSH), now or earlier; the store
                takes no more writes. The record may still be found after a
                restart (the outcome of this put is unknown, never PUT_OK).
            DiskFullError: disk use is above the warning level (status
                SERVICE_NOT_AVAILABLE; puts resume by themselves when it
                falls), or no room for a file the record needs
                (CREATE_MAPPED_FILE_FAILED).
            OSError: any other failure to make such a file (no descriptor
                left, no permission).
        """
        gate = self._put_gate
        if gate is not None:
            return gate.put(msg)
        return _careful(self)._put_one(msg)

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary="lower"):
        """Queue offset of the first (``"lower"``) or last (``"upper"``) message
        stored at *timestamp* ms, or the nearest one after/before it (RocketMQ
        5.1.1+ ``getOffsetInQueueByTime`` with BoundaryType), clamped to the
        queue's [min, max] offsets; 0 for an unknown queue. *queue_id* is a
        Java int, *timestamp* a long (ms since epoch, any value of one).

        Raises MessageTypeError (a bool or a float is not an int),
        ArgumentError for a number outside its range or any other
        *boundary* (a ValueError), StoreClosedError."""
        gate = self._read_gate
        if gate is not None:
            return gate.get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)
        return _careful(self)._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    def query_messages(self, topic, key, max_count=64, begin=0, end=0x7FFFFFFFFFFFFFFF):
        """The messages behind :meth:`query_offsets`, keeping only records that
        are still stored, whose topic is *topic* and whose UNIQ_KEY or one of
        whose KEYS is *key* (fixes RocketMQ #3613, docs/recovery.md#pitfall-index-hash-collisions);
        each record once (docs/recovery.md#pitfall-index-duplicate-entries), in the order of :meth:`query_offsets`.
        *max_count*, *begin* and *end* as there.

        Raises MessageTypeError, ArgumentError, StoreClosedError."""
        gate = self._read_gate
        if gate is not None:
            return gate.query_messages(topic, key, max_count, begin, end)
        return _careful(self)._query_messages(topic, key, max_count, begin, end)

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None, wait_ms=0):
        """Pull up to *max_count* messages of (topic, queue_id) from queue offset
        *offset* (RocketMQ ``getMessage``; with *wait_ms*, its long polling).

        Args:
            topic (str): the topic.
            queue_id (int): a Java int (-2**31 .. 2**31-1); a queue that does
                not exist answers NO_MATCHED_LOGIC_QUEUE.
            offset (int): queue offset, a long (-2**63 .. 2**63-1); outside
                the queue it is answered with a status, as RocketMQ does
                (OFFSET_TOO_SMALL below the minimum, OFFSET_OVERFLOW_ONE at
                the end, OFFSET_OVERFLOW_BADLY past it).
            max_count (int): messages at most, 1 .. 2**31-1.
            tags (str | list[str] | None): None or ``"*"`` for every message,
                else ``"TagA || TagB"`` or a list: kept are messages whose tags
                code matches and whose TAGS really is one of them.
            wait_ms (int | float): when nothing is there yet, wait up to this
                many ms (0 .. 2**63-1, finite) for messages put into this
                store (in this process) and return as soon as one arrives; no
                busy loop; ``close()`` wakes it. 0 returns at once. On a
                read-only store (follow mode) the queue's tail is re-read
                every ``follow_poll_interval`` ms instead, as a writer process
                gives no signal.

        Returns a :class:`GetMessageResult`; ``next_begin_offset`` is where the
        next pull starts. Statuses as RocketMQ: NO_MATCHED_LOGIC_QUEUE,
        NO_MESSAGE_IN_QUEUE, OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE,
        OFFSET_OVERFLOW_BADLY, FOUND, NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING.

        Raises MessageTypeError (an argument of the wrong type: a bool or a
        float is not an int), ArgumentError (a number outside the range
        above), StoreClosedError, and CorruptedFileError when a unit points
        at something that is not its record, or at a record whose body CRC
        does not match (every read checks it; RocketMQ checks it on recovery
        only).
        """
        gate = self._read_gate
        if gate is not None:
            return gate.get_messages(topic, queue_id, offset, max_count, tags, wait_ms)
        return _careful(self)._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    def get_message_views(self, topic, queue_id, offset, max_count=32):
        """Zero-copy form of :meth:`get_messages` (no tag filter, no waiting):
        up to *max_count* messages of (topic, queue_id) from queue offset
        *offset*, as positions in a read-only memoryview of the CommitLog
        segment that holds them instead of one :class:`MessageExt` each.

        The messages of one call come from one segment: a pull that reaches
        a record in the next segment ends there, and ``next_begin_offset``
        points at it. The view pins the mapping (Python never unmaps memory a
        view exports): clean-up still deletes the file, and the store still
        closes, while the mapping stays readable until the last view of it
        is released. Only the ranges ``units`` name are messages; the rest of
        the segment may change under later appends.

        Returns a :class:`GetViewsResult` with the statuses and offsets of
        get_messages; *queue_id*, *offset* and *max_count* as there.

        Raises MessageTypeError, ArgumentError (as get_messages),
        StoreClosedError; CorruptedFileError when a unit points at something
        that is not its record (a damaged body, whose CRC does not match,
        included), or at one whose stored topic is not the queue's topic byte
        for byte (then read it with get_messages)."""
        gate = self._read_gate
        if gate is not None:
            return gate.get_message_views(topic, queue_id, offset, max_count)
        return _careful(self)._get_message_views(topic, queue_id, offset, max_count)


class ReadGate:
    """The common case of the store's lookups and pulls in one call each:
    ``get_offset_in_queue_by_time``, ``query_messages``, ``get_messages``
    and ``get_message_views`` (same names, arguments and defaults as the
    ``MessageStore`` methods,
    whose docstrings hold). The store's methods of those names
    (:class:`StoreCore`'s) call them, so the core's runs no Python code on
    an open store's lookup or pull. Each method:

    - checks the store is open (its :class:`StoreState`) and the gate attached;
    - for the common case (an exact ``"lower"``/``"upper"`` boundary; str
      topic and key; an int queue id, an int offset, timestamp, begin and
      end within a long, an int count in 1 .. 2**31-1, begin <= end, an int
      wait_ms in 0 .. 2**63-1, tags None or a str; views of a writable
      store) calls the whole-operation kernel (:func:`time_lookup`,
      :func:`query_keyed`, :func:`pull_messages`, :func:`pull_views`) with
      the store's reader references;
    - hands anything else to the store's careful path (``_`` + its name), which
      decides (errors, an argument out of its range, an unknown queue, a
      clean-up holding the references, a careful read, a follow or a wait
      included): a pull only when ``get_messages`` would return its result
      unchanged.

    Args:
        store (MessageStore): held weakly (the store holds the gate).
        state (StoreState): the store's.
        cqs (dict): the store's ConsumeQueues by (topic, queue_id).
        commitlog (CommitLogBase), index (IndexServiceBase), refs
            (ReferenceResource), read_only (bool): the store's.
        state (StoreState): the store's state (``closed`` is read per call).
        message_type (type): what a message is made as (``MessageExt``).
        result_type (type): ``GetMessageResult``, a 5-tuple type.
        views_type (type): ``GetViewsResult``, a 6-tuple type.
        units_of (Callable[[bytes], numpy.ndarray]): pull_views' packed
            units as ``GetViewsResult.units``.
        tag_filter (Callable): ``store._tag_filter``: a ``tags`` argument
            as the filter :func:`pull_messages` takes (None for every
            message); the gate keeps the last str's.
        min_units (int): a pull visits at least this many units
            (``store._MAX_FILTER_UNITS``).

    ``detach()`` (on close) drops what the gate holds of the store; the
    methods then go to the store's, which raise StoreClosedError, as they
    do once the store is gone."""

    def __init__(self, store, state, cqs, commitlog, index, refs, read_only, message_type, result_type, views_type,
                 units_of, tag_filter, min_units) -> None:
        if type(cqs) is not dict:
            raise TypeError("a store's _cqs must be a dict")
        if type(state) is not StoreState:
            raise TypeError("state must be a StoreState")
        self._state = state
        self._store_ref = weakref.ref(store)
        self._cqs: dict | None = cqs
        self._commitlog, self._index, self._refs = commitlog, index, refs
        self._read_only = bool(read_only)
        self._message_type, self._result_type = message_type, result_type
        self._views_type, self._units_of, self._tag_filter = views_type, units_of, tag_filter
        self._last_filter: tuple = (None, None)
        self._min_units = operator.index(min_units)

    def detach(self) -> None:
        self._cqs = self._commitlog = self._index = self._refs = None

    def _store(self):
        store = self._store_ref()
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from .exceptions import StoreClosedError

            raise StoreClosedError("the store of this method is gone (closed)")
        return store

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary="lower"):
        cqs, commitlog, refs = self._cqs, self._commitlog, self._refs  # at once: detach may clear them
        store = self._store()
        upper = _BOUNDARY.get(boundary) if type(boundary) is str else None
        if upper is not None and cqs is not None and type(queue_id) is int and type(timestamp) is int \
                and _I64_MIN <= timestamp <= _I64_MAX and not self._state.closed:
            cq = cqs.get((topic, queue_id))
            if cq is not None:
                found = time_lookup(cq, commitlog, timestamp, upper, refs)
                if found is not None:
                    return found
        return store._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    def query_messages(self, topic, key, max_count=64, begin=0, end=(1 << 63) - 1):
        cqs, index, commitlog, refs = self._cqs, self._index, self._commitlog, self._refs
        store = self._store()
        if cqs is not None and type(topic) is str and type(key) is str and type(max_count) is int \
                and 0 < max_count <= _I32_MAX and type(begin) is int and type(end) is int \
                and _I64_MIN <= begin <= end <= _I64_MAX and not self._state.closed:
            out: list = []
            if query_keyed(index, commitlog, topic, key, max_count, begin, end, self._message_type, out,
                           refs) is not None:
                return out
        return store._query_messages(topic, key, max_count, begin, end)

    def _filter(self, tags):
        last = self._last_filter  # (one tuple: another thread may replace it)
        if type(tags) is not str:
            return False
        if last[0] is tags:
            return last[1]
        try:
            found = self._tag_filter(tags)
        except Exception:
            return False
        self._last_filter = (tags, found)
        return found

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None, wait_ms=0):
        cqs, commitlog, refs = self._cqs, self._commitlog, self._refs
        store = self._store()
        wanted = None if tags is None else self._filter(tags)
        if cqs is not None and wanted is not False and _pull_args_ok(queue_id, offset, max_count) \
                and type(wait_ms) is int and 0 <= wait_ms <= _I64_MAX and not self._state.closed:
            cq = cqs.get((topic, queue_id))
            if cq is not None:
                out: list = []
                found = pull_messages(cq, commitlog, offset, max_count, max(max_count, self._min_units),
                                      self._message_type, out, wanted, refs)
                # what the store's method would do next: a careful read, a follow or a wait
                if found is not None and found[0] is not None and \
                        (out or (not self._read_only and wait_ms == 0)):
                    return tuple.__new__(self._result_type, (found[0], out, *found[1:]))
        return store._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    def get_message_views(self, topic, queue_id, offset, max_count=32):
        cqs, commitlog, refs = self._cqs, self._commitlog, self._refs
        store = self._store()
        if cqs is not None and not self._read_only and _pull_args_ok(queue_id, offset, max_count) \
                and not self._state.closed:
            cq = cqs.get((topic, queue_id))
            if cq is not None:
                refs.hold()  # until the view exports the segment: then the store's close cannot unmap it
                try:
                    status, nxt, mn, mx, segment, packed = pull_views(cq, commitlog, offset, max_count,
                                                                      max(max_count, self._min_units), None)
                    view = None if segment is None else memoryview(segment).toreadonly()
                finally:
                    refs.release()
                if status is not None:  # (stopped: the store's method reads it carefully)
                    return tuple.__new__(self._views_type, (status, view, self._units_of(packed),
                                                            nxt, mn, mx))
        return store._get_message_views(topic, queue_id, offset, max_count)


_BOUNDARY = {"lower": False, "upper": True}
_I32_MAX = (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _pull_args_ok(queue_id, offset, max_count) -> bool:
    """Whether a pull's numbers are exact ints within their ranges (else
    the store's method checks them, and raises)."""
    return type(queue_id) is int and type(offset) is int and type(max_count) is int \
        and _I64_MIN <= offset <= _I64_MAX and 0 < max_count <= _I32_MAX


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_columns(bodies, queue_ids, tags, keys, unique_keys) -> None:
    n = len(bodies)
    if type(bodies) is not list or type(queue_ids) is not list or len(queue_ids) != n:
        raise TypeError("bodies and queue_ids must be lists of one length")
    for col in (tags, keys, unique_keys):
        if col is not None and (type(col) is not list or len(col) != n):
            raise TypeError("tags, keys and unique_keys must be None or lists as long as bodies")

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
        if phy in seen:
            continue
        seen.add(phy)
        fields = _record_at(view, phy, max_size)
        if fields is None or fields[15] != topic:
            continue
        props = parse_properties(fields[16])
        if props.get("UNIQ_KEY") == key or key in (props.get("KEYS") or "").split(" "):
            out.append(_ext(message_type, fields, fields[15]))


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
    """``query_messages`` in one call: ``index.query_offsets(topic, key,
    max_num, begin, end)`` (``IndexService.queryOffset``), then
    :func:`read_keyed` of those offsets through ``commitlog.segment_view()``
    with ``commitlog.max_record_size``, appending to *out*. *refs* as in
    :func:`time_lookup`. Returns *out*, or None (nothing read) when the
    caller must hold a reference and call again with ``refs=None``.
    Raises TypeError unless *topic* and *key* are str."""
    if not isinstance(topic, str) or not isinstance(key, str):
        raise TypeError("topic and key must be str")

    def read():
        offsets = index.query_offsets(topic, key, max_num, begin, end)
        if offsets:
            read_keyed(commitlog.segment_view(), offsets, topic, key, commitlog.max_record_size, message_type, out)
        return out

    return _held(refs, read)


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
