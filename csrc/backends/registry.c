/*
 * registry.c - the backends compiled in, looked up by device name, and the build facts (the
 * compiler and flags, passed in by setup.py, then what each backend says about itself). The only
 * file outside a backend's folder that names the backends.
 */
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

static const struct rlx_backend *const backends[] = {&rlx_cpu_backend, &rlx_ref_backend};
#define N_BACKENDS (sizeof backends / sizeof backends[0])

const char *rlx_backends(void) { return "cpu,ref"; }

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
    static _Thread_local char buf[2048];
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
