/*
 * backend.c - the Vulkan backend's vtable: "vulkan" opens the preferred usable device (a discrete
 * GPU before an integrated one, before a CPU implementation such as lavapipe), "vulkan:N" physical
 * device N. Options follow, comma separated: "staging" (device memory is never mapped: every
 * transfer goes through a staging buffer, as on a discrete GPU) and "range=BYTES" (bindings span
 * at most that many bytes, so that the split of big tensors is tested on small ones). Each open
 * device references its physical device's shared context (context.c). Also what the backend says
 * about itself (build info, devices, one device). Never prints.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/record.h"
#include "core/core.h"

/* A non-negative decimal number, all of s. */
static bool parse_u64(const char *s, uint64_t *out)
{
    if (!*s || *s < '0' || *s > '9') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno) return false;
    *out = v;
    return true;
}

static rlx_status parse_arg(const char *arg, int *index, bool *staging, uint64_t *range)
{
    char buf[64];
    if (!arg) return RLX_OK;
    if (strlen(arg) >= sizeof buf)
        return rlx_set_error(RLX_ERR_INVALID, "vulkan: device options '%s' are too long", arg);
    strcpy(buf, arg);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (parse_u64(tok, &v) && v < RLX_VK_MAX_DEVICES)
            *index = (int)v;
        else if (strcmp(tok, "staging") == 0)
            *staging = true;
        else if (strncmp(tok, "range=", 6) == 0 && parse_u64(tok + 6, &v) && v >= 1024)
            *range = v;
        else
            return rlx_set_error(RLX_ERR_INVALID,
                                 "vulkan: unknown device option '%s' (expected a device index below "
                                 "%d, 'staging' or 'range=BYTES' with BYTES >= 1024)",
                                 tok, RLX_VK_MAX_DEVICES);
    }
    return RLX_OK;
}

static rlx_status vk_open(const char *arg, void **ctx)
{
    int index = -1;
    bool staging = false;
    uint64_t range = 0;
    RLX_TRY(parse_arg(arg, &index, &staging, &range));
    struct rlx_vk_dev *d = rlx_calloc(1, sizeof *d);
    if (!d) return RLX_ERR_NOMEM;
    rlx_status s = rlx_vk_context_acquire(index, &d->vk);
    if (s != RLX_OK) {
        free(d);
        return s;
    }
    d->staging = staging;
    d->max_range = d->vk->info.max_storage_range;
    if (range && range < d->max_range) d->max_range = range;
    *ctx = d;
    return RLX_OK;
}

static void vk_close(void *ctx)
{
    struct rlx_vk_dev *d = ctx;
    if (!d) return;
    rlx_vk_context_release(d->vk);
    free(d);
}

/* ---- what it says about itself -------------------------------------------------------------- */

/* Appends printf-style text to buf (len: what is there; stops at cap). */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n < cap - *len ? (size_t)n : cap - *len - 1;
}

/* What a physical device offers, one "key=value" line each, keys prefixed with `pre`. */
static void put_info(char *buf, size_t cap, size_t *len, const char *pre, const struct rlx_vk_info *in)
{
    put(buf, cap, len, "%sdevice=%s\n%sdriver=%s\n%stype=%s\n%spci_id=%04x:%04x\n%sapi=%u.%u.%u\n%ssubgroup_size=%u\n",
        pre, in->name, pre, in->driver, pre, in->type, pre, in->vendor_id, in->device_id, pre,
        VK_API_VERSION_MAJOR(in->api_version), VK_API_VERSION_MINOR(in->api_version),
        VK_API_VERSION_PATCH(in->api_version), pre, in->subgroup_size);
    put(buf, cap, len, "%sdevice_memory_bytes=%llu\n%sdevice_memory_host_visible=%s\n%smax_storage_buffer_range=%u\n",
        pre, (unsigned long long)in->device_local_bytes, pre, in->device_local_host_visible ? "yes" : "no", pre,
        in->max_storage_range);
    put(buf, cap, len, "%sstorage_offset_alignment=%llu\n%smax_workgroup_invocations=%u\n%smax_shared_memory=%u\n", pre,
        (unsigned long long)in->storage_align, pre, in->max_wg_invocations, pre, in->max_shared);
    put(buf, cap, len, "%smax_allocation=%llu\n%stimestamps=%s\n", pre, (unsigned long long)in->max_alloc, pre,
        in->timestamps ? "yes" : "no");
}

static void put_validation(char *buf, size_t cap, size_t *len, const char *prefix, bool on)
{
    char last[512];
    rlx_vk_validation_last(last, sizeof last);
    put(buf, cap, len, "%svalidation=%s\n%svalidation_messages=%llu\n%svalidation_last=%s\n", prefix, on ? "on" : "off",
        prefix, (unsigned long long)rlx_vk_validation_messages(), prefix, last);
}

static void vk_describe(void *ctx, char *buf, size_t cap)
{
    size_t len = 0;
    if (cap) buf[0] = '\0';
    if (!ctx) { /* build info: whether Vulkan is usable here, and the validation count */
        const struct rlx_vk_probe *p = rlx_vk_probe();
        if (p->preferred >= 0) {
            put(buf, cap, &len, "vulkan=%s\n", p->dev[p->preferred].name);
            put_info(buf, cap, &len, "vulkan_", &p->dev[p->preferred]);
        } else {
            put(buf, cap, &len, "vulkan=unavailable: %s\n", p->why_none);
        }
        const char *env = getenv("RLX_VULKAN_VALIDATION");
        put_validation(buf, cap, &len, "vulkan_", env && *env && strcmp(env, "0") != 0);
        return;
    }
    const struct rlx_vk_dev *d = ctx;
    put_info(buf, cap, &len, "", &d->vk->info);
    put(buf, cap, &len, "binding_range=%llu\ntransfers=%s\n", (unsigned long long)d->max_range,
        d->staging || !d->vk->info.device_local_host_visible ? "staged" : "mapped");
    put_validation(buf, cap, &len, "", d->vk->validation);
}

static void vk_list_devices(char *buf, size_t cap)
{
    const struct rlx_vk_probe *p = rlx_vk_probe();
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < p->n; i++) {
        if (!p->dev[i].usable) continue;
        put(buf, cap, &len, "name=vulkan:%d\nbackend=vulkan\ndefault=%s\n", i, i == p->preferred ? "yes" : "no");
        put_info(buf, cap, &len, "", &p->dev[i]);
        put(buf, cap, &len, "\n");
    }
}

static bool vk_usable(void) { return rlx_vk_probe()->preferred >= 0; }

const struct rlx_backend rlx_vulkan_backend = {
    .name = "vulkan",
    .open = vk_open,
    .close = vk_close,
    .describe = vk_describe,
    .supports_op = rlx_vk_supports_op,
    .buffer_alloc = rlx_vk_buffer_alloc,
    .buffer_wrap = NULL,
    .buffer_release = rlx_vk_buffer_release,
    .upload = rlx_vk_upload,
    .download = rlx_vk_download,
    .copy = rlx_vk_copy,
    .plan_compile = rlx_vk_plan_compile,
    .plan_free = rlx_vk_plan_free,
    .plan_run = rlx_vk_plan_run,
    .list_devices = vk_list_devices,
    .usable = vk_usable,
};
