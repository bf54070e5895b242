"""Flush and dispatch: the flush thread, SYNC_FLUSH group commit, and the
dispatch of appended records to ConsumeQueues and the index
(docs/recovery.md#flush, docs/recovery.md#dispatch)."""

from __future__ import annotations

import logging
import os
import time

from ..dispatch import gets_consume_queue_unit, gets_index_entries, index_keys
from ..exceptions import FlushError, StoreClosedError
from ..storage.consumequeue import ConsumeQueue
from .args import MAX_OFFSET
from .space import Space

log = logging.getLogger("rmqstore.store")


class Commit(Space):
    """The layer that makes writes durable and visible: RocketMQ's
    ``FlushRealTimeService`` (the flush thread) and ``GroupCommitService``
    (SYNC_FLUSH), and the dispatch of records to their ConsumeQueue and the
    index (``CommitLogDispatcherBuildConsumeQueue`` and ``...BuildIndex``),
    done synchronously here."""

    def _fail_write(self, err: OSError) -> FlushError:
        """A sync failed: refuse every later write (never retry into a PUT_OK)."""
        if self._write_error is None:
            self._write_error = err
            log.error("flush of %s failed, the store takes no more writes: %s", self.root_dir, err)
        return FlushError(err.errno, f"flush failed, the store takes no more writes: {err.strerror or err}")

    def _check_write_error(self) -> None:
        err = self._write_error
        if err is not None:
            raise FlushError(
                err.errno, f"a flush failed earlier, the store takes no more writes: {err.strerror or err}"
            )

    def _flush_commit_log(self, least_pages: int, needed: int = MAX_OFFSET) -> None:
        """Flush the CommitLog unless it is already on disk up to *needed*;
        after a complete flush publish how far it is on disk and the store time
        of the last record known to be there (docs/recovery.md#pitfall-checkpoint-ahead-of-disk)."""
        with self._flush_lock:
            if self._flushed_where >= needed:
                return  # a sync that started after our append covered us (group commit)
            with self._lock:
                target, ts = self._written_end, self._last_store_ts
            if self._flushed_where >= target:
                return
            try:
                self.commitlog.flush(least_pages)
            except OSError as e:
                raise self._fail_write(e) from e
            if least_pages == 0:
                # the sync also covered what was appended while it ran
                self._publish_commit_log(max(target, self.commitlog.flushed_offset()), ts)

    def _publish_commit_log(self, end: int, ts: int) -> None:
        """The CommitLog counts as flushed up to offset *end*, its last record
        there stored at *ts* (ms): for the checkpoint, and for the puts and
        syncs that wait on ``_flushed_where``."""
        self._flushed_where = end
        self.checkpoint.physic_msg_timestamp = ts
        # and where: recovery tells disk damage from a torn end by it
        self.checkpoint.confirm_phy_offset = end

    def _flush_consume_queues(self, least_pages: int) -> None:
        ts = self._last_logics_ts  # captured before: only what the flush covers is published
        try:
            for cq in list(self._cqs.values()):
                cq.flush(least_pages)
        except OSError as e:
            raise self._fail_write(e) from e
        if least_pages == 0:
            self.checkpoint.logics_msg_timestamp = ts

    def _flush_all(self, sync: bool = True) -> None:
        """Flush every file and write the checkpoint. With *sync* False
        (NO_FLUSH's open and close) nothing is synced: the checkpoint is
        written with what was appended, and the kernel writes it all back
        in its own time (docs/recovery.md#no_flush)."""
        if sync:
            self._flush_commit_log(0)
            self._flush_consume_queues(0)
        else:
            with self._lock:
                self._publish_commit_log(self._written_end, self._last_store_ts)
            self.checkpoint.logics_msg_timestamp = self._last_logics_ts
        try:
            if sync:
                self.index.flush()
            else:
                self.index.sync_published()  # (a file's creation is synced in every mode)
            self.checkpoint.index_msg_timestamp = self.index.last_full_end_timestamp
            self.checkpoint.flush(sync=sync)
        except OSError as e:
            raise self._fail_write(e) from e

    def _flush_loop(self) -> None:
        """RocketMQ's flush services in one thread: the CommitLog every
        ``flush_interval_commit_log`` ms (ASYNC_FLUSH; least-pages rule, a
        complete flush every ``flush_commit_log_thorough_interval``), the
        ConsumeQueues every ``flush_interval_consume_queue`` ms (complete every
        ``flush_consume_queue_thorough_interval``), the checkpoint every second.
        Under NO_FLUSH only the disk-space probe. The CommitLog and
        ConsumeQueue syncs take the disk turn, which the warm-up takes too
        (rmqstore/service/allocate.py)."""
        cfg = self.config
        syncs = not self._no_flush
        now = time.monotonic()
        next_cl = next_cq = next_cp = now
        thorough_cl = thorough_cq = now
        tick = min(cfg.flush_interval_commit_log, cfg.flush_interval_consume_queue, 1000) / 1000
        while not self._stop.wait(tick):
            if self._write_error is not None:
                return
            now = time.monotonic()
            try:
                if syncs and not self._sync_flush and now >= next_cl:
                    complete = now - thorough_cl >= cfg.flush_commit_log_thorough_interval / 1000
                    with self._disk_turn:
                        self._flush_commit_log(0 if complete else cfg.flush_commit_log_least_pages)
                    thorough_cl = now if complete else thorough_cl
                    next_cl = now + cfg.flush_interval_commit_log / 1000
                if syncs and now >= next_cq:
                    complete = now - thorough_cq >= cfg.flush_consume_queue_thorough_interval / 1000
                    with self._disk_turn, self._dispatch_lock:
                        self._flush_consume_queues(0 if complete else cfg.flush_consume_queue_least_pages)
                    thorough_cq = now if complete else thorough_cq
                    next_cq = now + cfg.flush_interval_consume_queue / 1000
                if syncs and now >= next_cp:
                    self.checkpoint.index_msg_timestamp = self.index.last_full_end_timestamp
                    self.checkpoint.flush()
                    next_cp = now + 1.0
                if now >= self._disk_next_check:
                    self.check_disk_space()
            except FlushError:
                return  # _fail_write logged it; puts now raise FlushError
            except OSError as e:
                self._fail_write(e)
                return
            except (ValueError, StoreClosedError):  # pragma: no cover - closed under us
                return

    def flush(self) -> None:
        """Force CommitLog, ConsumeQueues, index and checkpoint to disk.

        Raises FlushError if a sync fails (the store then takes no more writes);
        StoreClosedError."""
        self._ensure_open()
        if self.read_only:
            return
        self._check_write_error()
        with self._dispatch_lock:
            self._ensure_open()  # (close unmaps under this lock)
            self._flush_all()

    def _index_keys(self, sys_flag: int, unique_key, keys) -> int:
        """How many index entries a record takes: none with the index off or
        for a transaction rollback record."""
        if not self.config.message_index_enable or not gets_index_entries(sys_flag):
            return 0
        return len(index_keys(unique_key, keys))

    def _new_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A ConsumeQueue object for a queue this store writes first (no file yet)."""
        return ConsumeQueue(
            os.path.join(self.root_dir, "consumequeue"), topic, queue_id, self.config.mapped_file_size_consume_queue
        )

    def _dispatch_pending(self, upto: int) -> None:
        """Dispatch pending records that end at or before physical offset *upto*,
        in CommitLog order."""
        with self._dispatch_lock:
            if self._closing:  # close dispatched everything it flushed, then unmapped
                if self._pending and self._pending[0][3] + self._pending[0][4] <= upto:
                    self._ensure_open()
                    raise StoreClosedError(f"store {self.root_dir} closed before this put was dispatched")
                return
            self._dispatch_locked(upto)
        if self._waiting:  # read after the units are in: a waiter that missed it sees them
            self._wake_waiters()

    def _dispatch_locked(self, upto: int) -> None:
        """:meth:`_dispatch_pending`'s work; the dispatch lock is held."""
        pending = self._pending
        while pending and pending[0][3] + pending[0][4] <= upto:
            p = pending[0]
            self._dispatch(*p)
            pending.popleft()
            self._pending_keys -= self._index_keys(p[5], p[8], p[9])

    def _commit(self, end: int) -> None:
        """SYNC_FLUSH: return once the CommitLog is on disk up to *end*, then
        dispatch what is on disk (RocketMQ 5.3.2+ dispatches only flushed data
        in this mode). Group commit: one leader syncs at a time; every producer
        whose record the sync covered wakes and returns together, and all of
        them append again during the next sync, which then covers them all."""
        cond = self._commit_cond
        with cond:
            while self._flushed_where < end and self._committing:
                cond.wait()
            lead = self._flushed_where < end
            if lead:
                self._check_write_error()
                self._committing = True
        if lead:
            try:
                self._flush_commit_log(0, end)
            finally:
                with cond:
                    self._committing = False
                    cond.notify_all()
        self._dispatch_pending(self._flushed_where)

    def _dispatch(self, topic, queue_id, queue_offset, phy, size, sys_flag, store_ts, code, unique_key,
                  keys) -> None:
        """Build the ConsumeQueue unit (tags code *code*) and the index
        entries of one record (docs/recovery.md#dispatch)."""
        if gets_consume_queue_unit(sys_flag):
            cq = self._cqs.get((topic, queue_id))
            if cq is None:  # (recovery's re-dispatch: puts reserve their queues first)
                cq = self._cqs[(topic, queue_id)] = self._new_consume_queue(topic, queue_id)
            cq.put(phy, size, code, queue_offset)
            self._last_logics_ts = store_ts
        if self.config.message_index_enable:
            self.index.build_index(topic, phy, store_ts, sys_flag, unique_key, keys)
