# Argument conversion (saturated and checked ints, buffers), hashes and
# CRCs, properties, and one CommitLog record at a time: size, encode, write,
# check, decode.


# --- helpers --------------------------------------------------------------


cdef inline Py_ssize_t _idx(object o) except? -1:
    """*o* (any int) saturated to Py_ssize_t: exact for comparisons with buffer sizes."""
    cdef int ovf = 0
    cdef long long v
    if rmq_small_long(o, &v):
        return <Py_ssize_t>v
    v = PyLong_AsLongLongAndOverflow(o, &ovf)
    if ovf > 0 or v > PY_SSIZE_T_MAX:
        return PY_SSIZE_T_MAX
    if ovf < 0 or v < PY_SSIZE_T_MIN:
        return PY_SSIZE_T_MIN
    return <Py_ssize_t>v


cdef inline long long _i64(object o) except? -1:
    """A 64-bit field value: TypeError unless an int (no float truncation), OverflowError
    when out of range (checked up front, before anything is stored)."""
    cdef int ovf = 0
    cdef long long v
    if rmq_small_long(o, &v):
        return v
    v = PyLong_AsLongLongAndOverflow(o, &ovf)
    if ovf:
        raise OverflowError(f"{o} does not fit in a 64-bit field")
    return v


cdef object _ZERO = 0  # the int 0 a default argument or a literal 0 is (identity: a shortcut only)


cdef inline bint _long_in(object v, long long lo, long long hi, long long *out) noexcept:
    """Whether *v* is an exact int within [lo, hi] (then its value in *out*):
    the gate's fast path takes no other number, the store's method checks
    (and refuses) the rest. The shared 0 object (most of a message's int
    fields) is known here, inline; any other int by _long_read."""
    if v is _ZERO:
        out[0] = 0
        return lo <= 0 <= hi
    return _long_read(v, lo, hi, out)


cdef bint _long_read(object v, long long lo, long long hi, long long *out) noexcept:
    """_long_in of anything but the shared 0."""
    cdef int ovf = 0
    if not rmq_small_long(v, out):  # (the usual values, read inline)
        if not PyLong_CheckExact(v):
            return False
        out[0] = PyLong_AsLongLongAndOverflow(v, &ovf)  # (cannot fail for an exact int)
        if ovf:
            return False
    return lo <= out[0] <= hi


cdef inline int _i32(object o) except? -1:
    cdef long long v = _i64(o)
    if v < -2147483648 or v > 2147483647:
        raise OverflowError(f"{o} does not fit in a 32-bit field")
    return <int>v


cdef inline rmq_i128 _wide(object o) except? -1:
    """*o* as a 128-bit int, exact within +-2**100 (far beyond i64 + 2**31 * 1000)."""
    cdef int ovf = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(o, &ovf)
    if not ovf:
        return <rmq_i128>v
    o = min(max(PyNumber_Index(o), -(1 << 100)), 1 << 100)
    return <rmq_i128><long long>(o >> 64) * ((<rmq_i128>1) << 64) + <unsigned long long>(o & 0xFFFFFFFFFFFFFFFF)


cdef inline void _init_view(Py_buffer *v) noexcept:
    memset(v, 0, sizeof(Py_buffer))


cdef inline bint _get_rw(object obj, Py_buffer *view) except -1:
    """Writable view of *obj* if it has one (True), else a read-only view
    (False): callers raise TypeError only when they actually write, as
    struct.pack_into would."""
    if _try_getbuffer(obj, view, PyBUF_WRITABLE) == 0:
        return True
    PyErr_Clear()
    _init_view(view)
    PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    return False


cdef inline int _not_writable(object obj) except -1:
    raise TypeError(f"argument must be read-write bytes-like object, not {type(obj).__name__}")


cdef uint32_t _crc(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Masked CRC-32 (zlib takes 32-bit lengths, so chunk)."""
    return <uint32_t>(_crc_from(0, p, n) & 0x7FFFFFFF)


cdef bint _HW_CRC = rmq_crc32_hw_available()
# which CRC-32 the kernels run: the same bits either way (tests/test_kernels.py)
CRC32_IMPLEMENTATION = "hardware" if _HW_CRC else "zlib"


cdef unsigned long _crc_from(unsigned long c, const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Raw CRC-32 of *p* continuing from *c*: the CPU's carry-less multiply or
    CRC instructions where it has them (about 10x zlib on a 330-byte record,
    bench/crc32_check.sh), else zlib, which beats a portable table. Callable
    without the GIL; callers holding it release it themselves around long
    inputs (masked_crc32)."""
    cdef unsigned int k
    if _HW_CRC:
        return rmq_crc32(<uint32_t>c, p, <size_t>n)
    while n > 0:
        k = <unsigned int>(n if n < 0x40000000 else 0x40000000)
        c = crc32(c, p, k)
        p += k
        n -= k
    return c


cdef int32_t _java_hash(object s) except? -1:
    return <int32_t>_java_hash_from(0, s)


cdef uint32_t _java_hash_from(uint32_t h, object s) except? 0xFFFFFFFF:
    """Java's String.hashCode continued from *h* (the hash of a prefix)."""
    if not isinstance(s, str):
        raise TypeError(f"java_hash expects str, got {type(s).__name__}")
    rmq_unicode_ready(s)
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(s)
    cdef int kind = PyUnicode_KIND(s)
    cdef const void *data = PyUnicode_DATA(s)
    cdef const uint8_t *p1
    cdef const uint16_t *p2
    cdef const uint32_t *p4
    if kind == PyUnicode_1BYTE_KIND:  # ASCII / Latin-1: one UTF-16 unit each
        p1 = <const uint8_t *>data
        i = 0
        while i + 4 <= n:  # four steps at once: 31**4 * h + 31**3 * c0 + ... (mod 2**32)
            h = 923521 * h + 29791 * p1[i] + 961 * p1[i + 1] + 31 * p1[i + 2] + p1[i + 3]
            i += 4
        while i < n:
            h = 31 * h + p1[i]
            i += 1
    elif kind == PyUnicode_2BYTE_KIND:  # BMP, lone surrogates included
        p2 = <const uint16_t *>data
        for i in range(n):
            h = 31 * h + p2[i]
    else:
        p4 = <const uint32_t *>data
        for i in range(n):
            h = _hash_char(h, p4[i])
    return h


cdef inline uint32_t _hash_char(uint32_t h, uint32_t c) noexcept nogil:
    """Java's hash step over one character: a surrogate pair beyond the BMP."""
    if c > 0xFFFF:
        c -= 0x10000
        h = 31 * h + (0xD800 + (c >> 10))
        return 31 * h + (0xDC00 + (c & 0x3FF))
    return 31 * h + c


cdef inline const char *_utf8(object s, Py_ssize_t *n) except NULL:
    """The UTF-8 of the str *s* and its length: an ASCII str's own bytes
    without a call, else PyUnicode_AsUTF8AndSize (UnicodeError for a lone
    surrogate)."""
    if PyUnicode_IS_COMPACT_ASCII(s):
        n[0] = PyUnicode_GET_LENGTH(s)
        return <const char *>PyUnicode_DATA(s)
    return PyUnicode_AsUTF8AndSize(s, n)


cdef inline int32_t _key_hash(object key) except? -1:
    cdef int32_t h = _java_hash(key)
    if h == -2147483648:
        return 0
    return -h if h < 0 else h


# --- hashing and checksums ------------------------------------------------


def java_hash(s):
    """Java ``String.hashCode()`` of *s*: 31-polynomial over UTF-16 code units.

    Characters outside the BMP count as two units (a surrogate pair).
    Returns a signed 32-bit int. Raises TypeError unless *s* is a str.
    """
    return _java_hash(s)


def index_key_hash(key):
    """IndexFile key hash (``IndexFile.indexKeyHashMethod``): ``abs(java_hash)``,
    with 0 for ``Integer.MIN_VALUE`` (Java's ``Math.abs`` overflow). Always >= 0."""
    return _key_hash(key)


def masked_crc32(data, start=0, end=-1):
    """CRC-32 (IEEE, as ``zlib.crc32``) of ``data[start:end]`` masked with
    0x7FFFFFFF, as RocketMQ's ``UtilAll.crc32`` stores it. ``end=-1`` means the
    end of *data*. Raises ValueError for a range outside *data*."""
    cdef Py_ssize_t s = _idx(start), e = _idx(end), n
    cdef Py_buffer v
    PyObject_GetBuffer(data, &v, PyBUF_SIMPLE)
    try:
        n = v.len
        if e < 0:
            e = n
            end = n
        if not (0 <= s <= e <= n):
            raise ValueError(f"range [{start}, {end}) outside buffer of {n} bytes")
        if e - s <= 65536:
            return _crc(<const unsigned char *>v.buf + s, e - s)
        with nogil:  # long inputs: let other threads run
            crc = _crc(<const unsigned char *>v.buf + s, e - s)
        return crc
    finally:
        PyBuffer_Release(&v)


# --- properties -----------------------------------------------------------


def parse_properties(blob):
    """Decode a property blob exactly as RocketMQ's ``string2messageProperties``.

    Pairs are separated by 0x02 and split at their first 0x01; pairs with an
    empty name or value are dropped; a later duplicate wins. Returns a dict in
    stored order. Invalid UTF-8 is replaced (as Java's decoder does).
    """
    # Splitting raw bytes at 0x01/0x02 and decoding each piece equals decoding
    # first: ASCII bytes are never part of a replaced (invalid) UTF-8 sequence.
    if not PyBytes_CheckExact(blob):
        blob = bytes(blob)
    cdef const char *b = PyBytes_AS_STRING(blob)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(blob), s = 0, e, k
    cdef const char *q
    out = {}
    while s <= n:
        q = <const char *>memchr(b + s, 2, <size_t>(n - s))
        e = q - b if q != NULL else n
        q = <const char *>memchr(b + s, 1, <size_t>(e - s))
        if q != NULL:
            k = q - b
            if s < k < e - 1:
                out[PyUnicode_DecodeUTF8(b + s, k - s, "replace")] = \
                    PyUnicode_DecodeUTF8(b + k + 1, e - k - 1, "replace")
        s = e + 1
    return out


# --- CommitLog records ----------------------------------------------------


cdef inline object _max0(object x):
    return 0 if 0 > x else x  # builtin max(x, 0), operand order included


def record_size(sys_flag, body_len, topic_len, props_len, v2):
    """Length in bytes of a CommitLog record (RocketMQ ``calMsgLength``)."""
    # Object arithmetic: _pure accepts ints of any size here.
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    return 68 + born + store + 4 + _max0(body_len) + (2 if v2 else 1) + topic_len + 2 + _max0(props_len)


cdef struct Rec:
    int queue_id, flag, sys_flag, reconsume_times, bw, sw
    long long queue_offset, physical_offset, born_timestamp, store_timestamp, prepared
    const unsigned char *born
    const unsigned char *store
    const unsigned char *body
    const unsigned char *topic
    const unsigned char *props
    Py_ssize_t born_len, store_len, body_len, topic_len, props_len, props_field, size
    bint v2, append_crc, sep
    int delay_level  # the put path's: SCHEDULE_TOPIC_XXXX's DELAY level, 0 for none


cdef int _fields(Rec *r, object queue_id, object flag, object queue_offset, object physical_offset,
                 object sys_flag, object born_timestamp, object store_timestamp,
                 object reconsume_times, object prepared) except -1:
    r.queue_id = _i32(queue_id)
    r.flag = _i32(flag)
    r.queue_offset = _i64(queue_offset)
    r.physical_offset = _i64(physical_offset)
    r.sys_flag = _i32(sys_flag)
    r.born_timestamp = _i64(born_timestamp)
    r.store_timestamp = _i64(store_timestamp)
    r.reconsume_times = _i32(reconsume_times)
    r.prepared = _i64(prepared)
    return 0


cdef int _check_hosts(Rec *r, object born_host, object store_host) except -1:
    r.bw = 20 if r.sys_flag & BORNHOST_V6_FLAG else 8
    r.sw = 20 if r.sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    if len(born_host) != r.bw or len(store_host) != r.sw:
        raise ValueError("host field widths disagree with the sysflag V6 bits")
    return 0


cdef int _check_topic(Rec *r, Py_buffer *t) except -1:
    r.topic = <const unsigned char *>t.buf
    r.topic_len = t.len
    if r.topic_len > MAX_TOPIC_LENGTH_V2:
        raise ValueError(f"topic of {r.topic_len} bytes is too long")
    r.v2 = r.topic_len > MAX_TOPIC_LENGTH_V1
    return 0


cdef int _check_props(Rec *r, Py_buffer *p) except -1:
    r.props = <const unsigned char *>p.buf
    r.props_len = r.props_field = p.len
    r.sep = r.append_crc and r.props_len > 0 and r.props[r.props_len - 1] != 2
    if r.append_crc:
        r.props_field += r.sep + CRC32_RESERVED_LEN
    if r.props_field > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties of {r.props_field} bytes exceed {MAX_PROPERTIES_LENGTH}")
    return 0


cdef int _check_size(Rec *r, Py_buffer *b) except -1:
    r.body = <const unsigned char *>b.buf
    r.body_len = b.len
    r.size = (68 + r.bw + r.sw + 4 + r.body_len + (2 if r.v2 else 1) + r.topic_len + 2
              + r.props_field)
    if r.size > 0x7FFFFFFF:  # TOTALSIZE is an i32 (_pure: struct.error)
        raise ValueError(f"record of {r.size} bytes is too large")
    return 0


cdef inline void _put_host(unsigned char *d, const unsigned char *h, Py_ssize_t n, int w) noexcept:
    # struct's "Ns" pads short values with zeros and truncates long ones
    memset(d, 0, w)
    memmove(d, h, n if n < w else w)


cdef void _emit(unsigned char *d, Rec *r) noexcept:
    """Store the validated record *r* at *d* (same store order as _pure):
    TOTALSIZE and the magic code go last, so a record torn by a crash has no
    magic and recovery stops there instead of accepting half a record."""
    cdef unsigned char *q
    cdef uint32_t crc
    cdef int i
    cdef unsigned char head[8]
    st32(head, <uint32_t>r.size)
    st32(head + 4, <uint32_t>(MESSAGE_MAGIC_CODE_V2 if r.v2 else MESSAGE_MAGIC_CODE))
    st32(d + 12, <uint32_t>r.queue_id)
    st32(d + 16, <uint32_t>r.flag)
    st64(d + 20, <uint64_t>r.queue_offset)
    st64(d + 28, <uint64_t>r.physical_offset)
    st32(d + 36, <uint32_t>r.sys_flag)
    st64(d + 40, <uint64_t>r.born_timestamp)
    q = d + 48
    _put_host(q, r.born, r.born_len, r.bw)
    q += r.bw
    st64(q, <uint64_t>r.store_timestamp)
    q += 8
    _put_host(q, r.store, r.store_len, r.sw)
    q += r.sw
    st32(q, <uint32_t>r.reconsume_times)
    st64(q + 4, <uint64_t>r.prepared)
    st32(q + 12, <uint32_t>r.body_len)
    q += 16
    if r.body_len:  # memmove: a source view may alias the target buffer
        memmove(q, r.body, r.body_len)
    # the CRC of the bytes written, not of the source: a body another thread
    # (or C code without the GIL) changes meanwhile still makes a valid record
    st32(d + 8, _crc(q, r.body_len) if r.body_len else 0)
    q += r.body_len
    if r.v2:
        st16(q, <uint32_t>r.topic_len)
        q += 2
    else:
        q[0] = <unsigned char>r.topic_len
        q += 1
    if r.topic_len:
        memmove(q, r.topic, r.topic_len)
    q += r.topic_len
    st16(q, <uint32_t>r.props_field)
    q += 2
    if r.props_len:
        memmove(q, r.props, r.props_len)
    q += r.props_len
    if r.append_crc:
        if r.sep:
            q[0] = 2
            q += 1
        crc = <uint32_t>(_crc_from(_crc_from(0, head, 8), d + 8, q - d - 8) & 0x7FFFFFFF)
        memmove(q, b"__CRC32#\x01", 9)
        for i in range(10):  # least-significant digit first (docs/format.md#crc32-property)
            q[9 + i] = <unsigned char>(48 + crc % 10)
            crc //= 10
        q[19] = 2
    memcpy(d, head, 8)


cdef int _prepare(Rec *r, object born_host, object store_host, object body, object topic,
                  object properties, Py_buffer *bv, Py_buffer *tv, Py_buffer *pv) except -1:
    """Acquire the byte arguments and validate every length (ValueError)."""
    PyObject_GetBuffer(body, bv, PyBUF_SIMPLE)
    PyObject_GetBuffer(topic, tv, PyBUF_SIMPLE)
    PyObject_GetBuffer(properties, pv, PyBUF_SIMPLE)
    _check_hosts(r, born_host, store_host)
    _check_topic(r, tv)
    _check_props(r, pv)
    _check_size(r, bv)
    return 0


cdef int _write(Rec *r, object buf, object pos, object born_host, object store_host, object body,
                object topic, object properties, Py_buffer *views) except -1:
    """The record part of write_record into views[0..3] (body, topic,
    properties, out; the caller releases them): every check first, so an
    error writes nothing, then the store (TOTALSIZE and magic last)."""
    cdef Py_ssize_t p0 = _idx(pos)
    _prepare(r, born_host, store_host, body, topic, properties, &views[0], &views[1], &views[2])
    cdef bint writable = _get_rw(buf, &views[3])
    if p0 < 0 or r.size > views[3].len - p0:
        raise ValueError(f"record of {r.size} bytes does not fit at position {pos}")
    if not PyBytes_CheckExact(born_host):
        born_host = bytes(born_host)
    if not PyBytes_CheckExact(store_host):
        store_host = bytes(store_host)
    if not writable:
        _not_writable(buf)
    r.born = <const unsigned char *>PyBytes_AS_STRING(born_host)
    r.born_len = PyBytes_GET_SIZE(born_host)
    r.store = <const unsigned char *>PyBytes_AS_STRING(store_host)
    r.store_len = PyBytes_GET_SIZE(store_host)
    _emit(<unsigned char *>views[3].buf + p0, r)
    return 0


def write_record(
    buf, pos, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
    born_host, store_timestamp, store_host, reconsume_times, prepared_transaction_offset,
    body, topic, properties, bint append_crc,
):
    """Encode one CommitLog record into ``buf[pos:]`` and return its size.

    *born_host* / *store_host* are the raw host fields (address bytes + i32
    port: 8 bytes for IPv4, 20 for IPv6) and must agree with the V6 bits of
    *sys_flag*; *topic* and *properties* are UTF-8 bytes; BODYCRC is computed
    here. v2 magic is used iff the topic is over 127 bytes. With *append_crc*
    the ``__CRC32#`` entry is appended over the finished record.

    Raises ValueError (nothing written) when the record does not fit in the
    buffer, a length is out of range or a host width disagrees with *sys_flag*.
    """
    cdef Rec r
    cdef Py_buffer views[4]
    cdef int i
    _fields(&r, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
            store_timestamp, reconsume_times, prepared_transaction_offset)
    r.append_crc = append_crc
    memset(views, 0, sizeof(views))
    try:
        _write(&r, buf, pos, born_host, store_host, body, topic, properties, views)
        return r.size
    finally:
        for i in range(4):
            PyBuffer_Release(&views[i])


def append_dispatch(
    buf, pos, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
    born_host, store_timestamp, store_host, reconsume_times, prepared_transaction_offset,
    body, topic, properties, bint append_crc,
    cq_buf, cq_pos, tags_code, index_buf, hash_slot_num, index_num, key_prefix, keys,
):
    """One put in one call (ASYNC_FLUSH's dispatch done at append time):
    ``write_record`` with the first 17 arguments, then the ConsumeQueue unit
    (``cq_put(cq_buf, cq_pos, physical_offset, size, tags_code)``), then, when
    *index_buf* is not None, ``index_put_keys(index_buf, hash_slot_num,
    index_num, key_prefix, keys, physical_offset, store_timestamp)``. Written
    in that order (what a crash leaves is a prefix recovery can finish).

    Returns the record size, or 0 with nothing written when the index file
    cannot take every key or its end physical offset is at or past
    *physical_offset* (the caller then takes the step-by-step path), unless
    both are 0 and the file holds no entry (a new store's first record into
    its first index file). Every check comes first: errors (as the three
    kernels raise them) write nothing.
    """
    cdef Rec r
    cdef Py_buffer views[4]
    cdef Py_buffer cqv, iv
    cdef Py_ssize_t c0, hsn = 0, idx = 0, i, n = 0
    cdef long long tags
    cdef int32_t count
    cdef uint32_t h0 = 0
    cdef unsigned char *u
    _fields(&r, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
            store_timestamp, reconsume_times, prepared_transaction_offset)
    tags = _i64(tags_code)
    r.append_crc = append_crc
    c0 = _idx(cq_pos)
    memset(views, 0, sizeof(views))
    _init_view(&cqv)
    _init_view(&iv)
    try:
        # every check comes before the first store: an error or a refusal writes nothing
        if index_buf is not None:
            h0 = _check_keys(key_prefix, keys)
            n = PyList_GET_SIZE(keys)
            if not _get_rw(index_buf, &iv):
                _not_writable(index_buf)
            _check_index(&iv, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
            u = <unsigned char *>iv.buf
            count = ld32(u + 36)
            if count <= 0:
                count = 1
            if not _index_takes_new(u, r.physical_offset, count) or count + n > idx:
                return 0  # indexed already (or partly), or the file fills up: the caller's steps
        if not _get_rw(cq_buf, &cqv):
            _not_writable(cq_buf)
        if c0 < 0 or c0 > cqv.len - CQ_STORE_UNIT_SIZE:
            raise ValueError(f"no ConsumeQueue unit at {cq_pos} in a buffer of {cqv.len} bytes")
        # the record, then its unit, then its keys: what a crash leaves is
        # always a prefix that recovery knows how to finish or cut
        _write(&r, buf, pos, born_host, store_host, body, topic, properties, views)
        u = <unsigned char *>cqv.buf + c0
        st64(u, <uint64_t>r.physical_offset)
        st64(u + 12, <uint64_t>tags)
        st32(u + 8, <uint32_t>r.size)  # size last: a torn unit is invalid
        if index_buf is not None:
            for i in range(n):
                _index_put(<unsigned char *>iv.buf, hsn, idx, _abs_hash(_java_hash_from(h0, keys[i])),
                           r.physical_offset, r.store_timestamp)
        return r.size
    finally:
        PyBuffer_Release(&iv)
        PyBuffer_Release(&cqv)
        for i in range(4):
            PyBuffer_Release(&views[i])


def encode_record(
    queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
    store_timestamp, store_host, reconsume_times, prepared_transaction_offset, body, topic,
    properties, bint append_crc,
):
    """``write_record`` into a new buffer; returns the record's bytes."""
    cdef Rec r
    cdef Py_buffer tv, pv, bv
    _fields(&r, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
            store_timestamp, reconsume_times, prepared_transaction_offset)
    r.append_crc = append_crc
    _init_view(&tv)
    _init_view(&pv)
    _init_view(&bv)
    try:
        _prepare(&r, born_host, store_host, body, topic, properties, &bv, &tv, &pv)
        if not PyBytes_CheckExact(born_host):
            born_host = bytes(born_host)
        if not PyBytes_CheckExact(store_host):
            store_host = bytes(store_host)
        r.born = <const unsigned char *>PyBytes_AS_STRING(born_host)
        r.born_len = PyBytes_GET_SIZE(born_host)
        r.store = <const unsigned char *>PyBytes_AS_STRING(store_host)
        r.store_len = PyBytes_GET_SIZE(store_host)
        out = PyBytes_FromStringAndSize(NULL, r.size)
        _emit(<unsigned char *>PyBytes_AS_STRING(out), &r)
        return out
    finally:
        PyBuffer_Release(&pv)
        PyBuffer_Release(&tv)
        PyBuffer_Release(&bv)


cdef bint _find_crc(const unsigned char *p, Py_ssize_t n, long long *out) noexcept nogil:
    """Value of the last ``__CRC32#`` entry in p[:n] (as _pure._find_crc_property)."""
    cdef Py_ssize_t i = n - 9, k
    cdef long long v = 0
    while i >= 0:  # rfind
        if p[i] == 95 and memcmp(p + i, b"__CRC32#\x01", 9) == 0:
            break
        i -= 1
    if i < 0 or (i > 0 and p[i - 1] != 2) or n - (i + 9) < 10:
        return False
    for k in range(9, -1, -1):  # digits are stored least-significant first
        if not 48 <= p[i + 9 + k] <= 57:
            return False
        v = v * 10 + (p[i + 9 + k] - 48)
    out[0] = v
    return True


cdef int _check(const unsigned char *b, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t limit,
                bint check_crc, int verify_prop_crc, Py_ssize_t max_size) noexcept nogil:
    cdef Py_ssize_t end, p, body_start
    cdef int32_t size, magic, sys_flag, body_len, topic_len, props_len
    cdef int tlw
    cdef long long stored = 0
    if limit > n:
        limit = n
    if pos < 0 or limit < pos or limit - pos < 8:
        return REC_TRUNCATED
    size = ld32(b + pos)
    magic = ld32(b + pos + 4)
    if magic == BLANK_MAGIC_CODE:
        return REC_BLANK
    if magic == MESSAGE_MAGIC_CODE:
        tlw = 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        tlw = 2
    else:
        return REC_BAD_MAGIC
    if size < MIN_RECORD_SIZE or size > max_size:
        return REC_BAD_SIZE
    if size > limit - pos:
        return REC_TRUNCATED
    # from here on pos + size <= n, and every sum below stays < n + 2**32
    end = pos + size
    sys_flag = ld32(b + pos + 36)
    p = pos + 68 + (20 if sys_flag & BORNHOST_V6_FLAG else 8) + (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8)
    if p + 4 > end:
        return REC_LENGTH_MISMATCH
    body_len = ld32(b + p)
    p += 4
    if body_len < 0:
        return REC_BAD_SIZE
    if p + body_len + tlw > end:
        return REC_LENGTH_MISMATCH
    body_start = p
    p += body_len
    if tlw == 1:
        topic_len = b[p]
        if topic_len > 127:  # Java reads a signed byte
            return REC_BAD_SIZE
    else:
        topic_len = ld16(b + p)
        if topic_len < 0:
            return REC_BAD_SIZE
    p += tlw + topic_len
    if p + 2 > end:
        return REC_LENGTH_MISMATCH
    props_len = ld16(b + p)
    if props_len < 0:
        return REC_BAD_SIZE
    p += 2
    if p + props_len != end:
        return REC_LENGTH_MISMATCH
    if check_crc:
        # every RocketMQ writer ends a property blob with 0x02; without it the
        # record was cut short, which neither CRC may cover (topic, properties)
        if props_len > 0 and b[end - 1] != 2:
            return REC_TORN
        if verify_prop_crc == 1:
            if props_len < CRC32_RESERVED_LEN:
                return REC_PROP_CRC
            if not _find_crc(b + p, props_len, &stored) or \
                    stored != _crc(b + pos, size - CRC32_RESERVED_LEN):
                return REC_PROP_CRC
        else:
            if body_len > 0 and <int64_t>_crc(b + body_start, body_len) != ld32(b + pos + 8):
                return REC_BODY_CRC
            if verify_prop_crc == 2 and _tail_crc(b + p, props_len, &stored) and \
                    stored != _crc(b + pos, size - CRC32_RESERVED_LEN):
                return REC_PROP_CRC
    return size


cdef bint _tail_crc(const unsigned char *p, Py_ssize_t n, long long *out) noexcept nogil:
    """Whether the blob ends with a whole ``__CRC32#`` entry (the store's own,
    appended last); its value into *out*."""
    cdef Py_ssize_t i, t
    cdef long long v = 0
    if n < CRC32_RESERVED_LEN:
        return False
    t = n - CRC32_RESERVED_LEN
    if (t > 0 and p[t - 1] != 2) or memcmp(p + t, b"__CRC32#\x01", 9) != 0 or p[n - 1] != 2:
        return False
    for i in range(n - 2, t + 8, -1):  # digits, most significant last
        if p[i] < 48 or p[i] > 57:
            return False
        v = v * 10 + (p[i] - 48)
    out[0] = v
    return True


def check_record(buf, pos, limit, bint check_crc, int verify_prop_crc, max_size):
    """Validate the record at ``buf[pos:limit]`` (RocketMQ ``checkMessageAndReturnSize``).

    Returns the record size (> 0) for a valid message, ``REC_BLANK`` (0) for
    the END_OF_FILE record, or a negative ``REC_*`` code (see ``rmqstore.format.layout``).
    TOTALSIZE is checked against ``[MIN_RECORD_SIZE, max_size]`` and the bytes
    left before anything is read. With *check_crc*, *verify_prop_crc*
    selects what is verified: 0 the body CRC; 1 the ``__CRC32#`` property
    instead, which must be present (RocketMQ's forceVerifyPropCRC); 2 the body
    CRC and, when the record ends with the store's ``__CRC32#`` entry, that too.
    With *check_crc* a non-empty property blob must also end with 0x02
    (``REC_TORN`` otherwise).
    """
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(limit), mx = _idx(max_size)
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        return _check(<const unsigned char *>v.buf, v.len, p0, lim, check_crc, verify_prop_crc, mx)
    finally:
        PyBuffer_Release(&v)


def decode_record(buf, pos, bint with_body):
    """Decode the record at *pos*, which ``check_record`` has accepted.

    Returns ``(total_size, magic, body_crc, queue_id, flag, queue_offset,
    physical_offset, sys_flag, born_timestamp, born_host, store_timestamp,
    store_host, reconsume_times, prepared_transaction_offset, body, topic,
    properties)``: hosts as raw field bytes (address + i32 port), body as bytes
    (None unless *with_body*), topic as str, properties as the raw blob bytes.
    Raises ValueError if the record is not well formed or leaves the buffer.
    """
    cdef Py_ssize_t p0 = _idx(pos), n, end, p
    cdef const unsigned char *b
    cdef const unsigned char *h
    cdef int32_t size, magic, sys_flag, body_len, topic_len, props_len
    cdef int bw, sw
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        n = v.len
        if p0 < 0 or p0 > n - 8:
            raise ValueError(f"no record at {pos}")
        size = ld32(b + p0)
        magic = ld32(b + p0 + 4)
        if (magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2) \
                or size < MIN_RECORD_SIZE or size > n - p0:
            raise ValueError(f"no valid record at {pos}")
        sys_flag = ld32(b + p0 + 36)
        bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
        sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
        end = p0 + size
        if 72 + bw + sw > size:
            raise ValueError(f"record at {pos} is shorter than its header")
        h = b + p0 + 48 + bw  # STORETIMESTAMP
        body_len = ld32(h + 20 + sw)
        p = p0 + 72 + bw + sw
        if body_len < 0 or body_len > end - p:
            raise ValueError(f"record at {pos} has a bad body length")
        body = PyBytes_FromStringAndSize(<const char *>b + p, body_len) if with_body else None
        p += body_len
        if magic == MESSAGE_MAGIC_CODE:
            if p + 1 > end:
                raise ValueError(f"record at {pos} is truncated")
            topic_len = <signed char>b[p]
            p += 1
        else:
            if p + 2 > end:
                raise ValueError(f"record at {pos} is truncated")
            topic_len = ld16(b + p)
            p += 2
        if topic_len < 0 or p + topic_len + 2 > end:
            raise ValueError(f"record at {pos} has a bad topic length")
        topic = PyUnicode_DecodeUTF8(<const char *>b + p, topic_len, "replace")
        p += topic_len
        props_len = ld16(b + p)
        p += 2
        if props_len < 0 or p + props_len > end:
            raise ValueError(f"record at {pos} has a bad properties length")
        return (
            size, magic, ld32(b + p0 + 8), ld32(b + p0 + 12), ld32(b + p0 + 16),
            ld64(b + p0 + 20), ld64(b + p0 + 28), sys_flag, ld64(b + p0 + 40),
            PyBytes_FromStringAndSize(<const char *>b + p0 + 48, bw), ld64(h),
            PyBytes_FromStringAndSize(<const char *>h + 8, sw), ld32(h + 8 + sw),
            ld64(h + 12 + sw), body, topic,
            PyBytes_FromStringAndSize(<const char *>b + p, props_len),
        )
    finally:
        PyBuffer_Release(&v)
