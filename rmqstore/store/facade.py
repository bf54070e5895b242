"""MessageStore: open, close and consumer groups over the layers below it
(RocketMQ ``DefaultMessageStore``)."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings

from .. import _kernels as k
from ..config import StoreConfig
from ..exceptions import ConfigError, CorruptedFileError
from ..message import (
    GetMessageResult,
    GetViewsResult,
    Message,
    MessageExt,
    PutMessageResult,
    PutMessageStatus,
    encode_host,
)
from ..service.allocate import AllocateService
from ..service.schedule import ScheduleService
from .args import MAX_OFFSET, _now_ms
from .lock import StoreLock, _open_stores
from .pull import _MAX_FILTER_UNITS, Pull, _tag_filter, _view_units

__all__ = ["MessageStore"]

log = logging.getLogger("rmqstore.store")

_PUT_OK = PutMessageStatus.PUT_OK


def _config_of_files(root_dir) -> StoreConfig:
    """``StoreConfig()`` with the file sizes and index geometry of the store
    in *root_dir*, as far as its files tell them (none: a new store). What
    they cannot tell keeps the default, and the open's own checks then
    refuse what disagrees, as they would refuse a config given."""
    from ..tools.inference import infer_config

    try:
        config, _notes = infer_config(root_dir, StoreConfig())
    except (OSError, CorruptedFileError):  # (the open reads the files again and says what is wrong)
        return StoreConfig()
    return config


class MessageStore(Pull):
    """An embedded RocketMQ store in one directory.

    Use :meth:`open`. Layout under *root_dir*: ``commitlog/``,
    ``consumequeue/<topic>/<queue_id>/``, ``index/``, ``checkpoint``,
    ``abort`` (while open for writing), ``lock``.
    """

    @classmethod
    def open(
        cls, root_dir, config=None, store_host="127.0.0.1:10911", clock=None, read_only=False, disk_usage=None
    ) -> MessageStore:
        """Open (creating if needed) the store in *root_dir* and recover it.

        Args:
            root_dir (str | PathLike): store root (RocketMQ ``storePathRootDir``).
            config (StoreConfig | dict | None): settings; a dict may use
                RocketMQ's camelCase names. None = ``StoreConfig()`` with,
                for a store that has files, the file sizes and index
                geometry its files have (a store opens without its config
                repeated); a new store gets ``StoreConfig()``'s sizes, made
                for a service (``StoreConfig.broker_defaults()``: a broker's).
            store_host (str): ``"a.b.c.d:port"`` or ``"[v6]:port"`` written into
                STOREHOSTADDRESS of every record (and so into msgIds).
            clock (callable | None): returns the store time in ms since epoch;
                called inside the append lock. Default: the wall clock.
            read_only (bool): never write; no lock is taken, so this may run
                beside a writer. File sizes and index geometry are inferred
                from the files, so a real RocketMQ store opens as it is.
                Follow mode: reads see what a writer process dispatches
                afterwards (see :meth:`refresh`).
            disk_usage (callable | None): ``disk_usage(path) -> float``, the
                used fraction (0..1, -1.0 unknown) of the file system holding
                *path*; drives clean-up under disk pressure and write refusal
                (docs/recovery.md#retention). Default: ``statvfs`` as RocketMQ computes it.

        Raises:
            StoreLockedError: another writer holds the store.
            CorruptedFileError: a file does not match its format.
            ConfigError: bad config, or sizes that disagree with the files.
            FileNotFoundError: *read_only* and *root_dir* does not exist.
        """
        if config is None:
            config = StoreConfig() if read_only else _config_of_files(root_dir)
        elif isinstance(config, dict):
            config = StoreConfig.from_dict(config)
        elif not isinstance(config, StoreConfig):
            raise ConfigError(f"config must be a StoreConfig or a dict, got {type(config).__name__}")
        store = cls(root_dir, config, store_host, clock, read_only, disk_usage)
        try:
            store._start()
        except BaseException:
            store._closed = True
            store._stop_flusher()  # (the threads _start may have started)
            store._release()
            raise
        _open_stores.add(store)
        return store

    def _start(self) -> None:
        root = self.root_dir
        if self.read_only:
            if not os.path.isdir(root):
                raise FileNotFoundError(f"no store directory at {root}")
        else:
            os.makedirs(root, exist_ok=True)
            self._take_lock()
            for name in ("commitlog", "consumequeue", "index", "config", "abort", "checkpoint"):
                if os.path.islink(os.path.join(root, name)):  # a writer never writes through one
                    raise CorruptedFileError("a symbolic link where the store keeps a file or directory of its "
                                             "own; the store never writes through one", os.path.join(root, name))
            queues = os.path.join(root, "consumequeue")
            if os.path.lexists(queues) and not os.path.isdir(queues):  # (the open makes it below)
                raise CorruptedFileError("a file where the store keeps its ConsumeQueue directory", queues)
        abort_path = os.path.join(root, "abort")
        self.last_exit_ok = not os.path.exists(abort_path)
        # read every file and decide what recovery does, writing nothing: an
        # open that fails up to here leaves the directory as it found it
        self.commitlog.load()
        self._load_consume_queues()
        self.checkpoint.load()
        self.index.load()
        self.index.last_full_end_timestamp = self.checkpoint.index_msg_timestamp
        plan = self._plan_recovery()
        if not self.read_only:
            if self.config.schedule_service_enable:
                self._schedule = ScheduleService(self)
                self._schedule.load()  # (a delay offset file that does not parse: refused before any write)
            # from the first write on, a failure is a crash to the next open,
            # whose recovery does the same again (and never cuts records
            # that validate)
            self._write_abort(abort_path)
            # made now, as RocketMQ's store does at start, and the file system's
            # name limits asked now: not on the time of the first put
            os.makedirs(os.path.join(root, "consumequeue"), exist_ok=True)
            self._name_limits()
            self.commitlog.queue.remove_junk()
            for cq in self._cqs.values():
                cq.queue.remove_junk()
            self.index.remove_junk()
        self._recover(plan)
        self._written_end = self._flushed_where = self.commitlog.max_offset()
        self._last_store_ts = self.checkpoint.physic_msg_timestamp
        self._last_logics_ts = self.checkpoint.logics_msg_timestamp
        if not self.read_only:
            # what recovery wrote or re-dispatched is durable before new writes
            self._flush_all(sync=not self._no_flush)
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"rmqstore-flush:{os.path.basename(self.root_dir)}", daemon=True
            )
            self._flusher.start()
            # every put goes through the Appender, which dispatches at once
            # under ASYNC_FLUSH and leaves records to _commit under SYNC_FLUSH
            cfg = self.config
            self._fast = k.Appender(
                Message, PutMessageResult, _PUT_OK, self._store_host_raw, self._append_crc,
                cfg.max_message_size, cfg.message_index_enable, self._queue_offsets, encode_host,
                [cfg.delay_millis(level) for level in range(1, cfg.max_delay_level + 1)],
                not self._sync_flush, self._state,
            )
            self._rebind()
            # put_message in one kernel call (StoreCore's, through the gate); close drops it
            self._kernel_clock = None if self._clock is _now_ms else self._clock
            self._put_gate = k.PutGate(self, self._state, self._lock, self._fast, self._kernel_clock)
            if cfg.make_files_ahead:
                self._allocator = AllocateService(
                    self._lock, self.commitlog.queue, self.index if cfg.message_index_enable else None,
                    self._cqs, cfg.warm_maped_file_enable,
                    cfg.flush_least_pages_when_warm_maped_file, self._sync_flush, os.path.basename(self.root_dir),
                    self._disk_turn,
                )
                self.commitlog.queue.on_take = self._allocator.wake
                self._allocator.start()
            if self._schedule is not None:
                self._schedule.start()
            if self.config.clean_service_enable:
                self._cleaner = threading.Thread(
                    target=self._clean_loop, name=f"rmqstore-clean:{os.path.basename(self.root_dir)}", daemon=True
                )
                self._cleaner.start()
        else:
            self._next_full_refresh = time.monotonic() + 1.0
        # lookups and pulls in one kernel call each (StoreCore's methods,
        # through the gate); close drops it
        self._read_gate = k.ReadGate(self, self._state, self._cqs, self.commitlog, self.index, self._refs,
                                     self.read_only, MessageExt, GetMessageResult, GetViewsResult, _view_units,
                                     _tag_filter, _MAX_FILTER_UNITS)

    def _take_lock(self) -> None:
        self._store_lock = StoreLock(self.root_dir).acquire()

    def close(self) -> None:
        """Stop the flush thread, flush everything, write the checkpoint, remove
        ``abort`` (kept after a failed flush, so the next open recovers),
        release the lock and unmap every file. Idempotent.

        Calls racing it either answer (they got in first) or raise
        StoreClosedError: a clean-up round in progress (the service's or
        ``delete_expired``) ends first, long polls are woken, and the files
        are unmapped only once the reads inside have left (waiting at most
        ``destroy_maped_file_interval_forcibly`` ms, 1 s at least; a view
        from ``get_message_views`` keeps its mapping readable after that)."""
        if self._closed:
            return
        self._stop_flusher()
        # in this order: a clean-up round takes the flush and append locks
        # after its own, a SYNC_FLUSH group commit the append lock after the
        # flush lock (close's own flush takes the flush lock again)
        with self._retention._lock, self._flush_lock, self._lock:
            if self._closed:
                return
            try:
                if not self.read_only:
                    with self._dispatch_lock:
                        self._closing = True  # a SYNC_FLUSH put waiting to dispatch finds it done
                        if self._write_error is None:
                            self._flush_all(sync=not self._no_flush)
                            # everything is on disk: dispatch what SYNC_FLUSH puts appended
                            self._dispatch_locked(MAX_OFFSET)
                    if self._write_error is None and not self._pending:
                        try:
                            os.unlink(os.path.join(self.root_dir, "abort"))
                        except FileNotFoundError:
                            pass
                if self._offsets is not None:  # persist deferred consumer-offset commits
                    self._offsets.close()
                if self._schedule is not None and self._write_error is None:
                    self._schedule.persist()  # (its thread stopped above: delivery offsets as of now)
            finally:
                self._closed = True
                self._fast = None  # drops its references to the files
                if self._put_gate is not None:
                    self._put_gate.detach()
                    self._put_gate = None
                if self._read_gate is not None:
                    self._read_gate.detach()
                    self._read_gate = None
                self._release()

    def _crash(self) -> None:
        """Test hook: drop the store as a killed process would. Nothing is
        flushed, the checkpoint is not written, ``abort`` stays, the lock is
        released. Data already in the mappings stays in the page cache, exactly
        as after ``kill -9``."""
        self._stop_flusher()
        with self._retention._lock, self._flush_lock, self._lock:  # (close's order)
            self._closed = True
            self._release()

    def _stop_flusher(self) -> None:
        self._stop.set()
        if self._schedule is not None:  # (first: its puts may wait for the others)
            self._schedule.stop()
        if self._allocator is not None:
            self._allocator.stop()
        for t in (self._cleaner, self._flusher):
            if t is not None and t is not threading.current_thread():
                t.join()

    def _release(self) -> None:
        self._wake_waiters()  # _closed is set: waiting long polls return now
        for c in list(self._consumers):  # (their queues go to the group's other members, as at a process's death)
            c._leave_group()
        # reads that start from now on raise StoreClosedError; the ones inside
        # finish before a file is unmapped (the kernels that read without a
        # reference see the references held exclusively, for good)
        drain = max(1.0, self.config.destroy_maped_file_interval_forcibly / 1000)
        if not self._refs.shutdown(drain):
            log.warning("closing %s with reads still inside after %.0f s", self.root_dir, drain)
        with self._dispatch_lock:  # (no flush() walks the files meanwhile)
            self.commitlog.close()
            for cq in list(self._cqs.values()):
                cq.close()
            self.index.close()
        if self._store_lock is not None:
            self._store_lock.release()
            self._store_lock = None

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            warnings.warn(f"MessageStore {self.root_dir} was not closed", ResourceWarning, stacklevel=2)
            try:
                self.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

    def consumer_offsets(self):
        """The store's :class:`~rmqstore.service.offsets.ConsumerOffsetStore` over
        ``<root_dir>/config/consumerOffset.json``, loaded on first use (from
        ``.bak`` when the file is missing or does not parse). Commits through it
        are on disk when they return unless made with ``sync=False``. A
        read-only store commits too (a consumer in a follower process): the
        file is the one thing it writes, and only when something is
        committed; commits of several processes are merged under a file lock.

        Raises StoreClosedError; CorruptedFileError when neither the file nor
        its ``.bak`` parses."""
        self._ensure_open()
        offsets = self._offsets
        if offsets is None:
            from ..service.offsets import CONSUMER_OFFSET_FILE, ConsumerOffsetStore

            with self._lock:
                self._ensure_open()  # (close persists and drops it under this lock)
                if self._offsets is None:
                    created = ConsumerOffsetStore(  # (commits from a read-only store too: a follower's consumers)
                        os.path.join(self.root_dir, CONSUMER_OFFSET_FILE),
                        owner_closed=lambda: self._closed,
                    )
                    created.load()
                    self._offsets = created  # type: ignore[assignment]  # (declared None in __init__)
                offsets = self._offsets
        return offsets

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, sync=None) -> None:
        """Record that consumer group *group* has consumed *queue_id* of *topic*
        up to queue offset *offset* (exclusive: *offset* is the next message to
        consume), as a broker does for a consumer's ``updateConsumerOffset``.
        Stored in ``config/consumerOffset.json`` under ``"<topic>@<group>"``;
        a read-only store (a follower process) commits too, merged with the
        commits of the other processes (see :meth:`consumer_offsets`).

        Args:
            group (str), topic (str): non-empty, without ``@``.
            queue_id (int): 0 .. 2**31-1; the queue need not exist yet.
            offset (int): 0 .. 2**63-1, a queue offset (not checked against the
                queue; a smaller value than the stored one moves it back).
            sync (bool | None): True (the default, None): on disk before
                returning. False: persisted by the next periodic persist (every
                5000 ms, RocketMQ ``flushConsumerOffsetInterval``), ``flush``
                of the offset store, or :meth:`close`; a crash loses it.

        Raises:
            StoreClosedError: the store is closed.
            MessageTypeError, IllegalMessageError: bad arguments.
            OSError: the file could not be written (the previous file is intact).
        """
        self._ensure_open()
        self.consumer_offsets().commit(group, topic, queue_id, offset, sync)

    def get_committed_offset(self, group: str, topic: str, queue_id: int):
        """The offset *group* committed for *queue_id* of *topic* (the next queue
        offset it will consume, an int), or None if it never committed one
        (RocketMQ's ``queryOffset`` answers -1). Works on read-only stores,
        re-reading the file when a writer changed it.

        Raises StoreClosedError, MessageTypeError, CorruptedFileError (see
        :meth:`consumer_offsets`)."""
        return self.consumer_offsets().get(group, topic, queue_id)

    def consumer(self, group: str, topic: str, queue_ids=None, batch: int = 32, tags=None, sync=None,
                 wait_ms=None, max_reconsume_times: int = 16):
        """A :class:`~rmqstore.service.consumer.Consumer` of *topic* for consumer group
        *group*: an iterator of :class:`MessageExt` from the group's committed
        offsets (a queue's first message when none), round robin over the
        queues (*queue_ids*, or every queue of the topic), committing each
        message's next offset when the following one is asked for
        (at-least-once). When every queue is drained it waits up to *wait_ms*
        ms (an int or a float; ``math.inf``: until closed) for new messages,
        without polling, then stops; None (the default) stops at once. Iterate
        it again or make a new one to continue. *batch* messages are pulled
        per queue at a time; *tags* filters as in :meth:`get_messages`;
        *sync* as in :meth:`commit_offset`.

        Without *queue_ids* it is a member of the group (the members divide
        the queues) and also consumes the group's ``%RETRY%<group>`` topic:
        ``consumer.reconsume_later(msg)`` hands a failed message back, to
        come again after a delay, or to ``%DLQ%<group>`` after
        *max_reconsume_times* reconsumes (docs/service.md#retries-and-dead-letters).

        A read-only store (a follower of a writer process) has consumers
        too: they read what the writer publishes and commit as the writer's
        do.

        Raises StoreClosedError, MessageTypeError, IllegalMessageError,
        ArgumentError (a negative or NaN *wait_ms*)."""
        from ..service.consumer import Consumer

        self._ensure_open()
        c = Consumer(self, group, topic, queue_ids=queue_ids, batch=batch, tags=tags, sync=sync, wait_ms=wait_ms,
                     max_reconsume_times=max_reconsume_times)
        self._consumers.add(c)
        return c
