/*
 * rmq_pages.h - faulting a mapped file's pages in ahead of its writer
 * (warm_pages, state.pxi), dropping this process's page-table entries for
 * pages written (release_pages), and forcing a range to disk (sync_pages).
 *
 * Included by the generated rmqstore/_core.c through c_support.pxi, which
 * holds the declarations Cython sees.
 */
#ifndef RMQ_PAGES_H
#define RMQ_PAGES_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

/* Linux 5.14's advice; older C headers (manylinux's) lack the name, older
   kernels answer EINVAL and the pages are touched instead */
#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23
#endif

/* The size of the pages the kernel maps (4096 when it will not say). */
static size_t rmq_page_size(void) {
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

/* Fault in [p, p + len) writable, changing no byte. Returns 1 when the
   kernel did it in one call, 0 when each page was touched with an atomic
   "or 0" (a write fault that cannot lose a store another thread makes to
   the same byte meanwhile), -errno when the kernel refused the range. */
static int rmq_warm_pages(unsigned char *p, size_t len) {
    size_t step = rmq_page_size();
    if (len == 0)
        return 1;
#ifdef MADV_POPULATE_WRITE
    {
        uintptr_t a = (uintptr_t)p, lo = a - a % step;
        if (madvise((void *)lo, len + (a - lo), MADV_POPULATE_WRITE) == 0)
            return 1;
        if (errno != EINVAL)
            return -errno;
    }
#endif
    {
        /* one byte per page: the first byte of the range, then each page start */
        uintptr_t a = (uintptr_t)p;
        size_t i = 0;
        while (i < len) {
            __atomic_fetch_or(p + i, (unsigned char)0, __ATOMIC_RELAXED);
            i = (size_t)((a + i) / step + 1) * step - a;
        }
    }
    return 0;
}

/* Drop this process's page-table entries for the whole pages inside
   [p, p + len) of a shared mapping of a file: the bytes stay in the page
   cache (a dirty page stays to be written back) and the next access maps
   the page again. A sync of pages that stay mapped write-protects each one
   as it cleans it, and each write-protect interrupts every CPU that runs a
   thread of this process (a TLB shootdown, one per page); dropped first,
   the pages need none, and the drop costs one for the whole range.
   Returns 1 when done, 0 when not (not Linux, where only this advice is
   known to keep a shared mapping's bytes; or the kernel refused: a locked
   range). On a private mapping it would discard the bytes written: the
   caller vouches for a shared one. */
static int rmq_release_pages(unsigned char *p, size_t len) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    size_t step = rmq_page_size();
    uintptr_t a = (uintptr_t)p, lo = (a + step - 1) / step * step, hi = (a + len) / step * step;
    if (hi <= lo)
        return 1;
    return madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0;
#else
    (void)p;
    (void)len;
    return 0;
#endif
}

/* Force the pages of [p, p + len) to disk and wait (msync MS_SYNC: on
   Linux the file system's sync of that range, journal commit included, as
   fdatasync does for the whole file). Returns 0, or -errno. */
static int rmq_sync_pages(unsigned char *p, size_t len) {
    size_t step = rmq_page_size();
    uintptr_t a = (uintptr_t)p, lo = a - a % step;
    if (len == 0)
        return 0;
    if (msync((void *)lo, len + (a - lo), MS_SYNC) != 0)
        return -errno;
    return 0;
}

#endif
