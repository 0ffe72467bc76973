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

#include <stdint.h>

/* fn processes [begin, end). */
typedef void (*rlx_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n) split into contiguous chunks, at most one chunk per thread; chunks are at
 * least `grain` items (grain <= 0 means 1). Returns when all chunks are done. */
void rlx_parallel_for(int64_t n, int64_t grain, rlx_range_fn fn, void *ctx);

/* Threads rlx_parallel_for will use (>= 1). */
int rlx_pool_threads(void);

#endif
