"""The one place that picks the kernel implementation.

``RMQSTORE_PURE_PYTHON=1`` forces the pure-Python twin (``_pure``);
``RMQSTORE_REQUIRE_EXTENSION=1`` turns a missing or broken Cython core into an
ImportError instead of a silent fallback. Everything else imports kernels from
here.
"""

from __future__ import annotations

import os


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


if _truthy("RMQSTORE_PURE_PYTHON"):
    if _truthy("RMQSTORE_REQUIRE_EXTENSION"):
        raise ImportError("RMQSTORE_PURE_PYTHON and RMQSTORE_REQUIRE_EXTENSION are both set")
    from . import _pure as k

    IMPLEMENTATION = "python"
else:
    try:
        from . import _core as k  # type: ignore[attr-defined]

        IMPLEMENTATION = "cython"
    except ImportError:
        if _truthy("RMQSTORE_REQUIRE_EXTENSION"):
            raise
        from . import _pure as k

        IMPLEMENTATION = "python"

java_hash = k.java_hash
index_key_hash = k.index_key_hash
masked_crc32 = k.masked_crc32
parse_properties = k.parse_properties
record_size = k.record_size
write_record = k.write_record
encode_record = k.encode_record
check_record = k.check_record
decode_record = k.decode_record
read_store_timestamp = k.read_store_timestamp
cq_put = k.cq_put
cq_get = k.cq_get
cq_units = k.cq_units
cq_scan = k.cq_scan
cq_search_time = k.cq_search_time
index_put = k.index_put
index_select = k.index_select
