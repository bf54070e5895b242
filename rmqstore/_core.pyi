"""Type stub of the Cython core ``rmqstore/_core.pyx``.

The compiled module has the same names, parameters (names, kinds, defaults),
results and exceptions as its pure-Python twin ``rmqstore/_pure/``, whose
docstrings define the semantics. CI keeps this stub honest with
``python -m mypy.stubtest --mypy-config-file pyproject.toml rmqstore._core``
against the built extension (.ci/wheel-check, .github/workflows/tests.yml).

Buffers: every kernel takes any object with the buffer protocol (``mmap``,
``bytearray``, ``bytes``, ``memoryview``); writers need a writable one. The
``_typeshed`` aliases exist for type checkers only: a stub is never imported
at run time, so they add no dependency.
"""

import mmap
from collections.abc import Callable, Iterable
from typing import Any, final

from _typeshed import ReadableBuffer, WriteableBuffer
from typing_extensions import disjoint_base

from ._status import GetMessageStatus
from .message import GetMessageResult, GetViewsResult, PutMessageResult

__all__ = [
    "Message",
    "MessageExt",
    "MappedRegion",
    "MappedQueue",
    "CommitLogBase",
    "ConsumeQueueBase",
    "IndexRegion",
    "IndexServiceBase",
    "ReferenceResource",
    "StoreState",
    "StoreCore",
    "warm_pages",
    "release_pages",
    "sync_pages",
    "java_hash",
    "index_key_hash",
    "gets_consume_queue_unit",
    "gets_index_entries",
    "delay_level",
    "tags_hash",
    "masked_crc32",
    "parse_properties",
    "record_size",
    "write_record",
    "append_dispatch",
    "encode_record",
    "check_record",
    "decode_record",
    "decode_columns",
    "decode_columns_at",
    "scan_records",
    "read_record",
    "read_store_timestamp",
    "read_store_timestamps",
    "cq_put",
    "cq_get",
    "cq_units",
    "cq_scan",
    "cq_search_time",
    "index_put",
    "index_put_keys",
    "index_select",
    "Appender",
    "AppendLock",
    "PutGate",
    "ReadGate",
    "pull_units",
    "pull_bounds",
    "read_keyed",
    "time_lookup",
    "query_keyed",
    "read_ext",
    "pull_views",
    "pull_messages",
]

@disjoint_base
class MappedRegion:
    """A mapped segment as the kernels read and write it; see rmqstore._pure.MappedRegion."""

    mm: Any
    file_from_offset: int
    file_size: int
    wrote_position: int
    def __init__(
        self, mm: Any = None, file_from_offset: int = 0, file_size: int = 0, wrote_position: int = 0
    ) -> None: ...

@disjoint_base
class MappedQueue:
    """A log's segments as the kernels walk them; see rmqstore._pure.MappedQueue."""

    files: list[Any]
    file_size: Any

@disjoint_base
class CommitLogBase:
    """A CommitLog as the read kernels use it; see rmqstore._pure.CommitLogBase."""

    queue: MappedQueue
    max_record_size: int

@disjoint_base
class ConsumeQueueBase:
    """A ConsumeQueue as the kernels use it; see rmqstore._pure.ConsumeQueueBase."""

    queue: MappedQueue
    min_logic_offset: int
    max_physic_offset: int
    topic: str
    queue_id: int

@disjoint_base
class IndexRegion:
    """An IndexFile as the kernels use it; see rmqstore._pure.IndexRegion."""

    mm: Any
    hash_slot_num: int
    index_num: int

@disjoint_base
class IndexServiceBase:
    """The index as a lookup uses it; see rmqstore._pure.IndexServiceBase."""

    files: list[Any]
    max_msgs_num_batch: int

@final
class ReferenceResource:
    """Reader references over a store's files; see rmqstore._pure.ReferenceResource."""

    @property
    def ref_count(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def exclusive_held(self) -> bool: ...
    def hold(self) -> None: ...
    def release(self) -> None: ...
    def acquire_exclusive(self, timeout: float) -> bool: ...
    def release_exclusive(self) -> None: ...
    def shutdown(self, timeout: float) -> bool: ...

@disjoint_base
class StoreState:
    """The state a store's gates check and update per call; see rmqstore._pure.StoreState."""

    closed: bool
    disk_full: bool
    pending: Any
    pending_keys: int
    write_error: Any
    waiting: int
    written_end: int
    last_store_ts: int
    last_logics_ts: int

@disjoint_base
class Message:
    """A message to store; see rmqstore._pure.message.Message (same fields,
    methods and errors)."""

    topic: Any
    body: Any
    queue_id: Any
    flag: Any
    tags: Any
    keys: Any
    unique_key: Any
    properties: Any
    born_timestamp: Any
    born_host: Any
    store_host: Any
    reconsume_times: Any
    sys_flag: Any
    prepared_transaction_offset: Any
    delay_level: Any
    def __init__(
        self,
        topic: str,
        body: Any = b"",
        queue_id: int = 0,
        flag: int = 0,
        tags: str | None = None,
        keys: str | list[str] | tuple[str, ...] | None = None,
        unique_key: str | None = None,
        properties: dict[str, str] | None = None,
        born_timestamp: int | None = None,
        born_host: Any = None,
        store_host: Any = None,
        reconsume_times: int = 0,
        sys_flag: int = 0,
        prepared_transaction_offset: int = 0,
        delay_level: int | None = None,
    ) -> None: ...
    @property
    def transaction_type(self) -> int: ...
    def property_map(self) -> dict[str, str]: ...
    def encode_properties(self, props: dict[str, str] | None = None) -> bytes: ...

@disjoint_base
class MessageExt:
    """A stored record as read back; see rmqstore._pure.message.MessageExt."""

    store_size: Any
    magic_code: Any
    body_crc: Any
    queue_id: Any
    flag: Any
    queue_offset: Any
    physical_offset: Any
    sys_flag: Any
    born_timestamp: Any
    store_timestamp: Any
    reconsume_times: Any
    prepared_transaction_offset: Any
    body: Any
    topic: Any
    properties_blob: Any
    def __init__(self, fields: tuple[Any, ...], properties: dict[str, str] | None = None) -> None: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @property
    def born_host(self) -> str: ...
    @property
    def store_host(self) -> str: ...
    @property
    def born_host_raw(self) -> bytes: ...
    @property
    def store_host_raw(self) -> bytes: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> str | None: ...
    @property
    def unique_key(self) -> str | None: ...
    @property
    def transaction_type(self) -> int: ...
    @property
    def born_host_v6(self) -> bool: ...
    @property
    def store_host_v6(self) -> bool: ...
    def to_dict(self, body: str = "base64") -> dict[str, Any]: ...
    __hash__: None  # type: ignore[assignment]

# (total_size, magic, body_crc, queue_id, flag, queue_offset, physical_offset,
#  sys_flag, born_timestamp, born_host, store_timestamp, store_host,
#  reconsume_times, prepared_transaction_offset, body, topic, properties)
_DecodedRecord = tuple[
    int, int, int, int, int, int, int, int, int, bytes, int, bytes, int, int, bytes | None, str, bytes
]

# --- hashing and checksums ---
def java_hash(s: str) -> int: ...
def index_key_hash(key: str) -> int: ...
def gets_consume_queue_unit(sys_flag: int) -> bool: ...
def gets_index_entries(sys_flag: int) -> bool: ...
def delay_level(text: str, max_level: int) -> int: ...
def tags_hash(tags: str | None) -> int: ...
def masked_crc32(data: ReadableBuffer, start: int = 0, end: int = -1) -> int: ...

# --- properties ---
def parse_properties(blob: ReadableBuffer) -> dict[str, str]: ...

# --- CommitLog records ---
def record_size(sys_flag: int, body_len: int, topic_len: int, props_len: int, v2: bool) -> int: ...
def write_record(
    buf: WriteableBuffer,
    pos: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: ReadableBuffer,
    store_timestamp: int,
    store_host: ReadableBuffer,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: ReadableBuffer,
    topic: ReadableBuffer,
    properties: ReadableBuffer,
    append_crc: bool,
) -> int: ...
def append_dispatch(
    buf: WriteableBuffer,
    pos: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: ReadableBuffer,
    store_timestamp: int,
    store_host: ReadableBuffer,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: ReadableBuffer,
    topic: ReadableBuffer,
    properties: ReadableBuffer,
    append_crc: bool,
    cq_buf: WriteableBuffer,
    cq_pos: int,
    tags_code: int,
    index_buf: WriteableBuffer | None,
    hash_slot_num: int,
    index_num: int,
    key_prefix: str,
    keys: list[str],
) -> int: ...
def encode_record(
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: ReadableBuffer,
    store_timestamp: int,
    store_host: ReadableBuffer,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: ReadableBuffer,
    topic: ReadableBuffer,
    properties: ReadableBuffer,
    append_crc: bool,
) -> bytes: ...
def check_record(
    buf: ReadableBuffer, pos: int, limit: int, check_crc: bool, verify_prop_crc: int, max_size: int
) -> int: ...
def decode_record(buf: ReadableBuffer, pos: int, with_body: bool) -> _DecodedRecord: ...
def decode_columns(
    buf: ReadableBuffer,
    pos: int,
    end: int,
    base_offset: int,
    max_count: int,
    with_body: bool,
    with_properties: bool,
    check_crc: bool = ...,
    with_hosts: bool = ...,
    with_keys: bool = ...,
) -> tuple[int, int, dict[str, Any]]: ...
def decode_columns_at(
    bufs: list[ReadableBuffer],
    file_size: int,
    base: int,
    offsets: list[int],
    with_body: bool,
    with_properties: bool,
) -> tuple[int, int, dict[str, Any]]: ...
def scan_records(
    buf: ReadableBuffer,
    pos: int,
    end: int,
    base_offset: int,
    check_crc: bool,
    verify_prop_crc: int,
    max_size: int,
) -> tuple[int, int, int]: ...
def read_record(
    buf: ReadableBuffer, pos: int, limit: int, physical_offset: int, max_size: int, with_body: bool
) -> _DecodedRecord | int: ...
def read_store_timestamp(buf: ReadableBuffer, pos: int) -> int: ...
def read_store_timestamps(buf: ReadableBuffer, positions: ReadableBuffer, out: WriteableBuffer) -> int: ...

# --- ConsumeQueue ---
def cq_put(buf: WriteableBuffer, pos: int, physical_offset: int, size: int, tags_code: int) -> None: ...
def cq_get(buf: ReadableBuffer, pos: int) -> tuple[int, int, int]: ...
def cq_units(buf: ReadableBuffer, start: int, end: int) -> list[tuple[int, int, int]]: ...
def warm_pages(buf: WriteableBuffer, start: int, end: int) -> bool: ...
def release_pages(buf: mmap.mmap, start: int, end: int) -> bool: ...
def sync_pages(buf: ReadableBuffer, start: int, end: int) -> bool: ...
def cq_scan(buf: ReadableBuffer, start: int, end: int, phy_limit: int | None = ...) -> tuple[int, int]: ...
def cq_search_time(
    buf: ReadableBuffer,
    file_start: int,
    low: int,
    range_: int,
    timestamp: int,
    upper: bool,
    min_physical_offset: int,
    time_at: Callable[[int, int], int] | tuple[list[ReadableBuffer], int, int, int, int],
) -> int: ...

# --- IndexFile ---
def index_put(
    buf: WriteableBuffer, hash_slot_num: int, index_num: int, key: str, physical_offset: int, store_timestamp: int
) -> bool: ...
def index_put_keys(
    buf: WriteableBuffer,
    hash_slot_num: int,
    index_num: int,
    prefix: str,
    keys: list[str],
    physical_offset: int,
    store_timestamp: int,
) -> int: ...
def index_select(
    buf: ReadableBuffer,
    hash_slot_num: int,
    index_num: int,
    key: str,
    max_num: int,
    begin: int,
    end: int,
    out: list[int],
) -> None: ...

@disjoint_base
class Appender:
    def __init__(
        self,
        message_type: type,
        result_type: type[tuple],
        ok_status: Any,
        store_host: bytes,
        append_crc: bool,
        max_message_size: int,
        index_enable: bool,
        queue_offsets: dict[tuple[str, int], int],
        host_bytes: Callable[[str], bytes] | None = None,
        delay_levels: Iterable[int] | None = None,
        dispatch: bool = True,
        state: StoreState | None = None,
    ) -> None: ...
    @property
    def unit_timestamp(self) -> int: ...
    @property
    def dispatch(self) -> bool: ...
    def bind_commit_log(self, mapped_file: Any) -> None: ...
    def bind_index(self, index_file: Any) -> None: ...
    def bind_queue(
        self, topic: str, queue_id: int, topic_bytes: bytes, consume_queue: Any, mapped_file: Any
    ) -> None: ...
    def unbind(self) -> None: ...
    def check(self, msg: object) -> bool: ...
    def check_all(
        self, msgs: list[Any], topic_bytes: Callable[[str], object] | None = None, file_size: int | None = None
    ) -> tuple[list[int], object]: ...
    def plan(self, encoded: object, always: bool = False) -> list[Any] | None: ...
    def put(self, msg: object, store_timestamp: int) -> tuple[Any, ...] | None: ...
    def put_batch(
        self,
        msgs: list[Any],
        start: int,
        clock: Callable[[], int] | None,
        results: list[Any],
        encoded: object = None,
    ) -> tuple[int, Any]: ...
    def check_columns(
        self,
        topic: str,
        bodies: list[Any],
        queue_ids: list[int],
        tags: list[str | None] | None,
        keys: list[str | None] | None,
        unique_keys: list[str | None] | None,
        start: int,
        encoded: object = None,
        topic_bytes: Callable[[str], object] | None = None,
        file_size: int | None = None,
    ) -> tuple[int, object]: ...
    def put_columns(
        self,
        topic: str,
        bodies: list[Any],
        queue_ids: list[int],
        tags: list[str | None] | None,
        keys: list[str | None] | None,
        unique_keys: list[str | None] | None,
        start: int,
        store_timestamp: int,
        physical_offsets: WriteableBuffer,
        sizes: WriteableBuffer,
        queue_offsets: WriteableBuffer,
        encoded: object = None,
    ) -> int: ...


@final
class AppendLock:
    def acquire(self, blocking: bool = True) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc: object) -> None: ...

@disjoint_base
class PutGate:
    def __init__(
        self, store: Any, state: StoreState, lock: Any, appender: Appender, clock: Callable[[], int] | None
    ) -> None: ...
    def detach(self) -> None: ...
    def put(self, msg: Any) -> Any: ...

@disjoint_base
class StoreCore:
    """The part of MessageStore the kernels own; see rmqstore._pure.StoreCore."""

    _put_gate: Any
    _read_gate: Any
    def put_message(self, msg: Any) -> PutMessageResult: ...
    def get_offset_in_queue_by_time(
        self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower"
    ) -> int: ...
    def query_messages(
        self, topic: str, key: str, max_count: int = 64, begin: int = 0, end: int = 0x7FFFFFFFFFFFFFFF
    ) -> list[Any]: ...
    def get_messages(
        self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags: Any = None, wait_ms: float = 0
    ) -> GetMessageResult: ...
    def get_message_views(self, topic: str, queue_id: int, offset: int, max_count: int = 32) -> GetViewsResult: ...

@disjoint_base
class ReadGate:
    def __init__(
        self,
        store: Any,
        state: StoreState,
        cqs: dict[Any, Any],
        commitlog: Any,
        index: Any,
        refs: ReferenceResource | Any,
        read_only: bool,
        message_type: type,
        result_type: type,
        views_type: type,
        units_of: Callable[[bytes], Any],
        tag_filter: Callable[[Any], Any],
        min_units: int,
    ) -> None: ...
    def detach(self) -> None: ...
    def get_offset_in_queue_by_time(
        self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower"
    ) -> int: ...
    def query_messages(
        self, topic: str, key: str, max_count: int = 64, begin: int = 0, end: int = 9223372036854775807
    ) -> list[Any]: ...
    def get_messages(
        self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags: Any = None, wait_ms: float = 0
    ) -> Any: ...
    def get_message_views(self, topic: str, queue_id: int, offset: int, max_count: int = 32) -> Any: ...

def pull_units(
    cq_buf: ReadableBuffer,
    start: int,
    end: int,
    view: tuple[list[Any], int, int, int, int],
    topic: str,
    queue_id: int,
    queue_offset: int,
    max_count: int,
    min_physical_offset: int,
    max_size: int,
    message_type: type,
    out: list[Any],
) -> tuple[int, GetMessageStatus | None, bool]: ...
def pull_bounds(cq: Any, queue_offset: int) -> tuple[GetMessageStatus | None, int, int, int]: ...
def read_keyed(
    view: tuple[list[Any], int, int, int, int],
    offsets: list[int],
    topic: str,
    key: str,
    max_size: int,
    message_type: type,
    out: list[Any],
) -> None: ...
def time_lookup(cq: Any, commitlog: Any, timestamp: int, upper: bool, refs: Any) -> int | None: ...
def query_keyed(
    index: Any,
    commitlog: Any,
    topic: str,
    key: str,
    max_num: int,
    begin: int,
    end: int,
    message_type: type,
    out: list[Any],
    refs: Any,
) -> list[Any] | None: ...
def read_ext(
    commitlog: Any, physical_offset: int, message_type: type, out: list[Any], refs: Any
) -> list[Any] | None: ...
def pull_views(
    cq: Any, commitlog: Any, queue_offset: int, max_count: int, max_units: int, refs: Any
) -> tuple[GetMessageStatus | None, int, int, int, Any, bytes] | None: ...
def pull_messages(
    cq: Any,
    commitlog: Any,
    queue_offset: int,
    max_count: int,
    max_units: int,
    message_type: type,
    out: list[Any],
    tags: tuple[set[int] | frozenset[int], set[str] | frozenset[str]] | None,
    refs: Any,
) -> tuple[GetMessageStatus | None, int, int, int] | None: ...
