"""``salvage``: :func:`salvage_store` copies every message of a store that
still validates (body CRC, ``__CRC32#`` when present, stored physical offset)
into a new store, resynchronising after damaged regions; the source is only
read. Two walks of the same records: the first counts them and settles the
new store's settings (``_Found``: a few numbers, whatever the store's size),
the second copies them, so memory does not grow with the number of records."""

from __future__ import annotations

import os

from .. import _kernels as k
from ..config import StoreConfig
from ..dispatch import gets_consume_queue_unit
from ..exceptions import RmqStoreError
from ..format.layout import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG
from ..message import Message, decode_host
from ..storage.walker import Segment, find_valid_record, list_segments, prop_crc, validate_record
from ._common import _I32, _common_size, _nonzero_end, _rel
from .inference import infer_config


def _ordered_properties(blob: bytes):
    """Ordered dict from a property blob keeping empty values, so the store
    re-encodes the same bytes; ``(dict, exact)``. When the blob cannot be
    rebuilt (invalid UTF-8, a piece without 0x01, duplicate or empty names, a
    missing final 0x02), RocketMQ's decoding is used and *exact* is False
    (pairs whose value holds 0x01, which a Message cannot carry, are dropped)."""
    raw = bytes(blob)
    text = raw.decode("utf-8", "replace")
    out: dict = {}
    pieces = text.split("\x02")
    if pieces[-1] == "":
        pieces.pop()
    exact = True
    for piece in pieces:
        name, sep, value = piece.partition("\x01")
        if not sep or not name or name in out or "\x01" in value:
            exact = False
            break
        out[name] = value
    if exact and "".join(f"{a}\x01{b}\x02" for a, b in out.items()).encode("utf-8") == raw:
        return out, True
    props = k.parse_properties(raw)
    return {a: b for a, b in props.items() if "\x01" not in b}, False


def salvage_store(src, out, config: StoreConfig | None = None, progress=None) -> dict:
    """Copy every verifiable message of the store in *src* into a new store at
    *out* (which must not exist or be an empty directory). *src* is only read.

    Each CommitLog segment is walked from position 0; after a record that
    does not validate (body CRC, ``__CRC32#`` when present, stored physical
    offset) the walk resynchronises at the next valid record, and the skipped
    bytes are reported. The new store gets the source's file sizes and index
    geometry (inferred, see :func:`infer_config`; *config* supplies the rest),
    the original store timestamps, hosts and fields; queue offsets are
    renumbered densely per queue and prepared-transaction offsets remapped to
    the new physical offsets.

    Returns a report dict: ``records_found``, ``messages_copied``,
    ``bytes_skipped``, ``bad_regions`` (list of ``(file, offset, length)``),
    ``not_copied`` (``(file, offset, reason)``), ``queue_offsets_renumbered``,
    ``properties_rewritten``, ``config`` and ``notes``.

    *progress*, if given, is called as ``progress(stage, done, total)``:
    stage ``"scan"`` in bytes of CommitLog walked, then ``"copy"`` in
    records copied.

    Raises:
        FileNotFoundError: *src* is not a directory.
        FileExistsError: *out* exists and is not an empty directory.
        ValueError: *out* is inside *src*.
    """
    from ..store import MessageStore

    src = os.path.abspath(os.fspath(src))
    out = os.path.abspath(os.fspath(out))
    if not os.path.isdir(src):
        raise FileNotFoundError(f"no store directory at {src}")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    real_src, real_out = os.path.realpath(src), os.path.realpath(out)
    if real_out == real_src or real_out.startswith(real_src.rstrip(os.sep) + os.sep):
        raise ValueError(f"the output {out} must not be inside the source store {src}")

    cfg, notes = infer_config(src, config)
    files, _ = list_segments(os.path.join(src, "commitlog"))
    segs: list = []
    bad_regions: list = []
    records = _Found()
    try:
        for start, _name, path in files:
            ro = Segment(path, _rel(src, path), start, follow_links=True)
            if ro.size == 0:
                ro.close()
                continue
            segs.append(ro)
        fs = cfg.mapped_file_size_commit_log
        if segs:
            fs = _common_size([s.size for s in segs])
        max_size = max(fs, 1)
        total, done = sum(seg.size for seg in segs), 0
        for si, seg in enumerate(segs):
            for pos, st, fields in _valid_records(seg, si == len(segs) - 1, fs, max_size, bad_regions):
                records.add(prop_crc(seg.buf, pos, st, fields[16]) is not None, _body_len(seg.buf, pos, fields),
                            fields[13])
            done += seg.size
            if progress is not None:
                progress("scan", done, total)
        changes: dict = {}
        if records.max_body > cfg.max_message_size:
            changes["max_message_size"] = records.max_body
        if records.with_crc * 2 > len(records) and not cfg.enabled_append_prop_crc:
            changes["enabled_append_prop_crc"] = True
        if changes:
            cfg = cfg.replace(**changes)
        report = {
            "source": src,
            "output": out,
            "records_found": len(records),
            "messages_copied": 0,
            "bytes_skipped": sum(r[2] for r in bad_regions),
            "bad_regions": bad_regions,
            "not_copied": [],
            "queue_offsets_renumbered": 0,
            "properties_rewritten": 0,
            "config": {
                "mapped_file_size_commit_log": cfg.mapped_file_size_commit_log,
                "mapped_file_size_consume_queue": cfg.mapped_file_size_consume_queue,
                "max_hash_slot_num": cfg.max_hash_slot_num,
                "max_index_num": cfg.max_index_num,
            },
            "notes": notes + ["queue offsets are renumbered densely per queue, in CommitLog order"],
        }
        now = [0]
        # (copies records as they are: delayed ones stay delayed, for the new store's writer)
        store = MessageStore.open(out, config=cfg.replace(schedule_service_enable=False), store_host="127.0.0.1:10911",
                                  clock=lambda: now[0])
        try:
            _copy_records(store, segs, fs, max_size, records, now, report, progress)
        finally:
            store.close()
    finally:
        for s in segs:
            s.close()
    return report


class _Found:
    """What the first walk learns of the valid records: how many, how many
    carry ``__CRC32#``, the longest body, and the prepared-transaction
    offsets that commit and rollback records name (few: one per such
    record), for the copy to remap."""

    def __init__(self):
        self.count = 0
        self.with_crc = 0
        self.max_body = 0
        self.referenced: set = set()

    def add(self, has_crc: bool, body_len: int, prepared: int) -> None:
        self.count += 1
        self.with_crc += has_crc
        self.max_body = max(self.max_body, body_len)
        if prepared:
            self.referenced.add(prepared)

    def __len__(self) -> int:
        return self.count


def _valid_records(seg: Segment, is_last: bool, fs: int, max_size: int, bad_regions: list):
    """The valid records of one segment, walked from position 0 as
    ``(position, size, fields)``, resynchronising after damage; the bad
    regions skipped are appended to *bad_regions* as ``(file, offset,
    length)``. The walk depends only on the bytes: run twice on the same
    segment, it yields the same records."""
    buf, n = seg.buf, seg.size
    data_end = _nonzero_end(buf, 0, n)
    pos = 0
    while pos < data_end:
        st, fields = validate_record(buf, pos, n, seg.start + pos, max_size)
        if st > 0:
            yield pos, st, fields
            pos += st
            continue
        if st == 0:
            return  # blank record: the rest of the segment is filler
        found = find_valid_record(buf, pos + 1, n, seg.start, max_size, prop_crc_tail=True, blank_end=fs,
                                  ranges=seg.data_ranges(pos + 1))
        if found is None:
            end = data_end if is_last else n
            bad_regions.append((seg.rel, pos, end - pos))
            return
        bad_regions.append((seg.rel, pos, found[0] - pos))
        pos = found[0]
        if found[1] == 0:
            return
    if not is_last and pos < n:
        # zeros where the records and the blank record of a full segment should be
        bad_regions.append((seg.rel, pos, n - pos))


def _body_len(buf, pos: int, fields) -> int:
    sys_flag = fields[7]
    bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    return _I32.unpack_from(buf, pos + 68 + bw + sw)[0]


def _copied(segs, fs: int, max_size: int):
    """The second walk: every valid record as ``(segment, position, size, fields)``."""
    for si, seg in enumerate(segs):
        for pos, st, fields in _valid_records(seg, si == len(segs) - 1, fs, max_size, []):
            yield seg, pos, st, fields


def _copy_records(store, segs, fs: int, max_size: int, records: _Found, now, report, progress=None) -> None:
    remap: dict = {}  # old -> new physical offset, of the records others name as their prepared one
    default_crc = store.config.enabled_append_prop_crc
    for seg, pos, st, fields in _copied(segs, fs, max_size):
        has_crc = prop_crc(seg.buf, pos, st, fields[16]) is not None
        f = k.decode_record(seg.buf, pos, True)
        old_phys = seg.start + pos
        props, exact = _ordered_properties(f[16])
        if not exact:
            report["properties_rewritten"] += 1
        try:
            msg = Message(
                f[15], f[14], queue_id=f[3], flag=f[4], properties=props, born_timestamp=f[8],
                born_host=decode_host(f[9]), store_host=decode_host(f[11]), reconsume_times=f[12],
                sys_flag=f[7], prepared_transaction_offset=remap.get(f[13], f[13]),
            )
            now[0] = f[10]
            if hasattr(store, "_append_crc"):
                # a store may mix records with and without __CRC32#: keep each as it was
                store._append_crc = has_crc
            r = store.put_message(msg)
        except (RmqStoreError, ValueError, TypeError, OverflowError) as e:
            report["not_copied"].append((seg.rel, pos, str(e)))
            continue
        finally:
            if hasattr(store, "_append_crc"):
                store._append_crc = default_crc
        if old_phys in records.referenced:
            remap[old_phys] = r.wrote_offset
        report["messages_copied"] += 1
        if progress is not None and report["messages_copied"] % 4096 == 0:
            progress("copy", report["messages_copied"], len(records))
        if gets_consume_queue_unit(f[7]) and r.queue_offset != f[5]:
            report["queue_offsets_renumbered"] += 1
    if progress is not None:
        progress("copy", report["messages_copied"], len(records))
