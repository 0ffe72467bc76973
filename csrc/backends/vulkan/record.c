/*
 * record.c - the pieces every op recorder uses: a dispatch over byte ranges (push descriptors,
 * offsets past the aligned base handed to the shader through its push constants, the grid split
 * to the device's workgroup-count limits), copies and fills, and the hazard tracking that puts a
 * barrier only where one dispatch depends on another (see record.h). Never prints.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/record.h"
#include "core/core.h"

uint64_t rlx_vk_tbytes(const struct rlx_tensor *t)
{
    size_t bytes = 0;
    rlx_status s = rlx_shape_bytes(t->dtype, t->ndim, t->shape, &bytes);
    (void)s;
    assert(s == RLX_OK);
    return bytes;
}

int64_t rlx_vk_rows(const struct rlx_tensor *t)
{
    int64_t r = 1;
    for (int i = 0; i + 1 < t->ndim; i++) r *= t->shape[i];
    return r;
}

struct rlx_vk_bind rlx_vk_tensor(const struct rlx_tensor *t, bool write, uint32_t *off)
{
    const struct rlx_dtype_traits *tr = rlx_dtype_traits(t->dtype);
    return (struct rlx_vk_bind){.buf = rlx_vk_tbuf(t),
                                .offset = t->offset,
                                .bytes = rlx_vk_tbytes(t),
                                .write = write,
                                .off = off,
                                .unit = tr->block_size > 1 ? 1u : (uint32_t)tr->type_size};
}

/* Descriptor offsets are multiples of this (and of 16, so that every view's elements align). */
static uint64_t align_of(const struct rlx_vk_rec *r)
{
    uint64_t a = r->vk->info.storage_align;
    return a < 16 ? 16 : a;
}

struct rlx_vk_bind rlx_vk_status(const struct rlx_vk_rec *r)
{
    return (struct rlx_vk_bind){
        .buf = r->status, .offset = 0, .bytes = 16, .write = true, .unit = 4, .untracked = true};
}

uint64_t rlx_vk_groups(const struct rlx_vk_rec *r, enum rlx_vk_shader sh, uint64_t items)
{
    const uint64_t wg = rlx_vk_shader_wg(r->vk, sh);
    return (items + wg - 1) / wg;
}

uint64_t rlx_vk_span_limit(const struct rlx_vk_rec *r) { return r->dev->max_range - align_of(r) - 4; }

/* ---- hazards ------------------------------------------------------------------------------ */

void rlx_vk_record_barrier(struct rlx_vk_rec *r)
{
    rlx_vk_cmd_full_barrier(r->vk, r->cmd);
    r->n_seen = 0;
}

/* Records a barrier if one of spans [0, n) depends on what was accessed since the last one, then
 * adds them to the accessed spans. */
static rlx_status track(struct rlx_vk_rec *r, const struct rlx_vk_span *sp, int n)
{
    bool hazard = false;
    for (int i = 0; i < n && !hazard; i++)
        for (int j = 0; j < r->n_seen && !hazard; j++) {
            const struct rlx_vk_span *s = &r->seen[j];
            hazard = s->buf == sp[i].buf && s->lo < sp[i].hi && sp[i].lo < s->hi && (s->write || sp[i].write);
        }
    if (hazard) rlx_vk_record_barrier(r);
    RLX_TRY(rlx_grow(&r->seen, &r->cap_seen, r->n_seen + n));
    memcpy(r->seen + r->n_seen, sp, sizeof *sp * (size_t)n);
    r->n_seen += n;
    return RLX_OK;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

rlx_status rlx_vk_dispatch(struct rlx_vk_rec *r, enum rlx_vk_shader sh, struct rlx_vk_bind *b, int n, void *push,
                           uint32_t push_bytes, uint64_t groups)
{
    assert(n <= RLX_VK_BINDINGS && push_bytes <= RLX_VK_PUSH_BYTES && push_bytes % 4 == 0);
    if (groups == 0) return RLX_OK;
    const struct rlx_vk_info *in = &r->vk->info;
    const uint64_t align = align_of(r);
    VkDescriptorBufferInfo info[RLX_VK_BINDINGS];
    VkWriteDescriptorSet wr[RLX_VK_BINDINGS];
    struct rlx_vk_span sp[RLX_VK_BINDINGS];
    int n_sp = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t base = b[i].offset / align * align, rest = b[i].offset - base;
        uint64_t range = (rest + (b[i].bytes ? b[i].bytes : 4) + 3) / 4 * 4;
        if (range > b[i].buf->size - base) range = b[i].buf->size - base;
        if (range > r->dev->max_range)
            return rlx_set_error(RLX_ERR_UNSUPPORTED,
                                 "node %d (%s): an operand of %llu bytes exceeds the %llu bytes one "
                                 "binding may span on this device (maxStorageBufferRange)",
                                 r->node, r->op, (unsigned long long)b[i].bytes, (unsigned long long)r->dev->max_range);
        if (b[i].off) {
            assert(rest % b[i].unit == 0);
            *b[i].off += (uint32_t)(rest / b[i].unit);
        } else {
            assert(rest == 0);
        }
        info[i] = (VkDescriptorBufferInfo){.buffer = b[i].buf->buf, .offset = base, .range = range};
        wr[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                       .dstBinding = (uint32_t)i,
                                       .descriptorCount = 1,
                                       .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       .pBufferInfo = &info[i]};
        if (!b[i].untracked)
            sp[n_sp++] = (struct rlx_vk_span){
                .buf = b[i].buf->buf, .lo = b[i].offset, .hi = b[i].offset + b[i].bytes, .write = b[i].write};
    }
    const uint64_t max_x = in->max_wg_count[0];
    const uint64_t gx = groups < max_x ? groups : max_x, gy = (groups + gx - 1) / gx;
    if (gy > in->max_wg_count[1])
        return rlx_set_error(RLX_ERR_UNSUPPORTED, "node %d (%s): %llu workgroups exceed this device's grid (%u x %u)",
                             r->node, r->op, (unsigned long long)groups, in->max_wg_count[0], in->max_wg_count[1]);
    VkPipeline pipe;
    RLX_TRY(rlx_vk_pipeline(r->vk, sh, &pipe));
    RLX_TRY(track(r, sp, n_sp));
    const struct rlx_vk_dfn *f = &r->vk->fn;
    if (pipe != r->bound) {
        f->vkCmdBindPipeline(r->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
        r->bound = pipe;
    }
    f->vkCmdPushDescriptorSetKHR(r->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, r->vk->layout, 0, (uint32_t)n, wr);
    f->vkCmdPushConstants(r->cmd, r->vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    f->vkCmdDispatch(r->cmd, (uint32_t)gx, (uint32_t)gy, 1);
    return RLX_OK;
}

rlx_status rlx_vk_record_copy(struct rlx_vk_rec *r, const struct rlx_vk_buf *dst, const struct rlx_vk_buf *src,
                              const VkBufferCopy *regions, uint32_t n)
{
    if (n == 0) return RLX_OK;
    struct rlx_vk_span sp[2] = {{.buf = src->buf, .lo = UINT64_MAX, .hi = 0},
                                {.buf = dst->buf, .lo = UINT64_MAX, .hi = 0, .write = true}};
    for (uint32_t i = 0; i < n; i++) {
        const VkBufferCopy *c = &regions[i];
        if (c->srcOffset < sp[0].lo) sp[0].lo = c->srcOffset;
        if (c->srcOffset + c->size > sp[0].hi) sp[0].hi = c->srcOffset + c->size;
        if (c->dstOffset < sp[1].lo) sp[1].lo = c->dstOffset;
        if (c->dstOffset + c->size > sp[1].hi) sp[1].hi = c->dstOffset + c->size;
    }
    RLX_TRY(track(r, sp, 2));
    r->vk->fn.vkCmdCopyBuffer(r->cmd, src->buf, dst->buf, n, regions);
    return RLX_OK;
}

rlx_status rlx_vk_record_zero(struct rlx_vk_rec *r, const struct rlx_vk_buf *buf, uint64_t offset, uint64_t bytes)
{
    if (bytes == 0) return RLX_OK;
    const struct rlx_vk_span sp = {.buf = buf->buf, .lo = offset, .hi = offset + bytes, .write = true};
    RLX_TRY(track(r, &sp, 1));
    r->vk->fn.vkCmdFillBuffer(r->cmd, buf->buf, offset, bytes, 0);
    return RLX_OK;
}

rlx_status rlx_vk_need_regions(struct rlx_vk_rec *r, size_t n)
{
    if (n <= r->cap_regions) return RLX_OK;
    VkBufferCopy *p = realloc(r->regions, n * sizeof *p);
    if (!p) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %zu copy regions", n);
    r->regions = p;
    r->cap_regions = n;
    return RLX_OK;
}
