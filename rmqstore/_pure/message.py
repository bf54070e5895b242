"""The pure-Python ``Message`` and ``MessageExt``: the twin of the core's
classes of the same names (``rmqstore/_core.pyx``), same fields, methods and
errors. :mod:`rmqstore.message` exports the live implementation's pair.
"""

from __future__ import annotations

from typing import NoReturn

from ..exceptions import IllegalMessageError, MessageTypeError, PropertiesSizeExceededError
from ..format.ids import decode_host, offset_msg_id
from ..format.layout import (
    BORNHOST_V6_FLAG,
    KEY_SEPARATOR,
    MAX_PROPERTIES_LENGTH,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_MASK,
)

__all__ = ["Message", "MessageExt"]

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _check_int(name, value, bounds=_INT32, minimum=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise MessageTypeError(f"{name} must be an int, got {type(value).__name__}")
    lo, hi = bounds
    if minimum is not None:
        lo = minimum
    if not lo <= value <= hi:
        raise IllegalMessageError(f"{name}={value} is out of range [{lo}, {hi}]")
    return value


def _check_str(name, value):
    if not isinstance(value, str):
        raise MessageTypeError(f"{name} must be a str, got {type(value).__name__}")
    if "\x01" in value or "\x02" in value:
        raise IllegalMessageError(f"{name} must not contain \\x01 or \\x02: {value!r}")
    return value


# the fields of a Message, in the order message_fields() gives them
MESSAGE_FIELDS = (
    "topic", "body", "queue_id", "flag", "tags", "keys", "unique_key", "properties",
    "born_timestamp", "born_host", "store_host", "reconsume_times", "sys_flag",
    "prepared_transaction_offset", "delay_level",
)


def message_fields(
    topic,
    body=b"",
    queue_id=0,
    flag=0,
    tags=None,
    keys=None,
    unique_key=None,
    properties=None,
    born_timestamp=None,
    born_host=None,
    store_host=None,
    reconsume_times=0,
    sys_flag=0,
    prepared_transaction_offset=0,
    delay_level=None,
) -> tuple:
    """Message's arguments checked, in MESSAGE_FIELDS order (a list of keys
    joined, a memoryview body cast to bytes). Both implementations of
    Message raise these errors (the core checks the common case in C and
    comes here for anything else)."""
    if not isinstance(topic, str):
        raise MessageTypeError(f"topic must be a str, got {type(topic).__name__}")
    if not topic:
        raise IllegalMessageError("topic must not be empty")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise MessageTypeError(f"body must be bytes-like, got {type(body).__name__}")
    if isinstance(body, memoryview):
        if not body.c_contiguous:
            raise MessageTypeError("a memoryview body must be C-contiguous")
        if body.ndim != 1 or body.format != "B":
            body = body.cast("B")  # so len() counts bytes, not items
    queue_id = _check_int("queue_id", queue_id, minimum=0)
    flag = _check_int("flag", flag)
    tags = None if tags is None else _check_str("tags", tags)
    if keys is not None and not isinstance(keys, str):
        if not isinstance(keys, (list, tuple)):
            raise MessageTypeError(f"keys must be a str or a list of str, got {type(keys).__name__}")
        for k in keys:
            _check_str("key", k)
        keys = KEY_SEPARATOR.join(keys)
    keys = None if keys is None else _check_str("keys", keys)
    unique_key = None if unique_key is None else _check_str("unique_key", unique_key)
    if properties is not None:
        if not isinstance(properties, dict):
            raise MessageTypeError(f"properties must be a dict, got {type(properties).__name__}")
        for name, value in properties.items():
            _check_str("property name", name)
            _check_str(f"property {name!r}", value)
            if not name:
                raise IllegalMessageError("property names must not be empty")
    born_timestamp = None if born_timestamp is None else _check_int("born_timestamp", born_timestamp, _INT64)
    reconsume_times = _check_int("reconsume_times", reconsume_times)
    sys_flag = _check_int("sys_flag", sys_flag)
    prepared_transaction_offset = _check_int(
        "prepared_transaction_offset", prepared_transaction_offset, _INT64
    )
    delay_level = None if delay_level is None else _check_int("delay_level", delay_level)
    return (topic, body, queue_id, flag, tags, keys, unique_key, properties, born_timestamp, born_host, store_host,
            reconsume_times, sys_flag, prepared_transaction_offset, delay_level)


class Message:
    """A message to store (RocketMQ ``Message`` plus the broker-side fields).

    Args:
        topic (str): non-empty, at most 127 UTF-8 bytes for v1 records; up to
            32767 bytes (written as v2) when ``auto_message_version_on_topic_len``.
        body (bytes-like): stored as given (the store never compresses).
        queue_id (int): queue within the topic, >= 0.
        flag (int): application flag, i32.
        tags (str | None): shorthand for the ``TAGS`` property.
        keys (str | list[str] | None): shorthand for ``KEYS``; a list is joined
            with single spaces, a string is stored verbatim.
        unique_key (str | None): shorthand for ``UNIQ_KEY`` (see :func:`new_unique_key`).
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
            ``setDelayTimeLevel``), i32: a level above 0 (capped at the last of ``message_delay_level``)
            makes the put store the message in ``SCHEDULE_TOPIC_XXXX``, to
            be delivered to its topic and queue once the level's delay has
            passed (docs/service.md#delayed-delivery); 0 or below is stored
            as it is.

    Raises:
        MessageTypeError: a field has the wrong type.
        IllegalMessageError: a value is out of range or holds a separator.
    """

    __slots__ = MESSAGE_FIELDS

    def __init__(
        self,
        topic: str,
        body=b"",
        queue_id: int = 0,
        flag: int = 0,
        tags=None,
        keys=None,
        unique_key=None,
        properties=None,
        born_timestamp=None,
        born_host=None,
        store_host=None,
        reconsume_times: int = 0,
        sys_flag: int = 0,
        prepared_transaction_offset: int = 0,
        delay_level=None,
    ):
        (
            self.topic, self.body, self.queue_id, self.flag, self.tags, self.keys, self.unique_key, self.properties,
            self.born_timestamp, self.born_host, self.store_host, self.reconsume_times, self.sys_flag,
            self.prepared_transaction_offset, self.delay_level,
        ) = message_fields(
            topic, body, queue_id, flag, tags, keys, unique_key, properties, born_timestamp, born_host, store_host,
            reconsume_times, sys_flag, prepared_transaction_offset, delay_level,
        )

    @property
    def transaction_type(self) -> int:
        """``sys_flag & 0xC``: 0 none, 4 prepared, 8 commit, 12 rollback."""
        return self.sys_flag & TRANSACTION_MASK

    def property_map(self) -> dict:
        """The properties as they will be stored, in order (shorthands merged)."""
        return property_map(self)

    def encode_properties(self, props: dict | None = None) -> bytes:
        """The UTF-8 property blob of *props* (default: :meth:`property_map`);
        see :func:`encode_properties` for the checks and errors."""
        return encode_properties(self, props)

    def __repr__(self):
        return f"Message(topic={self.topic!r}, queue_id={self.queue_id}, body={bytes(self.body[:32])!r}...)"


def property_map(msg) -> dict:
    """*msg*'s properties as they will be stored, in order (shorthands merged)."""
    props = dict(msg.properties) if msg.properties else {}
    # unrolled: this runs once per put
    value = msg.tags
    if value is not None and props.setdefault(PROPERTY_TAGS, value) != value:
        _twice(PROPERTY_TAGS, props[PROPERTY_TAGS], value)
    value = msg.keys
    if value is not None and props.setdefault(PROPERTY_KEYS, value) != value:
        _twice(PROPERTY_KEYS, props[PROPERTY_KEYS], value)
    value = msg.unique_key
    if value is not None and props.setdefault(PROPERTY_UNIQ_KEY, value) != value:
        _twice(PROPERTY_UNIQ_KEY, props[PROPERTY_UNIQ_KEY], value)
    level = msg.delay_level
    if level is not None:
        value = str(_check_int("delay_level", level))
        if props.setdefault(PROPERTY_DELAY, value) != value:
            _twice(PROPERTY_DELAY, props[PROPERTY_DELAY], value)
    return props


def encode_properties(msg, props: dict | None = None) -> bytes:
    """*msg*'s UTF-8 property blob (``name\x01value\x02`` per pair) of *props*
    (default: :meth:`property_map`). Every name and value is checked
    again here, as the message's attributes may have been changed since
    it was made: MessageTypeError for a name or value that is not a str,
    IllegalMessageError for an empty name, a separator inside, or a
    string with no UTF-8 form (a lone surrogate);
    PropertiesSizeExceededError above 32767 bytes."""
    if props is None:
        props = msg.property_map()
    for name, value in props.items():
        _check_str("property name", name)
        _check_str(f"property {name!r}", value)
        if not name:
            raise IllegalMessageError("property names must not be empty")
    try:
        blob = "".join([f"{k}\x01{v}\x02" for k, v in props.items()]).encode("utf-8")
    except UnicodeEncodeError:
        bad = next(t for kv in props.items() for t in kv if not _encodable(t))
        raise IllegalMessageError(f"property name or value {bad!r} has no UTF-8 form (a lone surrogate)") from None
    if len(blob) > MAX_PROPERTIES_LENGTH:
        raise PropertiesSizeExceededError(
            f"properties of {len(blob)} bytes exceed {MAX_PROPERTIES_LENGTH}"
        )
    return blob


def _encodable(text: str) -> bool:
    """Whether *text* has a UTF-8 form (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _twice(name: str, old: str, value: str) -> NoReturn:
    raise IllegalMessageError(f"{name} given twice with different values: {old!r} and {value!r}")


def ext_to_dict(ext, body: str = "base64") -> dict:
    """Plain dict of every field (for JSON dumps). *body*: ``"base64"``,
    ``"text"`` (UTF-8, replacing bad bytes), ``"hex"`` or ``"none"``."""
    import base64

    d = {
        "physical_offset": ext.physical_offset,
        "store_size": ext.store_size,
        "topic": ext.topic,
        "queue_id": ext.queue_id,
        "queue_offset": ext.queue_offset,
        "msg_id": ext.msg_id,
        "flag": ext.flag,
        "sys_flag": ext.sys_flag,
        "born_timestamp": ext.born_timestamp,
        "born_host": ext.born_host,
        "store_timestamp": ext.store_timestamp,
        "store_host": ext.store_host,
        "reconsume_times": ext.reconsume_times,
        "prepared_transaction_offset": ext.prepared_transaction_offset,
        "body_crc": ext.body_crc,
        "tags": ext.tags,
        "keys": ext.keys,
        "unique_key": ext.unique_key,
        "properties": ext.properties,
    }
    if body == "base64":
        d["body"] = base64.b64encode(ext.body).decode("ascii")
    elif body == "text":
        d["body"] = ext.body.decode("utf-8", "replace")
    elif body == "hex":
        d["body"] = ext.body.hex()
    return d


class MessageExt:
    """A stored record as read back (RocketMQ ``MessageExt``).

    Attributes: topic, body (bytes), queue_id, flag, queue_offset,
    physical_offset, sys_flag, born_timestamp / store_timestamp (ms since
    epoch), born_host / store_host (``"a.b.c.d:port"``; IPv6 as Java prints it),
    reconsume_times, prepared_transaction_offset, body_crc, store_size (record
    bytes), properties (dict in stored order, RocketMQ's decoding rules),
    msg_id (offset message id), tags, keys, unique_key (from the properties),
    magic_code.
    """

    __slots__ = (
        "store_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
        "sys_flag", "born_timestamp", "_born_host", "store_timestamp", "_store_host", "reconsume_times",
        "prepared_transaction_offset", "body", "topic", "properties_blob", "_properties",
    )

    def __init__(self, fields: tuple, properties=None):
        (
            self.store_size, self.magic_code, self.body_crc, self.queue_id, self.flag, self.queue_offset,
            self.physical_offset, self.sys_flag, self.born_timestamp, self._born_host, self.store_timestamp,
            self._store_host, self.reconsume_times, self.prepared_transaction_offset, self.body, self.topic,
            self.properties_blob,
        ) = fields
        self._properties = properties

    @property
    def properties(self) -> dict:
        if self._properties is None:
            from . import parse_properties  # (_pure imports this module)

            self._properties = parse_properties(self.properties_blob)
        return self._properties

    @property
    def born_host(self) -> str:
        return decode_host(self._born_host)

    @property
    def store_host(self) -> str:
        return decode_host(self._store_host)

    @property
    def born_host_raw(self) -> bytes:
        return self._born_host

    @property
    def store_host_raw(self) -> bytes:
        return self._store_host

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self._store_host, self.physical_offset)

    @property
    def tags(self):
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self):
        return self.properties.get(PROPERTY_KEYS)

    @property
    def unique_key(self):
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & TRANSACTION_MASK

    @property
    def born_host_v6(self) -> bool:
        return bool(self.sys_flag & BORNHOST_V6_FLAG)

    @property
    def store_host_v6(self) -> bool:
        return bool(self.sys_flag & STOREHOSTADDRESS_V6_FLAG)

    def to_dict(self, body: str = "base64") -> dict:
        """Plain dict of every field (for JSON dumps). *body*: ``"base64"``,
        ``"text"`` (UTF-8, replacing bad bytes), ``"hex"`` or ``"none"``."""
        return ext_to_dict(self, body)

    def _stored(self) -> tuple:
        return (
            self.store_size, self.magic_code, self.body_crc, self.queue_id, self.flag, self.queue_offset,
            self.physical_offset, self.sys_flag, self.born_timestamp, self._born_host, self.store_timestamp,
            self._store_host, self.reconsume_times, self.prepared_transaction_offset, self.body, self.topic,
            self.properties_blob,
        )

    def __eq__(self, other):
        """Equal when every stored field is equal."""
        if not isinstance(other, MessageExt):
            return NotImplemented
        return self._stored() == other._stored()

    __hash__ = None  # type: ignore[assignment]  # deliberately unhashable

    def __repr__(self):
        return (
            f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
            f"physical_offset={self.physical_offset}, store_size={self.store_size}, msg_id={self.msg_id!r})"
        )
