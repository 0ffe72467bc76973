/*
 * pool.h - the one thread pool of the cpu backend. Kernels split work with rlx_parallel_for; the caller's
 * thread takes part. After a region, workers spin for at most ~50 us (so back-to-back regions, as
 * in a decode step, skip futex wake-ups) and then block on a condition variable: OpenBLAS calls
 * made after that never compete with them.
 *
 * If two threads call rlx_parallel_for at once (two plans run from two Python threads), the second
 * one runs its range inline on its own thread: never a deadlock, never oversubscription.
 * Must never be called from inside a task (nested parallel regions run inline as well).
 */
#ifndef RLX_BACKENDS_CPU_POOL_H
#define RLX_BACKENDS_CPU_POOL_H

#include <stdatomic.h>
#include <stdint.h>

/* fn processes [begin, end). */
typedef void (*rlx_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n) split into contiguous chunks, at most one chunk per thread; chunks are at
 * least `grain` items (grain <= 0 means 1). Returns when all chunks are done. */
void rlx_parallel_for(int64_t n, int64_t grain, rlx_range_fn fn, void *ctx);

/* Threads rlx_parallel_for will use (>= 1). */
int rlx_pool_threads(void);

/* Pieces [0, n) dealt to `parts` tasks of one region (the memory-bound matrix-vector products):
 * task t first walks its own contiguous range of the pieces front to back, so each thread reads one
 * sequential stream, as the read probe does; when its range is done it takes the next untaken
 * pieces of the other ranges, so a thread that was descheduled (the machine is shared) leaves the
 * rest of its share to the others instead of stalling the region. Dealing the pieces in turn from
 * one counter instead (thread 0 piece 0, thread 1 piece 1, thread 0 piece 2, ...) streamed 0.77x
 * the read probe on an Intel Xeon with 2 threads (Q8_0 / Q4_K / Q4_0 weights of 512 MiB from DRAM),
 * contiguous ranges 0.89-1.1x over two runs; one thread 0.98-1.0x either way. */
#define RLX_PIECES_MAX_PARTS 256
struct rlx_pieces {
    int parts;
    struct {
        _Alignas(64) atomic_llong next; /* the range's next piece not yet taken */
        int64_t end;                    /* one past the range's last piece */
    } range[RLX_PIECES_MAX_PARTS];
};

/* parts in [1, RLX_PIECES_MAX_PARTS]: range t is [t * n / parts, (t + 1) * n / parts) */
static inline void rlx_pieces_init(struct rlx_pieces *p, int64_t n, int parts)
{
    p->parts = parts;
    for (int t = 0; t < parts; t++) {
        atomic_init(&p->range[t].next, t * n / parts);
        p->range[t].end = (t + 1) * n / parts;
    }
}

/* The next piece for task t (its own range first, then the others' in turn), or -1 when none is left */
static inline int64_t rlx_pieces_take(struct rlx_pieces *p, int t)
{
    for (int k = 0; k < p->parts; k++) {
        const int r = (t + k) % p->parts;
        if (atomic_load_explicit(&p->range[r].next, memory_order_relaxed) >= p->range[r].end) continue;
        const int64_t i = atomic_fetch_add_explicit(&p->range[r].next, 1, memory_order_relaxed);
        if (i < p->range[r].end) return i;
    }
    return -1;
}

/* Runs fn over [0, n) in pieces of `piece` items (the last may be shorter; the matrix-vector
 * products' weight rows), fn(ctx, begin, end) once per piece: one task per pool thread (at most
 * RLX_PIECES_MAX_PARTS) while there are at least two pieces a task, each task its own contiguous
 * range of the pieces first, then what is left of the others' (rlx_pieces). Returns when all are
 * done. */
void rlx_parallel_pieces(int64_t n, int64_t piece, rlx_range_fn fn, void *ctx);

#endif
