/*
 * plan.c - plans on a Vulkan device. Compile makes the pipelines of every live node (so shader
 * compilation happens there, not in the first step) and the plan's command buffer, fence and
 * status words; its scratch buffer (topk's pairs) is made, or grown, by the first run that needs
 * it. Run records every live node, in id order, into that one command buffer, checks for an
 * interrupt, submits it once and waits: inputs were uploaded and the states (KV caches) are
 * bound in place, so nothing else crosses. The status words report what only the kernels can
 * see (a token id, an expert id or a cache position out of range), read after the wait and
 * turned into the same errors the host backends give. Never prints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/record.h"
#include "core/core.h"

struct vk_plan {
    VkCommandPool pool;
    VkCommandBuffer cmd;
    VkFence fence;
    struct rlx_vk_buf *status;  /* host-visible uint[4]: flag, node, index, value */
    struct rlx_vk_buf *scratch; /* device memory the kernels of a run share (topk's pairs), grown on demand */
    VkQueryPool queries;        /* timestamps when profiling: one per live node, plus one */
    uint32_t n_queries;
    int *query_node;       /* (n_queries) the node that ends at each timestamp */
    uint64_t *ticks;       /* (n_queries) the timestamps read back */
    struct rlx_vk_rec rec; /* scratch kept between runs */
};

/* The recorder of each op; NULL: nothing to record (leaves, aliases, a second output). Locked to
 * the op enum so a new op fails to compile until it is listed here. */
static const rlx_vk_op_fn recorders[] = {
    [RLX_OP_INPUT] = NULL,
    [RLX_OP_PARAM] = NULL,
    [RLX_OP_MATMUL] = rlx_vk_op_matmul,
    [RLX_OP_EMBEDDING] = rlx_vk_op_embedding,
    [RLX_OP_RMSNORM] = rlx_vk_op_rmsnorm,
    [RLX_OP_ROPE] = rlx_vk_op_rope,
    [RLX_OP_SOFTMAX] = rlx_vk_op_softmax,
    [RLX_OP_SILU] = rlx_vk_op_eltwise,
    [RLX_OP_ADD] = rlx_vk_op_eltwise,
    [RLX_OP_MUL] = rlx_vk_op_eltwise,
    [RLX_OP_ATTENTION] = rlx_vk_op_attention,
    [RLX_OP_GATHER_LAST] = rlx_vk_op_gather_last,
    [RLX_OP_CONCAT] = rlx_vk_op_concat,
    [RLX_OP_SLICE] = rlx_vk_op_slice,
    [RLX_OP_RESHAPE] = NULL,
    [RLX_OP_SILU_MUL] = rlx_vk_op_eltwise,
    [RLX_OP_ADD_RMSNORM] = rlx_vk_op_rmsnorm,
    [RLX_OP_FUSED_OUT] = NULL,
    [RLX_OP_STATE] = NULL,
    [RLX_OP_CACHE_WRITE] = rlx_vk_op_cache_write,
    [RLX_OP_CONVERT] = rlx_vk_op_convert,
    [RLX_OP_TOPK] = rlx_vk_op_topk,
    [RLX_OP_MATMUL_ID] = rlx_vk_op_matmul_id,
    [RLX_OP_MOE_COMBINE] = rlx_vk_op_moe_combine,
};
static_assert(sizeof recorders / sizeof recorders[0] == RLX_OP_COUNT && RLX_OP_COUNT == 24,
              "vulkan: one recorder entry per op");

static bool records_nothing(enum rlx_op op)
{
    return op == RLX_OP_INPUT || op == RLX_OP_PARAM || op == RLX_OP_STATE || op == RLX_OP_RESHAPE ||
           op == RLX_OP_FUSED_OUT;
}

bool rlx_vk_supports_op(void *ctx, const struct rlx_graph *g, int id)
{
    (void)ctx;
    const struct rlx_node *n = &g->nodes[id];
    if ((unsigned)n->op >= RLX_OP_COUNT) return false;
    if (records_nothing(n->op)) return true;
    /* the shape rules admit only dtypes the shaders read; attention's q row must fit shared memory */
    if (n->op == RLX_OP_ATTENTION) return g->nodes[n->in[0]].shape[2].c <= RLX_VK_ATTN_MAX_D;
    return recorders[n->op] != NULL;
}

/* The shaders node id dispatches. */
static int node_shaders(const struct rlx_graph *g, int id, enum rlx_vk_shader out[2])
{
    const struct rlx_node *nd = &g->nodes[id];
    switch (nd->op) {
    case RLX_OP_MATMUL: {
        const enum rlx_dtype dt = g->nodes[nd->in[1]].dtype;
        out[0] = rlx_vk_weight_shader(RLX_VK_SH_MATMUL_F32, dt);
        if (!nd->attrs.trans_b) return 1;
        out[1] = rlx_vk_weight_shader(RLX_VK_SH_MATVEC_F32, dt);
        return 2;
    }
    case RLX_OP_EMBEDDING: out[0] = rlx_vk_weight_shader(RLX_VK_SH_EMBEDDING_F32, g->nodes[nd->in[0]].dtype); return 1;
    case RLX_OP_RMSNORM: out[0] = RLX_VK_SH_RMSNORM; return 1;
    case RLX_OP_ADD_RMSNORM: out[0] = RLX_VK_SH_ADD_RMSNORM; return 1;
    case RLX_OP_ROPE: out[0] = RLX_VK_SH_ROPE; return 1;
    case RLX_OP_SOFTMAX: out[0] = RLX_VK_SH_SOFTMAX; return 1;
    case RLX_OP_SILU:
    case RLX_OP_SILU_MUL:
    case RLX_OP_ADD:
    case RLX_OP_MUL: out[0] = RLX_VK_SH_ELTWISE; return 1;
    case RLX_OP_CONVERT: out[0] = RLX_VK_SH_CONVERT; return 1;
    case RLX_OP_CACHE_WRITE: out[0] = RLX_VK_SH_CACHE_WRITE; return 1;
    case RLX_OP_ATTENTION: out[0] = rlx_vk_attention_shader(g->nodes[nd->in[1]].dtype); return 1;
    case RLX_OP_TOPK: out[0] = RLX_VK_SH_TOPK; return 1;
    case RLX_OP_MATMUL_ID: out[0] = rlx_vk_weight_shader(RLX_VK_SH_MATMUL_ID_F32, g->nodes[nd->in[2]].dtype); return 1;
    case RLX_OP_MOE_COMBINE: out[0] = RLX_VK_SH_MOE_COMBINE; return 1;
    default: return 0; /* leaves, aliases and copies dispatch no shader */
    }
}

void rlx_vk_plan_free(void *ctx, void *state)
{
    struct rlx_vk_dev *d = ctx;
    struct vk_plan *p = state;
    if (!p) return;
    const struct rlx_vk_dfn *f = &d->vk->fn;
    if (p->queries) f->vkDestroyQueryPool(d->vk->device, p->queries, NULL);
    if (p->fence) f->vkDestroyFence(d->vk->device, p->fence, NULL);
    if (p->pool) f->vkDestroyCommandPool(d->vk->device, p->pool, NULL);
    rlx_vk_buf_destroy(d->vk, p->status);
    rlx_vk_buf_destroy(d->vk, p->scratch);
    free(p->query_node);
    free(p->ticks);
    free(p->rec.seen);
    free(p->rec.regions);
    free(p);
}

rlx_status rlx_vk_plan_compile(void *ctx, const struct rlx_graph *g, const struct rlx_compile_opts *opts, void **state)
{
    struct rlx_vk_dev *d = ctx;
    struct rlx_vk_context *vk = d->vk;
    RLX_TRY(rlx_vk_usable(vk));
    struct vk_plan *p = rlx_calloc(1, sizeof *p);
    if (!p) return RLX_ERR_NOMEM;
    p->rec.batch_invariant = opts->batch_invariant;
    const VkCommandPoolCreateInfo cp = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                        .queueFamilyIndex = vk->queue_family};
    rlx_status s = rlx_vk_check(vk, vk->fn.vkCreateCommandPool(vk->device, &cp, NULL, &p->pool), "vkCreateCommandPool");
    if (s == RLX_OK) {
        const VkCommandBufferAllocateInfo ca = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                                .commandPool = p->pool,
                                                .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                                .commandBufferCount = 1};
        s = rlx_vk_check(vk, vk->fn.vkAllocateCommandBuffers(vk->device, &ca, &p->cmd), "vkAllocateCommandBuffers");
    }
    if (s == RLX_OK) {
        const VkFenceCreateInfo fc = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        s = rlx_vk_check(vk, vk->fn.vkCreateFence(vk->device, &fc, NULL, &p->fence), "vkCreateFence");
    }
    if (s == RLX_OK) s = rlx_vk_buf_create(vk, 16, true, true, &p->status);
    for (int id = 0; s == RLX_OK && id < g->n_nodes; id++) {
        enum rlx_vk_shader sh[2];
        VkPipeline pipe;
        const int n = g->nodes[id].dead ? 0 : node_shaders(g, id, sh);
        for (int k = 0; s == RLX_OK && k < n; k++) s = rlx_vk_pipeline(vk, sh[k], &pipe);
    }
    if (s != RLX_OK) {
        rlx_vk_plan_free(ctx, p);
        return s;
    }
    *state = p;
    return RLX_OK;
}

/* ---- run ---------------------------------------------------------------------------------- */

/* Query slots for a profiled run of g (one per live node that records, plus the start). */
static rlx_status need_queries(struct rlx_vk_dev *d, struct vk_plan *p, const struct rlx_graph *g)
{
    uint32_t need = 1;
    for (int id = 0; id < g->n_nodes; id++) need += !g->nodes[id].dead && !records_nothing(g->nodes[id].op);
    if (p->queries && p->n_queries >= need) return RLX_OK;
    struct rlx_vk_context *vk = d->vk;
    if (p->queries) vk->fn.vkDestroyQueryPool(vk->device, p->queries, NULL);
    p->queries = VK_NULL_HANDLE;
    free(p->query_node);
    free(p->ticks);
    p->query_node = rlx_calloc(need, sizeof *p->query_node);
    p->ticks = rlx_calloc(need, sizeof *p->ticks);
    if (!p->query_node || !p->ticks) return RLX_ERR_NOMEM;
    const VkQueryPoolCreateInfo qi = {
        .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = need};
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkCreateQueryPool(vk->device, &qi, NULL, &p->queries), "vkCreateQueryPool"));
    p->n_queries = need;
    return RLX_OK;
}

/* Records every live node; *n_stamps: timestamps written (profiling). */
static rlx_status record(struct rlx_vk_dev *d, struct vk_plan *p, const struct rlx_graph *g,
                         const struct rlx_tensor *values, bool profile, uint32_t *n_stamps)
{
    struct rlx_vk_context *vk = d->vk;
    struct rlx_vk_rec *r = &p->rec;
    r->dev = d;
    r->vk = vk;
    r->cmd = p->cmd;
    r->status = p->status;
    r->n_seen = 0;
    r->bound = VK_NULL_HANDLE;
    uint64_t scratch = 0; /* the largest need of any node (the previous run has ended: its buffer may be replaced) */
    for (int id = 0; id < g->n_nodes; id++)
        if (!g->nodes[id].dead) {
            const uint64_t b = rlx_vk_scratch_bytes(r, g, id, values);
            scratch = b > scratch ? b : scratch;
        }
    if (scratch && (!p->scratch || p->scratch->size < scratch)) {
        rlx_vk_buf_destroy(vk, p->scratch);
        p->scratch = NULL;
        RLX_TRY(rlx_vk_buf_create(vk, scratch, false, false, &p->scratch));
    }
    r->scratch = p->scratch;
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                         .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkBeginCommandBuffer(p->cmd, &bi), "vkBeginCommandBuffer"));
    rlx_vk_cmd_full_barrier(vk, p->cmd); /* uploads and earlier runs before this one */
    *n_stamps = 0;
    if (profile) {
        vk->fn.vkCmdResetQueryPool(p->cmd, p->queries, 0, p->n_queries);
        vk->fn.vkCmdWriteTimestamp(p->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, (*n_stamps)++);
    }
    for (int id = 0; id < g->n_nodes; id++) {
        const struct rlx_node *n = &g->nodes[id];
        if (n->dead || records_nothing(n->op)) continue;
        r->node = id;
        r->op = rlx_op_name(n->op);
        if (profile) rlx_vk_record_barrier(r); /* each node alone, so its time is its own */
        RLX_TRY(recorders[n->op](r, g, id, values));
        if (profile) {
            rlx_vk_record_barrier(r);
            p->query_node[*n_stamps] = id;
            vk->fn.vkCmdWriteTimestamp(p->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, (*n_stamps)++);
        }
    }
    rlx_vk_cmd_full_barrier(vk, p->cmd); /* results visible to the host and to later submissions */
    return rlx_vk_check(vk, vk->fn.vkEndCommandBuffer(p->cmd), "vkEndCommandBuffer");
}

/* The error a kernel reported through the status words. */
static rlx_status reported(const struct rlx_graph *g, const struct rlx_tensor *values, const uint32_t *st)
{
    const int id = (int)st[1];
    const struct rlx_node *n = &g->nodes[id];
    if (n->op == RLX_OP_MATMUL_ID || n->op == RLX_OP_MOE_COMBINE) {
        const struct rlx_tensor *ids = &values[n->in[n->op == RLX_OP_MATMUL_ID ? 1 : 2]];
        const int64_t per_row = ids->shape[ids->ndim - 1];
        const int64_t E = n->op == RLX_OP_MATMUL_ID ? values[n->in[2]].shape[0] : values[n->in[1]].shape[1];
        return rlx_set_error(RLX_ERR_RANGE, "node %d (%s): expert id %d (row %lld, slot %lld) is outside [0, %lld)", id,
                             rlx_op_name(n->op), (int32_t)st[3], (long long)(st[2] / per_row),
                             (long long)(st[2] % per_row), (long long)E);
    }
    if (n->op == RLX_OP_EMBEDDING)
        return rlx_set_error(RLX_ERR_RANGE, "node %d (embedding): token id %d at position %u is outside [0, %lld)", id,
                             (int32_t)st[3], st[2], (long long)values[n->in[0]].shape[0]);
    return rlx_set_error(RLX_ERR_RANGE, "node %d (cache_write): position %d of row %u is outside the state's %lld rows",
                         id, (int32_t)st[3], st[2], (long long)values[n->in[0]].shape[0]);
}

rlx_status rlx_vk_plan_run(void *ctx, void *state, const struct rlx_graph *g, const struct rlx_tensor *values,
                           double *node_seconds)
{
    struct rlx_vk_dev *d = ctx;
    struct vk_plan *p = state;
    struct rlx_vk_context *vk = d->vk;
    RLX_TRY(rlx_vk_usable(vk));
    const bool profile = node_seconds && vk->info.timestamps;
    if (profile) RLX_TRY(need_queries(d, p, g));
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkResetCommandPool(vk->device, p->pool, 0), "vkResetCommandPool"));
    uint32_t n_stamps;
    RLX_TRY(record(d, p, g, values, profile, &n_stamps));
    memset(p->status->map, 0, 16);
    if (rlx_interrupted()) return rlx_set_error(RLX_ERR_INTERRUPTED, "interrupted (before the plan was submitted)");
    RLX_TRY(rlx_vk_submit_wait(vk, p->cmd, p->fence));
    uint32_t st[4];
    memcpy(st, p->status->map, sizeof st);
    if (st[0]) return reported(g, values, st);
    if (profile) {
        uint64_t *ticks = p->ticks;
        RLX_TRY(rlx_vk_check(vk,
                             vk->fn.vkGetQueryPoolResults(vk->device, p->queries, 0, n_stamps, sizeof *ticks * n_stamps,
                                                          ticks, sizeof *ticks,
                                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
                             "vkGetQueryPoolResults"));
        for (uint32_t k = 1; k < n_stamps; k++)
            node_seconds[p->query_node[k]] = (double)(ticks[k] - ticks[k - 1]) * vk->info.timestamp_period * 1e-9;
    }
    return RLX_OK;
}
