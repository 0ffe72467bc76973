/*
 * ref_backend.c - the reference backend: plain scalar kernels and buffers of its own. It accepts
 * no caller memory (no buffer_wrap), so every weight and input crosses upload/download exactly
 * as it would for a device with separate memory. It is the in-C oracle for the fast kernels and
 * the proof that such a backend plugs in without touching the IR or the passes. Never fast.
 */
#include "backends/host.h"

static rlx_status ref_plan_compile(const struct rlx_graph *g, void **state)
{
    (void)g;
    return rlx_host_state_create(&rlx_ref_kernels, state);
}

const struct rlx_backend rlx_ref_backend = {
    .name = "ref",
    .supports_op = rlx_host_supports_op,
    .buffer_alloc = rlx_host_buffer_alloc,
    .buffer_wrap = NULL,
    .buffer_free = rlx_host_buffer_free,
    .upload = rlx_host_upload,
    .download = rlx_host_download,
    .plan_compile = ref_plan_compile,
    .plan_free = rlx_host_state_free,
    .plan_run = rlx_host_run,
};
