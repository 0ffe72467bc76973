/*
 * ref_backend.c - the reference backend: plain scalar kernels and buffers of its own. It accepts
 * no caller memory (no buffer_wrap), so every weight and input crosses upload/download exactly
 * as it would for a device with separate memory; its byte counters are what tests read to prove
 * what crosses per step. It is the in-C oracle for the fast kernels and the proof that such a
 * backend plugs in without touching the IR or the passes. Never fast.
 */
#include <stdio.h>

#include "backends/host.h"

static rlx_status ref_plan_compile(void *ctx, const struct rlx_graph *g, const struct rlx_compile_opts *opts,
                                   void **state)
{
    (void)ctx, (void)g;
    return rlx_host_state_create(&rlx_ref_kernels, opts->batch_invariant, state);
}

static void ref_describe(void *ctx, char *buf, size_t cap)
{
    (void)ctx;
    if (cap) buf[0] = '\0';
}

const struct rlx_backend rlx_ref_backend = {
    .name = "ref",
    .open = rlx_host_open,
    .close = rlx_host_close,
    .describe = ref_describe,
    .supports_op = rlx_host_supports_op,
    .buffer_alloc = rlx_host_buffer_alloc,
    .buffer_wrap = NULL,
    .buffer_release = rlx_host_buffer_release,
    .buffer_settle = rlx_host_buffer_settle,
    .buffer_discard = rlx_host_buffer_discard,
    .upload = rlx_host_upload,
    .download = rlx_host_download,
    .copy = rlx_host_copy,
    .plan_compile = ref_plan_compile,
    .plan_free = rlx_host_state_free,
    .plan_run = rlx_host_run,
    .plan_share_workspace = rlx_host_share_workspace,
};
