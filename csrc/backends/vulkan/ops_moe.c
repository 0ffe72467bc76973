/*
 * ops_moe.c - the mixture-of-experts ops: topk (topk.comp, one invocation per row replaying the
 * host's choice among ties in a scratch buffer of the plan), matmul_id (matmul_id.comp, for
 * experts of every real-valued dtype: f32, f16, bf16 and the GGUF block types; stacked experts
 * bigger than one binding may span are bound in pieces of whole experts) and moe_combine
 * (moe_combine.comp). An expert id out of range is reported through the status words, as the
 * embedding reports a token id. Never prints.
 */
#include <stddef.h>

#include "backends/vulkan/record.h"
#include "core/core.h"

/* topk.comp's push constants */
struct pc_topk {
    uint32_t rows, n, k, x_off, o_off;
};
/* matmul_id.comp's push constants */
struct pc_matmul_id {
    uint32_t R, n, A, K, N, E, e0, experts, w_off, w_row, w_expert, a_off, ids_off, o_off, node, groups;
};
/* moe_combine.comp's push constants */
struct pc_moe_combine {
    uint32_t S, n, H, E, y_off, p_off, ids_off, o_off, norm, node, items;
};
static_assert(sizeof(struct pc_matmul_id) <= RLX_VK_PUSH_BYTES && sizeof(struct pc_moe_combine) <= RLX_VK_PUSH_BYTES,
              "push constants fit the layout");
static_assert(RLX_VK_SH_MATMUL_ID_Q6_K - RLX_VK_SH_MATMUL_ID_F32 == 12,
              "shaders.list lists one matmul_id variant per weight dtype, in dtype order");

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Bytes of one (key, index) pair of topk's scratch. */
#define PAIR 8u

/* Rows of topk node id's input that one dispatch sorts (their pairs, and the rows, fit one
 * binding); 0 when one row does not fit. */
static int64_t topk_rows_per_dispatch(uint64_t limit, const struct rlx_tensor *x)
{
    const int64_t n = x->shape[x->ndim - 1];
    return min64(rlx_vk_rows(x), (int64_t)(limit / ((uint64_t)n * PAIR)));
}

uint64_t rlx_vk_scratch_bytes(const struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    if (nd->op != RLX_OP_TOPK) return 0;
    const struct rlx_tensor *x = &v[nd->in[0]];
    const int64_t rows = topk_rows_per_dispatch(rlx_vk_span_limit(r), x);
    return rows > 0 ? (uint64_t)rows * (uint64_t)x->shape[x->ndim - 1] * PAIR : 0;
}

rlx_status rlx_vk_op_topk(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *x = &v[nd->in[0]], *out = &v[id];
    const int64_t rows = rlx_vk_rows(x), n = x->shape[x->ndim - 1], k = nd->attrs.k;
    if (rows == 0) return RLX_OK;
    const int64_t per = topk_rows_per_dispatch(rlx_vk_span_limit(r), x);
    if (per < 1)
        return rlx_set_error(RLX_ERR_UNSUPPORTED,
                             "node %d (%s): the %llu bytes of one row's (value, index) pairs "
                             "exceed the %llu bytes one binding may span on this device (maxStorageBufferRange)",
                             r->node, r->op, (unsigned long long)((uint64_t)n * PAIR),
                             (unsigned long long)rlx_vk_span_limit(r));
    assert(r->scratch && r->scratch->size >= (uint64_t)per * (uint64_t)n * PAIR);
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        const int64_t m = min64(per, rows - r0);
        struct pc_topk pc = {.rows = rlx_vk_u32(m), .n = rlx_vk_u32(n), .k = rlx_vk_u32(k)};
        struct rlx_vk_bind b[3] = {
            {.buf = rlx_vk_tbuf(x),
             .offset = x->offset + (uint64_t)(r0 * n) * 4,
             .bytes = (uint64_t)(m * n) * 4,
             .off = &pc.x_off,
             .unit = 4},
            {.buf = rlx_vk_tbuf(out),
             .offset = out->offset + (uint64_t)(r0 * k) * 4,
             .bytes = (uint64_t)(m * k) * 4,
             .write = true,
             .off = &pc.o_off,
             .unit = 4},
            {.buf = r->scratch, .offset = 0, .bytes = (uint64_t)m * (uint64_t)n * PAIR, .write = true, .unit = PAIR},
        };
        RLX_TRY(
            rlx_vk_dispatch(r, RLX_VK_SH_TOPK, b, 3, &pc, sizeof pc, rlx_vk_groups(r, RLX_VK_SH_TOPK, (uint64_t)m)));
    }
    return RLX_OK;
}

rlx_status rlx_vk_op_matmul_id(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *a = &v[nd->in[0]], *ids = &v[nd->in[1]], *w = &v[nd->in[2]], *out = &v[id];
    const int64_t S = ids->shape[0], n = ids->shape[1], A = a->shape[1], K = a->shape[2];
    const int64_t E = w->shape[0], N = w->shape[1], R = S * n;
    if (R == 0 || N == 0) return RLX_OK;
    const struct rlx_dtype_traits *tr = rlx_dtype_traits(w->dtype);
    const bool block = tr->block_size > 1;
    const uint64_t limit = rlx_vk_span_limit(r), wrow = (uint64_t)(K / tr->block_size) * tr->type_size;
    const uint64_t expert = (uint64_t)N * wrow;
    /* experts per dispatch (K == 0: the shader sums nothing and every row is zeros) */
    const int64_t per = expert ? min64(E, (int64_t)(limit / expert)) : E;
    if (per < 1)
        return rlx_set_error(RLX_ERR_UNSUPPORTED,
                             "node %d (%s): one expert's weight of %llu bytes exceeds the %llu "
                             "bytes one binding may span on this device (maxStorageBufferRange)",
                             r->node, r->op, (unsigned long long)expert, (unsigned long long)limit);
    const enum rlx_vk_shader sh = rlx_vk_weight_shader(RLX_VK_SH_MATMUL_ID_F32, w->dtype);
    const uint32_t unit = block ? 1u : (uint32_t)tr->type_size;
    for (int64_t e0 = 0; e0 < E; e0 += per) {
        const int64_t ec = min64(per, E - e0);
        struct pc_matmul_id pc = {.R = rlx_vk_u32(R),
                                  .n = rlx_vk_u32(n),
                                  .A = rlx_vk_u32(A),
                                  .K = rlx_vk_u32(K),
                                  .N = rlx_vk_u32(N),
                                  .E = rlx_vk_u32(E),
                                  .e0 = rlx_vk_u32(e0),
                                  .experts = rlx_vk_u32(ec),
                                  .w_row = rlx_vk_u32(block ? (int64_t)wrow : K),
                                  .w_expert = rlx_vk_u32(block ? (int64_t)expert : N * K),
                                  .node = rlx_vk_u32(id),
                                  .groups = rlx_vk_u32(R * N)};
        struct rlx_vk_bind b[5] = {
            {.buf = rlx_vk_tbuf(w),
             .offset = w->offset + (uint64_t)e0 * expert,
             .bytes = (uint64_t)ec * expert,
             .off = &pc.w_off,
             .unit = unit},
            rlx_vk_tensor(a, false, &pc.a_off),
            rlx_vk_tensor(ids, false, &pc.ids_off),
            rlx_vk_tensor(out, true, &pc.o_off),
            rlx_vk_status(r),
        };
        RLX_TRY(rlx_vk_dispatch(r, sh, b, 5, &pc, sizeof pc, (uint64_t)R * (uint64_t)N));
    }
    return RLX_OK;
}

rlx_status rlx_vk_op_moe_combine(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *y = &v[nd->in[0]], *probs = &v[nd->in[1]], *ids = &v[nd->in[2]], *out = &v[id];
    const int64_t S = y->shape[0], n = y->shape[1], H = y->shape[2], E = probs->shape[1];
    if (S == 0 || H == 0) return RLX_OK;
    struct pc_moe_combine pc = {.S = rlx_vk_u32(S),
                                .n = rlx_vk_u32(n),
                                .H = rlx_vk_u32(H),
                                .E = rlx_vk_u32(E),
                                .norm = nd->attrs.norm != 0,
                                .node = rlx_vk_u32(id),
                                .items = rlx_vk_u32(S * H)};
    struct rlx_vk_bind b[5] = {
        rlx_vk_tensor(y, false, &pc.y_off),
        rlx_vk_tensor(probs, false, &pc.p_off),
        rlx_vk_tensor(ids, false, &pc.ids_off),
        rlx_vk_tensor(out, true, &pc.o_off),
        rlx_vk_status(r),
    };
    return rlx_vk_dispatch(r, RLX_VK_SH_MOE_COMBINE, b, 5, &pc, sizeof pc,
                           rlx_vk_groups(r, RLX_VK_SH_MOE_COMBINE, (uint64_t)(S * H)));
}
