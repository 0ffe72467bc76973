/*
 * host.h - what the two host-memory backends (cpu, ref) share: a buffer that is plain host memory
 * (owned, or wrapping the caller's memory) and the dispatcher that turns each plan step into one
 * call of a kernel table. The backends differ only in their kernel table and in whether they let
 * callers' memory in without a copy.
 */
#ifndef RLX_BACKENDS_HOST_H
#define RLX_BACKENDS_HOST_H

#include "backends/backend.h"
#include "backends/kernels.h"

struct rlx_buffer {
    void *data;
    size_t size;
    bool owned;
};

rlx_status rlx_host_buffer_alloc(size_t bytes, struct rlx_buffer **out);
rlx_status rlx_host_buffer_wrap(const void *host, size_t bytes, struct rlx_buffer **inout);
void rlx_host_buffer_free(struct rlx_buffer *b);
rlx_status rlx_host_upload(struct rlx_buffer *b, size_t offset, const void *src, size_t bytes);
rlx_status rlx_host_download(const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes);

/* Every op of the IR, on f32 (and the dtype-generic copies). */
bool rlx_host_supports_op(const struct rlx_graph *g, int id);

/* Plan state: the kernel table and a scratch area grown on demand (only when a bigger binding
 * needs more; never per step). */
struct rlx_host_state {
    const struct rlx_kernels *k;
    float *scratch;
    size_t scratch_floats;
};
rlx_status rlx_host_state_create(const struct rlx_kernels *k, void **state);
void rlx_host_state_free(void *state);
rlx_status rlx_host_run(void *state, const struct rlx_graph *g, const struct rlx_tensor *values, double *node_seconds);

#endif
