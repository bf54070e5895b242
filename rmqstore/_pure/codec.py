"""The CommitLog record codec: hashes (Java ``String.hashCode``, index key,
tags code), the masked CRC-32, property blobs, record length, and writing,
checking, decoding, scanning and reading records one at a time
(docs/format.md#commitlog-record). The big-endian ``struct`` formats and the
field-width check the other modules share are here too."""

from __future__ import annotations

import operator
import struct
import zlib

from ..format.layout import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    CRC32_RESERVED_LEN,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
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
    STOREHOSTADDRESS_V6_FLAG,
)

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
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


def _jdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


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
    the END_OF_FILE record, or a negative ``REC_*`` code (see ``format.layout``).
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


def read_store_timestamps(buf, positions, out) -> int:
    """``read_store_timestamp`` for many records at once: ``out[i]`` becomes
    the STORETIMESTAMP (ms since epoch) of the record at byte position
    ``positions[i]`` of *buf*, or -1 where the field lies outside *buf*.
    For walks that date every unit of a queue (``rmqstore report``)
    without a Python int per record.

    *buf*: a readable buffer (a CommitLog segment's mapping); *positions*:
    a buffer of native int64 (a numpy ``int64`` array, ``array('q')``), n of
    them (its bytes // 8); *out*: a writable buffer of at least n native
    int64. Returns n. Raises ValueError when *out* holds fewer than n,
    BufferError when it is not writable, TypeError for what is not a buffer.
    """
    with memoryview(buf) as bv, memoryview(positions) as pv, memoryview(out) as ov:
        n = pv.nbytes // 8
        if ov.readonly:
            raise BufferError("Object is not writable.")
        if ov.nbytes < n * 8:
            raise ValueError(f"out holds {ov.nbytes // 8} int64 values, positions {n}")
        pb, ob = pv.cast("B"), ov.cast("B")
        try:
            with pb[: n * 8].cast("q") as pos, ob[: n * 8].cast("q") as o:
                for i in range(n):
                    o[i] = read_store_timestamp(bv, pos[i])
        finally:
            pb.release()
            ob.release()
    return n
