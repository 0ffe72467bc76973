/*
 * backend.c (cpu) - the CPU backend: host memory, zero-copy for weights and inputs, the fast
 * kernel table (OpenBLAS GEMM, threaded kernels, per-ISA vector loops).
 */
#include <cblas.h>
#include <stdio.h>

#include "backends/cpu/cpu.h"
#include "backends/host.h"

#ifndef RLX_BUILD_BLAS
#error "RLX_BUILD_BLAS must be defined by the build (setup.py)"
#endif

static rlx_status cpu_plan_compile(void *ctx, const struct rlx_graph *g, void **state)
{
    (void)ctx, (void)g;
    return rlx_host_state_create(&rlx_cpu_kernels, state);
}

/* Block-type (GGUF) weights have no cpu kernels yet: refused at compile, naming the node. */
static bool cpu_supports_op(void *ctx, const struct rlx_graph *g, int id)
{
    const struct rlx_node *n = &g->nodes[id];
    const int w = n->op == RLX_OP_MATMUL ? 1 : n->op == RLX_OP_EMBEDDING ? 0 : n->op == RLX_OP_MATMUL_ID ? 2 : -1;
    if (w >= 0 && rlx_dtype_traits(g->nodes[n->in[w]].dtype)->block_size > 1) return false;
    return rlx_host_supports_op(ctx, g, id);
}

static const char *const isa_names[] = {
    [RLX_CPU_ISA_SCALAR] = "x86-64",
    [RLX_CPU_ISA_AVX2] = "avx2",
    [RLX_CPU_ISA_AVX512] = "avx512f",
    [RLX_CPU_ISA_AVX512_BF16] = "avx512f+bf16",
};

/* The BLAS, its configuration and threads, and the vector ISA the kernels dispatch to. */
static void cpu_describe(void *ctx, char *buf, size_t cap)
{
    (void)ctx;
    snprintf(buf, cap, "blas=%s\nblas_config=%s\nblas_threads=%d\nisa=%s\n", RLX_BUILD_BLAS, openblas_get_config(),
             openblas_get_num_threads(), isa_names[rlx_cpu_isa()]);
}

const struct rlx_backend rlx_cpu_backend = {
    .name = "cpu",
    .open = rlx_host_open,
    .close = rlx_host_close,
    .describe = cpu_describe,
    .supports_op = cpu_supports_op,
    .buffer_alloc = rlx_host_buffer_alloc,
    .buffer_wrap = rlx_host_buffer_wrap,
    .buffer_release = rlx_host_buffer_release,
    .upload = rlx_host_upload,
    .download = rlx_host_download,
    .copy = rlx_host_copy,
    .plan_compile = cpu_plan_compile,
    .plan_free = rlx_host_state_free,
    .plan_run = rlx_host_run,
};
