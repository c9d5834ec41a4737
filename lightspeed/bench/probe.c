/* Streaming read bandwidth probe for `lightspeed bench`.
 *
 * ls_probe_read(bytes, threads, reps, times): allocate `bytes` (2 MiB aligned, huge pages
 * requested with MADV_HUGEPAGE because transparent huge pages are often "madvise" only),
 * fill it, then time `reps` passes in which `threads` threads each sum their contiguous
 * share of the buffer. One untimed pass first brings the pages in. times[r] receives the
 * seconds of pass r, measured by thread 0 between two barriers, so a pass ends when the
 * slowest thread is done. Returns 0, or -1 when the buffer cannot be allocated and -2 when
 * threads cannot be started.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

typedef struct {
    const unsigned char *buf;
    size_t bytes;
    int threads, reps;
    double *times;
    pthread_barrier_t barrier;
    volatile uint64_t sink;
} probe_t;

typedef struct { probe_t *p; int id; } worker_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sum 64-byte lines of [p, p + n) (n a multiple of 64, p 64-byte aligned). */
static uint64_t sum_lines(const unsigned char *p, size_t n) {
#if defined(__AVX2__)
    /* four independent accumulators keep several loads in flight per cycle */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    for (; i < n; i += 32) a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        s0 += q[i]; s1 += q[i + 1]; s2 += q[i + 2]; s3 += q[i + 3];
    }
    return s0 + s1 + s2 + s3;
#endif
}

static void *worker(void *arg) {
    worker_t *w = (worker_t *)arg;
    probe_t *p = w->p;
    size_t lines = p->bytes / 64;
    size_t lo = lines * (size_t)w->id / (size_t)p->threads * 64;
    size_t hi = lines * (size_t)(w->id + 1) / (size_t)p->threads * 64;
    uint64_t acc = 0;
    for (int r = -1; r < p->reps; r++) {  /* r = -1: the untimed pass */
        pthread_barrier_wait(&p->barrier);
        double t0 = now_s();
        acc += sum_lines(p->buf + lo, hi - lo);
        pthread_barrier_wait(&p->barrier);
        if (w->id == 0 && r >= 0) p->times[r] = now_s() - t0;
    }
    p->sink += acc;  /* keeps the sums (and so the loads) alive */
    return NULL;
}

int ls_probe_read(size_t bytes, int threads, int reps, double *times) {
    const size_t align = (size_t)2 << 20;
    if (threads < 1) threads = 1;
    bytes = (bytes + 127) / 128 * 128;
    size_t alloc = (bytes + align - 1) / align * align;
    unsigned char *buf = aligned_alloc(align, alloc);
    if (!buf) return -1;
#ifdef MADV_HUGEPAGE
    madvise(buf, alloc, MADV_HUGEPAGE);
#endif
    memset(buf, 1, bytes);  /* touches every page before the timed passes */
    probe_t p = {.buf = buf, .bytes = bytes, .threads = threads, .reps = reps, .times = times, .sink = 0};
    pthread_barrier_init(&p.barrier, NULL, (unsigned)threads);
    pthread_t *tids = calloc((size_t)threads, sizeof(pthread_t));
    worker_t *ws = calloc((size_t)threads, sizeof(worker_t));
    int rc = 0, started = 1;
    for (int t = 0; t < threads; t++) ws[t] = (worker_t){&p, t};
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&tids[t], NULL, worker, &ws[t]) != 0) { rc = -2; break; }
        started++;
    }
    if (rc == 0) worker(&ws[0]);
    /* on a failed start the started workers wait at a barrier that never fills: cancel them */
    for (int t = 1; t < started; t++) {
        if (rc != 0) pthread_cancel(tids[t]);
        pthread_join(tids[t], NULL);
    }
    pthread_barrier_destroy(&p.barrier);
    free(tids);
    free(ws);
    free(buf);
    return rc;
}
