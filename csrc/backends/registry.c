/*
 * registry.c - the backends compiled in, looked up by device name, the devices that can be opened,
 * and the build facts (the compiler and flags, passed in by setup.py, then what each backend says
 * about itself). The only file outside a backend's folder that names the backends. A backend with
 * a `usable` entry (vulkan: a driver and a device it can run on) is listed by rlx_backends() only
 * when it is usable here, decided once per process; it can still be named, and opening it then
 * fails with its reason.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backends/backend.h"
#include "core/core.h"

#ifndef RLX_BUILD_CC
#error "RLX_BUILD_CC must be defined by the build (setup.py)"
#endif
#ifndef RLX_BUILD_CFLAGS
#error "RLX_BUILD_CFLAGS must be defined by the build (setup.py)"
#endif

static const struct rlx_backend *const backends[] = {
    &rlx_cpu_backend,
    &rlx_ref_backend,
#ifdef RLX_WITH_VULKAN
    &rlx_vulkan_backend,
#endif
};
#define N_BACKENDS (sizeof backends / sizeof backends[0])

static pthread_once_t usable_once = PTHREAD_ONCE_INIT;
static char usable_names[128];

static void find_usable(void)
{
    size_t len = 0;
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (!backends[i]->usable || backends[i]->usable())
            len += (size_t)snprintf(usable_names + len, sizeof usable_names - len, "%s%s", len ? "," : "",
                                    backends[i]->name);
}

const char *rlx_backends(void)
{
    pthread_once(&usable_once, find_usable);
    return usable_names;
}

size_t rlx_devices_describe(char *buf, size_t cap)
{
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < N_BACKENDS && len + 1 < cap; i++) {
        if (backends[i]->list_devices)
            backends[i]->list_devices(buf + len, cap - len);
        else
            snprintf(buf + len, cap - len, "name=%s\nbackend=%s\n\n", backends[i]->name, backends[i]->name);
        len += strlen(buf + len);
    }
    return len;
}

rlx_status rlx_backend_find(const char *name, const struct rlx_backend **out)
{
    for (size_t i = 0; name && i < N_BACKENDS; i++)
        if (strcmp(backends[i]->name, name) == 0) {
            *out = backends[i];
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_INVALID, "unknown device '%s' (this build has: %s)", name ? name : "(null)",
                         rlx_backends());
}

const char *rlx_build_info(void)
{
    static _Thread_local char buf[4096];
    size_t len = (size_t)snprintf(buf, sizeof buf, "cc=%s\ncflags=%s\nbackends=%s\n", RLX_BUILD_CC, RLX_BUILD_CFLAGS,
                                  rlx_backends());
    for (size_t i = 0; i < N_BACKENDS && len < sizeof buf; i++) {
        backends[i]->describe(NULL, buf + len, sizeof buf - len);
        len += strlen(buf + len);
    }
    return buf;
}

int64_t rlx_tensor_numel(const struct rlx_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
