# Message and MessageExt, the core's message classes.


# --- messages ---------------------------------------------------------------
#
# Message and MessageExt (declared in _core.pxd): the put path reads a
# Message's fields and the read paths fill a MessageExt's as C fields. The
# rules that are not hot (an argument that fails its check, the property map
# and blob, to_dict) are the pure module's functions, shared with the twin
# classes, so each is written once.


cdef inline bint _int_in(object v, long long lo, long long hi) noexcept:
    """Whether *v* is an exact int in [lo, hi] (the common case of
    Message's int checks; anything else goes to the pure checks)."""
    cdef long long x
    return _long_in(v, lo, hi, &x)


cdef inline bint _plain_str(object v) noexcept:
    """Whether *v* is an exact str with no \\x01 or \\x02 in it."""
    cdef Py_ssize_t n
    cdef const unsigned char *p
    if not PyUnicode_CheckExact(v):
        return False
    n = PyUnicode_GET_LENGTH(v)
    if PyUnicode_IS_COMPACT_ASCII(v):  # (most names and values: one byte per character)
        p = PyUnicode_1BYTE_DATA(v)
        return memchr(p, 1, n) == NULL and memchr(p, 2, n) == NULL
    return PyUnicode_FindChar(v, 1, 0, n, 1) == -1 and PyUnicode_FindChar(v, 2, 0, n, 1) == -1


cdef inline bint _plain_props(object props) noexcept:
    """Whether *props* is None or an exact dict of non-empty plain names to plain values."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *pk
    cdef PyObject *pv
    if props is None:
        return True
    if not PyDict_CheckExact(props):
        return False
    while PyDict_Next(props, &pos, &pk, &pv):
        if not _plain_str(<object>pk) or PyUnicode_GET_LENGTH(<object>pk) == 0 or not _plain_str(<object>pv):
            return False
    return True


# Messages come and go by the thousand per batch: out of the cycle
# collector, whose passes over them cost a batch more than its encoding. Its
# fields are str, bytes, ints and a dict of str, so a Message never closes a
# cycle; a Python subclass's own attributes are still collected.
@cython.no_gc
@cython.freelist(64)  # (a caller's loop frees one and makes the next)
cdef class Message:
    """A message to store (RocketMQ ``Message`` plus the broker-side fields).

    Message(topic, body=b"", queue_id=0, flag=0, tags=None, keys=None,
    unique_key=None, properties=None, born_timestamp=None, born_host=None,
    store_host=None, reconsume_times=0, sys_flag=0,
    prepared_transaction_offset=0, delay_level=None)

    Args:
        topic (str): non-empty, at most 127 UTF-8 bytes for v1 records; up to
            32767 bytes (written as v2) when ``auto_message_version_on_topic_len``.
        body (bytes-like): stored as given (the store never compresses).
        queue_id (int): queue within the topic, >= 0.
        flag (int): application flag, i32.
        tags (str | None): shorthand for the ``TAGS`` property.
        keys (str | list[str] | None): shorthand for ``KEYS``; a list is joined
            with single spaces, a string is stored verbatim.
        unique_key (str | None): shorthand for ``UNIQ_KEY`` (see ``new_unique_key``).
        properties (dict[str, str] | None): written in the order given; names and
            values must not contain ``\\x01``/``\\x02``. A shorthand whose name is
            also in *properties* must agree with it and keeps that position;
            other shorthands follow in the order tags, keys, unique_key,
            delay_level.
        born_timestamp (int | None): ms since epoch; None = the store clock at put.
        born_host, store_host (str | tuple | None): ``"a.b.c.d:port"`` or
            ``"[v6]:port"``; None = the store's host. IPv6 sets the V6 sysflag bits.
        reconsume_times (int): retry count, i32.
        sys_flag (int): sysflag bits (docs/format.md#sysflag-bits); V6 bits are set by the store.
        prepared_transaction_offset (int): for commit/rollback records, the
            physical offset of the prepared record.
        delay_level (int | None): shorthand for ``DELAY`` (RocketMQ's
            ``setDelayTimeLevel``), i32: a level above 0 (capped at the last
            of ``message_delay_level``) makes the put store the message in ``SCHEDULE_TOPIC_XXXX``, to
            be delivered to its topic and queue once the level's delay has
            passed (docs/service.md#delayed-delivery); 0 or below is stored
            as it is.

    Raises:
        MessageTypeError: a field has the wrong type.
        IllegalMessageError: a value is out of range or holds a separator.

    The attributes may be changed after the message is made; a put checks
    them again. The Cython core's class; ``rmqstore._pure.message.Message``
    is its pure-Python twin.
    """

    def __init__(self, topic, body=b"", queue_id=0, flag=0, tags=None, keys=None, unique_key=None,
                 properties=None, born_timestamp=None, born_host=None, store_host=None, reconsume_times=0,
                 sys_flag=0, prepared_transaction_offset=0, delay_level=None):
        # the common case checked here; anything else (an error, a list of
        # keys, a memoryview body) by the pure checks, whose errors these are
        if (PyUnicode_CheckExact(topic) and PyUnicode_GET_LENGTH(topic) > 0
                and (PyBytes_CheckExact(body) or PyByteArray_CheckExact(body))
                and _int_in(queue_id, 0, INT32_MAX) and _int_in(flag, INT32_MIN, INT32_MAX)
                and (tags is None or _plain_str(tags)) and (keys is None or _plain_str(keys))
                and (unique_key is None or _plain_str(unique_key)) and _plain_props(properties)
                and (born_timestamp is None or _int_in(born_timestamp, LLONG_MIN, LLONG_MAX))
                and _int_in(reconsume_times, INT32_MIN, INT32_MAX) and _int_in(sys_flag, INT32_MIN, INT32_MAX)
                and _int_in(prepared_transaction_offset, LLONG_MIN, LLONG_MAX)
                and (delay_level is None or _int_in(delay_level, INT32_MIN, INT32_MAX))):
            self.topic, self.body, self.queue_id, self.flag = topic, body, queue_id, flag
            self.tags, self.keys, self.unique_key, self.properties = tags, keys, unique_key, properties
            self.born_timestamp, self.born_host, self.store_host = born_timestamp, born_host, store_host
            self.reconsume_times, self.sys_flag = reconsume_times, sys_flag
            self.prepared_transaction_offset, self.delay_level = prepared_transaction_offset, delay_level
            return
        (self.topic, self.body, self.queue_id, self.flag, self.tags, self.keys, self.unique_key, self.properties,
         self.born_timestamp, self.born_host, self.store_host, self.reconsume_times, self.sys_flag,
         self.prepared_transaction_offset, self.delay_level) = _pm.message_fields(
            topic, body, queue_id, flag, tags, keys, unique_key, properties, born_timestamp, born_host,
            store_host, reconsume_times, sys_flag, prepared_transaction_offset, delay_level)

    @property
    def transaction_type(self):
        """``sys_flag & 0xC``: 0 none, 4 prepared, 8 commit, 12 rollback."""
        return self.sys_flag & 0xC

    def property_map(self):
        """The properties (dict) as they will be stored, in order
        (shorthands merged). IllegalMessageError when a shorthand and the
        same-named property disagree."""
        return _pm.property_map(self)

    def encode_properties(self, props=None):
        """The UTF-8 property blob (bytes, ``name\\x01value\\x02`` per pair)
        of *props* (default: property_map()), every name and value checked
        again. MessageTypeError, IllegalMessageError,
        PropertiesSizeExceededError."""
        return _pm.encode_properties(self, props)

    def __reduce__(self):
        return _message_of, (self.topic, self.body, self.queue_id, self.flag, self.tags, self.keys,
                             self.unique_key, self.properties, self.born_timestamp, self.born_host,
                             self.store_host, self.reconsume_times, self.sys_flag,
                             self.prepared_transaction_offset, self.delay_level)

    def __repr__(self):
        return f"Message(topic={self.topic!r}, queue_id={self.queue_id}, body={bytes(self.body[:32])!r}...)"


def _message_of(*fields):
    """A Message with *fields* (MESSAGE_FIELDS order) as they were, unchecked (unpickling)."""
    cdef Message m = Message.__new__(Message)
    (m.topic, m.body, m.queue_id, m.flag, m.tags, m.keys, m.unique_key, m.properties, m.born_timestamp,
     m.born_host, m.store_host, m.reconsume_times, m.sys_flag, m.prepared_transaction_offset,
     m.delay_level) = fields
    return m


@cython.no_gc  # (as Message: pulls make them by the thousand)
cdef class MessageExt:
    """A stored record as read back (RocketMQ ``MessageExt``).

    MessageExt(fields, properties=None): *fields* is ``decode_record``'s
    17-tuple (store_size, magic_code, body_crc, queue_id, flag,
    queue_offset, physical_offset, sys_flag, born_timestamp, raw born host,
    store_timestamp, raw store host, reconsume_times,
    prepared_transaction_offset, body, topic, properties_blob).

    Attributes: topic, body (bytes), queue_id, flag, queue_offset,
    physical_offset, sys_flag, born_timestamp / store_timestamp (ms since
    epoch), born_host / store_host (``"a.b.c.d:port"``; IPv6 as Java prints it),
    reconsume_times, prepared_transaction_offset, body_crc, store_size (record
    bytes), properties (dict in stored order, RocketMQ's decoding rules),
    msg_id (offset message id), tags, keys, unique_key (from the properties),
    magic_code. The Cython core's class; ``rmqstore._pure.message.MessageExt``
    is its pure-Python twin.
    """

    def __init__(self, tuple fields not None, properties=None):
        (self.store_size, self.magic_code, self.body_crc, self.queue_id, self.flag, self.queue_offset,
         self.physical_offset, self.sys_flag, self.born_timestamp, self._born_host, self.store_timestamp,
         self._store_host, self.reconsume_times, self.prepared_transaction_offset, self.body, self.topic,
         self.properties_blob) = fields
        self._properties = properties

    @property
    def properties(self):
        """dict: the properties in stored order (parsed on first use)."""
        if self._properties is None:
            self._properties = parse_properties(self.properties_blob)
        return self._properties

    @property
    def born_host(self):
        return _decode_host(self._born_host)

    @property
    def store_host(self):
        return _decode_host(self._store_host)

    @property
    def born_host_raw(self):
        return self._born_host

    @property
    def store_host_raw(self):
        return self._store_host

    @property
    def msg_id(self):
        """The offset msgId: raw store host + physical offset, upper-case hex."""
        h = self._store_host
        if not PyBytes_CheckExact(h) or PyBytes_GET_SIZE(h) not in (8, 20):
            return _pm.offset_msg_id(h, self.physical_offset)  # (its error)
        return _hex_id(<const unsigned char *>PyBytes_AS_STRING(h), PyBytes_GET_SIZE(h), _i64(self.physical_offset))

    @property
    def tags(self):
        return self.properties.get("TAGS")

    @property
    def keys(self):
        return self.properties.get("KEYS")

    @property
    def unique_key(self):
        return self.properties.get("UNIQ_KEY")

    @property
    def transaction_type(self):
        return self.sys_flag & 0xC

    @property
    def born_host_v6(self):
        return bool(self.sys_flag & BORNHOST_V6_FLAG)

    @property
    def store_host_v6(self):
        return bool(self.sys_flag & STOREHOSTADDRESS_V6_FLAG)

    def to_dict(self, body="base64"):
        """Every field as a dict (for JSON dumps). *body*: ``"base64"``,
        ``"text"`` (UTF-8, replacing bad bytes), ``"hex"`` or ``"none"``."""
        return _pm.ext_to_dict(self, body)

    def _stored(self):
        return (self.store_size, self.magic_code, self.body_crc, self.queue_id, self.flag, self.queue_offset,
                self.physical_offset, self.sys_flag, self.born_timestamp, self._born_host, self.store_timestamp,
                self._store_host, self.reconsume_times, self.prepared_transaction_offset, self.body, self.topic,
                self.properties_blob)

    def __eq__(self, other):
        """Equal when every stored field is equal."""
        if not isinstance(other, MessageExt):
            return NotImplemented
        return self._stored() == (<MessageExt>other)._stored()

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    __hash__ = None  # deliberately unhashable

    def __reduce__(self):
        return MessageExt, (self._stored(),)

    def __repr__(self):
        return (
            f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
            f"physical_offset={self.physical_offset}, store_size={self.store_size}, msg_id={self.msg_id!r})"
        )
