"""The one place that picks the kernel implementation.

``RMQSTORE_PURE_PYTHON=1`` forces the pure-Python twin (``_pure``);
``RMQSTORE_REQUIRE_EXTENSION=1`` turns a missing or broken Cython core into an
ImportError instead of a silent fallback. Everything else imports kernels from
here. The choice is made once, at import (tests and benchmarks that compare
both in one process switch with ``tests/kernel_switch.py``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


k: ModuleType
if _truthy("RMQSTORE_PURE_PYTHON"):
    if _truthy("RMQSTORE_REQUIRE_EXTENSION"):
        raise ImportError("RMQSTORE_PURE_PYTHON and RMQSTORE_REQUIRE_EXTENSION are both set")
    from . import _pure as k

    IMPLEMENTATION = "python"
else:
    try:
        from . import _core as k

        IMPLEMENTATION = "cython"
    except ImportError:
        if _truthy("RMQSTORE_REQUIRE_EXTENSION"):
            raise
        from . import _pure as k

        IMPLEMENTATION = "python"

# every name the kernels export: the chosen module's __all__ (the core's and
# the twin's are the same list, which tests/test_kernels.py checks)
KERNELS: tuple[str, ...] = tuple(k.__all__)


if TYPE_CHECKING:
    # For type checkers only: the names _bind() puts into this module at run
    # time, with the signatures of rmqstore/_core.pyi (_pure has the same ones).
    from ._core import (
        Appender,
        AppendLock,
        CommitLogBase,
        ConsumeQueueBase,
        IndexRegion,
        IndexServiceBase,
        MappedQueue,
        MappedRegion,
        Message,
        MessageExt,
        PutGate,
        ReadGate,
        ReferenceResource,
        StoreCore,
        StoreState,
        append_dispatch,
        check_record,
        cq_get,
        cq_put,
        cq_scan,
        cq_search_time,
        cq_units,
        decode_columns,
        decode_columns_at,
        decode_record,
        delay_level,
        encode_record,
        gets_consume_queue_unit,
        gets_index_entries,
        index_key_hash,
        index_put,
        index_put_keys,
        index_select,
        java_hash,
        masked_crc32,
        parse_properties,
        pull_bounds,
        pull_messages,
        pull_units,
        pull_views,
        query_keyed,
        read_ext,
        read_keyed,
        read_record,
        read_store_timestamp,
        read_store_timestamps,
        record_size,
        release_pages,
        scan_records,
        sync_pages,
        tags_hash,
        time_lookup,
        warm_pages,
        write_record,
    )


def _bind(module: ModuleType) -> None:
    g = globals()
    for name in KERNELS:
        g[name] = getattr(module, name)


_bind(k)
