"""``recover``: :func:`recover_store` opens a store writable (which runs
recovery, docs/recovery.md#recovery) and closes it again, returning
``MessageStore.recovery_report`` with what recovery dropped: the CommitLog
bytes past the recovered end and the ConsumeQueue units cut off."""

from __future__ import annotations

import os

from .. import _kernels as k
from ..config import StoreConfig
from ..format.layout import (
    CQ_STORE_UNIT_SIZE,
)
from ..storage.walker import Segment, list_segments
from ..store.recovery import reporting_progress
from ._common import _nonzero_end, _queue_dirs
from .inference import infer_config


def _commitlog_data_end(root: str) -> int:
    """Physical offset just past the last non-zero byte of the CommitLog (0 if none)."""
    files, _ = list_segments(os.path.join(root, "commitlog"))
    for start, _name, path in reversed(files):
        if os.path.getsize(path) == 0:
            continue
        ro = Segment(path, path, start, follow_links=True)
        try:
            end = _nonzero_end(ro.buf, 0, ro.size)
        finally:
            ro.close()
        if end > 0:
            return start + end
    return 0


def _queue_ends(root: str) -> dict:
    """``{(topic, qid): units}``: where each ConsumeQueue's valid units end
    (the recovery scan of its last file, docs/recovery.md#consumequeue-recovery)."""
    out = {}
    for topic, qid, qdir in _queue_dirs(root):
        files, _ = list_segments(qdir)
        end = 0
        for start, _name, path in files:
            if os.path.getsize(path) == 0:
                continue
            ro = Segment(path, path, start, follow_links=True)
            try:
                valid_end, _ = k.cq_scan(ro.buf, 0, ro.size)
            finally:
                ro.close()
            if valid_end > 0:
                end = start + valid_end
        out[(topic, qid)] = end // CQ_STORE_UNIT_SIZE
    return out


def recover_store(root, config: StoreConfig | None = None, dry_run: bool = False, progress=None) -> dict:
    """Run recovery on the store in *root* explicitly: open it writable (which
    recovers, docs/recovery.md#recovery) and close it (clean shutdown).

    With *dry_run* nothing is written: the store is opened read-only, whose
    recovery makes the same decisions in memory, and the report says what a
    real run would cut (its ``index_keys_added`` is what the read-only view
    lacks, 0: a real run indexes what the index misses), with ``dry_run``
    True, ``writer_running`` (a real run would be refused) and, when the
    store has damage before its end, ``would_refuse``: a real run refuses
    to cut there (CorruptedFileError) and points to ``salvage``.

    *progress*, if given, is called as ``progress(done_bytes, total_bytes)``
    (ints, in bytes of CommitLog) while recovery walks the CommitLog: the
    bytes it checked, from the segment its scan starts at (one of the newest
    after a clean shutdown, one the checkpoint's times point to after a
    crash) to the end of the last segment holding data; a real run then
    adds the bytes of the valid records it dispatches again and of those it
    indexes from the CommitLog. The total starts as an estimate and becomes
    what the scan found to re-dispatch; *done_bytes* never goes down. Called
    at most once per 32 MiB walked and at the end of each pass, never per
    record; the last call has ``done_bytes == total_bytes`` (``(0, 0)`` for a
    store without CommitLog segments).

    Returns ``MessageStore.recovery_report`` (``last_exit_ok``,
    ``process_offset``, ``stopped_because``, ``truncated_bytes``,
    ``start_file``, ...) plus ``store``, ``data_end_before`` (physical offset
    past the last non-zero CommitLog byte before recovery),
    ``data_bytes_dropped`` (``data_end_before - process_offset`` when
    positive: bytes recovery cut off, zeros inside them included),
    ``consume_queue_units_dropped`` and ``config`` (the inferred file sizes).

    Raises:
        StoreLockedError: another writer holds the store.
        FileNotFoundError: *root* is not a directory, or holds none of a
            store's files (nothing is created there).
        CorruptedFileError, ConfigError: the store cannot be opened.
        Whatever *progress* raises: a real run then stops as a crash
        would (the next open recovers again).
    """
    from ..store import MessageStore

    root = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no store directory at {root}")
    if not any(os.path.exists(os.path.join(root, n)) for n in ("commitlog", "consumequeue", "index", "checkpoint")):
        raise FileNotFoundError(
            f"{root} does not look like a store (no commitlog/, consumequeue/, index/ or checkpoint)"
        )
    cfg, notes = infer_config(root, config)
    data_end = _commitlog_data_end(root)
    ends_before = _queue_ends(root)
    writer_running = False
    if dry_run:
        from ..store.lock import StoreLock

        writer_running = StoreLock.is_held(root)
        with reporting_progress(progress):
            store = MessageStore.open(root, config=cfg, read_only=True)
    else:
        # (recovery only: delayed records stay for the store's next writer to deliver)
        with reporting_progress(progress):
            store = MessageStore.open(root, config=cfg.replace(schedule_service_enable=False))
    try:
        report = dict(store.recovery_report)
        ends_after = {q: store.get_max_offset_in_queue(*q) for q in store.queues()}
    finally:
        store.close()
    dropped_units = sum(max(0, n - ends_after.get(q, 0)) for q, n in ends_before.items())
    process = report.get("process_offset", 0)
    report.update(
        store=root,
        data_end_before=data_end,
        data_bytes_dropped=max(0, data_end - process),
        consume_queue_units_dropped=dropped_units,
        config={
            "mapped_file_size_commit_log": cfg.mapped_file_size_commit_log,
            "mapped_file_size_consume_queue": cfg.mapped_file_size_consume_queue,
            "max_hash_slot_num": cfg.max_hash_slot_num,
            "max_index_num": cfg.max_index_num,
        },
        notes=notes,
    )
    if dry_run:
        report.update(dry_run=True, writer_running=writer_running)
        if report.get("damage"):
            report["would_refuse"] = ("damage before the end of the CommitLog: recovery refuses to cut there; "
                                      f"copy every valid record into a new store with: rmqstore salvage {root} <new>")
    return report
