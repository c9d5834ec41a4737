/* Lightspeed native runtime: a fork-join thread pool whose workers stay warm.
 *
 * Workers spin (with pause) for a while after each job before sleeping on a futex,
 * so a decode loop that calls every few milliseconds never pays the 0.5-3 ms
 * wake-up that a sleeping OpenMP team costs on these machines. One process-wide pool
 * is shared by every compiled graph (this library is loaded once, RTLD_GLOBAL).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

typedef void (*ls_task_fn)(void *ctx, int64_t begin, int64_t end);

#define LS_MAX_THREADS 256

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t workers[LS_MAX_THREADS];
static int n_threads = 0;       /* including the calling thread; 0 = not configured */
static int n_started = 0;       /* worker threads running */
static _Atomic uint32_t generation = 0;
/* the job's chunk counter: generation in the high 32 bits, next chunk in the low 32 bits, so a
 * worker that wakes late can never claim a chunk of a later job */
static _Atomic uint64_t claim = 0;
static _Atomic int64_t chunks_done = 0;
static int64_t job_chunks = 0;
static _Atomic int stop_flag = 0;
static _Atomic int sleepers = 0;
static _Atomic int64_t spin_ns = 20 * 1000 * 1000; /* 20 ms of spinning before a worker sleeps */
static uint32_t start_generation;
static ls_task_fn job_fn;
static void *job_ctx;
static int64_t job_n;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* Claim and run chunks of the job of generation ``gen`` until none are left. Chunks are claimed
 * dynamically, so a thread the OS has descheduled delays nobody: the others take its share. */
static void run_chunks(uint32_t gen) {
    for (;;) {
        uint64_t v = atomic_load_explicit(&claim, memory_order_acquire);
        if ((uint32_t)(v >> 32) != gen || (int64_t)(v & 0xffffffffu) >= job_chunks) return;
        if (!atomic_compare_exchange_weak_explicit(&claim, &v, v + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        int64_t c = (int64_t)(v & 0xffffffffu);
        int64_t b = job_n * c / job_chunks, e = job_n * (c + 1) / job_chunks;
        if (b < e) job_fn(job_ctx, b, e);
        atomic_fetch_add_explicit(&chunks_done, 1, memory_order_acq_rel);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    uint32_t seen = start_generation;  /* not the current value: a job may already be posted */
    for (;;) {
        uint32_t g;
        int64_t start = now_ns();
        unsigned spins = 0;
        while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen) {
            if (atomic_load_explicit(&stop_flag, memory_order_relaxed)) return NULL;
            cpu_relax();
            if (++spins % 256 == 0 && now_ns() - start > atomic_load_explicit(&spin_ns, memory_order_relaxed)) {
                atomic_fetch_add(&sleepers, 1);
                if (atomic_load_explicit(&generation, memory_order_acquire) == seen &&
                    !atomic_load_explicit(&stop_flag, memory_order_relaxed))
                    futex_wait(&generation, seen);
                atomic_fetch_sub(&sleepers, 1);
                start = now_ns();
            }
        }
        seen = g;
        if (atomic_load_explicit(&stop_flag, memory_order_relaxed)) return NULL;
        run_chunks(g);
    }
}

static int default_threads(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c > LS_MAX_THREADS ? LS_MAX_THREADS : c;
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)(c > LS_MAX_THREADS ? LS_MAX_THREADS : c) : 1;
}

static void stop_workers(void) {
    if (!n_started) return;
    atomic_store(&stop_flag, 1);
    atomic_fetch_add(&generation, 1);
    futex_wake_all(&generation);
    for (int i = 1; i <= n_started; i++) pthread_join(workers[i], NULL);
    n_started = 0;
    atomic_store(&stop_flag, 0);
}

static void start_workers(void) {
    if (n_threads == 0) n_threads = default_threads();
    start_generation = atomic_load(&generation);
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&workers[i], NULL, worker_main, (void *)(intptr_t)i) != 0) {
            n_threads = i;  /* run with what we could start */
            break;
        }
        n_started = i;
    }
}

/* Set the number of threads (including the caller); 0 restores the default. */
void ls_set_num_threads(int n) {
    pthread_mutex_lock(&pool_lock);
    stop_workers();
    n_threads = n <= 0 ? default_threads() : (n > LS_MAX_THREADS ? LS_MAX_THREADS : n);
    pthread_mutex_unlock(&pool_lock);
}

int ls_get_num_threads(void) {
    pthread_mutex_lock(&pool_lock);
    if (n_threads == 0) n_threads = default_threads();
    int n = n_threads;
    pthread_mutex_unlock(&pool_lock);
    return n;
}

/* How long idle workers spin before sleeping, in microseconds. */
void ls_set_spin_us(int64_t us) { atomic_store(&spin_ns, us * 1000); }

/* Run fn(ctx, begin, end) over [0, n) split evenly across the pool; returns when all are done. */
void ls_parallel_for(ls_task_fn fn, void *ctx, int64_t n) {
    if (n <= 0) return;
    pthread_mutex_lock(&pool_lock);
    if (n_threads == 0) n_threads = default_threads();
    if (n_threads > 1 && n_started == 0) start_workers();
    if (n_threads <= 1 || n == 1) {
        pthread_mutex_unlock(&pool_lock);
        fn(ctx, 0, n);
        return;
    }
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    job_chunks = n < 4 * n_threads ? n : 4 * n_threads;
    atomic_store_explicit(&chunks_done, 0, memory_order_relaxed);
    uint32_t gen = atomic_load_explicit(&generation, memory_order_relaxed) + 1;
    atomic_store_explicit(&claim, (uint64_t)gen << 32, memory_order_release);
    atomic_store_explicit(&generation, gen, memory_order_release);
    if (atomic_load(&sleepers) > 0) futex_wake_all(&generation);
    run_chunks(gen);
    while (atomic_load_explicit(&chunks_done, memory_order_acquire) < job_chunks) cpu_relax();
    pthread_mutex_unlock(&pool_lock);
}
