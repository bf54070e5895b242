"""Messages, put/get results and identifiers (docs/format.md#commitlog-record, docs/format.md#message-ids).

``Message`` is what a producer hands to :meth:`MessageStore.put_message`;
``MessageExt`` is a stored record as read back (RocketMQ's ``MessageExt``).
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import os
import random
import socket
import struct
import threading
import time
from typing import Any, NamedTuple, NoReturn

from ._layout import (
    BORNHOST_V6_FLAG,
    KEY_SEPARATOR,
    MAX_PROPERTIES_LENGTH,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_MASK,
)
from .exceptions import IllegalMessageError, MessageTypeError, PropertiesSizeExceededError

__all__ = [
    "Message",
    "MessageExt",
    "PutMessageStatus",
    "GetMessageStatus",
    "PutMessageResult",
    "GetMessageResult",
    "GetColumnsResult",
    "PutColumnsResult",
    "encode_host",
    "decode_host",
    "offset_msg_id",
    "decode_offset_msg_id",
    "new_unique_key",
]

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class PutMessageStatus(enum.Enum):
    """Outcome of a put (RocketMQ ``PutMessageStatus``). Bad input raises
    instead of returning MESSAGE_ILLEGAL / PROPERTIES_SIZE_EXCEEDED."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(enum.Enum):
    """Outcome of a pull (RocketMQ ``GetMessageStatus``)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class PutMessageResult(NamedTuple):
    """Result of one put. ``wrote_offset`` is the record's physical offset,
    ``wrote_bytes`` its size, ``store_timestamp`` ms since epoch, ``msg_id`` the
    offset message id (docs/format.md#offset-msgid)."""

    status: PutMessageStatus
    msg_id: str
    wrote_offset: int
    wrote_bytes: int
    queue_offset: int
    store_timestamp: int


class GetMessageResult(NamedTuple):
    """Result of a pull: the messages found and the queue offsets to go on from."""

    status: GetMessageStatus
    messages: list
    next_begin_offset: int
    min_offset: int
    max_offset: int


class PutColumnsResult(NamedTuple):
    """Result of a columnar put (:meth:`MessageStore.put_message_columns`):
    one row per message, in the order given. ``physical_offsets``,
    ``sizes`` (record bytes) and ``queue_offsets`` are numpy int64 arrays;
    ``store_timestamp`` (ms since epoch) is the batch's one store time. A
    message's offset msgId is ``offset_msg_id(store_host_raw,
    physical_offset)``."""

    status: PutMessageStatus
    physical_offsets: object
    sizes: object
    queue_offsets: object
    store_timestamp: int


class GetColumnsResult(NamedTuple):
    """Result of a columnar pull (:meth:`MessageStore.get_message_columns`):
    ``columns`` is ``decode_columns``' dict of numpy arrays, one row per
    message found (see :mod:`rmqstore._pure`), and the queue offsets as for
    :class:`GetMessageResult`."""

    status: GetMessageStatus
    columns: dict
    next_begin_offset: int
    min_offset: int
    max_offset: int


class GetViewsResult(NamedTuple):
    """Result of a zero-copy pull (:meth:`MessageStore.get_message_views`).

    ``buffer`` is a read-only memoryview of the one CommitLog segment that
    holds the messages (None when there are none); ``units`` a numpy
    structured array, one row per message, with int64 fields
    ``queue_offset``, ``physical_offset``, ``store_timestamp`` (ms),
    ``tags_code``, ``body_offset`` (bytes into ``buffer``) and int32
    ``body_length``, ``store_size``. Message *i*'s body is
    ``buffer[body_offset : body_offset + body_length]``. The buffer pins the
    mapping: it stays readable after clean-up deletes the file or the store
    closes, until the last view of it is released. Status and offsets are
    those of :class:`GetMessageResult`."""

    status: GetMessageStatus
    buffer: Any
    units: Any
    next_begin_offset: int
    min_offset: int
    max_offset: int

    def bodies(self) -> list:
        """The bodies as memoryviews of ``buffer`` (one object each: the
        columns are the fast way)."""
        buf = self.buffer
        if buf is None:
            return []
        return [buf[o : o + n] for o, n in zip(self.units["body_offset"].tolist(), self.units["body_length"].tolist())]


# --- hosts and ids ---------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def encode_host(host) -> bytes:
    """Raw host field for ``"a.b.c.d:port"``, ``"[v6]:port"`` or ``(address, port)``:
    address bytes (4 or 16) + big-endian i32 port. Raises IllegalMessageError."""
    if isinstance(host, tuple) and len(host) == 2:
        addr, port = host
    elif isinstance(host, str):
        if host.startswith("["):
            addr, sep, port = host[1:].partition("]:")
        else:
            addr, sep, port = host.rpartition(":")
        if not sep:
            raise IllegalMessageError(f"host {host!r} is not 'address:port'")
    else:
        raise MessageTypeError(f"host must be 'address:port' or (address, port), got {type(host).__name__}")
    try:
        ip = ipaddress.ip_address(str(addr).split("%", 1)[0])
        port = int(port)
    except ValueError:
        raise IllegalMessageError(f"bad host {host!r}") from None
    if not _INT32[0] <= port <= _INT32[1]:
        raise IllegalMessageError(f"bad port in host {host!r}")
    return ip.packed + struct.pack(">i", port)


@functools.lru_cache(maxsize=1024)
def decode_host(raw: bytes) -> str:
    """``"a.b.c.d:port"`` or, for IPv6, Java's uncompressed ``"[2001:db8:0:0:0:0:0:7]:port"``."""
    port = struct.unpack(">i", raw[-4:])[0]
    addr = raw[:-4]
    if len(addr) == 4:
        return f"{addr[0]}.{addr[1]}.{addr[2]}.{addr[3]}:{port}"
    groups = struct.unpack(">8H", addr)
    return "[" + ":".join(f"{g:x}" for g in groups) + f"]:{port}"


def offset_msg_id(store_host_raw: bytes, physical_offset: int) -> str:
    """Offset message id (docs/format.md#offset-msgid): store host address + port + physical offset, upper-case hex."""
    return (store_host_raw + struct.pack(">q", physical_offset)).hex().upper()


def _split_offset_msg_id(msg_id) -> tuple:
    """``(raw store host, physical_offset)`` of an offset message id: 32 or
    56 hex digits in either case, nothing else. Raises ValueError."""
    if not isinstance(msg_id, str) or len(msg_id) not in (32, 56):
        raise ValueError(f"not an offset message id: {msg_id!r}")
    raw = bytes.fromhex(msg_id)
    if len(raw) * 2 != len(msg_id):  # (fromhex skips whitespace)
        raise ValueError(f"not an offset message id: {msg_id!r}")
    return raw[:-8], int.from_bytes(raw[-8:], "big", signed=True)


def decode_offset_msg_id(msg_id: str) -> tuple:
    """``(store_host, physical_offset)`` of an offset message id; raises ValueError if malformed."""
    host_raw, offset = _split_offset_msg_id(msg_id)
    return decode_host(host_raw), offset


class _UniqueKeyFactory:
    """Client-compatible UNIQ_KEY generator (``MessageClientIDSetter``, docs/format.md#uniq_key)."""

    _pid: int  # set on first use, with _prefix

    def __init__(self):
        self._lock = threading.Lock()
        self._counter = 0
        self._prefix = None
        self._month_start = 0
        self._next_month = 0

    @staticmethod
    def _local_ip() -> bytes:
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
            for info in infos:
                ip = ipaddress.ip_address(info[4][0])
                if not ip.is_loopback:
                    return ip.packed
        except OSError:
            pass
        return struct.pack(">q", int(time.time() * 1000))[-4:]

    def _roll_month(self, now_ms: int) -> None:
        t = time.localtime(now_ms / 1000)
        start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        nxt = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
        self._month_start, self._next_month = int(start * 1000), int(nxt * 1000)

    def __call__(self) -> str:
        now = int(time.time() * 1000)
        with self._lock:
            if self._prefix is None or os.getpid() != self._pid:
                self._pid = os.getpid()
                self._prefix = (
                    self._local_ip() + struct.pack(">H", self._pid & 0xFFFF) + random.getrandbits(32).to_bytes(4, "big")
                )
            if now >= self._next_month:
                self._roll_month(now)
            diff = (now - self._month_start) & 0xFFFFFFFF
            self._counter = (self._counter + 1) & 0xFFFF
            counter = self._counter
        return (self._prefix + struct.pack(">IH", diff, counter)).hex().upper()


new_unique_key = _UniqueKeyFactory()
new_unique_key.__doc__ = """A new client-compatible UNIQ_KEY (32 upper-case hex chars, docs/format.md#uniq_key):
local IPv4, pid, a per-process random value, ms since the start of the local
month, a counter. Thread-safe."""


# --- messages --------------------------------------------------------------


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
            other shorthands follow in the order tags, keys, unique_key.
        born_timestamp (int | None): ms since epoch; None = the store clock at put.
        born_host, store_host (str | tuple | None): ``"a.b.c.d:port"`` or
            ``"[v6]:port"``; None = the store's host. IPv6 sets the V6 sysflag bits.
        reconsume_times (int): retry count, i32.
        sys_flag (int): sysflag bits (docs/format.md#sysflag-bits); V6 bits are set by the store.
        prepared_transaction_offset (int): for commit/rollback records, the
            physical offset of the prepared record.

    Raises:
        MessageTypeError: a field has the wrong type.
        IllegalMessageError: a value is out of range or holds a separator.
    """

    __slots__ = (
        "topic", "body", "queue_id", "flag", "tags", "keys", "unique_key", "properties",
        "born_timestamp", "born_host", "store_host", "reconsume_times", "sys_flag",
        "prepared_transaction_offset",
    )

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
    ):
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
        self.topic = topic
        self.body = body
        self.queue_id = _check_int("queue_id", queue_id, minimum=0)
        self.flag = _check_int("flag", flag)
        self.tags = None if tags is None else _check_str("tags", tags)
        if keys is not None and not isinstance(keys, str):
            if not isinstance(keys, (list, tuple)):
                raise MessageTypeError(f"keys must be a str or a list of str, got {type(keys).__name__}")
            for k in keys:
                _check_str("key", k)
            keys = KEY_SEPARATOR.join(keys)
        self.keys = None if keys is None else _check_str("keys", keys)
        self.unique_key = None if unique_key is None else _check_str("unique_key", unique_key)
        if properties is not None:
            if not isinstance(properties, dict):
                raise MessageTypeError(f"properties must be a dict, got {type(properties).__name__}")
            for name, value in properties.items():
                _check_str("property name", name)
                _check_str(f"property {name!r}", value)
                if not name:
                    raise IllegalMessageError("property names must not be empty")
        self.properties = properties
        self.born_timestamp = None if born_timestamp is None else _check_int("born_timestamp", born_timestamp, _INT64)
        self.born_host = born_host
        self.store_host = store_host
        self.reconsume_times = _check_int("reconsume_times", reconsume_times)
        self.sys_flag = _check_int("sys_flag", sys_flag)
        self.prepared_transaction_offset = _check_int(
            "prepared_transaction_offset", prepared_transaction_offset, _INT64
        )

    @property
    def transaction_type(self) -> int:
        """``sys_flag & 0xC``: 0 none, 4 prepared, 8 commit, 12 rollback."""
        return self.sys_flag & TRANSACTION_MASK

    def property_map(self) -> dict:
        """The properties as they will be stored, in order (shorthands merged)."""
        props = dict(self.properties) if self.properties else {}
        # unrolled: this runs once per put
        value = self.tags
        if value is not None and props.setdefault(PROPERTY_TAGS, value) != value:
            _twice(PROPERTY_TAGS, props[PROPERTY_TAGS], value)
        value = self.keys
        if value is not None and props.setdefault(PROPERTY_KEYS, value) != value:
            _twice(PROPERTY_KEYS, props[PROPERTY_KEYS], value)
        value = self.unique_key
        if value is not None and props.setdefault(PROPERTY_UNIQ_KEY, value) != value:
            _twice(PROPERTY_UNIQ_KEY, props[PROPERTY_UNIQ_KEY], value)
        return props

    def encode_properties(self, props: dict | None = None) -> bytes:
        """The UTF-8 property blob (``name\x01value\x02`` per pair) of *props*
        (default: :meth:`property_map`). Every name and value is checked
        again here, as the message's attributes may have been changed since
        it was made: MessageTypeError for a name or value that is not a str,
        IllegalMessageError for an empty name, a separator inside, or a
        string with no UTF-8 form (a lone surrogate);
        PropertiesSizeExceededError above 32767 bytes."""
        if props is None:
            props = self.property_map()
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

    def __repr__(self):
        return f"Message(topic={self.topic!r}, queue_id={self.queue_id}, body={bytes(self.body[:32])!r}...)"


def _encodable(text: str) -> bool:
    """Whether *text* has a UTF-8 form (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _twice(name: str, old: str, value: str) -> NoReturn:
    raise IllegalMessageError(f"{name} given twice with different values: {old!r} and {value!r}")


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
            from ._kernels import parse_properties

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
        import base64

        d = {
            "physical_offset": self.physical_offset,
            "store_size": self.store_size,
            "topic": self.topic,
            "queue_id": self.queue_id,
            "queue_offset": self.queue_offset,
            "msg_id": self.msg_id,
            "flag": self.flag,
            "sys_flag": self.sys_flag,
            "born_timestamp": self.born_timestamp,
            "born_host": self.born_host,
            "store_timestamp": self.store_timestamp,
            "store_host": self.store_host,
            "reconsume_times": self.reconsume_times,
            "prepared_transaction_offset": self.prepared_transaction_offset,
            "body_crc": self.body_crc,
            "tags": self.tags,
            "keys": self.keys,
            "unique_key": self.unique_key,
            "properties": self.properties,
        }
        if body == "base64":
            d["body"] = base64.b64encode(self.body).decode("ascii")
        elif body == "text":
            d["body"] = self.body.decode("utf-8", "replace")
        elif body == "hex":
            d["body"] = self.body.hex()
        return d

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
