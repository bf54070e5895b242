# Many CommitLog records at a time: bulk decoding into numpy columns,
# the recovery scan, one checked read, a record's store timestamp.


# --- bulk decoding into columns --------------------------------------------
#
# One pass over the records appends every field to growable C buffers; the
# buffers become numpy arrays at the end (one copy, no Python object per
# record). Column order is fixed by the _C_* indices below.

cdef struct _Col:
    char *p
    Py_ssize_t n
    Py_ssize_t cap
    bint borrowed  # p is the caller's (stack) buffer, not malloc'd: _grow copies out, _free leaves it

cdef enum:
    _C_PHY, _C_QOFF, _C_BORN_TS, _C_STORE_TS, _C_PREPARED,  # int64
    _C_SIZE, _C_QID, _C_FLAG, _C_SYSFLAG, _C_RECONSUME, _C_BODYCRC,  # int32
    _C_TOPIC, _C_BORN_HOST, _C_STORE_HOST, _C_MSGID, _C_TAGS, _C_KEYS, _C_UNIQ,  # strings
    _C_BODY, _C_PKEY, _C_PVAL,
    _C_STRINGS_END,
    _C_NCOLS = _C_STRINGS_END * 2 + 4  # data + offsets per string column, 3 valid, props offsets

cdef enum:
    _C_OFFSETS = _C_STRINGS_END  # offsets of string column c are at _C_OFFSETS + c
    _C_TAGS_VALID = _C_STRINGS_END * 2
    _C_KEYS_VALID
    _C_UNIQ_VALID
    _C_PROPS_OFFSETS

_COLUMN_NAMES = (
    "physical_offset", "queue_offset", "born_timestamp", "store_timestamp", "prepared_transaction_offset",
    "store_size", "queue_id", "flag", "sys_flag", "reconsume_times", "body_crc",
    "topic", "born_host", "store_host", "msg_id", "tags", "keys", "unique_key", "body", "property_key",
    "property_value",
)

cdef int _grow(_Col *c, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap = c.cap * 2
    cdef char *q
    if cap < c.n + extra:
        cap = c.n + extra
    if cap < 4096:
        cap = 4096
    if c.borrowed:
        q = <char *>malloc(cap)
        if q != NULL:
            memcpy(q, c.p, c.n)
    else:
        q = <char *>realloc(c.p, cap)
    if q == NULL:
        raise MemoryError()
    c.p = q
    c.cap = cap
    c.borrowed = False
    return 0


cdef inline void _on_stack(_Col *c, char *buf, Py_ssize_t size) noexcept:
    """Start *c* empty in the caller's *buf* (a lookup's few entries need no
    malloc); _free then releases only what _grow allocated."""
    c.p, c.n, c.cap, c.borrowed = buf, 0, size, True


cdef inline void _free(_Col *c) noexcept:
    if not c.borrowed:
        free(c.p)

cdef inline int _put(_Col *c, const void *src, Py_ssize_t k) except -1:
    if c.n + k > c.cap:
        _grow(c, k)
    memcpy(c.p + c.n, src, k)
    c.n += k
    return 0

cdef inline int _put64(_Col *c, int64_t v) except -1:
    return _put(c, &v, 8)

cdef inline int _put32(_Col *c, int32_t v) except -1:
    return _put(c, &v, 4)

cdef inline int _end_string(_Col *cols, int c) except -1:
    """Close one value of string column *c*: its end offset."""
    return _put32(&cols[_C_OFFSETS + c], <int32_t>cols[c].n)

cdef Py_ssize_t _fmt_int(char *out, long long v) noexcept:
    cdef char tmp[24]
    cdef Py_ssize_t i = 0, k = 0
    cdef unsigned long long u = <unsigned long long>(-v) if v < 0 else <unsigned long long>v
    if v < 0:
        out[k] = 45  # '-'
        k += 1
    while True:
        tmp[i] = <char>(48 + u % 10)
        i += 1
        u //= 10
        if u == 0:
            break
    while i > 0:
        i -= 1
        out[k] = tmp[i]
        k += 1
    return k

cdef Py_ssize_t _fmt_host(char *out, const unsigned char *raw, int width) noexcept:
    """``a.b.c.d:port`` or Java's ``[x:x:x:x:x:x:x:x]:port`` (as message.decode_host)."""
    cdef Py_ssize_t k = 0
    cdef int i, g, shift, started
    if width == 8:
        for i in range(4):
            k += _fmt_int(out + k, raw[i])
            out[k] = 46 if i < 3 else 58  # '.' / ':'
            k += 1
    else:
        out[k] = 91  # '['
        k += 1
        for i in range(8):
            g = (raw[2 * i] << 8) | raw[2 * i + 1]
            started = 0
            for shift in range(12, -4, -4):
                if (g >> shift) & 15 or started or shift == 0:
                    out[k] = b"0123456789abcdef"[(g >> shift) & 15]
                    k += 1
                    started = 1
            out[k] = 58 if i < 7 else 93  # ':' / ']'
            k += 1
        out[k] = 58
        k += 1
    return k + _fmt_int(out + k, ld32(raw + width - 4))

cdef int _put_hex(_Col *c, const unsigned char *p, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    if c.n + 2 * n > c.cap:
        _grow(c, 2 * n)
    for i in range(n):
        c.p[c.n + 2 * i] = b"0123456789ABCDEF"[p[i] >> 4]
        c.p[c.n + 2 * i + 1] = b"0123456789ABCDEF"[p[i] & 15]
    c.n += 2 * n
    return 0

cdef struct _Pair:
    Py_ssize_t k, kn, v, vn  # positions and lengths within the blob

cdef inline bint _is_name(const unsigned char *b, _Pair *e, const char *name, Py_ssize_t n) noexcept:
    return e.kn == n and memcmp(b + e.k, name, n) == 0

cdef inline bint _entry(const unsigned char *b, Py_ssize_t n, Py_ssize_t *s, _Pair *pr) noexcept:
    """RocketMQ's property parsing, one entry: the entry at *s* of the n-byte
    blob (split by 0x02, named up to its first 0x01) into *pr*; False when
    its name or value is empty (dropped). *s* moves past it (past n at the
    end: loop while *s* <= n)."""
    cdef Py_ssize_t st = s[0], e, i
    cdef const unsigned char *q = <const unsigned char *>memchr(b + st, 2, n - st) if st < n else NULL
    e = (q - b) if q != NULL else n
    q = <const unsigned char *>memchr(b + st, 1, e - st) if e > st else NULL
    s[0] = e + 1
    if q == NULL:
        return False
    i = q - b
    if i <= st or i >= e - 1:
        return False
    pr.k, pr.kn, pr.v, pr.vn = st, i - st, i + 1, e - i - 1
    return True


cdef Py_ssize_t _pairs(const unsigned char *b, Py_ssize_t n, _Col *tmp) except -1:
    """RocketMQ's property parsing into *tmp* (an array of _Pair): the
    _entry pairs, a later duplicate overwriting the earlier value in place.
    Returns the pair count."""
    cdef Py_ssize_t s = 0, j, count = 0
    cdef _Pair pr
    cdef _Pair *all
    tmp.n = 0
    while s <= n:
        if _entry(b, n, &s, &pr):
            all = <_Pair *>tmp.p
            for j in range(count):
                if all[j].kn == pr.kn and memcmp(b + all[j].k, b + pr.k, pr.kn) == 0:
                    all[j].v = pr.v
                    all[j].vn = pr.vn
                    break
            else:
                _put(tmp, &pr, sizeof(_Pair))
                count += 1
    return count

cdef object _np = None

cdef object _array(_Col *c, object dtype, Py_ssize_t itemsize):
    global _np
    if _np is None:
        import numpy
        _np = numpy
    arr = _np.empty(c.n // itemsize, dtype=dtype)
    cdef Py_buffer v
    if c.n:
        PyObject_GetBuffer(arr, &v, PyBUF_WRITABLE)
        memcpy(v.buf, c.p, c.n)
        PyBuffer_Release(&v)
    return arr

cdef int _optional(_Col *cols, int c, int valid, const unsigned char *b, _Pair *e) except -1:
    cdef uint8_t yes = e != NULL
    if yes:
        _put(&cols[c], b + e.v, e.vn)
    _end_string(cols, c)
    return _put(&cols[valid], &yes, 1)


cdef int _decode_one(_Col *cols, _Col *tmp, const unsigned char *b, Py_ssize_t p0, int32_t size,
                     bint with_body, bint with_properties, bint with_hosts=True, bint with_keys=True) except -1:
    """Append the record at *p0* (which _check accepted) to every column."""
    cdef int64_t phy = ld64(b + p0 + 28)
    cdef int32_t sys_flag, body_len, topic_len, props_len
    cdef int bw, sw
    cdef Py_ssize_t p, i, np_
    cdef const unsigned char *h
    cdef const unsigned char *props
    cdef char text[64]
    cdef _Pair *pairs
    cdef _Pair *tags
    cdef _Pair *keys
    cdef _Pair *uniq
    sys_flag = ld32(b + p0 + 36)
    bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    h = b + p0 + 48 + bw  # STORETIMESTAMP
    _put64(&cols[_C_PHY], phy)
    _put64(&cols[_C_QOFF], ld64(b + p0 + 20))
    _put64(&cols[_C_BORN_TS], ld64(b + p0 + 40))
    _put64(&cols[_C_STORE_TS], ld64(h))
    _put64(&cols[_C_PREPARED], ld64(h + 12 + sw))
    _put32(&cols[_C_SIZE], size)
    _put32(&cols[_C_QID], ld32(b + p0 + 12))
    _put32(&cols[_C_FLAG], ld32(b + p0 + 16))
    _put32(&cols[_C_SYSFLAG], sys_flag)
    _put32(&cols[_C_RECONSUME], ld32(h + 8 + sw))
    _put32(&cols[_C_BODYCRC], ld32(b + p0 + 8))
    if with_hosts:  # (host text and hex: most of a record's decoding)
        _put(&cols[_C_BORN_HOST], text, _fmt_host(text, b + p0 + 48, bw))
        _end_string(cols, _C_BORN_HOST)
        _put(&cols[_C_STORE_HOST], text, _fmt_host(text, h + 8, sw))
        _end_string(cols, _C_STORE_HOST)
        _put_hex(&cols[_C_MSGID], h + 8, sw)
        _put_hex(&cols[_C_MSGID], b + p0 + 28, 8)
        _end_string(cols, _C_MSGID)
    # _check accepted the record, so these lengths are consistent
    p = p0 + 72 + bw + sw
    body_len = ld32(b + p - 4)
    if with_body:
        _put(&cols[_C_BODY], b + p, body_len)
        _end_string(cols, _C_BODY)
    p += body_len
    if ld32(b + p0 + 4) == MESSAGE_MAGIC_CODE:
        topic_len = b[p]
        p += 1
    else:
        topic_len = ld16(b + p)
        p += 2
    _put(&cols[_C_TOPIC], b + p, topic_len)
    _end_string(cols, _C_TOPIC)
    p += topic_len
    if not (with_keys or with_properties):
        return 0
    props_len = ld16(b + p)
    props = b + p + 2
    np_ = _pairs(props, props_len, tmp)
    pairs = <_Pair *>tmp.p
    tags = keys = uniq = NULL
    for i in range(np_):
        if _is_name(props, &pairs[i], "TAGS", 4):
            tags = &pairs[i]
        elif _is_name(props, &pairs[i], "KEYS", 4):
            keys = &pairs[i]
        elif _is_name(props, &pairs[i], "UNIQ_KEY", 8):
            uniq = &pairs[i]
        if with_properties:
            _put(&cols[_C_PKEY], props + pairs[i].k, pairs[i].kn)
            _end_string(cols, _C_PKEY)
            _put(&cols[_C_PVAL], props + pairs[i].v, pairs[i].vn)
            _end_string(cols, _C_PVAL)
    if with_keys:
        _optional(cols, _C_TAGS, _C_TAGS_VALID, props, tags)
        _optional(cols, _C_KEYS, _C_KEYS_VALID, props, keys)
        _optional(cols, _C_UNIQ, _C_UNIQ_VALID, props, uniq)
    if with_properties:
        _put32(&cols[_C_PROPS_OFFSETS], <int32_t>((cols[_C_OFFSETS + _C_PKEY].n // 4) - 1))
    return 0


cdef object _columns_out(_Col *cols, bint with_body, bint with_properties, bint with_hosts=True,
                         bint with_keys=True):
    """The columns as numpy arrays (decode_columns' dict)."""
    cdef int i
    out = {}
    for i in range(_C_PHY, _C_PREPARED + 1):
        out[_COLUMN_NAMES[i]] = _array(&cols[i], "int64", 8)
    for i in range(_C_SIZE, _C_BODYCRC + 1):
        out[_COLUMN_NAMES[i]] = _array(&cols[i], "int32", 4)
    for i in range(_C_TOPIC, _C_STRINGS_END):
        if (i == _C_BODY and not with_body) or ((i == _C_PKEY or i == _C_PVAL) and not with_properties) or \
                (_C_BORN_HOST <= i <= _C_MSGID and not with_hosts) or (_C_TAGS <= i <= _C_UNIQ and not with_keys):
            continue
        out[_COLUMN_NAMES[i] + "_offsets"] = _array(&cols[_C_OFFSETS + i], "int32", 4)
        out[_COLUMN_NAMES[i] + "_data"] = _array(&cols[i], "uint8", 1)
    if with_keys:
        out["tags_valid"] = _array(&cols[_C_TAGS_VALID], "bool", 1)
        out["keys_valid"] = _array(&cols[_C_KEYS_VALID], "bool", 1)
        out["unique_key_valid"] = _array(&cols[_C_UNIQ_VALID], "bool", 1)
    if with_properties:
        out["properties_offsets"] = _array(&cols[_C_PROPS_OFFSETS], "int32", 4)
    return out


cdef int _columns_init(_Col *cols) except -1:
    cdef int i
    for i in range(_C_STRINGS_END):
        _put32(&cols[_C_OFFSETS + i], 0)
    _put32(&cols[_C_PROPS_OFFSETS], 0)
    return 0


def decode_columns(buf, pos, end, base_offset, max_count, bint with_body, bint with_properties,
                   bint check_crc=False, bint with_hosts=True, bint with_keys=True):
    """Decode consecutive CommitLog records of one file into columns.

    Reads records from byte *pos* of *buf* (one CommitLog file: mmap, bytes,
    memoryview) while they lie before *end*, at most *max_count* of them.
    *base_offset* is the physical offset of ``buf[0]`` (the file name); a
    record whose PHYSICALOFFSET differs from ``base_offset + position`` stops
    the scan with ``REC_BAD_OFFSET`` (pass -1 to skip that check). Every record
    is validated like ``check_record`` (with *check_crc*: body CRC, the store's
    ``__CRC32#`` when present, and the 0x02 terminator).

    Returns ``(next_pos, stop, cols)``. *stop* says why decoding ended at
    *next_pos*: ``STOP_LIMIT`` (1) max_count reached, ``STOP_END`` (2) *end*
    reached, ``REC_BLANK`` (0) an END_OF_FILE record or zeros (no more data in
    this file), or a negative ``REC_*`` code for an invalid record there.
    *cols* maps names to numpy arrays of n rows (n = records decoded):
    int64 physical_offset, queue_offset, born_timestamp, store_timestamp,
    prepared_transaction_offset; int32 store_size, queue_id, flag, sys_flag,
    reconsume_times, body_crc; Arrow-style string columns as ``<name>_offsets``
    (int32, n + 1) and ``<name>_data`` (uint8) for topic, born_host,
    store_host, msg_id (offset message id), tags, keys, unique_key
    (the last three with ``<name>_valid``, bool, False when the property is
    absent); with *with_body* ``body_offsets``/``body_data`` (the body as
    stored); with *with_properties* the property map as ``properties_offsets``
    (int32, n + 1, into the entries) and ``property_key_offsets``/
    ``property_key_data``, ``property_value_offsets``/``property_value_data``
    (RocketMQ's parsing rules: empty names or values dropped, a later
    duplicate replaces the earlier value in the earlier place). Strings are
    the stored bytes, not re-validated as UTF-8. Without *with_hosts* the
    born_host, store_host and msg_id columns are left out, without
    *with_keys* tags, keys and unique_key (each costs more to decode than
    the numbers: a reader leaves out what its caller does not ask for).
    Raises ValueError for positions outside the buffer or a negative
    *max_count*.
    """
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(end), mx = _idx(max_count), n, count = 0, i
    cdef long long base = _i64(base_offset), phy
    cdef const unsigned char *b
    cdef int32_t size
    cdef int stop = STOP_END, rc
    cdef _Col cols[_C_NCOLS]
    cdef _Col tmp
    cdef Py_buffer v
    memset(cols, 0, sizeof(cols))
    memset(&tmp, 0, sizeof(tmp))
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        n = v.len
        if p0 < 0 or lim < p0 or p0 > n or mx < 0:
            raise ValueError(f"bad range pos={pos} end={end} max_count={max_count} for a buffer of {n} bytes")
        if lim > n:
            lim = n
        _columns_init(cols)
        while p0 < lim:
            if count >= mx:
                stop = STOP_LIMIT
                break
            if lim - p0 >= 8 and ld32(b + p0) == 0 and ld32(b + p0 + 4) == 0:
                stop = REC_BLANK
                break
            rc = _check(b, n, p0, lim, check_crc, 2, lim - p0)
            if rc <= 0:
                stop = rc
                break
            size = rc
            phy = ld64(b + p0 + 28)
            if base >= 0 and <rmq_i128>phy != <rmq_i128>base + p0:
                stop = REC_BAD_OFFSET
                break
            _decode_one(cols, &tmp, b, p0, size, with_body, with_properties, with_hosts, with_keys)
            p0 += size
            count += 1
        out = _columns_out(cols, with_body, with_properties, with_hosts, with_keys)
        return p0, stop, out
    finally:
        PyBuffer_Release(&v)
        for i in range(_C_NCOLS):
            free(cols[i].p)
        free(tmp.p)


def decode_columns_at(bufs, file_size, base, offsets, bint with_body, bint with_properties):
    """``decode_columns`` for records at given physical offsets (a pull: the
    offsets of ConsumeQueue units) instead of consecutive ones.

    *bufs* are the CommitLog segments in order, each *file_size* bytes, the
    first at physical offset *base* (``CommitLog.segment_view()[:3]``);
    *offsets* a list of physical offsets. Each record is validated as a read
    does (``check_record`` with the body CRC, PHYSICALOFFSET equal to its offset).
    Returns ``(count, stop, cols)``: the first *count* offsets decoded into
    *cols* (as ``decode_columns``), *stop* ``STOP_END`` when all were, else
    the ``REC_*`` code of ``offsets[count]`` (``REC_BAD_OFFSET`` also for an
    offset outside the segments). Raises TypeError unless *bufs* and
    *offsets* are lists, ValueError for a file size that is not positive."""
    cdef long long fs = _i64(file_size), b0 = _i64(base), phy
    cdef Py_ssize_t i, seg, last = -1, pos, nbufs, count = 0
    cdef int stop = STOP_END, rc
    cdef _Col cols[_C_NCOLS]
    cdef _Col tmp
    cdef Py_buffer v
    if not PyList_CheckExact(bufs) or not PyList_CheckExact(offsets):
        raise TypeError("bufs and offsets must be lists")
    if fs <= 0:
        raise ValueError(f"file size {file_size} is not positive")
    nbufs = PyList_GET_SIZE(bufs)
    memset(cols, 0, sizeof(cols))
    memset(&tmp, 0, sizeof(tmp))
    _init_view(&v)
    try:
        _columns_init(cols)
        for i in range(PyList_GET_SIZE(offsets)):
            phy = _i64(offsets[i])
            if phy < b0 or (phy - b0) // fs >= nbufs:
                stop = REC_BAD_OFFSET
                break
            seg = <Py_ssize_t>((phy - b0) // fs)
            if seg != last:  # units of a pull mostly share a segment: one view for them
                PyBuffer_Release(&v)
                last = -1
                PyObject_GetBuffer(bufs[seg], &v, PyBUF_SIMPLE)
                last = seg
            pos = <Py_ssize_t>(phy - b0 - seg * fs)
            rc = _check(<const unsigned char *>v.buf, v.len, pos, v.len, True, 0, v.len - pos)
            if rc > 0 and ld64(<const unsigned char *>v.buf + pos + 28) != phy:
                rc = REC_BAD_OFFSET
            if rc <= 0:
                stop = rc
                break
            _decode_one(cols, &tmp, <const unsigned char *>v.buf, pos, rc, with_body, with_properties)
            count += 1
        return count, stop, _columns_out(cols, with_body, with_properties)
    finally:
        PyBuffer_Release(&v)
        for i in range(_C_NCOLS):
            free(cols[i].p)
        free(tmp.p)


def scan_records(buf, pos, end, base_offset, bint check_crc, int verify_prop_crc, max_size):
    """Walk consecutive records of one CommitLog file from *pos* while they
    validate (``check_record`` with *check_crc*, *verify_prop_crc*,
    *max_size*, limited to *end*) and their PHYSICALOFFSET equals
    ``base_offset + position`` (not checked when *base_offset* is -1): the
    CommitLog recovery scan without a Python step per record.

    Returns ``(next_pos, status, count)``: where the walk stopped, why
    (``STOP_END`` when it reached *end*, ``REC_BLANK`` at an END_OF_FILE
    record, ``REC_BAD_OFFSET`` or another negative ``REC_*`` code at an
    invalid record) and how many records it passed. Raises ValueError for a
    range outside the buffer."""
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(end), mx = _idx(max_size), n, count = 0, ahead
    cdef long long base = _i64(base_offset)
    cdef const unsigned char *b
    cdef int rc = STOP_END
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        n = v.len
        if p0 < 0 or lim < p0 or p0 > n:
            raise ValueError(f"bad range pos={pos} end={end} for a buffer of {n} bytes")
        if lim > n:
            lim = n
        ahead = p0
        with nogil:  # a long walk: two threads can scan two files
            while p0 < lim:
                # each header says where the next one is: the walk would wait on
                # memory at every record, so keep the next 4 KiB on their way
                while ahead < p0 + 4096 and ahead < lim:
                    prefetch(b + ahead)
                    ahead += 64
                rc = _check(b, n, p0, lim, check_crc, verify_prop_crc, mx)
                if rc <= 0:
                    break
                if base >= 0 and <rmq_i128>ld64(b + p0 + 28) != <rmq_i128>base + p0:
                    rc = REC_BAD_OFFSET
                    break
                p0 += rc
                count += 1
                rc = STOP_END
        return p0, rc, count
    finally:
        PyBuffer_Release(&v)


def read_record(buf, pos, limit, physical_offset, max_size, bint with_body):
    """The record at *pos* if ``check_record(buf, pos, limit, True, 0,
    max_size)`` accepts it (its body CRC too: every read checks it, where
    RocketMQ only checks on recovery) and its PHYSICALOFFSET is
    *physical_offset*: the ``decode_record`` tuple. Otherwise the int status:
    ``REC_BLANK``, a negative ``REC_*`` code (``REC_BODY_CRC`` for a damaged
    body), or ``REC_BAD_OFFSET``. (A read by offset, as a pull does it, in
    one call.)"""
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(limit), mx = _idx(max_size)
    cdef long long phy = _i64(physical_offset)
    cdef int rc
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        rc = _check(<const unsigned char *>v.buf, v.len, p0, lim, True, 0, mx)
        if rc <= 0:
            return rc
        if ld64(<const unsigned char *>v.buf + p0 + 28) != phy:
            return REC_BAD_OFFSET
    finally:
        PyBuffer_Release(&v)
    return decode_record(buf, pos, with_body)


cdef inline int64_t _store_ts_at(const unsigned char *b, Py_ssize_t n, Py_ssize_t p0) noexcept nogil:
    # where STORETIMESTAMP lies depends on the born host's width (SYSFLAG)
    cdef Py_ssize_t p
    if p0 < 0 or p0 > n - 40:
        return -1
    p = p0 + 48 + (20 if ld32(b + p0 + 36) & BORNHOST_V6_FLAG else 8)
    if p > n - 8:
        return -1
    return ld64(b + p)


def read_store_timestamp(buf, pos):
    """STORETIMESTAMP of the record at *pos* (its position depends on the born
    host width). Returns -1 when the field lies outside the buffer."""
    cdef Py_ssize_t p0 = _idx(pos)
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        return _store_ts_at(<const unsigned char *>v.buf, v.len, p0)
    finally:
        PyBuffer_Release(&v)


def read_store_timestamps(buf, positions, out):
    """``read_store_timestamp`` for many records at once: ``out[i]`` becomes
    the STORETIMESTAMP (ms since epoch) of the record at byte position
    ``positions[i]`` of *buf*, or -1 where the field lies outside *buf*.
    For walks that date every unit of a queue (``rmqstore report``)
    without a Python int per record.

    *buf*: a readable buffer (a CommitLog segment's mapping); *positions*:
    a buffer of native int64 (a numpy ``int64`` array, ``array('q')``), n of
    them (its bytes // 8); *out*: a writable buffer of at least n native
    int64. Returns n. Raises ValueError when *out* holds fewer than n,
    BufferError when it is not writable, TypeError for what is not a buffer.
    """
    cdef Py_buffer v, pv, ov
    cdef Py_ssize_t i, n
    cdef const int64_t *pp
    cdef int64_t *oo
    _init_view(&v)
    _init_view(&pv)
    _init_view(&ov)
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(positions, &pv, PyBUF_SIMPLE)
        PyObject_GetBuffer(out, &ov, PyBUF_WRITABLE)
        n = pv.len // 8
        if ov.len < n * 8:
            raise ValueError(f"out holds {ov.len // 8} int64 values, positions {n}")
        pp, oo = <const int64_t *>pv.buf, <int64_t *>ov.buf
        with nogil:
            for i in range(n):
                oo[i] = _store_ts_at(<const unsigned char *>v.buf, v.len, <Py_ssize_t>pp[i])
    finally:
        PyBuffer_Release(&ov)
        PyBuffer_Release(&pv)
        PyBuffer_Release(&v)
    return n
