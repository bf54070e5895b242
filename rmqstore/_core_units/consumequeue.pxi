# ConsumeQueue kernels (cq_*), the CommitLog view the reads share, and the
# search by store time (cq_search_time, time_lookup).


# --- ConsumeQueue ---------------------------------------------------------


def cq_put(buf, pos, physical_offset, size, tags_code):
    """Write one 20-byte ConsumeQueue unit at *pos*.
    Raises ValueError for a position outside *buf*."""
    cdef long long phy = _i64(physical_offset), tags = _i64(tags_code)
    cdef int sz = _i32(size)
    cdef Py_ssize_t p0 = _idx(pos)
    cdef unsigned char *b
    cdef Py_buffer v
    cdef bint writable = _get_rw(buf, &v)
    try:
        if p0 < 0 or p0 > v.len - CQ_STORE_UNIT_SIZE:
            raise ValueError(f"no ConsumeQueue unit at {pos} in a buffer of {v.len} bytes")
        if not writable:
            _not_writable(buf)
        b = <unsigned char *>v.buf + p0
        # size last: a unit torn by a crash has size 0 and is invalid
        st64(b, <uint64_t>phy)
        st64(b + 12, <uint64_t>tags)
        st32(b + 8, <uint32_t>sz)
    finally:
        PyBuffer_Release(&v)


def cq_get(buf, pos):
    """Read the unit at *pos*: ``(physical_offset, size, tags_code)``.
    Raises ValueError for a position outside *buf*."""
    cdef Py_ssize_t p0 = _idx(pos)
    cdef Py_buffer v
    cdef const unsigned char *b
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        if p0 < 0 or p0 > v.len - CQ_STORE_UNIT_SIZE:
            raise ValueError(f"no ConsumeQueue unit at {pos} in a buffer of {v.len} bytes")
        b = <const unsigned char *>v.buf + p0
        return (ld64(b), ld32(b + 8), ld64(b + 12))
    finally:
        PyBuffer_Release(&v)


def cq_units(buf, start, end):
    """Every unit in ``buf[start:end]`` (whole units only) as tuples."""
    cdef Py_ssize_t s = _idx(start), e = _idx(end), p
    cdef Py_buffer v
    cdef const unsigned char *b
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        if e > v.len:
            e = v.len
        if s < 0 or s >= e:
            return []
        e -= (e - s) % CQ_STORE_UNIT_SIZE
        b = <const unsigned char *>v.buf
        out = []
        p = s
        while p < e:
            out.append((ld64(b + p), ld32(b + p + 8), ld64(b + p + 12)))
            p += CQ_STORE_UNIT_SIZE
        return out
    finally:
        PyBuffer_Release(&v)


def cq_scan(buf, start, end, phy_limit=None):
    """Recovery scan of one ConsumeQueue file.

    From *start*, walk units while they are valid (physical offset >= 0 and
    size > 0) and, when *phy_limit* is an int, point below it (the truncation
    of dirty queue units at recovery). Returns ``(valid_end, max_physical_end)``: the position after
    the last valid unit, and offset + size of the last valid unit that is not
    a pre-blank placeholder (-1 if none).
    """
    cdef Py_ssize_t s = _idx(start), e = _idx(end), p
    cdef int64_t phy, tags, last_phy = 0
    cdef int32_t size, last_size = 0
    cdef bint found = False, limited = phy_limit is not None
    cdef rmq_i128 lim = _wide(phy_limit) if limited else 0
    cdef Py_buffer v
    cdef const unsigned char *b
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        if e > v.len:
            e = v.len
        p = s if s > 0 else 0
        while p < e and e - p >= CQ_STORE_UNIT_SIZE:
            phy = ld64(b + p)
            size = ld32(b + p + 8)
            tags = ld64(b + p + 12)
            if phy < 0 or size <= 0 or (limited and <rmq_i128>phy >= lim):
                break
            if not (phy == 0 and size == PRE_BLANK_SIZE and tags == 0):
                last_phy = phy
                last_size = size
                found = True
            p += CQ_STORE_UNIT_SIZE
    finally:
        PyBuffer_Release(&v)
    # offset + size may pass 2**63: add as Python ints
    max_end = (<object>last_phy) + last_size if found else -1
    if s >= 0 and p == s:
        return start, max_end  # _pure returns max(start, 0) itself
    return p, max_end


cdef struct _View:
    # a CommitLog view (bufs, file_size, base, lo, hi), one segment held at a time
    long long fs, base, lo, hi
    Py_ssize_t n, seg  # segments; the one held in buf (-1: none)
    bint files  # bufs holds MappedFile objects (their .mm), not buffers
    Py_buffer buf


cdef inline object _segment(object bufs, Py_ssize_t i, bint files):
    return (<MappedRegion?>bufs[i]).mm if files else bufs[i]


cdef object _view_open(_View *v, object view):
    """Parse *view* into v (nothing held yet); returns its list of buffers."""
    bufs, fsz, fbase, flo, fhi = view
    if not PyList_CheckExact(bufs):
        raise TypeError("a CommitLog view holds a list of buffers")
    v.n = PyList_GET_SIZE(bufs)
    v.fs, v.base, v.lo, v.hi = _i64(fsz), _i64(fbase), _i64(flo), _i64(fhi)
    _view_ready(v, False)
    return bufs


cdef inline MappedQueue _queue_of_log(object commitlog):
    cdef MappedQueue queue = (<CommitLogBase?>commitlog).queue
    if queue is None:
        raise TypeError("a CommitLog without a queue")
    return queue


cdef inline Py_ssize_t _max_record(object commitlog) except -1:
    cdef long long m = (<CommitLogBase?>commitlog).max_record_size
    if m < 0 or m > PY_SSIZE_T_MAX:
        raise ValueError(f"max_record_size {m} is out of range")
    return <Py_ssize_t>m


cdef inline MappedQueue _queue_of_cq(object cq):
    cdef MappedQueue queue = (<ConsumeQueueBase?>cq).queue
    if queue is None:
        raise TypeError("a ConsumeQueue without a queue")
    return queue


cdef object _view_of(_View *v, object commitlog):
    """v over *commitlog*'s segments as ``CommitLog.segment_view()`` would
    see them now, read straight from its MappedFile objects; returns them."""
    cdef MappedQueue queue = _queue_of_log(commitlog)
    files = queue.files
    if files is None:
        raise TypeError("a CommitLog's queue has no files list")
    v.n = PyList_GET_SIZE(files)
    if v.n == 0:  # nothing stored (a read-only store may not know its file size): every read misses
        v.fs, v.base, v.lo, v.hi = 1, 0, 0, 0
    else:
        v.fs = _i64(queue.file_size)
        last = files[v.n - 1]
        v.base = v.lo = (<MappedRegion?>files[0]).file_from_offset
        v.hi = (<MappedRegion?>last).file_from_offset + (<MappedRegion?>last).wrote_position
    _view_ready(v, True)
    return files


cdef int _view_ready(_View *v, bint files) except -1:
    """Finish opening v (nothing held yet)."""
    if v.fs <= 0:
        raise ValueError(f"file size {v.fs} is not positive")
    v.seg = -1
    v.files = files
    _init_view(&v.buf)
    return 0


cdef const unsigned char *_view_at(_View *v, object bufs, long long phy, Py_ssize_t *pos,
                                   Py_ssize_t *limit) except? NULL:
    """The segment holding *phy* (NULL outside [lo, hi) and the segments):
    its bytes, *phy*'s position in them and the written limit there."""
    cdef Py_ssize_t i
    cdef long long start = v.base + <long long>v.seg * v.fs
    if v.seg >= 0 and start <= phy and phy - start < v.fs and v.lo <= phy < v.hi:
        pass  # the segment held: units and offsets of one call mostly share one (no division)
    else:
        if phy < v.lo or phy >= v.hi or phy < v.base or (phy - v.base) // v.fs >= v.n:
            return NULL
        i = <Py_ssize_t>((phy - v.base) // v.fs)
        PyBuffer_Release(&v.buf)
        v.seg = -1
        PyObject_GetBuffer(_segment(bufs, i, v.files), &v.buf, PyBUF_SIMPLE)
        v.seg = i
        start = v.base + <long long>i * v.fs
    pos[0] = <Py_ssize_t>(phy - start)
    limit[0] = <Py_ssize_t>(v.fs if v.hi - start > v.fs else v.hi - start)
    return <const unsigned char *>v.buf.buf


cdef struct _Times:
    # a CommitLog view (bufs, file_size, base, lo, hi) probed without a Python call
    bint direct
    bint files  # bufs holds MappedFile objects (c_mode only)
    Py_ssize_t n
    long long fs, base, lo, hi


cdef object _probe(object time_at, object bufs, _Times *tv, int64_t phy, int32_t size):
    """time_at(phy, size): a call, or with a view the STORETIMESTAMP read here."""
    cdef Py_ssize_t i, pos
    cdef Py_buffer v
    cdef const unsigned char *b
    cdef long long t = -1
    if not tv.direct:
        return time_at(phy, size)
    if phy < tv.lo or <rmq_i128>phy + size > tv.hi or phy < tv.base:
        return -1
    i = <Py_ssize_t>((phy - tv.base) // tv.fs)
    if i >= tv.n:
        return -1
    pos = <Py_ssize_t>(phy - tv.base - <long long>i * tv.fs)
    PyObject_GetBuffer(bufs[i], &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        if pos <= v.len - 40:
            i = pos + 48 + (20 if ld32(b + pos + 36) & BORNHOST_V6_FLAG else 8)
            if i <= v.len - 8:
                t = ld64(b + i)
    finally:
        PyBuffer_Release(&v)
    return t


cdef struct _Search:
    _Times tv
    bint c_mode  # a view and an i64 timestamp: every probe and comparison in C
    int64_t ts
    Py_ssize_t seg  # the segment held in view (-1: none)
    long long seg_from  # its first physical offset
    Py_buffer view


cdef inline int64_t _probe_c(_Search *s, object bufs, int64_t phy, int32_t size) except? -2:
    """_probe's view read with the segment buffer kept across probes."""
    cdef Py_ssize_t i, pos
    cdef const unsigned char *b
    if phy < s.tv.lo or <rmq_i128>phy + size > s.tv.hi or phy < s.tv.base:
        return -1
    if s.seg >= 0 and phy >= s.seg_from and phy - s.seg_from < s.tv.fs:
        i = s.seg  # (most probes: no 64-bit division)
    else:
        i = <Py_ssize_t>((phy - s.tv.base) // s.tv.fs)
        if i >= s.tv.n:
            return -1
        PyBuffer_Release(&s.view)
        s.seg = -1
        PyObject_GetBuffer(_segment(bufs, i, s.tv.files), &s.view, PyBUF_SIMPLE)
        s.seg, s.seg_from = i, s.tv.base + <long long>i * s.tv.fs
    pos = <Py_ssize_t>(phy - s.seg_from)
    b = <const unsigned char *>s.view.buf
    if pos <= s.view.len - 40:
        i = pos + 48 + (20 if ld32(b + pos + 36) & BORNHOST_V6_FLAG else 8)
        if i <= s.view.len - 8:
            return ld64(b + i)
    return -1


cdef enum:  # how a probed time relates to the timestamp (_pure's comparisons, in order)
    T_LT = 1
    T_EQ = 2
    T_GT = 4
    T_NEG = 8  # the probe failed (time < 0)


cdef inline int _relate_c(_Search *s, const unsigned char *b, Py_ssize_t p, object bufs) except -1:
    """_relate in c_mode: small enough to be inlined in the search loop."""
    cdef int64_t t = _probe_c(s, bufs, ld64(b + p), ld32(b + p + 8))
    return (T_NEG if t < 0 else 0) | (T_LT if t < s.ts else (T_EQ if t == s.ts else T_GT))


cdef inline int _relate(_Search *s, const unsigned char *b, Py_ssize_t p, object time_at, object bufs,
                        object timestamp) except -1:
    """The relations of the time of the unit at b + p to the timestamp, as
    bits: each comparison _pure makes, made in C when c_mode (inlined; the
    object comparisons stay out of line)."""
    if s.c_mode:
        return _relate_c(s, b, p, bufs)
    return _relate_objects(s, b, p, time_at, bufs, timestamp)


cdef int _relate_objects(_Search *s, const unsigned char *b, Py_ssize_t p, object time_at, object bufs,
                         object timestamp) except -1:
    """_relate outside c_mode: the probe and comparisons as Python objects."""
    cdef int r = 0
    o = _probe(time_at, bufs, &s.tv, ld64(b + p), ld32(b + p + 8))
    if o < 0:
        r |= T_NEG
    if o < timestamp:
        r |= T_LT
    if o == timestamp:
        r |= T_EQ
    if o > timestamp:
        r |= T_GT
    return r


def cq_search_time(buf, file_start, low, range_, timestamp, bint upper, min_physical_offset, time_at):
    """Binary search of one ConsumeQueue file by store time (RocketMQ 5.1.1+
    ``binarySearchInQueueByTime``) returning a queue offset.

    *low* is the first position to consider, *range_* the readable length of
    the file in bytes; ``time_at(physical_offset, size)`` returns a record's
    store timestamp or -1. *time_at* may instead be a CommitLog view
    ``(buffers, file_size, base, lo, hi)`` (a list of the segments' buffers,
    the first one's physical offset *base*, the readable range [lo, hi)),
    which the kernel probes itself, as ``read_store_timestamp`` would, with
    no call per probe. *upper* selects BoundaryType UPPER (else LOWER).
    The caller clamps the answer to the queue's [min, max] offsets.
    """
    # timestamp and time_at's results are compared exactly as _pure does:
    # as Python objects, or in C for a view and an i64 timestamp
    cdef long long fs = _i64(file_start), min_phy
    cdef int min_ovf = 0, ts_ovf = 1
    cdef Py_ssize_t lo = _idx(low), rng = _idx(range_)
    cdef Py_buffer v
    cdef _Search s
    bufs = None
    s.tv.direct = type(time_at) is tuple
    s.tv.files = False
    if s.tv.direct:
        bufs, fsz, fbase, flo, fhi = time_at
        if not PyList_CheckExact(bufs):
            raise TypeError("a CommitLog view holds a list of buffers")
        s.tv.n = PyList_GET_SIZE(bufs)
        s.tv.fs, s.tv.base, s.tv.lo, s.tv.hi = _i64(fsz), _i64(fbase), _i64(flo), _i64(fhi)
        if s.tv.fs <= 0:
            raise ValueError(f"file size {fsz} is not positive")
        if type(timestamp) is int:
            s.ts = PyLong_AsLongLongAndOverflow(timestamp, &ts_ovf)
    s.c_mode = s.tv.direct and ts_ovf == 0
    s.seg = -1
    _init_view(&s.view)
    # a bound beyond i64 compares exactly: above all offsets (ovf > 0) or below all
    min_phy = PyLong_AsLongLongAndOverflow(min_physical_offset, &min_ovf)
    if min_ovf < 0:
        min_phy = LLONG_MIN
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        return _search_time(&s, <const unsigned char *>v.buf, v.len, fs, lo, rng, timestamp, upper,
                            min_phy, min_ovf, time_at, bufs, low)
    finally:
        PyBuffer_Release(&s.view)
        PyBuffer_Release(&v)


cdef object _search_time(_Search *s, const unsigned char *b, Py_ssize_t blen, long long fs, Py_ssize_t lo,
                         Py_ssize_t rng, object timestamp, bint upper, long long min_phy, int min_ovf,
                         object time_at, object bufs, object low):
    """cq_search_time on the units at b (blen bytes) with s set up."""
    cdef int rel
    cdef Py_ssize_t ceiling, floor, high, mid
    cdef Py_ssize_t left = -1, right = -1, target = -1, result
    cdef int64_t phy
    if rng > blen:
        rng = blen
    if rng < CQ_STORE_UNIT_SIZE:
        return jdiv(fs, 0, CQ_STORE_UNIT_SIZE)
    rng -= rng % CQ_STORE_UNIT_SIZE
    if lo > rng - CQ_STORE_UNIT_SIZE:
        return jdiv(fs, 0, CQ_STORE_UNIT_SIZE)
    if lo < 0:  # _pure would read from the buffer's end
        raise ValueError(f"low {low} is negative")
    ceiling = rng - CQ_STORE_UNIT_SIZE
    floor = lo
    high = ceiling
    if _relate(s, b, ceiling, time_at, bufs, timestamp) & T_LT:
        return jdiv(fs, ceiling + (0 if upper else CQ_STORE_UNIT_SIZE), CQ_STORE_UNIT_SIZE)
    if _relate(s, b, floor, time_at, bufs, timestamp) & T_GT:
        return 0 if upper else jdiv(fs, 0, CQ_STORE_UNIT_SIZE)
    while high >= lo:  # lo, high >= 0 here: C division floors like Python's //
        mid = (lo + high) // (2 * CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE
        phy = ld64(b + mid)
        if min_ovf > 0 or phy < min_phy:
            lo = mid + CQ_STORE_UNIT_SIZE
            left = mid
            continue
        rel = _relate(s, b, mid, time_at, bufs, timestamp)
        if rel & T_NEG:
            return 0
        if rel & T_EQ:
            target = mid
            break
        if rel & T_GT:
            high = mid - CQ_STORE_UNIT_SIZE
            right = mid
        else:
            lo = mid + CQ_STORE_UNIT_SIZE
            left = mid
    if target != -1:
        if upper:
            while target + CQ_STORE_UNIT_SIZE <= ceiling and \
                    _relate(s, b, target + CQ_STORE_UNIT_SIZE, time_at, bufs, timestamp) & T_EQ:
                target += CQ_STORE_UNIT_SIZE
        else:
            while target - CQ_STORE_UNIT_SIZE >= floor and \
                    _relate(s, b, target - CQ_STORE_UNIT_SIZE, time_at, bufs, timestamp) & T_EQ:
                target -= CQ_STORE_UNIT_SIZE
        result = target
    else:
        result = left if upper else right
    return jdiv(fs, result, CQ_STORE_UNIT_SIZE)


cdef int64_t _unit_time(_Search *s, object bufs, object mf, Py_ssize_t pos) except? -2:
    """consumequeue._unit_time: the store time of the record of the unit at
    *pos* of ConsumeQueue file *mf*, -1 past its written units."""
    cdef Py_buffer v
    cdef int64_t phy
    cdef int32_t size
    if pos < 0 or pos + CQ_STORE_UNIT_SIZE > (<MappedRegion?>mf).wrote_position:
        return -1
    PyObject_GetBuffer((<MappedRegion?>mf).mm, &v, PyBUF_SIMPLE)
    try:
        if pos + CQ_STORE_UNIT_SIZE > v.len:
            raise ValueError(f"unit at {pos} is outside a {v.len}-byte buffer")
        phy = ld64(<const unsigned char *>v.buf + pos)
        size = ld32(<const unsigned char *>v.buf + pos + 8)
    finally:
        PyBuffer_Release(&v)
    return _probe_c(s, bufs, phy, size)


def time_lookup(cq, commitlog, timestamp, bint upper, refs):
    """``cq.offset_by_time(timestamp, upper, commitlog.segment_view())`` (the
    queue offset ``get_offset_in_queue_by_time`` answers), under a reader
    reference: *refs* is the store's ``ReferenceResource`` (held here while
    reading) or None when the caller holds one.

    Returns None instead when the caller must hold a reference and call
    again with ``refs=None`` (the core's answer while clean-up holds the
    references exclusively; never here)."""
    return _time_lookup(cq, commitlog, timestamp, upper, refs)


cdef object _time_lookup(cq, commitlog, timestamp, bint upper, refs):
    if not _hold(refs):
        return None
    try:
        return _time_lookup_in(cq, commitlog, timestamp, upper)
    finally:
        _drop(refs)


cdef object _time_lookup_in(cq, commitlog, timestamp, bint upper):
    # ConsumeQueue.offset_by_time(timestamp, upper, commitlog.segment_view())
    # in one call (under a reference): the file choice, the search and the clamp
    cdef int ovf = 1
    cdef Py_ssize_t n, i, fsz, low, wrote
    cdef long long mn, mx, res, start
    cdef Py_buffer v
    cdef _Search s
    cdef _View cl
    if type(timestamp) is int:
        s.ts = PyLong_AsLongLongAndOverflow(timestamp, &ovf)
    if ovf:  # compared as Python objects: the twin's path
        return cq.offset_by_time(timestamp, upper, commitlog.segment_view())
    queue = _queue_of_cq(cq)
    files = queue.files
    if files is None:
        raise TypeError("a ConsumeQueue's queue has no files list")
    n = PyList_GET_SIZE(files)
    if n == 0:
        return 0
    fsz = _idx(queue.file_size)
    mn = jdiv((<ConsumeQueueBase>cq).min_logic_offset, 0, CQ_STORE_UNIT_SIZE)
    last = files[n - 1]
    mx = jdiv((<MappedRegion?>last).file_from_offset, (<MappedRegion?>last).wrote_position, CQ_STORE_UNIT_SIZE)
    # the CommitLog as segment_view() gives it, probed in C
    bufs = _view_of(&cl, commitlog)
    s.tv.direct = s.tv.files = s.c_mode = True
    s.tv.n, s.tv.fs, s.tv.base, s.tv.lo, s.tv.hi = cl.n, cl.fs, cl.base, cl.lo, cl.hi
    s.seg = -1
    _init_view(&s.view)
    _init_view(&v)
    try:
        mf = None  # ConsumeQueue._file_by_time
        if upper:
            for i in range(n - 1, -1, -1):
                res = _unit_time(&s, bufs, files[i], 0)
                if 0 <= res <= s.ts:
                    mf = files[i]
                    break
        else:
            mf = last
            for i in range(n - 1):
                if _unit_time(&s, bufs, files[i], fsz - CQ_STORE_UNIT_SIZE) >= s.ts:
                    mf = files[i]
                    break
        if mf is None:
            res = 0
        else:
            start = (<MappedRegion?>mf).file_from_offset
            wrote = (<MappedRegion?>mf).wrote_position
            if wrote <= 0:
                res = jdiv(start, 0, CQ_STORE_UNIT_SIZE)
            else:
                # as Python ints: min_logic_offset may lag far behind
                low = _idx(<object>(<ConsumeQueueBase>cq).min_logic_offset - start)
                PyObject_GetBuffer((<MappedRegion?>mf).mm, &v, PyBUF_SIMPLE)
                res = _search_time(&s, <const unsigned char *>v.buf, v.len, start, low if low > 0 else 0,
                                   wrote if wrote < fsz else fsz, timestamp, upper, cl.lo, 0, None, bufs, low)
    finally:
        PyBuffer_Release(&s.view)
        PyBuffer_Release(&v)
    res = mn if res < mn else res
    return mx if res > mx else res  # min(max(res, mn), mx): mx wins when mn > mx
