"""Retention and disk space: deleting expired files, the clean-up thread,
refusing puts while the disk is full (docs/recovery.md#retention)."""

from __future__ import annotations

import errno
import logging
import os
import time

from ..exceptions import ConfigError, DiskFullError, StoreClosedError
from ..message import PutMessageStatus
from .args import _I32_MAX
from .follow import Follow

log = logging.getLogger("rmqstore.store")


class Space(Follow):
    """The layer that ages data out and watches the disk: RocketMQ's
    ``CleanCommitLogService`` and ``CleanConsumeQueueService`` (run by
    :class:`~rmqstore.service.retention.Retention`) and its DISK_FULL
    running flag."""

    def delete_expired(self, force: bool = False, reserved_hours=None, dry_run: bool = False, progress=None):
        """Delete expired files now, whatever the hour (RocketMQ's admin
        ``deleteExpiredCommitLog`` / ``executeDeleteFilesManually``), then the
        ConsumeQueue and index files that only point below the new CommitLog
        minimum, and correct every queue's minimum offset.

        Args:
            force (bool): delete every CommitLog segment but the current one,
                regardless of age (RocketMQ's clean-at-once).
            reserved_hours (int | None): keep files younger than this many
                hours (0 .. 2**31-1) instead of ``file_reserved_time``.
            dry_run (bool): report what would be deleted now and delete
                nothing (on a read-only store too): the same choice, but for
                files a reader would hold at that moment.
            progress (callable | None): ``progress(done_bytes, total_bytes)``:
                the sizes in bytes of the files deleted so far (CommitLog,
                ConsumeQueue and index files) of the sizes of those the round
                is to delete, chosen as a dry run chooses them. Called after
                each CommitLog segment, after each queue's ConsumeQueue files
                and after the index files; the last call has ``done_bytes ==
                total_bytes`` (when a reader held a file, which the next call
                retries, the total comes down to the bytes freed; ``(0, 0)``
                when there was nothing to delete). Never called on a dry run.

        A segment's age is its last record's store time (its mtime when it has
        none, docs/recovery.md#pitfall-retention-by-mtime) against the store clock. At most ``delete_file_batch_max``
        segments go per call, ``delete_commit_log_files_interval`` ms apart;
        segments a reader is inside are retried on the next call.

        Returns a :class:`~rmqstore.service.retention.CleanupReport`; its ``deleted``
        is the number of CommitLog segments deleted.

        Raises StoreReadOnlyError (not for a dry run), StoreClosedError;
        OSError from unlinking; what *progress* raises, which ends the round
        there (the next call deletes the rest).
        """
        if dry_run:
            self._ensure_open()
        else:
            self._ensure_writable()
        if reserved_hours is not None and (isinstance(reserved_hours, bool) or not isinstance(reserved_hours, int)
                                           or not 0 <= reserved_hours <= _I32_MAX):
            raise ConfigError(f"reserved_hours must be an int in [0, {_I32_MAX}] (as file_reserved_time), "
                              f"got {reserved_hours!r}")
        if dry_run:
            return self._retention.plan(force=force, reserved_hours=reserved_hours)
        return self._retention.run(manual=True, force=force, reserved_hours=reserved_hours, progress=progress)

    def run_maintenance(self):
        """One round of RocketMQ's periodic clean-up (what the background
        service runs every ``clean_resource_interval`` ms; call it yourself
        with ``clean_service_enable=False``): delete expired CommitLog
        segments when the local hour is in ``delete_when`` or disk use is above
        ``disk_max_used_space_ratio`` (all non-current ones above the
        clean-forcibly level), let ConsumeQueues and index follow, update the
        disk-full state. On a read-only store: :meth:`refresh` only.

        Returns a :class:`~rmqstore.service.retention.CleanupReport` (None when read-only).
        Raises StoreClosedError."""
        self._ensure_open()
        if self.read_only:
            self.refresh()
            return None
        return self._retention.run()

    def _clean_loop(self) -> None:
        """The clean-up service thread: first round ``clean_resource_initial_delay``
        ms after open, then every ``clean_resource_interval`` ms."""
        cfg = self.config
        if self._stop.wait(cfg.clean_resource_initial_delay / 1000):
            return
        while True:
            try:
                self.run_maintenance()
            except StoreClosedError:
                return
            except Exception:  # keep cleaning: one bad round must not stop retention
                if self._stop.is_set():
                    return
                log.exception("clean-up round of %s failed", self.root_dir)
            if self._stop.wait(max(cfg.clean_resource_interval, 1) / 1000):
                return

    def _probe_disk(self, path) -> float:
        if not os.path.isdir(path):
            path = self.root_dir
        try:
            return float(self._disk_usage(path))
        except Exception:  # a probe must never break puts or the flusher
            log.exception("disk usage probe failed for %s", path)
            return -1.0

    def check_disk_space(self) -> float:
        """Probe the CommitLog's file system now and update the disk-full state
        (RocketMQ ``isSpaceFull``): puts are refused with :class:`DiskFullError`
        while use is above ``disk_space_warning_level_ratio`` (clamped to
        [35, 90] %). Runs by itself every ``disk_check_interval`` ms (flush
        thread) and, while puts are refused, on a put at the same cadence.
        Returns the used fraction (0..1; -1.0 unknown)."""
        ratio = self._probe_disk(self.commitlog.queue.directory)
        self._disk_next_check = time.monotonic() + self.config.disk_check_interval / 1000
        self._set_disk_full(ratio > self.config.disk_space_warning_level, ratio)
        return ratio

    @property
    def disk_full(self) -> bool:
        """Whether puts are refused for lack of disk space right now."""
        return self._disk_full

    def _set_disk_full(self, full: bool, ratio: float) -> None:
        self._disk_ratio = ratio
        if full and not self._disk_full:
            log.error("disk of %s is %.0f%% used: refusing puts until it is below %.0f%%", self.root_dir,
                      ratio * 100, self.config.disk_space_warning_level * 100)
        elif not full and self._disk_full:
            log.info("disk of %s is %.0f%% used: accepting puts again", self.root_dir, ratio * 100)
        self._disk_full = full

    def _refuse_if_disk_full(self) -> None:
        """Put-side hook, entered only while the disk-full state is set:
        re-probe when due, raise while still full."""
        if time.monotonic() >= self._disk_next_check:
            self.check_disk_space()
        if not self._disk_full:
            return
        raise DiskFullError(
            errno.ENOSPC,
            f"disk use {self._disk_ratio:.0%} is above disk_space_warning_level_ratio "
            f"({self.config.disk_space_warning_level:.0%}); puts resume when it falls back",
            self.commitlog.queue.directory, status=PutMessageStatus.SERVICE_NOT_AVAILABLE, ratio=self._disk_ratio,
        )
