"""Checks of index files against what they claim (docs/format.md#indexfile),
for reads that must not trust a header: ``header_problem`` (the first header
field that contradicts the file) and ``infer_index_geometry`` (the slot and
entry counts of existing files). ``IndexService`` opens with them, ``verify``
and ``infer_config`` report with them."""

from __future__ import annotations

import mmap
import os
import struct
import time

from ..exceptions import CorruptedFileError
from ..format.layout import INDEX_ENTRY_SIZE, INDEX_HASH_SLOT_SIZE, INDEX_HEADER_SIZE

__all__ = ["header_problem", "index_file_size", "infer_index_geometry"]

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_INT_MAX = (1 << 31) - 1


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of an IndexFile: 40 + 4 * slots + 20 * entries."""
    return INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * hash_slot_num + INDEX_ENTRY_SIZE * index_num


def header_problem(buf, hash_slot_num: int, index_num: int, settled: bool = True):
    """The first header field of the index file in *buf* (of *hash_slot_num*
    slots and *index_num* entries) that contradicts the file, as ``(offset,
    text)``, or None. Reads the header and at most two entries.

    Every file: counts and times within range (no negative field,
    ``indexCount <= index_num``, ``hashSlotCount <= hash_slot_num``).
    A *settled* file (no writer is putting keys into it) also: an empty
    file holds no used slot and its begin and end values agree (both come
    from the previous file); a file with entries has between 1 and
    ``indexCount - 1`` used slots, begins and ends at the physical offsets
    of its first and last entries, and ends at the time its last entry
    was put (a single entry: its begin time; more: its time difference
    from the begin time is ``(end - begin) / 1000``, clamped to
    ``[0, 2**31-1]``, exactly as every put computes it).

    A live file (another process putting keys) is judged by the range
    checks only: its entry, slot and header fields are written one after
    the other, so any equality between them may not hold yet."""
    n = index_num
    fb, fe, bp, ep, slot_count, raw = _HEADER.unpack_from(buf, 0)
    if not 0 <= raw <= n:
        return 36, f"indexCount {raw} outside [0, {n}]"
    if not 0 <= slot_count <= hash_slot_num:
        return 32, f"hashSlotCount {slot_count} outside [0, {hash_slot_num}]"
    for off, name, v in ((0, "beginTimestamp", fb), (8, "endTimestamp", fe),
                         (16, "beginPhyOffset", bp), (24, "endPhyOffset", ep)):
        if v < 0:
            return off, f"{name} {v} is negative"
    if not settled:
        return None
    count = max(raw, 1)
    if count == 1:
        if slot_count:
            return 32, f"hashSlotCount {slot_count} in a file without entries"
        if bp != ep:
            return 24, f"endPhyOffset {ep} differs from beginPhyOffset {bp} in a file without entries"
        if fb != fe:
            return 8, f"endTimestamp {fe} differs from beginTimestamp {fb} in a file without entries"
        return None
    if slot_count == 0 or slot_count >= count:
        return 32, f"hashSlotCount {slot_count} outside [1, {count - 1}] for {count - 1} entries"
    base = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * hash_slot_num
    last = base + (count - 1) * INDEX_ENTRY_SIZE
    h1, phy1, d1, p1 = _ENTRY.unpack_from(buf, base + INDEX_ENTRY_SIZE)
    h, phy, diff, prev = _ENTRY.unpack_from(buf, last)
    if h1 < 0 or d1 < 0 or p1 != 0:
        return base + INDEX_ENTRY_SIZE, f"index entry 1 is not a first entry ({h1}, {phy1}, {d1}, {p1})"
    if h < 0 or diff < 0 or not 0 <= prev < count - 1 or phy < phy1:
        return last, f"index entry {count - 1} (the last) is not an entry ({h}, {phy}, {diff}, {prev})"
    if bp != phy1:
        return 16, f"beginPhyOffset {bp}, but the first entry points at {phy1}"
    if ep != phy:
        return 24, f"endPhyOffset {ep}, but the last entry points at {phy}"
    if count == 2:
        if fe != fb:
            return 8, f"endTimestamp {fe} differs from beginTimestamp {fb} in a file with one entry"
    else:
        # (a negative difference clamps to 0, so floor division does as Java's)
        want = 0 if fb <= 0 else min(max((fe - fb) // 1000, 0), _INT_MAX)
        if diff != want:
            return 8, (f"endTimestamp {fe} is not the time of the last entry (beginTimestamp {fb} + "
                       f"{diff} s)")
    return None


def infer_index_geometry(paths, hash_slot_num=None, index_num=None, live=None) -> tuple:
    """Find ``(hash_slot_num, index_num)`` of existing index files.

    Tries, in order: the given values, RocketMQ's defaults and
    ``StoreConfig()``'s, the geometry implied
    by a full file (``index_count == index_num``), then every geometry that fits
    the file size, keeping the one whose slots and entries agree (each used
    slot points at an entry whose key hash falls in that slot, and the number
    of used slots equals the header's hashSlotCount). *live*: the path of a
    file another process may be writing (a follower's newest file), held to
    the checks a concurrent put cannot break (see ``_geometry_fits``).

    Raises:
        CorruptedFileError: a file whose size or content fits no geometry the
            others share (naming that file), or no geometry fits at all.
    """
    all_sizes = [os.path.getsize(p) for p in paths]
    size = max(set(all_sizes), key=lambda n: (all_sizes.count(n), n))
    for p, n in zip(paths, all_sizes):
        if n != size:
            raise CorruptedFileError(f"index file has {n} bytes, the others {size}", p, n)
    headers = []
    for p in paths:
        with open(p, "rb") as fh:
            head = fh.read(INDEX_HEADER_SIZE)
        if len(head) < INDEX_HEADER_SIZE:
            raise CorruptedFileError("index file shorter than its header", p)
        headers.append(_HEADER.unpack(head))

    candidates = []
    if hash_slot_num and index_num:
        candidates.append((hash_slot_num, index_num))
    candidates.append((5_000_000, 20_000_000))  # a broker's
    candidates.append((20_000, 80_000))  # StoreConfig()'s (an embedded store's)
    for h in headers:
        n = h[5]
        if n > 1 and (size - INDEX_HEADER_SIZE - INDEX_ENTRY_SIZE * n) > 0:
            rest = size - INDEX_HEADER_SIZE - INDEX_ENTRY_SIZE * n
            if rest % INDEX_HASH_SLOT_SIZE == 0:
                candidates.append((rest // INDEX_HASH_SLOT_SIZE, n))
    best = None  # (files that fit, candidate, first file that does not)
    for s, n in candidates:
        if index_file_size(s, n) != size:
            continue
        fits = [_geometry_fits(p, s, n, p == live) for p in paths]
        if all(fits):
            return s, n
        if best is None or sum(fits) > best[0]:
            best = (sum(fits), (s, n), paths[fits.index(False)])
    if best is not None and best[0] > 0:
        # the geometry most files agree on is right: name the file that breaks it
        raise CorruptedFileError(
            f"index file does not match the geometry of the others ({best[1][0]} slots, {best[1][1]} entries)",
            best[2], 0,
        )
    if size > 64 * 1024 * 1024:
        raise CorruptedFileError(
            f"neither the default nor a full file's geometry fits these {size}-byte index files", paths[0], 0
        )
    total = size - INDEX_HEADER_SIZE
    for s in range(1, total // INDEX_HASH_SLOT_SIZE):
        rest = total - INDEX_HASH_SLOT_SIZE * s
        if rest % INDEX_ENTRY_SIZE:
            continue
        n = rest // INDEX_ENTRY_SIZE
        if n > 1 and all(h[5] <= n for h in headers):
            fits = [_geometry_fits(p, s, n, p == live) for p in paths]
            if all(fits):
                return s, n
            if any(fits):
                raise CorruptedFileError(
                    f"index file does not match the geometry of the others ({s} slots, {n} entries)",
                    paths[fits.index(False)], 0,
                )
    raise CorruptedFileError(f"no slot/entry geometry fits these {size}-byte index files", paths[0], 0)


#: used slots whose entries' key hashes a geometry check reads (see _fits_once)
_HASH_SAMPLE = 4096

#: reads of a live index file before it counts as not fitting a geometry,
#: and the pause between them (s): damage stays, a writer mid-put moves on
_LIVE_READS, _LIVE_PAUSE = 3, 0.01


def _geometry_fits(path, s, n, live=False) -> bool:
    """:func:`_fits_once`, with a live file read again (up to _LIVE_READS
    times) before it counts as not fitting: what its writer did between two
    reads of a check must not fail a follower's open."""
    for attempt in range(_LIVE_READS if live else 1):
        if attempt:
            time.sleep(_LIVE_PAUSE)
        if _fits_once(path, s, n, live):
            return True
    return False


def _fits_once(path, s, n, live=False) -> bool:
    """Whether index file *path* (of index_file_size(s, n) bytes) reads as
    *s* hash slots and *n* entries: entry 0 unused, as many non-zero slots
    as the header counts, each pointing below the header's entry count at an
    entry whose key hash is >= 0 and falls in that slot.

    *live*: another process may be putting keys into the file meanwhile. A
    put writes the entry, then the slot, then the header counts, so the
    slots are held against the counts read before and after them: at least
    the slot count before and at most one more than the slot count after
    (one put may sit between its slot and its count), values up to the entry
    count after. An entry a slot names was written before the slot.

    Every slot is checked against the counts; the key hashes are checked
    for at most _HASH_SAMPLE used slots spread evenly over the file, first
    and last included: a wrong geometry puts nearly every entry in the
    wrong slot, so a sample tells geometries apart as surely as all of them,
    and gathering all (up to 5M entries spread over 400 MB) made a read-only
    open of a large store a walk of its index. Damage to a single entry is
    ``verify``'s to find; a lookup checks each entry it walks anyway.

    The slots are copied out of the file before they are checked (a default
    file has 20 MB of them): a check never runs over bytes that change under
    it. The key hashes of the entries they name are gathered through a
    mapping, copied in one step."""
    import numpy as np  # (importing rmqstore does not import numpy)

    base = INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * s
    with open(path, "rb") as fh:
        fd = fh.fileno()
        head = os.pread(fd, INDEX_HEADER_SIZE, 0)
        if len(head) < INDEX_HEADER_SIZE:
            return False
        _, _, _, _, slot_count, count = _HEADER.unpack(head)
        count = max(count, 1)
        if count > n or any(os.pread(fd, INDEX_ENTRY_SIZE, base)):  # (entry 0 is never used)
            return False
        raw = os.pread(fd, INDEX_HASH_SLOT_SIZE * s, INDEX_HEADER_SIZE)
        if len(raw) < INDEX_HASH_SLOT_SIZE * s:
            return False
        slots = np.frombuffer(raw, dtype=">i4")
        used = np.flatnonzero(slots)
        if live:
            _, _, _, _, slot_count_after, count_after = _HEADER.unpack(os.pread(fd, INDEX_HEADER_SIZE, 0))
            if not slot_count <= len(used) <= slot_count_after + 1:
                return False
            top = min(max(count_after, 1), n - 1)
        else:
            if len(used) != slot_count:
                return False
            top = count - 1
        if not len(used):
            return True  # (no key yet)
        v = slots[used].astype(np.int64)
        if v.min() <= 0 or v.max() > top:
            return False
        if len(used) > _HASH_SAMPLE:
            pick = np.linspace(0, len(used) - 1, _HASH_SAMPLE).astype(np.int64)
            used, v = used[pick], v[pick]
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            # each entry's first 4 bytes, its key hash
            heads = np.ndarray((top + 1,), dtype=">i4", buffer=mm, offset=base, strides=(INDEX_ENTRY_SIZE,))
            try:
                key_hash = heads[v].astype(np.int64)  # a copy
            finally:
                del heads  # (a view of the mapping: it closes next)
        return bool(key_hash.min() >= 0 and (key_hash % s == used).all())
