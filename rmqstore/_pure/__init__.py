"""Pure-Python kernels: the twin of ``rmqstore/_core.pyx``.

Same names, same signatures, same results as the Cython core; selected with
``RMQSTORE_PURE_PYTHON=1`` (see ``rmqstore/_kernels.py``). Kernels work on raw
buffers (``mmap``, ``bytearray``, ``bytes``) at byte positions; they hold no
state, open no files and log nothing. Every read is bounds-checked against the
buffer (or a caller-given limit), so corrupt input can never read outside it;
chain walks are bounded, so they always end.

All multi-byte integers are big-endian (docs/format.md#conventions).

The package is the core's twin file by file, one concept per module; this
module exports the names the core exports (``__all__``), with ``Message`` and
``MessageExt`` from ``message``:

- ``codec``: hashes, the masked CRC-32, property blobs, and writing, checking, decoding and reading records;
- ``columns``: bulk decoding of records into numpy columns;
- ``consumequeue``: ConsumeQueue units, the recovery scan and the search by store time;
- ``index``: IndexFile keys, put and select;
- ``put_path``: the dispatch rules the put path applies;
- ``appender``: the put path (``append_dispatch``, ``Appender``, ``AppendLock``);
- ``state``: the state classes the kernels read and write, reader references, ``StoreCore``;
- ``reads``: pulls, keyed reads and whole lookups under a reader reference;
- ``gates``: ``PutGate`` and ``ReadGate``, the store's put and read methods in one call.
"""

from __future__ import annotations

import importlib

# where each name lives: loaded on first use (PEP 562), so that importing
# one module of the twin (the core uses ``message``'s helpers) does not load
# them all; the underscored names are helpers tests use and the core's
# comments name (``_pure._bounds``, ``_pure.VIEW_UNIT`` ...)
_HOMES = {
    "appender": ("Appender", "AppendLock", "append_dispatch"),
    "put_path": ("delay_level", "gets_consume_queue_unit", "gets_index_entries"),
    "codec": ("_encoded_props_len", "_find_crc_property", "check_record", "decode_record", "encode_record",
              "index_key_hash", "java_hash", "masked_crc32", "parse_properties", "read_record",
              "read_store_timestamp", "read_store_timestamps", "record_size", "scan_records", "tags_hash",
              "write_record"),
    "columns": ("decode_columns", "decode_columns_at"),
    "consumequeue": ("cq_get", "cq_put", "cq_scan", "cq_search_time", "cq_units"),
    "gates": ("PutGate", "ReadGate"),
    "index": ("_index_keys", "index_put", "index_put_keys", "index_select"),
    "message": ("Message", "MessageExt"),
    "reads": ("VIEW_UNIT", "_bounds", "_keyed_record", "_unit_record", "pull_bounds", "pull_messages", "pull_units",
              "pull_views", "query_keyed", "read_ext", "read_keyed", "time_lookup"),
    "state": ("CommitLogBase", "ConsumeQueueBase", "IndexRegion", "IndexServiceBase", "MappedQueue",
              "MappedRegion", "ReferenceResource", "StoreCore", "StoreState", "warm_pages",
              "release_pages", "sync_pages"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_HOME))


# the core's __all__, in its order
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
