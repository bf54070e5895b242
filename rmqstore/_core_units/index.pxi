# IndexFile kernels: put one key or a message's keys, select by key.


# --- IndexFile ------------------------------------------------------------


cdef int _check_index(Py_buffer *v, Py_ssize_t hash_slot_num, Py_ssize_t index_num,
                      Py_ssize_t *hsn, Py_ssize_t *idx) except -1:
    """Validate that v holds header + slots + entries (overflow-safe)."""
    cdef Py_ssize_t rem = v.len - INDEX_HEADER_SIZE
    hsn[0] = hash_slot_num
    idx[0] = index_num
    if hsn[0] <= 0 or idx[0] <= 0 or rem < 0 or hsn[0] > rem // INDEX_HASH_SLOT_SIZE or \
            idx[0] > (rem - hsn[0] * INDEX_HASH_SLOT_SIZE) // INDEX_ENTRY_SIZE:
        need = INDEX_HEADER_SIZE + <object>hash_slot_num * INDEX_HASH_SLOT_SIZE + <object>index_num * INDEX_ENTRY_SIZE
        raise ValueError(f"index buffer of {v.len} bytes is smaller than {need}")
    return 0


cdef bint _index_put(unsigned char *b, Py_ssize_t hsn, Py_ssize_t idx, int32_t key_hash,
                     long long phy, long long ts) noexcept:
    """IndexFile.putKey on a checked, writable buffer: False when full."""
    cdef Py_ssize_t slot_pos
    cdef int32_t count, slot_value
    cdef int64_t begin_ts, time_diff
    cdef unsigned char *e
    count = ld32(b + 36)
    if count <= 0:
        count = 1
    if count >= idx:
        return False
    slot_pos = INDEX_HEADER_SIZE + (key_hash % hsn) * INDEX_HASH_SLOT_SIZE
    slot_value = ld32(b + slot_pos)
    if slot_value <= 0 or slot_value > count:
        slot_value = 0
    begin_ts = ld64(b)
    if begin_ts <= 0 or ts <= begin_ts:
        time_diff = 0  # a negative difference clamps to 0; no overflow below
    else:
        time_diff = (ts - begin_ts) // 1000
        if time_diff > 0x7FFFFFFF:
            time_diff = 0x7FFFFFFF
    e = b + INDEX_HEADER_SIZE + hsn * INDEX_HASH_SLOT_SIZE + <Py_ssize_t>count * INDEX_ENTRY_SIZE
    st32(e, <uint32_t>key_hash)
    st64(e + 4, <uint64_t>phy)
    st32(e + 12, <uint32_t>time_diff)
    st32(e + 16, <uint32_t>slot_value)
    release_fence()  # (a reader in another process that sees the slot sees its entry)
    st32(b + slot_pos, <uint32_t>count)
    if count <= 1:
        st64(b + 16, <uint64_t>phy)
        st64(b, <uint64_t>ts)
    if slot_value == 0:  # i32 counters wrap as in Java
        st32(b + 32, <uint32_t>ld32(b + 32) + 1)
    release_fence()  # (... and one that sees the count sees the slot and the begin time)
    st32(b + 36, <uint32_t>count + 1)
    st64(b + 24, <uint64_t>phy)
    st64(b + 8, <uint64_t>ts)
    return True


cdef inline int32_t _abs_hash(uint32_t h) noexcept:
    cdef int32_t v = <int32_t>h
    if v == -2147483648:
        return 0
    return -v if v < 0 else v


cdef inline bint _index_full(const unsigned char *b, Py_ssize_t idx) noexcept:
    cdef int32_t count = ld32(b + 36)
    return (count if count > 0 else 1) >= idx


cdef inline bint _index_takes_new(const unsigned char *b, long long phy, int32_t count) noexcept:
    """Whether the index file whose header is at *b* (holding *count*
    entries plus one, as the callers read it) takes the keys of a record
    being appended at CommitLog offset *phy*: one past the file's end
    physical offset (what it indexed last, or what the file before it
    did), or the store's first record at 0 into a file with no entry yet
    (a new store's first index file, whose end is 0 too)."""
    cdef long long end = ld64(b + 24)
    return phy > end or (phy == 0 and end == 0 and count == 1)


def index_put(buf, hash_slot_num, index_num, key, physical_offset, store_timestamp):
    """Put *key* into the IndexFile held in *buf* (``IndexFile.putKey``).

    Header, slot and entry are updated in place. Returns False when the file
    is full (``indexCount >= index_num``). Raises ValueError if *buf* is
    smaller than ``40 + 4*hash_slot_num + 20*index_num`` bytes.
    """
    cdef long long phy = _i64(physical_offset), ts = _i64(store_timestamp)
    cdef Py_ssize_t hsn = 0, idx = 0
    cdef int32_t key_hash
    cdef Py_buffer v
    cdef bint writable = _get_rw(buf, &v)
    try:
        _check_index(&v, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
        if _index_full(<const unsigned char *>v.buf, idx):
            return False
        key_hash = _key_hash(key)
        if not writable:
            _not_writable(buf)
        return _index_put(<unsigned char *>v.buf, hsn, idx, key_hash, phy, ts)
    finally:
        PyBuffer_Release(&v)


cdef uint32_t _check_keys(object prefix, object keys) except? 0xFFFFFFFF:
    """Every key a str (before anything is written); the hash of *prefix*."""
    if not PyList_CheckExact(keys):
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    cdef uint32_t h0 = _java_hash_from(0, prefix)
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"java_hash expects str, got {type(key).__name__}")
    return h0


def index_put_keys(buf, hash_slot_num, index_num, prefix, keys, physical_offset, store_timestamp):
    """Put ``prefix + key`` for each str in the list *keys*, in order, as
    ``index_put`` does (RocketMQ's ``topic#key`` entries of one record).
    Stops at the first key the full file refuses; returns how many
    were stored. Writes nothing and returns -1 when *physical_offset* is below
    the header's end physical offset (the record is indexed already), -2
    when equal (it may be partly indexed: the caller decides). Raises
    TypeError unless *keys* is a list of str (checked before anything is
    written), ValueError as ``index_put``."""
    cdef long long phy = _i64(physical_offset), ts = _i64(store_timestamp)
    cdef Py_ssize_t hsn = 0, idx = 0, i, n
    cdef uint32_t h0
    cdef int32_t key_hash
    cdef Py_buffer v
    h0 = _check_keys(prefix, keys)
    n = PyList_GET_SIZE(keys)
    cdef bint writable = _get_rw(buf, &v)
    cdef long long end_phy
    try:
        _check_index(&v, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
        end_phy = ld64(<const unsigned char *>v.buf + 24)
        if phy < end_phy:
            return -1
        if phy == end_phy:
            return -2
        for i in range(n):
            if _index_full(<const unsigned char *>v.buf, idx):
                return i
            key_hash = _abs_hash(_java_hash_from(h0, keys[i]))
            if not writable:
                _not_writable(buf)
            _index_put(<unsigned char *>v.buf, hsn, idx, key_hash, phy, ts)
        return n
    finally:
        PyBuffer_Release(&v)


def index_select(buf, hash_slot_num, index_num, key, max_num, begin, end, out):
    """Append to *out* the physical offsets stored for *key* whose decoded time
    lies in [begin, end], newest first (``IndexFile.selectPhyOffset``).

    Only the 32-bit key hash is compared. Stops once ``len(out) >=
    max_num``. A corrupt chain cannot loop: the walk visits at most
    ``index_num`` entries and never leaves the entry area.
    """
    cdef Py_ssize_t hsn = 0, idx = 0, i, limit = _idx(max_num)
    cdef rmq_i128 lo = _wide(begin), hi = _wide(end)
    cdef Py_buffer v
    cdef _Col found
    memset(&found, 0, sizeof(found))
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        _check_index(&v, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
        _select(<const unsigned char *>v.buf, hsn, idx, _key_hash(key), limit - len(out), lo, hi, &found)
        for i in range(found.n // 8):
            out.append((<int64_t *>found.p)[i])
    finally:
        free(found.p)
        PyBuffer_Release(&v)


cdef struct _Chain:
    # a walk down one key hash's chain of a checked IndexFile buffer, newest entry first
    const unsigned char *b
    Py_ssize_t hsn, idx, visited
    int32_t key_hash, cur, count  # cur: the entry to visit next, 0 once the chain ends
    int64_t begin_ts
    bint first_at_begin  # time the file's first entry by the header's begin time (see _chain_next)


cdef inline void _chain_start(_Chain *c, const unsigned char *b, Py_ssize_t hsn, Py_ssize_t idx, int32_t key_hash,
                              bint first_at_begin) noexcept:
    """Start *c* at the slot of *key_hash* in the IndexFile at *b* (checked)."""
    c.b, c.hsn, c.idx, c.key_hash, c.visited, c.first_at_begin = b, hsn, idx, key_hash, 0, first_at_begin
    # the slot before the count: a writer stores the count after the slot, so
    # the count read second covers the slot read first, however many puts
    # another process finishes between the two reads
    c.cur = ld32(b + INDEX_HEADER_SIZE + (key_hash % hsn) * INDEX_HASH_SLOT_SIZE)
    acquire_fence()
    c.count = ld32(b + 36)
    if c.count <= 0:
        c.count = 1
    if c.cur <= 0 or c.cur > c.count or c.count <= 1:
        c.cur = 0
    c.begin_ts = ld64(b)


cdef inline bint _chain_next(_Chain *c, rmq_i128 lo, rmq_i128 hi, int64_t *phy) noexcept:
    """The next physical offset down *c* whose entry has the key hash and a
    time in [lo, hi] (IndexFile.selectPhyOffset's test), into *phy*; False
    once the chain ends. The walk visits at most index_num entries, never
    outside [1, index_num), and ends below *lo*. With first_at_begin, entry
    1 is timed by the header's begin time, its own store time: its stored
    difference was taken from the previous file's end
    (docs/recovery.md#pitfall-index-first-entry-time)."""
    cdef const unsigned char *e
    cdef int32_t h, diff, prev
    cdef int64_t p
    cdef rmq_i128 t, tm
    while c.cur > 0 and c.visited < c.idx and c.cur < c.idx:
        c.visited += 1
        e = c.b + INDEX_HEADER_SIZE + c.hsn * INDEX_HASH_SLOT_SIZE + <Py_ssize_t>c.cur * INDEX_ENTRY_SIZE
        h = ld32(e)
        p = ld64(e + 4)
        diff = ld32(e + 12)
        prev = ld32(e + 16)
        if diff < 0:
            c.cur = 0
            return False
        t = <rmq_i128>c.begin_ts + <rmq_i128>diff * 1000
        tm = c.begin_ts if c.first_at_begin and c.cur == 1 else t
        if prev <= 0 or prev > c.count or prev == c.cur or t < lo:
            c.cur = 0
        else:
            c.cur = prev
        if h == c.key_hash and lo <= tm <= hi:
            phy[0] = p
            return True
    return False


cdef int _select(const unsigned char *b, Py_ssize_t hsn, Py_ssize_t idx, int32_t key_hash, Py_ssize_t room,
                 rmq_i128 lo, rmq_i128 hi, _Col *found) except -1:
    """IndexFile.selectPhyOffset on a checked buffer: up to *room* physical
    offsets with *key_hash* and index time in [lo, hi] added to *found*
    (int64 each), newest first."""
    cdef _Chain c
    cdef int64_t phy
    cdef Py_ssize_t added = 0
    _chain_start(&c, b, hsn, idx, key_hash, False)
    while added < room and _chain_next(&c, lo, hi, &phy):
        _put64(found, phy)
        added += 1
    return 0
