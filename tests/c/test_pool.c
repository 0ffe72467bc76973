/*
 * test_pool.c - the thread pool (csrc/backends/cpu/pool.h): rlx_parallel_for runs every index
 * exactly once, in at most one chunk a thread and no chunk under the grain, inline when nested,
 * right under concurrent callers and in a fork() child; rlx_pieces hands each piece out once and a
 * task alone takes its own range first; rlx_parallel_pieces covers [0, n) once. At 1, 2 and 3
 * threads, then at the default count (set_num_threads(0): the online CPUs, at most 256). Ends with
 * rlx_set_num_threads(1), which joins every worker, so valgrind sees no leaked thread.
 */
#include "backends/cpu/pool.h"
#include "check.h"
#include "core/core.h"
#include "rlx/rlx.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * The pool
 * ------------------------------------------------------------------------------------------- */

#define COVER_MAX 1000

struct cover {
    atomic_int hits[COVER_MAX];
    atomic_int chunks;
    atomic_llong min_chunk;
    atomic_int nested_ok;
    int nest;
};

static void cover_fn(void *p, int64_t begin, int64_t end)
{
    struct cover *c = p;
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_add(&c->chunks, 1);
    long long len = end - begin, cur = atomic_load(&c->min_chunk);
    while (len < cur && !atomic_compare_exchange_weak(&c->min_chunk, &cur, len))
        ;
    if (c->nest) {
        struct cover *inner = calloc(1, sizeof *inner);
        inner->min_chunk = 1 << 30;
        rlx_parallel_for(37, 1, cover_fn, inner);
        int ok = atomic_load(&inner->chunks) == 1;
        for (int i = 0; i < 37; i++) ok &= atomic_load(&inner->hits[i]) == 1;
        if (ok) atomic_fetch_add(&c->nested_ok, 1);
        free(inner);
    }
}

static void test_pool_cover(int nest)
{
    const int64_t ns[] = {1, 2, 3, 7, 100, 1000}, grains[] = {0, 1, 3, 50};
    for (int ni = 0; ni < 6; ni++)
        for (int gi = 0; gi < 4; gi++) {
            int64_t n = ns[ni], grain = grains[gi], g = grain < 1 ? 1 : grain;
            struct cover *c = calloc(1, sizeof *c);
            c->min_chunk = 1 << 30;
            c->nest = nest;
            rlx_parallel_for(n, grain, cover_fn, c);
            int once = 1;
            for (int64_t i = 0; i < n; i++) once &= atomic_load(&c->hits[i]) == 1;
            int chunks = atomic_load(&c->chunks);
            long long minc = atomic_load(&c->min_chunk);
            CHECK(once, "pool n=%lld grain=%lld nest=%d: an index not run exactly once", (long long)n, (long long)grain,
                  nest);
            CHECK(chunks >= 1 && chunks <= rlx_pool_threads(), "pool n=%lld grain=%lld: %d chunks for %d threads",
                  (long long)n, (long long)grain, chunks, rlx_pool_threads());
            CHECK(minc >= (g < n ? g : n), "pool n=%lld grain=%lld: a chunk of %lld items", (long long)n,
                  (long long)grain, minc);
            CHECK(!nest || atomic_load(&c->nested_ok) == chunks,
                  "pool n=%lld grain=%lld: nested region did not run inline", (long long)n, (long long)grain);
            free(c);
        }
}

struct sum_ctx {
    const int32_t *x;
    atomic_llong total;
};

static void sum_fn(void *p, int64_t begin, int64_t end)
{
    struct sum_ctx *c = p;
    long long s = 0;
    for (int64_t i = begin; i < end; i++) s += c->x[i];
    atomic_fetch_add(&c->total, s);
}

#define SUM_N 5000

static int32_t sum_data[SUM_N];

static void *concurrent_main(void *arg)
{
    int *ok = arg;
    *ok = 1;
    for (int r = 0; r < 300; r++) {
        struct sum_ctx c = {.x = sum_data};
        rlx_parallel_for(SUM_N, 16, sum_fn, &c);
        *ok &= atomic_load(&c.total) == (long long)SUM_N * (SUM_N - 1) / 2;
    }
    return NULL;
}

static void test_pool_concurrent(void)
{
    for (int i = 0; i < SUM_N; i++) sum_data[i] = i;
    pthread_t th[3];
    int ok[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, concurrent_main, &ok[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK(ok[0] && ok[1] && ok[2], "pool: concurrent callers got a wrong sum");
}

/* A fork() child of a process whose pool has workers gets a working pool of its own. */
static __attribute__((unused)) void test_pool_fork(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        int ok = 1;
        for (int r = 0; r < 20; r++) {
            struct sum_ctx c = {.x = sum_data};
            rlx_parallel_for(SUM_N, 16, sum_fn, &c);
            ok &= atomic_load(&c.total) == (long long)SUM_N * (SUM_N - 1) / 2;
        }
        rlx_set_num_threads(1);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    int waited = pid > 0 && waitpid(pid, &st, 0) == pid;
    CHECK(waited && WIFEXITED(st) && WEXITSTATUS(st) == 0, "pool: region in a fork() child failed (status %d)", st);
}

/* rlx_pieces: each piece taken exactly once, whether every task takes part or one task alone takes
 * all (the others descheduled); a task alone takes its own range front to back, then the others'
 * in turn (task t + 1, t + 2, ...), each front to back. */
struct pieces_ctx {
    struct rlx_pieces p;
    atomic_int hits[COVER_MAX];
    int64_t order[COVER_MAX]; /* alone: the pieces in the order taken */
    int64_t taken;
};

static void piece_hit(void *p, int64_t begin, int64_t end)
{
    struct pieces_ctx *c = p;
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_add(&c->hits[COVER_MAX - 1], end - begin > 3); /* a piece longer than asked */
}

static void pieces_fn(void *p, int64_t begin, int64_t end)
{
    struct pieces_ctx *c = p;
    for (int64_t t = begin; t < end; t++)
        for (int64_t i; (i = rlx_pieces_take(&c->p, (int)t)) >= 0;) atomic_fetch_add(&c->hits[i], 1);
}

static void test_pieces(void)
{
    const int64_t ns[] = {1, 2, 5, 64, 1000};
    const int parts[] = {1, 2, 3, 7};
    for (int ni = 0; ni < 5; ni++)
        for (int pi = 0; pi < 4; pi++)
            for (int alone = 0; alone < 2; alone++) {
                const int64_t n = ns[ni];
                const int np = parts[pi];
                struct pieces_ctx *c = calloc(1, sizeof *c);
                rlx_pieces_init(&c->p, n, np);
                int in_order = 1;
                if (alone) { /* the last task alone: its range, then task 0's, 1's, ... */
                    for (int64_t i; (i = rlx_pieces_take(&c->p, np - 1)) >= 0;) {
                        atomic_fetch_add(&c->hits[i], 1);
                        c->order[c->taken++] = i;
                    }
                    int64_t k = 0;
                    for (int r = 0; r < np; r++) {
                        const int t = (np - 1 + r) % np;
                        for (int64_t i = t * n / np; i < (t + 1) * n / np; i++) in_order &= c->order[k++] == i;
                    }
                } else {
                    rlx_parallel_for(np, 1, pieces_fn, c);
                }
                int once = 1;
                for (int64_t i = 0; i < n; i++) once &= atomic_load(&c->hits[i]) == 1;
                CHECK(once, "pieces n=%lld parts=%d alone=%d: a piece not taken exactly once", (long long)n, np, alone);
                CHECK(rlx_pieces_take(&c->p, 0) == -1, "pieces n=%lld parts=%d: a piece left after the region",
                      (long long)n, np);
                CHECK(in_order, "pieces n=%lld parts=%d: a task alone did not take its range first, then the others'",
                      (long long)n, np);
                free(c);
            }
    /* rlx_parallel_pieces: every item of [0, n) once, in pieces of at most 3 (1 and 3 items a
     * piece), at the pool's thread count */
    for (int ni = 0; ni < 5; ni++)
        for (int64_t piece = 1; piece <= 3; piece += 2) {
            const int64_t n = ns[ni] < COVER_MAX - 1 ? ns[ni] : COVER_MAX - 1;
            struct pieces_ctx *c = calloc(1, sizeof *c);
            rlx_parallel_pieces(n, piece, piece_hit, c);
            int once = atomic_load(&c->hits[COVER_MAX - 1]) == 0;
            for (int64_t i = 0; i < n; i++) once &= atomic_load(&c->hits[i]) == 1;
            CHECK(once, "parallel_pieces n=%lld piece=%lld [threads=%d]: an item not run once", (long long)n,
                  (long long)piece, rlx_pool_threads());
            free(c);
        }
    rlx_parallel_pieces(0, 3, piece_hit, NULL); /* nothing to run: fn never called */
}

static void test_pool(void)
{
    test_pieces();
    test_pool_cover(0);
    test_pool_cover(1);
    test_pool_concurrent();
#ifndef __SANITIZE_THREAD__ /* TSan cannot start threads in the child of a multi-threaded fork */
    test_pool_fork();
#endif
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

int main(void)
{
    const int counts[] = {1, 2, 3};
    for (int ti = 0; ti < 3; ti++) {
        rlx_set_num_threads(counts[ti]);
        CHECK(rlx_get_num_threads() == counts[ti] && rlx_pool_threads() == counts[ti],
              "set_num_threads(%d) then get = %d", counts[ti], rlx_get_num_threads());
        test_pool();
    }
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    rlx_set_num_threads(0);
    CHECK(rlx_get_num_threads() == (online < 1 ? 1 : online) || (online > 256 && rlx_get_num_threads() == 256),
          "set_num_threads(0) gives %d, online CPUs %ld", rlx_get_num_threads(), online);
    test_pool();
    rlx_set_num_threads(1);
    return check_summary();
}
