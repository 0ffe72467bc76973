/*
 * backend.c (cpu) - the CPU backend: host memory, zero-copy for weights and inputs, the fast
 * kernel table (OpenBLAS GEMM, threaded kernels).
 */
#include "backends/host.h"

static rlx_status cpu_plan_compile(const struct rlx_graph *g, void **state)
{
    (void)g;
    return rlx_host_state_create(&rlx_cpu_kernels, state);
}

const struct rlx_backend rlx_cpu_backend = {
    .name = "cpu",
    .supports_op = rlx_host_supports_op,
    .buffer_alloc = rlx_host_buffer_alloc,
    .buffer_wrap = rlx_host_buffer_wrap,
    .buffer_free = rlx_host_buffer_free,
    .upload = rlx_host_upload,
    .download = rlx_host_download,
    .plan_compile = cpu_plan_compile,
    .plan_free = rlx_host_state_free,
    .plan_run = rlx_host_run,
};
