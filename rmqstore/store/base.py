"""The state of one open store: its files, locks, threads and flags, and the
checks every call makes first (open, writable)."""

from __future__ import annotations

import collections
import operator
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from .. import _kernels as k
from ..commitlog import CommitLog
from ..config import NO_FLUSH, SYNC_FLUSH, StoreConfig
from ..exceptions import StoreClosedError, StoreReadOnlyError

if TYPE_CHECKING:
    from ..service.allocate import AllocateService
    from ..service.schedule import ScheduleService
from ..message import encode_host
from ..storage.checkpoint import StoreCheckpoint
from ..storage.index import IndexService
from ..storage.mapped_file import ReferenceResource
from .args import _now_ms
from .lock import StoreLock


def _state_field(name: str) -> property:
    """A MessageStore attribute kept in its StoreState as *name*."""

    def set_field(self, value) -> None:
        setattr(self._state, name, value)

    return property(operator.attrgetter(f"_state.{name}"), set_field)


class StoreBase(k.StoreCore):
    """What every layer of :class:`~rmqstore.store.MessageStore` works on.

    The layers, each a subclass of the one before, each calling only
    itself and the layers below it: :class:`StoreBase` (state), follow
    (read-only follow mode), space (retention and disk space), commit
    (flush, dispatch, SYNC_FLUSH group commit), recovery, put, pull, and
    the facade, :class:`MessageStore` (open and close, consumer groups)."""

    # the state the gates check and update on every put and read lives in a
    # k.StoreState (C fields in the core); these names read and write it
    _closed = _state_field("closed")
    _disk_full = _state_field("disk_full")
    _pending = _state_field("pending")
    _pending_keys = _state_field("pending_keys")
    _write_error = _state_field("write_error")
    _waiting = _state_field("waiting")
    _written_end = _state_field("written_end")
    _last_store_ts = _state_field("last_store_ts")
    _last_logics_ts = _state_field("last_logics_ts")

    def __init__(self, root_dir, config: StoreConfig, store_host, clock, read_only: bool, disk_usage=None):
        self._state = k.StoreState()
        self.root_dir = os.path.abspath(os.fspath(root_dir))
        self._opened_by = os.getpid()  # a forked child finds another pid (see _forked)
        self.config = config
        self.read_only = read_only
        self._store_host_raw = encode_host(store_host)
        self._clock = clock or _now_ms
        self._lock = k.AppendLock()  # reentrant (RocketMQ's PutMessageReentrantLock)
        self._closed = False
        self._store_lock: StoreLock | None = None  # the writer lock (docs/recovery.md#writer-lock-and-abort-file)
        self._cqs: dict = {}  # (topic, queue_id) -> ConsumeQueue; only ever added to (ReadGate keeps what it found)
        self._queue_offsets: dict = {}
        self._topics: dict = {}  # validated topic -> UTF-8 bytes
        self._limits: tuple | None = None  # _name_limits()
        self._fast: Any = None  # k.Appender: the ASYNC_FLUSH put path, bound in _start
        self._put_gate: Any = None  # k.PutGate: put_message's checks and bookkeeping around _fast
        self._read_gate: Any = None  # k.ReadGate: the common case of lookups and pulls, bound in _start
        self._kernel_clock: Any = None  # the store clock as kernels take it (None: their own wall clock)
        self._append_crc = config.enabled_append_prop_crc
        self._sync_flush = config.flush_disk_type == SYNC_FLUSH
        self._no_flush = config.flush_disk_type == NO_FLUSH  # nothing synced but files' creation
        # records appended but not yet dispatched, in CommitLog order: (topic, queue_id,
        # queue_offset, physical_offset, size, sys_flag, store_timestamp, tags_code,
        # unique_key, keys); their index keys are counted in _pending_keys
        self._pending = collections.deque()
        self._closing = False  # close() has begun: nothing is dispatched any more
        self._dispatch_lock = threading.Lock()
        # one CommitLog sync at a time; re-entrant: close() holds it around its own flush
        self._flush_lock = threading.RLock()
        # the service threads' long kernel work (the flush thread's syncs, the
        # warm-up) one at a time: with both at once as well as the putting
        # thread, a 2-core machine preempts the putter for milliseconds
        self._disk_turn = threading.Lock()
        self._commit_cond = threading.Condition()  # SYNC_FLUSH producers wait here
        self._committing = False  # a group-commit leader is syncing
        self._written_end = 0  # physical offset past the last appended record
        self._flushed_where = 0  # physical offset up to which the CommitLog is on disk
        self._last_store_ts = 0  # store time of the last appended record
        self._last_logics_ts = 0  # store time of the last record dispatched to a ConsumeQueue
        self._write_error = None  # a failed flush (an OSError): the store takes no more writes
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        self._arrival = threading.Condition()  # long-polling pulls wait here
        self._waiting = 0  # pulls waiting: dispatch notifies only when there are some
        self.last_exit_ok = True
        self.recovery_report: dict = {}
        self._offsets = None  # ConsumerOffsetStore (service/offsets.py), created by consumer_offsets()
        self._schedule: ScheduleService | None = None  # a writer's delayed delivery (service/schedule.py)
        # consumers made by consumer(): their group leases end with the store
        self._consumers: weakref.WeakSet = weakref.WeakSet()
        # retention, disk space and follow mode (retention.py, docs/recovery.md#retention)
        from ..service.retention import Retention, disk_usage_ratio

        self._disk_usage = disk_usage or disk_usage_ratio
        self._refs = ReferenceResource()  # readers: one hold per pull or lookup
        self._retention = Retention(self)
        self._cleaner: threading.Thread | None = None
        self._allocator: AllocateService | None = None  # files made ahead (service/allocate.py)
        self._disk_full = False  # RocketMQ's DISK_FULL running flag (or a stuck dispatch): puts refused
        self._disk_ratio = -1.0
        self._disk_next_check = 0.0  # time.monotonic() of the next probe
        self._next_full_refresh = 0.0  # read-only follow mode: next directory re-scan
        self.checkpoint = StoreCheckpoint(os.path.join(self.root_dir, "checkpoint"))
        ro = read_only
        self.commitlog = CommitLog(
            os.path.join(self.root_dir, "commitlog"),
            None if ro else config.mapped_file_size_commit_log,
            config.max_message_size,
            read_only=ro,
        )
        self.index = IndexService(
            os.path.join(self.root_dir, "index"),
            None if ro else config.max_hash_slot_num,
            None if ro else config.max_index_num,
            read_only=ro,
            max_msgs_num_batch=config.max_msgs_num_batch,
        )
        self.index.sync_rolls = not self._no_flush

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def _ensure_open(self) -> None:
        if self._closed:
            if self._opened_by != os.getpid():
                raise StoreClosedError(
                    f"store {self.root_dir} was opened by process {self._opened_by}: a forked child cannot use it "
                    "(open the store in the child, once the parent has closed it)"
                )
            raise StoreClosedError(f"store {self.root_dir} is closed")

    def _forked(self) -> None:
        """In a forked child (see :func:`_after_fork_in_child`): closed
        without a write. The gates are detached, so their methods go to the
        store's, which raise; the threads, the lock and the files stay the
        parent's."""
        self._closed = True
        for gate in (self._put_gate, self._read_gate):
            if gate is not None:
                gate.detach()
        if self._store_lock is not None:
            self._store_lock._forget()
            self._store_lock = None

    def _ensure_writable(self) -> None:
        self._ensure_open()
        if self.read_only:
            raise StoreReadOnlyError(f"store {self.root_dir} is open read-only")

    def _wake_waiters(self) -> None:
        """Wake every long poll waiting for arrivals (or for close)."""
        with self._arrival:
            self._arrival.notify_all()

    @property
    def min_physical_offset(self) -> int:
        """First physical offset still stored."""
        return self.commitlog.min_offset()

    @property
    def max_physical_offset(self) -> int:
        """Physical offset one past the last record."""
        return self.commitlog.max_offset()

    def consume_queue(self, topic: str, queue_id: int):
        """The :class:`ConsumeQueue` of (topic, queue_id), or None."""
        return self._cqs.get((topic, queue_id))

    def queues(self) -> list:
        """Every (topic, queue_id) that has a ConsumeQueue, sorted."""
        return sorted(key for key, cq in self._cqs.items() if cq.queue.files)

    def _held(self, kernel, *args):
        """``kernel(*args, None)`` under a reader reference: the whole-operation
        kernels (``time_lookup``, ``query_keyed``, ``pull_views``) take no
        reference and answer None while a clean-up holds them; this waits
        for it, then reads (never None with ``refs=None``)."""
        self._refs.hold()
        try:
            return kernel(*args, None)
        finally:
            self._refs.release()

    def __repr__(self):
        mode = "read-only" if self.read_only else "read-write"
        return f"<MessageStore {self.root_dir!r} {mode}{' closed' if self._closed else ''}>"
