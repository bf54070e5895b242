# cython: language_level=3
"""Cython kernels: the C twin of ``rmqstore/_pure.py``.

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
from cpython.dict cimport PyDict_CheckExact, PyDict_GetItem, PyDict_Next
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_CheckExact
from cpython.set cimport PyAnySet_CheckExact, PySet_Contains
from cpython.object cimport PyObject_Hash

import threading
import time
import weakref

from ._status import GetMessageStatus

cdef extern from "Python.h":
    # PyObject_GetBuffer without Cython's error check, to try a writable view
    int _try_getbuffer "PyObject_GetBuffer"(object obj, Py_buffer *view, int flags)
    void PyErr_Clear()
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    int PyUnicode_KIND(object o)
    const void *PyUnicode_DATA(object o)
    int PyUnicode_1BYTE_KIND, PyUnicode_2BYTE_KIND
    Py_ssize_t PY_SSIZE_T_MAX, PY_SSIZE_T_MIN
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    unsigned char *PyUnicode_1BYTE_DATA(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    bint PyUnicode_IS_ASCII(object o)

cdef extern from "pythread.h":
    ctypedef void *rmq_lock_t "PyThread_type_lock"
    ctypedef enum rmq_lock_status "PyLockStatus":
        RMQ_LOCK_ACQUIRED "PY_LOCK_ACQUIRED"
        RMQ_LOCK_INTR "PY_LOCK_INTR"
    rmq_lock_t rmq_lock_new "PyThread_allocate_lock"()
    void rmq_lock_free "PyThread_free_lock"(rmq_lock_t)
    rmq_lock_status rmq_lock_take "PyThread_acquire_lock_timed"(rmq_lock_t, long long microseconds,
                                                                int intr_flag) nogil
    void rmq_lock_give "PyThread_release_lock"(rmq_lock_t) nogil
    unsigned long rmq_thread_id "PyThread_get_thread_ident"()

cdef extern from "zlib.h" nogil:
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len)

cdef extern from "_crc32.h" nogil:
    # zlib's crc32 on PCLMULQDQ (x86-64) or the ARMv8 CRC32 instructions
    uint32_t rmq_crc32(uint32_t crc, const unsigned char *buf, size_t len)
    int rmq_crc32_hw_available()

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    #  define RMQ_BE32(x) (x)
    #  define RMQ_BE64(x) (x)
    #else
    #  define RMQ_BE32(x) __builtin_bswap32(x)
    #  define RMQ_BE64(x) __builtin_bswap64(x)
    #endif
    static inline int32_t rmq_ld32(const unsigned char *p) {
        uint32_t v; memcpy(&v, p, 4); return (int32_t)RMQ_BE32(v);
    }
    static inline int64_t rmq_ld64(const unsigned char *p) {
        uint64_t v; memcpy(&v, p, 8); return (int64_t)RMQ_BE64(v);
    }
    static inline int32_t rmq_ld16(const unsigned char *p) { return (int16_t)(uint16_t)((p[0] << 8) | p[1]); }
    static inline void rmq_st32(unsigned char *p, uint32_t v) { v = RMQ_BE32(v); memcpy(p, &v, 4); }
    static inline void rmq_st64(unsigned char *p, uint64_t v) { v = RMQ_BE64(v); memcpy(p, &v, 8); }
    static inline void rmq_st16(unsigned char *p, uint32_t v) {
        p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v;
    }
    /* 128-bit sums: file offsets plus positions, and index times, can pass 2**63 */
    typedef __int128 rmq_i128;
    static inline long long rmq_jdiv(long long a, long long b, long long u) {
        long long sum;
        if (!__builtin_add_overflow(a, b, &sum))
            return sum / u;  /* (the common case: no 128-bit division call) */
        return (long long)(((rmq_i128)a + b) / u);
    }
    /* a hint, never a fault: records are read in address order */
    #if defined(__GNUC__) || defined(__clang__)
    #  define rmq_prefetch(p) __builtin_prefetch(p)
    #else
    #  define rmq_prefetch(p) ((void)0)
    #endif
    #if PY_VERSION_HEX < 0x030C0000
    #  define rmq_unicode_ready(o) PyUnicode_READY(o)
    #else
    #  define rmq_unicode_ready(o) 0
    #endif
    """
    int32_t ld32 "rmq_ld32"(const unsigned char *p) nogil
    int64_t ld64 "rmq_ld64"(const unsigned char *p) nogil
    int32_t ld16 "rmq_ld16"(const unsigned char *p) nogil
    void st32 "rmq_st32"(unsigned char *p, uint32_t v) nogil
    void st64 "rmq_st64"(unsigned char *p, uint64_t v) nogil
    void st16 "rmq_st16"(unsigned char *p, uint32_t v) nogil
    ctypedef long long rmq_i128
    long long jdiv "rmq_jdiv"(long long a, long long b, long long u) nogil
    void prefetch "rmq_prefetch"(const void *p) nogil
    int rmq_unicode_ready(object o) except -1

cdef extern from *:
    """
    /* An exact int that fits one machine word, into *v*, without a call:
       3.12+ has public (unstable-tier) API for a "compact" int, the ints a
       store passes (ms timestamps, offsets). 0 for anything else, and
       always before 3.12: the caller takes PyLong_AsLongLongAndOverflow. */
    static inline int rmq_small_long(PyObject *o, long long *v) {
    #if PY_VERSION_HEX >= 0x030C0000
        if (!PyLong_CheckExact(o) || !PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
        *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 1;
    #else
        (void)o; (void)v;
        return 0;
    #endif
    }
    /* A ReferenceResource's word: bit 0 set while a clean-up or close holds
       the references exclusively, the references held counted above it.
       Atomic operations (GCC and Clang builtins), so a hold never rests on
       the GIL: once a clean-up has set the bit, no hold can succeed, and
       the count it then waits on only falls. */
    #define RMQ_REF_EXCLUSIVE ((Py_ssize_t)1)
    static inline Py_ssize_t rmq_ref_load(Py_ssize_t *w) {
        return __atomic_load_n(w, __ATOMIC_ACQUIRE);
    }
    static inline int rmq_ref_try_hold(Py_ssize_t *w) {
        Py_ssize_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        while (!(v & RMQ_REF_EXCLUSIVE))
            if (__atomic_compare_exchange_n(w, &v, v + 2, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return 1;
        return 0;
    }
    /* The word after the drop (unchanged when no reference is held). */
    static inline Py_ssize_t rmq_ref_drop(Py_ssize_t *w) {
        Py_ssize_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        while (v >= 2)
            if (__atomic_compare_exchange_n(w, &v, v - 2, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return v - 2;
        return v;
    }
    static inline void rmq_ref_set_exclusive(Py_ssize_t *w) {
        __atomic_fetch_or(w, RMQ_REF_EXCLUSIVE, __ATOMIC_SEQ_CST);
    }
    static inline void rmq_ref_clear_exclusive(Py_ssize_t *w) {
        __atomic_fetch_and(w, ~RMQ_REF_EXCLUSIVE, __ATOMIC_SEQ_CST);
    }
    /* The referent of a weak reference (a new reference), None once it is
       gone: PyWeakref_GetObject's borrowed reference is deprecated in 3.13. */
    static inline PyObject *rmq_deref(PyObject *ref) {
        PyObject *o;
    #if PY_VERSION_HEX >= 0x030D0000
        if (PyWeakref_GetRef(ref, &o) < 0) return NULL;
        if (o == NULL) o = Py_NewRef(Py_None);
    #else
        o = PyWeakref_GetObject(ref);
        Py_XINCREF(o);
    #endif
        return o;
    }
    /* An instance of the n-tuple subclass *tp* of *items*, without calling
       its Python-level __new__. With *untrack* the GC stops tracking it: a
       tuple of immutable fields in a type with no __dict__ can join no
       cycle worth collecting, and a batch's results would otherwise be
       traversed by every young collection while the batch runs. */
    static PyObject *rmq_tuple_n(PyObject *tp, int untrack, Py_ssize_t n, PyObject **items) {
        PyObject *r = ((PyTypeObject *)tp)->tp_alloc((PyTypeObject *)tp, n);
        Py_ssize_t i;
        if (r == NULL) return NULL;
        for (i = 0; i < n; i++) {
            Py_INCREF(items[i]);
            PyTuple_SET_ITEM(r, i, items[i]);
        }
        if (untrack && PyObject_GC_IsTracked(r))
            PyObject_GC_UnTrack(r);
        return r;
    }
    static PyObject *rmq_tuple6(PyObject *tp, int untrack, PyObject *a, PyObject *b, PyObject *c,
                                PyObject *d, PyObject *e, PyObject *f) {
        PyObject *items[6] = {a, b, c, d, e, f};
        return rmq_tuple_n(tp, untrack, 6, items);
    }
    static PyObject *rmq_tuple5(PyObject *tp, PyObject *a, PyObject *b, PyObject *c, PyObject *d, PyObject *e) {
        PyObject *items[5] = {a, b, c, d, e};
        return rmq_tuple_n(tp, 0, 5, items);
    }
    """
    bint rmq_small_long(object o, long long *v)
    Py_ssize_t RMQ_REF_EXCLUSIVE
    Py_ssize_t rmq_ref_load(Py_ssize_t *w) noexcept nogil
    bint rmq_ref_try_hold(Py_ssize_t *w) noexcept nogil
    Py_ssize_t rmq_ref_drop(Py_ssize_t *w) noexcept nogil
    void rmq_ref_set_exclusive(Py_ssize_t *w) noexcept nogil
    void rmq_ref_clear_exclusive(Py_ssize_t *w) noexcept nogil
    object rmq_deref(object ref)
    object rmq_tuple6(object tp, int untrack, object a, object b, object c, object d, object e, object f)
    object rmq_tuple5(object tp, object a, object b, object c, object d, object e)

# Same values as rmqstore/_layout.py (checked by tests/test_kernels.py).
cdef enum:
    MESSAGE_MAGIC_CODE = -626843481
    MESSAGE_MAGIC_CODE_V2 = -626843477
    BLANK_MAGIC_CODE = -875286124
    MIN_RECORD_SIZE = 91
    MAX_PROPERTIES_LENGTH = 32767
    MAX_TOPIC_LENGTH_V1 = 127
    MAX_TOPIC_LENGTH_V2 = 32767
    TRANSACTION_MASK = 0xC
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_COMMIT_TYPE = 0x8
    BORNHOST_V6_FLAG = 0x10
    STOREHOSTADDRESS_V6_FLAG = 0x20
    CRC32_RESERVED_LEN = 20
    CQ_STORE_UNIT_SIZE = 20
    PRE_BLANK_SIZE = 0x7FFFFFFF
    INDEX_HEADER_SIZE = 40
    INDEX_HASH_SLOT_SIZE = 4
    INDEX_ENTRY_SIZE = 20
    REC_BLANK = 0
    REC_TRUNCATED = -1
    REC_BAD_MAGIC = -2
    REC_BAD_SIZE = -3
    REC_LENGTH_MISMATCH = -4
    REC_BODY_CRC = -5
    REC_PROP_CRC = -6
    REC_TORN = -7
    REC_BAD_OFFSET = -8
    STOP_LIMIT = 1
    STOP_END = 2

_LAYOUT = {
    "MESSAGE_MAGIC_CODE": MESSAGE_MAGIC_CODE,
    "MESSAGE_MAGIC_CODE_V2": MESSAGE_MAGIC_CODE_V2,
    "BLANK_MAGIC_CODE": BLANK_MAGIC_CODE,
    "MIN_RECORD_SIZE": MIN_RECORD_SIZE,
    "MAX_PROPERTIES_LENGTH": MAX_PROPERTIES_LENGTH,
    "MAX_TOPIC_LENGTH_V1": MAX_TOPIC_LENGTH_V1,
    "MAX_TOPIC_LENGTH_V2": MAX_TOPIC_LENGTH_V2,
    "TRANSACTION_MASK": TRANSACTION_MASK,
    "TRANSACTION_NOT_TYPE": TRANSACTION_NOT_TYPE,
    "TRANSACTION_COMMIT_TYPE": TRANSACTION_COMMIT_TYPE,
    "BORNHOST_V6_FLAG": BORNHOST_V6_FLAG,
    "STOREHOSTADDRESS_V6_FLAG": STOREHOSTADDRESS_V6_FLAG,
    "CRC32_RESERVED_LEN": CRC32_RESERVED_LEN,
    "CQ_STORE_UNIT_SIZE": CQ_STORE_UNIT_SIZE,
    "PRE_BLANK_SIZE": PRE_BLANK_SIZE,
    "INDEX_HEADER_SIZE": INDEX_HEADER_SIZE,
    "INDEX_HASH_SLOT_SIZE": INDEX_HASH_SLOT_SIZE,
    "INDEX_ENTRY_SIZE": INDEX_ENTRY_SIZE,
    "REC_BLANK": REC_BLANK,
    "REC_TRUNCATED": REC_TRUNCATED,
    "REC_BAD_MAGIC": REC_BAD_MAGIC,
    "REC_BAD_SIZE": REC_BAD_SIZE,
    "REC_LENGTH_MISMATCH": REC_LENGTH_MISMATCH,
    "REC_BODY_CRC": REC_BODY_CRC,
    "REC_PROP_CRC": REC_PROP_CRC,
    "REC_TORN": REC_TORN,
    "REC_BAD_OFFSET": REC_BAD_OFFSET,
    "STOP_LIMIT": STOP_LIMIT,
    "STOP_END": STOP_END,
}

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
    "java_hash",
    "index_key_hash",
    "gets_consume_queue_unit",
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

# --- helpers --------------------------------------------------------------


cdef inline Py_ssize_t _idx(object o) except? -1:
    """*o* (any int) saturated to Py_ssize_t: exact for comparisons with buffer sizes."""
    cdef int ovf = 0
    cdef long long v
    if rmq_small_long(o, &v):
        return <Py_ssize_t>v
    v = PyLong_AsLongLongAndOverflow(o, &ovf)
    if ovf > 0 or v > PY_SSIZE_T_MAX:
        return PY_SSIZE_T_MAX
    if ovf < 0 or v < PY_SSIZE_T_MIN:
        return PY_SSIZE_T_MIN
    return <Py_ssize_t>v


cdef inline long long _i64(object o) except? -1:
    """A 64-bit field value: TypeError unless an int (no float truncation), OverflowError
    when out of range (checked up front, before anything is stored)."""
    cdef int ovf = 0
    cdef long long v
    if rmq_small_long(o, &v):
        return v
    v = PyLong_AsLongLongAndOverflow(o, &ovf)
    if ovf:
        raise OverflowError(f"{o} does not fit in a 64-bit field")
    return v


cdef inline bint _long_in(object v, long long lo, long long hi, long long *out) noexcept:
    """Whether *v* is an exact int within [lo, hi] (then its value in *out*):
    the gate's fast path takes no other number, the store's method checks
    (and refuses) the rest."""
    cdef int ovf = 0
    if not rmq_small_long(v, out):  # (the usual values, read inline)
        if not PyLong_CheckExact(v):
            return False
        out[0] = PyLong_AsLongLongAndOverflow(v, &ovf)  # (cannot fail for an exact int)
        if ovf:
            return False
    return lo <= out[0] <= hi


cdef inline int _i32(object o) except? -1:
    cdef long long v = _i64(o)
    if v < -2147483648 or v > 2147483647:
        raise OverflowError(f"{o} does not fit in a 32-bit field")
    return <int>v


cdef inline rmq_i128 _wide(object o) except? -1:
    """*o* as a 128-bit int, exact within +-2**100 (far beyond i64 + 2**31 * 1000)."""
    cdef int ovf = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(o, &ovf)
    if not ovf:
        return <rmq_i128>v
    o = min(max(PyNumber_Index(o), -(1 << 100)), 1 << 100)
    return <rmq_i128><long long>(o >> 64) * ((<rmq_i128>1) << 64) + <unsigned long long>(o & 0xFFFFFFFFFFFFFFFF)


cdef inline void _init_view(Py_buffer *v) noexcept:
    memset(v, 0, sizeof(Py_buffer))


cdef inline bint _get_rw(object obj, Py_buffer *view) except -1:
    """Writable view of *obj* if it has one (True), else a read-only view
    (False): callers raise TypeError only when they actually write, as
    struct.pack_into would."""
    if _try_getbuffer(obj, view, PyBUF_WRITABLE) == 0:
        return True
    PyErr_Clear()
    _init_view(view)
    PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    return False


cdef inline int _not_writable(object obj) except -1:
    raise TypeError(f"argument must be read-write bytes-like object, not {type(obj).__name__}")


cdef uint32_t _crc(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Masked CRC-32 (zlib takes 32-bit lengths, so chunk)."""
    return <uint32_t>(_crc_from(0, p, n) & 0x7FFFFFFF)


cdef bint _HW_CRC = rmq_crc32_hw_available()
# which CRC-32 the kernels run: the same bits either way (tests/test_kernels.py)
CRC32_IMPLEMENTATION = "hardware" if _HW_CRC else "zlib"


cdef unsigned long _crc_from(unsigned long c, const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Raw CRC-32 of *p* continuing from *c*: the CPU's carry-less multiply or
    CRC instructions where it has them (about 10x zlib on a 330-byte record,
    bench/crc32_check.sh), else zlib, which beats a portable table. Callable
    without the GIL; callers holding it release it themselves around long
    inputs (masked_crc32)."""
    cdef unsigned int k
    if _HW_CRC:
        return rmq_crc32(<uint32_t>c, p, <size_t>n)
    while n > 0:
        k = <unsigned int>(n if n < 0x40000000 else 0x40000000)
        c = crc32(c, p, k)
        p += k
        n -= k
    return c


cdef int32_t _java_hash(object s) except? -1:
    return <int32_t>_java_hash_from(0, s)


cdef uint32_t _java_hash_from(uint32_t h, object s) except? 0xFFFFFFFF:
    """Java's String.hashCode continued from *h* (the hash of a prefix)."""
    if not isinstance(s, str):
        raise TypeError(f"java_hash expects str, got {type(s).__name__}")
    rmq_unicode_ready(s)
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(s)
    cdef int kind = PyUnicode_KIND(s)
    cdef const void *data = PyUnicode_DATA(s)
    cdef const uint8_t *p1
    cdef const uint16_t *p2
    cdef const uint32_t *p4
    if kind == PyUnicode_1BYTE_KIND:  # ASCII / Latin-1: one UTF-16 unit each
        p1 = <const uint8_t *>data
        i = 0
        while i + 4 <= n:  # four steps at once: 31**4 * h + 31**3 * c0 + ... (mod 2**32)
            h = 923521 * h + 29791 * p1[i] + 961 * p1[i + 1] + 31 * p1[i + 2] + p1[i + 3]
            i += 4
        while i < n:
            h = 31 * h + p1[i]
            i += 1
    elif kind == PyUnicode_2BYTE_KIND:  # BMP, lone surrogates included
        p2 = <const uint16_t *>data
        for i in range(n):
            h = 31 * h + p2[i]
    else:
        p4 = <const uint32_t *>data
        for i in range(n):
            h = _hash_char(h, p4[i])
    return h


cdef inline uint32_t _hash_char(uint32_t h, uint32_t c) noexcept nogil:
    """Java's hash step over one character: a surrogate pair beyond the BMP."""
    if c > 0xFFFF:
        c -= 0x10000
        h = 31 * h + (0xD800 + (c >> 10))
        return 31 * h + (0xDC00 + (c & 0x3FF))
    return 31 * h + c


cdef inline const char *_utf8(object s, Py_ssize_t *n) except NULL:
    """The UTF-8 of the str *s* and its length: an ASCII str's own bytes
    without a call, else PyUnicode_AsUTF8AndSize (UnicodeError for a lone
    surrogate)."""
    if PyUnicode_IS_COMPACT_ASCII(s):
        n[0] = PyUnicode_GET_LENGTH(s)
        return <const char *>PyUnicode_DATA(s)
    return PyUnicode_AsUTF8AndSize(s, n)


cdef inline int32_t _key_hash(object key) except? -1:
    cdef int32_t h = _java_hash(key)
    if h == -2147483648:
        return 0
    return -h if h < 0 else h


# --- hashing and checksums ------------------------------------------------


def java_hash(s):
    """Java ``String.hashCode()`` of *s*: 31-polynomial over UTF-16 code units.

    Characters outside the BMP count as two units (a surrogate pair).
    Returns a signed 32-bit int. Raises TypeError unless *s* is a str.
    """
    return _java_hash(s)


def index_key_hash(key):
    """IndexFile key hash (``IndexFile.indexKeyHashMethod``): ``abs(java_hash)``,
    with 0 for ``Integer.MIN_VALUE`` (Java's ``Math.abs`` overflow). Always >= 0."""
    return _key_hash(key)


def masked_crc32(data, start=0, end=-1):
    """CRC-32 (IEEE, as ``zlib.crc32``) of ``data[start:end]`` masked with
    0x7FFFFFFF, as RocketMQ's ``UtilAll.crc32`` stores it. ``end=-1`` means the
    end of *data*. Raises ValueError for a range outside *data*."""
    cdef Py_ssize_t s = _idx(start), e = _idx(end), n
    cdef Py_buffer v
    PyObject_GetBuffer(data, &v, PyBUF_SIMPLE)
    try:
        n = v.len
        if e < 0:
            e = n
            end = n
        if not (0 <= s <= e <= n):
            raise ValueError(f"range [{start}, {end}) outside buffer of {n} bytes")
        if e - s <= 65536:
            return _crc(<const unsigned char *>v.buf + s, e - s)
        with nogil:  # long inputs: let other threads run
            crc = _crc(<const unsigned char *>v.buf + s, e - s)
        return crc
    finally:
        PyBuffer_Release(&v)


# --- properties -----------------------------------------------------------


def parse_properties(blob):
    """Decode a property blob exactly as RocketMQ's ``string2messageProperties``.

    Pairs are separated by 0x02 and split at their first 0x01; pairs with an
    empty name or value are dropped; a later duplicate wins. Returns a dict in
    stored order. Invalid UTF-8 is replaced (as Java's decoder does).
    """
    # Splitting raw bytes at 0x01/0x02 and decoding each piece equals decoding
    # first: ASCII bytes are never part of a replaced (invalid) UTF-8 sequence.
    if not PyBytes_CheckExact(blob):
        blob = bytes(blob)
    cdef const char *b = PyBytes_AS_STRING(blob)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(blob), s = 0, e, k
    cdef const char *q
    out = {}
    while s <= n:
        q = <const char *>memchr(b + s, 2, <size_t>(n - s))
        e = q - b if q != NULL else n
        q = <const char *>memchr(b + s, 1, <size_t>(e - s))
        if q != NULL:
            k = q - b
            if s < k < e - 1:
                out[PyUnicode_DecodeUTF8(b + s, k - s, "replace")] = \
                    PyUnicode_DecodeUTF8(b + k + 1, e - k - 1, "replace")
        s = e + 1
    return out


# --- CommitLog records ----------------------------------------------------


cdef inline object _max0(object x):
    return 0 if 0 > x else x  # builtin max(x, 0), operand order included


def record_size(sys_flag, body_len, topic_len, props_len, v2):
    """Length in bytes of a CommitLog record (RocketMQ ``calMsgLength``)."""
    # Object arithmetic: _pure accepts ints of any size here.
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    return 68 + born + store + 4 + _max0(body_len) + (2 if v2 else 1) + topic_len + 2 + _max0(props_len)


cdef struct Rec:
    int queue_id, flag, sys_flag, reconsume_times, bw, sw
    long long queue_offset, physical_offset, born_timestamp, store_timestamp, prepared
    const unsigned char *born
    const unsigned char *store
    const unsigned char *body
    const unsigned char *topic
    const unsigned char *props
    Py_ssize_t born_len, store_len, body_len, topic_len, props_len, props_field, size
    bint v2, append_crc, sep


cdef int _fields(Rec *r, object queue_id, object flag, object queue_offset, object physical_offset,
                 object sys_flag, object born_timestamp, object store_timestamp,
                 object reconsume_times, object prepared) except -1:
    r.queue_id = _i32(queue_id)
    r.flag = _i32(flag)
    r.queue_offset = _i64(queue_offset)
    r.physical_offset = _i64(physical_offset)
    r.sys_flag = _i32(sys_flag)
    r.born_timestamp = _i64(born_timestamp)
    r.store_timestamp = _i64(store_timestamp)
    r.reconsume_times = _i32(reconsume_times)
    r.prepared = _i64(prepared)
    return 0


cdef int _check_hosts(Rec *r, object born_host, object store_host) except -1:
    r.bw = 20 if r.sys_flag & BORNHOST_V6_FLAG else 8
    r.sw = 20 if r.sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    if len(born_host) != r.bw or len(store_host) != r.sw:
        raise ValueError("host field widths disagree with the sysflag V6 bits")
    return 0


cdef int _check_topic(Rec *r, Py_buffer *t) except -1:
    r.topic = <const unsigned char *>t.buf
    r.topic_len = t.len
    if r.topic_len > MAX_TOPIC_LENGTH_V2:
        raise ValueError(f"topic of {r.topic_len} bytes is too long")
    r.v2 = r.topic_len > MAX_TOPIC_LENGTH_V1
    return 0


cdef int _check_props(Rec *r, Py_buffer *p) except -1:
    r.props = <const unsigned char *>p.buf
    r.props_len = r.props_field = p.len
    r.sep = r.append_crc and r.props_len > 0 and r.props[r.props_len - 1] != 2
    if r.append_crc:
        r.props_field += r.sep + CRC32_RESERVED_LEN
    if r.props_field > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties of {r.props_field} bytes exceed {MAX_PROPERTIES_LENGTH}")
    return 0


cdef int _check_size(Rec *r, Py_buffer *b) except -1:
    r.body = <const unsigned char *>b.buf
    r.body_len = b.len
    r.size = (68 + r.bw + r.sw + 4 + r.body_len + (2 if r.v2 else 1) + r.topic_len + 2
              + r.props_field)
    if r.size > 0x7FFFFFFF:  # TOTALSIZE is an i32 (_pure: struct.error)
        raise ValueError(f"record of {r.size} bytes is too large")
    return 0


cdef inline void _put_host(unsigned char *d, const unsigned char *h, Py_ssize_t n, int w) noexcept:
    # struct's "Ns" pads short values with zeros and truncates long ones
    memset(d, 0, w)
    memmove(d, h, n if n < w else w)


cdef void _emit(unsigned char *d, Rec *r) noexcept:
    """Store the validated record *r* at *d* (same store order as _pure):
    TOTALSIZE and the magic code go last, so a record torn by a crash has no
    magic and recovery stops there instead of accepting half a record."""
    cdef unsigned char *q
    cdef uint32_t crc
    cdef int i
    cdef unsigned char head[8]
    st32(head, <uint32_t>r.size)
    st32(head + 4, <uint32_t>(MESSAGE_MAGIC_CODE_V2 if r.v2 else MESSAGE_MAGIC_CODE))
    st32(d + 12, <uint32_t>r.queue_id)
    st32(d + 16, <uint32_t>r.flag)
    st64(d + 20, <uint64_t>r.queue_offset)
    st64(d + 28, <uint64_t>r.physical_offset)
    st32(d + 36, <uint32_t>r.sys_flag)
    st64(d + 40, <uint64_t>r.born_timestamp)
    q = d + 48
    _put_host(q, r.born, r.born_len, r.bw)
    q += r.bw
    st64(q, <uint64_t>r.store_timestamp)
    q += 8
    _put_host(q, r.store, r.store_len, r.sw)
    q += r.sw
    st32(q, <uint32_t>r.reconsume_times)
    st64(q + 4, <uint64_t>r.prepared)
    st32(q + 12, <uint32_t>r.body_len)
    q += 16
    if r.body_len:  # memmove: a source view may alias the target buffer
        memmove(q, r.body, r.body_len)
    # the CRC of the bytes written, not of the source: a body another thread
    # (or C code without the GIL) changes meanwhile still makes a valid record
    st32(d + 8, _crc(q, r.body_len) if r.body_len else 0)
    q += r.body_len
    if r.v2:
        st16(q, <uint32_t>r.topic_len)
        q += 2
    else:
        q[0] = <unsigned char>r.topic_len
        q += 1
    if r.topic_len:
        memmove(q, r.topic, r.topic_len)
    q += r.topic_len
    st16(q, <uint32_t>r.props_field)
    q += 2
    if r.props_len:
        memmove(q, r.props, r.props_len)
    q += r.props_len
    if r.append_crc:
        if r.sep:
            q[0] = 2
            q += 1
        crc = <uint32_t>(_crc_from(_crc_from(0, head, 8), d + 8, q - d - 8) & 0x7FFFFFFF)
        memmove(q, b"__CRC32#\x01", 9)
        for i in range(10):  # least-significant digit first (docs/format.md#crc32-property)
            q[9 + i] = <unsigned char>(48 + crc % 10)
            crc //= 10
        q[19] = 2
    memcpy(d, head, 8)


cdef int _prepare(Rec *r, object born_host, object store_host, object body, object topic,
                  object properties, Py_buffer *bv, Py_buffer *tv, Py_buffer *pv) except -1:
    """Acquire the byte arguments and validate every length (ValueError)."""
    PyObject_GetBuffer(body, bv, PyBUF_SIMPLE)
    PyObject_GetBuffer(topic, tv, PyBUF_SIMPLE)
    PyObject_GetBuffer(properties, pv, PyBUF_SIMPLE)
    _check_hosts(r, born_host, store_host)
    _check_topic(r, tv)
    _check_props(r, pv)
    _check_size(r, bv)
    return 0


cdef int _write(Rec *r, object buf, object pos, object born_host, object store_host, object body,
                object topic, object properties, Py_buffer *views) except -1:
    """The record part of write_record into views[0..3] (body, topic,
    properties, out; the caller releases them): every check first, so an
    error writes nothing, then the store (TOTALSIZE and magic last)."""
    cdef Py_ssize_t p0 = _idx(pos)
    _prepare(r, born_host, store_host, body, topic, properties, &views[0], &views[1], &views[2])
    cdef bint writable = _get_rw(buf, &views[3])
    if p0 < 0 or r.size > views[3].len - p0:
        raise ValueError(f"record of {r.size} bytes does not fit at position {pos}")
    if not PyBytes_CheckExact(born_host):
        born_host = bytes(born_host)
    if not PyBytes_CheckExact(store_host):
        store_host = bytes(store_host)
    if not writable:
        _not_writable(buf)
    r.born = <const unsigned char *>PyBytes_AS_STRING(born_host)
    r.born_len = PyBytes_GET_SIZE(born_host)
    r.store = <const unsigned char *>PyBytes_AS_STRING(store_host)
    r.store_len = PyBytes_GET_SIZE(store_host)
    _emit(<unsigned char *>views[3].buf + p0, r)
    return 0


def write_record(
    buf, pos, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
    born_host, store_timestamp, store_host, reconsume_times, prepared_transaction_offset,
    body, topic, properties, bint append_crc,
):
    """Encode one CommitLog record into ``buf[pos:]`` and return its size.

    *born_host* / *store_host* are the raw host fields (address bytes + i32
    port: 8 bytes for IPv4, 20 for IPv6) and must agree with the V6 bits of
    *sys_flag*; *topic* and *properties* are UTF-8 bytes; BODYCRC is computed
    here. v2 magic is used iff the topic is over 127 bytes. With *append_crc*
    the ``__CRC32#`` entry is appended over the finished record.

    Raises ValueError (nothing written) when the record does not fit in the
    buffer, a length is out of range or a host width disagrees with *sys_flag*.
    """
    cdef Rec r
    cdef Py_buffer views[4]
    cdef int i
    _fields(&r, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
            store_timestamp, reconsume_times, prepared_transaction_offset)
    r.append_crc = append_crc
    memset(views, 0, sizeof(views))
    try:
        _write(&r, buf, pos, born_host, store_host, body, topic, properties, views)
        return r.size
    finally:
        for i in range(4):
            PyBuffer_Release(&views[i])


def append_dispatch(
    buf, pos, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
    born_host, store_timestamp, store_host, reconsume_times, prepared_transaction_offset,
    body, topic, properties, bint append_crc,
    cq_buf, cq_pos, tags_code, index_buf, hash_slot_num, index_num, key_prefix, keys,
):
    """One put in one call (ASYNC_FLUSH's dispatch done at append time):
    ``write_record`` with the first 17 arguments, then the ConsumeQueue unit
    (``cq_put(cq_buf, cq_pos, physical_offset, size, tags_code)``), then, when
    *index_buf* is not None, ``index_put_keys(index_buf, hash_slot_num,
    index_num, key_prefix, keys, physical_offset, store_timestamp)``. Written
    in that order (what a crash leaves is a prefix recovery can finish).

    Returns the record size, or 0 with nothing written when the index file
    cannot take every key or its end physical offset is at or past
    *physical_offset* (the caller then takes the step-by-step path). Every
    check comes first: errors (as the three kernels raise them) write nothing.
    """
    cdef Rec r
    cdef Py_buffer views[4]
    cdef Py_buffer cqv, iv
    cdef Py_ssize_t c0, hsn = 0, idx = 0, i, n = 0
    cdef long long tags
    cdef int32_t count
    cdef uint32_t h0 = 0
    cdef unsigned char *u
    _fields(&r, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
            store_timestamp, reconsume_times, prepared_transaction_offset)
    tags = _i64(tags_code)
    r.append_crc = append_crc
    c0 = _idx(cq_pos)
    memset(views, 0, sizeof(views))
    _init_view(&cqv)
    _init_view(&iv)
    try:
        # every check comes before the first store: an error or a refusal writes nothing
        if index_buf is not None:
            h0 = _check_keys(key_prefix, keys)
            n = PyList_GET_SIZE(keys)
            if not _get_rw(index_buf, &iv):
                _not_writable(index_buf)
            _check_index(&iv, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
            u = <unsigned char *>iv.buf
            count = ld32(u + 36)
            if count <= 0:
                count = 1
            if r.physical_offset <= ld64(u + 24) or count + n > idx:
                return 0  # indexed already (or partly), or the file fills up: the caller's steps
        if not _get_rw(cq_buf, &cqv):
            _not_writable(cq_buf)
        if c0 < 0 or c0 > cqv.len - CQ_STORE_UNIT_SIZE:
            raise ValueError(f"no ConsumeQueue unit at {cq_pos} in a buffer of {cqv.len} bytes")
        # the record, then its unit, then its keys: what a crash leaves is
        # always a prefix that recovery knows how to finish or cut
        _write(&r, buf, pos, born_host, store_host, body, topic, properties, views)
        u = <unsigned char *>cqv.buf + c0
        st64(u, <uint64_t>r.physical_offset)
        st64(u + 12, <uint64_t>tags)
        st32(u + 8, <uint32_t>r.size)  # size last: a torn unit is invalid
        if index_buf is not None:
            for i in range(n):
                _index_put(<unsigned char *>iv.buf, hsn, idx, _abs_hash(_java_hash_from(h0, keys[i])),
                           r.physical_offset, r.store_timestamp)
        return r.size
    finally:
        PyBuffer_Release(&iv)
        PyBuffer_Release(&cqv)
        for i in range(4):
            PyBuffer_Release(&views[i])


def encode_record(
    queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
    store_timestamp, store_host, reconsume_times, prepared_transaction_offset, body, topic,
    properties, bint append_crc,
):
    """``write_record`` into a new buffer; returns the record's bytes."""
    cdef Rec r
    cdef Py_buffer tv, pv, bv
    _fields(&r, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
            store_timestamp, reconsume_times, prepared_transaction_offset)
    r.append_crc = append_crc
    _init_view(&tv)
    _init_view(&pv)
    _init_view(&bv)
    try:
        _prepare(&r, born_host, store_host, body, topic, properties, &bv, &tv, &pv)
        if not PyBytes_CheckExact(born_host):
            born_host = bytes(born_host)
        if not PyBytes_CheckExact(store_host):
            store_host = bytes(store_host)
        r.born = <const unsigned char *>PyBytes_AS_STRING(born_host)
        r.born_len = PyBytes_GET_SIZE(born_host)
        r.store = <const unsigned char *>PyBytes_AS_STRING(store_host)
        r.store_len = PyBytes_GET_SIZE(store_host)
        out = PyBytes_FromStringAndSize(NULL, r.size)
        _emit(<unsigned char *>PyBytes_AS_STRING(out), &r)
        return out
    finally:
        PyBuffer_Release(&pv)
        PyBuffer_Release(&tv)
        PyBuffer_Release(&bv)


cdef bint _find_crc(const unsigned char *p, Py_ssize_t n, long long *out) noexcept nogil:
    """Value of the last ``__CRC32#`` entry in p[:n] (as _pure._find_crc_property)."""
    cdef Py_ssize_t i = n - 9, k
    cdef long long v = 0
    while i >= 0:  # rfind
        if p[i] == 95 and memcmp(p + i, b"__CRC32#\x01", 9) == 0:
            break
        i -= 1
    if i < 0 or (i > 0 and p[i - 1] != 2) or n - (i + 9) < 10:
        return False
    for k in range(9, -1, -1):  # digits are stored least-significant first
        if not 48 <= p[i + 9 + k] <= 57:
            return False
        v = v * 10 + (p[i + 9 + k] - 48)
    out[0] = v
    return True


cdef int _check(const unsigned char *b, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t limit,
                bint check_crc, int verify_prop_crc, Py_ssize_t max_size) noexcept nogil:
    cdef Py_ssize_t end, p, body_start
    cdef int32_t size, magic, sys_flag, body_len, topic_len, props_len
    cdef int tlw
    cdef long long stored = 0
    if limit > n:
        limit = n
    if pos < 0 or limit < pos or limit - pos < 8:
        return REC_TRUNCATED
    size = ld32(b + pos)
    magic = ld32(b + pos + 4)
    if magic == BLANK_MAGIC_CODE:
        return REC_BLANK
    if magic == MESSAGE_MAGIC_CODE:
        tlw = 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        tlw = 2
    else:
        return REC_BAD_MAGIC
    if size < MIN_RECORD_SIZE or size > max_size:
        return REC_BAD_SIZE
    if size > limit - pos:
        return REC_TRUNCATED
    # from here on pos + size <= n, and every sum below stays < n + 2**32
    end = pos + size
    sys_flag = ld32(b + pos + 36)
    p = pos + 68 + (20 if sys_flag & BORNHOST_V6_FLAG else 8) + (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8)
    if p + 4 > end:
        return REC_LENGTH_MISMATCH
    body_len = ld32(b + p)
    p += 4
    if body_len < 0:
        return REC_BAD_SIZE
    if p + body_len + tlw > end:
        return REC_LENGTH_MISMATCH
    body_start = p
    p += body_len
    if tlw == 1:
        topic_len = b[p]
        if topic_len > 127:  # Java reads a signed byte
            return REC_BAD_SIZE
    else:
        topic_len = ld16(b + p)
        if topic_len < 0:
            return REC_BAD_SIZE
    p += tlw + topic_len
    if p + 2 > end:
        return REC_LENGTH_MISMATCH
    props_len = ld16(b + p)
    if props_len < 0:
        return REC_BAD_SIZE
    p += 2
    if p + props_len != end:
        return REC_LENGTH_MISMATCH
    if check_crc:
        # every RocketMQ writer ends a property blob with 0x02; without it the
        # record was cut short, which neither CRC may cover (topic, properties)
        if props_len > 0 and b[end - 1] != 2:
            return REC_TORN
        if verify_prop_crc == 1:
            if props_len < CRC32_RESERVED_LEN:
                return REC_PROP_CRC
            if not _find_crc(b + p, props_len, &stored) or \
                    stored != _crc(b + pos, size - CRC32_RESERVED_LEN):
                return REC_PROP_CRC
        else:
            if body_len > 0 and <int64_t>_crc(b + body_start, body_len) != ld32(b + pos + 8):
                return REC_BODY_CRC
            if verify_prop_crc == 2 and _tail_crc(b + p, props_len, &stored) and \
                    stored != _crc(b + pos, size - CRC32_RESERVED_LEN):
                return REC_PROP_CRC
    return size


cdef bint _tail_crc(const unsigned char *p, Py_ssize_t n, long long *out) noexcept nogil:
    """Whether the blob ends with a whole ``__CRC32#`` entry (the store's own,
    appended last); its value into *out*."""
    cdef Py_ssize_t i, t
    cdef long long v = 0
    if n < CRC32_RESERVED_LEN:
        return False
    t = n - CRC32_RESERVED_LEN
    if (t > 0 and p[t - 1] != 2) or memcmp(p + t, b"__CRC32#\x01", 9) != 0 or p[n - 1] != 2:
        return False
    for i in range(n - 2, t + 8, -1):  # digits, most significant last
        if p[i] < 48 or p[i] > 57:
            return False
        v = v * 10 + (p[i] - 48)
    out[0] = v
    return True


def check_record(buf, pos, limit, bint check_crc, int verify_prop_crc, max_size):
    """Validate the record at ``buf[pos:limit]`` (RocketMQ ``checkMessageAndReturnSize``).

    Returns the record size (> 0) for a valid message, ``REC_BLANK`` (0) for
    the END_OF_FILE record, or a negative ``REC_*`` code (see ``_layout``).
    TOTALSIZE is checked against ``[MIN_RECORD_SIZE, max_size]`` and the bytes
    left before anything is read. With *check_crc*, *verify_prop_crc*
    selects what is verified: 0 the body CRC; 1 the ``__CRC32#`` property
    instead, which must be present (RocketMQ's forceVerifyPropCRC); 2 the body
    CRC and, when the record ends with the store's ``__CRC32#`` entry, that too.
    With *check_crc* a non-empty property blob must also end with 0x02
    (``REC_TORN`` otherwise).
    """
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(limit), mx = _idx(max_size)
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        return _check(<const unsigned char *>v.buf, v.len, p0, lim, check_crc, verify_prop_crc, mx)
    finally:
        PyBuffer_Release(&v)


def decode_record(buf, pos, bint with_body):
    """Decode the record at *pos*, which ``check_record`` has accepted.

    Returns ``(total_size, magic, body_crc, queue_id, flag, queue_offset,
    physical_offset, sys_flag, born_timestamp, born_host, store_timestamp,
    store_host, reconsume_times, prepared_transaction_offset, body, topic,
    properties)``: hosts as raw field bytes (address + i32 port), body as bytes
    (None unless *with_body*), topic as str, properties as the raw blob bytes.
    Raises ValueError if the record is not well formed or leaves the buffer.
    """
    cdef Py_ssize_t p0 = _idx(pos), n, end, p
    cdef const unsigned char *b
    cdef const unsigned char *h
    cdef int32_t size, magic, sys_flag, body_len, topic_len, props_len
    cdef int bw, sw
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        n = v.len
        if p0 < 0 or p0 > n - 8:
            raise ValueError(f"no record at {pos}")
        size = ld32(b + p0)
        magic = ld32(b + p0 + 4)
        if (magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2) \
                or size < MIN_RECORD_SIZE or size > n - p0:
            raise ValueError(f"no valid record at {pos}")
        sys_flag = ld32(b + p0 + 36)
        bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
        sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
        end = p0 + size
        if 72 + bw + sw > size:
            raise ValueError(f"record at {pos} is shorter than its header")
        h = b + p0 + 48 + bw  # STORETIMESTAMP
        body_len = ld32(h + 20 + sw)
        p = p0 + 72 + bw + sw
        if body_len < 0 or body_len > end - p:
            raise ValueError(f"record at {pos} has a bad body length")
        body = PyBytes_FromStringAndSize(<const char *>b + p, body_len) if with_body else None
        p += body_len
        if magic == MESSAGE_MAGIC_CODE:
            if p + 1 > end:
                raise ValueError(f"record at {pos} is truncated")
            topic_len = <signed char>b[p]
            p += 1
        else:
            if p + 2 > end:
                raise ValueError(f"record at {pos} is truncated")
            topic_len = ld16(b + p)
            p += 2
        if topic_len < 0 or p + topic_len + 2 > end:
            raise ValueError(f"record at {pos} has a bad topic length")
        topic = PyUnicode_DecodeUTF8(<const char *>b + p, topic_len, "replace")
        p += topic_len
        props_len = ld16(b + p)
        p += 2
        if props_len < 0 or p + props_len > end:
            raise ValueError(f"record at {pos} has a bad properties length")
        return (
            size, magic, ld32(b + p0 + 8), ld32(b + p0 + 12), ld32(b + p0 + 16),
            ld64(b + p0 + 20), ld64(b + p0 + 28), sys_flag, ld64(b + p0 + 40),
            PyBytes_FromStringAndSize(<const char *>b + p0 + 48, bw), ld64(h),
            PyBytes_FromStringAndSize(<const char *>h + 8, sw), ld32(h + 8 + sw),
            ld64(h + 12 + sw), body, topic,
            PyBytes_FromStringAndSize(<const char *>b + p, props_len),
        )
    finally:
        PyBuffer_Release(&v)


# --- bulk decoding into columns --------------------------------------------
#
# One pass over the records appends every field to growable C buffers; the
# buffers become numpy arrays at the end (one copy, no Python object per
# record). Column order is fixed by the _C_* indices below.

cdef struct _Col:
    char *p
    Py_ssize_t n
    Py_ssize_t cap
    bint borrowed  # p is the caller's (stack) buffer, not malloc'd: _grow copies out, _free leaves it

cdef enum:
    _C_PHY, _C_QOFF, _C_BORN_TS, _C_STORE_TS, _C_PREPARED,  # int64
    _C_SIZE, _C_QID, _C_FLAG, _C_SYSFLAG, _C_RECONSUME, _C_BODYCRC,  # int32
    _C_TOPIC, _C_BORN_HOST, _C_STORE_HOST, _C_MSGID, _C_TAGS, _C_KEYS, _C_UNIQ,  # strings
    _C_BODY, _C_PKEY, _C_PVAL,
    _C_STRINGS_END,
    _C_NCOLS = _C_STRINGS_END * 2 + 4  # data + offsets per string column, 3 valid, props offsets

cdef enum:
    _C_OFFSETS = _C_STRINGS_END  # offsets of string column c are at _C_OFFSETS + c
    _C_TAGS_VALID = _C_STRINGS_END * 2
    _C_KEYS_VALID
    _C_UNIQ_VALID
    _C_PROPS_OFFSETS

_COLUMN_NAMES = (
    "physical_offset", "queue_offset", "born_timestamp", "store_timestamp", "prepared_transaction_offset",
    "store_size", "queue_id", "flag", "sys_flag", "reconsume_times", "body_crc",
    "topic", "born_host", "store_host", "msg_id", "tags", "keys", "unique_key", "body", "property_key",
    "property_value",
)

cdef int _grow(_Col *c, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap = c.cap * 2
    cdef char *q
    if cap < c.n + extra:
        cap = c.n + extra
    if cap < 4096:
        cap = 4096
    if c.borrowed:
        q = <char *>malloc(cap)
        if q != NULL:
            memcpy(q, c.p, c.n)
    else:
        q = <char *>realloc(c.p, cap)
    if q == NULL:
        raise MemoryError()
    c.p = q
    c.cap = cap
    c.borrowed = False
    return 0


cdef inline void _on_stack(_Col *c, char *buf, Py_ssize_t size) noexcept:
    """Start *c* empty in the caller's *buf* (a lookup's few entries need no
    malloc); _free then releases only what _grow allocated."""
    c.p, c.n, c.cap, c.borrowed = buf, 0, size, True


cdef inline void _free(_Col *c) noexcept:
    if not c.borrowed:
        free(c.p)

cdef inline int _put(_Col *c, const void *src, Py_ssize_t k) except -1:
    if c.n + k > c.cap:
        _grow(c, k)
    memcpy(c.p + c.n, src, k)
    c.n += k
    return 0

cdef inline int _put64(_Col *c, int64_t v) except -1:
    return _put(c, &v, 8)

cdef inline int _put32(_Col *c, int32_t v) except -1:
    return _put(c, &v, 4)

cdef inline int _end_string(_Col *cols, int c) except -1:
    """Close one value of string column *c*: its end offset."""
    return _put32(&cols[_C_OFFSETS + c], <int32_t>cols[c].n)

cdef Py_ssize_t _fmt_int(char *out, long long v) noexcept:
    cdef char tmp[24]
    cdef Py_ssize_t i = 0, k = 0
    cdef unsigned long long u = <unsigned long long>(-v) if v < 0 else <unsigned long long>v
    if v < 0:
        out[k] = 45  # '-'
        k += 1
    while True:
        tmp[i] = <char>(48 + u % 10)
        i += 1
        u //= 10
        if u == 0:
            break
    while i > 0:
        i -= 1
        out[k] = tmp[i]
        k += 1
    return k

cdef Py_ssize_t _fmt_host(char *out, const unsigned char *raw, int width) noexcept:
    """``a.b.c.d:port`` or Java's ``[x:x:x:x:x:x:x:x]:port`` (as message.decode_host)."""
    cdef Py_ssize_t k = 0
    cdef int i, g, shift, started
    if width == 8:
        for i in range(4):
            k += _fmt_int(out + k, raw[i])
            out[k] = 46 if i < 3 else 58  # '.' / ':'
            k += 1
    else:
        out[k] = 91  # '['
        k += 1
        for i in range(8):
            g = (raw[2 * i] << 8) | raw[2 * i + 1]
            started = 0
            for shift in range(12, -4, -4):
                if (g >> shift) & 15 or started or shift == 0:
                    out[k] = b"0123456789abcdef"[(g >> shift) & 15]
                    k += 1
                    started = 1
            out[k] = 58 if i < 7 else 93  # ':' / ']'
            k += 1
        out[k] = 58
        k += 1
    return k + _fmt_int(out + k, ld32(raw + width - 4))

cdef int _put_hex(_Col *c, const unsigned char *p, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    if c.n + 2 * n > c.cap:
        _grow(c, 2 * n)
    for i in range(n):
        c.p[c.n + 2 * i] = b"0123456789ABCDEF"[p[i] >> 4]
        c.p[c.n + 2 * i + 1] = b"0123456789ABCDEF"[p[i] & 15]
    c.n += 2 * n
    return 0

cdef struct _Pair:
    Py_ssize_t k, kn, v, vn  # positions and lengths within the blob

cdef inline bint _is_name(const unsigned char *b, _Pair *e, const char *name, Py_ssize_t n) noexcept:
    return e.kn == n and memcmp(b + e.k, name, n) == 0

cdef inline bint _entry(const unsigned char *b, Py_ssize_t n, Py_ssize_t *s, _Pair *pr) noexcept:
    """RocketMQ's property parsing, one entry: the entry at *s* of the n-byte
    blob (split by 0x02, named up to its first 0x01) into *pr*; False when
    its name or value is empty (dropped). *s* moves past it (past n at the
    end: loop while *s* <= n)."""
    cdef Py_ssize_t st = s[0], e, i
    cdef const unsigned char *q = <const unsigned char *>memchr(b + st, 2, n - st) if st < n else NULL
    e = (q - b) if q != NULL else n
    q = <const unsigned char *>memchr(b + st, 1, e - st) if e > st else NULL
    s[0] = e + 1
    if q == NULL:
        return False
    i = q - b
    if i <= st or i >= e - 1:
        return False
    pr.k, pr.kn, pr.v, pr.vn = st, i - st, i + 1, e - i - 1
    return True


cdef Py_ssize_t _pairs(const unsigned char *b, Py_ssize_t n, _Col *tmp) except -1:
    """RocketMQ's property parsing into *tmp* (an array of _Pair): the
    _entry pairs, a later duplicate overwriting the earlier value in place.
    Returns the pair count."""
    cdef Py_ssize_t s = 0, j, count = 0
    cdef _Pair pr
    cdef _Pair *all
    tmp.n = 0
    while s <= n:
        if _entry(b, n, &s, &pr):
            all = <_Pair *>tmp.p
            for j in range(count):
                if all[j].kn == pr.kn and memcmp(b + all[j].k, b + pr.k, pr.kn) == 0:
                    all[j].v = pr.v
                    all[j].vn = pr.vn
                    break
            else:
                _put(tmp, &pr, sizeof(_Pair))
                count += 1
    return count

cdef object _np = None

cdef object _array(_Col *c, object dtype, Py_ssize_t itemsize):
    global _np
    if _np is None:
        import numpy
        _np = numpy
    arr = _np.empty(c.n // itemsize, dtype=dtype)
    cdef Py_buffer v
    if c.n:
        PyObject_GetBuffer(arr, &v, PyBUF_WRITABLE)
        memcpy(v.buf, c.p, c.n)
        PyBuffer_Release(&v)
    return arr

cdef int _optional(_Col *cols, int c, int valid, const unsigned char *b, _Pair *e) except -1:
    cdef uint8_t yes = e != NULL
    if yes:
        _put(&cols[c], b + e.v, e.vn)
    _end_string(cols, c)
    return _put(&cols[valid], &yes, 1)


cdef int _decode_one(_Col *cols, _Col *tmp, const unsigned char *b, Py_ssize_t p0, int32_t size,
                     bint with_body, bint with_properties) except -1:
    """Append the record at *p0* (which _check accepted) to every column."""
    cdef int64_t phy = ld64(b + p0 + 28)
    cdef int32_t sys_flag, body_len, topic_len, props_len
    cdef int bw, sw
    cdef Py_ssize_t p, i, np_
    cdef const unsigned char *h
    cdef const unsigned char *props
    cdef char text[64]
    cdef _Pair *pairs
    cdef _Pair *tags
    cdef _Pair *keys
    cdef _Pair *uniq
    sys_flag = ld32(b + p0 + 36)
    bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    h = b + p0 + 48 + bw  # STORETIMESTAMP
    _put64(&cols[_C_PHY], phy)
    _put64(&cols[_C_QOFF], ld64(b + p0 + 20))
    _put64(&cols[_C_BORN_TS], ld64(b + p0 + 40))
    _put64(&cols[_C_STORE_TS], ld64(h))
    _put64(&cols[_C_PREPARED], ld64(h + 12 + sw))
    _put32(&cols[_C_SIZE], size)
    _put32(&cols[_C_QID], ld32(b + p0 + 12))
    _put32(&cols[_C_FLAG], ld32(b + p0 + 16))
    _put32(&cols[_C_SYSFLAG], sys_flag)
    _put32(&cols[_C_RECONSUME], ld32(h + 8 + sw))
    _put32(&cols[_C_BODYCRC], ld32(b + p0 + 8))
    _put(&cols[_C_BORN_HOST], text, _fmt_host(text, b + p0 + 48, bw))
    _end_string(cols, _C_BORN_HOST)
    _put(&cols[_C_STORE_HOST], text, _fmt_host(text, h + 8, sw))
    _end_string(cols, _C_STORE_HOST)
    _put_hex(&cols[_C_MSGID], h + 8, sw)
    _put_hex(&cols[_C_MSGID], b + p0 + 28, 8)
    _end_string(cols, _C_MSGID)
    # _check accepted the record, so these lengths are consistent
    p = p0 + 72 + bw + sw
    body_len = ld32(b + p - 4)
    if with_body:
        _put(&cols[_C_BODY], b + p, body_len)
        _end_string(cols, _C_BODY)
    p += body_len
    if ld32(b + p0 + 4) == MESSAGE_MAGIC_CODE:
        topic_len = b[p]
        p += 1
    else:
        topic_len = ld16(b + p)
        p += 2
    _put(&cols[_C_TOPIC], b + p, topic_len)
    _end_string(cols, _C_TOPIC)
    p += topic_len
    props_len = ld16(b + p)
    props = b + p + 2
    np_ = _pairs(props, props_len, tmp)
    pairs = <_Pair *>tmp.p
    tags = keys = uniq = NULL
    for i in range(np_):
        if _is_name(props, &pairs[i], "TAGS", 4):
            tags = &pairs[i]
        elif _is_name(props, &pairs[i], "KEYS", 4):
            keys = &pairs[i]
        elif _is_name(props, &pairs[i], "UNIQ_KEY", 8):
            uniq = &pairs[i]
        if with_properties:
            _put(&cols[_C_PKEY], props + pairs[i].k, pairs[i].kn)
            _end_string(cols, _C_PKEY)
            _put(&cols[_C_PVAL], props + pairs[i].v, pairs[i].vn)
            _end_string(cols, _C_PVAL)
    _optional(cols, _C_TAGS, _C_TAGS_VALID, props, tags)
    _optional(cols, _C_KEYS, _C_KEYS_VALID, props, keys)
    _optional(cols, _C_UNIQ, _C_UNIQ_VALID, props, uniq)
    if with_properties:
        _put32(&cols[_C_PROPS_OFFSETS], <int32_t>((cols[_C_OFFSETS + _C_PKEY].n // 4) - 1))
    return 0


cdef object _columns_out(_Col *cols, bint with_body, bint with_properties):
    """The columns as numpy arrays (decode_columns' dict)."""
    cdef int i
    out = {}
    for i in range(_C_PHY, _C_PREPARED + 1):
        out[_COLUMN_NAMES[i]] = _array(&cols[i], "int64", 8)
    for i in range(_C_SIZE, _C_BODYCRC + 1):
        out[_COLUMN_NAMES[i]] = _array(&cols[i], "int32", 4)
    for i in range(_C_TOPIC, _C_STRINGS_END):
        if (i == _C_BODY and not with_body) or ((i == _C_PKEY or i == _C_PVAL) and not with_properties):
            continue
        out[_COLUMN_NAMES[i] + "_offsets"] = _array(&cols[_C_OFFSETS + i], "int32", 4)
        out[_COLUMN_NAMES[i] + "_data"] = _array(&cols[i], "uint8", 1)
    out["tags_valid"] = _array(&cols[_C_TAGS_VALID], "bool", 1)
    out["keys_valid"] = _array(&cols[_C_KEYS_VALID], "bool", 1)
    out["unique_key_valid"] = _array(&cols[_C_UNIQ_VALID], "bool", 1)
    if with_properties:
        out["properties_offsets"] = _array(&cols[_C_PROPS_OFFSETS], "int32", 4)
    return out


cdef int _columns_init(_Col *cols) except -1:
    cdef int i
    for i in range(_C_STRINGS_END):
        _put32(&cols[_C_OFFSETS + i], 0)
    _put32(&cols[_C_PROPS_OFFSETS], 0)
    return 0


def decode_columns(buf, pos, end, base_offset, max_count, bint with_body, bint with_properties,
                   bint check_crc=False):
    """Decode consecutive CommitLog records of one file into columns.

    Reads records from byte *pos* of *buf* (one CommitLog file: mmap, bytes,
    memoryview) while they lie before *end*, at most *max_count* of them.
    *base_offset* is the physical offset of ``buf[0]`` (the file name); a
    record whose PHYSICALOFFSET differs from ``base_offset + position`` stops
    the scan with ``REC_BAD_OFFSET`` (pass -1 to skip that check). Every record
    is validated like ``check_record`` (with *check_crc*: body CRC, the store's
    ``__CRC32#`` when present, and the 0x02 terminator).

    Returns ``(next_pos, stop, cols)``. *stop* says why decoding ended at
    *next_pos*: ``STOP_LIMIT`` (1) max_count reached, ``STOP_END`` (2) *end*
    reached, ``REC_BLANK`` (0) an END_OF_FILE record or zeros (no more data in
    this file), or a negative ``REC_*`` code for an invalid record there.
    *cols* maps names to numpy arrays of n rows (n = records decoded):
    int64 physical_offset, queue_offset, born_timestamp, store_timestamp,
    prepared_transaction_offset; int32 store_size, queue_id, flag, sys_flag,
    reconsume_times, body_crc; Arrow-style string columns as ``<name>_offsets``
    (int32, n + 1) and ``<name>_data`` (uint8) for topic, born_host,
    store_host, msg_id (offset message id), tags, keys, unique_key
    (the last three with ``<name>_valid``, bool, False when the property is
    absent); with *with_body* ``body_offsets``/``body_data`` (the body as
    stored); with *with_properties* the property map as ``properties_offsets``
    (int32, n + 1, into the entries) and ``property_key_offsets``/
    ``property_key_data``, ``property_value_offsets``/``property_value_data``
    (RocketMQ's parsing rules: empty names or values dropped, a later
    duplicate replaces the earlier value in the earlier place). Strings are
    the stored bytes, not re-validated as UTF-8. Raises ValueError for
    positions outside the buffer or a negative *max_count*.
    """
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(end), mx = _idx(max_count), n, count = 0, i
    cdef long long base = _i64(base_offset), phy
    cdef const unsigned char *b
    cdef int32_t size
    cdef int stop = STOP_END, rc
    cdef _Col cols[_C_NCOLS]
    cdef _Col tmp
    cdef Py_buffer v
    memset(cols, 0, sizeof(cols))
    memset(&tmp, 0, sizeof(tmp))
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        n = v.len
        if p0 < 0 or lim < p0 or p0 > n or mx < 0:
            raise ValueError(f"bad range pos={pos} end={end} max_count={max_count} for a buffer of {n} bytes")
        if lim > n:
            lim = n
        _columns_init(cols)
        while p0 < lim:
            if count >= mx:
                stop = STOP_LIMIT
                break
            if lim - p0 >= 8 and ld32(b + p0) == 0 and ld32(b + p0 + 4) == 0:
                stop = REC_BLANK
                break
            rc = _check(b, n, p0, lim, check_crc, 2, lim - p0)
            if rc <= 0:
                stop = rc
                break
            size = rc
            phy = ld64(b + p0 + 28)
            if base >= 0 and <rmq_i128>phy != <rmq_i128>base + p0:
                stop = REC_BAD_OFFSET
                break
            _decode_one(cols, &tmp, b, p0, size, with_body, with_properties)
            p0 += size
            count += 1
        out = _columns_out(cols, with_body, with_properties)
        return p0, stop, out
    finally:
        PyBuffer_Release(&v)
        for i in range(_C_NCOLS):
            free(cols[i].p)
        free(tmp.p)


def decode_columns_at(bufs, file_size, base, offsets, bint with_body, bint with_properties):
    """``decode_columns`` for records at given physical offsets (a pull: the
    offsets of ConsumeQueue units) instead of consecutive ones.

    *bufs* are the CommitLog segments in order, each *file_size* bytes, the
    first at physical offset *base* (``CommitLog.segment_view()[:3]``);
    *offsets* a list of physical offsets. Each record is validated as a read
    does (``check_record`` with the body CRC, PHYSICALOFFSET equal to its offset).
    Returns ``(count, stop, cols)``: the first *count* offsets decoded into
    *cols* (as ``decode_columns``), *stop* ``STOP_END`` when all were, else
    the ``REC_*`` code of ``offsets[count]`` (``REC_BAD_OFFSET`` also for an
    offset outside the segments). Raises TypeError unless *bufs* and
    *offsets* are lists, ValueError for a file size that is not positive."""
    cdef long long fs = _i64(file_size), b0 = _i64(base), phy
    cdef Py_ssize_t i, seg, last = -1, pos, nbufs, count = 0
    cdef int stop = STOP_END, rc
    cdef _Col cols[_C_NCOLS]
    cdef _Col tmp
    cdef Py_buffer v
    if not PyList_CheckExact(bufs) or not PyList_CheckExact(offsets):
        raise TypeError("bufs and offsets must be lists")
    if fs <= 0:
        raise ValueError(f"file size {file_size} is not positive")
    nbufs = PyList_GET_SIZE(bufs)
    memset(cols, 0, sizeof(cols))
    memset(&tmp, 0, sizeof(tmp))
    _init_view(&v)
    try:
        _columns_init(cols)
        for i in range(PyList_GET_SIZE(offsets)):
            phy = _i64(offsets[i])
            if phy < b0 or (phy - b0) // fs >= nbufs:
                stop = REC_BAD_OFFSET
                break
            seg = <Py_ssize_t>((phy - b0) // fs)
            if seg != last:  # units of a pull mostly share a segment: one view for them
                PyBuffer_Release(&v)
                last = -1
                PyObject_GetBuffer(bufs[seg], &v, PyBUF_SIMPLE)
                last = seg
            pos = <Py_ssize_t>(phy - b0 - seg * fs)
            rc = _check(<const unsigned char *>v.buf, v.len, pos, v.len, True, 0, v.len - pos)
            if rc > 0 and ld64(<const unsigned char *>v.buf + pos + 28) != phy:
                rc = REC_BAD_OFFSET
            if rc <= 0:
                stop = rc
                break
            _decode_one(cols, &tmp, <const unsigned char *>v.buf, pos, rc, with_body, with_properties)
            count += 1
        return count, stop, _columns_out(cols, with_body, with_properties)
    finally:
        PyBuffer_Release(&v)
        for i in range(_C_NCOLS):
            free(cols[i].p)
        free(tmp.p)


def scan_records(buf, pos, end, base_offset, bint check_crc, int verify_prop_crc, max_size):
    """Walk consecutive records of one CommitLog file from *pos* while they
    validate (``check_record`` with *check_crc*, *verify_prop_crc*,
    *max_size*, limited to *end*) and their PHYSICALOFFSET equals
    ``base_offset + position`` (not checked when *base_offset* is -1): the
    CommitLog recovery scan without a Python step per record.

    Returns ``(next_pos, status, count)``: where the walk stopped, why
    (``STOP_END`` when it reached *end*, ``REC_BLANK`` at an END_OF_FILE
    record, ``REC_BAD_OFFSET`` or another negative ``REC_*`` code at an
    invalid record) and how many records it passed. Raises ValueError for a
    range outside the buffer."""
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(end), mx = _idx(max_size), n, count = 0, ahead
    cdef long long base = _i64(base_offset)
    cdef const unsigned char *b
    cdef int rc = STOP_END
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        n = v.len
        if p0 < 0 or lim < p0 or p0 > n:
            raise ValueError(f"bad range pos={pos} end={end} for a buffer of {n} bytes")
        if lim > n:
            lim = n
        ahead = p0
        with nogil:  # a long walk: two threads can scan two files
            while p0 < lim:
                # each header says where the next one is: the walk would wait on
                # memory at every record, so keep the next 4 KiB on their way
                while ahead < p0 + 4096 and ahead < lim:
                    prefetch(b + ahead)
                    ahead += 64
                rc = _check(b, n, p0, lim, check_crc, verify_prop_crc, mx)
                if rc <= 0:
                    break
                if base >= 0 and <rmq_i128>ld64(b + p0 + 28) != <rmq_i128>base + p0:
                    rc = REC_BAD_OFFSET
                    break
                p0 += rc
                count += 1
                rc = STOP_END
        return p0, rc, count
    finally:
        PyBuffer_Release(&v)


def read_record(buf, pos, limit, physical_offset, max_size, bint with_body):
    """The record at *pos* if ``check_record(buf, pos, limit, True, 0,
    max_size)`` accepts it (its body CRC too: every read checks it, where
    RocketMQ only checks on recovery) and its PHYSICALOFFSET is
    *physical_offset*: the ``decode_record`` tuple. Otherwise the int status:
    ``REC_BLANK``, a negative ``REC_*`` code (``REC_BODY_CRC`` for a damaged
    body), or ``REC_BAD_OFFSET``. (A read by offset, as a pull does it, in
    one call.)"""
    cdef Py_ssize_t p0 = _idx(pos), lim = _idx(limit), mx = _idx(max_size)
    cdef long long phy = _i64(physical_offset)
    cdef int rc
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        rc = _check(<const unsigned char *>v.buf, v.len, p0, lim, True, 0, mx)
        if rc <= 0:
            return rc
        if ld64(<const unsigned char *>v.buf + p0 + 28) != phy:
            return REC_BAD_OFFSET
    finally:
        PyBuffer_Release(&v)
    return decode_record(buf, pos, with_body)


def read_store_timestamp(buf, pos):
    """STORETIMESTAMP of the record at *pos* (its position depends on the born
    host width). Returns -1 when the field lies outside the buffer."""
    cdef Py_ssize_t p0 = _idx(pos), n, p
    cdef Py_buffer v
    cdef const unsigned char *b
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        n = v.len
        if p0 < 0 or p0 > n - 40:
            return -1
        p = p0 + 48 + (20 if ld32(b + p0 + 36) & BORNHOST_V6_FLAG else 8)
        if p > n - 8:
            return -1
        return ld64(b + p)
    finally:
        PyBuffer_Release(&v)


# --- ConsumeQueue ---------------------------------------------------------


def cq_put(buf, pos, physical_offset, size, tags_code):
    """Write one 20-byte ConsumeQueue unit at *pos*.
    Raises ValueError for a position outside *buf*."""
    cdef long long phy = _i64(physical_offset), tags = _i64(tags_code)
    cdef int sz = _i32(size)
    cdef Py_ssize_t p0 = _idx(pos)
    cdef unsigned char *b
    cdef Py_buffer v
    cdef bint writable = _get_rw(buf, &v)
    try:
        if p0 < 0 or p0 > v.len - CQ_STORE_UNIT_SIZE:
            raise ValueError(f"no ConsumeQueue unit at {pos} in a buffer of {v.len} bytes")
        if not writable:
            _not_writable(buf)
        b = <unsigned char *>v.buf + p0
        # size last: a unit torn by a crash has size 0 and is invalid
        st64(b, <uint64_t>phy)
        st64(b + 12, <uint64_t>tags)
        st32(b + 8, <uint32_t>sz)
    finally:
        PyBuffer_Release(&v)


def cq_get(buf, pos):
    """Read the unit at *pos*: ``(physical_offset, size, tags_code)``.
    Raises ValueError for a position outside *buf*."""
    cdef Py_ssize_t p0 = _idx(pos)
    cdef Py_buffer v
    cdef const unsigned char *b
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        if p0 < 0 or p0 > v.len - CQ_STORE_UNIT_SIZE:
            raise ValueError(f"no ConsumeQueue unit at {pos} in a buffer of {v.len} bytes")
        b = <const unsigned char *>v.buf + p0
        return (ld64(b), ld32(b + 8), ld64(b + 12))
    finally:
        PyBuffer_Release(&v)


def cq_units(buf, start, end):
    """Every unit in ``buf[start:end]`` (whole units only) as tuples."""
    cdef Py_ssize_t s = _idx(start), e = _idx(end), p
    cdef Py_buffer v
    cdef const unsigned char *b
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        if e > v.len:
            e = v.len
        if s < 0 or s >= e:
            return []
        e -= (e - s) % CQ_STORE_UNIT_SIZE
        b = <const unsigned char *>v.buf
        out = []
        p = s
        while p < e:
            out.append((ld64(b + p), ld32(b + p + 8), ld64(b + p + 12)))
            p += CQ_STORE_UNIT_SIZE
        return out
    finally:
        PyBuffer_Release(&v)


def cq_scan(buf, start, end, phy_limit=None):
    """Recovery scan of one ConsumeQueue file.

    From *start*, walk units while they are valid (physical offset >= 0 and
    size > 0) and, when *phy_limit* is an int, point below it (the truncation
    of dirty queue units at recovery). Returns ``(valid_end, max_physical_end)``: the position after
    the last valid unit, and offset + size of the last valid unit that is not
    a pre-blank placeholder (-1 if none).
    """
    cdef Py_ssize_t s = _idx(start), e = _idx(end), p
    cdef int64_t phy, tags, last_phy = 0
    cdef int32_t size, last_size = 0
    cdef bint found = False, limited = phy_limit is not None
    cdef rmq_i128 lim = _wide(phy_limit) if limited else 0
    cdef Py_buffer v
    cdef const unsigned char *b
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        if e > v.len:
            e = v.len
        p = s if s > 0 else 0
        while p < e and e - p >= CQ_STORE_UNIT_SIZE:
            phy = ld64(b + p)
            size = ld32(b + p + 8)
            tags = ld64(b + p + 12)
            if phy < 0 or size <= 0 or (limited and <rmq_i128>phy >= lim):
                break
            if not (phy == 0 and size == PRE_BLANK_SIZE and tags == 0):
                last_phy = phy
                last_size = size
                found = True
            p += CQ_STORE_UNIT_SIZE
    finally:
        PyBuffer_Release(&v)
    # offset + size may pass 2**63: add as Python ints
    max_end = (<object>last_phy) + last_size if found else -1
    if s >= 0 and p == s:
        return start, max_end  # _pure returns max(start, 0) itself
    return p, max_end


@cython.auto_pickle(False)  # (a mapping is not data)
cdef class MappedRegion:
    """A mapped segment as the kernels read and write it: ``mm`` (the
    mapping, any buffer), ``file_from_offset`` (offset of its byte 0 in its
    log), ``file_size`` (bytes) and ``wrote_position`` (bytes appended,
    relative to the file). ``MappedFile`` is a MappedRegion with the file's
    lifecycle; the pure twin has the same class."""

    def __init__(self, mm=None, file_from_offset=0, file_size=0, wrote_position=0):
        self.mm = mm
        self.file_from_offset, self.file_size, self.wrote_position = file_from_offset, file_size, wrote_position


@cython.auto_pickle(False)  # (a store's files are not data)
cdef class MappedQueue:
    """The segments of one log as the kernels walk them: ``files`` (a list
    of :class:`MappedRegion`, in offset order) and ``file_size`` (bytes per
    segment; None for a read-only queue not yet sized). ``MappedFileQueue``
    (RocketMQ's ``MappedFileQueue``) is a MappedQueue with a directory; the
    pure twin has the same class."""


@cython.auto_pickle(False)
cdef class CommitLogBase:
    """A CommitLog as the read kernels use it: ``queue`` (its
    :class:`MappedQueue`) and ``max_record_size`` (the largest record, in
    bytes, a check accepts). ``CommitLog`` is a CommitLogBase with recovery
    and the walks; the pure twin has the same class."""


@cython.auto_pickle(False)
cdef class ConsumeQueueBase:
    """A ConsumeQueue as the kernels use it: ``queue`` (its
    :class:`MappedQueue`), ``min_logic_offset`` (byte offset of the first
    valid unit), ``max_physic_offset`` (physical offset past the last
    unit's record, -1: none; the put kernel advances it), ``topic`` and
    ``queue_id``. ``ConsumeQueue`` is a ConsumeQueueBase with recovery and
    the searches; the pure twin has the same class."""


@cython.auto_pickle(False)
cdef class IndexRegion:
    """An IndexFile as the kernels use it: ``mm`` (the mapping) and its
    geometry, ``hash_slot_num`` and ``index_num``. ``IndexFile`` is an
    IndexRegion with a path and a header; the pure twin has the same
    class."""


@cython.auto_pickle(False)
cdef class IndexServiceBase:
    """The index as a lookup uses it: ``files`` (:class:`IndexRegion`
    objects, oldest first) and ``max_msgs_num_batch`` (the most offsets one
    lookup reads, RocketMQ's ``maxMsgsNumBatch``). ``IndexService`` is an
    IndexServiceBase with rolling and recovery; the pure twin has the same
    class."""


cdef struct _View:
    # a CommitLog view (bufs, file_size, base, lo, hi), one segment held at a time
    long long fs, base, lo, hi
    Py_ssize_t n, seg  # segments; the one held in buf (-1: none)
    bint files  # bufs holds MappedFile objects (their .mm), not buffers
    Py_buffer buf


cdef inline object _segment(object bufs, Py_ssize_t i, bint files):
    return (<MappedRegion?>bufs[i]).mm if files else bufs[i]


cdef object _view_open(_View *v, object view):
    """Parse *view* into v (nothing held yet); returns its list of buffers."""
    bufs, fsz, fbase, flo, fhi = view
    if not PyList_CheckExact(bufs):
        raise TypeError("a CommitLog view holds a list of buffers")
    v.n = PyList_GET_SIZE(bufs)
    v.fs, v.base, v.lo, v.hi = _i64(fsz), _i64(fbase), _i64(flo), _i64(fhi)
    _view_ready(v, False)
    return bufs


cdef inline MappedQueue _queue_of_log(object commitlog):
    cdef MappedQueue queue = (<CommitLogBase?>commitlog).queue
    if queue is None:
        raise TypeError("a CommitLog without a queue")
    return queue


cdef inline Py_ssize_t _max_record(object commitlog) except -1:
    cdef long long m = (<CommitLogBase?>commitlog).max_record_size
    if m < 0 or m > PY_SSIZE_T_MAX:
        raise ValueError(f"max_record_size {m} is out of range")
    return <Py_ssize_t>m


cdef inline MappedQueue _queue_of_cq(object cq):
    cdef MappedQueue queue = (<ConsumeQueueBase?>cq).queue
    if queue is None:
        raise TypeError("a ConsumeQueue without a queue")
    return queue


cdef object _view_of(_View *v, object commitlog):
    """v over *commitlog*'s segments as ``CommitLog.segment_view()`` would
    see them now, read straight from its MappedFile objects; returns them."""
    cdef MappedQueue queue = _queue_of_log(commitlog)
    files = queue.files
    if files is None:
        raise TypeError("a CommitLog's queue has no files list")
    v.n = PyList_GET_SIZE(files)
    if v.n == 0:  # nothing stored (a read-only store may not know its file size): every read misses
        v.fs, v.base, v.lo, v.hi = 1, 0, 0, 0
    else:
        v.fs = _i64(queue.file_size)
        last = files[v.n - 1]
        v.base = v.lo = (<MappedRegion?>files[0]).file_from_offset
        v.hi = (<MappedRegion?>last).file_from_offset + (<MappedRegion?>last).wrote_position
    _view_ready(v, True)
    return files


cdef int _view_ready(_View *v, bint files) except -1:
    """Finish opening v (nothing held yet)."""
    if v.fs <= 0:
        raise ValueError(f"file size {v.fs} is not positive")
    v.seg = -1
    v.files = files
    _init_view(&v.buf)
    return 0


cdef const unsigned char *_view_at(_View *v, object bufs, long long phy, Py_ssize_t *pos,
                                   Py_ssize_t *limit) except? NULL:
    """The segment holding *phy* (NULL outside [lo, hi) and the segments):
    its bytes, *phy*'s position in them and the written limit there."""
    cdef Py_ssize_t i
    cdef long long start = v.base + <long long>v.seg * v.fs
    if v.seg >= 0 and start <= phy and phy - start < v.fs and v.lo <= phy < v.hi:
        pass  # the segment held: units and offsets of one call mostly share one (no division)
    else:
        if phy < v.lo or phy >= v.hi or phy < v.base or (phy - v.base) // v.fs >= v.n:
            return NULL
        i = <Py_ssize_t>((phy - v.base) // v.fs)
        PyBuffer_Release(&v.buf)
        v.seg = -1
        PyObject_GetBuffer(_segment(bufs, i, v.files), &v.buf, PyBUF_SIMPLE)
        v.seg = i
        start = v.base + <long long>i * v.fs
    pos[0] = <Py_ssize_t>(phy - start)
    limit[0] = <Py_ssize_t>(v.fs if v.hi - start > v.fs else v.hi - start)
    return <const unsigned char *>v.buf.buf


cdef struct _Times:
    # a CommitLog view (bufs, file_size, base, lo, hi) probed without a Python call
    bint direct
    bint files  # bufs holds MappedFile objects (c_mode only)
    Py_ssize_t n
    long long fs, base, lo, hi


cdef object _probe(object time_at, object bufs, _Times *tv, int64_t phy, int32_t size):
    """time_at(phy, size): a call, or with a view the STORETIMESTAMP read here."""
    cdef Py_ssize_t i, pos
    cdef Py_buffer v
    cdef const unsigned char *b
    cdef long long t = -1
    if not tv.direct:
        return time_at(phy, size)
    if phy < tv.lo or <rmq_i128>phy + size > tv.hi or phy < tv.base:
        return -1
    i = <Py_ssize_t>((phy - tv.base) // tv.fs)
    if i >= tv.n:
        return -1
    pos = <Py_ssize_t>(phy - tv.base - <long long>i * tv.fs)
    PyObject_GetBuffer(bufs[i], &v, PyBUF_SIMPLE)
    try:
        b = <const unsigned char *>v.buf
        if pos <= v.len - 40:
            i = pos + 48 + (20 if ld32(b + pos + 36) & BORNHOST_V6_FLAG else 8)
            if i <= v.len - 8:
                t = ld64(b + i)
    finally:
        PyBuffer_Release(&v)
    return t


cdef struct _Search:
    _Times tv
    bint c_mode  # a view and an i64 timestamp: every probe and comparison in C
    int64_t ts
    Py_ssize_t seg  # the segment held in view (-1: none)
    long long seg_from  # its first physical offset
    Py_buffer view


cdef inline int64_t _probe_c(_Search *s, object bufs, int64_t phy, int32_t size) except? -2:
    """_probe's view read with the segment buffer kept across probes."""
    cdef Py_ssize_t i, pos
    cdef const unsigned char *b
    if phy < s.tv.lo or <rmq_i128>phy + size > s.tv.hi or phy < s.tv.base:
        return -1
    if s.seg >= 0 and phy >= s.seg_from and phy - s.seg_from < s.tv.fs:
        i = s.seg  # (most probes: no 64-bit division)
    else:
        i = <Py_ssize_t>((phy - s.tv.base) // s.tv.fs)
        if i >= s.tv.n:
            return -1
        PyBuffer_Release(&s.view)
        s.seg = -1
        PyObject_GetBuffer(_segment(bufs, i, s.tv.files), &s.view, PyBUF_SIMPLE)
        s.seg, s.seg_from = i, s.tv.base + <long long>i * s.tv.fs
    pos = <Py_ssize_t>(phy - s.seg_from)
    b = <const unsigned char *>s.view.buf
    if pos <= s.view.len - 40:
        i = pos + 48 + (20 if ld32(b + pos + 36) & BORNHOST_V6_FLAG else 8)
        if i <= s.view.len - 8:
            return ld64(b + i)
    return -1


cdef enum:  # how a probed time relates to the timestamp (_pure's comparisons, in order)
    T_LT = 1
    T_EQ = 2
    T_GT = 4
    T_NEG = 8  # the probe failed (time < 0)


cdef inline int _relate_c(_Search *s, const unsigned char *b, Py_ssize_t p, object bufs) except -1:
    """_relate in c_mode: small enough to be inlined in the search loop."""
    cdef int64_t t = _probe_c(s, bufs, ld64(b + p), ld32(b + p + 8))
    return (T_NEG if t < 0 else 0) | (T_LT if t < s.ts else (T_EQ if t == s.ts else T_GT))


cdef inline int _relate(_Search *s, const unsigned char *b, Py_ssize_t p, object time_at, object bufs,
                        object timestamp) except -1:
    """The relations of the time of the unit at b + p to the timestamp, as
    bits: each comparison _pure makes, made in C when c_mode (inlined; the
    object comparisons stay out of line)."""
    if s.c_mode:
        return _relate_c(s, b, p, bufs)
    return _relate_objects(s, b, p, time_at, bufs, timestamp)


cdef int _relate_objects(_Search *s, const unsigned char *b, Py_ssize_t p, object time_at, object bufs,
                         object timestamp) except -1:
    """_relate outside c_mode: the probe and comparisons as Python objects."""
    cdef int r = 0
    o = _probe(time_at, bufs, &s.tv, ld64(b + p), ld32(b + p + 8))
    if o < 0:
        r |= T_NEG
    if o < timestamp:
        r |= T_LT
    if o == timestamp:
        r |= T_EQ
    if o > timestamp:
        r |= T_GT
    return r


def cq_search_time(buf, file_start, low, range_, timestamp, bint upper, min_physical_offset, time_at):
    """Binary search of one ConsumeQueue file by store time (RocketMQ 5.1.1+
    ``binarySearchInQueueByTime``) returning a queue offset.

    *low* is the first position to consider, *range_* the readable length of
    the file in bytes; ``time_at(physical_offset, size)`` returns a record's
    store timestamp or -1. *time_at* may instead be a CommitLog view
    ``(buffers, file_size, base, lo, hi)`` (a list of the segments' buffers,
    the first one's physical offset *base*, the readable range [lo, hi)),
    which the kernel probes itself, as ``read_store_timestamp`` would, with
    no call per probe. *upper* selects BoundaryType UPPER (else LOWER).
    The caller clamps the answer to the queue's [min, max] offsets.
    """
    # timestamp and time_at's results are compared exactly as _pure does:
    # as Python objects, or in C for a view and an i64 timestamp
    cdef long long fs = _i64(file_start), min_phy
    cdef int min_ovf = 0, ts_ovf = 1
    cdef Py_ssize_t lo = _idx(low), rng = _idx(range_)
    cdef Py_buffer v
    cdef _Search s
    bufs = None
    s.tv.direct = type(time_at) is tuple
    s.tv.files = False
    if s.tv.direct:
        bufs, fsz, fbase, flo, fhi = time_at
        if not PyList_CheckExact(bufs):
            raise TypeError("a CommitLog view holds a list of buffers")
        s.tv.n = PyList_GET_SIZE(bufs)
        s.tv.fs, s.tv.base, s.tv.lo, s.tv.hi = _i64(fsz), _i64(fbase), _i64(flo), _i64(fhi)
        if s.tv.fs <= 0:
            raise ValueError(f"file size {fsz} is not positive")
        if type(timestamp) is int:
            s.ts = PyLong_AsLongLongAndOverflow(timestamp, &ts_ovf)
    s.c_mode = s.tv.direct and ts_ovf == 0
    s.seg = -1
    _init_view(&s.view)
    # a bound beyond i64 compares exactly: above all offsets (ovf > 0) or below all
    min_phy = PyLong_AsLongLongAndOverflow(min_physical_offset, &min_ovf)
    if min_ovf < 0:
        min_phy = LLONG_MIN
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        return _search_time(&s, <const unsigned char *>v.buf, v.len, fs, lo, rng, timestamp, upper,
                            min_phy, min_ovf, time_at, bufs, low)
    finally:
        PyBuffer_Release(&s.view)
        PyBuffer_Release(&v)


cdef object _search_time(_Search *s, const unsigned char *b, Py_ssize_t blen, long long fs, Py_ssize_t lo,
                         Py_ssize_t rng, object timestamp, bint upper, long long min_phy, int min_ovf,
                         object time_at, object bufs, object low):
    """cq_search_time on the units at b (blen bytes) with s set up."""
    cdef int rel
    cdef Py_ssize_t ceiling, floor, high, mid
    cdef Py_ssize_t left = -1, right = -1, target = -1, result
    cdef int64_t phy
    if rng > blen:
        rng = blen
    if rng < CQ_STORE_UNIT_SIZE:
        return jdiv(fs, 0, CQ_STORE_UNIT_SIZE)
    rng -= rng % CQ_STORE_UNIT_SIZE
    if lo > rng - CQ_STORE_UNIT_SIZE:
        return jdiv(fs, 0, CQ_STORE_UNIT_SIZE)
    if lo < 0:  # _pure would read from the buffer's end
        raise ValueError(f"low {low} is negative")
    ceiling = rng - CQ_STORE_UNIT_SIZE
    floor = lo
    high = ceiling
    if _relate(s, b, ceiling, time_at, bufs, timestamp) & T_LT:
        return jdiv(fs, ceiling + (0 if upper else CQ_STORE_UNIT_SIZE), CQ_STORE_UNIT_SIZE)
    if _relate(s, b, floor, time_at, bufs, timestamp) & T_GT:
        return 0 if upper else jdiv(fs, 0, CQ_STORE_UNIT_SIZE)
    while high >= lo:  # lo, high >= 0 here: C division floors like Python's //
        mid = (lo + high) // (2 * CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE
        phy = ld64(b + mid)
        if min_ovf > 0 or phy < min_phy:
            lo = mid + CQ_STORE_UNIT_SIZE
            left = mid
            continue
        rel = _relate(s, b, mid, time_at, bufs, timestamp)
        if rel & T_NEG:
            return 0
        if rel & T_EQ:
            target = mid
            break
        if rel & T_GT:
            high = mid - CQ_STORE_UNIT_SIZE
            right = mid
        else:
            lo = mid + CQ_STORE_UNIT_SIZE
            left = mid
    if target != -1:
        if upper:
            while target + CQ_STORE_UNIT_SIZE <= ceiling and \
                    _relate(s, b, target + CQ_STORE_UNIT_SIZE, time_at, bufs, timestamp) & T_EQ:
                target += CQ_STORE_UNIT_SIZE
        else:
            while target - CQ_STORE_UNIT_SIZE >= floor and \
                    _relate(s, b, target - CQ_STORE_UNIT_SIZE, time_at, bufs, timestamp) & T_EQ:
                target -= CQ_STORE_UNIT_SIZE
        result = target
    else:
        result = left if upper else right
    return jdiv(fs, result, CQ_STORE_UNIT_SIZE)


cdef inline bint _hold(object refs) except -1:
    """Take a reader reference from *refs* (the store's
    ``ReferenceResource``) for a read kernel, which then drops it with
    :func:`_drop` when its last byte is copied out: clean-up and the store's
    close() wait for it, so no file the kernel reads is unmapped or removed
    meanwhile, whatever Python code (a finalizer, another thread) runs.
    False when a clean-up or close holds the references exclusively: the
    caller then goes to ``refs.hold()``, which waits or raises
    StoreClosedError. *refs* None: the caller holds one (True)."""
    return refs is None or (<ReferenceResource?>refs).try_hold()


cdef inline int _drop(object refs) except -1:
    if refs is not None:
        (<ReferenceResource>refs).drop()
    return 0


cdef int64_t _unit_time(_Search *s, object bufs, object mf, Py_ssize_t pos) except? -2:
    """consumequeue._unit_time: the store time of the record of the unit at
    *pos* of ConsumeQueue file *mf*, -1 past its written units."""
    cdef Py_buffer v
    cdef int64_t phy
    cdef int32_t size
    if pos < 0 or pos + CQ_STORE_UNIT_SIZE > (<MappedRegion?>mf).wrote_position:
        return -1
    PyObject_GetBuffer((<MappedRegion?>mf).mm, &v, PyBUF_SIMPLE)
    try:
        if pos + CQ_STORE_UNIT_SIZE > v.len:
            raise ValueError(f"unit at {pos} is outside a {v.len}-byte buffer")
        phy = ld64(<const unsigned char *>v.buf + pos)
        size = ld32(<const unsigned char *>v.buf + pos + 8)
    finally:
        PyBuffer_Release(&v)
    return _probe_c(s, bufs, phy, size)


def time_lookup(cq, commitlog, timestamp, bint upper, refs):
    """``cq.offset_by_time(timestamp, upper, commitlog.segment_view())`` (the
    queue offset ``get_offset_in_queue_by_time`` answers), under a reader
    reference: *refs* is the store's ``ReferenceResource`` (held here while
    reading) or None when the caller holds one.

    Returns None instead when the caller must hold a reference and call
    again with ``refs=None`` (the core's answer while clean-up holds the
    references exclusively; never here)."""
    return _time_lookup(cq, commitlog, timestamp, upper, refs)


cdef object _time_lookup(cq, commitlog, timestamp, bint upper, refs):
    if not _hold(refs):
        return None
    try:
        return _time_lookup_in(cq, commitlog, timestamp, upper)
    finally:
        _drop(refs)


cdef object _time_lookup_in(cq, commitlog, timestamp, bint upper):
    # ConsumeQueue.offset_by_time(timestamp, upper, commitlog.segment_view())
    # in one call (under a reference): the file choice, the search and the clamp
    cdef int ovf = 1
    cdef Py_ssize_t n, i, fsz, low, wrote
    cdef long long mn, mx, res, start
    cdef Py_buffer v
    cdef _Search s
    cdef _View cl
    if type(timestamp) is int:
        s.ts = PyLong_AsLongLongAndOverflow(timestamp, &ovf)
    if ovf:  # compared as Python objects: the twin's path
        return cq.offset_by_time(timestamp, upper, commitlog.segment_view())
    queue = _queue_of_cq(cq)
    files = queue.files
    if files is None:
        raise TypeError("a ConsumeQueue's queue has no files list")
    n = PyList_GET_SIZE(files)
    if n == 0:
        return 0
    fsz = _idx(queue.file_size)
    mn = jdiv((<ConsumeQueueBase>cq).min_logic_offset, 0, CQ_STORE_UNIT_SIZE)
    last = files[n - 1]
    mx = jdiv((<MappedRegion?>last).file_from_offset, (<MappedRegion?>last).wrote_position, CQ_STORE_UNIT_SIZE)
    # the CommitLog as segment_view() gives it, probed in C
    bufs = _view_of(&cl, commitlog)
    s.tv.direct = s.tv.files = s.c_mode = True
    s.tv.n, s.tv.fs, s.tv.base, s.tv.lo, s.tv.hi = cl.n, cl.fs, cl.base, cl.lo, cl.hi
    s.seg = -1
    _init_view(&s.view)
    _init_view(&v)
    try:
        mf = None  # ConsumeQueue._file_by_time
        if upper:
            for i in range(n - 1, -1, -1):
                res = _unit_time(&s, bufs, files[i], 0)
                if 0 <= res <= s.ts:
                    mf = files[i]
                    break
        else:
            mf = last
            for i in range(n - 1):
                if _unit_time(&s, bufs, files[i], fsz - CQ_STORE_UNIT_SIZE) >= s.ts:
                    mf = files[i]
                    break
        if mf is None:
            res = 0
        else:
            start = (<MappedRegion?>mf).file_from_offset
            wrote = (<MappedRegion?>mf).wrote_position
            if wrote <= 0:
                res = jdiv(start, 0, CQ_STORE_UNIT_SIZE)
            else:
                # as Python ints: min_logic_offset may lag far behind
                low = _idx(<object>(<ConsumeQueueBase>cq).min_logic_offset - start)
                PyObject_GetBuffer((<MappedRegion?>mf).mm, &v, PyBUF_SIMPLE)
                res = _search_time(&s, <const unsigned char *>v.buf, v.len, start, low if low > 0 else 0,
                                   wrote if wrote < fsz else fsz, timestamp, upper, cl.lo, 0, None, bufs, low)
    finally:
        PyBuffer_Release(&s.view)
        PyBuffer_Release(&v)
    res = mn if res < mn else res
    return mx if res > mx else res  # min(max(res, mn), mx): mx wins when mn > mx


# --- IndexFile ------------------------------------------------------------


cdef int _check_index(Py_buffer *v, Py_ssize_t hash_slot_num, Py_ssize_t index_num,
                      Py_ssize_t *hsn, Py_ssize_t *idx) except -1:
    """Validate that v holds header + slots + entries (overflow-safe)."""
    cdef Py_ssize_t rem = v.len - INDEX_HEADER_SIZE
    hsn[0] = hash_slot_num
    idx[0] = index_num
    if hsn[0] <= 0 or idx[0] <= 0 or rem < 0 or hsn[0] > rem // INDEX_HASH_SLOT_SIZE or \
            idx[0] > (rem - hsn[0] * INDEX_HASH_SLOT_SIZE) // INDEX_ENTRY_SIZE:
        need = INDEX_HEADER_SIZE + <object>hash_slot_num * INDEX_HASH_SLOT_SIZE + <object>index_num * INDEX_ENTRY_SIZE
        raise ValueError(f"index buffer of {v.len} bytes is smaller than {need}")
    return 0


cdef bint _index_put(unsigned char *b, Py_ssize_t hsn, Py_ssize_t idx, int32_t key_hash,
                     long long phy, long long ts) noexcept:
    """IndexFile.putKey on a checked, writable buffer: False when full."""
    cdef Py_ssize_t slot_pos
    cdef int32_t count, slot_value
    cdef int64_t begin_ts, time_diff
    cdef unsigned char *e
    count = ld32(b + 36)
    if count <= 0:
        count = 1
    if count >= idx:
        return False
    slot_pos = INDEX_HEADER_SIZE + (key_hash % hsn) * INDEX_HASH_SLOT_SIZE
    slot_value = ld32(b + slot_pos)
    if slot_value <= 0 or slot_value > count:
        slot_value = 0
    begin_ts = ld64(b)
    if begin_ts <= 0 or ts <= begin_ts:
        time_diff = 0  # a negative difference clamps to 0; no overflow below
    else:
        time_diff = (ts - begin_ts) // 1000
        if time_diff > 0x7FFFFFFF:
            time_diff = 0x7FFFFFFF
    e = b + INDEX_HEADER_SIZE + hsn * INDEX_HASH_SLOT_SIZE + <Py_ssize_t>count * INDEX_ENTRY_SIZE
    st32(e, <uint32_t>key_hash)
    st64(e + 4, <uint64_t>phy)
    st32(e + 12, <uint32_t>time_diff)
    st32(e + 16, <uint32_t>slot_value)
    st32(b + slot_pos, <uint32_t>count)
    if count <= 1:
        st64(b + 16, <uint64_t>phy)
        st64(b, <uint64_t>ts)
    if slot_value == 0:  # i32 counters wrap as in Java
        st32(b + 32, <uint32_t>ld32(b + 32) + 1)
    st32(b + 36, <uint32_t>count + 1)
    st64(b + 24, <uint64_t>phy)
    st64(b + 8, <uint64_t>ts)
    return True


cdef inline int32_t _abs_hash(uint32_t h) noexcept:
    cdef int32_t v = <int32_t>h
    if v == -2147483648:
        return 0
    return -v if v < 0 else v


cdef inline bint _index_full(const unsigned char *b, Py_ssize_t idx) noexcept:
    cdef int32_t count = ld32(b + 36)
    return (count if count > 0 else 1) >= idx


def index_put(buf, hash_slot_num, index_num, key, physical_offset, store_timestamp):
    """Put *key* into the IndexFile held in *buf* (``IndexFile.putKey``).

    Header, slot and entry are updated in place. Returns False when the file
    is full (``indexCount >= index_num``). Raises ValueError if *buf* is
    smaller than ``40 + 4*hash_slot_num + 20*index_num`` bytes.
    """
    cdef long long phy = _i64(physical_offset), ts = _i64(store_timestamp)
    cdef Py_ssize_t hsn = 0, idx = 0
    cdef int32_t key_hash
    cdef Py_buffer v
    cdef bint writable = _get_rw(buf, &v)
    try:
        _check_index(&v, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
        if _index_full(<const unsigned char *>v.buf, idx):
            return False
        key_hash = _key_hash(key)
        if not writable:
            _not_writable(buf)
        return _index_put(<unsigned char *>v.buf, hsn, idx, key_hash, phy, ts)
    finally:
        PyBuffer_Release(&v)


cdef uint32_t _check_keys(object prefix, object keys) except? 0xFFFFFFFF:
    """Every key a str (before anything is written); the hash of *prefix*."""
    if not PyList_CheckExact(keys):
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    cdef uint32_t h0 = _java_hash_from(0, prefix)
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"java_hash expects str, got {type(key).__name__}")
    return h0


def index_put_keys(buf, hash_slot_num, index_num, prefix, keys, physical_offset, store_timestamp):
    """Put ``prefix + key`` for each str in the list *keys*, in order, as
    ``index_put`` does (RocketMQ's ``topic#key`` entries of one record).
    Stops at the first key the full file refuses; returns how many
    were stored. Writes nothing and returns -1 when *physical_offset* is below
    the header's end physical offset (the record is indexed already), -2
    when equal (it may be partly indexed: the caller decides). Raises
    TypeError unless *keys* is a list of str (checked before anything is
    written), ValueError as ``index_put``."""
    cdef long long phy = _i64(physical_offset), ts = _i64(store_timestamp)
    cdef Py_ssize_t hsn = 0, idx = 0, i, n
    cdef uint32_t h0
    cdef int32_t key_hash
    cdef Py_buffer v
    h0 = _check_keys(prefix, keys)
    n = PyList_GET_SIZE(keys)
    cdef bint writable = _get_rw(buf, &v)
    cdef long long end_phy
    try:
        _check_index(&v, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
        end_phy = ld64(<const unsigned char *>v.buf + 24)
        if phy < end_phy:
            return -1
        if phy == end_phy:
            return -2
        for i in range(n):
            if _index_full(<const unsigned char *>v.buf, idx):
                return i
            key_hash = _abs_hash(_java_hash_from(h0, keys[i]))
            if not writable:
                _not_writable(buf)
            _index_put(<unsigned char *>v.buf, hsn, idx, key_hash, phy, ts)
        return n
    finally:
        PyBuffer_Release(&v)


def index_select(buf, hash_slot_num, index_num, key, max_num, begin, end, out):
    """Append to *out* the physical offsets stored for *key* whose decoded time
    lies in [begin, end], newest first (``IndexFile.selectPhyOffset``).

    Only the 32-bit key hash is compared. Stops once ``len(out) >=
    max_num``. A corrupt chain cannot loop: the walk visits at most
    ``index_num`` entries and never leaves the entry area.
    """
    cdef Py_ssize_t hsn = 0, idx = 0, i, limit = _idx(max_num)
    cdef rmq_i128 lo = _wide(begin), hi = _wide(end)
    cdef Py_buffer v
    cdef _Col found
    memset(&found, 0, sizeof(found))
    PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE)
    try:
        _check_index(&v, _idx(hash_slot_num), _idx(index_num), &hsn, &idx)
        _select(<const unsigned char *>v.buf, hsn, idx, _key_hash(key), limit - len(out), lo, hi, &found)
        for i in range(found.n // 8):
            out.append((<int64_t *>found.p)[i])
    finally:
        free(found.p)
        PyBuffer_Release(&v)


cdef int _select(const unsigned char *b, Py_ssize_t hsn, Py_ssize_t idx, int32_t key_hash, Py_ssize_t room,
                 rmq_i128 lo, rmq_i128 hi, _Col *found) except -1:
    """IndexFile.selectPhyOffset on a checked buffer: up to *room* physical
    offsets with *key_hash* and index time in [lo, hi] added to *found*
    (int64 each), newest first."""
    cdef Py_ssize_t visited = 0, added = 0
    cdef int32_t count, cur, h, diff, prev
    cdef int64_t phy, begin_ts
    cdef rmq_i128 t
    cdef const unsigned char *e
    count = ld32(b + 36)
    if count <= 0:
        count = 1
    cur = ld32(b + INDEX_HEADER_SIZE + (key_hash % hsn) * INDEX_HASH_SLOT_SIZE)
    if cur <= 0 or cur > count or count <= 1:
        return 0
    begin_ts = ld64(b)
    # walk at most index_num entries, never outside [1, index_num)
    while visited < idx:
        visited += 1
        if added >= room or cur >= idx:
            break
        e = b + INDEX_HEADER_SIZE + hsn * INDEX_HASH_SLOT_SIZE + <Py_ssize_t>cur * INDEX_ENTRY_SIZE
        h = ld32(e)
        phy = ld64(e + 4)
        diff = ld32(e + 12)
        prev = ld32(e + 16)
        if diff < 0:
            break
        t = <rmq_i128>begin_ts + <rmq_i128>diff * 1000
        if h == key_hash and lo <= t <= hi:
            _put64(found, phy)
            added += 1
        if prev <= 0 or prev > count or prev == cur or t < lo:
            break
        cur = prev
    return 0


# --- messages ---------------------------------------------------------------
#
# Message and MessageExt (declared in _core.pxd): the put path reads a
# Message's fields and the read paths fill a MessageExt's as C fields. The
# rules that are not hot (an argument that fails its check, the property map
# and blob, to_dict) are the pure module's functions, shared with the twin
# classes, so each is written once.

from rmqstore import _pure_message as _pm
from rmqstore._ids import decode_host as _decode_host

cdef extern from "Python.h":
    Py_ssize_t PyUnicode_FindChar(object s, Py_UCS4 ch, Py_ssize_t start, Py_ssize_t end, int direction) except -2


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


cdef class Message:
    """A message to store (RocketMQ ``Message`` plus the broker-side fields).

    Message(topic, body=b"", queue_id=0, flag=0, tags=None, keys=None,
    unique_key=None, properties=None, born_timestamp=None, born_host=None,
    store_host=None, reconsume_times=0, sys_flag=0,
    prepared_transaction_offset=0)

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

    The attributes may be changed after the message is made; a put checks
    them again. The Cython core's class; ``rmqstore._pure_message.Message``
    is its pure-Python twin.
    """

    def __init__(self, topic, body=b"", queue_id=0, flag=0, tags=None, keys=None, unique_key=None,
                 properties=None, born_timestamp=None, born_host=None, store_host=None, reconsume_times=0,
                 sys_flag=0, prepared_transaction_offset=0):
        # the common case checked here; anything else (an error, a list of
        # keys, a memoryview body) by the pure checks, whose errors these are
        if (PyUnicode_CheckExact(topic) and PyUnicode_GET_LENGTH(topic) > 0
                and (PyBytes_CheckExact(body) or PyByteArray_CheckExact(body))
                and _int_in(queue_id, 0, INT32_MAX) and _int_in(flag, INT32_MIN, INT32_MAX)
                and (tags is None or _plain_str(tags)) and (keys is None or _plain_str(keys))
                and (unique_key is None or _plain_str(unique_key)) and _plain_props(properties)
                and (born_timestamp is None or _int_in(born_timestamp, LLONG_MIN, LLONG_MAX))
                and _int_in(reconsume_times, INT32_MIN, INT32_MAX) and _int_in(sys_flag, INT32_MIN, INT32_MAX)
                and _int_in(prepared_transaction_offset, LLONG_MIN, LLONG_MAX)):
            self.topic, self.body, self.queue_id, self.flag = topic, body, queue_id, flag
            self.tags, self.keys, self.unique_key, self.properties = tags, keys, unique_key, properties
            self.born_timestamp, self.born_host, self.store_host = born_timestamp, born_host, store_host
            self.reconsume_times, self.sys_flag = reconsume_times, sys_flag
            self.prepared_transaction_offset = prepared_transaction_offset
            return
        (self.topic, self.body, self.queue_id, self.flag, self.tags, self.keys, self.unique_key, self.properties,
         self.born_timestamp, self.born_host, self.store_host, self.reconsume_times, self.sys_flag,
         self.prepared_transaction_offset) = _pm.message_fields(
            topic, body, queue_id, flag, tags, keys, unique_key, properties, born_timestamp, born_host,
            store_host, reconsume_times, sys_flag, prepared_transaction_offset)

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
                             self.prepared_transaction_offset)

    def __repr__(self):
        return f"Message(topic={self.topic!r}, queue_id={self.queue_id}, body={bytes(self.body[:32])!r}...)"


def _message_of(*fields):
    """A Message with *fields* (MESSAGE_FIELDS order) as they were, unchecked (unpickling)."""
    cdef Message m = Message.__new__(Message)
    (m.topic, m.body, m.queue_id, m.flag, m.tags, m.keys, m.unique_key, m.properties, m.born_timestamp,
     m.born_host, m.store_host, m.reconsume_times, m.sys_flag, m.prepared_transaction_offset) = fields
    return m


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
    magic_code. The Cython core's class; ``rmqstore._pure_message.MessageExt``
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
    int sys_flag, queue_id, flag, reconsume_times
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
        self.blobs_cap = 256
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


def tags_hash(tags):
    """The tags code of a unit outside ``SCHEDULE_TOPIC_XXXX``:
    ``java_hash(tags)`` for a non-empty str, 0 for None or "" (RocketMQ
    ``MessageExtBrokerInner.tagsString2tagsCode``). TypeError otherwise."""
    if tags is not None and not isinstance(tags, str):
        raise TypeError(f"java_hash expects str, got {type(tags).__name__}")
    return _tags_hash(tags)


cdef object _hex_id(const unsigned char *h, Py_ssize_t hn, long long phy):
    """Offset msgId: upper-case hex of the raw store host (*hn*: 8 or 20
    bytes at *h*) + big-endian offset."""
    cdef Py_ssize_t i
    cdef unsigned char raw[36]
    cdef object s
    cdef unsigned char *out
    memcpy(raw, h, hn)
    st64(raw + hn, <uint64_t>phy)
    s = PyUnicode_New(2 * (hn + 8), 127)
    out = PyUnicode_1BYTE_DATA(s)
    for i in range(hn + 8):
        out[2 * i] = b"0123456789ABCDEF"[raw[i] >> 4]
        out[2 * i + 1] = b"0123456789ABCDEF"[raw[i] & 15]
    return s


cdef enum:
    S_TOPIC, S_BODY, S_QUEUE_ID, S_FLAG, S_TAGS, S_KEYS, S_UNIQ, S_PROPS, S_BORN_TS, S_BORN_HOST, \
        S_STORE_HOST, S_RECONSUME, S_SYS_FLAG, S_PREPARED


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


cdef class Appender:
    """ASYNC_FLUSH put path of one writable store: ``put(msg, store_timestamp)``
    validates and encodes a :class:`~rmqstore.message.Message`, writes its
    CommitLog record, its ConsumeQueue unit and its index keys
    (``append_dispatch``'s bytes and order) and returns the
    ``PutMessageResult`` in one call.

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
    index file, a transactional prepared/rollback message, a message with
    its own born/store host, or anything the step-by-step path rejects
    (types, sizes, a shorthand contradicting its property): that path
    raises the typed error. It raises only for bound files that are not
    writable or smaller than their size (TypeError, ValueError).

    Not thread-safe: its callers serialize their calls (the store's append
    lock). The core keeps a call's file bytes and positions in C and writes
    the positions back when the call ends; a put made from within a call
    (by *clock*, or a property of a bound file, writing to the same store)
    gets a RuntimeError from the core, and no collection runs within
    ``put_batch`` there (a finalizer could be such a put).

    Args (constructor):
        message_type (type): the Message class; its ``__slots__`` are read
            (the core reads them by offset, as CPython's own slot access).
        result_type (type): a tuple subclass built as ``(ok_status, msg_id,
            physical_offset, size, queue_offset, store_timestamp)``.
        ok_status: its first field.
        store_host (bytes): raw store host field (8 bytes, 20 for IPv6).
        append_crc (bool): append the ``__CRC32#`` property.
        max_message_size (int): bodies above this many bytes go the
            step-by-step way (which refuses them).
        index_enable (bool): index UNIQ_KEY and KEYS.
        queue_offsets (dict): shared with the caller, see above.
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
    cdef long long gen  # put calls so far
    cdef _Queue touched  # the queues the current call wrote, linked by next_touched
    cdef list slots  # (topic, queue_id, _Queue) by queue id: see _bound

    def __cinit__(self):
        self.scratch = NULL
        self.scratch_cap = 0

    def __dealloc__(self):
        free(self.scratch)

    def __init__(self, message_type, result_type, ok_status, store_host, bint append_crc, max_message_size,
                 bint index_enable, queue_offsets, host_bytes=None):
        if not isinstance(message_type, type) or not isinstance(result_type, type) or \
                not issubclass(result_type, tuple):
            raise TypeError("message_type must be a class and result_type a tuple subclass")
        if not PyBytes_CheckExact(store_host) or len(store_host) not in (8, 20):
            raise ValueError("store_host must be the raw 8- or 20-byte host field")
        if not isinstance(queue_offsets, dict):
            raise TypeError("queue_offsets must be a dict")
        # (message_type: only the core's own Message goes the fast way, whatever is given)
        self.result_type = result_type
        # results of a type without __dict__ hold ints, the msgId and the one
        # shared status: nothing a cycle can pass through (see rmq_tuple6)
        self.untrack_results = result_type.__basicsize__ == tuple.__basicsize__ and result_type.__dictoffset__ == 0
        self.ok_status = ok_status
        self.store_host = store_host
        self.append_crc = append_crc
        self.max_message_size = _idx(max_message_size)
        self.index_enable = index_enable
        self.queue_offsets = queue_offsets
        self.queues = {}
        self.slots = [None] * 16
        self.host_bytes = host_bytes
        self.hosts = {}
        self.commit_file = self.commit_mm = self.index_mm = None

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
        cdef PyObject *v[14]
        if (self.commit_file is None and unbound is None) or type(msg) is not Message:
            return None  # (the twin's Message: step by step)
        _fields_of(<Message>msg, v)
        # v[] is borrowed: exact types only below, so that no Python code
        # (a __hash__, __index__ or __ne__) can run and replace a slot
        if not PyUnicode_CheckExact(<object>v[S_TOPIC]) or not PyLong_CheckExact(<object>v[S_QUEUE_ID]) or \
                not PyLong_CheckExact(<object>v[S_SYS_FLAG]) or not PyLong_CheckExact(<object>v[S_FLAG]) or \
                not PyLong_CheckExact(<object>v[S_RECONSUME]) or not PyLong_CheckExact(<object>v[S_PREPARED]) or \
                not (<object>v[S_BORN_TS] is None or PyLong_CheckExact(<object>v[S_BORN_TS])):
            return None
        if not (_str_or_none(v[S_TAGS]) and _str_or_none(v[S_KEYS]) and _str_or_none(v[S_UNIQ])):
            return None
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
        try:
            r.sys_flag = _i32(<object>v[S_SYS_FLAG]) & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
            r.queue_id = _i32(<object>v[S_QUEUE_ID])
            r.flag = _i32(<object>v[S_FLAG])
            r.reconsume_times = _i32(<object>v[S_RECONSUME])
            r.prepared = _i64(<object>v[S_PREPARED])
            born = <object>v[S_BORN_TS]
            self.born_default = born is None
            r.born_timestamp = 0 if born is None else _i64(born)
        except (TypeError, OverflowError):
            return None  # the step-by-step path raises the message's error
        if not _gets_consume_queue_unit(<uint32_t>r.sys_flag):
            return None  # transactional prepared / rollback: no queue unit, step by step
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
                          self._n_keys(self.keys, self.uniq))
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

    cdef inline Py_ssize_t _n_keys(self, object keys, object uniq) noexcept:
        """At most the index keys of a message (its unique key and each
        non-empty space-separated key; none when the index is off), without
        reading the keys: k keys take at least 2k - 1 characters. For plan,
        where reserving room early costs nothing and a count per character
        would cost every put."""
        if not self.index_enable:
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
        cdef bint fits = self.commit_file is not None
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
            if q.dead:  # a placeholder (a new queue) or rebound since: its queue counted by key
                fits = False
                key = (q.key, e.queue_id) if PyUnicode_CheckExact(q.key) else q.key
                counts[key] = counts.get(key, 0) + 1
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
            if self.index_mm is None:
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
                self.queue_offsets[q.key] = (q.file_from + q.pos) // CQ_STORE_UNIT_SIZE
            q = q.next_touched
        self._untouch()
        return 0

    cdef long long _row(self, Rec *r, _Queue q, object body, _Batch *b) except -2:
        """Write, within a call, what _encode/_encode_row prepared (tags, keys, unique key in
        self.tags/keys/uniq) with *body*: record, unit, index keys. Returns
        the physical offset (r.size and r.queue_offset set), or -1 having
        written nothing."""
        cdef Py_ssize_t pos, n_keys = 0, qpos
        cdef long long qo, phy, qmax
        cdef int32_t count
        cdef int64_t tags_code = 0
        cdef Py_buffer bv
        cdef unsigned char *u
        tags, keys, uniq = self.tags, self.keys, self.uniq
        self.tags = self.keys = self.uniq = None
        r.store_timestamp = b.ts
        if self.born_default:
            r.born_timestamp = b.ts
        if q.gen != self.gen:  # the queue's first row in this call (_end releases its bytes)
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
        if self.index_enable:
            n_keys = _index_keys(uniq, keys, 0, NULL, 0, 0, 0, 0)
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
            # the next queue offset is the next unit's index, as the last file's
            # position says (queue_offsets holds the same; it is written back)
            if q.pos <= 0 or q.pos > q.file_size - CQ_STORE_UNIT_SIZE or q.pos % CQ_STORE_UNIT_SIZE:
                return -1
            qo = (q.file_from + q.pos) // CQ_STORE_UNIT_SIZE
            phy = self.commit_from + pos
            if phy + r.size <= q.max_phy:
                return -1
            if self.index_enable:
                u = <unsigned char *>b.ix.buf
                count = ld32(u + 36)
                if count <= 0:
                    count = 1
                if phy <= ld64(u + 24) or count + n_keys > self.inum:
                    return -1
            r.queue_offset = qo
            r.physical_offset = phy
            # record, unit, keys: the order a crash must find them in
            _emit(<unsigned char *>b.cl.buf + pos, r)
            u = <unsigned char *>q.buf.buf + q.pos
            st64(u, <uint64_t>phy)
            st64(u + 12, <uint64_t>tags_code)
            st32(u + 8, <uint32_t>r.size)  # size last: a torn unit is invalid
            if self.index_enable:
                _index_keys(uniq, keys, q.key_h0, <unsigned char *>b.ix.buf, self.hsn, self.inum, phy,
                            r.store_timestamp)
        finally:
            PyBuffer_Release(&bv)
        b.cl_pos = pos + r.size
        q.pos += CQ_STORE_UNIT_SIZE
        q.max_phy = phy + r.size
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
        cdef Rec r
        cdef _Batch b
        cdef _Queue q = self._encode(msg, &r)
        cdef long long phy, ts
        if q is None and self._learn_hosts(msg):
            q = self._encode(msg, &r)
        if q is None:
            return None
        try:
            ts = _i64(store_timestamp)
        except (TypeError, OverflowError):
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
        return 0

    cdef object _result(self, Rec *r, long long phy, object ts):
        """The PutMessageResult of the record _row wrote at *phy*; *ts* the
        store timestamp as the int it was given as (r.store_timestamp)."""
        if not PyLong_CheckExact(ts):
            ts = r.store_timestamp
        return rmq_tuple6(self.result_type, self.untrack_results, self.ok_status, _hex_id(r.store, r.store_len, phy),
                          phy, r.size, r.queue_offset, ts)

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
                ts = _wall_ms() if clock is None else clock()
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
                              self.store, self._n_keys(self.keys, self.uniq))
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
        if self.commit_file is None or i >= n:
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


cdef inline long long _wall_ms() noexcept:
    """``time.time_ns() // 1_000_000``: the same clock (CLOCK_REALTIME), in C."""
    cdef timespec t
    clock_gettime(CLOCK_REALTIME, &t)
    return <long long>t.tv_sec * 1000 + t.tv_nsec // 1000000


@cython.final
@cython.auto_pickle(False)  # (a lock is not data)
@cython.auto_pickle(False)  # (references are not data)
cdef class ReferenceResource:
    """Reader references over a store's mapped files (RocketMQ's
    ``ReferenceResource``, taken per read operation instead of per file).

    A reader calls :meth:`hold` before it looks up files and :meth:`release`
    after its last byte is copied out (one pair per pull or lookup, never per
    message); the read kernels take and drop one themselves when given the
    store's references. Clean-up calls :meth:`acquire_exclusive`: new holds
    wait, and the clean-up proceeds once the references held drain to zero,
    so no file is removed from a queue or unmapped while a reader may be
    inside it. When they do not drain in time the clean-up gives up for this
    round (RocketMQ's failed ``destroy``) and retries later. There is no
    forced unmapping: Python refuses to unmap memory a view still exports
    (BufferError), and a mapping closed between two reads of a pull would
    make that pull fail; the forcible interval only unlinks the file early
    (see ``retention``).

    The store's ``close()`` calls :meth:`shutdown` before it unmaps: from
    then on every :meth:`hold` raises StoreClosedError (holds waiting for a
    clean-up too) and clean-ups are refused, and it waits for the readers
    inside to leave.

    Holds are not re-entrant: a thread must not hold twice at once (a
    clean-up waiting between the two would wait for this thread until its
    timeout). The pure twin has the same class and methods."""

    def __cinit__(self):
        self.cond = threading.Condition()

    cdef bint try_hold(self) noexcept:
        """Take one reference unless a clean-up or close holds them
        exclusively (then False: the caller goes to hold(), which waits or
        raises). One atomic compare-and-swap: no lock, no GIL needed."""
        return rmq_ref_try_hold(&self.word)

    cdef int drop(self) except -1:
        """Drop one reference (an unbalanced drop changes nothing); the last
        one wakes a clean-up or close waiting for them to drain."""
        if rmq_ref_drop(&self.word) == RMQ_REF_EXCLUSIVE:
            with self.cond:
                self.cond.notify_all()
        return 0

    cdef Py_ssize_t _count(self) noexcept:
        return rmq_ref_load(&self.word) >> 1

    @property
    def ref_count(self):
        """References held right now."""
        return self._count()

    @property
    def closed(self):
        """Whether :meth:`shutdown` was called."""
        return self.shut

    @property
    def exclusive_held(self):
        """Whether a clean-up or close holds the references exclusively
        (new holds wait, or raise once closed)."""
        return rmq_ref_load(&self.word) & RMQ_REF_EXCLUSIVE != 0

    def hold(self):
        """Take one reader reference (waits while a clean-up works).
        Raises StoreClosedError once :meth:`shutdown` was called."""
        if self.try_hold():
            return
        with self.cond:  # (held from each check to its wait: no wake-up is lost)
            while not self.try_hold():
                if self.shut:
                    from .exceptions import StoreClosedError
                    raise StoreClosedError("the store is closed")
                self.cond.wait()

    def release(self):
        """Drop one reader reference; the last one lets a waiting clean-up in."""
        self.drop()

    def acquire_exclusive(self, timeout):
        """Block new holds and wait up to *timeout* seconds for held
        references to drain. Returns True when exclusive (then
        :meth:`release_exclusive` must follow), False when readers stayed
        inside or the store closed."""
        deadline = time.monotonic() + timeout
        with self.cond:  # (the flags change only under it)
            while rmq_ref_load(&self.word) & RMQ_REF_EXCLUSIVE:  # another clean-up: queue behind it
                left = deadline - time.monotonic()
                if self.shut or left <= 0:
                    return False
                self.cond.wait(left)
            if self.shut:
                return False
            self.cleaning = True
            rmq_ref_set_exclusive(&self.word)
            while self._count() > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._end_cleaning()
                    return False
                self.cond.wait(left)
            return True

    def release_exclusive(self):
        """End a clean-up's exclusivity: waiting holds go on."""
        with self.cond:
            self._end_cleaning()

    cdef int _end_cleaning(self) except -1:
        # (cond held) once closed, holds stay blocked for good
        self.cleaning = False
        if not self.shut:
            rmq_ref_clear_exclusive(&self.word)
        self.cond.notify_all()
        return 0

    def shutdown(self, timeout):
        """Close the references for good: every later :meth:`hold` raises
        StoreClosedError, waiting ones included, and clean-ups are refused.
        Then wait up to *timeout* seconds for a clean-up that is in and for
        the readers inside to leave. Idempotent. Returns whether they left
        (False: the caller unmaps with readers inside, which Python's mmap
        survives: a mapping a buffer still exports stays mapped)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            self.shut = True
            self.cond.notify_all()
            while self.cleaning:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            rmq_ref_set_exclusive(&self.word)
            while self._count() > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return not self.cleaning


cdef class AppendLock:
    """The store's append lock (RocketMQ's ``PutMessageReentrantLock``):
    reentrant, with ``acquire(blocking=True)``, ``release()`` and the
    context manager protocol; ``release`` by a thread that does not hold it
    raises RuntimeError. The twin wraps ``threading.RLock``. The core's is
    its own, so that its ``PutGate`` takes it in C (``RLock.acquire`` parses
    its arguments on every call); a thread waiting for it releases the GIL
    and runs signal handlers, as ``RLock`` waiters do."""
    cdef rmq_lock_t lock
    cdef unsigned long owner
    cdef Py_ssize_t count  # the owner's acquisitions not yet released (0: free)

    def __cinit__(self):
        self.lock = rmq_lock_new()
        if self.lock == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.lock != NULL:
            rmq_lock_free(self.lock)

    cdef int _acquire(self, bint blocking=True) except -1:
        """1 when taken (again, by its owner), 0 when not (*blocking* False)."""
        cdef unsigned long me = rmq_thread_id()
        cdef rmq_lock_status r
        if self.count and self.owner == me:
            self.count += 1
            return 1
        r = rmq_lock_take(self.lock, 0, 0)
        while r != RMQ_LOCK_ACQUIRED:
            if not blocking:
                return 0
            with nogil:  # the owner needs the GIL to get on and release it
                r = rmq_lock_take(self.lock, -1, 1)
            if r == RMQ_LOCK_INTR:
                PyErr_CheckSignals()  # (a signal handler's exception, e.g. KeyboardInterrupt, ends the wait)
        self.owner, self.count = me, 1
        return 1

    cdef int _release(self) except -1:
        if not self.count or self.owner != rmq_thread_id():
            raise RuntimeError("cannot release un-acquired lock")
        self.count -= 1
        if not self.count:
            self.owner = 0
            rmq_lock_give(self.lock)
        return 0

    def acquire(self, bint blocking=True):
        """Take the lock (again, when this thread holds it); with *blocking*
        False, return at once. Returns True when taken, False when not."""
        return self._acquire(blocking) == 1

    def release(self):
        """Release one acquisition. Raises RuntimeError when this thread
        does not hold the lock."""
        self._release()

    def __enter__(self):
        self._acquire()
        return True

    def __exit__(self, *exc):
        self._release()


@cython.auto_pickle(False)  # (a store's state is not data)
cdef class StoreState:
    """StoreState(): the state of a store that its put and read gates check
    and update on every call (see _core.pxd for the fields): ``closed``,
    ``disk_full`` (RocketMQ's DISK_FULL running flag), ``pending`` (records
    appended but not yet dispatched: a collection, truthy when any),
    ``write_error`` (a failed flush, or None), ``waiting`` (pulls waiting
    for new messages), ``written_end`` (physical offset past the last
    record), ``last_store_ts`` and ``last_logics_ts`` (ms since epoch: the
    last record's store time, and the last dispatched one's). The store
    keeps one and reads and writes its fields; the pure twin has the same
    class. (Cython starts the fields as False, None and 0.)"""


@cython.auto_pickle(False)  # (a store's gate is not data)
cdef class PutGate:
    """``MessageStore.put_message``'s ASYNC_FLUSH path in one call: the
    store's state checks, its append lock, the store clock, :meth:`Appender.put`
    and the store's bookkeeping after it. The store's ``put_message``
    (:class:`StoreCore`'s) calls it (the core's then runs no Python code on
    a put). What the gate reads and writes is the store's :class:`StoreState`
    *state* (``disk_full``, ``closed``, ``pending``, ``write_error``,
    ``waiting``; ``written_end``, ``last_store_ts``, ``last_logics_ts``),
    under the store's append *lock*; what it declines goes to
    ``store._put_one``, as ``put_message`` did it step by step.

    *clock*: None for the store's default, ``time.time_ns() // 1_000_000``
    (ms since the epoch, read in C by the core), else a callable returning
    the store time in ms. The gate keeps a weak reference to the store
    (the store's dict holds the gate); ``detach()`` (on close) drops the
    Appender and all it holds of the store, so that a bound ``put`` kept
    past close keeps nothing alive and goes to ``_put_one``, which raises
    StoreClosedError (as the gate does once the store is gone)."""
    # The docstrings are the twin's (_pure.PutGate). The store's state is
    # its StoreState's C fields.
    cdef object store, lock_acquire, lock_release, clock
    cdef AppendLock alock  # the store's lock when it is the core's (else its Python-level methods)
    cdef Appender appender
    cdef StoreState state

    def __init__(self, store, StoreState state not None, lock, Appender appender, clock):
        self.store = weakref.ref(store)
        self.state = state
        if type(lock) is AppendLock:
            self.alock = lock
        else:
            self.lock_acquire, self.lock_release = lock.acquire, lock.release
        self.appender = appender
        self.clock = clock

    def detach(self):
        """Drop the Appender and the lock (on close): ``put`` then goes to
        ``store._put_one``, which raises StoreClosedError."""
        self.appender = self.alock = None
        self.lock_acquire = self.lock_release = None

    def put(self, msg):
        """``MessageStore.put_message(msg)`` (see there)."""
        return self.c_put(msg)

    cdef object c_put(self, msg):
        # taken at once: detach (close, in another thread) may clear them
        cdef Appender fast = self.appender
        cdef AppendLock alock = self.alock
        cdef long long end = 0
        cdef StoreState st = self.state
        acquire, release = self.lock_acquire, self.lock_release
        store = rmq_deref(self.store)
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from .exceptions import StoreClosedError
            raise StoreClosedError("the store of this put_message is gone (closed)")
        if fast is not None and not st.disk_full:
            if alock is not None:
                alock._acquire()
            else:
                acquire()
            try:
                if not st.closed and not st.pending and st.write_error is None:
                    store_ts = _wall_ms() if self.clock is None else self.clock()
                    result = fast._put(msg, store_ts, &end)
                    if result is None:  # not for the one-call path: step by step
                        return store._put_one(msg, store_ts)
                    st.written_end = end
                    st.last_store_ts = st.last_logics_ts = store_ts
                    # read after the unit is in: a waiter that missed it sees it
                    if st.waiting:
                        store._wake_waiters()
                    return result
            finally:
                if alock is not None:
                    alock._release()
                else:
                    release()
        return store._put_one(msg)


cdef enum:
    _I32_MAX = 0x7FFFFFFF


@cython.auto_pickle(False)  # (a store is not data)
cdef class StoreCore:
    """The part of :class:`~rmqstore.store.MessageStore` that the kernels
    own: ``put_message`` and the four read methods, each the common case in
    one kernel call through the store's gates (``_put_gate``, a
    :class:`PutGate`, and ``_read_gate``, a :class:`ReadGate`; None where
    the store has none or once it is closed), else the store's careful path
    (``_put_one``, ``_get_offset_in_queue_by_time``, ``_query_messages``,
    ``_get_messages``, ``_get_message_views``), which decides everything
    the gates leave: errors, waits, follows, new files. ``MessageStore`` is
    a StoreCore; a subclass that overrides one of these methods has its
    own. The pure twin has the same class."""

    def put_message(self, msg):
        """Append *msg* to the CommitLog and dispatch it to its ConsumeQueue and
        the index before returning (RocketMQ ``putMessage`` + reput). Under
        SYNC_FLUSH it returns only once the record is on disk; concurrent
        producers share one sync (group commit).

        All or nothing: every file the record needs (a CommitLog segment,
        its queue's directory and file, an index file) is made before its
        first byte is written, and a failure after that (an interrupt
        included) undoes the record, so whatever this raises nothing of the
        message is stored and the store goes on; retrying stores no
        duplicate. The one exception is FlushError under SYNC_FLUSH (below).

        Returns a :class:`PutMessageResult` with status PUT_OK.

        Raises:
            MessageTypeError, IllegalMessageError, MessageTooLargeError,
            PropertiesSizeExceededError: bad input.
            StoreReadOnlyError, StoreClosedError: the store cannot take writes.
            FlushError: the sync failed (SYNC_FLUSH), now or earlier; the store
                takes no more writes. The record may still be found after a
                restart (the outcome of this put is unknown, never PUT_OK).
            DiskFullError: disk use is above the warning level (status
                SERVICE_NOT_AVAILABLE; puts resume by themselves when it
                falls), or no room for a file the record needs
                (CREATE_MAPPED_FILE_FAILED).
            OSError: any other failure to make such a file (no descriptor
                left, no permission).
        """
        gate = self._put_gate
        if type(gate) is PutGate:
            return (<PutGate>gate).c_put(msg)
        if gate is not None:
            return gate.put(msg)
        return self._put_one(msg)

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary="lower"):
        """Queue offset of the first (``"lower"``) or last (``"upper"``) message
        stored at *timestamp* ms, or the nearest one after/before it (RocketMQ
        5.1.1+ ``getOffsetInQueueByTime`` with BoundaryType), clamped to the
        queue's [min, max] offsets; 0 for an unknown queue. *queue_id* is a
        Java int, *timestamp* a long (ms since epoch, any value of one).

        Raises MessageTypeError (a bool or a float is not an int),
        ArgumentError for a number outside its range or any other
        *boundary* (a ValueError), StoreClosedError."""
        gate = self._read_gate
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)
        if gate is not None:
            return gate.get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)
        return self._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    def query_messages(self, topic, key, max_count=64, begin=0, end=0x7FFFFFFFFFFFFFFF):
        """The messages behind :meth:`query_offsets`, keeping only records that
        are still stored, whose topic is *topic* and whose UNIQ_KEY or one of
        whose KEYS is *key* (fixes RocketMQ #3613, docs/recovery.md#pitfall-index-hash-collisions);
        each record once (docs/recovery.md#pitfall-index-duplicate-entries), in the order of :meth:`query_offsets`.
        *max_count*, *begin* and *end* as there.

        Raises MessageTypeError, ArgumentError, StoreClosedError."""
        gate = self._read_gate
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_query_messages(topic, key, max_count, begin, end)
        if gate is not None:
            return gate.query_messages(topic, key, max_count, begin, end)
        return self._query_messages(topic, key, max_count, begin, end)

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None, wait_ms=0):
        """Pull up to *max_count* messages of (topic, queue_id) from queue offset
        *offset* (RocketMQ ``getMessage``; with *wait_ms*, its long polling).

        Args:
            topic (str): the topic.
            queue_id (int): a Java int (-2**31 .. 2**31-1); a queue that does
                not exist answers NO_MATCHED_LOGIC_QUEUE.
            offset (int): queue offset, a long (-2**63 .. 2**63-1); outside
                the queue it is answered with a status, as RocketMQ does
                (OFFSET_TOO_SMALL below the minimum, OFFSET_OVERFLOW_ONE at
                the end, OFFSET_OVERFLOW_BADLY past it).
            max_count (int): messages at most, 1 .. 2**31-1.
            tags (str | list[str] | None): None or ``"*"`` for every message,
                else ``"TagA || TagB"`` or a list: kept are messages whose tags
                code matches and whose TAGS really is one of them.
            wait_ms (int | float): when nothing is there yet, wait up to this
                many ms (0 .. 2**63-1, finite) for messages put into this
                store (in this process) and return as soon as one arrives; no
                busy loop; ``close()`` wakes it. 0 returns at once. On a
                read-only store (follow mode) the queue's tail is re-read
                every ``follow_poll_interval`` ms instead, as a writer process
                gives no signal.

        Returns a :class:`GetMessageResult`; ``next_begin_offset`` is where the
        next pull starts. Statuses as RocketMQ: NO_MATCHED_LOGIC_QUEUE,
        NO_MESSAGE_IN_QUEUE, OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE,
        OFFSET_OVERFLOW_BADLY, FOUND, NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING.

        Raises MessageTypeError (an argument of the wrong type: a bool or a
        float is not an int), ArgumentError (a number outside the range
        above), StoreClosedError, and CorruptedFileError when a unit points
        at something that is not its record, or at a record whose body CRC
        does not match (every read checks it; RocketMQ checks it on recovery
        only).
        """
        gate = self._read_gate
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_get_messages(topic, queue_id, offset, max_count, tags, wait_ms)
        if gate is not None:
            return gate.get_messages(topic, queue_id, offset, max_count, tags, wait_ms)
        return self._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    def get_message_views(self, topic, queue_id, offset, max_count=32):
        """Zero-copy form of :meth:`get_messages` (no tag filter, no waiting):
        up to *max_count* messages of (topic, queue_id) from queue offset
        *offset*, as positions in a read-only memoryview of the CommitLog
        segment that holds them instead of one :class:`MessageExt` each.

        The messages of one call come from one segment: a pull that reaches
        a record in the next segment ends there, and ``next_begin_offset``
        points at it. The view pins the mapping (Python never unmaps memory a
        view exports): clean-up still deletes the file, and the store still
        closes, while the mapping stays readable until the last view of it
        is released. Only the ranges ``units`` name are messages; the rest of
        the segment may change under later appends.

        Returns a :class:`GetViewsResult` with the statuses and offsets of
        get_messages; *queue_id*, *offset* and *max_count* as there.

        Raises MessageTypeError, ArgumentError (as get_messages),
        StoreClosedError; CorruptedFileError when a unit points at something
        that is not its record (a damaged body, whose CRC does not match,
        included), or at one whose stored topic is not the queue's topic byte
        for byte (then read it with get_messages)."""
        gate = self._read_gate
        if type(gate) is ReadGate:
            return (<ReadGate>gate).c_get_message_views(topic, queue_id, offset, max_count)
        if gate is not None:
            return gate.get_message_views(topic, queue_id, offset, max_count)
        return self._get_message_views(topic, queue_id, offset, max_count)


@cython.auto_pickle(False)  # (a store's gate is not data)
cdef class ReadGate:
    """The common case of the store's lookups and pulls in one call each:
    ``get_offset_in_queue_by_time``, ``query_messages``, ``get_messages``
    and ``get_message_views`` (same names, arguments and defaults as the
    ``MessageStore`` methods,
    whose docstrings hold). The store's methods of those names
    (:class:`StoreCore`'s) call them, so the core's runs no Python code on
    an open store's lookup or pull. Each method:

    - checks the store is open (its StoreState) and the gate attached;
    - for the common case (an exact ``"lower"``/``"upper"`` boundary; str
      topic and key; an int queue id, an int offset, timestamp, begin and
      end within a long, an int count in 1 .. 2**31-1, begin <= end, an int
      wait_ms in 0 .. 2**63-1, tags None or a str; views of a writable
      store) calls the whole-operation kernel (:func:`time_lookup`,
      :func:`query_keyed`, :func:`pull_messages`, :func:`pull_views`) with
      the store's reader references;
    - hands anything else to the store's careful path (``_`` + its name), which
      decides (errors, an argument out of its range, an unknown queue, a
      clean-up holding the references, a careful read, a follow or a wait
      included): a pull only when ``get_messages`` would return its result
      unchanged.

    Args:
        store (MessageStore): held weakly (the store holds the gate).
        state (StoreState): the store's.
        cqs (dict): the store's ConsumeQueues by (topic, queue_id).
        commitlog (CommitLogBase), index (IndexServiceBase), refs
            (ReferenceResource), read_only (bool): the store's.
        message_type (type): what a message is made as (``MessageExt``).
        result_type (type): ``GetMessageResult``, a 5-tuple type.
        views_type (type): ``GetViewsResult``, a 6-tuple type.
        units_of (Callable[[bytes], numpy.ndarray]): pull_views' packed
            units as ``GetViewsResult.units``.
        tag_filter (Callable): ``store._tag_filter``: a ``tags`` argument
            as the filter :func:`pull_messages` takes (None for every
            message); the gate keeps the last str's.
        statuses (Mapping[str, GetMessageStatus]): by name.
        min_units (int): a pull visits at least this many units
            (``store._MAX_FILTER_UNITS``).

    ``detach()`` (on close) drops what the gate holds of the store; the
    methods then go to the store's, which raise StoreClosedError, as they
    do once the store is gone."""
    # The docstrings are the twin's (_pure.ReadGate). Each method is the
    # common case of the store method of its name, in C; whatever else
    # comes goes to that method of the store's class.
    cdef object store  # a weak reference
    cdef dict cqs
    cdef list queues  # (topic, queue_id, cq) by queue_id: see _queue
    cdef object commitlog, index, refs, message_type, result_type, views_type, units_of, tag_filter, min_units
    cdef tuple last_filter  # (tags, its filter): see _filter
    cdef bint read_only
    cdef StoreState state

    def __init__(self, store, StoreState state not None, cqs, commitlog, index, refs, bint read_only, message_type,
                 result_type, views_type, units_of, tag_filter, min_units):
        if not PyDict_CheckExact(cqs):
            raise TypeError("a store's _cqs must be a dict")
        self.store = weakref.ref(store)
        self.state = state
        self.cqs = cqs
        self.commitlog, self.index, self.refs = commitlog, index, refs
        self.read_only = read_only
        self.message_type, self.result_type = message_type, result_type
        self.views_type, self.units_of, self.tag_filter = views_type, units_of, tag_filter
        self.last_filter = (None, None)
        self.min_units = _idx(min_units)
        self.queues = [None] * 16

    def detach(self):
        """Drop what the gate holds of the store (on close); its methods
        then go to the store class's, which raise StoreClosedError."""
        self.cqs = self.queues = None
        self.commitlog = self.index = self.refs = None

    cdef object _queue(self, dict cqs, object topic, object queue_id):
        """cqs.get((topic, queue_id)), the last queue found for each of 16
        queue-id slots kept by the identity of an exact str topic and int
        queue id: the store only ever adds queues to its dict, so a pair
        once found maps to that queue for as long as the gate is attached
        (a tuple made, hashed and compared per lookup costs ~0.4k
        instructions)."""
        cdef list queues = self.queues
        cdef Py_ssize_t i
        if not PyLong_CheckExact(queue_id):  # a bool, a float, a numpy int: the store's method checks it
            return None
        if queues is None or not PyUnicode_CheckExact(topic):
            return cqs.get((topic, queue_id))
        i = PyObject_Hash(queue_id) & 15
        cq = _slot_hit(queues, i, topic, queue_id)
        if cq is not None:
            return cq
        cq = cqs.get((topic, queue_id))
        if cq is not None:
            queues[i] = (topic, queue_id, cq)
        return cq

    cdef object _filter(self, object tags):
        """tag_filter(tags) for a str (the last one's kept: a consumer pulls
        with the same subscription), False for anything else or an error
        (the store's method decides)."""
        cdef tuple last = self.last_filter  # (one tuple: another thread may replace it)
        if not PyUnicode_CheckExact(tags):
            return False
        if last[0] is tags:
            return last[1]
        try:
            found = self.tag_filter(tags)
        except Exception:
            return False
        self.last_filter = (tags, found)
        return found

    cdef object _store(self):
        """The store, or StoreClosedError once it is gone."""
        store = rmq_deref(self.store)
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from .exceptions import StoreClosedError
            raise StoreClosedError("the store of this method is gone (closed)")
        return store

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary="lower"):
        """``MessageStore.get_offset_in_queue_by_time`` (see there)."""
        return self.c_get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    cdef object c_get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary):
        cdef dict cqs = self.cqs  # taken at once: detach (close, in another thread) may clear them
        cdef int upper = -1
        cdef long long ts
        commitlog, refs = self.commitlog, self.refs
        store = self._store()
        if PyUnicode_CheckExact(boundary):  # as given, any other spelling: the store's method
            if <str>boundary == "lower":
                upper = 0
            elif <str>boundary == "upper":
                upper = 1
        # (any other timestamp: the store's method checks it, and refuses what is not a long)
        if upper >= 0 and cqs is not None and _long_in(timestamp, LLONG_MIN, LLONG_MAX, &ts) \
                and not self.state.closed:
            cq = self._queue(cqs, topic, queue_id)
            if cq is not None:
                found = _time_lookup(cq, commitlog, timestamp, upper, refs)
                if found is not None:
                    return found
        return store._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    def query_messages(self, topic, key, max_count=64, begin=0, end=0x7FFFFFFFFFFFFFFF):
        """``MessageStore.query_messages`` (see there)."""
        return self.c_query_messages(topic, key, max_count, begin, end)

    cdef object c_query_messages(self, topic, key, max_count, begin, end):
        cqs, index, commitlog, refs = self.cqs, self.index, self.commitlog, self.refs
        store = self._store()
        cdef list out
        cdef long long mc, lo, hi
        if cqs is not None and PyUnicode_CheckExact(topic) and PyUnicode_CheckExact(key) \
                and _long_in(max_count, 1, _I32_MAX, &mc) and _long_in(begin, LLONG_MIN, LLONG_MAX, &lo) \
                and _long_in(end, lo, LLONG_MAX, &hi) and not self.state.closed:
            out = []
            if _query_keyed_held(index, commitlog, topic, key, max_count, lo, hi, self.message_type, out,
                                 refs) is not None:
                return out
        return store._query_messages(topic, key, max_count, begin, end)

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None, wait_ms=0):
        """``MessageStore.get_messages`` (see there)."""
        return self.c_get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    cdef object c_get_messages(self, topic, queue_id, offset, max_count, tags, wait_ms):
        cdef dict cqs = self.cqs
        cdef list out
        cdef long long off, mc, wait
        commitlog, refs = self.commitlog, self.refs
        store = self._store()
        wanted = None if tags is None else self._filter(tags)
        if cqs is not None and wanted is not False and _long_in(offset, LLONG_MIN, LLONG_MAX, &off) \
                and _long_in(max_count, 1, _I32_MAX, &mc) and _long_in(wait_ms, 0, LLONG_MAX, &wait) \
                and not self.state.closed:
            cq = self._queue(cqs, topic, queue_id)
            if cq is not None:
                out = []
                found = _pull_messages(cq, commitlog, offset, max_count,
                                       max_count if max_count > self.min_units else self.min_units,
                                       self.message_type, out, wanted, refs)
                # what the store's method would do next: a careful read, a follow or a wait
                if found is not None and found[0] is not None and (out or (not self.read_only and wait == 0)):
                    return rmq_tuple5(self.result_type, found[0], out, found[1], found[2], found[3])
        return store._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    def get_message_views(self, topic, queue_id, offset, max_count=32):
        """``MessageStore.get_message_views`` (see there)."""
        return self.c_get_message_views(topic, queue_id, offset, max_count)

    cdef object c_get_message_views(self, topic, queue_id, offset, max_count):
        cdef dict cqs = self.cqs
        cdef long long off, mc
        commitlog, refs = self.commitlog, self.refs
        store = self._store()
        if cqs is not None and not self.read_only and _long_in(offset, LLONG_MIN, LLONG_MAX, &off) \
                and _long_in(max_count, 1, _I32_MAX, &mc) and not self.state.closed:
            cq = self._queue(cqs, topic, queue_id)
            if cq is not None and _hold(refs):
                # held until the view exports the segment: then close() cannot unmap it
                try:
                    found = _pull_queue(cq, commitlog, offset, max_count,
                                        max_count if max_count > self.min_units else self.min_units, None, None, None)
                    segment = found[4]
                    view = None if segment is None else memoryview(segment).toreadonly()
                finally:
                    _drop(refs)
                if found[0] is not None:  # (stopped: the store's method reads it carefully, and raises)
                    return rmq_tuple6(self.views_type, 0, found[0], view,
                                      self.units_of(found[5]), found[1], found[2], found[3])
        return store._get_message_views(topic, queue_id, offset, max_count)


cdef int _check_columns(object bodies, object queue_ids, object tags, object keys, object unique_keys) except -1:
    cdef Py_ssize_t n = len(bodies)
    if not PyList_CheckExact(bodies) or not PyList_CheckExact(queue_ids) or len(queue_ids) != n:
        raise TypeError("bodies and queue_ids must be lists of one length")
    for col in (tags, keys, unique_keys):
        if col is not None and (not PyList_CheckExact(col) or len(col) != n):
            raise TypeError("tags, keys and unique_keys must be None or lists as long as bodies")
    return 0

# --- the pull path ----------------------------------------------------------

cdef int _ext_type(object message_type) except -1:
    """Check a read's *message_type*: the core's MessageExt (its fields set
    directly) or any class made as ``message_type(fields)`` (the twin's)."""
    if message_type is not MessageExt and not isinstance(message_type, type):
        raise TypeError("message_type must be a class")
    return 0


@cython.final
cdef class _Repeats:
    """One read call's fields that records repeat (hosts, record size, magic
    code, store and born timestamps), each kept as one Python object while
    its value repeats: fewer objects made, and freed, per message."""
    cdef object born, store, size_o, magic_o, ts_o
    cdef long long size, magic, ts


cdef object _ext_at(object message_type, const unsigned char *b, Py_ssize_t p0, object topic, _Repeats r):
    """A *message_type* (see _ext_type) for the valid
    record at b + p0 whose topic is *topic*, its repeated fields from *r*."""
    cdef int32_t sys_flag = ld32(b + p0 + 36), body_len, props_len
    cdef int bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    cdef int sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    cdef const unsigned char *h = b + p0 + 48 + bw
    cdef const unsigned char *u
    cdef long long v
    cdef MessageExt m
    body_len = ld32(h + 20 + sw)
    u = h + 24 + sw + body_len
    u += (1 + u[0]) if ld32(b + p0 + 4) == MESSAGE_MAGIC_CODE else (2 + ld16(u))
    props_len = ld16(u)
    if r.born is None or PyBytes_GET_SIZE(r.born) != bw or memcmp(PyBytes_AS_STRING(r.born), b + p0 + 48, bw) != 0:
        r.born = PyBytes_FromStringAndSize(<const char *>b + p0 + 48, bw)
    if r.store is None or PyBytes_GET_SIZE(r.store) != sw or memcmp(PyBytes_AS_STRING(r.store), h + 8, sw) != 0:
        r.store = PyBytes_FromStringAndSize(<const char *>h + 8, sw)
    v = ld32(b + p0)
    if r.size_o is None or r.size != v:
        r.size_o, r.size = v, v
    v = ld32(b + p0 + 4)
    if r.magic_o is None or r.magic != v:
        r.magic_o, r.magic = v, v
    v = ld64(h)
    if r.ts_o is None or r.ts != v:
        r.ts_o, r.ts = v, v
    v = ld64(b + p0 + 40)
    born_ts = r.ts_o if v == r.ts else v  # (born = store time, unless the producer set it)
    body = PyBytes_FromStringAndSize(<const char *>h + 24 + sw, body_len)
    blob = PyBytes_FromStringAndSize(<const char *>u + 2, props_len)
    if message_type is not MessageExt:
        return message_type((r.size_o, r.magic_o, ld32(b + p0 + 8), ld32(b + p0 + 12), ld32(b + p0 + 16),
                             ld64(b + p0 + 20), ld64(b + p0 + 28), sys_flag, born_ts, r.born, r.ts_o, r.store,
                             ld32(h + 8 + sw), ld64(h + 12 + sw), body, topic, blob))
    m = MessageExt.__new__(MessageExt)
    m.store_size, m.magic_code, m.body_crc = r.size_o, r.magic_o, ld32(b + p0 + 8)
    m.queue_id, m.flag, m.queue_offset = ld32(b + p0 + 12), ld32(b + p0 + 16), ld64(b + p0 + 20)
    m.physical_offset, m.sys_flag, m.born_timestamp, m._born_host = ld64(b + p0 + 28), sys_flag, born_ts, r.born
    m.store_timestamp, m._store_host, m.reconsume_times = r.ts_o, r.store, ld32(h + 8 + sw)
    m.prepared_transaction_offset, m.body, m.topic, m.properties_blob = ld64(h + 12 + sw), body, topic, blob
    return m


cdef inline const unsigned char *_topic_at(const unsigned char *b, Py_ssize_t p0, Py_ssize_t *n) noexcept:
    """The topic bytes of the valid record at b + p0, their length in n."""
    cdef int32_t sys_flag = ld32(b + p0 + 36)
    cdef Py_ssize_t p = p0 + 68 + (20 if sys_flag & BORNHOST_V6_FLAG else 8) + \
        (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8)
    p += 4 + ld32(b + p)
    if ld32(b + p0 + 4) == MESSAGE_MAGIC_CODE:
        n[0] = b[p]
        return b + p + 1
    n[0] = ld16(b + p)
    return b + p + 2


cdef bint _topic_is(const unsigned char *b, Py_ssize_t p0, const char *tb, Py_ssize_t tl) noexcept:
    """Whether the valid record at b + p0 stores topic *tb* (UTF-8)."""
    cdef Py_ssize_t n
    cdef const unsigned char *t = _topic_at(b, p0, &n)
    return n == tl and memcmp(t, tb, tl) == 0


cdef const unsigned char *_props_of(const unsigned char *b, Py_ssize_t p0, Py_ssize_t *n) noexcept:
    """The properties of the valid record at b + p0 (they follow its topic), their length in n."""
    cdef Py_ssize_t tl
    cdef const unsigned char *p = _topic_at(b, p0, &tl) + tl
    n[0] = ld16(p)
    return p + 2


cdef bint _has_key(const unsigned char *props, Py_ssize_t n, const char *kb, Py_ssize_t kl) noexcept:
    """UNIQ_KEY == key, or key one of the space-separated KEYS (an absent
    KEYS splits to one empty key), on RocketMQ's property parsing: the last
    entry of each name is its value, found in one pass (as _tags_in)."""
    cdef Py_ssize_t s = 0, e
    cdef _Pair pr, uniq, keys
    cdef bint has_uniq = False, has_keys = False
    cdef const unsigned char *v
    while s <= n:
        if _entry(props, n, &s, &pr):
            if _is_name(props, &pr, "UNIQ_KEY", 8):
                uniq, has_uniq = pr, True
            elif _is_name(props, &pr, "KEYS", 4):
                keys, has_keys = pr, True
    if has_uniq and uniq.vn == kl and memcmp(props + uniq.v, kb, kl) == 0:
        return True
    if not has_keys:
        return kl == 0
    v = props + keys.v
    s = 0
    while s <= keys.vn:
        e = s
        while e < keys.vn and v[e] != 32:
            e += 1
        if e - s == kl and memcmp(v + s, kb, kl) == 0:
            return True
        s = e + 1
    return False


cdef const unsigned char *_unit_record(_View *v, object bufs, long long phy, int32_t size, long long queue_offset,
                                       int32_t queue_id, const char *tb, Py_ssize_t tl, Py_ssize_t max_size,
                                       Py_ssize_t *p0) except? NULL:
    """The record a ConsumeQueue unit stands for (docs/recovery.md#pitfall-stored-offsets-trusted), read through v: its
    segment's bytes (the record at *p0*) when a valid record (body CRC
    included) of *size* bytes starts at *phy* with that queue offset, queue
    id and stored topic; NULL otherwise (_pure._unit_record)."""
    cdef Py_ssize_t limit
    cdef const unsigned char *b = _view_at(v, bufs, phy, p0, &limit)
    cdef int rc
    if b == NULL:
        return NULL
    rc = _check(b, v.buf.len, p0[0], limit, True, 0, max_size)
    if rc <= 0 or rc != size or ld64(b + p0[0] + 28) != phy or ld64(b + p0[0] + 20) != queue_offset or \
            ld32(b + p0[0] + 12) != queue_id or not _topic_is(b, p0[0], tb, tl):
        return NULL
    return b


def pull_units(cq_buf, start, end, view, topic, queue_id, queue_offset, max_count, min_physical_offset, max_size,
               message_type, list out):
    """A pull's inner loop (RocketMQ ``getMessage`` without a filter) over the
    ConsumeQueue units in ``cq_buf[start:end]`` (whole units), the first at
    *queue_offset*, reading records through the CommitLog *view*
    (``CommitLog.segment_view()``): a pre-blank placeholder is skipped, a
    unit whose record starts below *min_physical_offset* (cleaned up) is
    skipped and noted, and every other record, checked to be the unit's
    (valid up to *max_size* bytes with its body CRC, its size, physical offset, queue offset,
    queue id and topic), is appended to *out* as ``message_type(fields)``
    (*message_type*: MessageExt, or a class with its ``__slots__`` and a
    constructor that only stores the fields in them; the core fills the
    slots without calling it), the topic field being *topic* itself, until
    *out* holds *max_count*.

    Returns ``(units_done, last_event, stopped)``: *last_event* is 2 when the
    last unit that found or missed a record found one, 1 when it was
    cleaned up, 0 for none; *stopped* means the unit after the ones done
    needs the caller's careful path (no valid record where it points, or not
    its record: the caller raises), nothing having been appended for it.
    """
    cdef Py_ssize_t s = _idx(start), e = _idx(end), mx = _idx(max_count), msize = _idx(max_size)
    cdef Py_ssize_t k, p, p0, tl
    cdef long long q0 = _i64(queue_offset), cl_min = _i64(min_physical_offset)
    cdef long long phy, tags, done = 0
    cdef int32_t size, qid = _i32(queue_id)
    cdef int status = -1
    cdef bint stopped = False
    cdef const unsigned char *u
    cdef const unsigned char *b
    cdef const char *tb
    cdef Py_buffer cv
    cdef _View v
    _ext_type(message_type)
    if not isinstance(topic, str):
        raise TypeError("topic must be a str")
    tb = PyUnicode_AsUTF8AndSize(topic, &tl)
    bufs = _view_open(&v, view)
    repeats = _Repeats.__new__(_Repeats)
    _init_view(&cv)
    PyObject_GetBuffer(cq_buf, &cv, PyBUF_SIMPLE)
    try:
        if s < 0 or e > cv.len or s > e or (e - s) % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"units [{start}, {end}) are not whole units of a {cv.len}-byte buffer")
        for k in range((e - s) // CQ_STORE_UNIT_SIZE):  # a C loop (an enum step would make a Python range)
            p = s + k * CQ_STORE_UNIT_SIZE
            if PyList_GET_SIZE(out) >= mx:
                break
            u = <const unsigned char *>cv.buf + p
            phy = ld64(u)
            size = ld32(u + 8)
            tags = ld64(u + 12)
            if size == PRE_BLANK_SIZE and phy == 0 and tags == 0:
                done += 1  # a pre-blank placeholder
                continue
            if phy < cl_min:  # its record was cleaned up
                if PyList_GET_SIZE(out) == 0:
                    status = _MESSAGE_WAS_REMOVING
                done += 1
                continue
            b = _unit_record(&v, bufs, phy, size, q0 + done, qid, tb, tl, msize, &p0)
            if b == NULL:  # not a record it can vouch for: the caller's careful path
                stopped = True
                break
            PyList_Append(out, _ext_at(message_type, b, p0, topic, repeats))
            status = _FOUND
            done += 1
    finally:
        PyBuffer_Release(&v.buf)
        PyBuffer_Release(&cv)
    return done, (None if status < 0 else _status(status)), stopped


def read_keyed(view, offsets, topic, key, max_size, message_type, list out):
    """``query_messages``' reads (fixes RocketMQ #3613 hash collisions,
    ): each physical offset of *offsets* once, in order, skipping
    those below the *view*'s minimum (cleaned up) or where no valid record
    of at most *max_size* bytes starts; a record whose topic is *topic* and
    whose UNIQ_KEY is *key* or one of whose space-separated KEYS is *key*
    (properties as ``parse_properties`` reads them, an absent KEYS counting
    as one empty key) is appended to *out* as ``message_type(fields)`` (see
    ``pull_units``). Returns None."""
    cdef Py_ssize_t i, n, msize = _idx(max_size)
    cdef _View v
    cdef _Col offs
    _ext_type(message_type)
    if not isinstance(topic, str) or not isinstance(key, str):
        raise TypeError("topic and key must be str")
    if not PyList_CheckExact(offsets):
        raise TypeError("offsets must be a list of int")
    bufs = _view_open(&v, view)
    memset(&offs, 0, sizeof(offs))
    try:
        n = PyList_GET_SIZE(offsets)
        for i in range(n):
            _put64(&offs, _i64(offsets[i]))
        _read_keyed(&v, bufs, <int64_t *>offs.p, n, topic, key, msize, message_type, out)
    finally:
        free(offs.p)
        PyBuffer_Release(&v.buf)
    return None


cdef int _read_keyed(_View *v, object bufs, const int64_t *offsets, Py_ssize_t n, object topic, object key,
                     Py_ssize_t msize, object message_type, list out) except -1:
    """read_keyed over *n* offsets with v open (_ext_type checked, topic and
    key str); v's held segment is the caller's to release."""
    cdef Py_ssize_t i, j, tl, kl, pn, p0, limit
    cdef long long phy
    cdef const char *tb
    cdef const char *kb
    cdef const unsigned char *b
    cdef const unsigned char *props
    try:
        tb = PyUnicode_AsUTF8AndSize(topic, &tl)
        kb = PyUnicode_AsUTF8AndSize(key, &kl)
    except UnicodeEncodeError:
        return 0  # lone surrogates: no stored (decoded) topic or key equals them
    # U+FFFD in the topic or key can equal an invalid UTF-8 byte read back
    # (decoded with "replace"): then compare as text, as the twin does
    text = not (PyUnicode_IS_ASCII(topic) and PyUnicode_IS_ASCII(key)) and ("\ufffd" in topic or "\ufffd" in key)
    repeats = _Repeats.__new__(_Repeats)
    for i in range(n):
        phy = offsets[i]
        for j in range(i):
            if offsets[j] == phy:
                break
        else:
            j = -1
        if j >= 0 or phy < v.lo:
            continue  # each record once; cleaned-up records are gone
        b = _view_at(v, bufs, phy, &p0, &limit)
        if b == NULL or _check(b, v.buf.len, p0, limit, True, 0, msize) <= 0 or ld64(b + p0 + 28) != phy:
            continue
        props = _props_of(b, p0, &pn)
        if text:
            fields = decode_record(_segment(bufs, v.seg, v.files), p0, False)
            if fields[15] != topic:
                continue
            found = parse_properties(fields[16])
            if found.get("UNIQ_KEY") == key or key in (found.get("KEYS") or "").split(" "):
                PyList_Append(out, _ext_at(message_type, b, p0, fields[15], repeats))
        elif _topic_is(b, p0, tb, tl) and _has_key(props, pn, kb, kl):
            PyList_Append(out, _ext_at(message_type, b, p0, topic, repeats))
    return 0


def query_keyed(index, commitlog, topic, key, max_num, begin, end, message_type, list out, refs):
    """``query_messages`` in one call: ``index.query_offsets(topic, key,
    max_num, begin, end)`` (``IndexService.queryOffset``), then
    :func:`read_keyed` of those offsets through ``commitlog.segment_view()``
    with ``commitlog.max_record_size``, appending to *out*. *refs* as in
    :func:`time_lookup`. Returns *out*, or None (nothing read) when the
    caller must hold a reference and call again with ``refs=None``.
    Raises TypeError unless *topic* and *key* are str."""
    return _query_keyed(index, commitlog, topic, key, max_num, begin, end, message_type, out, refs)


cdef object _query_keyed(index, commitlog, topic, key, max_num, begin, end, message_type, list out, refs):
    return _query_keyed_held(index, commitlog, topic, key, max_num, _wide(begin), _wide(end), message_type, out, refs)


cdef object _query_keyed_held(index, commitlog, topic, key, max_num, rmq_i128 lo, rmq_i128 hi, message_type,
                              list out, refs):
    if not _hold(refs):
        return None
    try:
        return _query_keyed_in(index, commitlog, topic, key, max_num, lo, hi, message_type, out)
    finally:
        _drop(refs)


cdef object _query_keyed_in(index, commitlog, topic, key, max_num, rmq_i128 lo, rmq_i128 hi, message_type,
                            list out):
    # IndexService.queryOffset over index's files, then read_keyed, in one call (under a reference)
    cdef Py_ssize_t i, n, hsn = 0, idx = 0, limit
    cdef int32_t key_hash
    cdef int64_t fb, fe
    cdef IndexRegion f
    cdef Py_buffer iv
    cdef _View v
    cdef _Col found
    cdef char found_buf[512]  # 64 offsets, max_msgs_num_batch's default
    _ext_type(message_type)
    if not isinstance(topic, str) or not isinstance(key, str):
        raise TypeError("topic and key must be str")
    limit = _idx(max_num)
    batch = (<IndexServiceBase?>index).max_msgs_num_batch
    if batch < limit:
        limit = batch
    files = (<IndexServiceBase>index).files
    if files is None:
        raise TypeError("an index without a files list")
    key_hash = _abs_hash(_java_hash_from(_hash_char(_java_hash_from(0, topic), 35), key))  # of topic#key
    _on_stack(&found, found_buf, sizeof(found_buf))
    _init_view(&iv)
    try:
        n = PyList_GET_SIZE(files)
        for i in range(n - 1, -1, -1):
            f = files[i]
            PyObject_GetBuffer(f.mm, &iv, PyBUF_SIMPLE)
            _check_index(&iv, f.hash_slot_num, f.index_num, &hsn, &idx)
            fb = ld64(<const unsigned char *>iv.buf)
            fe = ld64(<const unsigned char *>iv.buf + 8)
            # IndexFile.isTimeMatched, then selectPhyOffset
            if (lo < fb and hi > fe) or (fb <= lo <= fe) or (fb <= hi <= fe):
                _select(<const unsigned char *>iv.buf, hsn, idx, key_hash, limit - found.n // 8, lo, hi, &found)
            PyBuffer_Release(&iv)
            if fb < lo or found.n // 8 >= limit:
                break
        if found.n == 0:
            return out
        bufs = _view_of(&v, commitlog)
        try:
            _read_keyed(&v, bufs, <int64_t *>found.p, found.n // 8, topic, key,
                        _max_record(commitlog), message_type, out)
        finally:
            PyBuffer_Release(&v.buf)
    finally:
        PyBuffer_Release(&iv)
        _free(&found)
    return out


def read_ext(commitlog, physical_offset, message_type, list out not None, refs):
    """``get_message`` in one call: the valid record (body CRC checked, at
    most ``commitlog.max_record_size`` bytes) that starts at CommitLog
    physical offset *physical_offset*, read through
    ``commitlog.segment_view()`` and appended to *out* as
    ``message_type(fields)`` (see ``pull_units``); nothing is appended below
    the minimum offset, past the end (any int, past int64 too) or where no
    valid record starts. *refs* as in :func:`time_lookup`. Returns *out*,
    or None (nothing read) when the caller must hold a reference and call
    again with ``refs=None``. Raises TypeError unless *physical_offset* is
    an int (``__index__``; a bool is not)."""
    cdef _View v
    cdef Py_ssize_t p0, limit, tl
    cdef const unsigned char *b
    cdef const unsigned char *t
    cdef rmq_i128 phy
    if PyBool_Check(physical_offset):
        raise TypeError("physical_offset must be an int, not a bool")
    phy = _wide(physical_offset)
    _ext_type(message_type)
    if not _hold(refs):
        return None
    try:
        bufs = _view_of(&v, commitlog)
        if phy < v.lo or phy >= v.hi:
            return out
        try:
            b = _view_at(&v, bufs, <long long>phy, &p0, &limit)
            if b != NULL and _check(b, v.buf.len, p0, limit, True, 0,
                                    _max_record(commitlog)) > 0 \
                    and ld64(b + p0 + 28) == phy:
                t = _topic_at(b, p0, &tl)
                PyList_Append(out, _ext_at(message_type, b, p0, PyUnicode_DecodeUTF8(<const char *>t, tl, "replace"),
                                           _Repeats.__new__(_Repeats)))
        finally:
            PyBuffer_Release(&v.buf)
    finally:
        _drop(refs)
    return out


cdef packed struct _ViewUnit:  # _pure.VIEW_UNIT ("=qqqqqii"), native byte order
    int64_t queue_offset, physical_offset, store_timestamp, tags_code, body_offset
    int32_t body_length, store_size


# --- pull statuses ------------------------------------------------------------
# A pull answers a GetMessageStatus member (an IntEnum valued by RocketMQ's
# ordinal), taken from this tuple by its value: no lookup by name per pull.
cdef tuple _GMS = tuple(GetMessageStatus)
if [int(m) for m in _GMS] != list(range(len(_GMS))):
    raise ImportError("GetMessageStatus must be valued 0, 1, ... in declaration order")
cdef int _FOUND = GetMessageStatus.FOUND
cdef int _NO_MATCHED_MESSAGE = GetMessageStatus.NO_MATCHED_MESSAGE
cdef int _MESSAGE_WAS_REMOVING = GetMessageStatus.MESSAGE_WAS_REMOVING
cdef int _OFFSET_OVERFLOW_BADLY = GetMessageStatus.OFFSET_OVERFLOW_BADLY
cdef int _OFFSET_OVERFLOW_ONE = GetMessageStatus.OFFSET_OVERFLOW_ONE
cdef int _OFFSET_TOO_SMALL = GetMessageStatus.OFFSET_TOO_SMALL
cdef int _NO_MATCHED_LOGIC_QUEUE = GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
cdef int _NO_MESSAGE_IN_QUEUE = GetMessageStatus.NO_MESSAGE_IN_QUEUE


cdef inline object _status(int code):
    """The GetMessageStatus member of value *code* (a valid one)."""
    return <object>PyTuple_GET_ITEM(_GMS, code)


cdef inline int _bounds(long long q, long long mn, long long mx, long long *nxt) noexcept:
    """The status ladder of a pull before any unit is read (_pure._bounds):
    the status of queue offset *q* in a queue of min offset *mn* and max
    offset *mx*, *nxt* its next_begin_offset; -1 (*nxt* = *q*) when *q* is
    a unit to read."""
    nxt[0] = q
    if mx == 0:
        nxt[0] = 0
        return _NO_MESSAGE_IN_QUEUE
    if q < mn:
        nxt[0] = mn
        return _OFFSET_TOO_SMALL
    if q == mx:
        return _OFFSET_OVERFLOW_ONE
    if q > mx:
        nxt[0] = mx
        return _OFFSET_OVERFLOW_BADLY
    return -1


def pull_bounds(cq, queue_offset):
    """``(status, next_begin_offset, min_offset, max_offset)`` where a pull
    of *cq* (None: no such queue) from *queue_offset* ends before reading a
    unit; status None when it reads units (see _pure.pull_bounds)."""
    cdef long long nxt, mn, mx
    cdef rmq_i128 wq = _wide(queue_offset)
    cdef long long q = LLONG_MAX if wq > LLONG_MAX else (LLONG_MIN if wq < LLONG_MIN else <long long>wq)
    cdef int code
    if cq is None:
        return _status(_NO_MATCHED_LOGIC_QUEUE), 0, 0, 0
    mn, mx = _i64(cq.min_offset_in_queue()), _i64(cq.max_offset_in_queue())
    code = _bounds(q, mn, mx, &nxt)
    if code < 0:
        return None, queue_offset, mn, mx
    return _status(code), nxt, mn, mx


def pull_views(cq, commitlog, queue_offset, max_count, max_units, refs):
    """``get_messages`` without a filter, zero-copy (``get_message_views``):
    the messages of ConsumeQueue *cq* from *queue_offset* as positions in one
    CommitLog segment instead of copies. *refs* as in :func:`time_lookup`.

    The statuses and offsets are ``_pull_held``'s (RocketMQ ``getMessage``):
    placeholders and cleaned-up units are skipped, at most *max_count*
    messages, units read a ConsumeQueue file at a time until *max_units*
    have been visited; every record is checked to be its unit's (as
    :func:`pull_units`). The pull also ends before the first record in
    another segment than the first one found (the next pull starts there).

    Returns None (the caller must hold a reference and call again with
    ``refs=None``), or ``(status, next_queue_offset, min_offset, max_offset,
    segment, units)``: *status* a ``GetMessageStatus`` name, or ``"STOPPED"``
    when the first unit to read needs the caller's careful path (nothing
    found before it); *segment* the ``mmap`` of the segment holding the
    records (None when none); *units* ``VIEW_UNIT`` entries, one per message.
    A caller that exports *segment* (a memoryview) does so while it still
    holds its reader reference (so with ``refs=None``, under its own hold):
    an exported mapping is one the store's ``close()`` cannot unmap.
    """
    if not _hold(refs):
        return None
    try:
        return _pull_queue(cq, commitlog, queue_offset, max_count, max_units, None, None, None)
    finally:
        _drop(refs)


def pull_messages(cq, commitlog, queue_offset, max_count, max_units, message_type, list out not None, tags, refs):
    """``get_messages`` in one call: :func:`pull_views`' statuses, offsets
    and checks, with the messages made as *message_type* (``MessageExt``)
    and appended to *out*, across CommitLog segments.

    *tags*: None for every message, else a tag filter ``(codes, names)``
    (a set of tags codes, a set of tag names; ``store._tag_filter``'s): a
    unit is read only when its tags code is one of *codes* (RocketMQ's
    ConsumeQueue filter), and its message kept only when its ``tags`` is
    one of *names* (the client's check, fixing hash collisions); a
    ConsumeQueue file's units are then read *max_count* at a time, as the
    store's careful path reads them. The core answers ``"STOPPED"`` for a
    filter that is not sets of exact ints and strs.

    Returns None (as :func:`pull_views`), or ``(status, next_queue_offset,
    min_offset, max_offset)``; *status* is ``"STOPPED"`` at any unit the
    caller's careful path must read (what *out* got is then to be dropped:
    that path reads the pull again and raises)."""
    return _pull_messages(cq, commitlog, queue_offset, max_count, max_units, message_type, out, tags, refs)


cdef object _pull_messages(cq, commitlog, queue_offset, max_count, max_units, message_type, list out, tags, refs):
    _ext_type(message_type)
    if not _hold(refs):
        return None
    try:
        return _pull_queue(cq, commitlog, queue_offset, max_count, max_units, message_type, out, tags)[:4]
    finally:
        _drop(refs)


cdef struct _TagFilter:
    long long *codes  # malloc'd
    Py_ssize_t ncodes  # -1: no filter
    const char **names  # malloc'd: the names' UTF-8 (kept by the names set's strs)
    Py_ssize_t *lens
    Py_ssize_t nnames
    bint text  # a name holds U+FFFD: compare decoded TAGS (an invalid byte reads as U+FFFD)


cdef int _tag_filter_of(object tags, _TagFilter *f) except -1:
    """*f* from a pull's filter ``(codes, names)``: 1, or 0 when the filter
    is not what the core vouches for (sets of exact ints within int64 and
    of exact strs: no Python code may run while no reader reference is
    held). *f* starts zeroed; its arrays are the caller's to free."""
    cdef int ovf = 0
    cdef Py_ssize_t n
    cdef const char *u
    if type(tags) is not tuple or len(tags) != 2:
        return 0
    code_set, names = tags
    if not PyAnySet_CheckExact(code_set) or not PyAnySet_CheckExact(names):
        return 0
    f.codes = <long long *>malloc(sizeof(long long) * (len(code_set) + 1))
    f.names = <const char **>malloc(sizeof(const char *) * (len(names) + 1))
    f.lens = <Py_ssize_t *>malloc(sizeof(Py_ssize_t) * (len(names) + 1))
    if f.codes == NULL or f.names == NULL or f.lens == NULL:
        raise MemoryError()
    for c in code_set:
        if not PyLong_CheckExact(c):
            return 0
        f.codes[f.ncodes] = PyLong_AsLongLongAndOverflow(c, &ovf)
        if ovf:
            return 0
        f.ncodes += 1
    for name in names:
        if not PyUnicode_CheckExact(name):
            return 0
        if "\ufffd" in <str>name:
            f.text = True
        try:
            u = PyUnicode_AsUTF8AndSize(name, &n)
        except UnicodeEncodeError:
            continue  # lone surrogates: no decoded TAGS equals it
        f.names[f.nnames], f.lens[f.nnames] = u, n
        f.nnames += 1
    return 1


cdef inline bint _code_in(const long long *codes, Py_ssize_t n, long long code) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if codes[i] == code:
            return True
    return False


cdef bint _tags_in(const unsigned char *b, Py_ssize_t p0, _TagFilter *f, object names) except -1:
    """Whether the TAGS of the valid record at b + p0, as MessageExt.tags
    reads it (parse_properties: the last entry named TAGS with a value,
    decoded with "replace"), is one of the filter's *names* (a set of exact
    strs). Without U+FFFD in a name the raw bytes decide: valid UTF-8
    equals a name's UTF-8 exactly when its text equals the name, and
    invalid UTF-8 decodes to a U+FFFD no name holds."""
    cdef Py_ssize_t n, s = 0, i, v = -1, vn = 0
    cdef const unsigned char *props = _props_of(b, p0, &n)
    cdef _Pair pr
    while s <= n:  # (the last entry named TAGS counts, as a later duplicate does in _pairs)
        if _entry(props, n, &s, &pr) and _is_name(props, &pr, "TAGS", 4):
            v, vn = pr.v, pr.vn
    if v < 0:
        return False  # no TAGS: None is no name
    if f.text:
        return PySet_Contains(names, PyUnicode_DecodeUTF8(<const char *>props + v, vn, "replace")) == 1
    for i in range(f.nnames):
        if f.lens[i] == vn and memcmp(f.names[i], props + v, vn) == 0:
            return True
    return False


cdef tuple _pull_queue(cq, commitlog, queue_offset, max_count, max_units, object message_type, list out,
                       object tag_filter):
    """pull_views (*message_type* None: packed units of one segment) or
    pull_messages (*message_type* objects appended to *out*, across
    segments; status None (stopped) at any unit the careful path must read), the latter
    with *tag_filter* None or ``(codes, names)`` (store._tag_filter's:
    kept are units whose tags code is in *codes* and then records whose
    TAGS is in *names*; a ConsumeQueue file's units are then read
    *max_count* at a time, as the careful path does)."""
    cdef _TagFilter f
    memset(&f, 0, sizeof(f))
    f.ncodes = -1
    names = None
    try:
        if tag_filter is not None:
            f.ncodes = 0
            if not _tag_filter_of(tag_filter, &f):
                return None, 0, 0, 0, None, b""  # stopped
            names = tag_filter[1]
        return _pull_units_of(cq, commitlog, queue_offset, max_count, max_units, message_type, out, &f, names)
    finally:
        free(f.codes)
        free(f.names)
        free(f.lens)


cdef tuple _pull_units_of(cq, commitlog, queue_offset, max_count, max_units, object message_type, list out,
                          _TagFilter *f, object names):
    """_pull_queue with its filter ready (*f.ncodes* -1: none)."""
    cdef bint views = message_type is None
    cdef _Repeats repeats = None if views else _Repeats.__new__(_Repeats)
    cdef rmq_i128 wq = _wide(queue_offset)
    cdef long long mn, mx, off, cq_fs, first, phy, tags
    # saturated: an offset past int64 is past the queue's end (or before its start) all the same
    cdef long long q = LLONG_MAX if wq > LLONG_MAX else (LLONG_MIN if wq < LLONG_MIN else <long long>wq)
    cdef Py_ssize_t mc = _idx(max_count), mu = _idx(max_units), n = 0, visited = 0, nfiles, fi, pos, end, k
    cdef Py_ssize_t p0, tl, msize, seg = -1
    cdef int32_t size, qid, sys_flag
    cdef int bw, sw
    cdef bint kept
    cdef int status
    cdef const unsigned char *u
    cdef const unsigned char *b
    cdef const char *tb
    cdef _ViewUnit *w
    cdef Py_buffer cv
    cdef _View v
    cdef _Col units
    queue = _queue_of_cq(cq)
    files = queue.files
    if files is None:
        raise TypeError("a ConsumeQueue's queue has no files list")
    nfiles = PyList_GET_SIZE(files)
    min_logic = (<ConsumeQueueBase>cq).min_logic_offset
    mn = jdiv(min_logic, 0, CQ_STORE_UNIT_SIZE)
    mx = 0
    if nfiles:
        last = files[nfiles - 1]
        mx = ((<MappedRegion?>last).file_from_offset + (<MappedRegion?>last).wrote_position) // CQ_STORE_UNIT_SIZE
    status = _bounds(q, mn, mx, &off)
    if status >= 0:
        return _status(status), off, mn, mx, None, b""
    topic = (<ConsumeQueueBase>cq).topic
    if topic is None:
        raise TypeError("a ConsumeQueue without a topic")
    tb = PyUnicode_AsUTF8AndSize(topic, &tl)
    qid = (<ConsumeQueueBase>cq).queue_id
    msize = _max_record(commitlog)
    cq_fs = _i64(queue.file_size)
    first = (<MappedRegion?>files[0]).file_from_offset
    status = _NO_MATCHED_MESSAGE
    bufs = _view_of(&v, commitlog)
    memset(&units, 0, sizeof(units))
    _init_view(&cv)
    try:
        while q < mx and n < mc and visited < mu:
            # ConsumeQueue.unit_range(q, min(max_count - n, max - q)); filtered, max_count for max_count - n
            off = q * CQ_STORE_UNIT_SIZE
            if off < min_logic or cq_fs <= 0:
                break
            fi = <Py_ssize_t>(off // cq_fs - first // cq_fs)
            if fi < 0 or fi >= nfiles:
                break
            mf = files[fi]
            pos = <Py_ssize_t>(off - (<MappedRegion?>mf).file_from_offset)
            end = min((<MappedRegion?>mf).wrote_position,
                      pos + min(mc if f.ncodes >= 0 else mc - n, mx - q) * CQ_STORE_UNIT_SIZE)
            if end <= pos:
                break
            PyObject_GetBuffer((<MappedRegion?>mf).mm, &cv, PyBUF_SIMPLE)
            if pos < 0 or end > cv.len:
                raise ValueError(f"units [{pos}, {end}) are not whole units of a {cv.len}-byte buffer")
            for k in range((end - pos) // CQ_STORE_UNIT_SIZE):  # a C loop (an enum step would make a Python range)
                u = <const unsigned char *>cv.buf + pos + k * CQ_STORE_UNIT_SIZE
                phy = ld64(u)
                size = ld32(u + 8)
                tags = ld64(u + 12)
                # a placeholder: skipped; while nothing is kept, a unit the filter
                # drops makes NO_MATCHED_MESSAGE and one cleaned up MESSAGE_WAS_REMOVING
                if size == PRE_BLANK_SIZE and phy == 0 and tags == 0:
                    pass
                elif f.ncodes >= 0 and not _code_in(f.codes, f.ncodes, tags):
                    if n == 0:
                        status = _NO_MATCHED_MESSAGE
                elif phy < v.lo:
                    if n == 0:
                        status = _MESSAGE_WAS_REMOVING
                else:
                    b = _unit_record(&v, bufs, phy, size, q, qid, tb, tl, msize, &p0)
                    if b == NULL:
                        if n and views:
                            return _status(status), q, mn, mx, _segment(bufs, seg, v.files), units.p[:units.n]
                        return None, q, mn, mx, None, b""  # stopped
                    kept = True
                    if not views:
                        kept = names is None or _tags_in(b, p0, f, names)  # (a tags code's collision)
                        if kept:
                            PyList_Append(out, _ext_at(message_type, b, p0, topic, repeats))
                    else:
                        if seg != -1 and v.seg != seg:  # the next segment: the next pull
                            return _status(status), q, mn, mx, _segment(bufs, seg, v.files), units.p[:units.n]
                        seg = v.seg
                        sys_flag = ld32(b + p0 + 36)
                        bw = 20 if sys_flag & BORNHOST_V6_FLAG else 8
                        sw = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
                        if units.n + <Py_ssize_t>sizeof(_ViewUnit) > units.cap:
                            _grow(&units, sizeof(_ViewUnit))
                        w = <_ViewUnit *>(units.p + units.n)  # unaligned-safe: the struct is packed
                        w.queue_offset = q
                        w.physical_offset = phy
                        w.store_timestamp = ld64(b + p0 + 48 + bw)
                        w.tags_code = tags
                        w.body_offset = p0 + 48 + bw + 24 + sw
                        w.body_length = ld32(b + p0 + 48 + bw + 20 + sw)
                        w.store_size = size
                        units.n += sizeof(_ViewUnit)
                    if kept:
                        n += 1
                        status = _FOUND
                    elif n == 0:
                        status = _NO_MATCHED_MESSAGE
                q += 1
                visited += 1
                if n >= mc:
                    break
            PyBuffer_Release(&cv)
        if not views:
            return _status(status), q, mn, mx, None, b""
        return _status(status), q, mn, mx, (_segment(bufs, seg, v.files) if n else None), \
            (units.p[:units.n] if n else b"")
    finally:
        PyBuffer_Release(&cv)
        PyBuffer_Release(&v.buf)
        free(units.p)
