# cython: language_level=3
"""Cython kernels: the C twin of the ``rmqstore/_pure/`` package.

Same names, signatures, results and exceptions as the pure module, whose
docstrings define the semantics. A buffer is held only for the duration of
one call; every big-endian access goes through memcpy (no unaligned casts);
every record is bounds-checked once with overflow-safe arithmetic.

Integer arguments follow two rules. Positions, limits, counts and bounds
are saturated (``_idx``, ``_wide``): a value beyond +-2**63 compares against
buffer sizes and field values exactly like the Python int, so results agree
with ``_pure`` for ints of any size. Field values that get stored (queue ids,
offsets, timestamps, ...) are converted up front, before anything is
written: TypeError unless an int, OverflowError outside the field's width.
"""

cimport cython
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.limits cimport LLONG_MAX, LLONG_MIN
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove, memset
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_CheckExact
from cpython.memoryview cimport PyMemoryView_Check
from cpython.list cimport PyList_Append, PyList_CheckExact, PyList_GET_SIZE
from cpython.bool cimport PyBool_Check
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.number cimport PyNumber_Index
from cpython.dict cimport PyDict_CheckExact, PyDict_GetItem, PyDict_Next, PyDict_SetItem
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_CheckExact
from cpython.set cimport PyAnySet_CheckExact, PySet_Contains
from cpython.object cimport PyObject_Hash

import mmap as _mmap
import os
import threading
import time
import weakref

from ._status import GetMessageStatus
from rmqstore._pure import message as _pm
from rmqstore.format.ids import decode_host as _decode_host

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

# The units, by concept, in rmqstore/_core_units/. Cython's `include` (supported
# in Cython 3) pastes each into this file: one extension module, rmqstore._core,
# from several source files. Module-level names resolve across the units, so
# the order matters only for the module-level statements run at import time.

# C declarations: CPython API, lock, zlib, the C headers
include "_core_units/c_support.pxi"

# layout constants (C enums) and _LAYOUT
include "_core_units/layout.pxi"

# argument conversion, hashes, CRCs, properties, one record
include "_core_units/codec.pxi"

# many records: columns, the scan, checked reads
include "_core_units/columns.pxi"

# MappedRegion, MappedQueue, *Base, IndexRegion, ReferenceResource, StoreState
include "_core_units/state.pxi"

# cq_* kernels, the CommitLog view, search by time
include "_core_units/consumequeue.pxi"

# IndexFile kernels
include "_core_units/index.pxi"

# Message, MessageExt
include "_core_units/message.pxi"

# the put path's helpers and dispatch rules
include "_core_units/put_path.pxi"

# Appender
include "_core_units/appender.pxi"

# AppendLock, PutGate, StoreCore, ReadGate
include "_core_units/gates.pxi"

# the pull path: pull_*, read_keyed, query_keyed, read_ext, tag filter
include "_core_units/reads.pxi"
