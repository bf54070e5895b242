"""Bulk decoding of CommitLog records into numpy columns (``decode_columns``
for consecutive records, ``decode_columns_at`` for records at given physical
offsets), as ``rmqstore.arrow`` and ``rmqstore.spark`` read them."""

from __future__ import annotations

import struct

from ..format.layout import HOST_COLUMNS, KEY_COLUMNS, REC_BAD_OFFSET, REC_BLANK, STOP_END, STOP_LIMIT
from .codec import _I32, _I64, _SIZE_MAGIC, _fields, _stored_topic, check_record, decode_record, read_record

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
    check_crc: bool = False, with_hosts: bool = True, with_keys: bool = True,
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
    the stored bytes, not re-validated as UTF-8. Without *with_hosts* the
    born_host, store_host and msg_id columns are left out, without
    *with_keys* tags, keys and unique_key (each costs more to decode than
    the numbers: a reader leaves out what its caller does not ask for).
    Raises ValueError for positions outside the buffer or a negative
    *max_count*.
    """
    n_buf = len(buf)
    if pos < 0 or end < pos or pos > n_buf or max_count < 0:
        raise ValueError(f"bad range pos={pos} end={end} max_count={max_count} for a buffer of {n_buf} bytes")
    end = min(end, n_buf)
    out = _Columns(with_body, with_properties, with_hosts, with_keys)
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

    def __init__(self, with_body: bool, with_properties: bool, with_hosts: bool = True, with_keys: bool = True):
        self.with_body, self.with_properties = with_body, with_properties
        self.with_hosts, self.with_keys = with_hosts, with_keys
        self.count = 0
        self.i64: dict = {k: [] for k in _FIXED_I64}
        self.i32: dict = {k: [] for k in _FIXED_I32}
        # only the string columns asked for
        left_out = (() if with_hosts else HOST_COLUMNS) + (() if with_keys else KEY_COLUMNS)
        self.strs: dict = {k: [] for k in _STRINGS if k not in left_out}
        self.valid: dict = {k: [] for k in KEY_COLUMNS if with_keys}
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
        pairs = _split_properties(props) if self.with_keys or self.with_properties else {}
        strs = self.strs
        # the topic as stored, not decode_record's replaced text
        strs["topic"].append(_stored_topic(buf, pos))
        if self.with_hosts:
            strs["born_host"].append(_host_text(born_host))
            strs["store_host"].append(_host_text(store_host))
            strs["msg_id"].append((store_host + _I64.pack(phy)).hex().upper().encode())
        if self.with_keys:
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
