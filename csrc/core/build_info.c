/*
 * build_info.c - facts about this build and the machine it runs on, as "key=value" lines:
 * the BLAS and its configuration and threads, the compiler and flags (passed in by setup.py),
 * the CPU instruction set the kernels dispatch to, and the backends compiled in.
 */
#include <cblas.h>
#include <stdio.h>

#include "core/core.h"

#ifndef RLX_BUILD_CC
#error "RLX_BUILD_CC must be defined by the build (setup.py)"
#endif
#ifndef RLX_BUILD_CFLAGS
#error "RLX_BUILD_CFLAGS must be defined by the build (setup.py)"
#endif
#ifndef RLX_BUILD_BLAS
#error "RLX_BUILD_BLAS must be defined by the build (setup.py)"
#endif

/* The best instruction set of the ones the kernels are compiled for (target_clones). */
static const char *cpu_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "avx512f";
    if (__builtin_cpu_supports("avx2")) return "avx2";
    return "x86-64";
}

const char *rlx_build_info(void)
{
    static _Thread_local char buf[1024];
    snprintf(buf, sizeof buf,
             "blas=%s\nblas_config=%s\nblas_threads=%d\ncc=%s\ncflags=%s\nisa=%s\nbackends=%s\n", RLX_BUILD_BLAS,
             openblas_get_config(), openblas_get_num_threads(), RLX_BUILD_CC, RLX_BUILD_CFLAGS, cpu_isa(),
             rlx_backends());
    return buf;
}
