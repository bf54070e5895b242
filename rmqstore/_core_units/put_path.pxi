# The put path's helpers: queue slots and bindings, encoded columns, key
# hashing into the index, the dispatch rules, a Message's fields in C.


# --- the put path ---------------------------------------------------------


cdef inline object _slot_hit(list slots, Py_ssize_t i, object topic, object queue_id):
    """What *slots[i]* (a ``(topic, queue_id, value)`` or None) keeps for
    these very topic and queue id objects, else None: the queue caches of
    ReadGate._queue and Appender._bound, 16 slots by queue id whose strong
    references keep an identity from being reused."""
    e = slots[i]
    if e is not None and (<tuple>e)[0] is topic and (<tuple>e)[1] is queue_id:
        return (<tuple>e)[2]
    return None


cdef class _Queue:
    """A ConsumeQueue bound to an Appender: the queue, its last file and
    what stays fixed while that file is the last one."""
    cdef ConsumeQueueBase cq
    cdef object mf, mm, topic_b, key
    cdef long long file_from
    cdef Py_ssize_t file_size
    cdef uint32_t key_h0
    cdef bint schedule  # SCHEDULE_TOPIC_XXXX's: the delay rule sets its units' tags codes
    cdef bint dead  # rebound or unbound since: encodings made for it are stale
    # within one put call (gen == the Appender's): the file's bytes, its write
    # position and max physical offset, written back when the call ends
    cdef long long gen, max_phy
    cdef Py_ssize_t pos, pos0  # pos0: where the call found it
    cdef Py_buffer buf
    cdef _Queue next_touched  # the Appender's list of the queues the call wrote
    cdef Py_ssize_t planned  # Appender.plan: the call's messages for this queue
    cdef _Queue next_planned

    def __cinit__(self):
        _init_view(&self.buf)

    def __dealloc__(self):
        PyBuffer_Release(&self.buf)


cdef _Queue _placeholder_of(object topic, object topic_b):
    """check_all's and check_columns' stand-in for the unbound queues of a
    topic: a dead _Queue holding the topic (its key, for plan) and its bytes
    (put_batch / put_columns encode its messages afresh once a queue is
    bound), None unless *topic_b* is bytes (the store refuses the topic)."""
    cdef _Queue q
    if not PyBytes_CheckExact(topic_b):
        return None
    q = _Queue()
    q.topic_b, q.dead, q.key = topic_b, True, topic
    q.schedule = topic == SCHEDULE_TOPIC
    return q


cdef struct _Batch:
    # one put call's CommitLog and index bytes and CommitLog write position
    Py_buffer cl, ix
    Py_ssize_t cl_pos, cl_pos0
    long long ts


cdef struct _Enc:
    # one message as Appender.check_all encoded it (q NULL: refused); the
    # objects are strong references, so the message may change meanwhile
    PyObject *q
    PyObject *tags
    PyObject *keys
    PyObject *uniq
    PyObject *body
    PyObject *born  # the raw born and store hosts (bytes)
    PyObject *store
    long long prepared, born_timestamp
    Py_ssize_t props_at, props_len  # the property blob, in _Encoded.blobs
    Py_ssize_t size, n_keys  # the record's bytes as checked, its index keys (for plan)
    int sys_flag, queue_id, flag, reconsume_times, delay_level
    bint born_default


@cython.final
@cython.auto_pickle(False)
cdef class _Encoded:
    """What Appender.check_all encoded of one list of messages (or
    check_columns of one set of columns), for put_batch (put_columns) on the
    same: a batch's messages are encoded once."""
    cdef object of  # the list's items as checked (a tuple), or the bodies column
    cdef object topic  # the columns' topic
    cdef _Enc *e
    cdef Py_ssize_t n
    cdef unsigned char *blobs  # the property blobs, back to back
    cdef Py_ssize_t blobs_len, blobs_cap

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.e != NULL:
            for i in range(self.n):
                Py_XDECREF(self.e[i].q)
                Py_XDECREF(self.e[i].tags)
                Py_XDECREF(self.e[i].keys)
                Py_XDECREF(self.e[i].uniq)
                Py_XDECREF(self.e[i].body)
                Py_XDECREF(self.e[i].born)
                Py_XDECREF(self.e[i].store)
        free(self.e)
        free(self.blobs)

    cdef int _start(self, object of, Py_ssize_t n, object topic) except -1:
        self.of, self.topic = of, topic
        self.e = <_Enc *>calloc(n + 1, sizeof(_Enc))
        self.blobs_cap = max(256, min(n, 1 << 14) * 64)  # (room for a batch's usual blobs: no regrowing)
        self.blobs = <unsigned char *>malloc(self.blobs_cap)
        if self.e == NULL or self.blobs == NULL:
            raise MemoryError()
        self.n = n
        return 0

    cdef int _keep(self, Py_ssize_t i, Rec *r, bint born_default, _Queue q, tags, keys, uniq, body,
                   bytes born, bytes store, Py_ssize_t n_keys) except -1:
        """Entry *i* (not kept before): _encode's fields in *r*, its blob
        copied here."""
        cdef _Enc *e = &self.e[i]
        cdef Py_ssize_t cap = self.blobs_cap
        cdef unsigned char *p
        if self.blobs_len + r.props_len > cap:
            while self.blobs_len + r.props_len > cap:
                cap *= 2
            p = <unsigned char *>realloc(self.blobs, cap)
            if p == NULL:
                raise MemoryError()
            self.blobs, self.blobs_cap = p, cap
        memcpy(self.blobs + self.blobs_len, r.props, r.props_len)
        e.props_at, e.props_len = self.blobs_len, r.props_len
        self.blobs_len += r.props_len
        e.sys_flag, e.queue_id, e.flag, e.reconsume_times = r.sys_flag, r.queue_id, r.flag, r.reconsume_times
        e.delay_level = r.delay_level
        e.prepared, e.born_timestamp, e.born_default = r.prepared, r.born_timestamp, born_default
        e.size, e.n_keys = r.size, n_keys
        Py_INCREF(q)
        Py_INCREF(tags)
        Py_INCREF(keys)
        Py_INCREF(uniq)
        Py_INCREF(body)
        Py_INCREF(born)
        Py_INCREF(store)
        e.q, e.tags, e.keys, e.uniq, e.body = <PyObject *>q, <PyObject *>tags, <PyObject *>keys, \
            <PyObject *>uniq, <PyObject *>body
        e.born, e.store = <PyObject *>born, <PyObject *>store
        return 0


cdef _Encoded _encoded(object encoded):
    if type(encoded) is not _Encoded:
        raise TypeError("encoded must be what check_all or check_columns returned")
    return <_Encoded>encoded


cdef inline bint _for_columns(_Encoded enc, object topic, object bodies, Py_ssize_t n) noexcept:
    """Whether check_columns made *enc* for this topic and bodies column (of *n* rows)."""
    return enc.topic is not None and enc.topic is topic and enc.of is bodies and enc.n == n


cdef inline bint _nonempty(object s) noexcept:
    """Truth of *s*, None or an exact str (what the encoders keep)."""
    return s is not None and PyUnicode_GET_LENGTH(s) > 0


cdef inline bint _message_body(object body) noexcept:
    """Whether *body* is of a type Message takes (bytes, bytearray, memoryview)."""
    return PyBytes_CheckExact(body) or PyByteArray_CheckExact(body) or PyMemoryView_Check(body)


cdef inline bint _str_or_none(PyObject *o) noexcept:
    return o == <PyObject *>None or PyUnicode_CheckExact(<object>o)


cdef inline bint _is(const char *p, Py_ssize_t n, const char *name, Py_ssize_t m) noexcept:
    return n == m and memcmp(p, name, m) == 0


cdef inline uint32_t _unit_at(int kind, const void *data, Py_ssize_t i) noexcept:
    if kind == PyUnicode_1BYTE_KIND:
        return (<const uint8_t *>data)[i]
    if kind == PyUnicode_2BYTE_KIND:
        return (<const uint16_t *>data)[i]
    return (<const uint32_t *>data)[i]


cdef Py_ssize_t _each_key(object keys, uint32_t h0, unsigned char *ib, Py_ssize_t hsn, Py_ssize_t idx,
                          long long phy, long long ts) noexcept:
    """The non-empty space-separated keys of *keys* (a str): counted, and
    when *ib* is set, each put into the index as ``prefix + key`` (Java's
    hash continued from *h0*, the prefix's), with no substring objects."""
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(keys), count = 0
    cdef int kind = PyUnicode_KIND(keys)
    cdef const void *data = PyUnicode_DATA(keys)
    cdef uint32_t c
    cdef uint32_t h = h0
    cdef bint inside = False
    for i in range(n + 1):
        c = _unit_at(kind, data, i) if i < n else 32
        if c == 32:
            if inside:
                count += 1
                if ib != NULL:
                    _index_put(ib, hsn, idx, _abs_hash(h), phy, ts)
            inside = False
            h = h0
            continue
        inside = True
        if ib != NULL:  # (the counting pass needs no hash)
            h = _hash_char(h, c)
    return count


# --- dispatch rules (the put path's; rmqstore/dispatch.py has the same for the layers above) ---


cdef inline bint _gets_consume_queue_unit(uint32_t sys_flag) noexcept:
    """Whether a record gets a ConsumeQueue unit (docs/recovery.md#dispatch): its
    transaction type (bits 2-3) is "not a transaction" or "commit"; prepared
    and rollback records get none (RocketMQ CommitLogDispatcherBuildConsumeQueue)."""
    cdef uint32_t tran = sys_flag & TRANSACTION_MASK
    return tran == TRANSACTION_NOT_TYPE or tran == TRANSACTION_COMMIT_TYPE


cdef inline bint _gets_index_entries(uint32_t sys_flag) noexcept:
    """Whether a record is indexed under its keys (docs/format.md#building-the-index):
    every transaction type but rollback (RocketMQ IndexService.buildIndex)."""
    return sys_flag & TRANSACTION_MASK != TRANSACTION_ROLLBACK_TYPE


cdef int _delay_level(object text, Py_ssize_t max_level) except -2:
    """The delay level the DELAY property *text* (an exact str) gives a
    SCHEDULE_TOPIC_XXXX unit (docs/format.md#delay-rule): Java's
    Integer.parseInt of it capped at *max_level*, 0 for none (empty, or
    not above 0); -1 where parseInt would fail (the store's careful path
    keeps the tags code there, with a warning)."""
    cdef Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(text)
    cdef int kind = PyUnicode_KIND(text)
    cdef const void *data = PyUnicode_DATA(text)
    cdef uint32_t c
    cdef long long v = 0
    cdef bint neg = False
    if n == 0:
        return 0
    c = _unit_at(kind, data, 0)
    if c == 43 or c == 45:  # + -
        neg, i = c == 45, 1
    if i == n:
        return -1
    while i < n:
        c = _unit_at(kind, data, i)
        if c < 48 or c > 57:
            return -1
        v = v * 10 + (c - 48)
        if v > 0x80000000:
            return -1
        i += 1
    if neg:
        v = -v
    if v > 0x7FFFFFFF:
        return -1
    if v > max_level:
        v = max_level
    return <int>v if v > 0 else 0


cdef inline int64_t _tags_hash(object tags) noexcept:
    """The tags code outside SCHEDULE_TOPIC_XXXX (docs/format.md#tags-code): Java's
    hash of *tags* (None or a str: nothing to fail on), 0 for None or ""."""
    if _nonempty(tags):
        return <int32_t>_java_hash_from(0, tags)
    return 0


cdef inline Py_ssize_t _index_keys(object uniq, object keys, uint32_t h0, unsigned char *ib, Py_ssize_t hsn,
                                   Py_ssize_t idx, long long phy, long long ts) noexcept:
    """The keys a record is indexed under (docs/format.md#building-the-index): its
    unique key *uniq*, then each non-empty space-separated piece of *keys*
    (None or exact str each: nothing to fail on); counted, and when *ib* is
    set, each put into the index (hashes continued from *h0*, the ``topic#``
    prefix's). noexcept, as _tags_hash: an error check per put costs
    instructions the put path does not need."""
    cdef Py_ssize_t n = 0
    if _nonempty(uniq):
        n = 1
        if ib != NULL:
            _index_put(ib, hsn, idx, _abs_hash(_java_hash_from(h0, uniq)), phy, ts)
    if _nonempty(keys):
        n += _each_key(keys, h0, ib, hsn, idx, phy, ts)
    return n


def gets_consume_queue_unit(sys_flag):
    """Whether a record with SYSFLAG *sys_flag* (an int) gets a ConsumeQueue
    unit: its transaction type is "not a transaction" or "commit" (RocketMQ
    ``CommitLogDispatcherBuildConsumeQueue``). TypeError unless an int."""
    return _gets_consume_queue_unit(<uint32_t>(PyNumber_Index(sys_flag) & 0xFFFFFFFF))


def gets_index_entries(sys_flag):
    """Whether a record with SYSFLAG *sys_flag* (an int) is indexed under
    its keys: every transaction type but rollback, prepared records
    included (RocketMQ ``IndexService.buildIndex``). TypeError unless an int."""
    return _gets_index_entries(<uint32_t>(PyNumber_Index(sys_flag) & 0xFFFFFFFF))


def delay_level(text, max_level):
    """The delay level a DELAY property *text* (a str) gives a unit of
    ``SCHEDULE_TOPIC_XXXX``: Java's ``Integer.parseInt`` of it, capped at
    *max_level* (an int >= 0, the number of levels); 0 for none (empty, or
    not above 0); -1 where parseInt fails (RocketMQ
    ``CommitLog.checkMessageAndReturnSize``). TypeError unless a str."""
    cdef Py_ssize_t m = PyNumber_Index(max_level)
    if not isinstance(text, str):
        raise TypeError(f"DELAY must be a str, got {type(text).__name__}")
    if m < 0:
        raise ValueError("max_level must be >= 0")
    return _delay_level(str(text), m)


def tags_hash(tags):
    """The tags code of a unit outside ``SCHEDULE_TOPIC_XXXX``:
    ``java_hash(tags)`` for a non-empty str, 0 for None or "" (RocketMQ
    ``MessageExtBrokerInner.tagsString2tagsCode``). TypeError otherwise."""
    if tags is not None and not isinstance(tags, str):
        raise TypeError(f"java_hash expects str, got {type(tags).__name__}")
    return _tags_hash(tags)


cdef char _HEX_PAIRS[512]  # byte b -> its two upper-case hex digits at 2 * b


cdef int _fill_hex_pairs() except -1:
    cdef int b
    for b in range(256):
        _HEX_PAIRS[2 * b] = b"0123456789ABCDEF"[b >> 4]
        _HEX_PAIRS[2 * b + 1] = b"0123456789ABCDEF"[b & 15]
    return 0


_fill_hex_pairs()


cdef inline void _hex_into(unsigned char *out, const unsigned char *raw, Py_ssize_t n) noexcept:
    """The upper-case hex of *n* bytes at *raw* into *out* (2 * n bytes)."""
    cdef Py_ssize_t i
    for i in range(n):
        memcpy(out + 2 * i, &_HEX_PAIRS[2 * raw[i]], 2)


cdef object _hex_id(const unsigned char *h, Py_ssize_t hn, long long phy):
    """Offset msgId: upper-case hex of the raw store host (*hn*: 8 or 20
    bytes at *h*) + big-endian offset (a digit pair per byte: one copy of
    two bytes, not two lookups and shifts)."""
    cdef unsigned char raw[36]
    cdef object s
    memcpy(raw, h, hn)
    st64(raw + hn, <uint64_t>phy)
    s = PyUnicode_New(2 * (hn + 8), 127)
    _hex_into(PyUnicode_1BYTE_DATA(s), raw, hn + 8)
    return s


cdef object _hex_id_after(const unsigned char *host_hex, Py_ssize_t hn, long long phy):
    """_hex_id with the host's hex already made (*host_hex*, 2 * *hn*
    characters): the store's own host, the same on every put."""
    cdef unsigned char raw[8]
    cdef object s
    cdef unsigned char *out
    st64(raw, <uint64_t>phy)
    s = PyUnicode_New(2 * (hn + 8), 127)
    out = PyUnicode_1BYTE_DATA(s)
    memcpy(out, host_hex, 2 * hn)
    _hex_into(out + 2 * hn, raw, 8)
    return s


cdef enum:
    S_TOPIC, S_BODY, S_QUEUE_ID, S_FLAG, S_TAGS, S_KEYS, S_UNIQ, S_PROPS, S_BORN_TS, S_BORN_HOST, \
        S_STORE_HOST, S_RECONSUME, S_SYS_FLAG, S_PREPARED, S_DELAY, S_COUNT


cdef inline void _fields_of(Message m, PyObject **v) noexcept:
    """*m*'s fields, borrowed, in the S_* order."""
    v[S_TOPIC], v[S_BODY], v[S_QUEUE_ID], v[S_FLAG] = <PyObject *>m.topic, <PyObject *>m.body, \
        <PyObject *>m.queue_id, <PyObject *>m.flag
    v[S_TAGS], v[S_KEYS], v[S_UNIQ], v[S_PROPS] = <PyObject *>m.tags, <PyObject *>m.keys, \
        <PyObject *>m.unique_key, <PyObject *>m.properties
    v[S_BORN_TS], v[S_BORN_HOST], v[S_STORE_HOST] = <PyObject *>m.born_timestamp, <PyObject *>m.born_host, \
        <PyObject *>m.store_host
    v[S_RECONSUME], v[S_SYS_FLAG], v[S_PREPARED] = <PyObject *>m.reconsume_times, <PyObject *>m.sys_flag, \
        <PyObject *>m.prepared_transaction_offset
    v[S_DELAY] = <PyObject *>m.delay_level
