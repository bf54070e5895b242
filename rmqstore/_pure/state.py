"""The state the kernels read and write: the mapped segments and queues, the
CommitLog, ConsumeQueue and index as the kernels see them, the reader
references (``ReferenceResource``), the store's ``StoreState``, and
``StoreCore``, the part of ``MessageStore`` that goes through the gates.
Imports nothing from the other modules of the package."""

from __future__ import annotations

import errno
import mmap
import operator
import sys
import threading
import time
from typing import Any

# Linux 5.14's advice (the mmap module names it from Python 3.13 on)
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)


class MappedRegion:
    """A mapped segment as the kernels read and write it: ``mm`` (the
    mapping, any buffer), ``file_from_offset`` (offset of its byte 0 in its
    log), ``file_size`` (bytes) and ``wrote_position`` (bytes appended,
    relative to the file). ``MappedFile`` is a MappedRegion with the file's
    lifecycle; the core has the same class, with C fields."""

    __slots__ = ("mm", "file_from_offset", "file_size", "wrote_position")

    def __init__(self, mm=None, file_from_offset=0, file_size=0, wrote_position=0) -> None:
        self.mm: Any = mm
        self.file_from_offset: int = operator.index(file_from_offset)
        self.file_size: int = operator.index(file_size)
        self.wrote_position: int = operator.index(wrote_position)


def warm_pages(buf, start, end) -> bool:
    """Fault in the pages of ``buf[start:end]`` writable, as a write there
    would, without changing a byte: a file made ahead is warmed so that the
    puts that later write into it do not wait on page faults (RocketMQ's
    ``warmMappedFile``). Safe while another thread writes into the range.

    *buf*: a writable buffer, normally a file's ``mmap``; *start*, *end*:
    byte positions, clipped to it. Returns True when the operating system
    did it in one call (``MADV_POPULATE_WRITE``, Linux 5.14 and later),
    False when it could not; then the core touches each page with an atomic
    write of its own byte, and the pure twin (which cannot make one atomic)
    touches nothing. Raises OSError when the system refuses the range (a
    page it cannot provide), BufferError for a buffer that is not writable.
    """
    s, e = operator.index(start), operator.index(end)
    with memoryview(buf) as view:
        if view.readonly:
            raise BufferError("Object is not writable.")
        n = view.nbytes
    s = max(s, 0)
    e = min(e, n)
    if e <= s:
        return True
    if _POPULATE_WRITE is None or not isinstance(buf, mmap.mmap):
        return False
    lo = s - s % mmap.PAGESIZE
    try:
        buf.madvise(_POPULATE_WRITE, lo, e - lo)  # (holds the GIL: callers warm a chunk at a time)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    return True


def release_pages(buf, start, end) -> bool:
    """Drop this process's page-table entries for the whole pages inside
    ``buf[start:end]``, bytes that are written and will not be written
    again, before a sync of them: a sync write-protects each page it cleans
    that is still mapped, which interrupts every CPU running a thread of
    this process once per page (a TLB shootdown), a putting thread
    included; released first, the sync cleans pages no table maps, and the
    release costs one interruption for the whole range. The bytes stay in
    the page cache, a dirty page stays to be written back, and the next
    read maps the page again (a minor fault). Releases the GIL.

    *buf*: an ``mmap.mmap`` shared mapping of a file (a private mapping
    would lose the bytes written to it: the caller vouches for a shared
    one, as ``MappedFile`` maps); *start*, *end*: byte positions, clipped
    to it. Returns True when released, False when not (a platform other
    than Linux, a range the kernel refused, such as a locked one; the pure
    twin, whose ``madvise`` holds the GIL, never releases). Raises
    TypeError for a buffer that is not an ``mmap.mmap``.
    """
    if not isinstance(buf, mmap.mmap):
        raise TypeError(f"release_pages needs a file's mmap.mmap, not {type(buf).__name__}")
    s, e = max(operator.index(start), 0), min(operator.index(end), len(buf))
    page = mmap.PAGESIZE
    return e // page * page <= -(-s // page) * page  # (no whole page inside: nothing to release)


def sync_pages(buf, start, end) -> bool:
    """Force the pages holding ``buf[start:end]`` to disk and wait, releasing
    the GIL (``msync(MS_SYNC)``; on Linux the file system's sync of that
    range, as ``fdatasync`` for the whole file). The periodic flush syncs
    only what was appended: pages warmed ahead of the writer stay writable
    rather than being written back as zeros, and a put into them takes no
    page fault (RocketMQ's ``MappedFile.flush`` forces the whole mapping).

    *buf*: a buffer, normally a file's shared ``mmap``; *start*, *end*: byte
    positions, clipped to it. Returns True when the range was synced, False
    when this implementation cannot sync a range without holding the GIL
    (the pure twin): the caller then syncs the whole file. Raises OSError
    from ``msync`` (EIO: the data may not be on disk).
    """
    operator.index(start)
    operator.index(end)
    with memoryview(buf):  # (a TypeError for what is not a buffer, as in the core)
        pass
    return False  # (mmap.flush would hold the GIL for the whole sync)


class MappedQueue:
    """The segments of one log as the kernels walk them: ``files`` (a list
    of :class:`MappedRegion`, in offset order) and ``file_size`` (bytes per
    segment; None for a read-only queue not yet sized). ``MappedFileQueue``
    (RocketMQ's ``MappedFileQueue``) is a MappedQueue with a directory; the
    core has the same class, with C fields."""

    __slots__ = ("files", "file_size")

    def __init__(self) -> None:
        self.files: list = []
        self.file_size: Any = None


class CommitLogBase:
    """A CommitLog as the read kernels use it: ``queue`` (its
    :class:`MappedQueue`) and ``max_record_size`` (the largest record, in
    bytes, a check accepts). ``CommitLog`` is a CommitLogBase with recovery
    and the walks; the core has the same class, with C fields."""

    __slots__ = ("queue", "max_record_size")

    def __init__(self) -> None:
        self.queue: Any = None
        self.max_record_size = 0


class ConsumeQueueBase:
    """A ConsumeQueue as the kernels use it: ``queue`` (its
    :class:`MappedQueue`), ``min_logic_offset`` (byte offset of the first
    valid unit), ``max_physic_offset`` (physical offset past the last
    unit's record, -1: none; the put kernel advances it), ``topic`` and
    ``queue_id``. ``ConsumeQueue`` is a ConsumeQueueBase with recovery and
    the searches; the core has the same class, with C fields."""

    __slots__ = ("queue", "min_logic_offset", "max_physic_offset", "topic", "queue_id")

    def __init__(self) -> None:
        self.queue: Any = None
        self.min_logic_offset = self.max_physic_offset = self.queue_id = 0
        self.topic: Any = None


class IndexRegion:
    """An IndexFile as the kernels use it: ``mm`` (the mapping) and its
    geometry, ``hash_slot_num`` and ``index_num``. ``IndexFile`` is an
    IndexRegion with a path and a header; the core has the same class, with
    C fields."""

    __slots__ = ("mm", "hash_slot_num", "index_num")

    def __init__(self) -> None:
        self.mm: Any = None
        self.hash_slot_num = self.index_num = 0


class IndexServiceBase:
    """The index as a lookup uses it: ``files`` (:class:`IndexRegion`
    objects, oldest first) and ``max_msgs_num_batch`` (the most offsets
    ``query_offsets`` answers, RocketMQ's ``maxMsgsNumBatch``; ``query_keyed``
    walks past it). ``IndexService`` is an
    IndexServiceBase with rolling and recovery; the core has the same
    class, with C fields."""

    __slots__ = ("files", "max_msgs_num_batch")

    def __init__(self) -> None:
        self.files: list = []
        self.max_msgs_num_batch = 0


class ReferenceResource:
    """Reader references over a store's mapped files (RocketMQ's
    ``ReferenceResource``, taken per read operation instead of per file).

    A reader calls :meth:`hold` before it looks up files and :meth:`release`
    after its last byte is copied out (one pair per pull or lookup, never per
    message). Clean-up calls :meth:`acquire_exclusive`: new holds wait, and
    the clean-up proceeds once the references held drain to zero, so no file
    is removed from a queue or unmapped while a reader may be inside it. When
    they do not drain in time the clean-up gives up for this round
    (RocketMQ's failed ``destroy``) and retries later. There is no forced
    unmapping: Python refuses to unmap memory a view still exports
    (BufferError), and a mapping closed between two reads of a pull would
    make that pull fail; the forcible interval only unlinks the file early
    (see ``retention``).

    The store's ``close()`` calls :meth:`shutdown` before it unmaps: from
    then on every :meth:`hold` raises StoreClosedError (holds waiting for a
    clean-up too), clean-ups are refused, and it waits for the readers
    inside to leave.

    Holds are not re-entrant: a thread must not hold twice at once (a
    clean-up waiting between the two would wait for this thread until its
    timeout). The core has the same class and methods, its count and flags
    in C fields.
    """

    __slots__ = ("_lock", "_cond", "_refs", "_exclusive", "_cleaning", "_closed")

    def __init__(self) -> None:
        # a plain Lock (C-level ``with``) on the fast paths; the Condition over
        # the same lock only where someone must wait or be woken
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._refs = 0
        self._exclusive = False  # new holds wait (a clean-up is in, or the store closed)
        self._cleaning = False  # a clean-up owns the exclusivity
        self._closed = False

    @property
    def ref_count(self) -> int:
        """References held right now."""
        return self._refs

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._closed

    @property
    def exclusive_held(self) -> bool:
        """Whether a clean-up or close holds the references exclusively
        (new holds wait, or raise once closed)."""
        return self._exclusive

    def hold(self) -> None:
        """Take one reader reference (waits while a clean-up works).
        Raises StoreClosedError once :meth:`shutdown` was called."""
        with self._lock:
            if not self._exclusive:  # (never clear once closed: see shutdown)
                self._refs += 1
                return
            while self._exclusive and not self._closed:
                self._cond.wait()
            if self._closed:
                from ..exceptions import StoreClosedError

                raise StoreClosedError("the store is closed")
            self._refs += 1

    def release(self) -> None:
        """Drop one reader reference; the last one lets a waiting clean-up in."""
        with self._lock:
            self._refs -= 1
            if self._refs <= 0:
                self._refs = 0
                if self._exclusive:
                    self._cond.notify_all()

    def acquire_exclusive(self, timeout: float) -> bool:
        """Block new holds and wait up to *timeout* seconds for held references
        to drain. Returns True when exclusive (then :meth:`release_exclusive`
        must follow), False when readers stayed inside or the store closed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._exclusive:  # another clean-up: queue behind it
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return False
                self._cond.wait(left)
            if self._closed:
                return False
            self._exclusive = self._cleaning = True
            while self._refs > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._end_cleaning()
                    return False
                self._cond.wait(left)
            return True

    def release_exclusive(self) -> None:
        with self._cond:
            self._end_cleaning()

    def _end_cleaning(self) -> None:
        # (lock held) once closed, holds stay blocked for good
        self._cleaning = False
        if not self._closed:
            self._exclusive = False
        self._cond.notify_all()

    def shutdown(self, timeout: float) -> bool:
        """Close the references for good: every later :meth:`hold` raises
        StoreClosedError, waiting ones included, and clean-ups are refused.
        Then wait up to *timeout* seconds for a clean-up that is in and for
        the readers inside to leave. Idempotent. Returns whether they left
        (False: the caller unmaps with readers inside, which Python's mmap
        survives: a mapping a buffer still exports stays mapped)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._cleaning:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._exclusive = True
            while self._refs > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return not self._cleaning


class StoreState:
    """The state of a store that its put and read gates check and update on
    every call: ``closed``, ``disk_full`` (RocketMQ's DISK_FULL running
    flag), ``pending`` (records appended but not yet dispatched: a
    collection, truthy when any), ``pending_keys`` (the index entries those
    records will take), ``write_error`` (a failed flush, or None),
    ``waiting`` (pulls waiting for new messages), ``written_end`` (physical
    offset past the last record), ``last_store_ts`` and ``last_logics_ts``
    (ms since epoch: the last record's store time, and the last dispatched
    one's). The store keeps one and reads and writes its fields; the core
    has the same class, with C fields."""

    __slots__ = ("closed", "disk_full", "pending", "pending_keys", "write_error", "waiting", "written_end",
                 "last_store_ts", "last_logics_ts")

    def __init__(self) -> None:
        self.closed = self.disk_full = False
        self.pending: Any = None
        self.write_error: Any = None
        self.pending_keys = self.waiting = self.written_end = self.last_store_ts = self.last_logics_ts = 0


def _careful(store: StoreCore) -> Any:
    """*store* as the MessageStore (a StoreCore subclass) whose careful
    paths a StoreCore method calls: ``_put_one``, ``_get_messages`` ..."""
    return store


class StoreCore:
    """The part of :class:`~rmqstore.store.MessageStore` that the kernels
    own: ``put_message`` and the four read methods, each the common case in
    one kernel call through the store's gates (``_put_gate``, a
    :class:`PutGate`, and ``_read_gate``, a :class:`ReadGate`; None where
    the store has none or once it is closed), else the store's careful path
    (``_put_one``, ``_get_offset_in_queue_by_time``, ``_query_messages``,
    ``_get_messages``, ``_get_message_views``), which decides everything
    the gates leave: errors, waits, follows, new files. ``MessageStore`` is
    a StoreCore; a subclass that overrides one of these methods has its
    own. The core has the same class, its methods in C."""

    __slots__ = ("_put_gate", "_read_gate")

    def __init__(self) -> None:
        self._put_gate: Any = None
        self._read_gate: Any = None

    def put_message(self, msg):
        """Append *msg* to the CommitLog and dispatch it to its ConsumeQueue and
        the index before returning (RocketMQ ``putMessage`` + reput). Under
        SYNC_FLUSH it returns only once the record is on disk; concurrent
        producers share one sync (group commit).

        All or nothing: every file the record needs (a CommitLog segment,
        its queue's directory and file, an index file) is made before its
        first byte is written, and a failure after that (an interrupt
        included) undoes the record, so whatever this raises nothing of the
        message is stored and the store goes on; retrying stores no
        duplicate. The one exception is FlushError under SYNC_FLUSH (below).

        Returns a :class:`PutMessageResult` with status PUT_OK.

        Raises:
            MessageTypeError, IllegalMessageError, MessageTooLargeError,
            PropertiesSizeExceededError: bad input.
            StoreReadOnlyError, StoreClosedError: the store cannot take writes.
            FlushError: the sync failed (SYNC_FLUSH), now or earlier; the store
                takes no more writes. The record may still be found after a
                restart (the outcome of this put is unknown, never PUT_OK).
            DiskFullError: disk use is above the warning level (status
                SERVICE_NOT_AVAILABLE; puts resume by themselves when it
                falls), or no room for a file the record needs
                (CREATE_MAPPED_FILE_FAILED).
            OSError: any other failure to make such a file (no descriptor
                left, no permission).
        """
        gate = self._put_gate
        if gate is not None:
            return gate.put(msg)
        return _careful(self)._put_one(msg)

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary="lower"):
        """Queue offset of the first (``"lower"``) or last (``"upper"``) message
        stored at *timestamp* ms, or the nearest one after/before it (RocketMQ
        5.1.1+ ``getOffsetInQueueByTime`` with BoundaryType), clamped to the
        queue's [min, max] offsets; 0 for an unknown queue. *queue_id* is a
        Java int, *timestamp* a long (ms since epoch, any value of one).

        Raises MessageTypeError (a bool or a float is not an int),
        ArgumentError for a number outside its range or any other
        *boundary* (a ValueError), StoreClosedError."""
        gate = self._read_gate
        if gate is not None:
            return gate.get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)
        return _careful(self)._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    def query_messages(self, topic, key, max_count=64, begin=0, end=0x7FFFFFFFFFFFFFFF):
        """The messages stored under *key* in *topic* (docs/recovery.md#lookups-by-key):
        the first *max_count* records, newest first (the order the index walks
        its chains: newest file first, newest entry first), that are still
        stored, whose topic is *topic*, whose UNIQ_KEY or one of whose KEYS is
        *key* (fixes RocketMQ #3613, docs/recovery.md#pitfall-index-hash-collisions)
        and whose own store timestamp lies in [*begin*, *end*]; each record once
        (docs/recovery.md#pitfall-index-duplicate-entries). Unlike
        :meth:`query_offsets`, RocketMQ's raw answer, no collision or
        duplicate takes a place of the *max_count*, ``max_msgs_num_batch``
        does not cap them, and a window of a few ms around a store timestamp
        finds its message (the index keeps whole seconds).

        Args:
            max_count (int): 1 .. 2**31-1.
            begin, end (int): ms since epoch, longs, begin <= end.

        Raises MessageTypeError, ArgumentError, StoreClosedError."""
        gate = self._read_gate
        if gate is not None:
            return gate.query_messages(topic, key, max_count, begin, end)
        return _careful(self)._query_messages(topic, key, max_count, begin, end)

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None, wait_ms=0):
        """Pull up to *max_count* messages of (topic, queue_id) from queue offset
        *offset* (RocketMQ ``getMessage``; with *wait_ms*, its long polling).

        Args:
            topic (str): the topic.
            queue_id (int): a Java int (-2**31 .. 2**31-1); a queue that does
                not exist answers NO_MATCHED_LOGIC_QUEUE.
            offset (int): queue offset, a long (-2**63 .. 2**63-1); outside
                the queue it is answered with a status, as RocketMQ does
                (OFFSET_TOO_SMALL below the minimum, OFFSET_OVERFLOW_ONE at
                the end, OFFSET_OVERFLOW_BADLY past it).
            max_count (int): messages at most, 1 .. 2**31-1.
            tags (str | list[str] | None): None or ``"*"`` for every message,
                else ``"TagA || TagB"`` or a list: kept are messages whose tags
                code matches and whose TAGS really is one of them.
            wait_ms (int | float): when nothing is there yet, wait up to this
                many ms (0 .. 2**63-1, finite) for messages put into this
                store (in this process) and return as soon as one arrives; no
                busy loop; ``close()`` wakes it. 0 returns at once. On a
                read-only store (follow mode) the queue's tail is re-read
                every ``follow_poll_interval`` ms instead, as a writer process
                gives no signal.

        Returns a :class:`GetMessageResult`; ``next_begin_offset`` is where the
        next pull starts. Statuses as RocketMQ: NO_MATCHED_LOGIC_QUEUE,
        NO_MESSAGE_IN_QUEUE, OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE,
        OFFSET_OVERFLOW_BADLY, FOUND, NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING.

        Raises MessageTypeError (an argument of the wrong type: a bool or a
        float is not an int), ArgumentError (a number outside the range
        above), StoreClosedError, and CorruptedFileError when a unit points
        at something that is not its record, or at a record whose body CRC
        does not match (every read checks it; RocketMQ checks it on recovery
        only).
        """
        gate = self._read_gate
        if gate is not None:
            return gate.get_messages(topic, queue_id, offset, max_count, tags, wait_ms)
        return _careful(self)._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    def get_message_views(self, topic, queue_id, offset, max_count=32):
        """Zero-copy form of :meth:`get_messages` (no tag filter, no waiting):
        up to *max_count* messages of (topic, queue_id) from queue offset
        *offset*, as positions in a read-only memoryview of the CommitLog
        segment that holds them instead of one :class:`MessageExt` each.

        The messages of one call come from one segment: a pull that reaches
        a record in the next segment ends there, and ``next_begin_offset``
        points at it. The view pins the mapping (Python never unmaps memory a
        view exports): clean-up still deletes the file, and the store still
        closes, while the mapping stays readable until the last view of it
        is released. Only the ranges ``units`` name are messages; the rest of
        the segment may change under later appends.

        Returns a :class:`GetViewsResult` with the statuses and offsets of
        get_messages; *queue_id*, *offset* and *max_count* as there.

        Raises MessageTypeError, ArgumentError (as get_messages),
        StoreClosedError; CorruptedFileError when a unit points at something
        that is not its record (a damaged body, whose CRC does not match,
        included), or at one whose stored topic is not the queue's topic byte
        for byte (then read it with get_messages)."""
        gate = self._read_gate
        if gate is not None:
            return gate.get_message_views(topic, queue_id, offset, max_count)
        return _careful(self)._get_message_views(topic, queue_id, offset, max_count)
