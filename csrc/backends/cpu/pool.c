/*
 * pool.c - the cpu backend's one thread pool (pool.h) and the thread-count setting of rlx.h
 * (rlx_set_num_threads / rlx_get_num_threads). A parallel region splits [0, n) into at most one
 * contiguous chunk per thread; the caller runs chunk 0 and workers 1..nchunks-1 run the others.
 * Workers are created lazily on the first region that needs them. After a region a worker spins
 * for RLX_POOL_SPIN_NS on the atomic generation counter, then sleeps on a condition variable;
 * the owner likewise spins on the atomic count of pending chunks before sleeping. A decode step
 * runs a few hundred short regions back to back, and waking a sleeping thread through futexes
 * costs 15-40 us per region on a 2-vCPU VM, against ~1 us when the worker is spinning
 * (measured, /tmp/bench_kernels.c). The spin is short and only follows a region, so OpenBLAS
 * (sized to the same count) has the cores to itself between regions apart from that tail; this
 * file must never spin longer or anywhere else. A region is owned through a try-lock: a second
 * thread that finds the pool busy, and any call made from inside a task, runs its range inline
 * on its own thread; it must never wait for the pool. Resizing joins every worker while holding
 * the region lock, so it waits for a running region to end; rlx_set_num_threads(1) leaves no
 * worker alive, which is the way to shut the pool down completely (nothing is freed at exit).
 * Workers block all signals; a fork() child starts over with no workers.
 */
#include "backends/cpu/pool.h"

#include "rlx/rlx.h"

#include <cblas.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Upper bound on threads (caller included); larger requests are clamped. */
#define RLX_POOL_MAX_THREADS 256
/* How long a worker waits for the next region, and the owner for its workers, before sleeping. */
#define RLX_POOL_SPIN_NS     50000

struct rlx_pool_worker {
    pthread_t thread;
    int id;             /* chunk index this worker runs: 1..RLX_POOL_MAX_THREADS-1 */
    uint64_t start_gen; /* generation current when it was created: it waits for the next one */
};

static struct {
    pthread_once_t once;
    pthread_mutex_t region;            /* held by the thread that owns the workers for a region or a resize */
    pthread_mutex_t m;                 /* guards everything below */
    pthread_cond_t work;               /* workers wait here for gen to change or quit */
    pthread_cond_t done;               /* the region owner waits here for pending == 0 */
    _Alignas(64) _Atomic uint64_t gen; /* incremented once per region (written under m, read spinning) */
    atomic_int quit;                   /* set while joining workers (written under m, read spinning) */
    rlx_range_fn fn;                   /* the current region: */
    void *ctx;
    int64_t n;
    int nchunks;
    _Alignas(64) atomic_int pending; /* worker chunks of the current region not yet finished (the last
                               worker to finish signals `done` under m) */
    int nworkers;                    /* workers alive: ids 1..nworkers */
    struct rlx_pool_worker workers[RLX_POOL_MAX_THREADS];
} g_pool = {
    .once = PTHREAD_ONCE_INIT,
    .region = PTHREAD_MUTEX_INITIALIZER,
    .m = PTHREAD_MUTEX_INITIALIZER,
    .work = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

/* Threads wanted (caller included), >= 1; read without locks by rlx_pool_threads. */
static atomic_int g_threads = 1;

/* Nonzero on pool workers, and on any thread while it runs a range (its chunk or an inline run). */
static _Thread_local int tls_in_region;

static int clamp_threads(long n)
{
    if (n < 1) return 1;
    return n > RLX_POOL_MAX_THREADS ? RLX_POOL_MAX_THREADS : (int)n;
}

static int default_threads(void) { return clamp_threads(sysconf(_SC_NPROCESSORS_ONLN)); }

/* In a child of fork() only the forking thread exists: forget the workers (a fresh set is made
 * on the next region) and reset locks a parent thread may have held at the fork. */
static void pool_after_fork_child(void)
{
    pthread_mutex_init(&g_pool.region, NULL);
    pthread_mutex_init(&g_pool.m, NULL);
    pthread_cond_init(&g_pool.work, NULL);
    pthread_cond_init(&g_pool.done, NULL);
    g_pool.quit = 0;
    g_pool.pending = 0;
    g_pool.nworkers = 0;
}

static void pool_init_once(void)
{
    int n = default_threads();
    const char *env = getenv("RLX_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v > 0) n = clamp_threads(v);
    }
    atomic_store(&g_threads, n);
    openblas_set_num_threads(n);
    pthread_atfork(NULL, NULL, pool_after_fork_child);
}

static void pool_init(void) { pthread_once(&g_pool.once, pool_init_once); }

/* Bounds of chunk c of nchunks over [0, n): balanced, so every chunk has floor or ceil(n/nchunks). */
static int64_t chunk_begin(int64_t n, int nchunks, int c)
{
    /* floor(n * c / nchunks) without overflowing n * c */
    return n / nchunks * c + n % nchunks * c / nchunks;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins up to RLX_POOL_SPIN_NS until *v != old or quit is set; the caller then takes the slow
 * path, which checks again under the lock and sleeps if nothing changed. */
static void spin_u64(_Atomic uint64_t *v, uint64_t old)
{
    uint64_t start = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != old ||
            atomic_load_explicit(&g_pool.quit, memory_order_relaxed))
            return;
        cpu_relax();
        if ((i & 15) == 15) {
            const uint64_t t = now_ns();
            if (start == 0)
                start = t;
            else if (t - start > RLX_POOL_SPIN_NS)
                return;
        }
    }
}

/* Spins up to RLX_POOL_SPIN_NS until every worker chunk of the region is done. */
static void spin_pending(void)
{
    uint64_t start = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&g_pool.pending, memory_order_acquire) == 0) return;
        cpu_relax();
        if ((i & 15) == 15) {
            const uint64_t t = now_ns();
            if (start == 0)
                start = t;
            else if (t - start > RLX_POOL_SPIN_NS)
                return;
        }
    }
}

static void *worker_main(void *arg)
{
    struct rlx_pool_worker *w = arg;
    uint64_t seen = w->start_gen;
    tls_in_region = 1;
    for (;;) {
        spin_u64(&g_pool.gen, seen);
        pthread_mutex_lock(&g_pool.m);
        while (!atomic_load(&g_pool.quit) && atomic_load(&g_pool.gen) == seen)
            pthread_cond_wait(&g_pool.work, &g_pool.m);
        if (atomic_load(&g_pool.quit)) break;
        seen = atomic_load(&g_pool.gen);
        const int mine = w->id < g_pool.nchunks;
        rlx_range_fn fn = g_pool.fn;
        void *ctx = g_pool.ctx;
        int64_t n = g_pool.n;
        int nchunks = g_pool.nchunks;
        pthread_mutex_unlock(&g_pool.m);
        if (!mine) continue;
        fn(ctx, chunk_begin(n, nchunks, w->id), chunk_begin(n, nchunks, w->id + 1));
        if (atomic_fetch_sub_explicit(&g_pool.pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&g_pool.m);
            pthread_cond_signal(&g_pool.done);
            pthread_mutex_unlock(&g_pool.m);
        }
    }
    pthread_mutex_unlock(&g_pool.m);
    return NULL;
}

/* Joins every worker. Caller holds g_pool.region. */
static void workers_join(void)
{
    pthread_mutex_lock(&g_pool.m);
    g_pool.quit = 1;
    pthread_cond_broadcast(&g_pool.work);
    pthread_mutex_unlock(&g_pool.m);
    for (int i = 0; i < g_pool.nworkers; i++) pthread_join(g_pool.workers[i].thread, NULL);
    pthread_mutex_lock(&g_pool.m);
    g_pool.quit = 0;
    g_pool.nworkers = 0;
    pthread_mutex_unlock(&g_pool.m);
}

/* Makes the worker count match g_threads - 1: joins all on a shrink, adds on a grow. A worker
 * that cannot be created is simply missing: regions then use fewer chunks. Caller holds
 * g_pool.region, so no region is in flight and gen is stable. */
static void workers_fit(void)
{
    int want = atomic_load(&g_threads) - 1;
    if (want < g_pool.nworkers) workers_join();
    if (g_pool.nworkers >= want) return;
    /* Workers start with every signal blocked: signals go to the application's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (g_pool.nworkers < want) {
        struct rlx_pool_worker *w = &g_pool.workers[g_pool.nworkers];
        w->id = g_pool.nworkers + 1;
        w->start_gen = g_pool.gen;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) break;
        pthread_mutex_lock(&g_pool.m);
        g_pool.nworkers++;
        pthread_mutex_unlock(&g_pool.m);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Runs the whole range on this thread, as a region of its own: calls made from inside run inline. */
static void run_inline(int64_t n, rlx_range_fn fn, void *ctx)
{
    int was = tls_in_region;
    tls_in_region = 1;
    fn(ctx, 0, n);
    tls_in_region = was;
}

void rlx_parallel_for(int64_t n, int64_t grain, rlx_range_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    pool_init();
    int64_t by_grain = n / grain;
    if (tls_in_region || by_grain < 2 || atomic_load(&g_threads) == 1 || pthread_mutex_trylock(&g_pool.region) != 0) {
        run_inline(n, fn, ctx);
        return;
    }
    workers_fit();
    int nchunks = g_pool.nworkers + 1;
    if (by_grain < nchunks) nchunks = (int)by_grain;
    if (nchunks < 2) {
        pthread_mutex_unlock(&g_pool.region);
        run_inline(n, fn, ctx);
        return;
    }
    pthread_mutex_lock(&g_pool.m);
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    g_pool.n = n;
    g_pool.nchunks = nchunks;
    atomic_store(&g_pool.pending, nchunks - 1);
    atomic_fetch_add(&g_pool.gen, 1);
    pthread_cond_broadcast(&g_pool.work);
    pthread_mutex_unlock(&g_pool.m);

    tls_in_region = 1;
    fn(ctx, 0, chunk_begin(n, nchunks, 1));
    tls_in_region = 0;

    spin_pending();
    pthread_mutex_lock(&g_pool.m);
    while (atomic_load(&g_pool.pending) > 0) pthread_cond_wait(&g_pool.done, &g_pool.m);
    pthread_mutex_unlock(&g_pool.m);
    pthread_mutex_unlock(&g_pool.region);
}

struct pieces_ctx {
    struct rlx_pieces pieces; /* a range of pieces per task */
    int64_t n, piece;         /* items, items per piece */
    rlx_range_fn fn;
    void *ctx;
};

static void pieces_task(void *p, int64_t begin, int64_t end)
{
    struct pieces_ctx *c = p;
    for (int64_t t = begin; t < end; t++)
        for (int64_t i; (i = rlx_pieces_take(&c->pieces, (int)t)) >= 0;) {
            const int64_t b = i * c->piece;
            c->fn(c->ctx, b, b + c->piece < c->n ? b + c->piece : c->n);
        }
}

void rlx_parallel_pieces(int64_t n, int64_t piece, rlx_range_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (piece < 1) piece = 1;
    const int64_t npieces = (n + piece - 1) / piece;
    const int64_t threads = rlx_pool_threads() < RLX_PIECES_MAX_PARTS ? rlx_pool_threads() : RLX_PIECES_MAX_PARTS;
    int64_t ntasks = npieces / 2;
    ntasks = ntasks > threads ? threads : ntasks < 1 ? 1 : ntasks;
    struct pieces_ctx c = {.n = n, .piece = piece, .fn = fn, .ctx = ctx};
    rlx_pieces_init(&c.pieces, npieces, (int)ntasks);
    rlx_parallel_for(ntasks, 1, pieces_task, &c);
}

int rlx_pool_threads(void)
{
    pool_init();
    return atomic_load(&g_threads);
}

void rlx_set_num_threads(int n)
{
    pool_init();
    int t = n <= 0 ? default_threads() : clamp_threads(n);
    atomic_store(&g_threads, t);
    openblas_set_num_threads(t);
    /* From inside a task the region lock is held by this region's owner: the new count is
     * applied by the next region instead. */
    if (tls_in_region) return;
    pthread_mutex_lock(&g_pool.region);
    if (g_pool.nworkers > t - 1) workers_join();
    pthread_mutex_unlock(&g_pool.region);
}

int rlx_get_num_threads(void) { return rlx_pool_threads(); }
