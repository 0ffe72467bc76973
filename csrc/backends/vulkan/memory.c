/*
 * memory.c - device buffers: one VkBuffer with memory of its own per rlx buffer, in the first
 * device-local memory type. Where that memory is also host-visible and coherent (lavapipe,
 * integrated GPUs, resizable BAR) and the device was not opened with ":staging", it stays mapped
 * and uploads / downloads are plain copies; otherwise they go through a host-visible staging
 * buffer and a copy command (the path of a discrete GPU, forced by ":staging" so that lavapipe
 * tests it). Transfers are synchronous: when one returns, its bytes have landed. Never prints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk.h"
#include "core/core.h"

#define STAGING_MIN ((VkDeviceSize)1 << 20)
#define STAGING_MAX ((VkDeviceSize)64 << 20) /* bigger transfers go in pieces of this size */

static bool find_type(const struct rlx_vk_context *vk, uint32_t bits, VkMemoryPropertyFlags want, uint32_t *out)
{
    VkPhysicalDeviceMemoryProperties mp;
    vk->ifn.vkGetPhysicalDeviceMemoryProperties(vk->phys, &mp);
    for (uint32_t t = 0; t < mp.memoryTypeCount; t++)
        if ((bits & (1u << t)) && (mp.memoryTypes[t].propertyFlags & want) == want) {
            *out = t;
            return true;
        }
    return false;
}

static bool type_mappable(const struct rlx_vk_context *vk, uint32_t t)
{
    VkPhysicalDeviceMemoryProperties mp;
    vk->ifn.vkGetPhysicalDeviceMemoryProperties(vk->phys, &mp);
    const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    return (mp.memoryTypes[t].propertyFlags & hv) == hv;
}

rlx_status rlx_vk_buf_create(struct rlx_vk_context *vk, VkDeviceSize bytes, bool host, bool map,
                             struct rlx_vk_buf **out)
{
    RLX_TRY(rlx_vk_usable(vk));
    const VkDeviceSize size = bytes < 16 ? 16 : (bytes + 15) & ~(VkDeviceSize)15;
    if (size < bytes || size > vk->info.max_alloc)
        return rlx_set_error(RLX_ERR_NOMEM,
                             "vulkan (%s): a buffer of %llu bytes exceeds the device's largest "
                             "allocation (maxMemoryAllocationSize %llu bytes)",
                             vk->info.name, (unsigned long long)bytes, (unsigned long long)vk->info.max_alloc);
    struct rlx_vk_buf *b = rlx_calloc(1, sizeof *b);
    if (!b) return RLX_ERR_NOMEM;
    b->size = size;
    const VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                   .size = size,
                                   .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                            VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                   .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    char what[128];
    snprintf(what, sizeof what, "allocating a buffer of %llu bytes", (unsigned long long)size);
    rlx_status s = rlx_vk_check(vk, vk->fn.vkCreateBuffer(vk->device, &bi, NULL, &b->buf), what);
    VkMemoryRequirements req;
    uint32_t type = 0;
    if (s == RLX_OK) {
        vk->fn.vkGetBufferMemoryRequirements(vk->device, b->buf, &req);
        const VkMemoryPropertyFlags want =
            host ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                 : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
        if (!find_type(vk, req.memoryTypeBits, want, &type))
            s = rlx_set_error(RLX_ERR_UNSUPPORTED, "vulkan (%s): no %s memory type for storage buffers", vk->info.name,
                              host ? "host-visible coherent" : "device-local");
    }
    if (s == RLX_OK) {
        const VkMemoryAllocateInfo ai = {
            .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = type};
        s = rlx_vk_check(vk, vk->fn.vkAllocateMemory(vk->device, &ai, NULL, &b->mem), what);
    }
    if (s == RLX_OK)
        s = rlx_vk_check(vk, vk->fn.vkBindBufferMemory(vk->device, b->buf, b->mem, 0), "vkBindBufferMemory");
    if (s == RLX_OK && (map || host) && type_mappable(vk, type))
        s = rlx_vk_check(vk, vk->fn.vkMapMemory(vk->device, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map), "vkMapMemory");
    if (s != RLX_OK) {
        rlx_vk_buf_destroy(vk, b);
        return s;
    }
    *out = b;
    return RLX_OK;
}

void rlx_vk_buf_destroy(struct rlx_vk_context *vk, struct rlx_vk_buf *b)
{
    if (!b) return;
    if (b->buf) vk->fn.vkDestroyBuffer(vk->device, b->buf, NULL);
    if (b->mem) vk->fn.vkFreeMemory(vk->device, b->mem, NULL); /* unmaps it too */
    free(b);
}

/* ---- the transfer command buffer (vk->lock held) -------------------------------------------- */

static rlx_status xfer_begin(struct rlx_vk_context *vk)
{
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkResetCommandPool(vk->device, vk->xfer_pool, 0), "vkResetCommandPool"));
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                         .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkBeginCommandBuffer(vk->xfer_cmd, &bi), "vkBeginCommandBuffer"));
    rlx_vk_cmd_full_barrier(vk, vk->xfer_cmd);
    return RLX_OK;
}

static rlx_status xfer_submit(struct rlx_vk_context *vk)
{
    rlx_vk_cmd_full_barrier(vk, vk->xfer_cmd);
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkEndCommandBuffer(vk->xfer_cmd), "vkEndCommandBuffer"));
    return rlx_vk_submit_wait(vk, vk->xfer_cmd, vk->xfer_fence);
}

/* A staging buffer of at least min(bytes, STAGING_MAX) bytes; *chunk: what one piece may move. */
static rlx_status need_staging(struct rlx_vk_context *vk, size_t bytes, size_t *chunk)
{
    VkDeviceSize want = bytes < STAGING_MAX ? bytes : STAGING_MAX;
    if (!vk->staging || vk->staging->size < want) {
        VkDeviceSize size = STAGING_MIN;
        while (size < want) size *= 2;
        struct rlx_vk_buf *b;
        RLX_TRY(rlx_vk_buf_create(vk, size, true, true, &b));
        rlx_vk_buf_destroy(vk, vk->staging);
        vk->staging = b;
    }
    *chunk = (size_t)(vk->staging->size < STAGING_MAX ? vk->staging->size : STAGING_MAX);
    return RLX_OK;
}

/* ---- rlx buffers ---------------------------------------------------------------------------- */

static struct rlx_vk_buf *vbuf(const struct rlx_buffer *b) { return b->impl; }

/* Zeroes b on the device (vk->lock held). */
static rlx_status fill_zero(struct rlx_vk_context *vk, struct rlx_vk_buf *b)
{
    RLX_TRY(xfer_begin(vk));
    vk->fn.vkCmdFillBuffer(vk->xfer_cmd, b->buf, 0, VK_WHOLE_SIZE, 0);
    return xfer_submit(vk);
}

rlx_status rlx_vk_buffer_alloc(void *ctx, struct rlx_buffer *b)
{
    struct rlx_vk_dev *d = ctx;
    struct rlx_vk_buf *vb;
    RLX_TRY(rlx_vk_buf_create(d->vk, b->size, false, !d->staging, &vb));
    rlx_status s = RLX_OK;
    if (vb->map) {
        memset(vb->map, 0, (size_t)vb->size);
    } else {
        pthread_mutex_lock(&d->vk->lock);
        s = fill_zero(d->vk, vb);
        pthread_mutex_unlock(&d->vk->lock);
    }
    if (s != RLX_OK) {
        rlx_vk_buf_destroy(d->vk, vb);
        return s;
    }
    b->data = NULL; /* device memory: kernels reach it through descriptors only */
    b->impl = vb;
    return RLX_OK;
}

void rlx_vk_buffer_release(void *ctx, struct rlx_buffer *b)
{
    struct rlx_vk_dev *d = ctx;
    rlx_vk_buf_destroy(d->vk, vbuf(b));
    b->data = b->impl = NULL;
}

rlx_status rlx_vk_upload(void *ctx, struct rlx_buffer *b, size_t offset, const void *src, size_t bytes)
{
    struct rlx_vk_dev *d = ctx;
    struct rlx_vk_context *vk = d->vk;
    struct rlx_vk_buf *vb = vbuf(b);
    RLX_TRY(rlx_vk_usable(vk));
    if (vb->map) {
        memcpy((char *)vb->map + offset, src, bytes);
        return RLX_OK;
    }
    pthread_mutex_lock(&vk->lock);
    size_t chunk, done = 0;
    rlx_status s = need_staging(vk, bytes, &chunk);
    while (s == RLX_OK && done < bytes) {
        const size_t n = bytes - done < chunk ? bytes - done : chunk;
        memcpy(vk->staging->map, (const char *)src + done, n);
        s = xfer_begin(vk);
        if (s == RLX_OK) {
            const VkBufferCopy region = {.srcOffset = 0, .dstOffset = offset + done, .size = n};
            vk->fn.vkCmdCopyBuffer(vk->xfer_cmd, vk->staging->buf, vb->buf, 1, &region);
            s = xfer_submit(vk);
        }
        done += n;
    }
    pthread_mutex_unlock(&vk->lock);
    return s;
}

rlx_status rlx_vk_download(void *ctx, const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes)
{
    struct rlx_vk_dev *d = ctx;
    struct rlx_vk_context *vk = d->vk;
    const struct rlx_vk_buf *vb = vbuf(b);
    RLX_TRY(rlx_vk_usable(vk));
    if (vb->map) {
        memcpy(dst, (const char *)vb->map + offset, bytes);
        return RLX_OK;
    }
    pthread_mutex_lock(&vk->lock);
    size_t chunk, done = 0;
    rlx_status s = need_staging(vk, bytes, &chunk);
    while (s == RLX_OK && done < bytes) {
        const size_t n = bytes - done < chunk ? bytes - done : chunk;
        s = xfer_begin(vk);
        if (s == RLX_OK) {
            const VkBufferCopy region = {.srcOffset = offset + done, .dstOffset = 0, .size = n};
            vk->fn.vkCmdCopyBuffer(vk->xfer_cmd, vb->buf, vk->staging->buf, 1, &region);
            s = xfer_submit(vk);
        }
        if (s == RLX_OK) memcpy((char *)dst + done, vk->staging->map, n);
        done += n;
    }
    pthread_mutex_unlock(&vk->lock);
    return s;
}

rlx_status rlx_vk_copy(void *ctx, struct rlx_buffer *dst, size_t dst_offset, const struct rlx_buffer *src,
                       size_t src_offset, size_t bytes)
{
    struct rlx_vk_dev *d = ctx;
    struct rlx_vk_context *vk = d->vk;
    struct rlx_vk_buf *vd = vbuf(dst);
    const struct rlx_vk_buf *vs = vbuf(src);
    RLX_TRY(rlx_vk_usable(vk));
    if (vd->map && vs->map) {
        memmove((char *)vd->map + dst_offset, (const char *)vs->map + src_offset, bytes);
        return RLX_OK;
    }
    if (vd == vs && dst_offset < src_offset + bytes && src_offset < dst_offset + bytes)
        return rlx_set_error(RLX_ERR_INTERNAL, "vulkan: an overlapping copy within one buffer");
    pthread_mutex_lock(&vk->lock);
    rlx_status s = xfer_begin(vk);
    if (s == RLX_OK) {
        const VkBufferCopy region = {.srcOffset = src_offset, .dstOffset = dst_offset, .size = bytes};
        vk->fn.vkCmdCopyBuffer(vk->xfer_cmd, vs->buf, vd->buf, 1, &region);
        s = xfer_submit(vk);
    }
    pthread_mutex_unlock(&vk->lock);
    return s;
}
