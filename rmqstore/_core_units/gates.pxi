# The store's append lock, and the gates: PutGate, StoreCore (put_message
# and the read methods' common case in C) and ReadGate.


cdef inline long long _wall_ms() noexcept:
    """``time.time_ns() // 1_000_000``: the same clock (CLOCK_REALTIME), in C."""
    cdef timespec t
    clock_gettime(CLOCK_REALTIME, &t)
    return <long long>t.tv_sec * 1000 + t.tv_nsec // 1000000


@cython.auto_pickle(False)  # (a lock is not data)
cdef class AppendLock:
    """The store's append lock (RocketMQ's ``PutMessageReentrantLock``):
    reentrant, with ``acquire(blocking=True)``, ``release()`` and the
    context manager protocol; ``release`` by a thread that does not hold it
    raises RuntimeError. The twin wraps ``threading.RLock``. The core's is
    its own, so that its ``PutGate`` takes it in C (``RLock.acquire`` parses
    its arguments on every call); a thread waiting for it releases the GIL
    and runs signal handlers, as ``RLock`` waiters do."""
    cdef rmq_lock_t lock
    cdef unsigned long owner
    cdef Py_ssize_t count  # the owner's acquisitions not yet released (0: free)

    def __cinit__(self):
        self.lock = rmq_lock_new()
        if self.lock == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.lock != NULL:
            rmq_lock_free(self.lock)

    cdef int _acquire(self, bint blocking=True) except -1:
        """1 when taken (again, by its owner), 0 when not (*blocking* False)."""
        cdef unsigned long me = rmq_thread_id()
        cdef rmq_lock_status r
        if self.count and self.owner == me:
            self.count += 1
            return 1
        r = rmq_lock_take(self.lock, 0, 0)
        while r != RMQ_LOCK_ACQUIRED:
            if not blocking:
                return 0
            with nogil:  # the owner needs the GIL to get on and release it
                r = rmq_lock_take(self.lock, -1, 1)
            if r == RMQ_LOCK_INTR:
                PyErr_CheckSignals()  # (a signal handler's exception, e.g. KeyboardInterrupt, ends the wait)
        self.owner, self.count = me, 1
        return 1

    cdef int _release(self) except -1:
        if not self.count or self.owner != rmq_thread_id():
            raise RuntimeError("cannot release un-acquired lock")
        self.count -= 1
        if not self.count:
            self.owner = 0
            rmq_lock_give(self.lock)
        return 0

    def acquire(self, bint blocking=True):
        """Take the lock (again, when this thread holds it); with *blocking*
        False, return at once. Returns True when taken, False when not."""
        return self._acquire(blocking) == 1

    def release(self):
        """Release one acquisition. Raises RuntimeError when this thread
        does not hold the lock."""
        self._release()

    def __enter__(self):
        self._acquire()
        return True

    def __exit__(self, *exc):
        self._release()


@cython.auto_pickle(False)  # (a store's gate is not data)
cdef class PutGate:
    """``MessageStore.put_message`` in one call: the store's state checks,
    its append lock, the store clock, :meth:`Appender.put` and the store's
    bookkeeping after it; under SYNC_FLUSH (an Appender that does not
    dispatch) then ``store._commit``, with the lock released, so that
    producers share a sync (group commit). The store's ``put_message``
    (:class:`StoreCore`'s) calls it (the core's then runs no Python code on
    a put). What the gate reads and writes is the store's :class:`StoreState`
    *state* (``disk_full``, ``closed``, ``pending``, ``write_error``,
    ``waiting``; ``written_end``, ``last_store_ts``, ``last_logics_ts``),
    under the store's append *lock*; what it declines goes to
    ``store._put_one``, the step-by-step path.

    *clock*: None for the store's default, ``time.time_ns() // 1_000_000``
    (ms since the epoch, read in C by the core), else a callable returning
    the store time in ms. The gate keeps a weak reference to the store
    (its ``_put_gate`` field holds the gate); ``detach()`` (on close)
    drops the Appender and all it holds of the store, so that a gate kept
    past close keeps nothing alive and goes to ``_put_one``, which raises
    StoreClosedError (as the gate does once the store is gone)."""
    # The docstrings are the twin's (_pure.PutGate). The store's state is
    # its StoreState's C fields.
    cdef object store, lock_acquire, lock_release, clock
    cdef AppendLock alock  # the store's lock when it is the core's (else its Python-level methods)
    cdef Appender appender
    cdef StoreState state

    def __init__(self, store, StoreState state not None, lock, Appender appender, clock):
        self.store = weakref.ref(store)
        self.state = state
        if type(lock) is AppendLock:
            self.alock = lock
        else:
            self.lock_acquire, self.lock_release = lock.acquire, lock.release
        self.appender = appender
        self.clock = clock

    def detach(self):
        """Drop the Appender and the lock (on close): ``put`` then goes to
        ``store._put_one``, which raises StoreClosedError."""
        self.appender = self.alock = None
        self.lock_acquire = self.lock_release = None

    def put(self, msg):
        """``MessageStore.put_message(msg)`` (see there)."""
        return self.c_put(msg)

    cdef object c_put(self, msg):
        # taken at once: detach (close, in another thread) may clear them
        cdef Appender fast = self.appender
        cdef AppendLock alock = self.alock
        cdef long long end = 0, ts
        cdef StoreState st = self.state
        cdef bint now
        acquire, release = self.lock_acquire, self.lock_release
        store = rmq_deref(self.store)
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from .exceptions import StoreClosedError
            raise StoreClosedError("the store of this put_message is gone (closed)")
        result = None
        if fast is not None and not st.disk_full:
            now = fast.dispatch  # (else SYNC_FLUSH: records wait in pending for the sync)
            if alock is not None:
                alock._acquire()
            else:
                acquire()
            try:
                if not st.closed and (not now or not st.pending) and st.write_error is None:
                    if self.clock is None:  # (read in C, made an int once)
                        ts = _wall_ms()
                        store_ts = fast._ts_int(ts)
                        result = fast._put_c(msg, store_ts, ts, &end)
                    else:
                        store_ts = self.clock()
                        result = fast._put(msg, store_ts, &end)
                    if result is None:  # not for the one-call path: step by step
                        if now:
                            return store._put_one(msg, store_ts)
                        result = store._put_one(msg, store_ts, False)
                        end = result[2] + result[3]
                    else:
                        st.written_end = end
                        st.last_store_ts = store_ts
                        if fast.unit_timestamp >= 0:  # (a transaction's prepared record gets no unit)
                            st.last_logics_ts = fast.unit_timestamp
                        # read after the unit is in: a waiter that missed it sees it
                        if st.waiting:
                            store._wake_waiters()
                    if now:
                        return result
            finally:
                if alock is not None:
                    alock._release()
                else:
                    release()
            if result is not None:  # SYNC_FLUSH: on disk, then dispatched (the lock released: group commit)
                store._commit(end)
                return result
        return store._put_one(msg)


cdef enum:
    _I32_MAX = 0x7FFFFFFF


@cython.auto_pickle(False)  # (a store is not data)
cdef class StoreCore:
    """The part of :class:`~rmqstore.store.MessageStore` that the kernels
    own: ``put_message`` and the four read methods, each the common case in
    one kernel call through the store's gates (``_put_gate``, a
    :class:`PutGate`, and ``_read_gate``, a :class:`ReadGate`; None where
    the store has none or once it is closed), else the store's careful path
    (``_put_one``, ``_get_offset_in_queue_by_time``, ``_query_messages``,
    ``_get_messages``, ``_get_message_views``), which decides everything
    the gates leave: errors, waits, follows, new files. ``MessageStore`` is
    a StoreCore; a subclass that overrides one of these methods has its
    own. The pure twin has the same class."""

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
        if type(gate) is PutGate:
            return (<PutGate>gate).c_put(msg)
        if gate is not None:
            return gate.put(msg)
        return self._put_one(msg)

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
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)
        if gate is not None:
            return gate.get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)
        return self._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

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
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_query_messages(topic, key, max_count, begin, end)
        if gate is not None:
            return gate.query_messages(topic, key, max_count, begin, end)
        return self._query_messages(topic, key, max_count, begin, end)

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
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_get_messages(topic, queue_id, offset, max_count, tags, wait_ms)
        if gate is not None:
            return gate.get_messages(topic, queue_id, offset, max_count, tags, wait_ms)
        return self._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

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
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_get_message_views(topic, queue_id, offset, max_count)
        if gate is not None:
            return gate.get_message_views(topic, queue_id, offset, max_count)
        return self._get_message_views(topic, queue_id, offset, max_count)


@cython.auto_pickle(False)  # (a store's gate is not data)
cdef class ReadGate:
    """The common case of the store's lookups and pulls in one call each:
    ``get_offset_in_queue_by_time``, ``query_messages``, ``get_messages``
    and ``get_message_views`` (same names, arguments and defaults as the
    ``MessageStore`` methods,
    whose docstrings hold). The store's methods of those names
    (:class:`StoreCore`'s) call them, so the core's runs no Python code on
    an open store's lookup or pull. Each method:

    - checks the store is open (its StoreState) and the gate attached;
    - for the common case (an exact ``"lower"``/``"upper"`` boundary; str
      topic and key; an int queue id, an int offset, timestamp, begin and
      end within a long, an int count in 1 .. 2**31-1, begin <= end, an int
      wait_ms in 0 .. 2**63-1, tags None or a str; views of a writable
      store) calls the whole-operation kernel (:func:`time_lookup`,
      :func:`query_keyed`, :func:`pull_messages`, :func:`pull_views`) with
      the store's reader references;
    - hands anything else to the store's careful path (``_`` + its name), which
      decides (errors, an argument out of its range, an unknown queue, a
      clean-up holding the references, a careful read, a follow or a wait
      included): a pull only when ``get_messages`` would return its result
      unchanged.

    Args:
        store (MessageStore): held weakly (the store holds the gate).
        state (StoreState): the store's.
        cqs (dict): the store's ConsumeQueues by (topic, queue_id).
        commitlog (CommitLogBase), index (IndexServiceBase), refs
            (ReferenceResource), read_only (bool): the store's.
        message_type (type): what a message is made as (``MessageExt``).
        result_type (type): ``GetMessageResult``, a 5-tuple type.
        views_type (type): ``GetViewsResult``, a 6-tuple type.
        units_of (Callable[[bytes], numpy.ndarray]): pull_views' packed
            units as ``GetViewsResult.units``.
        tag_filter (Callable): ``store._tag_filter``: a ``tags`` argument
            as the filter :func:`pull_messages` takes (None for every
            message); the gate keeps the last str's.
        statuses (Mapping[str, GetMessageStatus]): by name.
        min_units (int): a pull visits at least this many units
            (``store._MAX_FILTER_UNITS``).

    ``detach()`` (on close) drops what the gate holds of the store; the
    methods then go to the store's, which raise StoreClosedError, as they
    do once the store is gone."""
    # The docstrings are the twin's (_pure.ReadGate). Each method is the
    # common case of the store method of its name, in C; whatever else
    # comes goes to that method of the store's class.
    cdef object store  # a weak reference
    cdef dict cqs
    cdef list queues  # (topic, queue_id, cq) by queue_id: see _queue
    cdef object commitlog, index, refs, message_type, result_type, views_type, units_of, tag_filter, min_units
    cdef tuple last_filter  # (tags, its filter): see _filter
    cdef bint read_only
    cdef StoreState state

    def __init__(self, store, StoreState state not None, cqs, commitlog, index, refs, bint read_only, message_type,
                 result_type, views_type, units_of, tag_filter, min_units):
        if not PyDict_CheckExact(cqs):
            raise TypeError("a store's _cqs must be a dict")
        self.store = weakref.ref(store)
        self.state = state
        self.cqs = cqs
        self.commitlog, self.index, self.refs = commitlog, index, refs
        self.read_only = read_only
        self.message_type, self.result_type = message_type, result_type
        self.views_type, self.units_of, self.tag_filter = views_type, units_of, tag_filter
        self.last_filter = (None, None)
        self.min_units = _idx(min_units)
        self.queues = [None] * 16

    def detach(self):
        """Drop what the gate holds of the store (on close); its methods
        then go to the store class's, which raise StoreClosedError."""
        self.cqs = self.queues = None
        self.commitlog = self.index = self.refs = None

    cdef object _queue(self, dict cqs, object topic, object queue_id):
        """cqs.get((topic, queue_id)), the last queue found for each of 16
        queue-id slots kept by the identity of an exact str topic and int
        queue id: the store only ever adds queues to its dict, so a pair
        once found maps to that queue for as long as the gate is attached
        (a tuple made, hashed and compared per lookup costs ~0.4k
        instructions)."""
        cdef list queues = self.queues
        cdef Py_ssize_t i
        if not PyLong_CheckExact(queue_id):  # a bool, a float, a numpy int: the store's method checks it
            return None
        if queues is None or not PyUnicode_CheckExact(topic):
            return cqs.get((topic, queue_id))
        i = PyObject_Hash(queue_id) & 15
        cq = _slot_hit(queues, i, topic, queue_id)
        if cq is not None:
            return cq
        cq = cqs.get((topic, queue_id))
        if cq is not None:
            queues[i] = (topic, queue_id, cq)
        return cq

    cdef object _filter(self, object tags):
        """tag_filter(tags) for a str (the last one's kept: a consumer pulls
        with the same subscription), False for anything else or an error
        (the store's method decides)."""
        cdef tuple last = self.last_filter  # (one tuple: another thread may replace it)
        if not PyUnicode_CheckExact(tags):
            return False
        if last[0] is tags:
            return last[1]
        try:
            found = self.tag_filter(tags)
        except Exception:
            return False
        self.last_filter = (tags, found)
        return found

    cdef object _store(self):
        """The store, or StoreClosedError once it is gone."""
        store = rmq_deref(self.store)
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from .exceptions import StoreClosedError
            raise StoreClosedError("the store of this method is gone (closed)")
        return store

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary="lower"):
        """``MessageStore.get_offset_in_queue_by_time`` (see there)."""
        return self.c_get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    cdef object c_get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary):
        cdef dict cqs = self.cqs  # taken at once: detach (close, in another thread) may clear them
        cdef int upper = -1
        cdef long long ts
        commitlog, refs = self.commitlog, self.refs
        store = self._store()
        if PyUnicode_CheckExact(boundary):  # as given, any other spelling: the store's method
            if <str>boundary == "lower":
                upper = 0
            elif <str>boundary == "upper":
                upper = 1
        # (any other timestamp: the store's method checks it, and refuses what is not a long)
        if upper >= 0 and cqs is not None and _long_in(timestamp, LLONG_MIN, LLONG_MAX, &ts) \
                and not self.state.closed:
            cq = self._queue(cqs, topic, queue_id)
            if cq is not None:
                found = _time_lookup(cq, commitlog, timestamp, upper, refs)
                if found is not None:
                    return found
        return store._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    def query_messages(self, topic, key, max_count=64, begin=0, end=0x7FFFFFFFFFFFFFFF):
        """``MessageStore.query_messages`` (see there)."""
        return self.c_query_messages(topic, key, max_count, begin, end)

    cdef object c_query_messages(self, topic, key, max_count, begin, end):
        cqs, index, commitlog, refs = self.cqs, self.index, self.commitlog, self.refs
        store = self._store()
        cdef list out
        cdef long long mc, lo, hi
        if cqs is not None and PyUnicode_CheckExact(topic) and PyUnicode_CheckExact(key) \
                and _long_in(max_count, 1, _I32_MAX, &mc) and _long_in(begin, LLONG_MIN, LLONG_MAX, &lo) \
                and _long_in(end, lo, LLONG_MAX, &hi) and not self.state.closed:
            out = []
            if _query_keyed_held(index, commitlog, topic, key, max_count, lo, hi, self.message_type, out,
                                 refs) is not None:
                return out
        return store._query_messages(topic, key, max_count, begin, end)

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None, wait_ms=0):
        """``MessageStore.get_messages`` (see there)."""
        return self.c_get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    cdef object c_get_messages(self, topic, queue_id, offset, max_count, tags, wait_ms):
        cdef dict cqs = self.cqs
        cdef list out
        cdef long long off, mc, wait
        commitlog, refs = self.commitlog, self.refs
        store = self._store()
        wanted = None if tags is None else self._filter(tags)
        if cqs is not None and wanted is not False and _long_in(offset, LLONG_MIN, LLONG_MAX, &off) \
                and _long_in(max_count, 1, _I32_MAX, &mc) and _long_in(wait_ms, 0, LLONG_MAX, &wait) \
                and not self.state.closed:
            cq = self._queue(cqs, topic, queue_id)
            if cq is not None:
                out = []
                found = _pull_messages(cq, commitlog, offset, max_count,
                                       max_count if max_count > self.min_units else self.min_units,
                                       self.message_type, out, wanted, refs)
                # what the store's method would do next: a careful read, a follow or a wait
                if found is not None and found[0] is not None and (out or (not self.read_only and wait == 0)):
                    return rmq_tuple5(self.result_type, found[0], out, found[1], found[2], found[3])
        return store._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    def get_message_views(self, topic, queue_id, offset, max_count=32):
        """``MessageStore.get_message_views`` (see there)."""
        return self.c_get_message_views(topic, queue_id, offset, max_count)

    cdef object c_get_message_views(self, topic, queue_id, offset, max_count):
        cdef dict cqs = self.cqs
        cdef long long off, mc
        commitlog, refs = self.commitlog, self.refs
        store = self._store()
        if cqs is not None and not self.read_only and _long_in(offset, LLONG_MIN, LLONG_MAX, &off) \
                and _long_in(max_count, 1, _I32_MAX, &mc) and not self.state.closed:
            cq = self._queue(cqs, topic, queue_id)
            if cq is not None and _hold(refs):
                # held until the view exports the segment: then close() cannot unmap it
                try:
                    found = _pull_queue(cq, commitlog, offset, max_count,
                                        max_count if max_count > self.min_units else self.min_units, None, None, None)
                    segment = found[4]
                    view = None if segment is None else memoryview(segment).toreadonly()
                finally:
                    _drop(refs)
                if found[0] is not None:  # (stopped: the store's method reads it carefully, and raises)
                    return rmq_tuple6(self.views_type, 0, found[0], view,
                                      self.units_of(found[5]), found[1], found[2], found[3])
        return store._get_message_views(topic, queue_id, offset, max_count)


cdef int _check_columns(object bodies, object queue_ids, object tags, object keys, object unique_keys) except -1:
    cdef Py_ssize_t n = len(bodies)
    if not PyList_CheckExact(bodies) or not PyList_CheckExact(queue_ids) or len(queue_ids) != n:
        raise TypeError("bodies and queue_ids must be lists of one length")
    for col in (tags, keys, unique_keys):
        if col is not None and (not PyList_CheckExact(col) or len(col) != n):
            raise TypeError("tags, keys and unique_keys must be None or lists as long as bodies")
    return 0
