/*
 * registry.c - the list of backends compiled in, looked up by device name.
 */
#include <string.h>

#include "core/core.h"
#include "backends/backend.h"

static const struct rlx_backend *const backends[] = {&rlx_cpu_backend, &rlx_ref_backend};

const char *rlx_backends(void) { return "cpu,ref"; }

rlx_status rlx_backend_find(const char *name, const struct rlx_backend **out)
{
    for (size_t i = 0; name && i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(backends[i]->name, name) == 0) {
            *out = backends[i];
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_INVALID, "unknown device '%s' (this build has: %s)", name ? name : "(null)",
                         rlx_backends());
}

int64_t rlx_tensor_numel(const struct rlx_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
