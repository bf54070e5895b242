# The pull path: ConsumeQueue units to records, keyed and single reads,
# pull statuses and bounds, views and messages, the tag filter.


# --- the pull path ----------------------------------------------------------

cdef int _ext_type(object message_type) except -1:
    """Check a read's *message_type*: the core's MessageExt (its fields set
    directly) or any class made as ``message_type(fields)`` (the twin's)."""
    if message_type is not MessageExt and not isinstance(message_type, type):
        raise TypeError("message_type must be a class")
    return 0


@cython.final
cdef class _Repeats:
    """One read call's fields that records repeat (hosts, record size, magic
    code, store and born timestamps), each kept as one Python object while
    its value repeats: fewer objects made, and freed, per message."""
    cdef object born, store, size_o, magic_o, ts_o
    cdef long long size, magic, ts


cdef object _ext_at(object message_type, const unsigned char *b, Py_ssize_t p0, object topic, _Repeats r):
    """A *message_type* (see _ext_type) for the valid
    record at b + p0 whose topic is *topic*, its repeated fields from *r*."""
    cdef int32_t sys_flag = ld32(b + p0 + 36), body_len, props_len
    cdef int bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    cdef int sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    cdef const unsigned char *h = b + p0 + 48 + bw
    cdef const unsigned char *u
    cdef long long v
    cdef MessageExt m
    body_len = ld32(h + 20 + sw)
    u = h + 24 + sw + body_len
    u += (1 + u[0]) if ld32(b + p0 + 4) == MESSAGE_MAGIC_CODE else (2 + ld16(u))
    props_len = ld16(u)
    if r.born is None or PyBytes_GET_SIZE(r.born) != bw or memcmp(PyBytes_AS_STRING(r.born), b + p0 + 48, bw) != 0:
        r.born = PyBytes_FromStringAndSize(<const char *>b + p0 + 48, bw)
    if r.store is None or PyBytes_GET_SIZE(r.store) != sw or memcmp(PyBytes_AS_STRING(r.store), h + 8, sw) != 0:
        r.store = PyBytes_FromStringAndSize(<const char *>h + 8, sw)
    v = ld32(b + p0)
    if r.size_o is None or r.size != v:
        r.size_o, r.size = v, v
    v = ld32(b + p0 + 4)
    if r.magic_o is None or r.magic != v:
        r.magic_o, r.magic = v, v
    v = ld64(h)
    if r.ts_o is None or r.ts != v:
        r.ts_o, r.ts = v, v
    v = ld64(b + p0 + 40)
    born_ts = r.ts_o if v == r.ts else v  # (born = store time, unless the producer set it)
    body = PyBytes_FromStringAndSize(<const char *>h + 24 + sw, body_len)
    blob = PyBytes_FromStringAndSize(<const char *>u + 2, props_len)
    if message_type is not MessageExt:
        return message_type((r.size_o, r.magic_o, ld32(b + p0 + 8), ld32(b + p0 + 12), ld32(b + p0 + 16),
                             ld64(b + p0 + 20), ld64(b + p0 + 28), sys_flag, born_ts, r.born, r.ts_o, r.store,
                             ld32(h + 8 + sw), ld64(h + 12 + sw), body, topic, blob))
    m = MessageExt.__new__(MessageExt)
    m.store_size, m.magic_code, m.body_crc = r.size_o, r.magic_o, ld32(b + p0 + 8)
    m.queue_id, m.flag, m.queue_offset = ld32(b + p0 + 12), ld32(b + p0 + 16), ld64(b + p0 + 20)
    m.physical_offset, m.sys_flag, m.born_timestamp, m._born_host = ld64(b + p0 + 28), sys_flag, born_ts, r.born
    m.store_timestamp, m._store_host, m.reconsume_times = r.ts_o, r.store, ld32(h + 8 + sw)
    m.prepared_transaction_offset, m.body, m.topic, m.properties_blob = ld64(h + 12 + sw), body, topic, blob
    return m


cdef inline const unsigned char *_topic_at(const unsigned char *b, Py_ssize_t p0, Py_ssize_t *n) noexcept:
    """The topic bytes of the valid record at b + p0, their length in n."""
    cdef int32_t sys_flag = ld32(b + p0 + 36)
    cdef Py_ssize_t p = p0 + 68 + (20 if sys_flag & BORNHOST_V6_FLAG else 8) + \
        (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8)
    p += 4 + ld32(b + p)
    if ld32(b + p0 + 4) == MESSAGE_MAGIC_CODE:
        n[0] = b[p]
        return b + p + 1
    n[0] = ld16(b + p)
    return b + p + 2


cdef bint _topic_is(const unsigned char *b, Py_ssize_t p0, const char *tb, Py_ssize_t tl) noexcept:
    """Whether the valid record at b + p0 stores topic *tb* (UTF-8)."""
    cdef Py_ssize_t n
    cdef const unsigned char *t = _topic_at(b, p0, &n)
    return n == tl and memcmp(t, tb, tl) == 0


cdef const unsigned char *_props_of(const unsigned char *b, Py_ssize_t p0, Py_ssize_t *n) noexcept:
    """The properties of the valid record at b + p0 (they follow its topic), their length in n."""
    cdef Py_ssize_t tl
    cdef const unsigned char *p = _topic_at(b, p0, &tl) + tl
    n[0] = ld16(p)
    return p + 2


cdef bint _has_key(const unsigned char *props, Py_ssize_t n, const char *kb, Py_ssize_t kl) noexcept:
    """UNIQ_KEY == key, or key one of the space-separated KEYS (an absent
    KEYS splits to one empty key), on RocketMQ's property parsing: the last
    entry of each name is its value, found in one pass (as _tags_in)."""
    cdef Py_ssize_t s = 0, e
    cdef _Pair pr, uniq, keys
    cdef bint has_uniq = False, has_keys = False
    cdef const unsigned char *v
    while s <= n:
        if _entry(props, n, &s, &pr):
            if _is_name(props, &pr, "UNIQ_KEY", 8):
                uniq, has_uniq = pr, True
            elif _is_name(props, &pr, "KEYS", 4):
                keys, has_keys = pr, True
    if has_uniq and uniq.vn == kl and memcmp(props + uniq.v, kb, kl) == 0:
        return True
    if not has_keys:
        return kl == 0
    v = props + keys.v
    s = 0
    while s <= keys.vn:
        e = s
        while e < keys.vn and v[e] != 32:
            e += 1
        if e - s == kl and memcmp(v + s, kb, kl) == 0:
            return True
        s = e + 1
    return False


cdef const unsigned char *_unit_record(_View *v, object bufs, long long phy, int32_t size, long long queue_offset,
                                       int32_t queue_id, const char *tb, Py_ssize_t tl, Py_ssize_t max_size,
                                       Py_ssize_t *p0) except? NULL:
    """The record a ConsumeQueue unit stands for (docs/recovery.md#pitfall-stored-offsets-trusted), read through v: its
    segment's bytes (the record at *p0*) when a valid record (body CRC
    included) of *size* bytes starts at *phy* with that queue offset, queue
    id and stored topic; NULL otherwise (_pure._unit_record)."""
    cdef Py_ssize_t limit
    cdef const unsigned char *b = _view_at(v, bufs, phy, p0, &limit)
    cdef int rc
    if b == NULL:
        return NULL
    rc = _check(b, v.buf.len, p0[0], limit, True, 0, max_size)
    if rc <= 0 or rc != size or ld64(b + p0[0] + 28) != phy or ld64(b + p0[0] + 20) != queue_offset or \
            ld32(b + p0[0] + 12) != queue_id or not _topic_is(b, p0[0], tb, tl):
        return NULL
    return b


def pull_units(cq_buf, start, end, view, topic, queue_id, queue_offset, max_count, min_physical_offset, max_size,
               message_type, list out):
    """A pull's inner loop (RocketMQ ``getMessage`` without a filter) over the
    ConsumeQueue units in ``cq_buf[start:end]`` (whole units), the first at
    *queue_offset*, reading records through the CommitLog *view*
    (``CommitLog.segment_view()``): a pre-blank placeholder is skipped, a
    unit whose record starts below *min_physical_offset* (cleaned up) is
    skipped and noted, and every other record, checked to be the unit's
    (valid up to *max_size* bytes with its body CRC, its size, physical offset, queue offset,
    queue id and topic), is appended to *out* as ``message_type(fields)``
    (*message_type*: MessageExt, or a class with its ``__slots__`` and a
    constructor that only stores the fields in them; the core fills the
    slots without calling it), the topic field being *topic* itself, until
    *out* holds *max_count*.

    Returns ``(units_done, last_event, stopped)``: *last_event* is 2 when the
    last unit that found or missed a record found one, 1 when it was
    cleaned up, 0 for none; *stopped* means the unit after the ones done
    needs the caller's careful path (no valid record where it points, or not
    its record: the caller raises), nothing having been appended for it.
    """
    cdef Py_ssize_t s = _idx(start), e = _idx(end), mx = _idx(max_count), msize = _idx(max_size)
    cdef Py_ssize_t k, p, p0, tl
    cdef long long q0 = _i64(queue_offset), cl_min = _i64(min_physical_offset)
    cdef long long phy, tags, done = 0
    cdef int32_t size, qid = _i32(queue_id)
    cdef int status = -1
    cdef bint stopped = False
    cdef const unsigned char *u
    cdef const unsigned char *b
    cdef const char *tb
    cdef Py_buffer cv
    cdef _View v
    _ext_type(message_type)
    if not isinstance(topic, str):
        raise TypeError("topic must be a str")
    tb = PyUnicode_AsUTF8AndSize(topic, &tl)
    bufs = _view_open(&v, view)
    repeats = _Repeats.__new__(_Repeats)
    _init_view(&cv)
    PyObject_GetBuffer(cq_buf, &cv, PyBUF_SIMPLE)
    try:
        if s < 0 or e > cv.len or s > e or (e - s) % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"units [{start}, {end}) are not whole units of a {cv.len}-byte buffer")
        for k in range((e - s) // CQ_STORE_UNIT_SIZE):  # a C loop (an enum step would make a Python range)
            p = s + k * CQ_STORE_UNIT_SIZE
            if PyList_GET_SIZE(out) >= mx:
                break
            u = <const unsigned char *>cv.buf + p
            phy = ld64(u)
            size = ld32(u + 8)
            tags = ld64(u + 12)
            if size == PRE_BLANK_SIZE and phy == 0 and tags == 0:
                done += 1  # a pre-blank placeholder
                continue
            if phy < cl_min:  # its record was cleaned up
                if PyList_GET_SIZE(out) == 0:
                    status = _MESSAGE_WAS_REMOVING
                done += 1
                continue
            b = _unit_record(&v, bufs, phy, size, q0 + done, qid, tb, tl, msize, &p0)
            if b == NULL:  # not a record it can vouch for: the caller's careful path
                stopped = True
                break
            PyList_Append(out, _ext_at(message_type, b, p0, topic, repeats))
            status = _FOUND
            done += 1
    finally:
        PyBuffer_Release(&v.buf)
        PyBuffer_Release(&cv)
    return done, (None if status < 0 else _status(status)), stopped


def read_keyed(view, offsets, topic, key, max_size, message_type, list out):
    """``query_messages``' reads (fixes RocketMQ #3613 hash collisions,
    ): each physical offset of *offsets* once, in order, skipping
    those below the *view*'s minimum (cleaned up) or where no valid record
    of at most *max_size* bytes starts; a record whose topic is *topic* and
    whose UNIQ_KEY is *key* or one of whose space-separated KEYS is *key*
    (properties as ``parse_properties`` reads them, an absent KEYS counting
    as one empty key) is appended to *out* as ``message_type(fields)`` (see
    ``pull_units``). Returns None."""
    cdef Py_ssize_t i, n, msize = _idx(max_size)
    cdef _View v
    cdef _Col offs
    _ext_type(message_type)
    if not isinstance(topic, str) or not isinstance(key, str):
        raise TypeError("topic and key must be str")
    if not PyList_CheckExact(offsets):
        raise TypeError("offsets must be a list of int")
    bufs = _view_open(&v, view)
    memset(&offs, 0, sizeof(offs))
    try:
        n = PyList_GET_SIZE(offsets)
        for i in range(n):
            _put64(&offs, _i64(offsets[i]))
        _read_keyed(&v, bufs, <int64_t *>offs.p, n, topic, key, msize, message_type, out)
    finally:
        free(offs.p)
        PyBuffer_Release(&v.buf)
    return None


cdef struct _Keyed:
    # what a keyed read keeps: records of topic *tb* carrying key *kb* (UTF-8),
    # at most *msize* bytes, stored at a time in [lo, hi] when *timed*
    const char *tb
    const char *kb
    Py_ssize_t tl, kl, msize
    rmq_i128 lo, hi
    bint timed
    bint text  # U+FFFD in the topic or key: compare decoded text (see _keyed_of)


cdef int _keyed_of(_Keyed *q, object topic, object key, Py_ssize_t msize) except -1:
    """*q* for *topic* and *key* (str), not timed: 1, or 0 when no stored
    record can match (a lone surrogate, which no decoded text holds)."""
    try:
        q.tb = PyUnicode_AsUTF8AndSize(topic, &q.tl)
        q.kb = PyUnicode_AsUTF8AndSize(key, &q.kl)
    except UnicodeEncodeError:
        return 0
    q.msize, q.timed = msize, False
    # U+FFFD in the topic or key can equal an invalid UTF-8 byte read back
    # (decoded with "replace"): then compare as text, as the twin does
    q.text = not (PyUnicode_IS_ASCII(topic) and PyUnicode_IS_ASCII(key)) and ("\ufffd" in topic or "\ufffd" in key)
    return 1


cdef int _keyed_record(_View *v, object bufs, long long phy, _Keyed *q, object topic, object key,
                       object message_type, list out, _Repeats repeats) except -1:
    """Append the record at *phy* to *out* when it is kept by *q* (and still
    stored, and valid): 1 if appended, else 0 (_pure._keyed_record)."""
    cdef Py_ssize_t p0, limit, pn
    cdef const unsigned char *b
    cdef const unsigned char *props
    cdef rmq_i128 ts
    if phy < v.lo:
        return 0  # cleaned up: gone
    b = _view_at(v, bufs, phy, &p0, &limit)
    if b == NULL or _check(b, v.buf.len, p0, limit, True, 0, q.msize) <= 0 or ld64(b + p0 + 28) != phy:
        return 0
    if q.timed:
        ts = ld64(b + p0 + 48 + (20 if ld32(b + p0 + 36) & BORNHOST_V6_FLAG else 8))
        if ts < q.lo or ts > q.hi:
            return 0
    if q.text:
        fields = decode_record(_segment(bufs, v.seg, v.files), p0, False)
        if fields[15] != topic:
            return 0
        found = parse_properties(fields[16])
        if found.get("UNIQ_KEY") != key and key not in (found.get("KEYS") or "").split(" "):
            return 0
        PyList_Append(out, _ext_at(message_type, b, p0, fields[15], repeats))
        return 1
    props = _props_of(b, p0, &pn)
    if not (_topic_is(b, p0, q.tb, q.tl) and _has_key(props, pn, q.kb, q.kl)):
        return 0
    PyList_Append(out, _ext_at(message_type, b, p0, topic, repeats))
    return 1


cdef int _read_keyed(_View *v, object bufs, const int64_t *offsets, Py_ssize_t n, object topic, object key,
                     Py_ssize_t msize, object message_type, list out) except -1:
    """read_keyed over *n* offsets with v open (_ext_type checked, topic and
    key str); v's held segment is the caller's to release."""
    cdef Py_ssize_t i, j
    cdef long long phy
    cdef _Keyed q
    cdef _Repeats repeats
    if not _keyed_of(&q, topic, key, msize):
        return 0
    repeats = _Repeats.__new__(_Repeats)
    for i in range(n):
        phy = offsets[i]
        for j in range(i):
            if offsets[j] == phy:
                break
        else:
            _keyed_record(v, bufs, phy, &q, topic, key, message_type, out, repeats)  # each record once
    return 0


def query_keyed(index, commitlog, topic, key, max_num, begin, end, message_type, list out, refs):
    """``query_messages`` in one call (docs/recovery.md#lookups-by-key):
    appends to *out* the first *max_num* records, in the order the index
    chains of ``topic#key`` are walked (newest file first, newest entry
    first), that are still stored, valid (at most
    ``commitlog.max_record_size`` bytes, read through
    ``commitlog.segment_view()``), of topic *topic*, carry *key* (as
    :func:`read_keyed` reads them) and were stored at a time in [*begin*,
    *end*]; each record once. The walk is ``index.query_offsets``' without
    its cap (collisions and duplicates take no room) and with the window
    widened to [*begin* - 999, *end*] (the index keeps whole seconds).
    *refs* as in :func:`time_lookup`. Returns *out*, or None (nothing read)
    when the caller must hold a reference and call again with
    ``refs=None``. Raises TypeError unless *topic* and *key* are str."""
    return _query_keyed(index, commitlog, topic, key, max_num, begin, end, message_type, out, refs)


cdef object _query_keyed(index, commitlog, topic, key, max_num, begin, end, message_type, list out, refs):
    return _query_keyed_held(index, commitlog, topic, key, max_num, _wide(begin), _wide(end), message_type, out, refs)


cdef object _query_keyed_held(index, commitlog, topic, key, max_num, rmq_i128 lo, rmq_i128 hi, message_type,
                              list out, refs):
    if not _hold(refs):
        return None
    try:
        return _query_keyed_in(index, commitlog, topic, key, max_num, lo, hi, message_type, out)
    finally:
        _drop(refs)


cdef object _query_keyed_in(index, commitlog, topic, key, max_num, rmq_i128 lo, rmq_i128 hi, message_type,
                            list out):
    # the chains of topic#key read as they are walked, so that no batch of
    # offsets caps the answer and nothing is read past the max_num-th match
    cdef Py_ssize_t i, j, n, hsn = 0, idx = 0, left
    cdef int32_t key_hash
    cdef int64_t fb, fe, phy, last = -1
    cdef long long least = LLONG_MAX  # the least offset kept: the walk mostly meets offsets descending
    cdef rmq_i128 wlo
    cdef bint newer_began_before = False
    cdef IndexRegion f
    cdef Py_buffer iv
    cdef _View v
    cdef _Chain c
    cdef _Keyed q
    cdef _Col kept  # the offsets kept, in order
    cdef char kept_buf[512]
    cdef set seen = None  # the same as a set, once they are many and out of order
    cdef _Repeats repeats
    _ext_type(message_type)
    if not isinstance(topic, str) or not isinstance(key, str):
        raise TypeError("topic and key must be str")
    left = _idx(max_num)
    files = (<IndexServiceBase?>index).files
    if files is None:
        raise TypeError("an index without a files list")
    if left <= 0 or not _keyed_of(&q, topic, key, 0):
        return out
    q.timed, q.lo, q.hi = True, lo, hi
    # an entry is timed in whole seconds, up to 999 ms before its record's
    # store time (docs/recovery.md#pitfall-index-time-resolution); clamped,
    # as every time the index holds is a long
    wlo = lo - 999 if lo > <rmq_i128>LLONG_MIN + 999 else <rmq_i128>LLONG_MIN
    key_hash = _abs_hash(_java_hash_from(_hash_char(_java_hash_from(0, topic), 35), key))  # of topic#key
    repeats = _Repeats.__new__(_Repeats)
    bufs = None  # the CommitLog view, opened at the first candidate
    _on_stack(&kept, kept_buf, sizeof(kept_buf))
    _init_view(&iv)
    try:
        n = PyList_GET_SIZE(files)
        for i in range(n - 1, -1, -1):
            f = files[i]
            PyObject_GetBuffer(f.mm, &iv, PyBUF_SIMPLE)
            _check_index(&iv, f.hash_slot_num, f.index_num, &hsn, &idx)
            fb = ld64(<const unsigned char *>iv.buf)
            fe = ld64(<const unsigned char *>iv.buf + 8)
            # IndexFile.isTimeMatched, then the chain
            if (wlo < fb and hi > fe) or (fb <= wlo <= fe) or (fb <= hi <= fe):
                _chain_start(&c, <const unsigned char *>iv.buf, hsn, idx, key_hash, True)
                while _chain_next(&c, wlo, hi, &phy):
                    if phy == last:
                        continue  # (one record's keys, and re-indexed records, repeat in a row)
                    last = phy
                    if phy >= least:  # each record once
                        if seen is None and kept.n > 32 * 8:  # (many, out of order: a set keeps it linear)
                            seen = {(<const int64_t *>kept.p)[j] for j in range(kept.n // 8)}
                        if (phy in seen) if seen is not None else _in_col64(&kept, phy):
                            continue
                    if bufs is None:
                        bufs = _view_of(&v, commitlog)
                        q.msize = _max_record(commitlog)
                    if _keyed_record(&v, bufs, phy, &q, topic, key, message_type, out, repeats):
                        _put64(&kept, phy)
                        if seen is not None:
                            seen.add(phy)
                        if phy < least:
                            least = phy
                        left -= 1
                        if left == 0:
                            return out
            PyBuffer_Release(&iv)
            # RocketMQ stops at the first file that began before the window; here the next
            # older one must also have ended before it (a lying header hides no other file's keys)
            if newer_began_before and fe < wlo:
                break
            newer_began_before = fb < wlo
    finally:
        PyBuffer_Release(&iv)
        if bufs is not None:
            PyBuffer_Release(&v.buf)
        _free(&kept)
    return out


cdef inline bint _in_col64(const _Col *c, int64_t v) noexcept:
    """Whether *v* is one of the int64 in *c*, newest first (a repeat is mostly recent)."""
    cdef const int64_t *p = <const int64_t *>c.p
    cdef Py_ssize_t i
    for i in range(c.n // 8 - 1, -1, -1):
        if p[i] == v:
            return True
    return False


def read_ext(commitlog, physical_offset, message_type, list out not None, refs):
    """``get_message`` in one call: the valid record (body CRC checked, at
    most ``commitlog.max_record_size`` bytes) that starts at CommitLog
    physical offset *physical_offset*, read through
    ``commitlog.segment_view()`` and appended to *out* as
    ``message_type(fields)`` (see ``pull_units``); nothing is appended below
    the minimum offset, past the end (any int, past int64 too) or where no
    valid record starts. *refs* as in :func:`time_lookup`. Returns *out*,
    or None (nothing read) when the caller must hold a reference and call
    again with ``refs=None``. Raises TypeError unless *physical_offset* is
    an int (``__index__``; a bool is not)."""
    cdef _View v
    cdef Py_ssize_t p0, limit, tl
    cdef const unsigned char *b
    cdef const unsigned char *t
    cdef rmq_i128 phy
    if PyBool_Check(physical_offset):
        raise TypeError("physical_offset must be an int, not a bool")
    phy = _wide(physical_offset)
    _ext_type(message_type)
    if not _hold(refs):
        return None
    try:
        bufs = _view_of(&v, commitlog)
        if phy < v.lo or phy >= v.hi:
            return out
        try:
            b = _view_at(&v, bufs, <long long>phy, &p0, &limit)
            if b != NULL and _check(b, v.buf.len, p0, limit, True, 0,
                                    _max_record(commitlog)) > 0 \
                    and ld64(b + p0 + 28) == phy:
                t = _topic_at(b, p0, &tl)
                PyList_Append(out, _ext_at(message_type, b, p0, PyUnicode_DecodeUTF8(<const char *>t, tl, "replace"),
                                           _Repeats.__new__(_Repeats)))
        finally:
            PyBuffer_Release(&v.buf)
    finally:
        _drop(refs)
    return out


cdef packed struct _ViewUnit:  # _pure.VIEW_UNIT ("=qqqqqii"), native byte order
    int64_t queue_offset, physical_offset, store_timestamp, tags_code, body_offset
    int32_t body_length, store_size


# --- pull statuses ------------------------------------------------------------
# A pull answers a GetMessageStatus member (an IntEnum valued by RocketMQ's
# ordinal), taken from this tuple by its value: no lookup by name per pull.
cdef tuple _GMS = tuple(GetMessageStatus)
if [int(m) for m in _GMS] != list(range(len(_GMS))):
    raise ImportError("GetMessageStatus must be valued 0, 1, ... in declaration order")
cdef int _FOUND = GetMessageStatus.FOUND
cdef int _NO_MATCHED_MESSAGE = GetMessageStatus.NO_MATCHED_MESSAGE
cdef int _MESSAGE_WAS_REMOVING = GetMessageStatus.MESSAGE_WAS_REMOVING
cdef int _OFFSET_OVERFLOW_BADLY = GetMessageStatus.OFFSET_OVERFLOW_BADLY
cdef int _OFFSET_OVERFLOW_ONE = GetMessageStatus.OFFSET_OVERFLOW_ONE
cdef int _OFFSET_TOO_SMALL = GetMessageStatus.OFFSET_TOO_SMALL
cdef int _NO_MATCHED_LOGIC_QUEUE = GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
cdef int _NO_MESSAGE_IN_QUEUE = GetMessageStatus.NO_MESSAGE_IN_QUEUE


cdef inline object _status(int code):
    """The GetMessageStatus member of value *code* (a valid one)."""
    return <object>PyTuple_GET_ITEM(_GMS, code)


cdef inline int _bounds(long long q, long long mn, long long mx, long long *nxt) noexcept:
    """The status ladder of a pull before any unit is read (_pure._bounds):
    the status of queue offset *q* in a queue of min offset *mn* and max
    offset *mx*, *nxt* its next_begin_offset; -1 (*nxt* = *q*) when *q* is
    a unit to read."""
    nxt[0] = q
    if mx == 0:
        nxt[0] = 0
        return _NO_MESSAGE_IN_QUEUE
    if q < mn:
        nxt[0] = mn
        return _OFFSET_TOO_SMALL
    if q == mx:
        return _OFFSET_OVERFLOW_ONE
    if q > mx:
        nxt[0] = mx
        return _OFFSET_OVERFLOW_BADLY
    return -1


def pull_bounds(cq, queue_offset):
    """``(status, next_begin_offset, min_offset, max_offset)`` where a pull
    of *cq* (None: no such queue) from *queue_offset* ends before reading a
    unit; status None when it reads units (see _pure.pull_bounds)."""
    cdef long long nxt, mn, mx
    cdef rmq_i128 wq = _wide(queue_offset)
    cdef long long q = LLONG_MAX if wq > LLONG_MAX else (LLONG_MIN if wq < LLONG_MIN else <long long>wq)
    cdef int code
    if cq is None:
        return _status(_NO_MATCHED_LOGIC_QUEUE), 0, 0, 0
    mn, mx = _i64(cq.min_offset_in_queue()), _i64(cq.max_offset_in_queue())
    code = _bounds(q, mn, mx, &nxt)
    if code < 0:
        return None, queue_offset, mn, mx
    return _status(code), nxt, mn, mx


def pull_views(cq, commitlog, queue_offset, max_count, max_units, refs):
    """``get_messages`` without a filter, zero-copy (``get_message_views``):
    the messages of ConsumeQueue *cq* from *queue_offset* as positions in one
    CommitLog segment instead of copies. *refs* as in :func:`time_lookup`.

    The statuses and offsets are ``_pull_held``'s (RocketMQ ``getMessage``):
    placeholders and cleaned-up units are skipped, at most *max_count*
    messages, units read a ConsumeQueue file at a time until *max_units*
    have been visited; every record is checked to be its unit's (as
    :func:`pull_units`). The pull also ends before the first record in
    another segment than the first one found (the next pull starts there).

    Returns None (the caller must hold a reference and call again with
    ``refs=None``), or ``(status, next_queue_offset, min_offset, max_offset,
    segment, units)``: *status* a ``GetMessageStatus`` name, or ``"STOPPED"``
    when the first unit to read needs the caller's careful path (nothing
    found before it); *segment* the ``mmap`` of the segment holding the
    records (None when none); *units* ``VIEW_UNIT`` entries, one per message.
    A caller that exports *segment* (a memoryview) does so while it still
    holds its reader reference (so with ``refs=None``, under its own hold):
    an exported mapping is one the store's ``close()`` cannot unmap.
    """
    if not _hold(refs):
        return None
    try:
        return _pull_queue(cq, commitlog, queue_offset, max_count, max_units, None, None, None)
    finally:
        _drop(refs)


def pull_messages(cq, commitlog, queue_offset, max_count, max_units, message_type, list out not None, tags, refs):
    """``get_messages`` in one call: :func:`pull_views`' statuses, offsets
    and checks, with the messages made as *message_type* (``MessageExt``)
    and appended to *out*, across CommitLog segments.

    *tags*: None for every message, else a tag filter ``(codes, names)``
    (a set of tags codes, a set of tag names; ``store._tag_filter``'s): a
    unit is read only when its tags code is one of *codes* (RocketMQ's
    ConsumeQueue filter), and its message kept only when its ``tags`` is
    one of *names* (the client's check, fixing hash collisions); a
    ConsumeQueue file's units are then read *max_count* at a time, as the
    store's careful path reads them. The core answers ``"STOPPED"`` for a
    filter that is not sets of exact ints and strs.

    Returns None (as :func:`pull_views`), or ``(status, next_queue_offset,
    min_offset, max_offset)``; *status* is ``"STOPPED"`` at any unit the
    caller's careful path must read (what *out* got is then to be dropped:
    that path reads the pull again and raises)."""
    return _pull_messages(cq, commitlog, queue_offset, max_count, max_units, message_type, out, tags, refs)


cdef object _pull_messages(cq, commitlog, queue_offset, max_count, max_units, message_type, list out, tags, refs):
    _ext_type(message_type)
    if not _hold(refs):
        return None
    try:
        return _pull_queue(cq, commitlog, queue_offset, max_count, max_units, message_type, out, tags)[:4]
    finally:
        _drop(refs)


cdef struct _TagFilter:
    long long *codes  # malloc'd
    Py_ssize_t ncodes  # -1: no filter
    const char **names  # malloc'd: the names' UTF-8 (kept by the names set's strs)
    Py_ssize_t *lens
    Py_ssize_t nnames
    bint text  # a name holds U+FFFD: compare decoded TAGS (an invalid byte reads as U+FFFD)


cdef int _tag_filter_of(object tags, _TagFilter *f) except -1:
    """*f* from a pull's filter ``(codes, names)``: 1, or 0 when the filter
    is not what the core vouches for (sets of exact ints within int64 and
    of exact strs: no Python code may run while no reader reference is
    held). *f* starts zeroed; its arrays are the caller's to free."""
    cdef int ovf = 0
    cdef Py_ssize_t n
    cdef const char *u
    if type(tags) is not tuple or len(tags) != 2:
        return 0
    code_set, names = tags
    if not PyAnySet_CheckExact(code_set) or not PyAnySet_CheckExact(names):
        return 0
    f.codes = <long long *>malloc(sizeof(long long) * (len(code_set) + 1))
    f.names = <const char **>malloc(sizeof(const char *) * (len(names) + 1))
    f.lens = <Py_ssize_t *>malloc(sizeof(Py_ssize_t) * (len(names) + 1))
    if f.codes == NULL or f.names == NULL or f.lens == NULL:
        raise MemoryError()
    for c in code_set:
        if not PyLong_CheckExact(c):
            return 0
        f.codes[f.ncodes] = PyLong_AsLongLongAndOverflow(c, &ovf)
        if ovf:
            return 0
        f.ncodes += 1
    for name in names:
        if not PyUnicode_CheckExact(name):
            return 0
        if "\ufffd" in <str>name:
            f.text = True
        try:
            u = PyUnicode_AsUTF8AndSize(name, &n)
        except UnicodeEncodeError:
            continue  # lone surrogates: no decoded TAGS equals it
        f.names[f.nnames], f.lens[f.nnames] = u, n
        f.nnames += 1
    return 1


cdef inline bint _code_in(const long long *codes, Py_ssize_t n, long long code) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if codes[i] == code:
            return True
    return False


cdef bint _tags_in(const unsigned char *b, Py_ssize_t p0, _TagFilter *f, object names) except -1:
    """Whether the TAGS of the valid record at b + p0, as MessageExt.tags
    reads it (parse_properties: the last entry named TAGS with a value,
    decoded with "replace"), is one of the filter's *names* (a set of exact
    strs). Without U+FFFD in a name the raw bytes decide: valid UTF-8
    equals a name's UTF-8 exactly when its text equals the name, and
    invalid UTF-8 decodes to a U+FFFD no name holds."""
    cdef Py_ssize_t n, s = 0, i, v = -1, vn = 0
    cdef const unsigned char *props = _props_of(b, p0, &n)
    cdef _Pair pr
    while s <= n:  # (the last entry named TAGS counts, as a later duplicate does in _pairs)
        if _entry(props, n, &s, &pr) and _is_name(props, &pr, "TAGS", 4):
            v, vn = pr.v, pr.vn
    if v < 0:
        return False  # no TAGS: None is no name
    if f.text:
        return PySet_Contains(names, PyUnicode_DecodeUTF8(<const char *>props + v, vn, "replace")) == 1
    for i in range(f.nnames):
        if f.lens[i] == vn and memcmp(f.names[i], props + v, vn) == 0:
            return True
    return False


cdef tuple _pull_queue(cq, commitlog, queue_offset, max_count, max_units, object message_type, list out,
                       object tag_filter):
    """pull_views (*message_type* None: packed units of one segment) or
    pull_messages (*message_type* objects appended to *out*, across
    segments; status None (stopped) at any unit the careful path must read), the latter
    with *tag_filter* None or ``(codes, names)`` (store._tag_filter's:
    kept are units whose tags code is in *codes* and then records whose
    TAGS is in *names*; a ConsumeQueue file's units are then read
    *max_count* at a time, as the careful path does)."""
    cdef _TagFilter f
    memset(&f, 0, sizeof(f))
    f.ncodes = -1
    names = None
    try:
        if tag_filter is not None:
            f.ncodes = 0
            if not _tag_filter_of(tag_filter, &f):
                return None, 0, 0, 0, None, b""  # stopped
            names = tag_filter[1]
        return _pull_units_of(cq, commitlog, queue_offset, max_count, max_units, message_type, out, &f, names)
    finally:
        free(f.codes)
        free(f.names)
        free(f.lens)


cdef tuple _pull_units_of(cq, commitlog, queue_offset, max_count, max_units, object message_type, list out,
                          _TagFilter *f, object names):
    """_pull_queue with its filter ready (*f.ncodes* -1: none)."""
    cdef bint views = message_type is None
    cdef _Repeats repeats = None if views else _Repeats.__new__(_Repeats)
    cdef rmq_i128 wq = _wide(queue_offset)
    cdef long long mn, mx, off, cq_fs, first, phy, tags
    # saturated: an offset past int64 is past the queue's end (or before its start) all the same
    cdef long long q = LLONG_MAX if wq > LLONG_MAX else (LLONG_MIN if wq < LLONG_MIN else <long long>wq)
    cdef Py_ssize_t mc = _idx(max_count), mu = _idx(max_units), n = 0, visited = 0, nfiles, fi, pos, end, k
    cdef Py_ssize_t p0, tl, msize, seg = -1
    cdef int32_t size, qid, sys_flag
    cdef int bw, sw
    cdef bint kept
    cdef int status
    cdef const unsigned char *u
    cdef const unsigned char *b
    cdef const char *tb
    cdef _ViewUnit *w
    cdef Py_buffer cv
    cdef _View v
    cdef _Col units
    queue = _queue_of_cq(cq)
    files = queue.files
    if files is None:
        raise TypeError("a ConsumeQueue's queue has no files list")
    nfiles = PyList_GET_SIZE(files)
    min_logic = (<ConsumeQueueBase>cq).min_logic_offset
    mn = jdiv(min_logic, 0, CQ_STORE_UNIT_SIZE)
    mx = 0
    if nfiles:
        last = files[nfiles - 1]
        mx = ((<MappedRegion?>last).file_from_offset + (<MappedRegion?>last).wrote_position) // CQ_STORE_UNIT_SIZE
    status = _bounds(q, mn, mx, &off)
    if status >= 0:
        return _status(status), off, mn, mx, None, b""
    topic = (<ConsumeQueueBase>cq).topic
    if topic is None:
        raise TypeError("a ConsumeQueue without a topic")
    tb = PyUnicode_AsUTF8AndSize(topic, &tl)
    qid = (<ConsumeQueueBase>cq).queue_id
    msize = _max_record(commitlog)
    cq_fs = _i64(queue.file_size)
    first = (<MappedRegion?>files[0]).file_from_offset
    status = _NO_MATCHED_MESSAGE
    bufs = _view_of(&v, commitlog)
    memset(&units, 0, sizeof(units))
    _init_view(&cv)
    try:
        while q < mx and n < mc and visited < mu:
            # ConsumeQueue.unit_range(q, min(max_count - n, max - q)); filtered, max_count for max_count - n
            off = q * CQ_STORE_UNIT_SIZE
            if off < min_logic or cq_fs <= 0:
                break
            fi = <Py_ssize_t>(off // cq_fs - first // cq_fs)
            if fi < 0 or fi >= nfiles:
                break
            mf = files[fi]
            pos = <Py_ssize_t>(off - (<MappedRegion?>mf).file_from_offset)
            end = min((<MappedRegion?>mf).wrote_position,
                      pos + min(mc if f.ncodes >= 0 else mc - n, mx - q) * CQ_STORE_UNIT_SIZE)
            if end <= pos:
                break
            PyObject_GetBuffer((<MappedRegion?>mf).mm, &cv, PyBUF_SIMPLE)
            if pos < 0 or end > cv.len:
                raise ValueError(f"units [{pos}, {end}) are not whole units of a {cv.len}-byte buffer")
            for k in range((end - pos) // CQ_STORE_UNIT_SIZE):  # a C loop (an enum step would make a Python range)
                u = <const unsigned char *>cv.buf + pos + k * CQ_STORE_UNIT_SIZE
                phy = ld64(u)
                size = ld32(u + 8)
                tags = ld64(u + 12)
                # a placeholder: skipped; while nothing is kept, a unit the filter
                # drops makes NO_MATCHED_MESSAGE and one cleaned up MESSAGE_WAS_REMOVING
                if size == PRE_BLANK_SIZE and phy == 0 and tags == 0:
                    pass
                elif f.ncodes >= 0 and not _code_in(f.codes, f.ncodes, tags):
                    if n == 0:
                        status = _NO_MATCHED_MESSAGE
                elif phy < v.lo:
                    if n == 0:
                        status = _MESSAGE_WAS_REMOVING
                else:
                    b = _unit_record(&v, bufs, phy, size, q, qid, tb, tl, msize, &p0)
                    if b == NULL:
                        if n and views:
                            return _status(status), q, mn, mx, _segment(bufs, seg, v.files), units.p[:units.n]
                        return None, q, mn, mx, None, b""  # stopped
                    kept = True
                    if not views:
                        kept = names is None or _tags_in(b, p0, f, names)  # (a tags code's collision)
                        if kept:
                            PyList_Append(out, _ext_at(message_type, b, p0, topic, repeats))
                    else:
                        if seg != -1 and v.seg != seg:  # the next segment: the next pull
                            return _status(status), q, mn, mx, _segment(bufs, seg, v.files), units.p[:units.n]
                        seg = v.seg
                        sys_flag = ld32(b + p0 + 36)
                        bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
                        sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
                        if units.n + <Py_ssize_t>sizeof(_ViewUnit) > units.cap:
                            _grow(&units, sizeof(_ViewUnit))
                        w = <_ViewUnit *>(units.p + units.n)  # unaligned-safe: the struct is packed
                        w.queue_offset = q
                        w.physical_offset = phy
                        w.store_timestamp = ld64(b + p0 + 48 + bw)
                        w.tags_code = tags
                        w.body_offset = p0 + 48 + bw + 24 + sw
                        w.body_length = ld32(b + p0 + 48 + bw + 20 + sw)
                        w.store_size = size
                        units.n += sizeof(_ViewUnit)
                    if kept:
                        n += 1
                        status = _FOUND
                    elif n == 0:
                        status = _NO_MATCHED_MESSAGE
                q += 1
                visited += 1
                if n >= mc:
                    break
            PyBuffer_Release(&cv)
        if not views:
            return _status(status), q, mn, mx, None, b""
        return _status(status), q, mn, mx, (_segment(bufs, seg, v.files) if n else None), \
            (units.p[:units.n] if n else b"")
    finally:
        PyBuffer_Release(&cv)
        PyBuffer_Release(&v.buf)
        free(units.p)
