/*
 * attention.h - what attention.c (the dispatch, the portable loops, the split-key decode driver)
 * and attention_vec.c (the per-ISA kernels of attention_simd.inc, the flash prefill) share. Internal
 * to the cpu backend.
 */
#ifndef RLX_CPU_ATTENTION_H
#define RLX_CPU_ATTENTION_H

#include "backends/kernels.h"

#include <stdint.h>

/* Keys per chunk of the split-key decode path (the scores of a chunk are RLX_ATTN_CHUNK apart per
 * head). */
#define RLX_ATTN_CHUNK       64
/* Queries from which a call with vector kernels takes the flash path; keys per block of its items. */
#define RLX_ATTN_FLASH_MIN_S 8
#define RLX_ATTN_FLASH_BC    64

/* A software prefetch cursor of the decode loops (attention_simd.inc). */
struct attn_pf {
    const char *p;     /* next line */
    int64_t left, per; /* bytes left; lines per step */
};

/* One ISA's vector kernels (attention_simd.inc). */
struct attn_simd {
    /* decode: a chunk of n keys from c0, while the next nn rows are prefetched (scores: the key rows,
     * and with `first` the chunk's own value rows; values: the value rows) */
    void (*scores)(const struct rlx_attn_args *a, float *sc, int64_t c0, int64_t n, int64_t nn, int first);
    void (*values)(const struct rlx_attn_args *a, float *o, const float *p, int64_t c0, int64_t n, int64_t nn,
                   int skip_zero);
    void (*widen_rows)(const struct rlx_attn_args *a, const void *base, int64_t k0, int64_t n, int64_t np, int64_t g,
                       float *dst);
    void (*flash_scores)(float *St, const float *Kw, const float *Qt, int64_t np, int64_t D, int64_t M);
    void (*flash_softmax)(float *St, int64_t np, int64_t M, float *m, float *l, float *al);
    void (*flash_rescale)(float *Ot, const float *al, int64_t D, int64_t M);
    void (*flash_values)(float *Ot, const float *Vw, const float *P, int64_t np, int64_t D, int64_t M);
    float (*max_of)(const float *x, int64_t n);
    void (*scale_row)(float *x, float w, int64_t n);
    int64_t mr; /* rows of the microkernel tile: key blocks are padded to a multiple */
};

/* The vector kernels this call may use: AVX-512 or AVX2 (rlx_cpu_isa), head size a multiple of
 * 16; NULL means attention.c's portable loops. */
const struct attn_simd *rlx_cpu_attn_simd(const struct rlx_attn_args *a);

/* The flash path (attention_vec.c): out for S >= RLX_ATTN_FLASH_MIN_S with the kernels sd, in
 * rlx_pool_threads() slices of rlx_cpu_attn_flash_task_floats(a) floats of a->scratch. */
void rlx_cpu_attn_flash(const struct rlx_attn_args *a, const struct attn_simd *sd);
int64_t rlx_cpu_attn_flash_task_floats(const struct rlx_attn_args *a);

/* The flash path on AMX-BF16 tiles (attention_amx.c): whether this call takes it (rlx_cpu_isa() is
 * RLX_CPU_ISA_AMX, K / V f16 or bf16, D a multiple of 32, S x T large enough); the floats of one task's scratch for
 * items of up to M columns; the floats of scratch shared by the tasks, after theirs (0 where the
 * machine has no AMX); the call, with items of br query positions and at most Mmax columns, and
 * task_floats (>= rlx_cpu_attn_amx_task_floats) floats of scratch a pool thread. */
int rlx_cpu_attn_amx(const struct rlx_attn_args *a);
int64_t rlx_cpu_attn_amx_task_floats(int64_t M, int64_t D);
int64_t rlx_cpu_attn_amx_shared_floats(const struct rlx_attn_args *a);
void rlx_cpu_attn_flash_amx(const struct rlx_attn_args *a, int64_t br, int64_t Mmax, int64_t task_floats);

/* Asks the cache for kv head g's K and V rows [k0, k0 + n) (the flash path's next block: its rows
 * are a head segment apart, which the hardware prefetchers do not follow); n <= 0 asks for nothing. */
static inline void rlx_cpu_attn_prefetch_block(const struct rlx_attn_args *a, int64_t k0, int64_t n, int64_t g)
{
    const int64_t es = a->kv_dtype == RLX_F32 ? 4 : 2, seg = a->D * es, rs = a->Hkv * seg;
    const char *kp = (const char *)a->k + k0 * rs + g * seg, *vp = (const char *)a->v + k0 * rs + g * seg;
    for (int64_t c = 0; c < n; c++)
        for (int64_t b = 0; b < seg; b += 64) {
            __builtin_prefetch(kp + c * rs + b, 0, 2);
            __builtin_prefetch(vp + c * rs + b, 0, 2);
        }
}

/* The keys query i may see before the masks: [*lo, *hi). */
static inline void attn_visible(const struct rlx_attn_args *a, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t qpos = a->T - a->S + i;
    *lo = 0;
    *hi = a->T;
    if (a->causal && *hi > qpos + 1) *hi = qpos + 1;
    if (a->window > 0 && *lo < qpos - a->window + 1) *lo = qpos - a->window + 1;
}

#endif
