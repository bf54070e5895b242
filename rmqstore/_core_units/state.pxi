# The classes whose state the kernels read as C fields (declared in
# rmqstore/_core.pxd): mapped regions and queues, the CommitLog, ConsumeQueue
# and index bases, the reader references and the store's state.


@cython.auto_pickle(False)  # (a mapping is not data)
cdef class MappedRegion:
    """A mapped segment as the kernels read and write it: ``mm`` (the
    mapping, any buffer), ``file_from_offset`` (offset of its byte 0 in its
    log), ``file_size`` (bytes) and ``wrote_position`` (bytes appended,
    relative to the file). ``MappedFile`` is a MappedRegion with the file's
    lifecycle; the pure twin has the same class."""

    def __init__(self, mm=None, file_from_offset=0, file_size=0, wrote_position=0):
        self.mm = mm
        self.file_from_offset, self.file_size, self.wrote_position = file_from_offset, file_size, wrote_position


def warm_pages(buf, start, end):
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
    cdef Py_ssize_t s = _idx(start), e = _idx(end)
    cdef Py_buffer v
    cdef int rc
    PyObject_GetBuffer(buf, &v, PyBUF_WRITABLE)
    try:
        if s < 0:
            s = 0
        if e > v.len:
            e = v.len
        if e <= s:
            return True
        with nogil:  # (a gigabyte takes a second: the writer goes on meanwhile)
            rc = rmq_warm_pages(<unsigned char *>v.buf + s, <size_t>(e - s))
    finally:
        PyBuffer_Release(&v)
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return rc == 1


def release_pages(buf, start, end):
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
    if not isinstance(buf, _mmap.mmap):
        raise TypeError(f"release_pages needs a file's mmap.mmap, not {type(buf).__name__}")
    cdef Py_ssize_t s = _idx(start), e = _idx(end)
    cdef Py_buffer v
    cdef int rc
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)  # (held: the mapping outlives the call)
    try:
        if s < 0:
            s = 0
        if e > v.len:
            e = v.len
        if e <= s:
            return True
        with nogil:
            rc = rmq_release_pages(<unsigned char *>v.buf + s, <size_t>(e - s))
    finally:
        PyBuffer_Release(&v)
    return rc == 1


def sync_pages(buf, start, end):
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
    cdef Py_ssize_t s = _idx(start), e = _idx(end)
    cdef Py_buffer v
    cdef int rc
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)  # (held: the mapping outlives the sync)
    try:
        if s < 0:
            s = 0
        if e > v.len:
            e = v.len
        if e <= s:
            return True
        with nogil:
            rc = rmq_sync_pages(<unsigned char *>v.buf + s, <size_t>(e - s))
    finally:
        PyBuffer_Release(&v)
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return True


@cython.auto_pickle(False)  # (a store's files are not data)
cdef class MappedQueue:
    """The segments of one log as the kernels walk them: ``files`` (a list
    of :class:`MappedRegion`, in offset order) and ``file_size`` (bytes per
    segment; None for a read-only queue not yet sized). ``MappedFileQueue``
    (RocketMQ's ``MappedFileQueue``) is a MappedQueue with a directory; the
    pure twin has the same class."""


@cython.auto_pickle(False)
cdef class CommitLogBase:
    """A CommitLog as the read kernels use it: ``queue`` (its
    :class:`MappedQueue`) and ``max_record_size`` (the largest record, in
    bytes, a check accepts). ``CommitLog`` is a CommitLogBase with recovery
    and the walks; the pure twin has the same class."""


@cython.auto_pickle(False)
cdef class ConsumeQueueBase:
    """A ConsumeQueue as the kernels use it: ``queue`` (its
    :class:`MappedQueue`), ``min_logic_offset`` (byte offset of the first
    valid unit), ``max_physic_offset`` (physical offset past the last
    unit's record, -1: none; the put kernel advances it), ``topic`` and
    ``queue_id``. ``ConsumeQueue`` is a ConsumeQueueBase with recovery and
    the searches; the pure twin has the same class."""


@cython.auto_pickle(False)
cdef class IndexRegion:
    """An IndexFile as the kernels use it: ``mm`` (the mapping) and its
    geometry, ``hash_slot_num`` and ``index_num``. ``IndexFile`` is an
    IndexRegion with a path and a header; the pure twin has the same
    class."""


@cython.auto_pickle(False)
cdef class IndexServiceBase:
    """The index as a lookup uses it: ``files`` (:class:`IndexRegion`
    objects, oldest first) and ``max_msgs_num_batch`` (the most offsets
    ``query_offsets`` answers, RocketMQ's ``maxMsgsNumBatch``; ``query_keyed``
    walks past it). ``IndexService`` is an
    IndexServiceBase with rolling and recovery; the pure twin has the same
    class."""


@cython.final
@cython.auto_pickle(False)  # (references are not data)
cdef class ReferenceResource:
    """Reader references over a store's mapped files (RocketMQ's
    ``ReferenceResource``, taken per read operation instead of per file).

    A reader calls :meth:`hold` before it looks up files and :meth:`release`
    after its last byte is copied out (one pair per pull or lookup, never per
    message); the read kernels take and drop one themselves when given the
    store's references. Clean-up calls :meth:`acquire_exclusive`: new holds
    wait, and the clean-up proceeds once the references held drain to zero,
    so no file is removed from a queue or unmapped while a reader may be
    inside it. When they do not drain in time the clean-up gives up for this
    round (RocketMQ's failed ``destroy``) and retries later. There is no
    forced unmapping: Python refuses to unmap memory a view still exports
    (BufferError), and a mapping closed between two reads of a pull would
    make that pull fail; the forcible interval only unlinks the file early
    (see ``retention``).

    The store's ``close()`` calls :meth:`shutdown` before it unmaps: from
    then on every :meth:`hold` raises StoreClosedError (holds waiting for a
    clean-up too) and clean-ups are refused, and it waits for the readers
    inside to leave.

    Holds are not re-entrant: a thread must not hold twice at once (a
    clean-up waiting between the two would wait for this thread until its
    timeout). The pure twin has the same class and methods."""

    def __cinit__(self):
        self.cond = threading.Condition()

    cdef bint try_hold(self) noexcept:
        """Take one reference unless a clean-up or close holds them
        exclusively (then False: the caller goes to hold(), which waits or
        raises). One atomic compare-and-swap: no lock, no GIL needed."""
        return rmq_ref_try_hold(&self.word)

    cdef int drop(self) except -1:
        """Drop one reference (an unbalanced drop changes nothing); the last
        one wakes a clean-up or close waiting for them to drain."""
        if rmq_ref_drop(&self.word) == RMQ_REF_EXCLUSIVE:
            with self.cond:
                self.cond.notify_all()
        return 0

    cdef Py_ssize_t _count(self) noexcept:
        return rmq_ref_load(&self.word) >> 1

    @property
    def ref_count(self):
        """References held right now."""
        return self._count()

    @property
    def closed(self):
        """Whether :meth:`shutdown` was called."""
        return self.shut

    @property
    def exclusive_held(self):
        """Whether a clean-up or close holds the references exclusively
        (new holds wait, or raise once closed)."""
        return rmq_ref_load(&self.word) & RMQ_REF_EXCLUSIVE != 0

    def hold(self):
        """Take one reader reference (waits while a clean-up works).
        Raises StoreClosedError once :meth:`shutdown` was called."""
        if self.try_hold():
            return
        with self.cond:  # (held from each check to its wait: no wake-up is lost)
            while not self.try_hold():
                if self.shut:
                    from .exceptions import StoreClosedError
                    raise StoreClosedError("the store is closed")
                self.cond.wait()

    def release(self):
        """Drop one reader reference; the last one lets a waiting clean-up in."""
        self.drop()

    def acquire_exclusive(self, timeout):
        """Block new holds and wait up to *timeout* seconds for held
        references to drain. Returns True when exclusive (then
        :meth:`release_exclusive` must follow), False when readers stayed
        inside or the store closed."""
        deadline = time.monotonic() + timeout
        with self.cond:  # (the flags change only under it)
            while rmq_ref_load(&self.word) & RMQ_REF_EXCLUSIVE:  # another clean-up: queue behind it
                left = deadline - time.monotonic()
                if self.shut or left <= 0:
                    return False
                self.cond.wait(left)
            if self.shut:
                return False
            self.cleaning = True
            rmq_ref_set_exclusive(&self.word)
            while self._count() > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._end_cleaning()
                    return False
                self.cond.wait(left)
            return True

    def release_exclusive(self):
        """End a clean-up's exclusivity: waiting holds go on."""
        with self.cond:
            self._end_cleaning()

    cdef int _end_cleaning(self) except -1:
        # (cond held) once closed, holds stay blocked for good
        self.cleaning = False
        if not self.shut:
            rmq_ref_clear_exclusive(&self.word)
        self.cond.notify_all()
        return 0

    def shutdown(self, timeout):
        """Close the references for good: every later :meth:`hold` raises
        StoreClosedError, waiting ones included, and clean-ups are refused.
        Then wait up to *timeout* seconds for a clean-up that is in and for
        the readers inside to leave. Idempotent. Returns whether they left
        (False: the caller unmaps with readers inside, which Python's mmap
        survives: a mapping a buffer still exports stays mapped)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            self.shut = True
            self.cond.notify_all()
            while self.cleaning:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            rmq_ref_set_exclusive(&self.word)
            while self._count() > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return not self.cleaning


cdef inline bint _hold(object refs) except -1:
    """Take a reader reference from *refs* (the store's
    ``ReferenceResource``) for a read kernel, which then drops it with
    :func:`_drop` when its last byte is copied out: clean-up and the store's
    close() wait for it, so no file the kernel reads is unmapped or removed
    meanwhile, whatever Python code (a finalizer, another thread) runs.
    False when a clean-up or close holds the references exclusively: the
    caller then goes to ``refs.hold()``, which waits or raises
    StoreClosedError. *refs* None: the caller holds one (True)."""
    return refs is None or (<ReferenceResource?>refs).try_hold()


cdef inline int _drop(object refs) except -1:
    if refs is not None:
        (<ReferenceResource>refs).drop()
    return 0


@cython.auto_pickle(False)  # (a store's state is not data)
cdef class StoreState:
    """StoreState(): the state of a store that its put and read gates check
    and update on every call (see _core.pxd for the fields): ``closed``,
    ``disk_full`` (RocketMQ's DISK_FULL running flag), ``pending`` (records
    appended but not yet dispatched: a collection, truthy when any),
    ``pending_keys`` (the index entries those records will take),
    ``write_error`` (a failed flush, or None), ``waiting`` (pulls waiting
    for new messages), ``written_end`` (physical offset past the last
    record), ``last_store_ts`` and ``last_logics_ts`` (ms since epoch: the
    last record's store time, and the last dispatched one's). The store
    keeps one and reads and writes its fields; the pure twin has the same
    class. (Cython starts the fields as False, None and 0.)"""
