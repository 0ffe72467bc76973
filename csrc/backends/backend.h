/*
 * backend.h - the backend vtable. A backend owns its memory (buffers reached only through
 * alloc / wrap / upload / download), decides which ops it runs (supports_op, the one capability
 * gate), and compiles and runs a plan over a graph whose values have been given buffers, offsets
 * and concrete shapes by the runtime. The IR and the passes know nothing else about a backend.
 */
#ifndef RLX_BACKENDS_BACKEND_H
#define RLX_BACKENDS_BACKEND_H

#include "ir/graph.h"

struct rlx_buffer; /* backend-defined */

/* A value placed in memory for one run: contiguous row-major. */
struct rlx_tensor {
    struct rlx_buffer *buf;
    size_t offset;                 /* bytes from the start of buf */
    enum rlx_dtype dtype;
    int ndim;
    int64_t shape[RLX_MAX_DIMS];
};

struct rlx_backend {
    const char *name;
    bool (*supports_op)(const struct rlx_graph *g, int id);
    rlx_status (*buffer_alloc)(size_t bytes, struct rlx_buffer **out);
    /* Zero-copy view of host memory the caller keeps alive (read-only: kernels never write to
     * wrapped buffers). If *inout is a wrapper already it is re-pointed without allocating.
     * NULL for backends with separate memory. */
    rlx_status (*buffer_wrap)(const void *host, size_t bytes, struct rlx_buffer **inout);
    void (*buffer_free)(struct rlx_buffer *b);
    rlx_status (*upload)(struct rlx_buffer *b, size_t offset, const void *src, size_t bytes);
    rlx_status (*download)(const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes);
    rlx_status (*plan_compile)(const struct rlx_graph *g, void **state);
    void (*plan_free)(void *state);
    /* Executes every live node in id order; values: (g->n_nodes) placed values. node_seconds, when
     * not NULL, receives each node's wall time (g->n_nodes entries; nodes not run get 0). */
    rlx_status (*plan_run)(void *state, const struct rlx_graph *g, const struct rlx_tensor *values,
                           double *node_seconds);
};

extern const struct rlx_backend rlx_cpu_backend;
extern const struct rlx_backend rlx_ref_backend;

/* The backend with this name, or RLX_ERR_INVALID listing the ones compiled in. */
rlx_status rlx_backend_find(const char *name, const struct rlx_backend **out);

int64_t rlx_tensor_numel(const struct rlx_tensor *t);

#endif
