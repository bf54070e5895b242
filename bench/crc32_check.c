/*
 * Correctness + speed check for rmqstore/_crc32.h against zlib's crc32().
 * Build/run: bench/crc32_check.sh  (gcc -O2 ... -lz).  Exit status 0 = all
 * checks passed.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "../rmqstore/_crc32.h"

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);

/* zlib's crc32 takes a uInt length; split so the wrapper accepts size_t. */
static uint32_t zlib_crc(uint32_t crc, const unsigned char *p, size_t n)
{
    uLong c = crc;
    if (p == NULL)
        return (uint32_t)crc32(c, Z_NULL, 0);
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

struct impl { const char *name; crc_fn fn; };
static struct impl impls[4];
static int n_impls;

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) /* splitmix64: deterministic across runs */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static long n_checks, n_fail;
static void expect(const char *impl, const char *what, size_t off, size_t len,
                   uint32_t start, uint32_t got, uint32_t want)
{
    n_checks++;
    if (got != want) {
        if (n_fail++ < 20)
            fprintf(stderr, "FAIL %s %s off=%zu len=%zu start=%08x: got %08x want %08x\n",
                    impl, what, off, len, start, got, want);
    }
}

#define BIG (1u << 20)

static void check_table(void)
{
    uint32_t t[8][256];
    int i, k, bad = 0;
    for (i = 0; i < 256; i++) {
        uint32_t c = (uint32_t)i;
        for (k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
        t[0][i] = c;
    }
    for (k = 1; k < 8; k++)
        for (i = 0; i < 256; i++)
            t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
    bad = memcmp(t, rmq_crc32__table, sizeof t) != 0;
    expect("table", "regenerated", 0, 0, 0, (uint32_t)bad, 0);
}

static void check_all(const unsigned char *buf)
{
    int m;
    size_t off, len, i;
    const unsigned char *check = (const unsigned char *)"123456789";

    check_table();
    for (m = 0; m < n_impls; m++) {
        crc_fn f = impls[m].fn;
        const char *nm = impls[m].name;

        /* Fixed points: standard check value, NULL buffer, empty input. */
        expect(nm, "check", 0, 9, 0, f(0, check, 9), 0xCBF43926u);
        expect(nm, "null", 0, 0, 0, f(0x12345678u, NULL, 0), zlib_crc(0x12345678u, NULL, 0));
        expect(nm, "empty", 0, 0, 0, f(0xdeadbeefu, buf, 0), zlib_crc(0xdeadbeefu, buf, 0));

        /* Every length 0..1024 at every alignment 0..15, crc 0 and random. */
        for (off = 0; off < 16; off++)
            for (len = 0; len <= 1024; len++) {
                uint32_t s = (uint32_t)rnd();
                expect(nm, "exhaustive", off, len, 0, f(0, buf + off, len),
                       zlib_crc(0, buf + off, len));
                expect(nm, "exhaustive", off, len, s, f(s, buf + off, len),
                       zlib_crc(s, buf + off, len));
            }

        /* Exact-size heap copies, so ASan/valgrind would flag over-reads. */
        for (len = 0; len <= 300; len++) {
            unsigned char *e = malloc(len ? len : 1);
            memcpy(e, buf + 7, len);
            expect(nm, "exact", 0, len, 0, f(0, e, len), zlib_crc(0, buf + 7, len));
            free(e);
        }

        /* Random lengths up to 1 MiB at random offsets and start values. */
        for (i = 0; i < 400; i++) {
            uint32_t s = (i & 3) == 0 ? 0 : (i & 3) == 1 ? 0xffffffffu : (uint32_t)rnd();
            off = rnd() % 64;
            len = rnd() % (BIG + 1);
            expect(nm, "random", off, len, s, f(s, buf + off, len), zlib_crc(s, buf + off, len));
        }

        /* Continuation: split at random points, mixing implementations
         * piecewise (each piece continues from the previous result). */
        for (i = 0; i < 2000; i++) {
            uint32_t s = (i & 1) ? (uint32_t)rnd() : 0;
            uint32_t c = s;
            size_t pos = 0, pieces = 1 + rnd() % 5;
            off = rnd() % 16;
            len = (i < 1000) ? rnd() % 4096 : rnd() % (BIG / 4);
            while (pieces-- > 1 && pos < len) {
                size_t k = rnd() % (len - pos + 1);
                crc_fn g = (rnd() & 1) ? f : impls[rnd() % n_impls].fn;
                c = g(c, buf + off + pos, k);
                pos += k;
            }
            c = f(c, buf + off + pos, len - pos);
            expect(nm, "split", off, len, s, c, zlib_crc(s, buf + off, len));
        }
    }
}

/* ---- benchmark -------------------------------------------------------- */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile uint32_t sink;

/* Median over RUNS runs of the seconds per call for len-byte calls;
 * calls are independent (different offset each), like separate records. */
#define RUNS 15
static double bench(crc_fn f, const unsigned char *buf, size_t len)
{
    double t[RUNS];
    long iters = 1, r, i;
    uint32_t acc = 0;
    /* calibrate: ~20 ms per run */
    for (;;) {
        double t0 = now();
        for (i = 0; i < iters; i++)
            acc ^= f(0, buf + (i & 15), len);
        if (now() - t0 > 0.02)
            break;
        iters *= 2;
    }
    for (r = 0; r < RUNS; r++) {
        double t0 = now();
        for (i = 0; i < iters; i++)
            acc ^= f(0, buf + (i & 15), len);
        t[r] = (now() - t0) / iters;
    }
    sink = acc;
    qsort(t, RUNS, sizeof t[0], cmp_d);
    return t[RUNS / 2];
}

int main(void)
{
    unsigned char *buf = malloc(BIG + 128);
    size_t i;
    int m;
    const size_t sizes[] = {330, 64 * 1024};

    if (!buf)
        return 2;
    for (i = 0; i < BIG + 128; i++)
        buf[i] = (unsigned char)rnd();

    impls[n_impls++] = (struct impl){"portable", rmq_crc32_portable};
#if defined(RMQ_CRC32_HAVE_PCLMUL)
    if (rmq_crc32_hw_available())
        impls[n_impls++] = (struct impl){"pclmul", rmq_crc32_pclmul};
#endif
#if defined(RMQ_CRC32_HAVE_ARMV8)
    if (rmq_crc32_hw_available())
        impls[n_impls++] = (struct impl){"armv8", rmq_crc32_armv8};
#endif
    impls[n_impls++] = (struct impl){"rmq_crc32", rmq_crc32};
    printf("zlib %s; hardware path available: %s\n", zlibVersion(),
           rmq_crc32_hw_available() ? "yes" : "no");

    check_all(buf);
    printf("correctness: %ld checks over %d implementations, %ld failures\n",
           n_checks, n_impls, n_fail);
    if (n_fail)
        return 1;

    printf("\n%-10s %12s %14s %12s\n", "impl", "GB/s @64KiB", "ns/call @330B", "GB/s @330B");
    for (m = -1; m < n_impls; m++) {
        crc_fn f = m < 0 ? zlib_crc : impls[m].fn;
        double small = bench(f, buf, sizes[0]);
        double large = bench(f, buf, sizes[1]);
        printf("%-10s %12.2f %14.1f %12.2f\n", m < 0 ? "zlib" : impls[m].name,
               sizes[1] / large / 1e9, small * 1e9, sizes[0] / small / 1e9);
    }
    free(buf);
    return 0;
}
