/*
 * ops_attention.c - attention over the KV cache (attention.comp: one workgroup per query row and
 * head, streaming the keys and values in chunks with an online softmax) and the writes of new
 * rows into the cache (cache_write.comp, which reports a position outside the cache through the
 * status words). The cache is a state bound in place: nothing of it crosses to the host. Never
 * prints.
 */
#include <stdint.h>

#include "backends/vulkan/record.h"
#include "core/core.h"

/* attention.comp's push constants */
struct pc_attention {
    uint32_t S, T, Hq, Hkv, D, group;
    float scale;
    uint32_t causal;
    int32_t window;
    uint32_t mask_kind, q_off, k_off, v_off, o_off, m_off, groups;
};
/* cache_write.comp's */
struct pc_cache_write {
    uint32_t dtype, S, row, T, s_off, r_off, p_off, node, items;
};
static_assert(sizeof(struct pc_attention) <= RLX_VK_PUSH_BYTES, "push constants fit the layout");

static enum rlx_vk_shader attention_shader(enum rlx_dtype kv)
{
    return kv == RLX_F32 ? RLX_VK_SH_ATTENTION_F32 : kv == RLX_F16 ? RLX_VK_SH_ATTENTION_F16 : RLX_VK_SH_ATTENTION_BF16;
}

enum rlx_vk_shader rlx_vk_attention_shader(enum rlx_dtype kv) { return attention_shader(kv); }

rlx_status rlx_vk_op_attention(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *q = &v[nd->in[0]], *k = &v[nd->in[1]], *out = &v[id];
    const int64_t S = q->shape[0], Hq = q->shape[1], D = q->shape[2], T = k->shape[0], Hkv = k->shape[1];
    if (T < S)
        return rlx_set_error(RLX_ERR_SHAPE,
                             "node %d (attention): %lld keys for %lld queries; the queries are the "
                             "last positions of the keys (T >= S)",
                             id, (long long)T, (long long)S);
    if (S == 0 || Hq == 0 || D == 0) return RLX_OK;
    const int64_t window = nd->attrs.window > INT32_MAX ? INT32_MAX : nd->attrs.window;
    const struct rlx_tensor *mask = nd->n_in == 4 ? &v[nd->in[3]] : NULL;
    struct pc_attention pc = {
        .S = rlx_vk_u32(S),
        .T = rlx_vk_u32(T),
        .Hq = rlx_vk_u32(Hq),
        .Hkv = rlx_vk_u32(Hkv),
        .D = rlx_vk_u32(D),
        .group = rlx_vk_u32(Hq / Hkv),
        .scale = nd->attrs.scale,
        .causal = nd->attrs.causal != 0,
        .window = (int32_t)window,
        .mask_kind = !mask                    ? 0u
                     : mask->dtype == RLX_F32 ? 1u
                                              : 2u,
        .groups = rlx_vk_u32(S * Hq),
    };
    struct rlx_vk_bind b[5] = {
        rlx_vk_tensor(q, false, &pc.q_off),
        rlx_vk_tensor(k, false, &pc.k_off),
        rlx_vk_tensor(&v[nd->in[2]], false, &pc.v_off),
        rlx_vk_tensor(out, true, &pc.o_off),
        rlx_vk_tensor(mask ? mask : q, false, &pc.m_off), /* without a mask the shader reads none of it */
    };
    return rlx_vk_dispatch(r, attention_shader(k->dtype), b, 5, &pc, sizeof pc, (uint64_t)(S * Hq));
}

rlx_status rlx_vk_op_cache_write(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *state = &v[nd->in[0]], *rows = &v[nd->in[1]];
    const int64_t S = rows->shape[0], row = S ? rlx_tensor_numel(rows) / S : 0;
    if (S == 0 || row == 0) return RLX_OK;
    struct pc_cache_write pc = {.dtype = (uint32_t)state->dtype,
                                .S = rlx_vk_u32(S),
                                .row = rlx_vk_u32(row),
                                .T = rlx_vk_u32(state->shape[0]),
                                .node = rlx_vk_u32(id),
                                .items = rlx_vk_u32(S * row)};
    struct rlx_vk_bind b[4] = {
        rlx_vk_tensor(state, true, &pc.s_off),
        rlx_vk_tensor(rows, false, &pc.r_off),
        rlx_vk_tensor(&v[nd->in[2]], false, &pc.p_off),
        rlx_vk_status(r),
    };
    return rlx_vk_dispatch(r, RLX_VK_SH_CACHE_WRITE, b, 4, &pc, sizeof pc,
                           rlx_vk_groups(r, RLX_VK_SH_CACHE_WRITE, (uint64_t)(S * row)));
}
