/*
 * host.h - what the two host-memory backends (cpu, ref) share: buffers that are plain host memory
 * (owned, or wrapping the caller's memory) and the dispatcher that turns each plan step into one
 * call of a kernel table. The backends differ only in their kernel table and in whether they let
 * callers' memory in without a copy.
 */
#ifndef RLX_BACKENDS_HOST_H
#define RLX_BACKENDS_HOST_H

#include "backends/backend.h"
#include "backends/kernels.h"

rlx_status rlx_host_open(const char *arg, void **ctx); /* no instance state: *ctx = NULL */
void rlx_host_close(void *ctx);
rlx_status rlx_host_buffer_alloc(void *ctx, struct rlx_buffer *b);
rlx_status rlx_host_buffer_wrap(void *ctx, struct rlx_buffer *b, const void *host);
void rlx_host_buffer_release(void *ctx, struct rlx_buffer *b);
bool rlx_host_buffer_settle(void *ctx, struct rlx_buffer *b, size_t bytes, bool move);
void rlx_host_buffer_discard(void *ctx, struct rlx_buffer *b, size_t offset, size_t bytes);
rlx_status rlx_host_upload(void *ctx, struct rlx_buffer *b, size_t offset, const void *src, size_t bytes);
rlx_status rlx_host_download(void *ctx, const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes);
rlx_status rlx_host_copy(void *ctx, struct rlx_buffer *dst, size_t dst_offset, const struct rlx_buffer *src,
                         size_t src_offset, size_t bytes);

/* Every op of the IR, on f32 and the dtypes its shape rule admits (weights of every real-valued
 * dtype, the block types included). */
bool rlx_host_supports_op(void *ctx, const struct rlx_graph *g, int id);

/* Plan state: the kernel table and a scratch area grown on demand (only when a bigger binding
 * needs more; never per step). */
struct rlx_host_state {
    const struct rlx_kernels *k;
    struct rlx_workspace own;
    struct rlx_workspace *ws; /* the kernels' scratch: &own, or one shared with other plans */
    const void **experts;     /* (expert_cap) MATMUL_ID's pointer per expert, grown on demand */
    size_t expert_cap;
    bool batch_invariant; /* products run in groups of at most k->matmul_rows_alone rows */
};
rlx_status rlx_host_state_create(const struct rlx_kernels *k, bool batch_invariant, void **state);
void rlx_host_state_free(void *ctx, void *state);
void rlx_host_share_workspace(void *ctx, void *state, struct rlx_workspace *ws);
rlx_status rlx_host_run(void *ctx, void *state, const struct rlx_graph *g, const struct rlx_tensor *values,
                        double *node_seconds);

#endif
