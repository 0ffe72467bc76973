/*
 * record.h - recording a plan run into one command buffer (record.c), and the recorders of each
 * op family (ops_linear.c, ops_pointwise.c, ops_attention.c, ops_copy.c, ops_moe.c), with the push-constant
 * blocks of the shaders they dispatch mirrored as C structs (the shader file is named beside
 * each; the two must agree field for field).
 *
 * Every dispatch binds byte ranges of buffers. A range is bound from its start rounded down to
 * the device's storage-offset alignment, and the rest of the start (in elements of the view the
 * shader reads) is added to the push constant that the binding names, so a tensor may start at
 * any offset. A range longer than one binding may span (maxStorageBufferRange, or less with the
 * device option ":range=N") is refused naming the node, unless the op splits its work (matmul
 * and embedding split their weights, their rows, or both). A barrier is recorded only before a
 * dispatch that reads what an earlier one wrote since the last barrier, or writes what an
 * earlier one read or wrote: independent nodes (q, k, v projections) are left to overlap.
 */
#ifndef RLX_BACKENDS_VULKAN_RECORD_H
#define RLX_BACKENDS_VULKAN_RECORD_H

#include <assert.h>

#include "backends/vulkan/vk.h"

struct rlx_vk_span { /* bytes [lo, hi) of a buffer, read or written since the last barrier */
    VkBuffer buf;
    uint64_t lo, hi;
    bool write;
};

struct rlx_vk_rec {
    struct rlx_vk_dev *dev;
    struct rlx_vk_context *vk;
    VkCommandBuffer cmd;
    const struct rlx_vk_buf *status;  /* the plan's status words (uint[4]: flag, node, index, value) */
    const struct rlx_vk_buf *scratch; /* the plan's scratch (rlx_vk_scratch_bytes of every node), or NULL */
    struct rlx_vk_span *seen;         /* (n_seen) */
    int n_seen, cap_seen;
    VkBufferCopy *regions; /* (cap_regions) scratch of the copy recorders */
    size_t cap_regions;
    VkPipeline bound;
    bool batch_invariant; /* the plan's rlx_compile_opts.batch_invariant */
    int node;             /* the node being recorded and its op's name (for messages) */
    const char *op;
};

/* One binding of a dispatch: bytes [offset, offset + bytes) of buf. */
struct rlx_vk_bind {
    const struct rlx_vk_buf *buf;
    uint64_t offset, bytes;
    bool write;
    uint32_t *off;  /* push constant that receives the range's start past the bound
                                          base, in units of `unit` bytes; NULL for ranges at offset 0 */
    uint32_t unit;  /* bytes of one element of the shader's view (1, 2 or 4) */
    bool untracked; /* the status words: claimed with an atomic, written by one
                                          invocation of the whole run; never a hazard */
};

/* Binds b[0..n) to bindings 0..n-1 (setting their offsets in push), pushes `push`, and records
 * `groups` workgroups of shader sh (after a barrier when a hazard needs one). */
rlx_status rlx_vk_dispatch(struct rlx_vk_rec *r, enum rlx_vk_shader sh, struct rlx_vk_bind *b, int n, void *push,
                           uint32_t push_bytes, uint64_t groups);
/* Records a copy of regions (counted in the hazards like a dispatch). */
rlx_status rlx_vk_record_copy(struct rlx_vk_rec *r, const struct rlx_vk_buf *dst, const struct rlx_vk_buf *src,
                              const VkBufferCopy *regions, uint32_t n);
/* Records a fill of bytes [offset, offset + bytes) of buf with zeros (offset and bytes multiples of 4). */
rlx_status rlx_vk_record_zero(struct rlx_vk_rec *r, const struct rlx_vk_buf *buf, uint64_t offset, uint64_t bytes);
/* A barrier now, whatever the hazards (profiling separates nodes with one). */
void rlx_vk_record_barrier(struct rlx_vk_rec *r);
/* Room for n copy regions in r->regions. */
rlx_status rlx_vk_need_regions(struct rlx_vk_rec *r, size_t n);

/* ---- tensors ----------------------------------------------------------------------------- */

static inline const struct rlx_vk_buf *rlx_vk_tbuf(const struct rlx_tensor *t) { return t->buf->impl; }
/* Bytes of a placed value (its shape was checked when memory was planned). */
uint64_t rlx_vk_tbytes(const struct rlx_tensor *t);
/* The whole of t as a binding (unit: its element size; 1 for block types). */
struct rlx_vk_bind rlx_vk_tensor(const struct rlx_tensor *t, bool write, uint32_t *off);
/* The status words as a binding. */
struct rlx_vk_bind rlx_vk_status(const struct rlx_vk_rec *r);
/* Workgroups of shader sh's size that cover `items` invocations. */
uint64_t rlx_vk_groups(const struct rlx_vk_rec *r, enum rlx_vk_shader sh, uint64_t items);
/* Bytes one binding may span on this device, less the alignment a start may need. */
uint64_t rlx_vk_span_limit(const struct rlx_vk_rec *r);
int64_t rlx_vk_rows(const struct rlx_tensor *t); /* the product of all dims but the last */
/* A count the shaders hold in 32 bits (checked by the caller's range limits). */
static inline uint32_t rlx_vk_u32(int64_t v)
{
    assert(v >= 0 && v <= (int64_t)UINT32_MAX);
    return (uint32_t)v;
}

/* ---- plans (plan.c) ---------------------------------------------------------------------- */

bool rlx_vk_supports_op(void *ctx, const struct rlx_graph *g, int id);
rlx_status rlx_vk_plan_compile(void *ctx, const struct rlx_graph *g, const struct rlx_compile_opts *opts, void **state);
void rlx_vk_plan_free(void *ctx, void *state);
rlx_status rlx_vk_plan_run(void *ctx, void *state, const struct rlx_graph *g, const struct rlx_tensor *values,
                           double *node_seconds);

/* ---- op recorders ------------------------------------------------------------------------ */

/* One live node into r (the values are placed for this run). */
typedef rlx_status (*rlx_vk_op_fn)(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_matmul(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_embedding(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_rmsnorm(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_rope(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_softmax(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_eltwise(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_convert(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_cache_write(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_attention(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_gather_last(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_concat(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_slice(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_topk(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_matmul_id(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
rlx_status rlx_vk_op_moe_combine(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v);
/* Bytes of the plan's scratch buffer node id needs in this run (0: none; topk's pairs). Every node
 * records into the same scratch: the hazard tracking orders them. */
uint64_t rlx_vk_scratch_bytes(const struct rlx_vk_rec *r, const struct rlx_graph *g, int id,
                              const struct rlx_tensor *v);

/* The variant of shader `first` (matvec_f32, matmul_f32, embedding_f32) for weights of dtype dt. */
enum rlx_vk_shader rlx_vk_weight_shader(enum rlx_vk_shader first, enum rlx_dtype dt);
/* The attention shader for K / V of dtype kv. */
enum rlx_vk_shader rlx_vk_attention_shader(enum rlx_dtype kv);
/* Head dims the attention shader holds (attention.comp MAX_D). */
#define RLX_VK_ATTN_MAX_D 512

#endif
