"""MessageStore: lifecycle, recovery and dispatch over CommitLog, ConsumeQueues
and the IndexFile (RocketMQ ``DefaultMessageStore``, docs/recovery.md#dispatch, docs/recovery.md#recovery).

Dispatch is synchronous: a message is in its ConsumeQueue and the index when
``put_message`` returns.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import logging
import math
import operator
import os
import threading
import time
import warnings
import weakref
from typing import Any

from . import _kernels as k
from .commitlog import CommitLog
from .config import SYNC_FLUSH, StoreConfig
from .dispatch import consume_queue_mask, gets_consume_queue_unit, gets_index_entries, index_keys, tags_code
from .exceptions import (
    ArgumentError,
    ConfigError,
    CorruptedFileError,
    DiskFullError,
    FlushError,
    IllegalMessageError,
    MessageTooLargeError,
    MessageTypeError,
    PropertiesSizeExceededError,
    StoreClosedError,
    StoreLockedError,
    StoreReadOnlyError,
)
from .format.layout import (
    BORNHOST_V6_FLAG,
    CQ_STORE_UNIT_SIZE,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    PRE_BLANK_SIZE,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    REC_STATUS_TEXT,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
)
from .message import (
    _INT64,
    MESSAGE_TYPES,
    GetColumnsResult,
    GetMessageResult,
    GetMessageStatus,
    GetViewsResult,
    Message,
    MessageExt,
    PutColumnsResult,
    PutMessageResult,
    PutMessageStatus,
    _check_int,
    _split_offset_msg_id,
    encode_host,
    offset_msg_id,
)
from .storage.checkpoint import StoreCheckpoint
from .storage.consumequeue import ConsumeQueue, queue_dirs
from .storage.index import IndexService
from .storage.mapped_file import _NOFOLLOW, ReferenceResource, open_no_follow

__all__ = ["MessageStore"]

log = logging.getLogger("rmqstore.store")

MAX_OFFSET = (1 << 63) - 1
# the ranges of RocketMQ's Java ints and longs: what an argument may hold
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), MAX_OFFSET
#: a long poll waits at most this many seconds at a time (threading's
#: timeouts stop at TIMEOUT_MAX; the loop around it waits on)
_WAIT_SLICE = 3600.0
_BOUNDARIES = {"lower": False, "upper": True}
# pull outcomes a long poll waits on: nothing there yet
_WAITABLE = frozenset(
    (
        GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
        GetMessageStatus.NO_MESSAGE_IN_QUEUE,
        GetMessageStatus.OFFSET_OVERFLOW_ONE,
        GetMessageStatus.NO_MATCHED_MESSAGE,
    )
)
# units visited by one pull at most when a tag filter matches nothing
# (RocketMQ's maxFilterMessageSize of 16000 bytes)
_MAX_FILTER_UNITS = 800

# writable stores open in this process, by the (device, inode) of their
# directory: fcntl locks do not exclude the same process, and one directory
# has many paths (a symbolic link, a rename, a bind mount)
_open_writers: set = set()
_open_writers_lock = threading.Lock()
# every open store of this process: a forked child must not use them
_open_stores: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: every store the parent had open is closed here
    (its calls raise StoreClosedError; nothing is written, the parent's
    lock and files are untouched), and the child may open stores itself."""
    for store in list(_open_stores):
        store._forked()
    _open_stores.clear()
    _open_writers.clear()
    global _open_writers_lock
    _open_writers_lock = threading.Lock()  # (a parent thread may have held it at the fork)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class StoreLock:
    """The writer lock of a store directory (RocketMQ's ``lock`` file): an
    exclusive fcntl lock on ``<root_dir>/lock``, plus this process's
    registry of open writers, which knows a directory by its device and
    inode (fcntl locks do not exclude the same process, and a directory may
    be reached by several paths). :meth:`MessageStore.open` takes it for a
    writable store; jobs that rewrite or swap a store's files (the Spark
    writer and rebuilds) take it to keep writers out. Use as a context
    manager or ``acquire()``/``release()``. The ``lock`` file is never
    reached through a symbolic link.

    Raises StoreLockedError (from ``acquire``) when a writer holds the store,
    in this process or another; CorruptedFileError when ``lock`` is a
    symbolic link."""

    def __init__(self, root_dir):
        self.root_dir = os.fspath(root_dir)
        self._key = None
        self._fd = -1

    def acquire(self) -> StoreLock:
        with _open_writers_lock:
            st = os.stat(self.root_dir)
            key = (st.st_dev, st.st_ino)
            if key in _open_writers:
                raise StoreLockedError(f"store {self.root_dir} is already open for writing in this process")
            flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            fd = open_no_follow(os.path.join(self.root_dir, "lock"), flags, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError:
                os.close(fd)
                raise StoreLockedError(f"store {self.root_dir} is locked by another process") from None
            try:
                if os.pread(fd, 4, 0) != b"lock":  # (the same bytes: an existing lock file is left as it was)
                    os.pwrite(fd, b"lock", 0)
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            _open_writers.add(key)
            self._key = key
            self._fd = fd
        return self

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the fcntl lock
            self._fd = -1
            with _open_writers_lock:
                _open_writers.discard(self._key)

    def _forget(self) -> None:
        """In a forked child: the parent holds the lock; keep its descriptor
        (closing a copy drops nothing, but the child has no business with it)."""
        self._fd = -1

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


_new_tuple = tuple.__new__
#: the methods an open store's instance takes from its k.ReadGate
def _view_units(packed: bytes):
    """pull_views' packed units as GetViewsResult.units (a read-only array over them)."""
    if _VIEW_DTYPE is None:
        _load_numpy()
    return _frombuffer(packed, _VIEW_DTYPE)


def _load_numpy() -> None:
    """numpy on first use (importing rmqstore does not import it)."""
    global _VIEW_DTYPE, _frombuffer
    import numpy as np

    _frombuffer = np.frombuffer
    _VIEW_DTYPE = np.dtype([
        ("queue_offset", "=i8"), ("physical_offset", "=i8"), ("store_timestamp", "=i8"), ("tags_code", "=i8"),
        ("body_offset", "=i8"), ("body_length", "=i4"), ("store_size", "=i4"),
    ])


_VIEW_DTYPE: Any = None
_frombuffer: Any = None
_PUT_OK = PutMessageStatus.PUT_OK
_UNIT_DTYPE = [("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")]  # docs/format.md#consumequeue-unit


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _int_arg(name: str, value, lo: int, hi: int) -> int:
    """*value* as an int in [lo, hi]. Raises MessageTypeError for a bool, a
    float or anything else without ``__index__``, ArgumentError out of range."""
    if type(value) is not int:
        if isinstance(value, bool):
            raise MessageTypeError(f"{name} must be an int in [{lo}, {hi}], got a bool")
        try:
            value = operator.index(value)  # (numpy's ints too)
        except TypeError:
            raise MessageTypeError(f"{name} must be an int in [{lo}, {hi}], got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise ArgumentError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _wait_arg(wait_ms):
    """A long poll's *wait_ms* (an int or a float, ms) in [0, 2**63-1]: no
    NaN, infinity or negative wait. Raises MessageTypeError, ArgumentError."""
    if type(wait_ms) is int and 0 <= wait_ms <= _I64_MAX:
        return wait_ms
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)):
        raise MessageTypeError(f"wait_ms must be an int or a float (ms), got {type(wait_ms).__name__}")
    if not (math.isfinite(wait_ms) and 0 <= wait_ms <= _I64_MAX):
        raise ArgumentError(f"wait_ms must be in [0, {_I64_MAX}] ms, got {wait_ms}")
    return wait_ms


def _pull_args(queue_id, offset, max_count) -> tuple:
    """A pull's queue id (a Java int), queue offset (a long: outside the
    queue it is a status, not an error) and count (1 .. 2**31-1)."""
    return (
        _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX),
        _int_arg("offset", offset, _I64_MIN, _I64_MAX),
        _int_arg("max_count", max_count, 1, _I32_MAX),
    )


def _query_args(max_count, begin, end) -> tuple:
    """A key query's count and [begin, end] store-time range (ms, longs)."""
    max_count = _int_arg("max_count", max_count, 1, _I32_MAX)
    begin = _int_arg("begin", begin, _I64_MIN, _I64_MAX)
    end = _int_arg("end", end, _I64_MIN, _I64_MAX)
    if begin > end:
        raise ArgumentError(f"begin ({begin}) must not be after end ({end})")
    return max_count, begin, end


def _state_field(name: str) -> property:
    """A MessageStore attribute kept in its StoreState as *name*."""

    def set_field(self, value) -> None:
        setattr(self._state, name, value)

    return property(operator.attrgetter(f"_state.{name}"), set_field)


class MessageStore(k.StoreCore):
    """An embedded RocketMQ store in one directory.

    Use :meth:`open`. Layout under *root_dir*: ``commitlog/``,
    ``consumequeue/<topic>/<queue_id>/``, ``index/``, ``checkpoint``,
    ``abort`` (while open for writing), ``lock``.
    """

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
        # records appended but not yet dispatched, in CommitLog order: (topic, queue_id,
        # queue_offset, physical_offset, size, sys_flag, store_timestamp, tags_code,
        # unique_key, keys); their index keys are counted in _pending_keys
        self._pending = collections.deque()
        self._closing = False  # close() has begun: nothing is dispatched any more
        self._dispatch_lock = threading.Lock()
        # one CommitLog sync at a time; re-entrant: close() holds it around its own flush
        self._flush_lock = threading.RLock()
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
        # retention, disk space and follow mode (retention.py, docs/recovery.md#retention)
        from .service.retention import Retention, disk_usage_ratio

        self._disk_usage = disk_usage or disk_usage_ratio
        self._refs = ReferenceResource()  # readers: one hold per pull or lookup
        self._retention = Retention(self)
        self._cleaner: threading.Thread | None = None
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

    # --- lifecycle --------------------------------------------------------------------

    @classmethod
    def open(
        cls, root_dir, config=None, store_host="127.0.0.1:10911", clock=None, read_only=False, disk_usage=None
    ) -> MessageStore:
        """Open (creating if needed) the store in *root_dir* and recover it.

        Args:
            root_dir (str | PathLike): store root (RocketMQ ``storePathRootDir``).
            config (StoreConfig | dict | None): settings; a dict may use
                RocketMQ's camelCase names. None = RocketMQ's defaults.
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
            config = StoreConfig()
        elif isinstance(config, dict):
            config = StoreConfig.from_dict(config)
        elif not isinstance(config, StoreConfig):
            raise ConfigError(f"config must be a StoreConfig or a dict, got {type(config).__name__}")
        store = cls(root_dir, config, store_host, clock, read_only, disk_usage)
        try:
            store._start()
        except BaseException:
            store._closed = True
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
            # from the first write on, a failure is a crash to the next open,
            # whose recovery does the same again (and never cuts records
            # that validate)
            self._write_abort(abort_path)
            self.commitlog.queue.remove_junk()
            for cq in self._cqs.values():
                cq.queue.remove_junk()
            self.index.remove_junk()
        self._recover(plan)
        self._written_end = self._flushed_where = self.commitlog.max_offset()
        self._last_store_ts = self.checkpoint.physic_msg_timestamp
        self._last_logics_ts = self.checkpoint.logics_msg_timestamp
        if not self.read_only:
            self._flush_all()  # what recovery wrote or re-dispatched is durable before new writes
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

    @staticmethod
    def _write_abort(path) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = open_no_follow(path, flags, 0o644)
        try:
            os.write(fd, str(os.getpid()).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _load_consume_queues(self) -> None:
        base = os.path.join(self.root_dir, "consumequeue")
        size = None if self.read_only else self.config.mapped_file_size_consume_queue
        for topic, qid, _qdir in queue_dirs(self.root_dir):
            cq = ConsumeQueue(base, topic, qid, size, read_only=self.read_only)
            cq.load()
            self._cqs[(topic, qid)] = cq

    def _plan_recovery(self) -> dict:
        """What load-time recovery will do, read from the files without
        writing: where each ConsumeQueue ends, where the CommitLog scan
        starts, the runs of valid records it found (to dispatch) and where
        valid data ends (RocketMQ's normal and abnormal recovery).

        A crash can only tear what was being written last: nothing valid
        lies behind a torn end. Where records that validate follow the point
        the scan stopped at, or a record the index must be rebuilt from does
        not validate (an older segment), the damage is the disk's, not a
        crash's, and recovery must not cut there: a writable open raises
        :class:`CorruptedFileError` (nothing has been written), a read-only
        one reads around it and lists it in ``recovery_report["damage"]``."""
        cfg = self.config
        cl = self.commitlog
        cq_ends = {key: cq.recover_end() for key, cq in self._cqs.items()}
        max_cq_phy = max((cq.max_physic_offset for cq in self._cqs.values()), default=-1)
        files = cl.queue.files
        crc = cfg.check_crc_on_recover
        # body CRC, and the store's own __CRC32# entry when it writes one
        crc_mode = 1 if cfg.force_verify_prop_crc else (2 if cfg.enabled_append_prop_crc else 0)
        plan: dict = {"cq_ends": cq_ends, "max_cq_phy": max_cq_phy, "runs": [], "process_offset": 0,
                      "reason": None, "damage": [], "start_file": None, "drop_last_index": False,
                      "dispatch_from": max_cq_phy if self.last_exit_ok else -1}
        if not files:
            return plan
        start = self._normal_start(max_cq_phy) if self.last_exit_ok else self._abnormal_start()
        plan["start_file"] = files[start].path
        runs = plan["runs"]
        end, reason = cl.scan_valid(start, crc, crc_mode, lambda mf, lo, hi: runs.append((mf, lo, hi)))
        plan["reason"] = reason
        while reason is not None:
            if not self._disk_damage(end):
                break  # where a crash tears: recovery cuts there, as RocketMQ does
            nxt = cl.find_valid_record(end, crc, crc_mode)
            if nxt is None:
                break  # nothing valid behind it: the end of the data
            mf = cl.queue.find(end)
            if not self.read_only:
                raise CorruptedFileError(
                    f"the CommitLog does not validate at physical offset {end} ({reason}), but records that "
                    f"validate follow it (the first at physical offset {nxt}): damage a crash cannot cause, as a "
                    "crash tears only what was written last. Opening the store for writing would cut them, so "
                    "nothing was changed. Read it with read_only=True, or copy every valid record into a new "
                    f"store with: rmqstore salvage {self.root_dir} <new directory>",
                    mf.path if mf else cl.queue.directory, end - mf.file_from_offset if mf else end,
                )
            plan["damage"].append({"path": mf.path if mf else None, "physical_offset": end, "reason": reason,
                                   "resumes_at": nxt})
            log.warning("read-only open of %s: damage at physical offset %d (%s), reading on from %d",
                        self.root_dir, end, reason, nxt)
            seg = cl.queue.find(nxt)
            end, reason = cl.scan_valid(files.index(seg), crc, crc_mode, None, nxt - seg.file_from_offset)
        plan["process_offset"] = end
        if not self.read_only and cfg.message_index_enable:
            # a last index file a crash tore (power loss) is rebuilt
            files_ = self.index.files
            plan["drop_last_index"] = not self.last_exit_ok and bool(files_) and not files_[-1].is_consistent()
            self._check_index_source(plan, start, crc_mode)
        return plan

    def _disk_damage(self, offset: int) -> bool:
        """Whether damage at CommitLog physical *offset* lies where no crash
        can have torn the data: below the offset the checkpoint names as
        flushed (``confirmPhyOffset``, which this store keeps at its
        flushed end; a value past the files is not believed), or in a
        segment before the last two that hold data (a crash tears what was
        being written: the last segment, or the one before it just after a
        roll)."""
        cl = self.commitlog
        files = cl.queue.files
        flushed = self.checkpoint.confirm_phy_offset
        if 0 < flushed <= cl.max_offset() and offset < flushed:
            return True
        last = len(files) - 1
        while last > 0 and not any(files[last].mm[:8]):  # a segment made ahead, never written
            last -= 1
        mf = cl.queue.find(offset)
        return mf is not None and files.index(mf) < last - 1

    def _check_index_source(self, plan: dict, scan_start: int, crc_mode: int) -> None:
        """Recovery indexes the records the index lacks, from the CommitLog:
        those before the scanned segments must validate (body CRC included)
        before anything is written, or the open raises CorruptedFileError
        (damage in a segment before the ones being written is the disk's)."""
        cl = self.commitlog
        files = cl.queue.files
        end = plan["process_offset"]
        index_files = list(self.index.files)
        if plan["drop_last_index"]:
            index_files.pop()  # recovery rebuilds it
        # where the index catch-up starts: the end of what the kept files index
        # below the valid end (a lower bound where the last file is cut)
        indexed = max((f.end_phy_offset for f in index_files if f.end_phy_offset < end), default=0)
        lo = max(indexed, cl.min_offset())
        hi = files[scan_start].file_from_offset
        if lo >= hi:
            return
        seg = cl.queue.find(lo)
        reached, reason = cl.scan_valid(files.index(seg), True, crc_mode, None, lo - seg.file_from_offset,
                                        stop_index=scan_start)
        if reached < hi:
            mf = cl.queue.find(reached)
            raise CorruptedFileError(
                f"the index lacks the records from physical offset {lo} on, and the CommitLog does not validate "
                f"at physical offset {reached} ({reason or 'no record'}): damage in a segment before the ones "
                "being written, which a crash cannot cause. Nothing was changed. Read the store with "
                f"read_only=True, or copy every valid record into a new store with: rmqstore salvage "
                f"{self.root_dir} <new directory>",
                mf.path if mf else cl.queue.directory, reached - mf.file_from_offset if mf else reached,
            )

    def _recover(self, plan: dict) -> None:
        """Load-time recovery as :meth:`_plan_recovery` decided it: cut each
        ConsumeQueue at its valid end, dispatch what the queues and the
        index miss, cut queues and CommitLog at the valid end, index what
        the index lacks (writable); in memory only when read-only."""
        cfg = self.config
        for key, cq in self._cqs.items():
            end = plan["cq_ends"].get(key)
            if end is not None:
                cq.queue.truncate_dirty(end)
        max_cq_phy = plan["max_cq_phy"]
        process_offset = plan["process_offset"]
        report = self.recovery_report = {
            "last_exit_ok": self.last_exit_ok, "max_cq_physical_offset": max_cq_phy,
            "process_offset": process_offset, "index_keys_added": 0, "stopped_because": plan["reason"],
            "damage": plan["damage"],
        }
        if plan["start_file"] is not None:
            report["start_file"] = plan["start_file"]
        self.commitlog.damaged = {d["physical_offset"]: d["resumes_at"] for d in plan["damage"]}
        if plan["runs"] and not self.read_only:
            on_run = self._recovery_dispatcher(plan["dispatch_from"])
            for mf, lo, hi in plan["runs"]:
                on_run(mf, lo, hi)
        if max_cq_phy >= process_offset:
            for cq in self._cqs.values():
                cq.truncate_dirty_logic_files(process_offset)
        # bytes of data the cut drops (not the zeros a preallocated segment ends with)
        report["truncated_bytes"] = max(0, self.commitlog.data_end_estimate(process_offset) - process_offset)
        self.commitlog.truncate(process_offset)
        if not self.read_only:  # (a cut in the crash window: what was flushed ends here at most)
            self.checkpoint.confirm_phy_offset = min(self.checkpoint.confirm_phy_offset, process_offset)
        if not self.read_only and cfg.message_index_enable:
            self._recover_index(process_offset, plan["drop_last_index"])
        # keys indexed by recovery: re-dispatched records and the catch-up above
        report["index_keys_added"] = self.index.keys_added
        if self.index.keys_added:
            log.warning("recovery indexed %d keys the index was missing", self.index.keys_added)
        cl_min = self.commitlog.min_offset()
        for key, cq in list(self._cqs.items()):
            if cq.max_offset_in_queue() == 0 and cq.queue.files:
                # no unit ever: files a put made ahead and a crash left unused
                if self.read_only:
                    cq.close()
                else:
                    cq.destroy()
                    cq.remove_directory()
                del self._cqs[key]
                continue
            self._queue_offsets[key] = cq.max_offset_in_queue()
            cq.correct_min_offset(cl_min)
        self.recovery_report = report
        log.info("recovered %s: %s", self.root_dir, report)

    def _recover_index(self, process_offset: int, drop_last: bool) -> None:
        """Make the index cover exactly the CommitLog: after a crash drop a last
        index file that is not consistent (torn by a power loss), cut entries past
        *process_offset* (docs/recovery.md#pitfall-index-not-truncated), then index each record the index lacks straight
        from the CommitLog — RocketMQ instead deletes unflushed index files after
        a crash and never rebuilds them (docs/recovery.md#pitfall-index-lost-after-crash)."""
        index = self.index
        ts_at = lambda phy: self.commitlog.store_timestamp_at(phy, 1)  # noqa: E731
        if drop_last:
            log.warning("index file %s is not consistent after a crash; rebuilding it", index.files[-1].path)
            index.files.pop().destroy()
        index.truncate(process_offset, ts_at)
        last = index.files[-1] if index.files else None
        start = max(last.end_phy_offset if last else 0, self.commitlog.min_offset())
        for phy, _size in self.commitlog.iter_offsets(start):
            f = self.commitlog.read(phy, with_body=False, strict=True)
            props = k.parse_properties(f[16])
            index.build_index(f[15], phy, f[10], f[7], props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS))
        # from the files, not from the checkpoint or the rolls this recovery
        # happened to make: a recovery that died before writing the checkpoint
        # leaves full files the next one never rolls (_flush_all flushes them
        # before the checkpoint names them)
        index.last_full_end_timestamp = index.newest_full_end_timestamp()

    def _normal_start(self, max_cq_phy: int) -> int:
        """The last three segments, or earlier when the queues lag behind
        (docs/recovery.md#normal-recovery: a superset of every RocketMQ version's choice)."""
        files = self.commitlog.queue.files
        start = max(0, len(files) - 3)
        for i in range(len(files) - 1, -1, -1):
            if files[i].file_from_offset <= max_cq_phy:
                return min(start, i)
        return 0

    def _abnormal_start(self) -> int:
        """Newest segment whose first record validates and was stored before the
        checkpoint's safe time (docs/recovery.md#abnormal-recovery); segment 0 otherwise."""
        cp = self.checkpoint
        index_safe = self.config.message_index_enable and self.config.message_index_safe
        limit = cp.min_timestamp_index if index_safe else cp.min_timestamp
        files = self.commitlog.queue.files
        for i in range(len(files) - 1, -1, -1):
            t = self.commitlog.first_record_timestamp(i)
            if t > 0 and t <= limit:
                return i
        return 0

    def _recovery_dispatcher(self, dispatch_from: int):
        """``on_run`` for the recovery scan: dispatch (again) every record of a
        validated run that ends after *dispatch_from*. Runs are decoded into
        columns (``decode_columns``); a record its queue and the index hold
        already is passed over without a dispatch call."""
        topics: dict = {}  # topic bytes -> str, decoded once
        index = self.index if self.config.message_index_enable else None

        def on_run(mf, start, end):
            base = mf.file_from_offset
            if base + end <= dispatch_from:
                return
            pos = start
            while pos < end:
                pos_next, _stop, c = k.decode_columns(mf.mm, pos, end, base, 8192, False, False)
                if pos_next == pos:  # cannot happen on a validated run; never loop on it
                    raise CorruptedFileError("recovery could not decode a validated record", mf.path, pos)
                pos = pos_next
                self._dispatch_columns(mf, c, dispatch_from, topics, index)

        return on_run

    def _undispatched(self, c, dispatch_from: int, index_end):
        """Rows of columns *c* that may need a dispatch. When the rows share one
        topic (the usual case) the rows whose queue and index hold them
        already are found with array operations; otherwise every row."""
        import numpy as np

        toff, tdata = c["topic_offsets"], c["topic_data"]
        n = len(toff) - 1
        width = int(toff[1] - toff[0]) if n else 0
        if n == 0 or not (np.diff(toff) == width).all() or \
                (width and not (tdata.reshape(n, width) == tdata[:width]).all()):
            return range(n)
        topic = tdata[:width].tobytes().decode("utf-8", "replace")
        phy = c["physical_offset"]
        end = phy + c["store_size"]
        qids = c["queue_id"]
        have = np.full(n, -1, dtype=np.int64)  # each row's queue: its max physical offset
        for qid in np.unique(qids).tolist():
            cq = self._cqs.get((topic, qid))
            if cq is not None:
                have[qids == qid] = cq.max_physic_offset
        done = consume_queue_mask(c["sys_flag"]) & (end <= have)
        if index_end is not None:
            done &= phy < index_end
        return np.flatnonzero((end > dispatch_from) & ~done).tolist()

    def _dispatch_columns(self, mf, c, dispatch_from: int, topics: dict, index) -> None:
        """Dispatch the records of columns *c* (decoded from segment *mf*)."""
        phys, sizes = c["physical_offset"].tolist(), c["store_size"].tolist()
        qids, qoffs = c["queue_id"].tolist(), c["queue_offset"].tolist()
        flags, times = c["sys_flag"].tolist(), c["store_timestamp"].tolist()
        toff, tdata = c["topic_offsets"].tolist(), c["topic_data"].tobytes()
        optional = [
            (name, c[col + "_valid"].tolist(), c[col + "_offsets"].tolist(), c[col + "_data"].tobytes())
            for name, col in ((PROPERTY_TAGS, "tags"), (PROPERTY_KEYS, "keys"), (PROPERTY_UNIQ_KEY, "unique_key"))
        ]
        index_end = index.files[-1].end_phy_offset if index is not None and index.files else -1
        cqs = self._cqs
        for i in self._undispatched(c, dispatch_from, index_end if index is not None else None):
            phy = phys[i]
            size = sizes[i]
            if phy + size <= dispatch_from:
                continue
            tb = tdata[toff[i] : toff[i + 1]]
            topic = topics.get(tb)
            if topic is None:
                topic = topics[tb] = tb.decode("utf-8", "replace")
            sys_flag = flags[i]
            if gets_consume_queue_unit(sys_flag):
                cq = cqs.get((topic, qids[i]))
                if cq is not None and phy + size <= cq.max_physic_offset and (index is None or phy < index_end):
                    continue  # in its queue and in the index already
            if topic == SCHEDULE_TOPIC:  # its tags code needs DELAY: every property
                props = k.parse_properties(k.decode_record(mf.mm, phy - mf.file_from_offset, False)[16])
            else:
                props = {}
                for name, valid, off, data in optional:
                    if valid[i]:
                        props[name] = data[off[i] : off[i + 1]].decode("utf-8", "replace")
            self._dispatch(topic, qids[i], qoffs[i], phy, size, sys_flag, times[i],
                           tags_code(topic, props, times[i], self.config), props.get(PROPERTY_UNIQ_KEY),
                           props.get(PROPERTY_KEYS))

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
                            self._flush_all()
                            # everything is on disk: dispatch what SYNC_FLUSH puts appended
                            self._dispatch_locked(MAX_OFFSET)
                    if self._write_error is None and not self._pending:
                        try:
                            os.unlink(os.path.join(self.root_dir, "abort"))
                        except FileNotFoundError:
                            pass
                if self._offsets is not None:  # persist deferred consumer-offset commits
                    self._offsets.close()
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
        for t in (self._cleaner, self._flusher):
            if t is not None and t is not threading.current_thread():
                t.join()

    def _release(self) -> None:
        self._wake_waiters()  # _closed is set: waiting long polls return now
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

    # --- flushing (docs/recovery.md#flush) ------------------------------------------

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
                self._flushed_where = max(target, self.commitlog.flushed_offset())
                self.checkpoint.physic_msg_timestamp = ts
                # and where: recovery tells disk damage from a torn end by it
                self.checkpoint.confirm_phy_offset = self._flushed_where

    def _flush_consume_queues(self, least_pages: int) -> None:
        ts = self._last_logics_ts  # captured before: only what the flush covers is published
        try:
            for cq in list(self._cqs.values()):
                cq.flush(least_pages)
        except OSError as e:
            raise self._fail_write(e) from e
        if least_pages == 0:
            self.checkpoint.logics_msg_timestamp = ts

    def _flush_all(self) -> None:
        self._flush_commit_log(0)
        self._flush_consume_queues(0)
        try:
            self.index.flush()
            self.checkpoint.index_msg_timestamp = self.index.last_full_end_timestamp
            self.checkpoint.flush()
        except OSError as e:
            raise self._fail_write(e) from e

    def _flush_loop(self) -> None:
        """RocketMQ's flush services in one thread: the CommitLog every
        ``flush_interval_commit_log`` ms (ASYNC_FLUSH; least-pages rule, a
        complete flush every ``flush_commit_log_thorough_interval``), the
        ConsumeQueues every ``flush_interval_consume_queue`` ms (complete every
        ``flush_consume_queue_thorough_interval``), the checkpoint every second."""
        cfg = self.config
        now = time.monotonic()
        next_cl = next_cq = next_cp = now
        thorough_cl = thorough_cq = now
        tick = min(cfg.flush_interval_commit_log, cfg.flush_interval_consume_queue, 1000) / 1000
        while not self._stop.wait(tick):
            if self._write_error is not None:
                return
            now = time.monotonic()
            try:
                if not self._sync_flush and now >= next_cl:
                    complete = now - thorough_cl >= cfg.flush_commit_log_thorough_interval / 1000
                    self._flush_commit_log(0 if complete else cfg.flush_commit_log_least_pages)
                    thorough_cl = now if complete else thorough_cl
                    next_cl = now + cfg.flush_interval_commit_log / 1000
                if now >= next_cq:
                    complete = now - thorough_cq >= cfg.flush_consume_queue_thorough_interval / 1000
                    with self._dispatch_lock:
                        self._flush_consume_queues(0 if complete else cfg.flush_consume_queue_least_pages)
                    thorough_cq = now if complete else thorough_cq
                    next_cq = now + cfg.flush_interval_consume_queue / 1000
                if now >= next_cp:
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

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            warnings.warn(f"MessageStore {self.root_dir} was not closed", ResourceWarning, stacklevel=2)
            try:
                self.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

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

    # --- retention and disk space (docs/recovery.md#retention, retention.py) ------------

    def delete_expired(self, force: bool = False, reserved_hours=None):
        """Delete expired files now, whatever the hour (RocketMQ's admin
        ``deleteExpiredCommitLog`` / ``executeDeleteFilesManually``), then the
        ConsumeQueue and index files that only point below the new CommitLog
        minimum, and correct every queue's minimum offset.

        Args:
            force (bool): delete every CommitLog segment but the current one,
                regardless of age (RocketMQ's clean-at-once).
            reserved_hours (int | None): keep files younger than this many
                hours (0 .. 2**31-1) instead of ``file_reserved_time``.

        A segment's age is its last record's store time (its mtime when it has
        none, docs/recovery.md#pitfall-retention-by-mtime) against the store clock. At most ``delete_file_batch_max``
        segments go per call, ``delete_commit_log_files_interval`` ms apart;
        segments a reader is inside are retried on the next call.

        Returns a :class:`~rmqstore.service.retention.CleanupReport`; its ``deleted``
        is the number of CommitLog segments deleted.

        Raises StoreReadOnlyError, StoreClosedError; OSError from unlinking.
        """
        self._ensure_writable()
        if reserved_hours is not None and (isinstance(reserved_hours, bool) or not isinstance(reserved_hours, int)
                                           or not 0 <= reserved_hours <= _I32_MAX):
            raise ConfigError(f"reserved_hours must be an int in [0, {_I32_MAX}] (as file_reserved_time), "
                              f"got {reserved_hours!r}")
        return self._retention.run(manual=True, force=force, reserved_hours=reserved_hours)

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

    # --- reader references and follow mode ------------------------------------------------

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

    def _poll_follow(self, topic, queue_id, offset, max_count, tags, wait_ms, result) -> GetMessageResult:
        """Long polling on a read-only store: no in-process signal comes from
        a writer process, so poll the queue's tail every
        ``follow_poll_interval`` ms until messages arrive or *wait_ms* pass."""
        deadline = time.monotonic() + wait_ms / 1000
        pause = max(self.config.follow_poll_interval, 1) / 1000
        while True:
            if result.status is GetMessageStatus.NO_MATCHED_MESSAGE:
                offset = result.next_begin_offset
            left = deadline - time.monotonic()
            if left <= 0 or self._closed:
                return result
            time.sleep(min(pause, left))
            if self._closed:
                return result
            if self._follow_queue(topic, queue_id):
                result = self._pull(topic, queue_id, offset, max_count, tags)
                if result.messages or result.status not in _WAITABLE:
                    return result

    # --- writing ---------------------------------------------------------------------

    def _prepare(self, msg):
        """Validate and encode what does not depend on the append position,
        from one reading of each of the message's attributes (they may be
        changed after the message was made, by this thread or another): the
        fields are checked again here, and a body that is not bytes is
        copied once, so its length and its bytes agree whatever happens to
        it meanwhile. Returns ``(topic, topic bytes, (queue_id, flag,
        born_timestamp, reconsume_times, prepared_transaction_offset),
        sys_flag, born host, store host, body, property blob, properties,
        record size)``."""
        if not isinstance(msg, MESSAGE_TYPES):
            raise MessageTypeError(f"expected a Message, got {type(msg).__name__}")
        cfg = self.config
        topic = msg.topic
        if not isinstance(topic, str):
            raise MessageTypeError(f"topic must be a str, got {type(topic).__name__}")
        topic_b = self._check_topic(topic)
        body = msg.body
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise MessageTypeError(f"body must be bytes-like, got {type(body).__name__}")
            body = bytes(body)
        if len(body) > cfg.max_message_size:
            raise MessageTooLargeError(f"body of {len(body)} bytes exceeds max_message_size {cfg.max_message_size}")
        born_ts = msg.born_timestamp
        fields = (
            _check_int("queue_id", msg.queue_id, minimum=0), _check_int("flag", msg.flag),
            None if born_ts is None else _check_int("born_timestamp", born_ts, _INT64),
            _check_int("reconsume_times", msg.reconsume_times),
            _check_int("prepared_transaction_offset", msg.prepared_transaction_offset, _INT64),
        )
        props = msg.property_map()
        if self._append_crc:
            props.pop(PROPERTY_CRC32, None)  # the store appends its own
        props_b = msg.encode_properties(props)
        born_raw = self._store_host_raw if msg.born_host is None else encode_host(msg.born_host)
        store_raw = self._store_host_raw if msg.store_host is None else encode_host(msg.store_host)
        sys_flag = _check_int("sys_flag", msg.sys_flag) & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
        if len(born_raw) == 20:
            sys_flag |= BORNHOST_V6_FLAG
        if len(store_raw) == 20:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        props_len = len(props_b)
        if self._append_crc:
            props_len += (1 if props_b and props_b[-1] != 2 else 0) + 20
            if props_len > MAX_PROPERTIES_LENGTH:
                raise PropertiesSizeExceededError(
                    f"properties of {props_len} bytes (with __CRC32#) exceed {MAX_PROPERTIES_LENGTH}"
                )
        size = k.record_size(sys_flag, len(body), len(topic_b), props_len, len(topic_b) > MAX_TOPIC_LENGTH_V1)
        if not self.commitlog.fits_in_new_segment(size):
            raise MessageTooLargeError(
                f"record of {size} bytes cannot fit in a {self.commitlog.file_size}-byte CommitLog file"
            )
        return (topic, topic_b, fields, sys_flag, born_raw, store_raw, body, props_b, props, size)

    def check_message(self, msg: Message) -> int:
        """Validate *msg* as :meth:`put_message` would, writing nothing (for
        loaders that must refuse a whole batch before storing any of it).
        Returns the size in bytes its CommitLog record would take. Raises
        MessageTypeError, IllegalMessageError, MessageTooLargeError or
        PropertiesSizeExceededError, as put_message does."""
        return self._prepare(msg)[-1]

    def _topic_bytes(self, topic: str):
        """The UTF-8 bytes of *topic* put_message would write, None when it
        refuses the topic (check_all's view of a topic with no bound queue:
        its messages are then prepared in order, which raises the first bad
        message's error, whatever it is)."""
        try:
            return self._check_topic(topic)
        except IllegalMessageError:
            return None

    def _check_topic(self, topic: str) -> bytes:
        """The UTF-8 bytes of a valid topic: validated once, then cached
        (topics are few). Raises IllegalMessageError."""
        topic_b = self._topics.get(topic)
        if topic_b is not None:
            return topic_b
        try:
            topic_b = topic.encode("utf-8")
        except UnicodeEncodeError:
            raise IllegalMessageError(f"topic {topic!r} has no UTF-8 form (a lone surrogate)") from None
        if len(topic_b) > MAX_TOPIC_LENGTH_V1 and not self.config.auto_message_version_on_topic_len:
            raise IllegalMessageError(f"topic of {len(topic_b)} UTF-8 bytes is over 127")
        if len(topic_b) > MAX_TOPIC_LENGTH_V2:
            raise IllegalMessageError(f"topic of {len(topic_b)} UTF-8 bytes is over {MAX_TOPIC_LENGTH_V2}")
        if "/" in topic or "\x00" in topic or topic in (".", ".."):
            raise IllegalMessageError(f"topic {topic!r} cannot name a ConsumeQueue directory")
        name_max, path_room = self._name_limits()
        if len(topic_b) > name_max or len(topic_b) > path_room:
            raise IllegalMessageError(
                f"topic of {len(topic_b)} UTF-8 bytes cannot name a ConsumeQueue directory under {self.root_dir} "
                f"(the file system takes names of up to {name_max} bytes, and paths of up to "
                f"{path_room} more bytes there)"
            )
        if len(self._topics) >= 4096:  # bound the cache against endless distinct topics
            self._topics.clear()
        self._topics[topic] = topic_b
        return topic_b

    def _name_limits(self) -> tuple:
        """``(longest file name, bytes a topic may take in a path)`` on the
        store's file system: ``consumequeue/<topic>/<queue id>/<20 digits>``
        must fit PATH_MAX under the root (asked once, POSIX minimums
        where the system does not say)."""
        limits = self._limits
        if limits is None:
            try:
                name_max = os.pathconf(self.root_dir, "PC_NAME_MAX")
                path_max = os.pathconf(self.root_dir, "PC_PATH_MAX")
            except (OSError, ValueError):
                name_max, path_max = 255, 4096
            name_max = name_max if name_max and name_max > 0 else 255
            path_max = path_max if path_max and path_max > 0 else 4096
            # "<root>/consumequeue/" + topic + "/2147483647/" + 20 digits, and the NUL
            fixed = len(os.fsencode(self.root_dir)) + len("/consumequeue/") + len("/2147483647/") + 20 + 1
            limits = self._limits = (name_max, path_max - fixed)
        return limits

    # --- a put is all or nothing ----------------------------------------------------

    def _index_keys(self, sys_flag: int, unique_key, keys) -> int:
        """How many index entries a record takes: none with the index off or
        for a transaction rollback record."""
        if not self.config.message_index_enable or not gets_index_entries(sys_flag):
            return 0
        return len(index_keys(unique_key, keys))

    def _plan_prepared(self, prepared, plan=None) -> list:
        """What prepared messages (:meth:`_prepare`'s tuples) need of the
        files, added to *plan* (``Appender.plan``'s form, made if None):
        ``[total record bytes, the largest record's bytes, records,
        {(topic, queue_id): records that get a ConsumeQueue unit}, index
        keys]``."""
        if plan is None:
            plan = [0, 0, 0, {}, 0]
        counts = plan[3]
        for topic, _tb, fields, sys_flag, _born, _store, _body, _blob, props, size in prepared:
            plan[0] += size
            if size > plan[1]:
                plan[1] = size
            plan[2] += 1
            if gets_consume_queue_unit(sys_flag):
                key = (topic, fields[0])
                counts[key] = counts.get(key, 0) + 1
            plan[4] += self._index_keys(sys_flag, props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS))
        return plan

    def _reserve(self, plan) -> None:
        """Make every file the records of *plan* (:meth:`_plan_prepared`)
        need before the first of them is written, so that writing them
        cannot fail half way for a file that cannot be made: the CommitLog
        segments they roll into, each queue's files (and, for a new queue,
        its directory) and the index files their keys roll into. RocketMQ
        makes its next CommitLog file ahead in the same way; files made
        ahead wait as spares for the rolls that take them. Under SYNC_FLUSH
        what is appended but not yet dispatched counts too. Raises what
        making a file raises (DiskFullError, OSError, CorruptedFileError)
        with no record written. The append lock is held."""
        total, biggest, count, counts, n_keys = plan
        if count:
            self.commitlog.reserve(total, biggest, count)
        for key, n in counts.items():
            known = self._cqs.get(key)
            cq = self._new_consume_queue(*key) if known is None else known
            first = self._queue_offsets.get(key, 0)
            cq.reserve(first, first + n)
            if known is None:  # (registered once its files exist)
                self._cqs[key] = cq
        if count and self.config.message_index_enable:
            self.index.reserve(n_keys + self._pending_keys)

    def _new_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A ConsumeQueue object for a queue this store writes first (no file yet)."""
        return ConsumeQueue(
            os.path.join(self.root_dir, "consumequeue"), topic, queue_id, self.config.mapped_file_size_consume_queue
        )

    def _mark(self) -> tuple:
        """Where the CommitLog ends now and the bookkeeping :meth:`_undo` to
        here restores (taken under the append lock before a put writes)."""
        return self.commitlog.max_offset(), self._written_end, self._last_store_ts, self._last_logics_ts

    def _undo(self, mark) -> None:
        """A put raised after it began writing (an interrupt, or anything
        :meth:`_reserve` could not foresee): remove what it wrote since
        *mark* — the records from that physical offset on, their units and
        index entries, the files made for them — and restore the
        bookkeeping, so the store is as before the put and a retry stores
        no duplicate. If the undo itself fails the store takes no more
        writes (reopening recovers it). The append lock is held."""
        w0 = mark[0]
        cl = self.commitlog
        try:
            firsts: dict = {}  # (topic, queue_id) -> the first queue offset undone
            try:
                for phy, _size in cl.iter_offsets(w0):
                    f = cl.read(phy, with_body=False)
                    if f is None:
                        break
                    if gets_consume_queue_unit(f[7]):
                        firsts.setdefault((f[15], f[3]), f[5])
            except CorruptedFileError:  # (a record torn by the failure itself: nothing after it is ours)
                pass
            with self._dispatch_lock:
                pending = self._pending
                while pending and pending[-1][3] >= w0:
                    pending.pop()
                self._pending_keys = sum(self._index_keys(p[5], p[8], p[9]) for p in pending)
                for key, cq in list(self._cqs.items()):
                    if key in firsts or cq.max_physic_offset > w0:
                        cq.truncate_dirty_logic_files(w0)
                        self._queue_offsets[key] = firsts.get(key, cq.max_offset_in_queue())
                    if not cq.queue.files:  # a queue this put made (or reserved): no trace of it
                        self._queue_offsets.pop(key, None)
                        cq.remove_directory()
                if self.config.message_index_enable and self.index.files:
                    self.index.truncate(w0, lambda phy: cl.store_timestamp_at(phy, 1))
            cl.forget(cl.undo_to(w0, cl.max_record_size))
            if self._fast is not None:  # its bindings may name files the undo deleted
                self._fast.unbind()
                self._rebind()
            self._written_end, self._last_store_ts, self._last_logics_ts = mark[1:]
            self._flushed_where = min(self._flushed_where, w0)
            self.checkpoint.confirm_phy_offset = min(self.checkpoint.confirm_phy_offset, w0)
        except BaseException as e:
            err = e if isinstance(e, OSError) else OSError(errno.EIO, f"undo of a failed put: {e!r}")
            self._fail_write(err)
            log.exception("could not undo a failed put in %s", self.root_dir)

    def _append(self, prepared, store_ts=None) -> PutMessageResult:
        """Append one prepared message step by step; the caller holds the
        append lock. The record joins the pending-dispatch queue in CommitLog
        order. *store_ts*: the store time the caller already took (one clock
        reading per record, whichever path writes it)."""
        if store_ts is None:
            store_ts = self._clock()
        topic, topic_b, (qid, flag, born_ts, reconsume, prepared_off), sys_flag, born_raw, store_raw, body, props_b, \
            props, size = prepared
        consumed = gets_consume_queue_unit(sys_flag)  # (the dispatch rules: docs/recovery.md#dispatch)
        key = (topic, qid)
        queue_offset = self._queue_offsets.get(key, 0) if consumed else 0
        if born_ts is None:
            born_ts = store_ts
        phy = self.commitlog.append(
            size, qid, flag, queue_offset, sys_flag, born_ts, born_raw, store_ts, store_raw,
            reconsume, prepared_off, body, topic_b, props_b, self._append_crc,
        )
        if consumed:
            self._queue_offsets[key] = queue_offset + 1
        self._written_end = phy + size
        self._last_store_ts = store_ts
        uniq, keys = props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS)
        self._pending.append((topic, qid, queue_offset, phy, size, sys_flag, store_ts,
                              tags_code(topic, props, store_ts, self.config), uniq, keys))
        self._pending_keys += self._index_keys(sys_flag, uniq, keys)
        return PutMessageResult(
            PutMessageStatus.PUT_OK, offset_msg_id(store_raw, phy), phy, size, queue_offset, store_ts
        )

    def _append_stepped(self, prepared, store_ts=None) -> PutMessageResult:
        """A put the Appender declined, step by step (append lock held):
        append, dispatch at once under ASYNC_FLUSH (SYNC_FLUSH: once
        flushed, in _commit), and point the Appender at the files and the
        queue that may have been created."""
        result = self._append(prepared, store_ts)
        if not self._sync_flush:
            self._dispatch_pending(MAX_OFFSET)
        if self._fast is not None:
            self._rebind(prepared[0], prepared[2][0])
        return result

    def _wake_waiters(self) -> None:
        """Wake every long poll waiting for arrivals (or for close)."""
        with self._arrival:
            self._arrival.notify_all()

    def _rebind(self, topic=None, queue_id=None) -> None:
        """Point the put path (``k.Appender``) at the files a put writes now:
        the last CommitLog and index files and, given one, the last file of
        the queue the step-by-step path just wrote. Called under the append
        lock after that path, which may have created or rolled any of them;
        the Appender itself never creates a file. Under SYNC_FLUSH, where
        units and index entries are written once flushed, a queue or an
        index with no file yet is bound to the file made for it ahead (a
        spare), and a queue to the file its next unit goes into."""
        fast = self._fast
        sync = self._sync_flush
        files = self.commitlog.queue.files
        fast.bind_commit_log(files[-1] if files else None)
        if self.config.message_index_enable:
            files = self.index.files or (self.index.spares[:1] if sync else [])
            fast.bind_index(files[-1] if files else None)
        if topic is not None:
            cq = self._cqs.get((topic, queue_id))
            topic_b = self._topics.get(topic)
            if cq is not None and topic_b is not None:
                files = cq.queue.files
                mf = files[-1] if files else None
                if sync:
                    at = self._queue_offsets.get((topic, queue_id), 0) * CQ_STORE_UNIT_SIZE
                    mf = next((f for f in (*files[-1:], *cq.queue.spares)
                               if f.file_from_offset <= at < f.file_from_offset + f.file_size), mf)
                fast.bind_queue(topic, queue_id, topic_b, cq, mf)

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

    def _put_one(self, msg, store_ts=None, commit: bool = True) -> PutMessageResult:
        """put_message step by step, for what the Appender leaves (new files
        and queues, messages it does not vouch for, which _prepare checks
        and refuses or encodes; a closed store): every file the record needs
        is made first, and a failure after its first byte is written undoes
        it (see :meth:`_reserve`). Under SYNC_FLUSH it returns once the
        record is on disk, unless *commit* is False (the put gate, which
        holds the append lock, then waits after releasing it)."""
        self._ensure_writable()
        if self._disk_full:
            self._refuse_if_disk_full()
        prepared = self._prepare(msg)
        with self._lock:
            self._ensure_open()
            self._check_write_error()
            self._reserve(self._plan_prepared([prepared]))
            mark = self._mark()
            try:
                result = self._append_stepped(prepared, store_ts)
            except BaseException:
                self._undo(mark)
                raise
        if self._sync_flush and commit:
            self._commit(result.wrote_offset + result.wrote_bytes)
        return result

    def put_messages(self, msgs) -> list:
        """Put each message of *msgs* (an iterable of :class:`Message`) under one
        append lock, as separate records (and, under SYNC_FLUSH, one sync).
        All or nothing: every message is validated and every file the batch
        needs is made before the first record is written, and a failure
        after that (an interrupt included) undoes what the call wrote, so a
        caller may retry the whole batch. Returns the list of
        :class:`PutMessageResult`; raises what :meth:`put_message` raises."""
        self._ensure_writable()
        if self._disk_full:
            self._refuse_if_disk_full()
        fast = self._appender()
        msgs = list(msgs)
        with self._lock:
            # validated first: the Appender vouches for what it encodes itself
            # (and keeps the encoding for put_batch), _prepare checks and encodes
            # the rest (a new queue's, or a new store's, messages too: checked
            # against the topic's bytes and the CommitLog file size). Under the
            # lock: every Appender call is (they share its encoding scratch).
            refused, encoded = fast.check_all(msgs, self._topic_bytes, self.commitlog.file_size)
            prepared: list = [None] * len(msgs)
            for i in refused:
                prepared[i] = self._prepare(msgs[i])
            self._ensure_open()
            self._check_write_error()
            own = [p for p in prepared if p is not None]
            plan = fast.plan(encoded, bool(own))
            if own:
                plan = self._plan_prepared(own, plan)
            if plan is not None:
                self._reserve(plan)
            mark = self._mark()
            try:
                results = self._append_batch(fast, msgs, prepared, encoded)
            except BaseException:
                self._undo(mark)
                raise
        if self._sync_flush and results:
            self._commit(results[-1].wrote_offset + results[-1].wrote_bytes)
        return results

    def _appender(self):
        """The Appender, or StoreClosedError (close drops it)."""
        fast = self._fast
        if fast is None:
            self._ensure_open()
            raise StoreClosedError(f"store {self.root_dir} is closed")
        return fast

    def _append_batch(self, fast, msgs, prepared, encoded) -> list:
        """put_messages' appends (append lock held): the Appender's
        put_batch as far as it goes (with check_all's *encoded*), step by
        step where it declines (:meth:`_append_stepped`, which rebinds the
        Appender), one clock reading per message either way."""
        results: list = []
        clock = self._kernel_clock
        i = 0
        while True:
            i, store_ts = fast.put_batch(msgs, i, clock, results, encoded)  # as far as the Appender goes
            if fast.unit_timestamp >= 0:  # (the Appender dispatches what it writes)
                self._last_logics_ts = fast.unit_timestamp
            if i >= len(msgs):
                break
            results.append(self._append_stepped(prepared[i] or self._prepare(msgs[i]), store_ts))
            i += 1
        if results:
            last = results[-1]
            self._written_end = last[2] + last[3]
            self._last_store_ts = last[5]
            if self._waiting:
                self._wake_waiters()
        return results

    def put_message_columns(
        self, topic: str, bodies, queue_ids=0, tags=None, keys=None, unique_keys=None
    ) -> PutColumnsResult:
        """Bulk form of :meth:`put_messages` for callers holding columns: row
        *i* is ``Message(topic, bodies[i], queue_id=queue_ids[i], tags=tags[i],
        keys=keys[i], unique_key=unique_keys[i])``, stored as its own record,
        all under one append lock with one store timestamp (RocketMQ stamps a
        batch once; born timestamp = store timestamp), and under SYNC_FLUSH
        one sync. The rows go through one kernel call
        (``Appender.put_columns``), no Python object per message; rows
        needing a new file or queue, the step-by-step path.

        Args:
            topic (str): one topic for every row.
            bodies (sequence of bytes-like): the bodies.
            queue_ids (int | sequence of int): one queue for all, or one per row.
            tags, keys, unique_keys (None | str | sequence of str|None): one
                value for all rows, or one per row (None: no such property).
                Keys are space-separated (RocketMQ's KEYS).

        Returns a :class:`PutColumnsResult` (numpy arrays, one row per message).

        Raises what :meth:`put_messages` raises for the row's Message, before
        anything is written; ValueError when a column's length differs.
        """
        import numpy as np

        bodies = list(bodies)
        n = len(bodies)
        cols = []
        for name, col in (("queue_ids", queue_ids), ("tags", tags), ("keys", keys), ("unique_keys", unique_keys)):
            if col is None or isinstance(col, (int, str)):
                col = None if col is None else [col] * n
            else:
                col = col.tolist() if hasattr(col, "tolist") else list(col)  # numpy ints become ints
                if len(col) != n:
                    raise ValueError(f"{name} has {len(col)} rows, bodies has {n}")
            cols.append(col)
        qids, tags_c, keys_c, uniq_c = cols
        if qids is None:
            raise MessageTypeError("queue_ids must be an int or a sequence of ints")

        def message(i: int) -> Message:
            return Message(topic, bodies[i], queue_id=qids[i], tags=None if tags_c is None else tags_c[i],
                           keys=None if keys_c is None else keys_c[i],
                           unique_key=None if uniq_c is None else uniq_c[i])

        phys, sizes, qoffs = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
        self._ensure_writable()
        if self._disk_full:
            self._refuse_if_disk_full()
        fast = self._appender()
        with self._lock:
            # validated first (under the lock, as put_messages): the kernel
            # vouches for the rows it encodes itself, the rest are checked as
            # the Message they stand for (and kept so)
            own: dict = {}
            i, encoded = 0, None
            while i < n:  # (the kernel keeps its encodings for put_columns)
                i, encoded = fast.check_columns(topic, bodies, qids, tags_c, keys_c, uniq_c, i, encoded,
                                                self._topic_bytes, self.commitlog.file_size)
                if i < n:
                    own[i] = self._prepare(message(i))
                    i += 1
            self._ensure_open()
            self._check_write_error()
            plan = None if encoded is None else fast.plan(encoded, bool(own))
            if own:
                plan = self._plan_prepared(list(own.values()), plan)
            if plan is not None:
                self._reserve(plan)  # (all or nothing, as put_messages)
            mark = self._mark()
            ts = self._clock()
            i = 0
            try:
                while i < n:
                    i = fast.put_columns(topic, bodies, qids, tags_c, keys_c, uniq_c, i, ts, phys, sizes, qoffs,
                                         encoded)
                    if i < n:  # a new file or queue: this row step by step, then on in one call
                        r = self._append_stepped(own.get(i) or self._prepare(message(i)), ts)
                        phys[i], sizes[i], qoffs[i] = r.wrote_offset, r.wrote_bytes, r.queue_offset
                        i += 1
            except BaseException:
                self._undo(mark)
                raise
            if n:  # rows are stored in order: the last one ends the CommitLog
                self._written_end = int(phys[-1] + sizes[-1])
                self._last_store_ts = ts
                if not self._sync_flush:  # (every row got its unit: dispatched; SYNC_FLUSH's in _commit)
                    self._last_logics_ts = ts
                if self._waiting:
                    self._wake_waiters()
        if self._sync_flush and n:
            self._commit(int(phys[-1] + sizes[-1]))
        return PutColumnsResult(PutMessageStatus.PUT_OK, phys, sizes, qoffs, ts)

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

    # --- reading ---------------------------------------------------------------------

    def get_message(self, physical_offset: int):
        """The record starting at CommitLog physical offset *physical_offset*
        (an int, bytes) as a :class:`MessageExt`, or None when no valid record
        starts there: below the minimum offset, at or past the maximum, or not
        a record boundary (a record whose body CRC does not match is not
        valid: every read checks it). RocketMQ ``lookMessageByOffset``: any
        long (-2**63 .. 2**63-1) is a valid question, answered None where no
        record starts.

        Raises MessageTypeError unless *physical_offset* is an int (a bool is
        not); ArgumentError outside a long; StoreClosedError."""
        if self._closed:
            self._ensure_open()
        out: list = []
        try:  # (the kernel refuses what is not an int, a bool too: the checks cost a lookup nothing)
            if k.read_ext(self.commitlog, physical_offset, MessageExt, out, self._refs) is None:  # clean-up at work
                self._held(k.read_ext, self.commitlog, physical_offset, MessageExt, out)
        except TypeError:
            _int_arg("physical_offset", physical_offset, _I64_MIN, _I64_MAX)  # raises MessageTypeError
            raise
        if out:
            return out[0]
        if not _I64_MIN <= physical_offset <= _I64_MAX:  # (no record is past a long: checked only here)
            _int_arg("physical_offset", physical_offset, _I64_MIN, _I64_MAX)
        return None

    def iter_messages(self, start_offset: int = 0):
        """An iterator of every stored message in CommitLog order from physical
        offset *start_offset* (an int, 0 .. 2**63-1, a record boundary; blank
        records are skipped).

        Raises MessageTypeError, ArgumentError (at once, for *start_offset*),
        StoreClosedError; while iterating CorruptedFileError at a record that
        does not validate, StoreClosedError once the store is closed."""
        self._ensure_open()
        return self._iter_messages(_int_arg("start_offset", start_offset, 0, _I64_MAX))

    def _iter_messages(self, start_offset: int):
        offsets = self.commitlog.iter_offsets(start_offset)
        refs = self._refs
        at = start_offset
        while True:
            refs.hold()  # per step: a paused iterator must not block clean-up
            try:
                nxt = next(offsets, None)
                if nxt is None:
                    mn = self.commitlog.min_offset()
                    if at >= mn:
                        return
                    # clean-up deleted the file we were in: go on at the new start
                    at = mn
                    offsets = self.commitlog.iter_offsets(mn)
                    continue
                at = nxt[0]
                out: list = []
                k.read_ext(self.commitlog, at, MessageExt, out, None)
                if not out:  # raises CorruptedFileError with the reason
                    out.append(MessageExt(self.commitlog.read(at, strict=True)))
            finally:
                refs.release()
            yield out[0]

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

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """First queue offset whose message is still stored (0 for an unknown queue).

        Raises MessageTypeError, ArgumentError (*queue_id* outside a Java
        int), StoreClosedError."""
        self._ensure_open()
        if type(queue_id) is not int or not _I32_MIN <= queue_id <= _I32_MAX:
            queue_id = _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX)
        cq = self._cqs.get((topic, queue_id))
        return cq.min_offset_in_queue() if cq else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be written (0 for an unknown queue).

        Raises MessageTypeError, ArgumentError (*queue_id* outside a Java
        int), StoreClosedError."""
        self._ensure_open()
        if type(queue_id) is not int or not _I32_MIN <= queue_id <= _I32_MAX:
            queue_id = _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX)
        if self.read_only:
            self._follow_queue(topic, queue_id)
        cq = self._cqs.get((topic, queue_id))
        return cq.max_offset_in_queue() if cq else 0

    def _get_messages(
        self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags=None, wait_ms: int = 0
    ) -> GetMessageResult:
        """The careful path of :meth:`get_messages` (StoreCore's), for whatever
        its gate leaves: checks, errors, careful reads, follows and waits."""
        queue_id, offset, max_count = _pull_args(queue_id, offset, max_count)
        wait_ms = _wait_arg(wait_ms)
        result = self._pull(topic, queue_id, offset, max_count, tags)
        if self.read_only and not result.messages and result.status in _WAITABLE:
            # follow mode: a writer process may have dispatched more since
            if self._follow_queue(topic, queue_id):
                result = self._pull(topic, queue_id, offset, max_count, tags)
            if wait_ms > 0 and not result.messages and result.status in _WAITABLE:
                return self._poll_follow(topic, queue_id, offset, max_count, tags, wait_ms, result)
        if wait_ms <= 0 or result.messages or result.status not in _WAITABLE:
            return result
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if result.status is GetMessageStatus.NO_MATCHED_MESSAGE:
                offset = result.next_begin_offset  # filtered units are done with
            with self._arrival:  # held only while waiting: dispatch must not stall
                self._waiting += 1
                try:
                    while True:
                        if self._closed:
                            return result  # close() wakes long polls
                        if self.get_max_offset_in_queue(topic, queue_id) > offset:
                            break
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return result
                        self._arrival.wait(min(left, _WAIT_SLICE))
                finally:
                    self._waiting -= 1
            result = self._pull(topic, queue_id, offset, max_count, tags)
            if result.messages or result.status not in _WAITABLE:
                return result

    def _pull(self, topic, queue_id, offset, max_count, tags) -> GetMessageResult:
        if self._closed:  # (inline: a call per pull is measurable)
            self._ensure_open()
        if type(offset) is int and type(max_count) is int:
            # one kernel call, the tag filter in it (no reader reference, see
            # pull_messages); tags that do not parse: the careful path raises
            try:
                wanted = None if tags is None else _tag_filter(tags)
                cq = self._cqs.get((topic, queue_id))
            except Exception:
                wanted = cq = None
            if cq is not None:
                units = max_count if max_count > _MAX_FILTER_UNITS else _MAX_FILTER_UNITS
                out: list = []
                found = k.pull_messages(cq, self.commitlog, offset, max_count, units, MessageExt, out, wanted,
                                        self._refs)
                if found is None:  # clean-up at work: wait for it, then read
                    found = self._held(k.pull_messages, cq, self.commitlog, offset, max_count, units, MessageExt, out,
                                       wanted)
                if found[0] is not None:  # (stopped: the careful path below reads it all again, and raises)
                    return _new_tuple(GetMessageResult, (found[0], out, *found[1:]))
        refs = self._refs
        refs.hold()  # one reader reference for the whole pull: clean-up waits for it
        try:
            return self._pull_held(topic, queue_id, offset, max_count, tags)
        finally:
            refs.release()

    def _pull_held(self, topic, queue_id, offset, max_count, tags) -> GetMessageResult:
        """The careful pull: the kernels' statuses (k.pull_bounds, then those
        of k.pull_units), reading step by step what they do not vouch for."""
        cq: Any = self._cqs.get((topic, queue_id))
        ended, nxt, mn, mx = k.pull_bounds(cq, offset)
        if ended is not None:
            return GetMessageResult(ended, [], nxt, mn, mx)
        wanted = _tag_filter(tags)
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        messages: list = []
        q = offset
        visited = 0
        cl_min = self.commitlog.min_offset()
        if wanted is None:  # every message: the units of each file in one kernel call
            view = self.commitlog.segment_view()
            max_size = self.commitlog.max_record_size
            stopped = False
            while q < mx and len(messages) < max_count and visited < max(_MAX_FILTER_UNITS, max_count):
                where = cq.unit_range(q, min(max_count - len(messages), mx - q))
                if where is None or where[1] == where[2]:
                    break
                buf, start, end = where
                done, event, stopped = k.pull_units(
                    buf, start, end, view, topic, queue_id, q, max_count, cl_min, max_size, MessageExt, messages
                )
                q += done
                visited += done
                if event is not None:
                    status = event
                if stopped:  # not a record the kernel can vouch for: read it step by step (raises)
                    break
            else:
                return GetMessageResult(status, messages, q, mn, mx)
            if not stopped:
                return GetMessageResult(status, messages, q, mn, mx)
        read = self.commitlog.record_reader()
        while q < mx and len(messages) < max_count and visited < max(_MAX_FILTER_UNITS, max_count):
            units = cq.get_units(q, max_count - len(messages) if wanted is None else max_count)
            if not units:
                break
            for unit in units:
                q += 1
                visited += 1
                phy, size, tags_code = unit
                if size == PRE_BLANK_SIZE and phy == 0 and tags_code == 0:
                    continue  # a pre-blank placeholder (is_pre_blank)
                # while nothing is kept (as the kernels): a unit the filter drops makes
                # NO_MATCHED_MESSAGE, one cleaned up MESSAGE_WAS_REMOVING
                if wanted is not None and tags_code not in wanted[0]:
                    if not messages:
                        status = GetMessageStatus.NO_MATCHED_MESSAGE
                    continue
                if phy < cl_min:
                    if not messages:
                        status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
                fields = read(phy)
                # the record must be the one the unit stands for (docs/recovery.md#pitfall-stored-offsets-trusted)
                if fields[0] != size or fields[5] != q - 1 or fields[3] != queue_id or fields[15] != topic:
                    raise _unit_mismatch(cq, q - 1, phy, size, fields)
                m = MessageExt(fields)
                if wanted is not None and m.tags not in wanted[1]:
                    if not messages:
                        status = GetMessageStatus.NO_MATCHED_MESSAGE
                    continue
                messages.append(m)
                status = GetMessageStatus.FOUND
                if len(messages) >= max_count:
                    break
        return GetMessageResult(status, messages, q, mn, mx)

    def get_message_columns(
        self, topic: str, queue_id: int, offset: int, max_count: int = 1024, with_body: bool = True,
        with_properties: bool = False,
    ) -> GetColumnsResult:
        """Bulk form of :meth:`get_messages`: up to *max_count* messages of
        (topic, queue_id) from queue offset *offset*, decoded by one kernel
        call into column arrays (``decode_columns_at``) instead of one
        :class:`MessageExt` each. For consumers that take many messages at a
        time; no tag filter and no waiting (use get_messages for those).

        Args:
            with_body (bool): include ``body_offsets``/``body_data``.
            with_properties (bool): include the property map columns
                (tags, keys and unique_key are always there).

        Returns a :class:`GetColumnsResult` with the statuses and offsets of
        get_messages (NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE,
        OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE, OFFSET_OVERFLOW_BADLY, FOUND,
        MESSAGE_WAS_REMOVING). *queue_id*, *offset* and *max_count* as in
        get_messages.

        Raises MessageTypeError, ArgumentError (as get_messages),
        StoreClosedError, and CorruptedFileError when a unit points at
        something that is not its record.
        """
        self._ensure_open()
        queue_id, offset, max_count = _pull_args(queue_id, offset, max_count)
        if self.read_only:
            self._follow_if_behind(topic, queue_id, offset)
        self._refs.hold()
        try:
            return self._columns_held(topic, queue_id, offset, max_count, with_body, with_properties)
        finally:
            self._refs.release()

    def _get_message_views(self, topic: str, queue_id: int, offset: int, max_count: int = 32) -> GetViewsResult:
        """The careful path of :meth:`get_message_views` (StoreCore's), for
        whatever its gate leaves: checks, errors, careful reads."""
        if self._closed:
            self._ensure_open()
        queue_id, offset, max_count = _pull_args(queue_id, offset, max_count)
        if self.read_only:
            self._follow_if_behind(topic, queue_id, offset)
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            ended, nxt, mn, mx = k.pull_bounds(cq, offset)
            assert ended is not None  # (NO_MATCHED_LOGIC_QUEUE)
            return GetViewsResult(ended, None, _view_units(b""), nxt, mn, mx)
        units = max_count if max_count > _MAX_FILTER_UNITS else _MAX_FILTER_UNITS
        refs = self._refs
        refs.hold()  # until the view exports the segment: then close() cannot unmap it
        try:
            found = k.pull_views(cq, self.commitlog, offset, max_count, units, None)  # (never None without refs)
            status, nxt, mn, mx, segment, packed = found  # type: ignore[misc]
            view = None if segment is None else memoryview(segment).toreadonly()
        finally:
            refs.release()
        if status is None:  # stopped: the careful path raises for a unit that is not its record
            careful = self.get_messages(topic, queue_id, offset, max_count)
            if careful.messages:
                m = careful.messages[0]
                raise CorruptedFileError(
                    f"the record of {topic}/{queue_id} queue offset {m.queue_offset} does not store the topic "
                    "as its UTF-8 bytes; read it with get_messages", self.commitlog.queue.directory,
                    m.physical_offset,
                )
            return GetViewsResult(careful.status, None, _view_units(b""), careful.next_begin_offset, mn, mx)
        # (the tuple made directly: a NamedTuple's own __new__ is a Python frame, per pull)
        return _new_tuple(GetViewsResult, (status, view, _view_units(packed), nxt, mn, mx))

    def _columns_held(self, topic, queue_id, offset, max_count, with_body, with_properties) -> GetColumnsResult:
        view = self.commitlog.segment_view()
        cq: Any = self._cqs.get((topic, queue_id))
        status, nxt, mn, mx = k.pull_bounds(cq, offset)  # (the statuses of every pull)
        phys: list = []
        sizes: Any = []
        qoffs: Any = []
        if status is None:
            import numpy as np

            status, q, cl_min = GetMessageStatus.NO_MATCHED_MESSAGE, offset, view[3]
            parts = []
            kept = 0
            while q < mx and kept < max_count:
                where = cq.unit_range(q, max_count - kept)
                if where is None or where[1] == where[2]:
                    break
                buf, start, end = where
                # the units as arrays (a copy, never a view of the mapping)
                u = np.frombuffer(buf[start:end], dtype=_UNIT_DTYPE)
                placeholder = (u["size"] == PRE_BLANK_SIZE) & (u["phy"] == 0) & (u["tags"] == 0)
                cleaned = ~placeholder & (u["phy"] < cl_min)
                if cleaned.any():
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                keep = np.flatnonzero(~placeholder & ~cleaned)
                parts.append((u[keep], keep + q))
                kept += len(keep)
                q += len(u)
            if parts:
                units = np.concatenate([p[0] for p in parts])
                phys = units["phy"].tolist()
                sizes = units["size"].astype(np.int32)
                qoffs = np.concatenate([p[1] for p in parts])
            nxt = q
        count, stop, cols = k.decode_columns_at(view[0], view[1], view[2], phys, with_body, with_properties)
        if count < len(phys):
            raise CorruptedFileError(
                f"ConsumeQueue {topic}/{queue_id} unit {qoffs[count]} points at physical offset {phys[count]}, "
                f"where no valid record starts: {REC_STATUS_TEXT.get(stop, 'blank record')}",
                self.commitlog.queue.directory, phys[count],
            )
        if count:
            self._check_columns(cq, topic, queue_id, cols, sizes, qoffs)
            status = GetMessageStatus.FOUND
        return GetColumnsResult(status, cols, nxt, mn, mx)

    @staticmethod
    def _check_columns(cq, topic, queue_id, cols, sizes, qoffs) -> None:
        """Each record is the one its unit stands for (docs/recovery.md#pitfall-stored-offsets-trusted), on arrays."""
        import numpy as np

        topic_b = np.frombuffer(topic.encode("utf-8"), dtype=np.uint8)
        n, width = len(sizes), len(topic_b)
        toff = cols["topic_offsets"]
        same = (
            np.array_equal(cols["store_size"], sizes)
            and np.array_equal(cols["queue_offset"], qoffs)
            and bool((cols["queue_id"] == queue_id).all())
            and bool((np.diff(toff) == width).all())
            and bool((cols["topic_data"].reshape(n, width) == topic_b).all() if width else True)
        )
        if not same:
            i = next(
                i for i in range(n)
                if (cols["store_size"][i], cols["queue_offset"][i], cols["queue_id"][i])
                != (sizes[i], qoffs[i], queue_id)
                or cols["topic_data"][toff[i] : toff[i + 1]].tobytes() != topic_b.tobytes()
            )
            raise CorruptedFileError(
                f"ConsumeQueue {topic}/{queue_id} unit {qoffs[i]} ({sizes[i]} bytes) points at a record of "
                f"{cols['store_size'][i]} bytes for queue {cols['queue_id'][i]} offset {cols['queue_offset'][i]}",
                cq.queue.directory, int(cols["physical_offset"][i]),
            )

    def query_offsets(self, topic: str, key: str, max_count: int = 64, begin: int = 0, end: int = MAX_OFFSET) -> list:
        """Physical offsets the index holds for *key* in *topic* with index time in
        [begin, end] (ms), exactly as RocketMQ's ``IndexService.queryOffset``:
        newest first, at most ``min(max_count, max_msgs_num_batch)``, key-hash
        collisions and duplicates included.

        Args:
            max_count (int): 1 .. 2**31-1.
            begin, end (int): ms since epoch, longs, begin <= end.

        Raises MessageTypeError, ArgumentError, StoreClosedError."""
        self._ensure_open()
        if not isinstance(key, str) or not isinstance(topic, str):
            raise MessageTypeError("topic and key must be str")
        max_count, begin, end = _query_args(max_count, begin, end)
        self._refs.hold()
        try:
            return self.index.query_offsets(topic, key, max_count, begin, end)
        finally:
            self._refs.release()

    def _query_messages(self, topic: str, key: str, max_count: int = 64, begin: int = 0, end: int = MAX_OFFSET) -> list:
        """The careful path of :meth:`query_messages` (StoreCore's), for
        whatever its gate leaves: checks, errors, a clean-up in the way."""
        if self._closed:  # (inline: a call per lookup is measurable)
            self._ensure_open()
        if not isinstance(key, str) or not isinstance(topic, str):
            raise MessageTypeError("topic and key must be str")
        max_count, begin, end = _query_args(max_count, begin, end)
        out: list = []
        if k.query_keyed(self.index, self.commitlog, topic, key, max_count, begin, end, MessageExt, out,
                         self._refs) is None:  # clean-up at work: wait for it, then read
            self._held(k.query_keyed, self.index, self.commitlog, topic, key, max_count, begin, end, MessageExt, out)
        return out

    def look_message_by_msg_id(self, msg_id: str):
        """The message with offset message id *msg_id* (docs/format.md#offset-msgid: store host
        and port, then physical offset, as 32 or 56 hex digits in either
        case), or None when the id is malformed, points nowhere, or names
        another store host. RocketMQ ``viewMessage`` by offset msgId."""
        if self._closed:
            self._ensure_open()
        try:
            host_raw, offset = _split_offset_msg_id(msg_id)
        except ValueError:
            return None
        m = self.get_message(offset)
        # (the record is at that offset: the same id unless another host stored it)
        return m if m is not None and m.store_host_raw == host_raw else None

    def _get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower") -> int:
        """The careful path of :meth:`get_offset_in_queue_by_time` (StoreCore's),
        for whatever its gate leaves: checks, errors, follow mode."""
        if self._closed:  # (inline: a call per lookup is measurable)
            self._ensure_open()
        upper = _BOUNDARIES.get(boundary) if type(boundary) is str else None  # (as given: no lower() per lookup)
        if upper is None:
            try:
                upper = _BOUNDARIES[boundary.lower()]
            except (KeyError, AttributeError):
                raise ArgumentError(f"boundary must be 'lower' or 'upper', got {boundary!r}") from None
        queue_id = _int_arg("queue_id", queue_id, _I32_MIN, _I32_MAX)
        timestamp = _int_arg("timestamp", timestamp, _I64_MIN, _I64_MAX)
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        found = k.time_lookup(cq, self.commitlog, timestamp, upper, self._refs)
        if found is None:  # clean-up at work: under a held reference
            found = self._held(k.time_lookup, cq, self.commitlog, timestamp, upper)
        return found

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

    # --- consumer groups (RocketMQ ConsumerOffsetManager, config/consumerOffset.json) ---

    def consumer_offsets(self):
        """The store's :class:`~rmqstore.service.offsets.ConsumerOffsetStore` over
        ``<root_dir>/config/consumerOffset.json``, loaded on first use (from
        ``.bak`` when the file is missing or does not parse). Commits through it
        are on disk when they return unless made with ``sync=False``.

        Raises StoreClosedError; CorruptedFileError when neither the file nor
        its ``.bak`` parses."""
        self._ensure_open()
        offsets = self._offsets
        if offsets is None:
            from .service.offsets import CONSUMER_OFFSET_FILE, ConsumerOffsetStore

            with self._lock:
                self._ensure_open()  # (close persists and drops it under this lock)
                if self._offsets is None:
                    created = ConsumerOffsetStore(
                        os.path.join(self.root_dir, CONSUMER_OFFSET_FILE),
                        read_only=self.read_only,
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
        Stored in ``config/consumerOffset.json`` under ``"<topic>@<group>"``.

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
            StoreReadOnlyError, StoreClosedError: the store cannot take it.
            MessageTypeError, IllegalMessageError: bad arguments.
            OSError: the file could not be written (the previous file is intact).
        """
        self._ensure_writable()
        self.consumer_offsets().commit(group, topic, queue_id, offset, sync)

    def get_committed_offset(self, group: str, topic: str, queue_id: int):
        """The offset *group* committed for *queue_id* of *topic* (the next queue
        offset it will consume, an int), or None if it never committed one
        (RocketMQ's ``queryOffset`` answers -1). Works on read-only stores,
        re-reading the file when a writer changed it.

        Raises StoreClosedError, MessageTypeError, CorruptedFileError (see
        :meth:`consumer_offsets`)."""
        return self.consumer_offsets().get(group, topic, queue_id)

    def consumer(self, group: str, topic: str, queue_ids=None, batch: int = 32, tags=None, sync=None):
        """A :class:`~rmqstore.service.consumer.Consumer` of *topic* for consumer group
        *group*: an iterator of :class:`MessageExt` from the group's committed
        offsets (a queue's first message when none), round robin over the
        queues (*queue_ids*, or every queue of the topic), committing each
        message's next offset when the following one is asked for
        (at-least-once). It stops when every queue is drained; iterate it again
        or make a new one to continue. *batch* messages are pulled per queue at
        a time; *tags* filters as in :meth:`get_messages`; *sync* as in
        :meth:`commit_offset`.

        Raises StoreReadOnlyError, StoreClosedError, MessageTypeError,
        IllegalMessageError."""
        from .service.consumer import Consumer

        self._ensure_writable()
        return Consumer(self, group, topic, queue_ids=queue_ids, batch=batch, tags=tags, sync=sync)


def _tag_filter(tags):
    if tags is None:
        return None
    if isinstance(tags, str):
        if tags.strip() == "*":
            return None
        names = [t.strip() for t in tags.split("||")]
    else:
        names = [str(t) for t in tags]
    kept = {t for t in names if t}
    return {k.java_hash(t) for t in kept}, kept


def _unit_mismatch(cq, queue_offset, phy, size, fields):
    mf = cq.queue.find(queue_offset * 20)
    return CorruptedFileError(
        f"ConsumeQueue {cq.topic}/{cq.queue_id} unit {queue_offset} ({size} bytes at physical offset {phy}) "
        f"points at a record of {fields[0]} bytes for {fields[15]}/{fields[3]} queue offset {fields[5]}",
        mf.path if mf else cq.queue.directory,
        (queue_offset * 20 - mf.file_from_offset) if mf else None,
    )
