"""Retention and disk space: RocketMQ's CleanCommitLogService and
CleanConsumeQueueService (docs/recovery.md#retention), and the disk-usage probe behind write
refusal (DISK_FULL, docs/recovery.md#disk-space).

One clean-up round (:meth:`Retention.run`):

1. CommitLog: when the local hour is one of ``delete_when``, or disk use is
   above ``disk_max_used_space_ratio`` (or unknown), or a caller asked for it,
   delete non-current segments from the oldest on while each is expired —
   ``now >= time + file_reserved_time`` where *time* is the segment's last
   record's store time (its mtime when it holds none; docs/recovery.md#pitfall-retention-by-mtime) — or, when use
   is above the clean-forcibly level (and ``clean_file_forcibly_enable``),
   regardless of age. At most ``delete_file_batch_max`` files per round,
   ``delete_commit_log_files_interval`` ms apart. The current (last) segment
   is never deleted.
2. ConsumeQueues and index, when the CommitLog minimum moved: delete queue
   files whose last unit points below it (docs/recovery.md#retention), correct each queue's
   minimum offset (docs/recovery.md#queue-minimum-offset), delete index files that index only records below it
   (docs/recovery.md#retention).

Readers are never cut off: a segment is unmapped and dropped from its queue
only while no reader holds a reference
(:class:`~rmqstore.storage.mapped_file.ReferenceResource`); when readers stay inside,
the destroy fails for this round and is retried by the next (RocketMQ's
``reDeleteHangedFile``). Once ``destroy_maped_file_interval_forcibly`` ms have
passed since the first attempt the file is unlinked anyway (RocketMQ's forced
destroy) and marked unavailable; its mapping, which keeps serving the readers
inside, is closed by the first later round that finds no reader. (On POSIX the
space of an unlinked file returns when its last mapping closes, so forcing
the unmapping would gain nothing and could fail a read.)

Times are the store's clock (``MessageStore.open(clock=)``, ms since epoch);
disk use comes from the store's probe (``MessageStore.open(disk_usage=)``), so
tests need neither waiting nor a full disk.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import NamedTuple

from ..exceptions import StoreClosedError
from ..storage.index import index_file_size
from ..storage.mapped_file import fsync_dir

__all__ = ["CleanupReport", "Retention", "disk_usage_ratio"]

log = logging.getLogger("rmqstore.retention")

# how long one destroy waits for readers to leave before it counts as failed
# (RocketMQ's destroy does not wait at all; reads here last microseconds)
_EXCLUSIVE_WAIT = 1.0


def disk_usage_ratio(path) -> float:
    """Used fraction of the file system holding *path*, RocketMQ's
    ``UtilAll.getDiskPartitionSpaceUsedPercent`` (docs/recovery.md#disk-space):
    ``used = total - free``, ``ratio = ceil(100 * used / (used + usable)) / 100``
    where *usable* is what an unprivileged process may still allocate.
    Returns -1.0 when it cannot be determined (RocketMQ treats that as a
    reason to clean)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return -1.0
    used = total - st.f_bfree * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if entire <= 0:
        return -1.0
    return math.ceil(100 * used / entire) / 100


class CleanupReport(NamedTuple):
    """What one clean-up round did.

    Attributes:
        commit_log_files (tuple[str]): CommitLog segments deleted, oldest first.
        consume_queue_files (tuple[str]): ConsumeQueue files deleted.
        index_files (tuple[str]): index files deleted.
        min_physical_offset (int): the CommitLog's first offset afterwards.
        reason (str): why CommitLog deletion ran: ``"time"`` (a ``delete_when``
            hour), ``"space"`` (disk use), ``"manual"`` (``delete_expired``),
            joined by ``+``; ``""`` when it did not run.
        clean_at_once (bool): files were deleted regardless of age.
        disk_ratio (float): used fraction of the CommitLog's file system
            (-1.0 unknown).
        busy (bool): an expired file stayed mapped because readers held it
            (retried next round; unlinked anyway after
            ``destroy_maped_file_interval_forcibly``, then dropped from the
            queue by the first round that finds no reader).
    """

    commit_log_files: tuple
    consume_queue_files: tuple
    index_files: tuple
    min_physical_offset: int
    reason: str
    clean_at_once: bool
    disk_ratio: float
    busy: bool

    @property
    def deleted(self) -> int:
        """Number of CommitLog segments deleted."""
        return len(self.commit_log_files)


def _index_size(f) -> int:
    """Bytes of index file *f* (its geometry fixes its size)."""
    return index_file_size(f.hash_slot_num, f.index_num)


class _Freed:
    """``progress(done_bytes, total_bytes)`` for one manual round: the sizes
    of the files deleted so far of the sizes of those it set out to delete,
    told after each deletion step (one CommitLog segment, one queue's
    ConsumeQueue files, the index files)."""

    __slots__ = ("progress", "done", "total", "told")

    def __init__(self, progress, total: int) -> None:
        self.progress = progress
        self.done = 0
        self.total = total
        self.told = False

    def deleted(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self.done += nbytes
        self.total = max(self.total, self.done)
        self.told = True
        self.progress(self.done, self.total)

    def end(self) -> None:
        """The round is over: what it did not delete (a reader held the file)
        is the next round's, so the total comes down to what it freed."""
        if not self.told or self.total != self.done:
            self.total = self.done
            self.progress(self.done, self.total)


class Retention:
    """The clean-up of one writable :class:`~rmqstore.store.MessageStore`.
    Rounds are serialised (``_lock``, which the store's ``close()`` takes
    too, so it never unmaps a file under a round); use the store's
    ``run_maintenance`` / ``delete_expired``."""

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._cq_cleaned_at = -1  # CommitLog minimum the CQ/index cleaner last ran for

    # --- decisions (docs/recovery.md#retention) ----------------------------------

    def is_time_to_delete(self, now_ms: int) -> bool:
        """RocketMQ ``isTimeToDelete``: the local hour of *now_ms* is one of
        ``delete_when``'s hours (true for the whole hour)."""
        return time.localtime(now_ms / 1000).tm_hour in self.store.config.delete_hours

    def space_to_delete(self, update: bool = True) -> tuple:
        """RocketMQ ``isSpaceToDelete`` for the CommitLog's and the
        ConsumeQueues' file systems. Returns ``(to_delete, clean_immediately,
        physic_ratio)``; with *update*, sets the store's DISK_FULL state above
        the warning level and clears it at or below the clean-forcibly level."""
        store, cfg = self.store, self.store.config
        warn, forcibly = cfg.disk_space_warning_level, cfg.disk_space_clean_forcibly_level
        physic = store._probe_disk(store.commitlog.queue.directory)
        logics = store._probe_disk(os.path.join(store.root_dir, "consumequeue"))
        for ratio in (physic, logics):
            if ratio > warn:
                if update:
                    store._set_disk_full(True, ratio)
                return True, True, physic
            if ratio > forcibly:
                return True, True, physic
            if update:
                store._set_disk_full(False, ratio)
        limit = cfg.disk_max_used_space_level
        to_delete = physic < 0 or physic > limit or logics < 0 or logics > limit
        return to_delete, False, physic

    # --- one round --------------------------------------------------------------

    def run(self, manual: bool = False, force: bool = False, reserved_hours=None, progress=None) -> CleanupReport:
        """One clean-up round (RocketMQ's clean-resource task).

        Args:
            manual (bool): delete expired files now whatever the hour
                (RocketMQ ``executeDeleteFilesManually``).
            force (bool): with *manual*: every non-current segment, regardless
                of age and disk use.
            reserved_hours (int | None): age limit in hours instead of
                ``file_reserved_time``.
            progress (callable | None): ``progress(done_bytes, total_bytes)``
                as for the store's ``delete_expired``.

        Raises StoreClosedError when the store closed (``close()`` waits for
        a round in progress, holding this lock, then closes it).
        """
        store, cfg = self.store, self.store.config
        with self._lock:
            if store._closed:
                raise StoreClosedError(f"store {store.root_dir} is closed")
            now = store._clock()
            to_delete, immediately, ratio = self.space_to_delete()
            reasons = []
            if self.is_time_to_delete(now):
                reasons.append("time")
            if to_delete:
                reasons.append("space")
            if manual:
                reasons.append("manual")
            deleted: list = []
            busy = False
            clean_at_once = force or (cfg.clean_file_forcibly_enable and immediately)
            heads: list = []
            if reasons:
                hours = cfg.file_reserved_time if reserved_hours is None else reserved_hours
                heads = self._expired_heads(hours * 3_600_000, clean_at_once, now)
            freed = None
            if progress is not None:
                # (sized up front, as plan() chooses: a bar needs its total first)
                cl = store.commitlog
                cl_next = cl.queue.files[len(heads)].file_from_offset if heads else cl.min_offset()
                total = sum(mf.file_size for mf in heads if mf.available)
                if cl_next != self._cq_cleaned_at:
                    cq_heads, index_heads = self._logics_heads(cl_next)
                    total += sum(mf.file_size for mf in cq_heads) + sum(map(_index_size, index_heads))
                freed = _Freed(progress, total)
            if reasons:
                deleted, busy = self._delete_commit_log(heads, now, freed)
                if not deleted and to_delete:
                    log.warning("disk use of %s is %.2f but no CommitLog file could be deleted", store.root_dir, ratio)
            cq_files: list = []
            index_files: list = []
            cl_min = store.commitlog.min_offset()
            if cl_min != self._cq_cleaned_at:
                cq_files, index_files, done = self._clean_logics(cl_min, freed)
                if done:
                    self._cq_cleaned_at = cl_min
            if freed is not None:
                freed.end()
            return CleanupReport(
                tuple(deleted), tuple(cq_files), tuple(index_files), store.commitlog.min_offset(),
                "+".join(reasons), bool(reasons) and clean_at_once, ratio, busy,
            )

    def plan(self, force: bool = False, reserved_hours=None) -> CleanupReport:
        """What a manual round (:meth:`run` with *manual*, the store's
        ``delete_expired``) would delete now, deleting nothing and changing
        no state (a dry run; also on a read-only store): the same choice of
        CommitLog segments, then the ConsumeQueue and index files that would
        only point below the CommitLog's new first offset. Readers holding a
        file (which would make a real round retry it) are not foreseen."""
        store, cfg = self.store, self.store.config
        now = store._clock()
        _to_delete, immediately, ratio = self.space_to_delete(update=False)
        clean_at_once = force or (cfg.clean_file_forcibly_enable and immediately)
        hours = cfg.file_reserved_time if reserved_hours is None else reserved_hours
        heads = self._expired_heads(hours * 3_600_000, clean_at_once, now)
        files = store.commitlog.queue.files
        cl_min = files[len(heads)].file_from_offset if heads else store.commitlog.min_offset()
        cq_heads, index_heads = self._logics_heads(cl_min)
        return CleanupReport(
            tuple(mf.path for mf in heads if mf.available), tuple(mf.path for mf in cq_heads),
            tuple(f.path for f in index_heads), cl_min, "manual", clean_at_once, ratio, False,
        )

    def _logics_heads(self, cl_min: int) -> tuple:
        """``(ConsumeQueue files, index files)`` that only point below
        CommitLog offset *cl_min*, oldest first, queues in sorted order."""
        store = self.store
        cq_heads = [mf for _key, cq in sorted(store._cqs.items())
                    for mf in cq.queue.files[:cq.expired_head_count(cl_min)]]
        return cq_heads, store.index.files[:store.index.expired_head_count(cl_min)]

    # --- CommitLog (docs/recovery.md#retention) --------------------------------------

    def _expired_heads(self, expired_ms: int, clean_at_once: bool, now: int) -> list:
        """The CommitLog segments a round deletes, oldest first: from the
        head while each is expired (``now >= time + expired_ms``) or
        *clean_at_once*, never the current one, at most
        ``delete_file_batch_max`` not deleted yet (a segment unlinked by an
        earlier forced destroy comes along, to be dropped)."""
        cl, most = self.store.commitlog, self.store.config.delete_file_batch_max
        heads: list = []
        fresh = 0
        for mf in cl.queue.files[:-1]:
            if mf.available and not clean_at_once and now < cl.file_timestamp(mf) + expired_ms:
                break  # files go from the head only: a younger one ends the round
            heads.append(mf)
            fresh += mf.available
            if fresh >= most:
                break
        return heads

    def _delete_commit_log(self, candidates: list, now: int, freed: _Freed | None = None) -> tuple:
        store, cfg = self.store, self.store.config
        deleted: list = []
        busy = False
        for i, mf in enumerate(candidates):
            unlinked_before = not mf.available  # forced earlier: reported then
            outcome = self._destroy_commit_log_head(mf, now)
            if outcome == "busy":
                busy = True
                break
            if not unlinked_before:
                deleted.append(mf.path)
                log.info("deleted CommitLog file %s", mf.path)
                if freed is not None:
                    freed.deleted(mf.file_size)
            if outcome == "unlinked":
                busy = True  # still mapped for the readers inside: dropped by a later round
                break
            pause = cfg.delete_commit_log_files_interval
            if pause > 0 and i + 1 < len(candidates) and store._stop.wait(pause / 1000):
                break  # the store is closing
        return deleted, busy

    def _destroy_commit_log_head(self, mf, now: int) -> str:
        """RocketMQ ``MappedFile.destroy(intervalForcibly)`` for the first
        segment: ``"gone"`` (unmapped, dropped, unlinked), ``"unlinked"``
        (forced: the file is deleted but readers still use the mapping) or
        ``"busy"`` (readers inside; try again next round)."""
        store = self.store
        cl = store.commitlog
        if not cl.queue.files or cl.queue.files[0] is not mf:
            return "busy"
        if mf.first_shutdown_ms == 0:
            mf.first_shutdown_ms = now
        refs = store._refs
        if refs.acquire_exclusive(_EXCLUSIVE_WAIT):
            try:
                with store._flush_lock:  # no CommitLog sync walks the segments meanwhile
                    gone = cl.queue.delete_first(1)
            finally:
                refs.release_exclusive()
            cl.forget(gone)
            return "gone" if gone else "busy"
        if mf.available and now - mf.first_shutdown_ms >= store.config.destroy_maped_file_interval_forcibly:
            log.warning("readers still hold %s after the forcible interval; unlinking it now", mf.path)
            with store._flush_lock:
                mf.flush(0)
            mf.available = False
            try:
                os.unlink(mf.path)
            except FileNotFoundError:
                pass
            fsync_dir(cl.queue.directory)
            return "unlinked"
        log.info("CommitLog file %s is being read; deleting it later", mf.path)
        return "busy"

    # --- ConsumeQueues and index (docs/recovery.md#retention) ---------------------------

    def _clean_logics(self, cl_min: int, freed: _Freed | None = None) -> tuple:
        """Delete queue and index files below *cl_min* and correct minimum
        offsets. Returns ``(cq_paths, index_paths, complete)``."""
        store, cfg = self.store, self.store.config
        refs = store._refs
        cq_paths: list = []
        index_paths: list = []
        complete = True
        for key in sorted(store._cqs):
            cq = store._cqs.get(key)
            if cq is None:
                continue
            n = cq.expired_head_count(cl_min)
            unit = cq.get_unit(cq.min_offset_in_queue())
            if n == 0 and (unit is None or unit[0] >= cl_min):
                continue  # nothing below the minimum in this queue
            if not refs.acquire_exclusive(_EXCLUSIVE_WAIT):
                complete = False
                continue
            try:
                with store._dispatch_lock:  # dispatch appends to the same file list
                    gone = cq.queue.delete_first(n) if n else []
                    cq.correct_min_offset(cl_min)
            finally:
                refs.release_exclusive()
            cq_paths.extend(mf.path for mf in gone)
            if freed is not None:
                freed.deleted(sum(mf.file_size for mf in gone))
            pause = cfg.delete_consume_queue_files_interval
            if gone and pause > 0 and store._stop.wait(pause / 1000):
                return cq_paths, index_paths, False
        n = store.index.expired_head_count(cl_min)
        if n:
            if refs.acquire_exclusive(_EXCLUSIVE_WAIT):
                try:
                    with store._dispatch_lock:
                        sizes = [_index_size(f) for f in store.index.files[:n]]
                        index_paths = store.index.delete_first(n)
                finally:
                    refs.release_exclusive()
                if freed is not None:
                    freed.deleted(sum(sizes[:len(index_paths)]))
            else:
                complete = False
        if cq_paths or index_paths:
            log.info("deleted %d ConsumeQueue and %d index file(s) below physical offset %d",
                     len(cq_paths), len(index_paths), cl_min)
        return cq_paths, index_paths, complete
