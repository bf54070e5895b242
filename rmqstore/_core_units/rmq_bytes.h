/*
 * rmq_bytes.h - big-endian loads and stores through memcpy, 128-bit sums,
 * the prefetch hint, the fences of a shared mapping and PyUnicode_READY
 * where it still exists.
 *
 * Included by the generated rmqstore/_core.c, after Python.h (Cython puts
 * every extern header there), through c_support.pxi; the declarations
 * Cython sees are in c_support.pxi.
 */
#ifndef RMQ_BYTES_H
#define RMQ_BYTES_H

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
/* A writer and a reader in other processes share a mapped file: the writer
 * publishes a store (an index slot, then its count) only after what it names,
 * the reader reads the name first. Free on x86 (they only keep the compiler
 * from reordering), a barrier on arm64. */
#define rmq_release() __atomic_thread_fence(__ATOMIC_RELEASE)
#define rmq_acquire() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#if PY_VERSION_HEX < 0x030C0000
#  define rmq_unicode_ready(o) PyUnicode_READY(o)
#else
#  define rmq_unicode_ready(o) 0
#endif

#endif /* RMQ_BYTES_H */
