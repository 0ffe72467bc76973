/*
 * plan.h - the compiled plan: a private copy of the graph after the passes, its backend and the
 * backend's state, the liveness that memory plans are made from, and the per-run binding of
 * inputs, params, symbols and arena. Internal to runtime/.
 */
#ifndef RLX_RUNTIME_PLAN_H
#define RLX_RUNTIME_PLAN_H

#include "backends/backend.h"
#include "passes/passes.h"

struct rlx_plan {
    struct rlx_graph *g;               /* compiled graph, owned */
    const struct rlx_backend *be;
    void *be_state;
    struct rlx_compile_opts opts;      /* opts.budget_hint points at budget_hint below */
    char budget_hint[256];
    struct rlx_liveness lv;

    int n_inputs, n_params;
    int *inputs, *params;              /* (n_inputs), (n_params) node ids */
    struct rlx_host_tensor *in_host;   /* (n_inputs) bound for the next run */
    bool *in_set;                      /* (n_inputs) */
    struct rlx_buffer **in_buf;        /* (n_inputs) wrapper or uploaded copy */
    size_t *in_buf_cap;                /* (n_inputs) bytes of an owned in_buf */
    struct rlx_buffer **param_buf;     /* (n_params) */
    bool *param_set;                   /* (n_params) */
    bool *used;                        /* (n_nodes) read by a live node or an output: unused inputs
                                          and params need not be bound */
    void **out_dst;                    /* (n_outputs) host memory bound for the next run, or NULL */
    size_t *out_dst_bytes;             /* (n_outputs) */
    struct rlx_buffer **out_buf;       /* (n_outputs) wrapper of out_dst (backends that wrap) */
    bool *external;                    /* (n_nodes) roots written straight into a bound output this
                                          run: no arena space */
    bool *planned_external;            /* (n_nodes) `external` of the current memory plan */

    int64_t sym[RLX_MAX_SYMS];         /* values of the current / last run */
    bool sym_bound[RLX_MAX_SYMS];
    bool sym_explicit[RLX_MAX_SYMS];   /* bound by rlx_plan_bind_symbol for the next run */

    bool planned;                      /* offsets valid for every binding <= planned_sym */
    int64_t planned_sym[RLX_MAX_SYMS];
    size_t *sizes, *offsets;           /* (n_nodes) bytes / arena offset of each root */
    int *scratch;                      /* (2 * n_nodes) for rlx_memory_plan */
    struct rlx_buffer *arena;
    size_t arena_cap, planned_bytes, unshared_bytes;

    struct rlx_tensor *values;         /* (n_nodes) placed values of the last run */
    bool ran;                          /* values hold a successful run's results */
    double *node_seconds;              /* (n_nodes) wall time of each node in the last run, or NULL when
                                          profiling is off */
};

/* Concrete shape of node id under symbol values vals (all its symbols bound). */
void rlx_plan_eval_shape(const struct rlx_plan *p, int id, const int64_t *vals, int64_t *shape);

#endif
