/*
 * device.c - devices: an open instance of a backend, and the counted buffer operations that every
 * part of the core outside backends/ uses. The counters (bytes uploaded, downloaded and copied,
 * bytes allocated and wrapped) are atomics: one device serves plans, weight stores and KV caches
 * used from several threads. Never prints; a device freed while buffers are alive is a bug of the
 * caller and trips an assert.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/core.h"

rlx_status rlx_device_open(const char *name, struct rlx_device **out)
{
    if (!name) return rlx_set_error(RLX_ERR_INVALID, "device: no name");
    const char *colon = strchr(name, ':');
    size_t len = colon ? (size_t)(colon - name) : strlen(name);
    char base[32];
    if (len >= sizeof base)
        return rlx_set_error(RLX_ERR_INVALID, "unknown device '%s' (this build has: %s)", name, rlx_backends());
    memcpy(base, name, len);
    base[len] = '\0';
    const struct rlx_backend *be;
    RLX_TRY(rlx_backend_find(base, &be));
    struct rlx_device *d = rlx_calloc(1, sizeof *d);
    if (!d) return RLX_ERR_NOMEM;
    d->be = be;
    snprintf(d->name, sizeof d->name, "%s", strlen(name) < sizeof d->name ? name : base);
    rlx_status s = be->open(colon ? colon + 1 : NULL, &d->ctx);
    if (s != RLX_OK) {
        free(d);
        return s;
    }
    *out = d;
    return RLX_OK;
}

void rlx_device_free(struct rlx_device *d)
{
    if (!d) return;
    assert(atomic_load(&d->live_buffers) == 0 && "a device freed before the plans, weights or caches made on it");
    d->be->close(d->ctx);
    free(d);
}

const char *rlx_device_name(const struct rlx_device *d) { return d->name; }

void rlx_device_stats(const struct rlx_device *d, struct rlx_device_stats *out)
{
    out->upload_bytes = atomic_load(&d->upload_bytes);
    out->download_bytes = atomic_load(&d->download_bytes);
    out->copy_bytes = atomic_load(&d->copy_bytes);
    out->uploads = atomic_load(&d->uploads);
    out->downloads = atomic_load(&d->downloads);
    out->allocated_bytes = atomic_load(&d->allocated_bytes);
    out->wrapped_bytes = atomic_load(&d->wrapped_bytes);
}

bool rlx_device_zero_copy(const struct rlx_device *d) { return rlx_dev_can_wrap(d); }

size_t rlx_device_describe(const struct rlx_device *d, char *buf, size_t cap)
{
    if (cap) buf[0] = '\0';
    d->be->describe(d->ctx, buf, cap);
    return strlen(buf);
}

/* ---- counted buffer operations ------------------------------------------------------------ */

rlx_status rlx_dev_alloc(struct rlx_device *d, size_t bytes, struct rlx_buffer **out)
{
    struct rlx_buffer *b = rlx_calloc(1, sizeof *b);
    if (!b) return RLX_ERR_NOMEM;
    b->size = bytes;
    rlx_status s = d->be->buffer_alloc(d->ctx, b);
    if (s != RLX_OK) {
        free(b);
        return s;
    }
    atomic_fetch_add(&d->allocated_bytes, bytes);
    atomic_fetch_add(&d->live_buffers, 1);
    *out = b;
    return RLX_OK;
}

bool rlx_dev_settle(struct rlx_device *d, struct rlx_buffer *b, size_t bytes, bool move)
{
    return b && !b->wrapped && d->be->buffer_settle && d->be->buffer_settle(d->ctx, b, bytes, move);
}

bool rlx_dev_settles(const struct rlx_device *d) { return d->be->buffer_settle != NULL; }

void rlx_dev_discard(struct rlx_device *d, struct rlx_buffer *b, size_t offset, size_t bytes)
{
    if (b && !b->wrapped && d->be->buffer_discard && offset <= b->size && bytes <= b->size - offset)
        d->be->buffer_discard(d->ctx, b, offset, bytes);
}

bool rlx_dev_can_wrap(const struct rlx_device *d) { return d->be->buffer_wrap != NULL; }

rlx_status rlx_dev_wrap(struct rlx_device *d, const void *host, size_t bytes, struct rlx_buffer **inout)
{
    if (!d->be->buffer_wrap)
        return rlx_set_error(RLX_ERR_UNSUPPORTED, "device '%s' cannot use host memory in place", d->name);
    struct rlx_buffer *b = *inout;
    if (b && !b->wrapped) return rlx_set_error(RLX_ERR_INTERNAL, "re-pointing an owned buffer");
    if (b) {
        d->be->buffer_release(d->ctx, b);
        atomic_fetch_sub(&d->wrapped_bytes, b->size);
    } else {
        b = rlx_calloc(1, sizeof *b);
        if (!b) return RLX_ERR_NOMEM;
        atomic_fetch_add(&d->live_buffers, 1);
        *inout = b;
    }
    b->size = bytes;
    b->wrapped = true;
    rlx_status s = d->be->buffer_wrap(d->ctx, b, host);
    if (s != RLX_OK) {
        b->size = 0; /* released state: freeing it is still fine */
        b->data = b->impl = NULL;
        return s;
    }
    atomic_fetch_add(&d->wrapped_bytes, bytes);
    return RLX_OK;
}

void rlx_dev_free(struct rlx_device *d, struct rlx_buffer *b)
{
    if (!b) return;
    d->be->buffer_release(d->ctx, b);
    atomic_fetch_sub(b->wrapped ? &d->wrapped_bytes : &d->allocated_bytes, b->size);
    atomic_fetch_sub(&d->live_buffers, 1);
    free(b);
}

static rlx_status check_range(const struct rlx_buffer *b, size_t offset, size_t bytes, const char *what)
{
    if (offset > b->size || bytes > b->size - offset)
        return rlx_set_error(RLX_ERR_INTERNAL, "%s of %zu bytes at %zu overruns a %zu-byte buffer", what, bytes, offset,
                             b->size);
    return RLX_OK;
}

rlx_status rlx_dev_upload(struct rlx_device *d, struct rlx_buffer *b, size_t offset, const void *src, size_t bytes)
{
    RLX_TRY(check_range(b, offset, bytes, "upload"));
    if (b->wrapped) return rlx_set_error(RLX_ERR_INTERNAL, "upload into a wrapped (read-only) buffer");
    if (!bytes) return RLX_OK;
    RLX_TRY(d->be->upload(d->ctx, b, offset, src, bytes));
    atomic_fetch_add(&d->upload_bytes, bytes);
    atomic_fetch_add(&d->uploads, 1);
    return RLX_OK;
}

rlx_status rlx_dev_download(struct rlx_device *d, const struct rlx_buffer *b, size_t offset, void *dst, size_t bytes)
{
    RLX_TRY(check_range(b, offset, bytes, "download"));
    if (!bytes) return RLX_OK;
    RLX_TRY(d->be->download(d->ctx, b, offset, dst, bytes));
    atomic_fetch_add(&d->download_bytes, bytes);
    atomic_fetch_add(&d->downloads, 1);
    return RLX_OK;
}

rlx_status rlx_dev_copy(struct rlx_device *d, struct rlx_buffer *dst, size_t dst_offset, const struct rlx_buffer *src,
                        size_t src_offset, size_t bytes)
{
    RLX_TRY(check_range(dst, dst_offset, bytes, "copy"));
    RLX_TRY(check_range(src, src_offset, bytes, "copy"));
    if (dst->wrapped) return rlx_set_error(RLX_ERR_INTERNAL, "copy into a wrapped (read-only) buffer");
    if (!bytes) return RLX_OK;
    RLX_TRY(d->be->copy(d->ctx, dst, dst_offset, src, src_offset, bytes));
    atomic_fetch_add(&d->copy_bytes, bytes);
    return RLX_OK;
}

rlx_status rlx_dev_place(struct rlx_device *d, const void *data, size_t bytes, struct rlx_buffer **buf, size_t *cap)
{
    if (rlx_dev_can_wrap(d)) return rlx_dev_wrap(d, data, bytes, buf);
    if (!*buf || *cap < bytes) {
        struct rlx_buffer *nb;
        RLX_TRY(rlx_dev_alloc(d, bytes, &nb));
        rlx_dev_free(d, *buf);
        *buf = nb;
        *cap = bytes;
    }
    return rlx_dev_upload(d, *buf, 0, data, bytes);
}
