/*
 * ops_copy.c - the ops that move bytes without arithmetic: gather_last, concat and slice, as
 * copy commands (one region per contiguous run of bytes), for every dtype they take. Copies have
 * no binding-size limit. Never prints.
 */
#include "backends/vulkan/record.h"
#include "core/core.h"

/* For an axis of t: elements before it (outer) and bytes of one index step along it. */
static void axis_split(const struct rlx_tensor *t, int axis, int64_t *outer, uint64_t *step)
{
    int64_t o = 1, in = 1;
    for (int i = 0; i < axis; i++) o *= t->shape[i];
    for (int i = axis + 1; i < t->ndim; i++) in *= t->shape[i];
    *outer = o;
    *step = (uint64_t)in * rlx_dtype_traits(t->dtype)->type_size; /* no block types here (shape rules) */
}

rlx_status rlx_vk_op_gather_last(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_tensor *x = &v[g->nodes[id].in[0]], *out = &v[id];
    if (x->shape[0] < 1) return rlx_set_error(RLX_ERR_SHAPE, "node %d (gather_last): the input has no rows", id);
    const uint64_t row = rlx_vk_tbytes(out);
    const VkBufferCopy c = {
        .srcOffset = x->offset + (uint64_t)(x->shape[0] - 1) * row, .dstOffset = out->offset, .size = row};
    return rlx_vk_record_copy(r, rlx_vk_tbuf(out), rlx_vk_tbuf(x), &c, row ? 1 : 0);
}

/* Regions copying `outer` runs of `inner` bytes from src (stride src_stride) to dst (stride dst_stride). */
static rlx_status copy_runs(struct rlx_vk_rec *r, const struct rlx_tensor *dst, uint64_t dst_at, uint64_t dst_stride,
                            const struct rlx_tensor *src, uint64_t src_at, uint64_t src_stride, int64_t outer,
                            uint64_t inner)
{
    if (outer == 0 || inner == 0) return RLX_OK;
    RLX_TRY(rlx_vk_need_regions(r, (size_t)outer));
    for (int64_t o = 0; o < outer; o++)
        r->regions[o] = (VkBufferCopy){.srcOffset = src_at + (uint64_t)o * src_stride,
                                       .dstOffset = dst_at + (uint64_t)o * dst_stride,
                                       .size = inner};
    if (dst_stride == inner && src_stride == inner) { /* one contiguous run */
        r->regions[0].size = inner * (uint64_t)outer;
        outer = 1;
    }
    return rlx_vk_record_copy(r, rlx_vk_tbuf(dst), rlx_vk_tbuf(src), r->regions, (uint32_t)outer);
}

rlx_status rlx_vk_op_concat(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *a = &v[nd->in[0]], *b = &v[nd->in[1]], *out = &v[id];
    int64_t outer;
    uint64_t step;
    axis_split(a, nd->attrs.axis, &outer, &step);
    const uint64_t sa = step * (uint64_t)a->shape[nd->attrs.axis], sb = step * (uint64_t)b->shape[nd->attrs.axis];
    RLX_TRY(copy_runs(r, out, out->offset, sa + sb, a, a->offset, sa, outer, sa));
    return copy_runs(r, out, out->offset + sa, sa + sb, b, b->offset, sb, outer, sb);
}

rlx_status rlx_vk_op_slice(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *x = &v[nd->in[0]], *out = &v[id];
    /* bounds were checked by the runtime before memory was planned */
    const int64_t extent = x->shape[nd->attrs.axis];
    const int64_t start = nd->attrs.start < 0 ? extent + nd->attrs.start : nd->attrs.start;
    int64_t outer;
    uint64_t step;
    axis_split(x, nd->attrs.axis, &outer, &step);
    return copy_runs(r, out, out->offset, step * (uint64_t)nd->attrs.len, x, x->offset + step * (uint64_t)start,
                     step * (uint64_t)extent, outer, step * (uint64_t)nd->attrs.len);
}
