/*
 * passes.h - the compile passes. Each rewrites or analyses a graph (a private copy owned by the
 * plan being built); none allocates memory for tensors. The order is fixed by runtime/compile.c:
 * dead nodes -> fusion -> dead nodes -> shape inference -> backend assignment -> liveness; the
 * memory plan (offsets) is made per symbol binding at run time from the liveness.
 */
#ifndef RLX_PASSES_PASSES_H
#define RLX_PASSES_PASSES_H

#include "backends/backend.h"
#include "ir/graph.h"

/* Marks dead every node that no output depends on (a live ADD_RMSNORM keeps its companion). */
rlx_status rlx_pass_dead_nodes(struct rlx_graph *g);

/* Rewrites mul(silu(a), b) -> silu_mul(a, b) and rmsnorm(add(a, b), w) -> add_rmsnorm + fused_out
 * where it is exact and pays; run rlx_pass_dead_nodes afterwards. */
rlx_status rlx_pass_fuse(struct rlx_graph *g);

/* Re-runs every live node's shape rule (validates the rewritten graph). */
rlx_status rlx_pass_shape_infer(struct rlx_graph *g);

/* Fails with RLX_ERR_UNSUPPORTED naming the first live node the device's backend cannot run. */
rlx_status rlx_pass_assign(const struct rlx_graph *g, const struct rlx_device *dev);

/* Liveness of every value, in steps of the execution order (the live nodes in id order).
 * Storage: RESHAPE and CACHE_WRITE alias their (first) input, and a pointwise op (SILU, SILU_MUL,
 * ADD, MUL) the input of its dtype and shape it is the last reader of (in place: memory_plan.c), so
 * values share a storage root; only roots that are intermediates (not INPUT / PARAM / STATE) get
 * arena space. */
struct rlx_liveness {
    int n_nodes;
    int *root;      /* (n_nodes) storage root of each node (itself unless it aliases) */
    int *first;     /* (n_nodes) step writing the root (valid for roots) */
    int *last;      /* (n_nodes) last step reading any alias of the root; INT_MAX for outputs */
    bool *in_arena; /* (n_nodes) root that needs arena space */
};
rlx_status rlx_liveness_compute(const struct rlx_graph *g, struct rlx_liveness *lv);
void rlx_liveness_free(struct rlx_liveness *lv);

/* Assigns arena offsets (offsets[root], 64-byte aligned) to every arena root given the byte size
 * of each (sizes[root]), reusing space between values whose lifetimes do not overlap. Returns the
 * arena size in *arena_bytes and the no-reuse total in *unshared_bytes. scratch: 2 * n_nodes ints. */
rlx_status rlx_memory_plan(const struct rlx_liveness *lv, const size_t *sizes, size_t *offsets, int *scratch,
                           size_t *arena_bytes, size_t *unshared_bytes);

#endif
