/*
 * plan.h - the compiled plan: a private copy of the graph after the passes, the device it runs on
 * and the backend's state, the liveness that memory plans are made from, and the per-run binding
 * of inputs, params, states, symbols and arena. Internal to the core: runtime/ implements it;
 * gen/ binds the states (KV caches) through the functions at the end.
 */
#ifndef RLX_RUNTIME_PLAN_H
#define RLX_RUNTIME_PLAN_H

#include "backends/backend.h"
#include "passes/passes.h"

/* An arena that plans which never run at the same time share: a model's plans, which run one at a
 * time under its lock (gen/model.c). Each run places its intermediates at the start of buf, grown
 * to the largest need a run has had, so N cached plans hold the largest one's bytes instead of
 * all of theirs; their kernels' scratch likewise (ws, on backends with plan_share_workspace). A
 * plan's results there can be read until another plan sharing the arena runs
 * (rlx_plan_read_output refuses after that). Its owner frees it (rlx_shared_arena_release) when no
 * plan is between a run and the reading of its outputs; the next run allocates it again. */
struct rlx_shared_arena {
    struct rlx_buffer *buf;        /* NULL until a run needs it */
    size_t cap;                    /* bytes of buf */
    const struct rlx_plan *holder; /* the plan whose last run's values buf holds, or NULL */
    struct rlx_workspace ws;       /* the kernels' scratch, empty until a run needs it */
};

/* Where a param or a state lives: a region of a device buffer. */
struct rlx_binding {
    struct rlx_buffer *buf;
    size_t offset;
    bool owned; /* params: the plan allocated / wrapped buf (set_param) */
};

struct rlx_plan {
    struct rlx_graph *g;    /* compiled graph, owned */
    struct rlx_device *dev; /* borrowed: outlives the plan */
    void *be_state;
    struct rlx_compile_opts opts; /* opts.budget_hint points at budget_hint below */
    char budget_hint[256];
    struct rlx_liveness lv;

    int n_inputs, n_params, n_states;
    int *inputs, *params, *states;   /* (n_inputs), (n_params), (n_states) node ids, in id order */
    struct rlx_host_tensor *in_host; /* (n_inputs) bound for the next run */
    bool *in_set;                    /* (n_inputs) */
    struct rlx_buffer **in_buf;      /* (n_inputs) wrapper or uploaded copy */
    size_t *in_buf_cap;              /* (n_inputs) bytes of an owned in_buf */
    struct rlx_binding *param;       /* (n_params); buf NULL when not bound */
    struct rlx_binding *state;       /* (n_states) bound for the next run; buf NULL when not */
    bool *used;                      /* (n_nodes) read by a live node or an output: unused inputs,
                                          params and states need not be bound */
    void **out_dst;                  /* (n_outputs) host memory bound for the next run, or NULL */
    size_t *out_dst_bytes;           /* (n_outputs) */
    struct rlx_buffer **out_buf;     /* (n_outputs) wrapper of out_dst (devices that wrap) */
    bool *external;                  /* (n_nodes) roots written straight into a bound output this
                                          run: no arena space */
    bool *planned_external;          /* (n_nodes) `external` of the current memory plan */

    int64_t sym[RLX_MAX_SYMS]; /* values of the current / last run */
    bool sym_bound[RLX_MAX_SYMS];
    bool sym_explicit[RLX_MAX_SYMS]; /* bound by rlx_plan_bind_symbol for the next run */
    bool sym_used[RLX_MAX_SYMS];     /* in a live node's shape: a run must bind it */

    bool planned; /* offsets valid for every binding <= planned_sym */
    int64_t planned_sym[RLX_MAX_SYMS];
    size_t *sizes, *offsets;         /* (n_nodes) bytes / arena offset of each root */
    int *scratch;                    /* (2 * n_nodes) for rlx_memory_plan */
    struct rlx_buffer *arena;        /* the plan's own, or NULL when it uses `shared` */
    struct rlx_shared_arena *shared; /* borrowed (rlx_plan_share_arena), or NULL */
    size_t arena_cap, planned_bytes, unshared_bytes;

    struct rlx_tensor *values; /* (n_nodes) placed values of the last run */
    bool ran;                  /* values hold a successful run's results */
    double *node_seconds;      /* (n_nodes) wall time of each node in the last run, or NULL when
                                          profiling is off */
};

/* Concrete shape of node id under symbol values vals (all its symbols bound). */
void rlx_plan_eval_shape(const struct rlx_plan *p, int id, const int64_t *vals, int64_t *shape);

/* Binds param i to a buffer the plan does not own (a weight store's), after checking the
 * dtype and shape it holds against the param. */
rlx_status rlx_plan_bind_param_buffer(struct rlx_plan *p, int index, enum rlx_dtype dt, int ndim, const int64_t *shape,
                                      struct rlx_buffer *buf);

/* When every symbol the plan uses has a compile cap: fails (RLX_ERR_RANGE naming the node) if the
 * plan's sizes at the caps overflow. Compile calls it, so such a plan is never made. */
rlx_status rlx_plan_check_caps(const struct rlx_plan *p);

/* The plan's index of the input / state that is node `id` of the built graph (compiling keeps node
 * ids), or RLX_ERR_INVALID. */
rlx_status rlx_plan_input_of_node(const struct rlx_plan *p, int id, int *index);
rlx_status rlx_plan_state_of_node(const struct rlx_plan *p, int id, int *index);
/* Binds state i to device memory for the next run (cleared by run): the state's bytes for that
 * run's symbols must fit in buf from offset on (checked at run). buf must belong to the plan's
 * device and outlive the run. */
rlx_status rlx_plan_bind_state(struct rlx_plan *p, int index, struct rlx_buffer *buf, size_t offset);

/* From the next run on, p places its intermediates in `a` (outliving p) instead of an arena of its
 * own, which is freed. The plans sharing `a` must be on one device and never run concurrently. */
void rlx_plan_share_arena(struct rlx_plan *p, struct rlx_shared_arena *a);
void rlx_shared_arena_release(struct rlx_device *dev, struct rlx_shared_arena *a);

#endif
