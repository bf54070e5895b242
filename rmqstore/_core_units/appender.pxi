# Appender, the put path of one writable store.
#
# Longer than the other units (about 1,050 lines) because it is one cdef
# class: Cython cannot spread a class body over files, and its methods share
# the class's C fields and its cdef methods.


cdef class Appender:
    """The put path of one writable store: ``put(msg, store_timestamp)``
    validates and encodes a :class:`~rmqstore.message.Message`, writes its
    CommitLog record, its ConsumeQueue unit and its index keys
    (``append_dispatch``'s bytes and order) and returns the
    ``PutMessageResult`` in one call (ASYNC_FLUSH). With *dispatch* False
    (SYNC_FLUSH, where RocketMQ 5.3.2+ dispatches only what is on disk) it
    writes the record alone, takes the queue offset from *queue_offsets*,
    and appends ``(topic, queue_id, queue_offset, physical_offset, size,
    sys_flag, store_timestamp, tags_code, unique_key, keys)`` to
    ``state.pending`` (adding its index entries to ``state.pending_keys``)
    for the store to dispatch once the record is flushed; it declines a
    record whose unit or index entries would not fit the bound files then
    (with what is pending before it), so that the store makes those files
    first.

    The caller binds the files a put may write, all of them the last of
    their kind, and rebinds after anything else writes them:
    ``bind_commit_log(mapped_file)`` (attributes ``mm``, ``file_from_offset``,
    ``file_size``, ``wrote_position``), ``bind_index(index_file)`` (``mm``,
    ``hash_slot_num``, ``index_num``) and, per queue, ``bind_queue(topic,
    queue_id, topic_bytes, consume_queue, mapped_file)`` (the queue's
    ``max_physic_offset``; *topic_bytes* the validated UTF-8 topic, *None*
    for *mapped_file* unbinds). ``unbind()`` drops every binding. Positions
    are read from and written back to those objects on each put, and
    *queue_offsets* (the store's ``{(topic, queue_id): next queue offset}``)
    is read and advanced, so the Python layer's view stays exact.

    The queue offset a put takes is the index of the unit it writes (the
    queue file's offset plus write position, over 20), as ConsumeQueue
    layout defines it; *queue_offsets* is advanced to match.

    ``put`` returns None, having written nothing, whenever the store's
    step-by-step path must take the message: a message whose type is not
    exactly *message_type* (a subclass may redefine attributes) or with a
    slot never set, an unbound queue or no bound
    CommitLog file, a record that does not fit the file (a roll), a full
    index file, a message with a host the store has not learnt, a DELAY
    of ``SCHEDULE_TOPIC_XXXX`` that is not a number, or anything the
    step-by-step path rejects (types, sizes, a shorthand contradicting its
    property): that path raises the typed error. It raises only for bound
    files that are not writable or smaller than their size (TypeError,
    ValueError).

    The dispatch rules are the put path's own: a transactional prepared
    or rollback record gets no ConsumeQueue unit (queue offset 0), a
    rollback no index entries; a unit of ``SCHEDULE_TOPIC_XXXX`` with a
    DELAY level above 0 gets the delivery time as its tags code (store
    time plus the level's delay from *delay_levels*, the level capped at
    the last; docs/format.md#delay-rule). ``unit_timestamp`` is the store
    time of the last record the latest put call gave a unit, -1 if none
    (the store's logics time, docs/recovery.md#checkpoint-fields).

    Not thread-safe: its callers serialize their calls (the store's append
    lock). The core keeps a call's file bytes and positions in C and writes
    the positions back when the call ends; a put made from within a call
    (by *clock*, a finalizer or a signal handler, writing to the same
    store) gets a RuntimeError.

    Args (constructor):
        message_type (type): the Message class whose instances go this way
            (the core takes only its own Message, whatever is given).
        result_type (type): a tuple subclass built as ``(ok_status, msg_id,
            physical_offset, size, queue_offset, store_timestamp)``.
        ok_status: its first field.
        store_host (bytes): raw store host field (8 bytes, 20 for IPv6).
        append_crc (bool): append the ``__CRC32#`` property.
        max_message_size (int): bodies above this many bytes go the
            step-by-step way (which refuses them).
        index_enable (bool): index UNIQ_KEY and KEYS.
        queue_offsets (dict): shared with the caller, see above.
        host_bytes (callable or None): a host string's raw field (the
            store's ``encode_host``), for messages with their own hosts.
        delay_levels (sequence of int or None): the delay in ms of each
            delay level from 1 on (``StoreConfig.message_delay_level``);
            None leaves every message of ``SCHEDULE_TOPIC_XXXX`` with a
            DELAY to the step-by-step path.
        dispatch (bool): write units and index keys with each record
            (True), or leave them to the store through *state* (False).
        state (StoreState): the store's, whose ``pending`` collection
            and ``pending_keys`` count the records left to dispatch
            (needed with *dispatch* False; TypeError without one).
    """
    # The docstrings are the twin's (_pure.Appender), as for every kernel: keep them alike.
    cdef object result_type, ok_status, store_host, queue_offsets
    cdef dict queues
    cdef bint append_crc, index_enable, untrack_results
    cdef bint entered  # inside a call (see _enter)
    cdef Py_ssize_t max_message_size
    cdef object commit_file, commit_mm
    cdef long long commit_from
    cdef Py_ssize_t commit_size
    cdef object index_mm
    cdef Py_ssize_t hsn, inum
    cdef unsigned char *scratch
    cdef Py_ssize_t scratch_cap
    cdef object tags, keys, uniq  # _encode's results for put
    cdef bytes born, store  # and its raw hosts
    cdef object host_bytes  # the store's encode_host, or None: messages with hosts go step by step
    cdef dict hosts  # host str -> its raw bytes, learnt from host_bytes (see _learn_hosts)
    cdef bint born_default
    cdef long long *delay_ms  # delay_levels, in ms by level - 1
    cdef Py_ssize_t max_delay  # how many levels
    cdef bint delays  # delay_levels given
    cdef readonly long long unit_timestamp
    cdef readonly bint dispatch
    cdef StoreState state  # the store's, for its records to dispatch (dispatch False)
    cdef long long gen  # put calls so far
    cdef _Queue touched  # the queues the current call wrote, linked by next_touched
    cdef list slots  # (topic, queue_id, _Queue) by queue id: see _bound
    # results' parts made once: the store host's hex (the msgId's first
    # part), the last store timestamp and record size as ints (a producer's
    # puts share a millisecond, its records often a size)
    cdef unsigned char host_hex[40]
    cdef long long last_ts
    cdef object last_ts_int
    cdef Py_ssize_t last_size
    cdef object last_size_int
    cdef bint offsets_exact  # queue_offsets is an exact dict

    def __cinit__(self):
        self.scratch = NULL
        self.scratch_cap = 0
        self.unit_timestamp = -1

    def __dealloc__(self):
        free(self.scratch)
        free(self.delay_ms)

    def __init__(self, message_type, result_type, ok_status, store_host, bint append_crc, max_message_size,
                 bint index_enable, queue_offsets, host_bytes=None, delay_levels=None, bint dispatch=True,
                 state=None):
        cdef Py_ssize_t i
        if not isinstance(message_type, type) or not isinstance(result_type, type) or \
                not issubclass(result_type, tuple):
            raise TypeError("message_type must be a class and result_type a tuple subclass")
        if not PyBytes_CheckExact(store_host) or len(store_host) not in (8, 20):
            raise ValueError("store_host must be the raw 8- or 20-byte host field")
        if not isinstance(queue_offsets, dict):
            raise TypeError("queue_offsets must be a dict")
        if not dispatch and not isinstance(state, StoreState):
            raise TypeError("an Appender that does not dispatch needs the store's StoreState")
        self.dispatch, self.state = dispatch, state
        # (message_type: only the core's own Message goes the fast way, whatever is given)
        self.result_type = result_type
        # results of a type without __dict__ hold ints, the msgId and the one
        # shared status: nothing a cycle can pass through (see rmq_tuple6)
        self.untrack_results = result_type.__basicsize__ == tuple.__basicsize__ and result_type.__dictoffset__ == 0
        self.ok_status = ok_status
        self.store_host = store_host
        _hex_into(self.host_hex, <const unsigned char *>PyBytes_AS_STRING(store_host), PyBytes_GET_SIZE(store_host))
        self.append_crc = append_crc
        self.max_message_size = _idx(max_message_size)
        self.index_enable = index_enable
        self.queue_offsets = queue_offsets
        self.offsets_exact = type(queue_offsets) is dict
        self.queues = {}
        self.slots = [None] * 16
        self.host_bytes = host_bytes
        self.hosts = {}
        self.commit_file = self.commit_mm = self.index_mm = None
        if delay_levels is not None:
            levels = [_i64(d) for d in delay_levels]
            free(self.delay_ms)
            self.delay_ms = <long long *>malloc((len(levels) + 1) * sizeof(long long))
            if self.delay_ms == NULL:
                raise MemoryError()
            for i in range(len(levels)):
                self.delay_ms[i] = levels[i]
            self.max_delay, self.delays = len(levels), True

    def bind_commit_log(self, mapped_file):
        """Bind the CommitLog's last ``MappedFile`` (the file a put appends
        to; reads its ``mm``, ``file_from_offset``, ``file_size`` and
        ``wrote_position``), or unbind it with None: ``put`` then returns
        None. Returns None."""
        if mapped_file is None:
            self.commit_file = self.commit_mm = None
            return
        cdef MappedRegion r = mapped_file
        self.commit_from = r.file_from_offset
        self.commit_size = r.file_size
        self.commit_mm = r.mm
        self.commit_file = mapped_file

    def bind_index(self, index_file):
        """Bind the last ``IndexFile`` (an :class:`IndexRegion`: its ``mm``,
        ``hash_slot_num``, ``index_num``), or unbind it with None. Raises
        TypeError for another type, ValueError when the mapping is smaller
        than the header, slots and entries of that geometry (or a count is
        not positive). Returns None."""
        cdef Py_buffer v
        cdef Py_ssize_t hsn, idx
        if index_file is None:
            self.index_mm = None
            return
        cdef IndexRegion r = <IndexRegion?>index_file
        mm = r.mm
        PyObject_GetBuffer(mm, &v, PyBUF_SIMPLE)
        try:
            _check_index(&v, r.hash_slot_num, r.index_num, &hsn, &idx)
        finally:
            PyBuffer_Release(&v)
        self.hsn, self.inum, self.index_mm = hsn, idx, mm

    def bind_queue(self, topic, queue_id, topic_bytes, consume_queue, mapped_file):
        """Bind the last ConsumeQueue file (*mapped_file*, a ``MappedFile``)
        of queue (*topic* str, *queue_id* int) of *consume_queue* (a
        :class:`ConsumeQueueBase`, whose ``max_physic_offset`` the puts
        advance); *topic_bytes* is the topic's validated UTF-8 (TypeError
        unless bytes). None for *mapped_file* unbinds the queue: its puts go
        the step-by-step path. Returns None."""
        cdef _Queue q
        cdef PyObject *o
        if not PyBytes_CheckExact(topic_bytes):
            raise TypeError("topic_bytes must be bytes")
        if mapped_file is not None and not isinstance(mapped_file, MappedRegion):  # (before anything changes)
            raise TypeError("mapped_file must be a MappedRegion (a MappedFile) or None")
        if mapped_file is not None and not isinstance(consume_queue, ConsumeQueueBase):
            raise TypeError("consume_queue must be a ConsumeQueueBase (a ConsumeQueue)")
        by_id = self.queues.setdefault(topic, {})
        old = by_id.pop(queue_id, None)
        if old is not None:
            (<_Queue>old).dead = True
        if mapped_file is None:
            return
        q = _Queue()
        cdef MappedRegion r = <MappedRegion>mapped_file
        q.cq, q.mf, q.mm, q.topic_b = <ConsumeQueueBase>consume_queue, r, r.mm, topic_bytes
        q.file_from = r.file_from_offset
        q.file_size = r.file_size
        q.key_h0 = _java_hash_from(0, topic + "#")
        q.key = (topic, queue_id)
        if self.offsets_exact and PyUnicode_CheckExact(topic) and PyLong_CheckExact(queue_id):
            # the queue's entry in queue_offsets re-keyed by q.key itself (the
            # same value; the dict's order means nothing): each put's write
            # back then finds its key by identity, not by comparing tuples
            o = PyDict_GetItem(self.queue_offsets, q.key)  # (a str and an int: no Python code runs)
            if o is not NULL:
                value = <object>o
                del self.queue_offsets[q.key]
                PyDict_SetItem(self.queue_offsets, q.key, value)
        q.schedule = topic == SCHEDULE_TOPIC
        by_id[queue_id] = q

    def unbind(self):
        """Drop every binding (CommitLog, index, queues): ``put`` returns
        None until the files are bound again. Returns None."""
        for by_id in self.queues.values():
            for old in by_id.values():
                (<_Queue>old).dead = True
        self.queues.clear()
        self.slots = [None] * 16
        self.commit_file = self.commit_mm = self.index_mm = None

    cdef int _grow(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap = self.scratch_cap * 2 if self.scratch_cap else 256
        cdef unsigned char *p
        while cap < need:
            cap *= 2
        p = <unsigned char *>realloc(self.scratch, cap)
        if p == NULL:
            raise MemoryError()
        self.scratch, self.scratch_cap = p, cap
        return 0

    cdef Py_ssize_t _pair(self, Py_ssize_t at, object name, object value, int plain=0) except -2:
        """Append ``name\\x01value\\x02`` (UTF-8) at *at*; -1 past the
        properties limit (the caller's step-by-step path raises then), or
        for a value (*plain* 1), or a name and a value (*plain* 2), holding a
        separator: Message refuses them, and a message's attributes may have
        been changed since it was made."""
        cdef Py_ssize_t nl, vl, end
        cdef const char *nb = _utf8(name, &nl)
        cdef const char *vb = _utf8(value, &vl)
        if plain and (memchr(vb, 1, vl) != NULL or memchr(vb, 2, vl) != NULL or
                      (plain == 2 and (memchr(nb, 1, nl) != NULL or memchr(nb, 2, nl) != NULL))):
            return -1
        end = at + nl + vl + 2
        if end > MAX_PROPERTIES_LENGTH:
            return -1
        if end > self.scratch_cap:
            self._grow(end)
        memcpy(self.scratch + at, nb, nl)
        self.scratch[at + nl] = 1
        memcpy(self.scratch + at + nl + 1, vb, vl)
        self.scratch[end - 1] = 2
        return end

    cdef _Queue _bound(self, str topic, queue_id):
        """self.queues[topic][queue_id] for an exact str *topic* and int
        *queue_id* (None when unbound), the last one found for each of 16
        queue-id slots kept by the identity of both: a producer passes the
        same objects message after message, and two dict lookups cost ~0.3k
        instructions. A rebound or unbound queue is dead, so its slot is
        found again (see _slot_hit)."""
        cdef Py_ssize_t i = PyObject_Hash(queue_id) & 15
        cdef PyObject *o
        hit = _slot_hit(self.slots, i, topic, queue_id)
        if hit is not None and not (<_Queue>hit).dead:
            return <_Queue>hit
        o = PyDict_GetItem(self.queues, topic)
        if o is NULL:
            return None
        o = PyDict_GetItem(<object>o, queue_id)
        if o is NULL:
            return None
        self.slots[i] = (topic, queue_id, <object>o)
        return <_Queue>o

    cdef _Queue _encode(self, msg, Rec *r, dict unbound=None):
        """Everything of a put that depends on the message alone: its bound
        queue (None: not for this path), the Rec fields but the offsets,
        times and body, the property blob in scratch; the tags, keys and
        unique key in self.tags/keys/uniq."""
        cdef _Queue q
        cdef PyObject *o
        cdef PyObject *pk
        cdef PyObject *pv
        cdef Py_ssize_t ppos = 0, plen = 0, nl
        cdef const char *nb
        cdef int seen = 0
        cdef PyObject *v[S_COUNT]
        cdef long long x, sys_flag, flag, reconsume, prepared, born_ts = 0
        if (self.commit_file is None and unbound is None) or type(msg) is not Message:
            return None  # (the twin's Message: step by step)
        _fields_of(<Message>msg, v)
        # v[] is borrowed: exact types only below, so that no Python code
        # (a __hash__, __index__ or __ne__) can run and replace a slot
        # (the ints: exact and in range, a queue id not negative, read without
        # an error to catch; the step-by-step path raises the message's error)
        if not PyUnicode_CheckExact(<object>v[S_TOPIC]) or \
                not _long_in(<object>v[S_QUEUE_ID], 0, INT32_MAX, &x) or \
                not _long_in(<object>v[S_SYS_FLAG], INT32_MIN, INT32_MAX, &sys_flag) or \
                not _long_in(<object>v[S_FLAG], INT32_MIN, INT32_MAX, &flag) or \
                not _long_in(<object>v[S_RECONSUME], INT32_MIN, INT32_MAX, &reconsume) or \
                not _long_in(<object>v[S_PREPARED], LLONG_MIN, LLONG_MAX, &prepared) or \
                not (<object>v[S_BORN_TS] is None or _long_in(<object>v[S_BORN_TS], LLONG_MIN, LLONG_MAX, &born_ts)):
            return None
        if not (_str_or_none(v[S_TAGS]) and _str_or_none(v[S_KEYS]) and _str_or_none(v[S_UNIQ])):
            return None
        if <object>v[S_DELAY] is not None:
            return None  # (a delay shorthand: the step-by-step path moves the message to SCHEDULE_TOPIC_XXXX)
        q = self._bound(<object>v[S_TOPIC], <object>v[S_QUEUE_ID])
        if q is None:
            if unbound is None:
                return None
            o = PyDict_GetItem(unbound, <object>v[S_TOPIC])  # (an exact str: no Python code runs)
            if o is NULL or <object>o is None:
                return None
            q = <_Queue>o
        born_raw = self.store_host if <object>v[S_BORN_HOST] is None else self._host_raw(v[S_BORN_HOST])
        store_raw = self.store_host if <object>v[S_STORE_HOST] is None else self._host_raw(v[S_STORE_HOST])
        if born_raw is None or store_raw is None:
            return None
        r.sys_flag = <int>sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
        r.queue_id = <int>x
        r.flag = <int>flag
        r.reconsume_times = <int>reconsume
        r.prepared = prepared
        self.born_default = <object>v[S_BORN_TS] is None
        r.born_timestamp = born_ts
        r.delay_level = 0
        if PyBytes_GET_SIZE(born_raw) == 20:
            r.sys_flag |= BORNHOST_V6_FLAG
        if PyBytes_GET_SIZE(store_raw) == 20:
            r.sys_flag |= STOREHOSTADDRESS_V6_FLAG
        # the properties as Message.property_map orders them, encoded
        tags, keys, uniq = <object>v[S_TAGS], <object>v[S_KEYS], <object>v[S_UNIQ]
        props = <object>v[S_PROPS]
        if props is not None:
            if not PyDict_CheckExact(props):
                return None
            while PyDict_Next(props, &ppos, &pk, &pv):
                name, value = <object>pk, <object>pv
                if not PyUnicode_CheckExact(name) or not PyUnicode_CheckExact(value):
                    return None
                try:
                    nb = _utf8(name, &nl)
                except UnicodeError:
                    return None
                if _is(nb, nl, "TAGS", 4):
                    if tags is not None and tags != value:
                        return None
                    tags, seen = value, seen | 1
                elif _is(nb, nl, "KEYS", 4):
                    if keys is not None and keys != value:
                        return None
                    keys, seen = value, seen | 2
                elif _is(nb, nl, "UNIQ_KEY", 8):
                    if uniq is not None and uniq != value:
                        return None
                    uniq, seen = value, seen | 4
                elif self.append_crc and _is(nb, nl, "__CRC32#", 8):
                    continue  # the store writes its own
                elif _is(nb, nl, "DELAY", 5):
                    if not q.schedule:
                        return None  # (a delayed message: the step-by-step path moves it to SCHEDULE_TOPIC_XXXX)
                    if not self.delays:
                        return None
                    r.delay_level = _delay_level(value, self.max_delay)
                    if r.delay_level < 0:
                        return None  # (the step-by-step path keeps the tags code, with a warning)
                try:
                    plen = -1 if nl == 0 else self._pair(plen, name, value, 2)
                except UnicodeError:
                    return None
                if plen < 0:
                    return None
        try:
            if tags is not None and not seen & 1:
                plen = self._pair(plen, "TAGS", tags, 1)
            if plen >= 0 and keys is not None and not seen & 2:
                plen = self._pair(plen, "KEYS", keys, 1)
            if plen >= 0 and uniq is not None and not seen & 4:
                plen = self._pair(plen, "UNIQ_KEY", uniq, 1)
        except (UnicodeError, TypeError):
            return None
        return None if plen < 0 else self._finish(r, self.scratch, plen, q, tags, keys, uniq, unbound is not None,
                                                  born_raw, store_raw)

    cdef bytes _host_raw(self, PyObject *h):
        """The raw host a message's born_host / store_host slot (not None:
        the caller takes the store's) stands for: the one learnt for an
        exact str (see _learn_hosts), else None (the step-by-step path
        encodes it, or raises its error). No Python code runs: the slot is
        borrowed."""
        cdef PyObject *o
        if not PyUnicode_CheckExact(<object>h):
            return None
        o = PyDict_GetItem(self.hosts, <object>h)
        return None if o is NULL else <bytes>o

    cdef int _learn_hosts(self, msg) except -1:
        """After *msg* was declined: the raw bytes of its born and store
        hosts (exact strs) not known yet, from the store's host_bytes, kept
        by host (a store sees few); 1 when it learnt one (encode the
        message again). Not within _encode: host_bytes runs Python code. A
        host it refuses is not kept: the step-by-step path raises its
        error."""
        if self.host_bytes is None or type(msg) is not Message:
            return 0
        return self._learn_host(<PyObject *>(<Message>msg).born_host) | \
            self._learn_host(<PyObject *>(<Message>msg).store_host)

    cdef int _learn_host(self, PyObject *o) except -1:
        if o is NULL or not PyUnicode_CheckExact(<object>o) or PyDict_GetItem(self.hosts, <object>o) is not NULL:
            return 0
        host = <object>o  # (a reference of our own from here on)
        try:
            raw = self.host_bytes(host)
        except Exception:
            return 0
        if PyBytes_CheckExact(raw) and (PyBytes_GET_SIZE(raw) == 8 or PyBytes_GET_SIZE(raw) == 20):
            if len(self.hosts) >= 4096:  # (bounded against endless distinct hosts)
                self.hosts.clear()
            self.hosts[host] = raw
            return 1
        return 0

    cdef _Queue _finish(self, Rec *r, const unsigned char *props, Py_ssize_t plen, _Queue q, object tags,
                        object keys, object uniq, bint checking, bytes born, bytes store):
        """The Rec fields every encoding shares, given the property blob of
        *plen* bytes at *props*, the tags, keys and unique key kept for
        _row, and the raw born and store hosts: *q*, or None where the
        step-by-step path must go (*checking*: for check_all's
        placeholders, with no index file needed)."""
        r.props = props
        r.props_len = r.props_field = plen
        r.append_crc = self.append_crc
        r.sep = r.append_crc and plen > 0 and r.props[plen - 1] != 2
        if r.append_crc:
            r.props_field += r.sep + CRC32_RESERVED_LEN
            if r.props_field > MAX_PROPERTIES_LENGTH:
                return None
        if self.index_enable and self.index_mm is None and not checking:
            return None
        r.topic = <const unsigned char *>PyBytes_AS_STRING(q.topic_b)
        r.topic_len = PyBytes_GET_SIZE(q.topic_b)
        r.v2 = r.topic_len > MAX_TOPIC_LENGTH_V1
        r.born = <const unsigned char *>PyBytes_AS_STRING(born)
        r.born_len = r.bw = PyBytes_GET_SIZE(born)
        r.store = <const unsigned char *>PyBytes_AS_STRING(store)
        r.store_len = r.sw = PyBytes_GET_SIZE(store)
        self.tags, self.keys, self.uniq, self.born, self.store = tags, keys, uniq, born, store
        return q

    cdef object _queues_of(self, topic):
        """self.queues[topic], None when unbound (or not a str at all: the
        step-by-step path then raises the row's error). PyDict_GetItem only
        sees an exact str: it would swallow another key's hash error (and
        3.13 reports that as unraisable)."""
        cdef PyObject *o
        if not PyUnicode_CheckExact(topic):
            return None
        o = PyDict_GetItem(self.queues, topic)
        return None if o is NULL else <object>o

    cdef _Queue _encode_row(self, object by_id, queue_id, tags, keys, uniq, Rec *r, _Queue unbound=None):
        """_encode for one row of put_columns: a Message(topic, body,
        queue_id=..., tags=..., keys=..., unique_key=...) of no other field;
        *by_id* the topic's bound queues (self.queues[topic], looked up once
        per call; None when it has none); *unbound* check_columns' topic
        placeholder (see _placeholder) for a queue that is not bound."""
        cdef PyObject *o
        cdef Py_ssize_t plen = 0
        cdef _Queue q
        if self.commit_file is None and unbound is None:
            return None
        if type(queue_id) is not int:
            return None  # (Message takes ints only, bools not; and an unhashable key would make the lookup fail)
        o = NULL if by_id is None else PyDict_GetItem(by_id, queue_id)
        if o is NULL:
            if unbound is None:
                return None
            q = unbound
        else:
            q = <_Queue>o
        try:
            r.queue_id = _i32(queue_id)
        except OverflowError:
            return None
        if r.queue_id < 0:
            return None
        r.sys_flag = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG if PyBytes_GET_SIZE(self.store_host) == 20 else 0
        r.flag = r.reconsume_times = 0
        r.prepared = r.born_timestamp = 0
        r.delay_level = 0
        self.born_default = True
        # the order Message.property_map gives the shorthands; what Message
        # refuses (not a str, a separator inside) goes the step-by-step way
        try:
            if tags is not None:
                if not PyUnicode_CheckExact(tags):
                    return None
                plen = self._pair(plen, "TAGS", tags, 1)
            if plen >= 0 and keys is not None:
                if not PyUnicode_CheckExact(keys):
                    return None
                plen = self._pair(plen, "KEYS", keys, 1)
            if plen >= 0 and uniq is not None:
                if not PyUnicode_CheckExact(uniq):
                    return None
                plen = self._pair(plen, "UNIQ_KEY", uniq, 1)
        except UnicodeError:
            return None
        return None if plen < 0 else self._finish(r, self.scratch, plen, q, tags, keys, uniq, unbound is not None,
                                                  self.store_host, self.store_host)

    cdef inline Py_ssize_t _size(self, Rec *r) noexcept:
        return 68 + r.bw + r.sw + 4 + r.body_len + (2 if r.v2 else 1) + r.topic_len + 2 + r.props_field

    cdef _Queue _cached(self, _Encoded enc, Py_ssize_t i, Rec *r):
        """_encode from *enc*'s entry *i*, or None when it has none or its
        queue has been rebound since (the caller then encodes afresh)."""
        cdef _Enc *e = &enc.e[i]
        if e.q == NULL or (<_Queue>e.q).dead:
            return None
        r.sys_flag, r.queue_id, r.flag, r.reconsume_times = e.sys_flag, e.queue_id, e.flag, e.reconsume_times
        r.prepared, r.born_timestamp, self.born_default = e.prepared, e.born_timestamp, e.born_default
        r.delay_level = e.delay_level
        return self._finish(r, enc.blobs + e.props_at, e.props_len, <_Queue>e.q, <object>e.tags, <object>e.keys,
                            <object>e.uniq, False, <bytes>e.born, <bytes>e.store)

    cdef _Queue _checked(self, msg, Rec *r, dict unbound=None, Py_ssize_t file_size=0):
        """_encode of a message check takes (its body fits), else None;
        the caller clears self.tags/keys/uniq. With *unbound* (check_all's
        placeholders) a record must fit *file_size* where no CommitLog file
        is bound."""
        cdef _Queue q = self._encode(msg, r, unbound)
        if q is None or not self._fits(r, <object><PyObject *>(<Message>msg).body,
                                       self.commit_size if self.commit_file is not None else file_size):
            return None
        return q

    def check(self, msg):
        """True when ``put`` takes *msg* wherever the files stand, that is:
        the message is valid and fits in an empty CommitLog file (for
        callers that validate a batch before writing any of it)."""
        cdef Rec r
        ok = self._checked(msg, &r) is not None
        if not ok and self._learn_hosts(msg):
            ok = self._checked(msg, &r) is not None
        self.tags = self.keys = self.uniq = None
        return ok

    def check_all(self, msgs, topic_bytes=None, file_size=None):
        """:meth:`check` of each message of the list *msgs* (TypeError unless
        a list): ``(the indices it refuses, in order, what it encoded)``.
        Pass the second to :meth:`put_batch` on the same list, which then
        encodes each message no second time: a message is read once, when
        checked.

        With *topic_bytes* (a callable) and *file_size* (ints; both or
        neither, else TypeError), a message is checked as if its queue and
        the CommitLog file were bound: against the topic's UTF-8 bytes as
        ``topic_bytes(topic)`` gives them (called once per topic of an
        unbound queue; anything but bytes: the store refuses the topic, and
        so does this) and a CommitLog file of *file_size* bytes. What it
        takes that way is valid (the step-by-step path would take it too),
        and put_batch encodes it afresh once its queue is bound: a batch's
        first message of a new queue goes step by step, which binds the
        queue, and the rest of that queue's messages follow in put_batch."""
        cdef list refused = []
        cdef Py_ssize_t i, size = 0
        cdef Rec r
        cdef _Queue q
        cdef dict unbound = None
        cdef _Encoded enc = _Encoded.__new__(_Encoded)
        if not PyList_CheckExact(msgs):
            raise TypeError("msgs must be a list")
        if (topic_bytes is None) != (file_size is None):
            raise TypeError("topic_bytes and file_size go together")
        enc._start(tuple(msgs), PyList_GET_SIZE(msgs), None)
        if topic_bytes is not None:
            size = _idx(file_size)
            unbound = {}
        for i in range(enc.n):
            msg = enc.of[i]
            q = self._checked(msg, &r, unbound, size)
            # a new queue's topic, or a host not seen yet: learnt, then checked again
            if q is None and ((unbound is not None and self._placeholder(msg, topic_bytes, unbound)) |
                              self._learn_hosts(msg)):
                q = self._checked(msg, &r, unbound, size)
            if q is None:
                refused.append(i)
            else:
                enc._keep(i, &r, self.born_default, q, self.tags, self.keys, self.uniq,
                          <object><PyObject *>(<Message>msg).body, self.born, self.store,
                          self._n_keys(self.keys, self.uniq, r.sys_flag))
            self.tags = self.keys = self.uniq = None
        return refused, enc

    cdef int _placeholder(self, msg, topic_bytes, dict unbound) except -1:
        """After check_all refused *msg*: when its queue (an exact str topic,
        an exact int queue id) is not bound, a placeholder for its topic in
        *unbound*, made once per topic from ``topic_bytes(topic)``: a dead
        _Queue holding the bytes the store would write (None when the store
        refuses the topic). _encode checks the message against it as if the
        queue were bound; put_batch, finding it dead, encodes the message
        afresh once the step-by-step path has bound the queue. 1 when it
        made one (check the message again). Not within _encode:
        topic_bytes runs Python code, which may not run while _encode holds
        the message's slots borrowed (nor may anything but this call see
        the placeholders: a put in another thread then would take one for
        a bound queue)."""
        cdef _Queue q
        cdef PyObject *t
        cdef PyObject *qid
        if type(msg) is not Message:
            return 0
        t, qid = <PyObject *>(<Message>msg).topic, <PyObject *>(<Message>msg).queue_id
        if t is NULL or qid is NULL or not PyUnicode_CheckExact(<object>t) or not PyLong_CheckExact(<object>qid):
            return 0
        if self._bound(<str>t, <object>qid) is not None:  # (most messages: no Python code runs)
            return 0
        topic = <object>t  # (references of our own from here on)
        if PyDict_GetItem(unbound, topic) is not NULL:
            return 0
        q = _placeholder_of(topic, topic_bytes(topic))
        unbound[topic] = q
        return q is not None

    cdef bint _fits(self, Rec *r, object body, Py_ssize_t file_size) except -1:
        """Whether the encoded record with *body* is one a put may take: a
        body within max_message_size, a record that fits an empty CommitLog
        file of *file_size* bytes."""
        cdef Py_buffer bv
        try:
            PyObject_GetBuffer(body, &bv, PyBUF_SIMPLE)
        except (TypeError, BufferError):
            return False
        r.body_len = bv.len
        PyBuffer_Release(&bv)
        r.size = self._size(r)
        return r.body_len <= self.max_message_size and r.size + 8 <= file_size

    cdef inline Py_ssize_t _n_keys(self, object keys, object uniq, int sys_flag) noexcept:
        """At most the index keys of a message (its unique key and each
        non-empty space-separated key; none when the index is off or for a
        transaction rollback), without
        reading the keys: k keys take at least 2k - 1 characters. For plan,
        where reserving room early costs nothing, and _row's room check,
        which counts exactly only near a full index file: a count per
        character would cost every put."""
        if not self.index_enable or not _gets_index_entries(<uint32_t>sys_flag):
            return 0
        return (1 if _nonempty(uniq) else 0) + ((PyUnicode_GET_LENGTH(keys) + 1) // 2 if _nonempty(keys) else 0)

    def plan(self, encoded, bint always=False):
        """What the messages *encoded* (:meth:`check_all` or
        :meth:`check_columns`' second result) need of the files, for the
        store to make every file a batch needs before it writes any of it:
        ``[total record bytes, the largest record's bytes, records,
        {(topic, queue_id): records}, index keys]`` over the messages it
        encoded (the store adds the others). None, unless *always*, when
        the bound files take them all as they stand (no roll, no new queue
        or file), as the next put call would find them; call it under the
        lock the puts take."""
        cdef _Encoded enc = _encoded(encoded)
        cdef _Enc *e
        cdef _Queue q, planned = None
        cdef Py_ssize_t i, total = 0, biggest = 0, count = 0, n_keys = 0, pos, room
        cdef bint fits = self.commit_file is not None and self.dispatch, unit  # (else: files to dispatch into)
        cdef dict counts = {}
        cdef Py_buffer ix
        cdef int32_t used
        for i in range(enc.n):
            e = &enc.e[i]
            if e.q == NULL:
                continue
            q = <_Queue>e.q
            total += e.size
            if e.size > biggest:
                biggest = e.size
            count += 1
            n_keys += e.n_keys
            unit = _gets_consume_queue_unit(<uint32_t>e.sys_flag)  # (else a transaction's: no unit)
            if q.dead:  # a placeholder (a new queue) or rebound since: its queue counted by key
                fits = False
                if unit:
                    key = (q.key, e.queue_id) if PyUnicode_CheckExact(q.key) else q.key
                    counts[key] = counts.get(key, 0) + 1
                continue
            if not unit:
                continue
            if q.planned == 0:
                q.next_planned, planned = planned, q
            q.planned += 1
        # the bound files' room, read as the next put call reads it
        while planned is not None:
            q = planned
            if fits:
                pos = (<MappedRegion?>q.mf).wrote_position
                room = (q.file_size - pos) // CQ_STORE_UNIT_SIZE if 0 < pos <= q.file_size else 0
                fits = q.planned <= room
            counts[q.key] = counts.get(q.key, 0) + q.planned
            planned, q.next_planned, q.planned = q.next_planned, None, 0
        if fits:
            pos = (<MappedRegion?>self.commit_file).wrote_position
            fits = total + 8 <= self.commit_size - pos  # END_FILE_MIN_BLANK_LENGTH
        if fits and self.index_enable and n_keys:
            if self.index_mm is None:  # (fits: dispatching)
                fits = False
            else:
                PyObject_GetBuffer(self.index_mm, &ix, PyBUF_SIMPLE)
                used = ld32(<unsigned char *>ix.buf + 36) if ix.len >= INDEX_HEADER_SIZE else <int32_t>self.inum
                PyBuffer_Release(&ix)
                fits = (used if used > 0 else 1) + n_keys <= self.inum
        if fits and not always:
            return None
        return [total, biggest, count, counts, n_keys]

    cdef void _untouch(self) noexcept:
        """Empty the list of touched queues."""
        cdef _Queue q = self.touched, nxt
        self.touched = None
        while q is not None:
            nxt = q.next_touched
            q.next_touched = None
            q = nxt

    cdef int _begin(self, _Batch *b, long long store_timestamp) except -1:
        """Start a put call: the CommitLog and index bytes, the write
        position. _end must follow (it writes the positions back)."""
        _init_view(&b.cl)
        _init_view(&b.ix)
        self.gen += 1
        self._untouch()  # (an _end that raised left its queues)
        b.ts = store_timestamp
        b.cl_pos = b.cl_pos0 = (<MappedRegion?>self.commit_file).wrote_position
        try:
            if not _get_rw(self.commit_mm, &b.cl):
                raise TypeError("a bound file is not writable")
            if b.cl.len < self.commit_size:
                raise ValueError("a bound file is smaller than its file size")
            if self.index_enable:
                if not _get_rw(self.index_mm, &b.ix):
                    raise TypeError("the bound index file is not writable")
                if b.ix.len < INDEX_HEADER_SIZE + self.hsn * INDEX_HASH_SLOT_SIZE + self.inum * INDEX_ENTRY_SIZE:
                    raise ValueError("the bound index file is smaller than its size")
        except BaseException:
            PyBuffer_Release(&b.ix)
            PyBuffer_Release(&b.cl)
            raise
        return 0

    cdef int _end(self, _Batch *b) except -1:
        """End a put call: release the bytes, write every position back into
        the store's objects (the Python layer's view stays exact)."""
        cdef _Queue q
        PyBuffer_Release(&b.ix)
        PyBuffer_Release(&b.cl)
        q = self.touched
        while q is not None:
            PyBuffer_Release(&q.buf)
            q = q.next_touched
        if b.cl_pos != b.cl_pos0:
            (<MappedRegion?>self.commit_file).wrote_position = b.cl_pos
        q = self.touched
        while q is not None:
            if q.pos != q.pos0:  # (what the call did not write stays as it was)
                (<MappedRegion?>q.mf).wrote_position = q.pos
                q.cq.max_physic_offset = q.max_phy
                if self.offsets_exact:  # (an exact tuple key: no Python code runs)
                    PyDict_SetItem(self.queue_offsets, q.key, (q.file_from + q.pos) // CQ_STORE_UNIT_SIZE)
                else:
                    self.queue_offsets[q.key] = (q.file_from + q.pos) // CQ_STORE_UNIT_SIZE
            q = q.next_touched
        self._untouch()
        return 0

    cdef bint _opens_file(self, _Queue q) except -1:
        """Whether the empty file bound for *q* takes the queue's next unit
        at its start: the store's next queue offset for the queue is the
        file's first (a new queue's first file, the file after a full one),
        so that no position in it is owed a blank unit."""
        cdef PyObject *o = PyDict_GetItem(self.queue_offsets, q.key)  # (an exact tuple key: no Python code runs)
        if o is NULL:
            return q.file_from == 0
        return PyLong_CheckExact(<object>o) and <object>o * CQ_STORE_UNIT_SIZE == q.file_from

    cdef long long _row(self, Rec *r, _Queue q, object body, _Batch *b) except -2:
        """Write, within a call, what _encode/_encode_row prepared (tags, keys, unique key in
        self.tags/keys/uniq) with *body*: record, unit, index keys. Returns
        the physical offset (r.size and r.queue_offset set), or -1 having
        written nothing."""
        cdef Py_ssize_t pos, n_keys = 0, qpos, used
        cdef long long qo = 0, phy, qmax
        cdef int32_t count
        cdef int64_t tags_code = 0
        cdef Py_buffer bv
        cdef unsigned char *u
        # the dispatch rules: a unit unless a transaction's prepared or
        # rollback record, index entries unless a rollback
        cdef bint unit = _gets_consume_queue_unit(<uint32_t>r.sys_flag)
        cdef bint indexed = self.index_enable and _gets_index_entries(<uint32_t>r.sys_flag)
        cdef bint now = self.dispatch  # (else the store dispatches once the record is flushed)
        cdef PyObject *o
        tags, keys, uniq = self.tags, self.keys, self.uniq
        self.tags = self.keys = self.uniq = None
        r.store_timestamp = b.ts
        if self.born_default:
            r.born_timestamp = b.ts
        if now and unit and q.gen != self.gen:  # the queue's first row in this call (_end releases its bytes)
            qpos = (<MappedRegion?>q.mf).wrote_position
            qmax = q.cq.max_physic_offset
            if not _get_rw(q.mm, &q.buf):
                PyBuffer_Release(&q.buf)
                raise TypeError("a bound file is not writable")
            if q.buf.len < q.file_size:
                PyBuffer_Release(&q.buf)
                raise ValueError("a bound file is smaller than its file size")
            q.pos, q.pos0, q.max_phy, q.gen = qpos, qpos, qmax, self.gen
            q.next_touched, self.touched = self.touched, q
        tags_code = _tags_hash(tags)
        if r.delay_level > 0:  # the delay rule: the delivery time
            tags_code = b.ts + self.delay_ms[r.delay_level - 1]
        if indexed:  # at most (exact for the pending count): the keys are counted only when it matters
            n_keys = self._n_keys(keys, uniq, r.sys_flag) if now else _index_keys(uniq, keys, 0, NULL, 0, 0, 0, 0)
        _init_view(&bv)
        try:
            try:
                PyObject_GetBuffer(body, &bv, PyBUF_SIMPLE)
            except (TypeError, BufferError):
                return -1
            if bv.len > self.max_message_size:
                return -1
            r.body = <const unsigned char *>bv.buf
            r.body_len = bv.len
            r.size = self._size(r)
            # where it goes: the CommitLog, the queue and the index must all take it here
            pos = b.cl_pos
            if pos < 0 or r.size + 8 > self.commit_size - pos:  # END_FILE_MIN_BLANK_LENGTH
                return -1
            phy = self.commit_from + pos
            if unit and now:
                # the next queue offset is the next unit's index, as the last file's
                # position says (queue_offsets holds the same; it is written back)
                if q.pos < 0 or q.pos > q.file_size - CQ_STORE_UNIT_SIZE or q.pos % CQ_STORE_UNIT_SIZE or \
                        q.pos == 0 and not self._opens_file(q):
                    return -1
                qo = (q.file_from + q.pos) // CQ_STORE_UNIT_SIZE
                if phy + r.size <= q.max_phy:
                    return -1
            elif unit:  # the next queue offset, as the store keeps it (an exact tuple key: no Python code runs)
                o = PyDict_GetItem(self.queue_offsets, q.key)
                if o is not NULL:
                    if not PyLong_CheckExact(<object>o):
                        return -1
                    qo = <object>o
                # its unit, written once flushed, must fit the bound file (which the units before it fill first)
                if qo * CQ_STORE_UNIT_SIZE < q.file_from or \
                        qo * CQ_STORE_UNIT_SIZE + CQ_STORE_UNIT_SIZE > q.file_from + q.file_size:
                    return -1
            if self.index_enable:  # (deferred: with the entries of the records before it)
                u = <unsigned char *>b.ix.buf
                count = ld32(u + 36)
                if count <= 0:
                    count = 1
                if not _index_takes_new(u, phy, count):
                    return -1
                used = count if now else count + self.state.pending_keys
                if used + n_keys > self.inum:
                    if not (now and indexed):  # (n_keys is exact)
                        return -1
                    n_keys = _index_keys(uniq, keys, 0, NULL, 0, 0, 0, 0)  # (the bound was too coarse)
                    if used + n_keys > self.inum:
                        return -1
            r.queue_offset = qo
            r.physical_offset = phy
            # record, unit, keys: the order a crash must find them in
            _emit(<unsigned char *>b.cl.buf + pos, r)
            if now and unit:
                u = <unsigned char *>q.buf.buf + q.pos
                st64(u, <uint64_t>phy)
                st64(u + 12, <uint64_t>tags_code)
                st32(u + 8, <uint32_t>r.size)  # size last: a torn unit is invalid
            if now and indexed:
                _index_keys(uniq, keys, q.key_h0, <unsigned char *>b.ix.buf, self.hsn, self.inum, phy,
                            r.store_timestamp)
        finally:
            PyBuffer_Release(&bv)
        b.cl_pos = pos + r.size
        if not now:  # for the store to dispatch (what a failure from here on wrote, its undo removes)
            if unit:
                self.queue_offsets[q.key] = qo + 1
            self.state.pending.append(((<tuple>q.key)[0], r.queue_id, qo, phy, r.size, r.sys_flag, b.ts,
                                       tags_code, uniq, keys))
            self.state.pending_keys += n_keys
        elif unit:
            q.pos += CQ_STORE_UNIT_SIZE
            q.max_phy = phy + r.size
            self.unit_timestamp = b.ts
        return phy

    def put(self, msg, store_timestamp):
        """Put one ``Message`` *msg* with *store_timestamp* (int, ms since
        the epoch) into the bound files: CommitLog record, ConsumeQueue unit
        and index keys. Returns its ``PutMessageResult`` (the *result_type*),
        or None, having written nothing, when the store's step-by-step path
        must take it (see the class docstring)."""
        return self._put(msg, store_timestamp, NULL)

    cdef object _put(self, msg, store_timestamp, long long *end):
        """put; *end* (when not NULL) gets the physical offset past the record."""
        self._enter()
        try:
            return self._put_in(msg, store_timestamp, end)
        finally:
            self.entered = False

    cdef object _put_in(self, msg, store_timestamp, long long *end):
        cdef long long ts
        if not _long_in(store_timestamp, LLONG_MIN, LLONG_MAX, &ts):
            try:
                ts = _i64(store_timestamp)
            except (TypeError, OverflowError):
                return None
        return self._put_at(msg, store_timestamp, ts, end)

    cdef object _put_c(self, msg, store_timestamp, long long ts, long long *end):
        """_put with *store_timestamp* (an exact int) already read into *ts*."""
        self._enter()
        try:
            return self._put_at(msg, store_timestamp, ts, end)
        finally:
            self.entered = False

    cdef object _put_at(self, msg, store_timestamp, long long ts, long long *end):
        """_put_in with *store_timestamp* (an exact int) read into *ts*."""
        cdef Rec r
        cdef _Batch b
        cdef _Queue q = self._encode(msg, &r)
        cdef long long phy
        if q is None and self._learn_hosts(msg):
            q = self._encode(msg, &r)
        if q is None:
            return None
        self._begin(&b, ts)
        try:
            phy = self._row(&r, q, <object><PyObject *>(<Message>msg).body, &b)
        finally:
            self._end(&b)
        if phy < 0:
            return None
        if end != NULL:
            end[0] = phy + r.size
        return self._result(&r, phy, store_timestamp)

    cdef int _enter(self) except -1:
        # A put call (put, put_batch, put_columns: the store makes them
        # under its append lock) uses scratch fields (an encoding's tags and
        # keys) and holds the files' bytes and write positions in C until it
        # ends: a put that Python code inside one (a finalizer, the clock)
        # starts on this Appender would write over them. The store's lock
        # is reentrant (RocketMQ's), so that put gets here: refused.
        if self.entered:
            raise RuntimeError("a put started inside another put of this store (from a finalizer, "
                               "a signal handler or the store's clock) is refused")
        self.entered = True
        self.unit_timestamp = -1
        return 0

    cdef object _result(self, Rec *r, long long phy, object ts):
        """The PutMessageResult of the record _row wrote at *phy*; *ts* the
        store timestamp as the int it was given as (r.store_timestamp)."""
        if not PyLong_CheckExact(ts):
            ts = r.store_timestamp
        if r.size != self.last_size or self.last_size_int is None:
            self.last_size, self.last_size_int = r.size, r.size
        if r.store == <const unsigned char *>PyBytes_AS_STRING(self.store_host):  # (the store's host, as a rule)
            msg_id = _hex_id_after(self.host_hex, r.store_len, phy)
        else:
            msg_id = _hex_id(r.store, r.store_len, phy)
        return rmq_tuple6(self.result_type, self.untrack_results, self.ok_status, msg_id, phy, self.last_size_int,
                          r.queue_offset, ts)

    cdef object _ts_int(self, long long t):
        """The store timestamp *t* as an int, the last one made when *t* is the same."""
        if t != self.last_ts or self.last_ts_int is None:
            self.last_ts, self.last_ts_int = t, t
        return self.last_ts_int

    def put_batch(self, msgs, start, clock, list results not None, encoded=None):
        """:meth:`put` of ``msgs[start:]`` (a list) in order, each stamped by
        one reading of *clock* (None: the wall clock, ms since the epoch)
        taken before its put, each result appended to *results*. Stops at
        the first message ``put`` declines and returns ``(its index, the
        reading it got)`` for the step-by-step path to use;
        ``(len(msgs), None)`` when none declines, ``(start, None)`` with no
        bound CommitLog file. One put call's semantics per message: the
        core holds the files' bytes once for the whole batch.

        *encoded* (None, or :meth:`check_all`'s second result for this
        list): a message still at its index whose queue is bound as it was
        when checked is written as it was encoded then; any other is
        encoded afresh. TypeError for anything else."""
        self._enter()
        try:
            return self._put_batch_in(msgs, start, clock, results, encoded)
        finally:
            self.entered = False

    cdef object _put_batch_in(self, msgs, start, clock, list results, encoded):
        cdef Rec r
        cdef _Batch b
        cdef _Queue q
        cdef _Encoded enc = None
        cdef Py_ssize_t i = _idx(start), n
        cdef long long phy, t
        cdef bint began = False
        if not PyList_CheckExact(msgs):
            raise TypeError("msgs must be a list")
        if encoded is not None:
            enc = _encoded(encoded)
        n = PyList_GET_SIZE(msgs)
        if enc is not None and (enc.topic is not None or enc.n != n):
            enc = None  # (another list's)
        if self.commit_file is None or i >= n:
            return i, None
        ts = None
        try:
            while i < n:
                msg = msgs[i]
                if clock is None:
                    t = _wall_ms()
                    ts = self._ts_int(t)
                else:
                    ts = clock()
                # check_all's encoding of the message still at this index
                q = None
                if enc is not None and <PyObject *>msg == PyTuple_GET_ITEM(enc.of, i):
                    q = self._cached(enc, i, &r)
                if q is not None:
                    body = <object>enc.e[i].body
                else:
                    q = self._encode(msg, &r)
                    if q is None and self._learn_hosts(msg):
                        q = self._encode(msg, &r)
                    body = None if q is None else <object><PyObject *>(<Message>msg).body
                if q is None:
                    break
                if clock is not None:
                    try:
                        t = _i64(ts)
                    except (TypeError, OverflowError):
                        break
                if not began:  # one call's bytes for the whole batch, once a row is sure to be written
                    self._begin(&b, t)
                    began = True
                b.ts = t
                phy = self._row(&r, q, body, &b)
                if phy < 0:
                    break
                results.append(self._result(&r, phy, ts))
                ts = None
                i += 1
        finally:
            self.tags = self.keys = self.uniq = None
            if began:
                self._end(&b)
        return i, ts

    def check_columns(self, topic, bodies, queue_ids, tags, keys, unique_keys, start, encoded=None,
                      topic_bytes=None, file_size=None):
        """:meth:`check` over rows ``start..`` of columns (lists of one length:
        *bodies* bytes-like, *queue_ids* ints, *tags*/*keys*/*unique_keys*
        None or lists of str/None), each row the Message of those fields:
        returns ``(the index of the first row check refuses, or len(bodies)
        when none; what it encoded)``. Pass the second back to go on after
        a refused row (*encoded*: this call adds to it), and then to
        :meth:`put_columns`, which encodes no row twice. TypeError for
        columns that are not such lists.

        *topic_bytes* and *file_size*: as for :meth:`check_all` (rows of an
        unbound queue checked against ``topic_bytes(topic)``, asked once per
        call for a str topic, and a CommitLog file of *file_size* bytes
        where none is bound); put_columns writes such rows once their queue
        is bound."""
        cdef Rec r
        cdef _Queue q, unbound = None
        cdef Py_ssize_t i = _idx(start), n = len(bodies), size = self.commit_size
        cdef _Encoded enc = None if encoded is None else _encoded(encoded)
        _check_columns(bodies, queue_ids, tags, keys, unique_keys)
        if (topic_bytes is None) != (file_size is None):
            raise TypeError("topic_bytes and file_size go together")
        if enc is None or not _for_columns(enc, topic, bodies, n):
            enc = _Encoded.__new__(_Encoded)
            enc._start(bodies, n, topic)
        if topic_bytes is not None:  # (rows are no message's slots: Python code may run here)
            if self.commit_file is None:
                size = _idx(file_size)
            unbound = _placeholder_of(topic, topic_bytes(topic) if PyUnicode_CheckExact(topic) else None)
        by_id = self._queues_of(topic)
        while i < n:
            q = self._encode_row(by_id, queue_ids[i], None if tags is None else tags[i],
                                 None if keys is None else keys[i],
                                 None if unique_keys is None else unique_keys[i], &r, unbound)
            body = bodies[i]
            if q is not None and _message_body(body) and self._fits(&r, body, size):
                if enc.e[i].q == NULL:
                    enc._keep(i, &r, self.born_default, q, self.tags, self.keys, self.uniq, body, self.born,
                              self.store, self._n_keys(self.keys, self.uniq, r.sys_flag))
            else:
                q = None
            self.tags = self.keys = self.uniq = None
            if q is None:
                break
            i += 1
        return i, enc

    def put_columns(self, topic, bodies, queue_ids, tags, keys, unique_keys, start, store_timestamp,
                    physical_offsets, sizes, queue_offsets, encoded=None):
        """:meth:`put` of rows ``start..`` of columns (see :meth:`check_columns`),
        all with *store_timestamp* (RocketMQ stamps a batch once), each
        result's physical offset, size and queue offset stored at its row of
        the three int64 arrays; stops at the first row ``put`` declines and
        returns its index (len(bodies) when none). ValueError for output
        arrays shorter than the columns. *encoded*: check_columns' for these
        columns (rows it kept are written as encoded then, while their queue
        is bound as it was), or None."""
        self._enter()
        try:
            return self._put_columns_in(topic, bodies, queue_ids, tags, keys, unique_keys, start, store_timestamp,
                                        physical_offsets, sizes, queue_offsets, encoded)
        finally:
            self.entered = False

    cdef object _put_columns_in(self, topic, bodies, queue_ids, tags, keys, unique_keys, start, store_timestamp,
                                physical_offsets, sizes, queue_offsets, encoded):
        cdef Rec r
        cdef _Batch b
        cdef _Queue q
        cdef _Encoded enc = None if encoded is None else _encoded(encoded)
        cdef Py_ssize_t i = _idx(start), n = len(bodies)
        cdef long long phy, ts
        cdef Py_buffer pv, sv, ov
        cdef int64_t *po
        cdef int64_t *so
        cdef int64_t *oo
        _check_columns(bodies, queue_ids, tags, keys, unique_keys)
        ts = _i64(store_timestamp)  # TypeError / OverflowError before anything
        if self.commit_file is None or (self.index_enable and self.index_mm is None) or i >= n:
            return i
        if enc is not None and not _for_columns(enc, topic, bodies, n):
            enc = None
        by_id = self._queues_of(topic)
        _init_view(&pv)
        _init_view(&sv)
        _init_view(&ov)
        PyObject_GetBuffer(physical_offsets, &pv, PyBUF_WRITABLE)
        try:
            PyObject_GetBuffer(sizes, &sv, PyBUF_WRITABLE)
            PyObject_GetBuffer(queue_offsets, &ov, PyBUF_WRITABLE)
            if pv.len < n * 8 or sv.len < n * 8 or ov.len < n * 8:
                raise ValueError("the output arrays must hold len(bodies) int64 values")
            po, so, oo = <int64_t *>pv.buf, <int64_t *>sv.buf, <int64_t *>ov.buf
            self._begin(&b, ts)
            try:
                while i < n:
                    q = None if enc is None else self._cached(enc, i, &r)  # check_columns' encoding
                    if q is not None:
                        body = <object>enc.e[i].body
                    else:
                        body = bodies[i]
                        if not _message_body(body):
                            break
                        q = self._encode_row(by_id, queue_ids[i], None if tags is None else tags[i],
                                             None if keys is None else keys[i],
                                             None if unique_keys is None else unique_keys[i], &r)
                        if q is None:
                            break
                    phy = self._row(&r, q, body, &b)
                    if phy < 0:
                        break
                    po[i], so[i], oo[i] = phy, r.size, r.queue_offset
                    i += 1
            finally:
                self._end(&b)
        finally:
            PyBuffer_Release(&ov)
            PyBuffer_Release(&sv)
            PyBuffer_Release(&pv)
        return i
