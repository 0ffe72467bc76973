/*
 * backend.c (cpu) - the CPU backend: host memory, zero-copy for weights and inputs, the fast
 * kernel table (OpenBLAS GEMM, threaded kernels, per-ISA vector loops).
 */
#include <assert.h>
#include <cblas.h>
#include <stdio.h>

#include "backends/cpu/cpu.h"
#include "backends/host.h"

#ifndef RLX_BUILD_BLAS
#error "RLX_BUILD_BLAS must be defined by the build (setup.py)"
#endif

static rlx_status cpu_plan_compile(void *ctx, const struct rlx_graph *g, const struct rlx_compile_opts *opts,
                                   void **state)
{
    (void)ctx, (void)g;
    return rlx_host_state_create(&rlx_cpu_kernels, opts->batch_invariant, state);
}

static const char *const isa_names[] = {
    [RLX_CPU_ISA_SCALAR] = "x86-64",        [RLX_CPU_ISA_AVX2] = "avx2",
    [RLX_CPU_ISA_AVX512] = "avx512f",       [RLX_CPU_ISA_AVX512_BF16] = "avx512f+bf16",
    [RLX_CPU_ISA_AMX] = "avx512f+bf16+amx",
};
static_assert(sizeof isa_names / sizeof *isa_names == RLX_CPU_ISA_TOP + 1, "a name per ISA level");

/* The BLAS, its configuration and threads, the vector ISA the kernels dispatch to, and the integer
 * dot products the block-type (GGUF) kernels use (quant.c; "+amx-int8": the prefill GEMM and the
 * K types' batches on AMX tiles). */
static void cpu_describe(void *ctx, char *buf, size_t cap)
{
    (void)ctx;
    const int isa = rlx_cpu_isa();
    snprintf(buf, cap, "blas=%s\nblas_config=%s\nblas_threads=%d\nisa=%s\nquant=%s\n", RLX_BUILD_BLAS,
             openblas_get_config(), openblas_get_num_threads(), isa_names[isa],
             rlx_cpu_amx_int8()        ? "avx512-vnni+amx-int8"
             : rlx_cpu_avx512_vnni()   ? "avx512-vnni"
             : isa >= RLX_CPU_ISA_AVX2 ? "avx2"
                                       : "scalar");
}

const struct rlx_backend rlx_cpu_backend = {
    .name = "cpu",
    .open = rlx_host_open,
    .close = rlx_host_close,
    .describe = cpu_describe,
    .supports_op = rlx_host_supports_op,
    .buffer_alloc = rlx_host_buffer_alloc,
    .buffer_wrap = rlx_host_buffer_wrap,
    .buffer_release = rlx_host_buffer_release,
    .buffer_settle = rlx_host_buffer_settle,
    .buffer_discard = rlx_host_buffer_discard,
    .upload = rlx_host_upload,
    .download = rlx_host_download,
    .copy = rlx_host_copy,
    .plan_compile = cpu_plan_compile,
    .plan_free = rlx_host_state_free,
    .plan_run = rlx_host_run,
    .plan_share_workspace = rlx_host_share_workspace,
};
