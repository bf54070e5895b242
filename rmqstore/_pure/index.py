"""IndexFile kernels: the keys a record is indexed under, putting keys
(``IndexFile.putKey``, docs/format.md#index-put) and selecting the physical
offsets stored for a key (docs/format.md#index-lookup)."""

from __future__ import annotations

import struct

from ..format.layout import INDEX_ENTRY_SIZE, INDEX_HASH_SLOT_SIZE, INDEX_HEADER_SIZE, KEY_SEPARATOR
from .codec import _I32, _I64, _INT_MAX, _fields, _jdiv, index_key_hash, java_hash

_INDEX_ENTRY = struct.Struct(">iqii")
_INDEX_HEADER = struct.Struct(">qqqqii")


def _wrap32(v: int) -> int:
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def _index_keys(uniq, keys) -> list:
    """The keys a record is indexed under, in order (docs/format.md#building-the-index):
    its unique key, then each non-empty space-separated piece of its keys (str or None each)."""
    out = [uniq] if uniq else []
    if keys:
        out += [x for x in keys.split(KEY_SEPARATOR) if x]
    return out


# --- IndexFile ------------------------------------------------------------


def _load32(buf, pos: int) -> int:
    # a slot or the count as one 4-byte copy (struct reads and writes a byte
    # at a time): another process never sees half of one put's store. A
    # slice of an mmap or bytearray (the store's files, the tests') is such
    # a copy; a memoryview's is not, and is read a byte at a time again
    return _I32.unpack(buf[pos : pos + 4])[0]


def _store32(buf, pos: int, v: int) -> None:
    buf[pos : pos + 4] = _I32.pack(v)


def _index_count(buf) -> int:
    c = _load32(buf, 36)
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
    _store32(buf, slot_pos, count)
    if count <= 1:
        _I64.pack_into(buf, 16, physical_offset)
        _I64.pack_into(buf, 0, store_timestamp)
    if slot_value == 0:
        _I32.pack_into(buf, 32, _wrap32(_I32.unpack_from(buf, 32)[0] + 1))
    _store32(buf, 36, _wrap32(count + 1))
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
    if len(out) >= max_num:
        return
    for phy in _chain(buf, hash_slot_num, index_num, index_key_hash(key), begin, end, False):
        out.append(phy)
        if len(out) >= max_num:
            break


def _chain(buf, hash_slot_num: int, index_num: int, key_hash: int, lo: int, hi: int, first_at_begin: bool):
    """The physical offsets down *key_hash*'s chain of the IndexFile in *buf*
    (checked) whose entry has the key hash and a time in [lo, hi], newest
    first: ``index_select``'s walk, bounded the same way. With
    *first_at_begin*, entry 1 is timed by the header's begin time, its own
    store time: its stored difference was taken from the previous file's
    end (docs/recovery.md#pitfall-index-first-entry-time)."""
    n = _load32(buf, INDEX_HEADER_SIZE + (key_hash % hash_slot_num) * INDEX_HASH_SLOT_SIZE)  # (before the count)
    count = _index_count(buf)
    if n <= 0 or n > count or count <= 1:
        return
    begin_ts = _I64.unpack_from(buf, 0)[0]
    base = INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE
    unpack = _INDEX_ENTRY.unpack_from
    for _ in range(index_num):
        if n >= index_num:
            break
        h, phy, diff, prev = unpack(buf, base + n * INDEX_ENTRY_SIZE)
        if diff < 0:
            break
        t = begin_ts + diff * 1000
        if h == key_hash and lo <= (begin_ts if first_at_begin and n == 1 else t) <= hi:
            yield phy
        if prev <= 0 or prev > count or prev == n or t < lo:
            break
        n = prev
