/*
 * ops_pointwise.c - the row-wise and elementwise ops: rmsnorm and the fused add_rmsnorm
 * (rmsnorm.comp, one workgroup per row), rope (rope.comp), softmax (softmax.comp), silu,
 * silu_mul, add, mul (eltwise.comp) and convert (convert.comp). Operands are bound whole; one
 * bigger than a binding may span is refused naming the node. Never prints.
 */
#include "backends/vulkan/record.h"
#include "core/core.h"

/* rmsnorm.comp's push constants */
struct pc_rmsnorm {
    uint32_t rows, d;
    float eps;
    uint32_t x_off, w_off, o_off, b_off, s_off;
};
/* rope.comp's */
struct pc_rope {
    uint32_t s, h, d, interleaved, x_off, p_off, f_off, o_off, items;
};
/* softmax.comp's */
struct pc_softmax {
    uint32_t rows, n, x_off, o_off;
};
/* eltwise.comp's */
struct pc_eltwise {
    uint32_t op, n, nb, a_off, b_off, o_off;
};
/* convert.comp's */
struct pc_convert {
    uint32_t dtype, n, x_off, o_off;
};

rlx_status rlx_vk_op_rmsnorm(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const bool add = nd->op == RLX_OP_ADD_RMSNORM;
    /* add_rmsnorm(a, b, w): the sum is the node itself, the normalised value its fused_out companion */
    const struct rlx_tensor *x = &v[nd->in[0]], *w = &v[nd->in[add ? 2 : 1]], *out = &v[add ? nd->companion : id];
    const int64_t rows = rlx_vk_rows(x), d = x->shape[x->ndim - 1];
    struct pc_rmsnorm pc = {.rows = rlx_vk_u32(rows), .d = rlx_vk_u32(d), .eps = nd->attrs.eps};
    struct rlx_vk_bind b[5] = {
        rlx_vk_tensor(x, false, &pc.x_off),
        rlx_vk_tensor(w, false, &pc.w_off),
        rlx_vk_tensor(out, true, &pc.o_off),
    };
    if (add) {
        b[3] = rlx_vk_tensor(&v[nd->in[1]], false, &pc.b_off);
        b[4] = rlx_vk_tensor(&v[id], true, &pc.s_off);
    }
    if (rows == 0 || d == 0) return RLX_OK;
    return rlx_vk_dispatch(r, add ? RLX_VK_SH_ADD_RMSNORM : RLX_VK_SH_RMSNORM, b, add ? 5 : 3, &pc, sizeof pc,
                           (uint64_t)rows);
}

rlx_status rlx_vk_op_rope(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *out = &v[id];
    const int64_t items = rlx_tensor_numel(out) / 2;
    struct pc_rope pc = {.s = rlx_vk_u32(out->shape[0]),
                         .h = rlx_vk_u32(out->shape[1]),
                         .d = rlx_vk_u32(out->shape[2]),
                         .interleaved = nd->attrs.interleaved != 0,
                         .items = rlx_vk_u32(items)};
    struct rlx_vk_bind b[4] = {
        rlx_vk_tensor(&v[nd->in[0]], false, &pc.x_off),
        rlx_vk_tensor(&v[nd->in[1]], false, &pc.p_off),
        rlx_vk_tensor(&v[nd->in[2]], false, &pc.f_off),
        rlx_vk_tensor(out, true, &pc.o_off),
    };
    if (items == 0) return RLX_OK;
    return rlx_vk_dispatch(r, RLX_VK_SH_ROPE, b, 4, &pc, sizeof pc, rlx_vk_groups(r, RLX_VK_SH_ROPE, (uint64_t)items));
}

rlx_status rlx_vk_op_softmax(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_tensor *out = &v[id];
    const int64_t rows = rlx_vk_rows(out), n = out->shape[out->ndim - 1];
    struct pc_softmax pc = {.rows = rlx_vk_u32(rows), .n = rlx_vk_u32(n)};
    struct rlx_vk_bind b[2] = {
        rlx_vk_tensor(&v[g->nodes[id].in[0]], false, &pc.x_off),
        rlx_vk_tensor(out, true, &pc.o_off),
    };
    if (rows == 0 || n == 0) return RLX_OK;
    return rlx_vk_dispatch(r, RLX_VK_SH_SOFTMAX, b, 2, &pc, sizeof pc, (uint64_t)rows);
}

rlx_status rlx_vk_op_eltwise(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *out = &v[id], *a = &v[nd->in[0]];
    const struct rlx_tensor *bt = nd->n_in > 1 ? &v[nd->in[1]] : a; /* silu binds a twice: the shader declares b */
    const uint32_t op = nd->op == RLX_OP_SILU ? 0 : nd->op == RLX_OP_SILU_MUL ? 1 : nd->op == RLX_OP_ADD ? 2 : 3;
    const int64_t n = rlx_tensor_numel(out), nb = rlx_tensor_numel(bt);
    struct pc_eltwise pc = {.op = op, .n = rlx_vk_u32(n), .nb = rlx_vk_u32(nb)};
    struct rlx_vk_bind b[3] = {
        rlx_vk_tensor(a, false, &pc.a_off),
        rlx_vk_tensor(bt, false, &pc.b_off),
        rlx_vk_tensor(out, true, &pc.o_off),
    };
    if (n == 0) return RLX_OK;
    return rlx_vk_dispatch(r, RLX_VK_SH_ELTWISE, b, 3, &pc, sizeof pc,
                           rlx_vk_groups(r, RLX_VK_SH_ELTWISE, (uint64_t)n));
}

rlx_status rlx_vk_op_convert(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_tensor *out = &v[id];
    const int64_t n = rlx_tensor_numel(out);
    struct pc_convert pc = {.dtype = (uint32_t)out->dtype, .n = rlx_vk_u32(n)};
    struct rlx_vk_bind b[2] = {
        rlx_vk_tensor(&v[g->nodes[id].in[0]], false, &pc.x_off),
        rlx_vk_tensor(out, true, &pc.o_off),
    };
    if (n == 0) return RLX_OK;
    return rlx_vk_dispatch(r, RLX_VK_SH_CONVERT, b, 2, &pc, sizeof pc,
                           rlx_vk_groups(r, RLX_VK_SH_CONVERT, (uint64_t)n));
}
