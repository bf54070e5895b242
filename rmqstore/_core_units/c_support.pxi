# The core's C declarations: the CPython API that Cython's own .pxd files
# lack, the thread lock, zlib, and the project's C headers (rmqstore/_crc32.h
# and the rmq_*.h headers beside this file).


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

cdef extern from "_core_units/rmq_bytes.h":
    int32_t ld32 "rmq_ld32"(const unsigned char *p) nogil
    int64_t ld64 "rmq_ld64"(const unsigned char *p) nogil
    int32_t ld16 "rmq_ld16"(const unsigned char *p) nogil
    void st32 "rmq_st32"(unsigned char *p, uint32_t v) nogil
    void st64 "rmq_st64"(unsigned char *p, uint64_t v) nogil
    void st16 "rmq_st16"(unsigned char *p, uint32_t v) nogil
    ctypedef long long rmq_i128
    long long jdiv "rmq_jdiv"(long long a, long long b, long long u) nogil
    void prefetch "rmq_prefetch"(const void *p) nogil
    void release_fence "rmq_release"() nogil
    void acquire_fence "rmq_acquire"() nogil
    int rmq_unicode_ready(object o) except -1

cdef extern from "_core_units/rmq_objects.h":
    bint rmq_small_long(object o, long long *v)
    object rmq_deref(object ref)
    object rmq_tuple6(object tp, int untrack, object a, object b, object c, object d, object e, object f)
    object rmq_tuple5(object tp, object a, object b, object c, object d, object e)

cdef extern from "_core_units/rmq_refs.h":
    Py_ssize_t RMQ_REF_EXCLUSIVE
    Py_ssize_t rmq_ref_load(Py_ssize_t *w) noexcept nogil
    bint rmq_ref_try_hold(Py_ssize_t *w) noexcept nogil
    Py_ssize_t rmq_ref_drop(Py_ssize_t *w) noexcept nogil
    void rmq_ref_set_exclusive(Py_ssize_t *w) noexcept nogil
    void rmq_ref_clear_exclusive(Py_ssize_t *w) noexcept nogil

cdef extern from "_core_units/rmq_pages.h":
    int rmq_warm_pages(unsigned char *p, size_t length) noexcept nogil
    int rmq_release_pages(unsigned char *p, size_t length) noexcept nogil
    int rmq_sync_pages(unsigned char *p, size_t length) noexcept nogil


cdef extern from "Python.h":
    Py_ssize_t PyUnicode_FindChar(object s, Py_UCS4 ch, Py_ssize_t start, Py_ssize_t end, int direction) except -2
