"""Follow mode: a read-only store takes in what a writer process appended,
dispatched or deleted since it looked last."""

from __future__ import annotations

import os
import time

from ..storage.consumequeue import ConsumeQueue, queue_dirs
from .base import StoreBase


class Follow(StoreBase):
    """The layer of :class:`~rmqstore.store.MessageStore` that follows a writer
    process from a read-only open: what it appended, dispatched, made and
    deleted. (A RocketMQ slave gets its data by HA replication instead; a
    follower here reads the writer's own files.)"""

    def refresh(self) -> bool:
        """Read-only follow mode: take in what a writer process did since the
        last look — new records, ConsumeQueue units, queues, CommitLog,
        ConsumeQueue and index files — and drop files it deleted (correcting
        minimum offsets). Reads of a read-only store call the cheap part of
        this (the asked queue's tail) by themselves when asked beyond the
        known end, and all of it at most once a second. Returns whether
        anything new was found; a no-op on a writable store.

        Raises StoreClosedError."""
        self._ensure_open()
        if not self.read_only:
            return False
        self._next_full_refresh = time.monotonic() + 1.0
        grew = False
        refs = self._refs
        refs.hold()  # the scan reads the files close() unmaps
        try:
            for topic, qid, _qdir in queue_dirs(self.root_dir):
                if (topic, qid) not in self._cqs:
                    grew |= self._follow_queue_held(topic, qid)
            grew |= self._follow_commit_log()
            end = self.commitlog.max_offset()
            for cq in list(self._cqs.values()):
                grew |= cq.follow(end)
            _added, n_index = self.index.follow()
        finally:
            refs.release()
        self._drop_vanished(n_index)
        return grew

    def _drop_vanished(self, n_index: int) -> None:
        """Forget files a writer process deleted (clean-up) and move minimum
        offsets past them, exclusively so no read of this process is inside."""
        cl_q = self.commitlog.queue
        n_cl = cl_q.vanished_head()
        cq_n = {key: cq.queue.vanished_head() for key, cq in self._cqs.items()}
        if not n_cl and not any(cq_n.values()) and not n_index:
            return
        if not self._refs.acquire_exclusive(5.0):
            return  # readers stayed inside: next refresh
        try:
            gone = cl_q.delete_first(n_cl) if n_cl else []
            self.commitlog.forget(gone)
            cl_min = self.commitlog.min_offset()
            for key, n in cq_n.items():
                cq = self._cqs[key]
                if n:
                    cq.queue.delete_first(n)
                cq.correct_min_offset(cl_min)
            if n_index:
                self.index.delete_first(n_index)
        finally:
            self._refs.release_exclusive()

    def _follow_commit_log(self) -> bool:
        cfg = self.config
        crc_mode = 1 if cfg.force_verify_prop_crc else (2 if cfg.enabled_append_prop_crc else 0)
        return self.commitlog.follow(cfg.check_crc_on_recover, crc_mode)

    def _follow_if_behind(self, topic, queue_id, offset) -> None:
        """Follow mode, before a pull that does not wait: a writer process may
        have dispatched more than this reader has mapped at *offset*."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None or offset >= cq.max_offset_in_queue():
            self._follow_queue(topic, queue_id)

    def _follow_queue(self, topic, queue_id) -> bool:
        """Read-only: take in new units of one queue (creating it when the
        writer made it after we opened) and the records they point at, under
        a reader reference; all of :meth:`refresh` when one is due. Raises
        StoreClosedError."""
        refs = self._refs
        refs.hold()
        try:
            grew = self._follow_queue_held(topic, queue_id)
        finally:
            refs.release()
        if time.monotonic() >= self._next_full_refresh:
            grew |= self.refresh()
        return grew

    def _follow_queue_held(self, topic, queue_id) -> bool:
        """_follow_queue's part under the reference. The CommitLog goes
        first: the writer stores a record before its unit."""
        self._follow_commit_log()
        end = self.commitlog.max_offset()
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            path = os.path.join(self.root_dir, "consumequeue", topic, str(queue_id))
            if not os.path.isdir(path):
                return False
            cq = ConsumeQueue(os.path.join(self.root_dir, "consumequeue"), topic, queue_id, None, read_only=True)
            if not cq.follow(end):
                cq.close()
                return False
            cq.correct_min_offset(self.commitlog.min_offset())
            self._cqs[(topic, queue_id)] = cq
            return True
        return cq.follow(end)
