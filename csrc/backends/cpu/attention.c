/*
 * attention.c - the cpu table's grouped-query attention: S queries (positions T-S .. T-1) over the
 * T keys and values of positions 0 .. T-1 (a KV cache, or the new rows alone), stored f32, f16 or
 * bf16; three paths by the number of queries S.
 *
 * K/V dtypes: f32 rows are read in place; f16 / bf16 rows are widened exactly to f32 (F16C / a
 * shift) as they are used, so the cache is read once at its stored width (half the bytes of f32 at
 * long context) and the arithmetic is the f32 arithmetic of the f32 path.
 *
 * The vector paths (attention_vec.c: attention_simd.inc compiled for AVX-512 and for AVX2, chosen
 * per call by rlx_cpu_isa(); head size D a multiple of 16) take decode and prefill; the portable
 * loops below take the rest (no AVX2, odd D) and are the same functions as before those paths
 * existed.
 *
 * Prefill and extension on the vector paths (S >= RLX_ATTN_FLASH_MIN_S): tiled flash attention on
 * the pool. A work item is one kv head and one block of query positions; its G query heads
 * make the columns of the tile, so the group shares every key and value row it reads: M = G x
 * rows ~ RLX_ATTN_FLASH_M columns (padded to 32). The item keeps Qt (D, M: the queries, scaled,
 * transposed), Ot (D, M: its output so far), m, l (M: the running max and sum) in its task's
 * scratch, and walks the keys it may see (up to its last row's position, from its first row's
 * window start) in blocks of RLX_ATTN_FLASH_BC: the block's K and V rows are widened into
 * scratch (Kw, Vw), St (Bc, M) = Kw @ Qt and Ot += Vw^T @ P are register-tiled microkernels
 * (8 x 32 on AVX-512, 4 x 16 on AVX2; broadcast one operand, two vector loads of the other),
 * and between them the online softmax runs down the columns of St (vector max, the vector exp,
 * rescale of Ot and l by exp(old max - new max)). Blocks that reach past the causal diagonal,
 * the window or into masks get their invisible scores set to -inf first. Items go to the pool's
 * threads through a shared counter, the last query blocks (the most keys under a causal mask)
 * first, so the threads finish together; the next block's rows are prefetched (a head segment
 * per row, which the hardware prefetchers do not follow). OpenBLAS is not called: before this
 * path, its sgemms ran on OpenBLAS's threads, which keep spinning after each call and took a
 * core from the next projection on the pool (Llama-3.2-1B bf16 pp128, 2 threads: 129-136 tok/s,
 * 151-156 with OpenBLAS capped at one thread). Measured (one thread, thread CPU time, f16 K / V,
 * causal S = T; machine shared, load average ~4): Qwen3 shape (16 / 8 heads, D = 128) 65 -> 80
 * GFLOP/s at T = 1024-4096, Llama 3.2 shape (32 / 8, D = 64) 60 -> 75 (OpenBLAS sgemm before).
 * Where the CPU has AMX-BF16 and K / V are f16 or bf16 (D a multiple of 32), the items run on bf16
 * tiles instead, every operand split into a bf16 hi + lo pair so that the products keep 16 bits of
 * Q and P and all of K and V (attention_amx.c: its header says how, and what it measured).
 *
 * Prefill and extension otherwise (S >= RLX_ATTN_GEMM_MIN_S): through sgemm. Per kv head, per
 * block of `rows` query positions, per query head of the kv head's group: scores (rows, W) =
 * scale * Q_blk @ K^T by sgemm into scratch, then a row softmax (causal / window bounds, masks,
 * max subtracted, the vector exp; a row with nothing visible gives zeros), then out_blk =
 * weights @ V by sgemm written straight into out, then each out row scaled by 1 / its sum. Q and
 * out are read and written in place (rows Hq * D floats apart, which sgemm takes as leading
 * dimensions); f32 K / V too (rows Hkv * D apart); f16 / bf16 K / V blocks are widened first into
 * scratch (W rows of D, once per kv head and query block, shared by the group). A block only gets
 * the keys its rows may see: up to its last row's position (causal), from its first row's window
 * start (window). rows = min(64, RLX_ATTN_GEMM_FLOATS / T), at least 8, so the scores stay <=
 * ~4 MiB. sgemm multiplies every value row of the range, masked ones by their weight 0: here a row
 * a u8 mask hides must be finite (kv.h: a cache's rows past its length are), unlike on the other
 * paths, which skip it (flash zeroes a row no query of its item sees; tests/c/test_attention.c).
 * Threads: OpenBLAS's own threads inside each sgemm; the sgemms run on the calling thread, never
 * inside a pool task (that would run OpenBLAS's threads on top of ours).
 *
 * Small S (1 < S < RLX_ATTN_GEMM_MIN_S, and S == 1 with too many heads for the split path): one
 * (query i, head h) pair is scored against its visible keys (dot products), softmaxed with the
 * max subtracted, and its output accumulated as a weighted sum of value rows; the two loops over
 * key rows (scores, weighted sum) are compiled per ISA.
 *
 * Decode (one query, S == 1) takes another path that reads the KV cache once: the visible keys are
 * split into one contiguous range per task (at least RLX_ATTN_SPLIT_MIN_KEYS keys each), every head
 * is scored against each key row (chunks of RLX_ATTN_CHUNK keys: scores, then an online softmax per
 * head, then the value rows), and the tasks' partials (max, sum, weighted values per head) are
 * merged by the caller, flash-decoding style. Each task's partial lives in its own
 * RLX_ATTN_PART_FLOATS of scratch; heads too many for that fall back to the per-head path. The
 * vector loops take four keys at a time: two or four query heads of a kv head against four key rows
 * (eight or sixteen accumulators, one 4-way horizontal sum per head), and each vector of the output
 * loaded and stored once per four value rows. They read four rows' head segments in turn, an order
 * DRAM serves at a third of its bandwidth (one thread: 12 GB/s against 33 GB/s front to back), so
 * while a chunk is computed the next chunk's rows are prefetched into L2 front to back, a few lines
 * per step. Measured (one thread, thread CPU time, f16 cache, T = 4096-32768, machine shared):
 * Qwen3 shape 10 -> 23 GB/s of K + V (the probe reads 28-33 GB/s), Llama 3.2 shape (twice the
 * multiply-adds per byte: G = 4, D = 64; compute-bound) 5 -> 13 GB/s; in the model, Qwen3-0.6B bf16
 * at 2048 positions: the step's attention 36 -> 12 ms. A task's first chunk, which nothing
 * prefetched, has its value rows prefetched while its scores are computed (Zen 5, Qwen3 shape,
 * f16, cold cache: 128 keys 33-34 -> 27-29 us a call at one thread, 25-31 -> 19-22 at two; 1024
 * keys within the noise), and its own key rows from the fifth on, at twice the pace the scores
 * read them (Zen 4, Qwen3-0.6B Q4_K_M in the model, one thread, the step's attention, median of
 * 40 steps, six alternating pairs of builds: 128 positions 1.26-1.75 -> 1.12-1.25 ms, 512 within
 * the noise; two threads 128 positions 1.04-1.14 -> 0.96-1.14; Llama-3.2-1B within the noise).
 * Tried and left out: the value rows weighed per kv head with the group's outputs held in
 * registers across the chunk (each output vector loaded and stored once a chunk): 13-15 % faster
 * cache-resident, no faster from DRAM at 128 keys, 10 % slower at 1024 keys on one thread (its
 * walk down a head's column of rows defeats the prefetchers).
 *
 * Threading and scratch (per-pair path): pairs come in blocks, one block per (query, kv head)
 * holding the Hq/Hkv query heads that read the same key/value rows (so the second head finds
 * them in cache). Blocks are dealt round-robin to `ntasks` tasks (ntasks <= rlx_pool_threads(),
 * fewer when the work is small), so causal rows of unequal length balance.
 * rlx_parallel_for runs over the task ids [0, ntasks), and task t keeps its scores (T floats) and
 * its widened row (D floats) in its own slice of scratch: slices are owned by task id, not by
 * thread or chunk, so they stay distinct however the pool groups task ids into chunks (or runs
 * them all inline). The caller must not raise the thread count between sizing the scratch
 * (rlx_cpu_attention_scratch) and calling the kernel. Must never allocate.
 */
#include "backends/cpu/attention.h"
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

typedef float attn_v8 __attribute__((vector_size(32)));
typedef float attn_v4 __attribute__((vector_size(16)));

/* The floats of scratch each task of the split-key decode path may use for its partial result:
 * m, l (Hq each), o (Hq * D), a chunk of scores (Hq * RLX_ATTN_CHUNK) and one widened key / value
 * row (Hkv * D). */
#define RLX_ATTN_PART_FLOATS 32768

/* The fewest keys a task of the split-key decode path takes. It was a whole chunk (64): below 128
 * keys a step then ran on one thread, which a batch of short sequences does once per sequence and
 * layer (Qwen3-0.6B Q4_K_M, 8 sequences of 32..96 positions, 2 threads: the step's attention
 * 9.4-11.6 -> 6.1-8.7 ms in three alternating pairs; one call at 64 positions, L3-resident, 11.5
 * -> 8.0 us). */
#define RLX_ATTN_SPLIT_MIN_KEYS 16

/* Sum of the 16 lanes of *v by halving (8 + 8, 4 + 4, then pairs): a few shuffles instead of a
 * 16-long chain of dependent adds, which cost as much as the dot product itself at D = 128. */
static inline __attribute__((always_inline)) float hsum16(const rlx_cpu_v16 *v)
{
    attn_v8 lo, hi;
    memcpy(&lo, v, sizeof lo);
    memcpy(&hi, (const char *)v + sizeof lo, sizeof hi);
    lo += hi;
    attn_v4 a, b;
    memcpy(&a, &lo, sizeof a);
    memcpy(&b, (const char *)&lo + sizeof a, sizeof b);
    a += b;
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/* A key / value row of D elements of kv head kvh at row j of the (T, Hkv, D) array base, as f32:
 * in place for f32, else widened into buf (D floats). */
static inline const float *kv_row(const struct rlx_attn_args *a, const void *base, int64_t j, int64_t kvh, float *buf)
{
    const int64_t off = (j * a->Hkv + kvh) * a->D;
    if (a->kv_dtype == RLX_F32) return (const float *)base + off;
    rlx_cpu_widen(buf, (const uint16_t *)base + off, a->kv_dtype, a->D);
    return buf;
}

/* scale * q (D) . k (D) */
RLX_CLONES
static float dot_scaled(const float *q, const float *k, int64_t D, float scale)
{
    rlx_cpu_v16 acc0 = {0}, acc1 = {0};
    int64_t e = 0;
    for (; e + 32 <= D; e += 32) {
        rlx_cpu_v16 q0, k0, q1, k1;
        memcpy(&q0, q + e, sizeof q0);
        memcpy(&k0, k + e, sizeof k0);
        memcpy(&q1, q + e + 16, sizeof q1);
        memcpy(&k1, k + e + 16, sizeof k1);
        acc0 += q0 * k0;
        acc1 += q1 * k1;
    }
    for (; e + 16 <= D; e += 16) {
        rlx_cpu_v16 q0, k0;
        memcpy(&q0, q + e, sizeof q0);
        memcpy(&k0, k + e, sizeof k0);
        acc0 += q0 * k0;
    }
    acc0 += acc1;
    float s = hsum16(&acc0);
    for (; e < D; e++) s += q[e] * k[e];
    return scale * s;
}

/* o (D) += w * v (D) */
RLX_CLONES
static void axpy(float *o, float w, const float *v, int64_t D)
{
    int64_t e = 0;
    for (; e + 16 <= D; e += 16) {
        rlx_cpu_v16 ov, vv;
        memcpy(&ov, o + e, sizeof ov);
        memcpy(&vv, v + e, sizeof vv);
        ov += w * vv;
        memcpy(o + e, &ov, sizeof ov);
    }
    for (; e < D; e++) o[e] += w * v[e];
}

/* p[j] = exp(p[j] - m) for j < n (-inf gives 0); returns their sum. 16 lanes through
 * rlx_cpu_exp16, whole vectors loaded and stored directly, the tail through a vector padded with
 * -inf (rlx_cpu_load16_part). */
RLX_CLONES
static float exp_sum(float *p, int64_t n, float m)
{
    rlx_cpu_v16 sum = {0};
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t len = n - j < 16 ? n - j : 16;
        rlx_cpu_v16 v = {0};
        v -= INFINITY;
        rlx_cpu_load16_part(&v, p + j, len);
        v -= m;
        rlx_cpu_exp16(&v);
        sum += v;
        rlx_cpu_store16_part(p + j, &v, len);
    }
    return hsum16(&sum);
}

/* out[i, h] (D) = sum_j softmax_j(scale * q[i, h] . k_j + mask) v_j over the keys visible to i;
 * sc: T floats of scratch, row: D floats (a widened key / value row). */
static void attend_one(const struct rlx_attn_args *a, int64_t i, int64_t h, float *sc, float *row)
{
    const int64_t D = a->D, kvh = h / (a->Hq / a->Hkv);
    const float *q = a->q + (i * a->Hq + h) * D;
    float *o = a->out + (i * a->Hq + h) * D;
    int64_t lo, hi;
    attn_visible(a, i, &lo, &hi);
    memset(o, 0, (size_t)D * sizeof(float));
    if (lo >= hi) return;
    const float *mf = a->mask_f32 ? a->mask_f32 + i * a->T : NULL;
    const uint8_t *mu = a->mask_u8 ? a->mask_u8 + i * a->T : NULL;
    float m = -INFINITY;
    for (int64_t j = lo; j < hi; j++) {
        if (mu && !mu[j]) {
            sc[j] = -INFINITY;
            continue;
        }
        sc[j] = dot_scaled(q, kv_row(a, a->k, j, kvh, row), D, a->scale);
        if (mf) sc[j] += mf[j];
        m = sc[j] > m ? sc[j] : m;
    }
    if (m == -INFINITY) return; /* nothing visible: zeros */
    const float sum = exp_sum(sc + lo, hi - lo, m);
    for (int64_t j = lo; j < hi; j++)
        if (sc[j] != 0.0f) /* masked keys (weight 0) are skipped: their rows may hold anything */
            axpy(o, sc[j], kv_row(a, a->v, j, kvh, row), D);
    const float inv = 1.0f / sum;
    for (int64_t e = 0; e < D; e++) o[e] *= inv;
}

/* ---------------------------------------------------------------------------------------------
 * Decode (S == 1): keys split across tasks, every head at once
 * ------------------------------------------------------------------------------------------- */

/* A whole key / value row (Hkv * D) of row j as f32: in place, or widened into buf. */
static inline const float *kv_full_row(const struct rlx_attn_args *a, const void *base, int64_t j, float *buf)
{
    const int64_t n = a->Hkv * a->D;
    if (a->kv_dtype == RLX_F32) return (const float *)base + j * n;
    rlx_cpu_widen(buf, (const uint16_t *)base + j * n, a->kv_dtype, n);
    return buf;
}

/* sc[h * RLX_ATTN_CHUNK] = scale * q[h] . k[h / G] for every query head h, k one key row (Hkv, D). */
RLX_CLONES
static void score_heads(float *sc, const float *q, const float *k, int64_t Hq, int64_t G, int64_t D, float scale)
{
    for (int64_t h = 0; h < Hq; h++) {
        const float *kh = k + h / G * D, *qh = q + h * D;
        rlx_cpu_v16 acc0 = {0}, acc1 = {0};
        int64_t e = 0;
        for (; e + 32 <= D; e += 32) {
            rlx_cpu_v16 q0, k0, q1, k1;
            memcpy(&q0, qh + e, sizeof q0);
            memcpy(&k0, kh + e, sizeof k0);
            memcpy(&q1, qh + e + 16, sizeof q1);
            memcpy(&k1, kh + e + 16, sizeof k1);
            acc0 += q0 * k0;
            acc1 += q1 * k1;
        }
        for (; e + 16 <= D; e += 16) {
            rlx_cpu_v16 q0, k0;
            memcpy(&q0, qh + e, sizeof q0);
            memcpy(&k0, kh + e, sizeof k0);
            acc0 += q0 * k0;
        }
        acc0 += acc1;
        float s = hsum16(&acc0);
        for (; e < D; e++) s += qh[e] * kh[e];
        sc[h * RLX_ATTN_CHUNK] = scale * s;
    }
}

/* o[h] (D) += p[h * RLX_ATTN_CHUNK] * v[h / G] for every query head h with a nonzero weight, v one
 * value row (Hkv, D). */
RLX_CLONES
static void weigh_heads(float *o, const float *p, const float *v, int64_t Hq, int64_t G, int64_t D)
{
    for (int64_t h = 0; h < Hq; h++) {
        const float w = p[h * RLX_ATTN_CHUNK];
        if (w == 0.0f) continue;
        const float *vh = v + h / G * D;
        float *oh = o + h * D;
        int64_t e = 0;
        for (; e + 16 <= D; e += 16) {
            rlx_cpu_v16 ov, vv;
            memcpy(&ov, oh + e, sizeof ov);
            memcpy(&vv, vh + e, sizeof vv);
            ov += w * vv;
            memcpy(oh + e, &ov, sizeof ov);
        }
        for (; e < D; e++) oh[e] += w * vh[e];
    }
}

/* sc[h * RLX_ATTN_CHUNK + jj] = scale * q[h] . k_{j0+jj}[h / G] for jj < n keys, all Hq heads: each
 * key row is read once, front to back. */
static void score_chunk(const struct rlx_attn_args *a, float *sc, int64_t j0, int64_t n, float *row)
{
    for (int64_t jj = 0; jj < n; jj++)
        score_heads(sc + jj, a->q, kv_full_row(a, a->k, j0 + jj, row), a->Hq, a->Hq / a->Hkv, a->D, a->scale);
}

/* o[h] (D) += sum_jj p[h * RLX_ATTN_CHUNK + jj] * v_{j0+jj}[h / G] for jj < n, all Hq heads,
 * skipping zero weights (masked keys, whose rows may hold anything). */
static void weigh_chunk(const struct rlx_attn_args *a, float *o, const float *p, int64_t j0, int64_t n, float *row)
{
    const int64_t Hq = a->Hq;
    for (int64_t jj = 0; jj < n; jj++) {
        bool any = false;
        for (int64_t h = 0; h < Hq && !any; h++) any = p[h * RLX_ATTN_CHUNK + jj] != 0.0f;
        if (any) weigh_heads(o, p + jj, kv_full_row(a, a->v, j0 + jj, row), Hq, Hq / a->Hkv, a->D);
    }
}

/* Per-task partial of the split-key path, inside the task's slice of scratch. */
struct attn_part {
    float *m, *l, *o, *sc, *row; /* (Hq) running max, (Hq) sum of exp(score - m), (Hq, D) sum of
                                    weighted values, (Hq, RLX_ATTN_CHUNK) scores of the current
                                    chunk, (Hkv * D) a widened row */
};

static struct attn_part part_of(const struct rlx_attn_args *a, int64_t t)
{
    float *base = a->scratch + t * RLX_ATTN_PART_FLOATS;
    struct attn_part pt = {.m = base, .l = base + a->Hq, .o = base + 2 * a->Hq};
    pt.sc = pt.o + a->Hq * a->D;
    pt.row = pt.sc + a->Hq * RLX_ATTN_CHUNK;
    return pt;
}

struct split_ctx {
    const struct rlx_attn_args *a;
    const struct attn_simd *simd; /* the vector kernels, or NULL */
    int64_t lo, hi, ntasks;       /* visible keys [lo, hi) of the one query, split evenly over tasks */
};

/* Task t: keys [lo + len * t / ntasks, lo + len * (t+1) / ntasks) in chunks, online softmax per head
 * (the running max only grows; o and l are rescaled by exp(old max - new max) when it does). */
static void split_tasks(void *p, int64_t begin, int64_t end)
{
    const struct split_ctx *c = p;
    const struct rlx_attn_args *a = c->a;
    const int64_t Hq = a->Hq, D = a->D, len = c->hi - c->lo;
    for (int64_t t = begin; t < end; t++) {
        const struct attn_part pt = part_of(a, t);
        for (int64_t h = 0; h < Hq; h++) pt.m[h] = -INFINITY, pt.l[h] = 0.0f;
        memset(pt.o, 0, (size_t)(Hq * D) * sizeof(float));
        const int64_t j0 = c->lo + len * t / c->ntasks, j1 = c->lo + len * (t + 1) / c->ntasks;
        for (int64_t cj = j0; cj < j1;) {
            const int64_t n = j1 - cj < RLX_ATTN_CHUNK ? j1 - cj : RLX_ATTN_CHUNK;
            const int64_t nn = j1 - cj - n < RLX_ATTN_CHUNK ? j1 - cj - n : RLX_ATTN_CHUNK;
            if (c->simd)
                c->simd->scores(a, pt.sc, cj, n, nn, cj == j0);
            else
                score_chunk(a, pt.sc, cj, n, pt.row);
            for (int64_t jj = 0; jj < n && (a->mask_u8 || a->mask_f32); jj++) {
                const int64_t j = cj + jj;
                const int masked = a->mask_u8 && !a->mask_u8[j];
                for (int64_t h = 0; h < Hq; h++) {
                    float *s = &pt.sc[h * RLX_ATTN_CHUNK + jj];
                    *s = masked ? -INFINITY : a->mask_f32 ? *s + a->mask_f32[j] : *s;
                }
            }
            for (int64_t h = 0; h < Hq; h++) {
                float *sc = pt.sc + h * RLX_ATTN_CHUNK, cm = -INFINITY;
                if (c->simd)
                    cm = c->simd->max_of(sc, n);
                else
                    for (int64_t jj = 0; jj < n; jj++) cm = sc[jj] > cm ? sc[jj] : cm;
                if (cm == -INFINITY) {
                    for (int64_t jj = 0; jj < n; jj++) sc[jj] = 0.0f;
                    continue;
                }
                if (cm > pt.m[h]) {
                    const float alpha = pt.m[h] == -INFINITY ? 0.0f : expf(pt.m[h] - cm);
                    pt.l[h] *= alpha;
                    if (c->simd)
                        c->simd->scale_row(pt.o + h * D, alpha, D);
                    else
                        for (int64_t e = 0; e < D; e++) pt.o[h * D + e] *= alpha;
                    pt.m[h] = cm;
                }
                pt.l[h] += exp_sum(sc, n, pt.m[h]);
            }
            if (c->simd)
                c->simd->values(a, pt.o, pt.sc, cj, n, nn, a->mask_u8 || a->mask_f32);
            else
                weigh_chunk(a, pt.o, pt.sc, cj, n, pt.row);
            cj += n;
        }
    }
}

/* out (1, Hq, D) from the tasks' partials: per head, weights exp(m_t - max_t m_t); vector loops, the
 * scalar ones' bits (a multiply and an add per element: no contraction under -std=c11). They were
 * scalar: Zen 4, Qwen3-0.6B Q4_K_M, 8 sequences, this merge was most of the calling thread's 1 %
 * of a step's samples in rlx_cpu_attention, 2026-12-07. */
static void split_merge(const struct rlx_attn_args *a, int64_t ntasks)
{
    const int64_t Hq = a->Hq, D = a->D;
    memset(a->out, 0, (size_t)(Hq * D) * sizeof(float));
    for (int64_t h = 0; h < Hq; h++) {
        float m = -INFINITY;
        for (int64_t t = 0; t < ntasks; t++) {
            const struct attn_part pt = part_of(a, t);
            m = pt.m[h] > m ? pt.m[h] : m;
        }
        if (m == -INFINITY) continue; /* nothing visible: zeros */
        float den = 0.0f;
        float *o = a->out + h * D;
        for (int64_t t = 0; t < ntasks; t++) {
            const struct attn_part pt = part_of(a, t);
            if (pt.m[h] == -INFINITY) continue;
            const float w = expf(pt.m[h] - m);
            den += w * pt.l[h];
            axpy(o, w, pt.o + h * D, D);
        }
        rlx_cpu_scale_inplace(o, 1.0f / den, D);
    }
}

/* Whether a task's partial of the split-key path fits its RLX_ATTN_PART_FLOATS of scratch. */
static int split_fits(const struct rlx_attn_args *a)
{
    return a->Hq * (a->D + 2 + RLX_ATTN_CHUNK) + a->Hkv * a->D <= RLX_ATTN_PART_FLOATS;
}

/* The split-key path for one query (S == 1). */
static void attend_split(const struct rlx_attn_args *a)
{
    int64_t lo, hi;
    attn_visible(a, 0, &lo, &hi);
    const int64_t work = (hi - lo) * a->Hq * a->D * 2;
    int64_t ntasks = work / RLX_CPU_GRAIN_FMA;
    const int64_t threads = rlx_pool_threads();
    ntasks = ntasks > threads ? threads : ntasks;
    ntasks = ntasks > (hi - lo) / RLX_ATTN_SPLIT_MIN_KEYS ? (hi - lo) / RLX_ATTN_SPLIT_MIN_KEYS : ntasks;
    ntasks = ntasks < 1 ? 1 : ntasks;
    struct split_ctx c = {.a = a, .simd = rlx_cpu_attn_simd(a), .lo = lo, .hi = hi, .ntasks = ntasks};
    rlx_parallel_for(ntasks, 1, split_tasks, &c);
    split_merge(a, ntasks);
}

struct attn_ctx {
    const struct rlx_attn_args *a;
    int64_t ntasks;
};

static void attend_tasks(void *p, int64_t begin, int64_t end)
{
    const struct attn_ctx *c = p;
    const struct rlx_attn_args *a = c->a;
    const int64_t G = a->Hq / a->Hkv, blocks = a->S * a->Hkv;
    for (int64_t t = begin; t < end; t++) {
        float *sc = a->scratch + t * (a->T + a->D), *row = sc + a->T;
        for (int64_t b = t; b < blocks; b += c->ntasks)
            for (int64_t pr = b * G; pr < (b + 1) * G; pr++) attend_one(a, pr / a->Hq, pr % a->Hq, sc, row);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Prefill / extension (S >= RLX_ATTN_GEMM_MIN_S): query blocks through sgemm
 * ------------------------------------------------------------------------------------------- */

/* Queries from which the blocked sgemm path is taken, score floats (block rows * T) it may use,
 * and the bounds on its block rows. */
#define RLX_ATTN_GEMM_MIN_S    8
#define RLX_ATTN_GEMM_FLOATS   (1 << 20)
#define RLX_ATTN_GEMM_MAX_ROWS 64
#define RLX_ATTN_GEMM_MIN_ROWS 8

/* Query rows per block of the sgemm path for S queries over T keys. */
static int64_t gemm_rows(int64_t S, int64_t T)
{
    int64_t r = RLX_ATTN_GEMM_FLOATS / (T > 0 ? T : 1);
    r = r > RLX_ATTN_GEMM_MAX_ROWS ? RLX_ATTN_GEMM_MAX_ROWS : r;
    r = r < RLX_ATTN_GEMM_MIN_ROWS ? RLX_ATTN_GEMM_MIN_ROWS : r;
    return r < S ? r : S;
}

/* Max of x[j] for j < n (n >= 1), NaN when some x[j] is NaN or x holds both infinities (then
 * the row's result is NaN, as it would be through exp(x - max)). */
RLX_CLONES
static float row_max(const float *x, int64_t n)
{
    rlx_cpu_v16 m = {0}, sum = {0};
    m -= INFINITY;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        rlx_cpu_v16 v;
        memcpy(&v, x + j, sizeof v);
        const rlx_cpu_v16i gt = v > m;
        m = (rlx_cpu_v16)(((rlx_cpu_v16i)v & gt) | ((rlx_cpu_v16i)m & ~gt));
        sum += v;
    }
    float r = -INFINITY, s = hsum16(&sum);
    for (int l = 0; l < 16; l++) r = m[l] > r ? m[l] : r;
    for (; j < n; j++) {
        r = x[j] > r ? x[j] : r;
        s += x[j];
    }
    return s != s ? NAN : r;
}

/* One row of scores, sc[c] for key lo + c, c < W (already scaled by sgemm): keys outside
 * [vlo, vhi) (causal, window) and keys the masks drop become weight 0, the others
 * exp(score + mask - max). Returns 1 / (sum of the weights), or 0 with the row all zero when no
 * key is visible (NaN with the row all NaN when a score is NaN or +inf, as the ref table gives).
 * mf / mu: the row's masks from key lo, or NULL. */
static float row_softmax(float *sc, int64_t W, int64_t vlo, int64_t vhi, const float *mf, const uint8_t *mu)
{
    if (vlo > 0) memset(sc, 0, (size_t)vlo * sizeof(float));
    if (vhi < W) memset(sc + vhi, 0, (size_t)(W - vhi) * sizeof(float));
    if (vhi <= vlo) return 0.0f;
    if (mu || mf)
        for (int64_t c = vlo; c < vhi; c++) sc[c] = mu && !mu[c] ? -INFINITY : mf ? sc[c] + mf[c] : sc[c];
    const float m = row_max(sc + vlo, vhi - vlo);
    if (m == -INFINITY) {
        memset(sc + vlo, 0, (size_t)(vhi - vlo) * sizeof(float));
        return 0.0f;
    }
    if (!(m < INFINITY)) { /* NaN or +inf */
        for (int64_t c = vlo; c < vhi; c++) sc[c] = NAN;
        return NAN;
    }
    return 1.0f / exp_sum(sc + vlo, vhi - vlo, m);
}

/* out rows i0 .. i0+R of head h: scores over keys [lo, hi) by sgemm into sc (R, hi - lo), row
 * softmax, then out = weights @ values by sgemm straight into out (rows Hq * D apart), scaled per
 * row by 1 / sum (inv: R floats). k / v: the keys / values of [lo, hi) for this kv head, rows
 * ld floats apart. */
static void gemm_block(const struct rlx_attn_args *a, int64_t i0, int64_t R, int64_t h, int64_t lo, int64_t hi,
                       const float *k, const float *v, int64_t ld, float *sc, float *inv)
{
    const int64_t D = a->D, Hq = a->Hq, W = hi - lo;
    const float *q = a->q + (i0 * Hq + h) * D;
    float *out = a->out + (i0 * Hq + h) * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)R, (blasint)W, (blasint)D, a->scale, q,
                (blasint)(Hq * D), k, (blasint)ld, 0.0f, sc, (blasint)W);
    for (int64_t r = 0; r < R; r++) {
        const int64_t i = i0 + r;
        int64_t vlo, vhi; /* keys visible to query i before the masks */
        attn_visible(a, i, &vlo, &vhi);
        vlo = vlo > lo ? vlo : lo;
        vhi = vhi < hi ? vhi : hi;
        inv[r] = row_softmax(sc + r * W, W, vlo - lo, vhi - lo, a->mask_f32 ? a->mask_f32 + i * a->T + lo : NULL,
                             a->mask_u8 ? a->mask_u8 + i * a->T + lo : NULL);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)R, (blasint)D, (blasint)W, 1.0f, sc, (blasint)W, v,
                (blasint)ld, 0.0f, out, (blasint)(Hq * D));
    for (int64_t r = 0; r < R; r++) {
        float *o = out + r * Hq * D;
        if (inv[r] == 0.0f)
            memset(o, 0, (size_t)D * sizeof(float)); /* nothing visible: zeros */
        else
            for (int64_t e = 0; e < D; e++) o[e] *= inv[r];
    }
}

/* Rows [lo, hi) of kv head kvh of a (T, Hkv, D) f16 / bf16 array, widened into dst (hi - lo, D). */
static void widen_block(const struct rlx_attn_args *a, const void *base, int64_t lo, int64_t hi, int64_t kvh,
                        float *dst)
{
    for (int64_t j = lo; j < hi; j++)
        rlx_cpu_widen(dst + (j - lo) * a->D, (const uint16_t *)base + (j * a->Hkv + kvh) * a->D, a->kv_dtype, a->D);
}

/* The blocked sgemm path: per kv head, per block of query rows, per query head of its group
 * (the group reads the same key/value rows, still in cache). A block needs only the keys its
 * last row may see (causal) from the first its first row may see (window). */
static void attend_gemm(const struct rlx_attn_args *a)
{
    const int64_t S = a->S, T = a->T, G = a->Hq / a->Hkv, D = a->D, stride = a->Hkv * D;
    const int64_t rows = gemm_rows(S, T);
    float *inv = a->scratch + rows * T, *kw = inv + rows, *vw = kw + T * D; /* kw, vw: f16 / bf16 only */
    (void)rlx_pool_threads(); /* the first pool use applies RLX_NUM_THREADS to OpenBLAS too */
    for (int64_t kvh = 0; kvh < a->Hkv; kvh++)
        for (int64_t i0 = 0; i0 < S; i0 += rows) {
            const int64_t R = S - i0 < rows ? S - i0 : rows;
            int64_t lo, hi, lo_last, hi_last;
            attn_visible(a, i0, &lo, &hi);
            attn_visible(a, i0 + R - 1, &lo_last, &hi_last);
            hi = hi_last; /* the block's keys: from its first row's start to its last row's end */
            if (hi <= lo) {
                for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
                    for (int64_t r = 0; r < R; r++)
                        memset(a->out + ((i0 + r) * a->Hq + h) * D, 0, (size_t)D * sizeof(float));
                continue;
            }
            const float *k, *v;
            int64_t ld;
            if (a->kv_dtype == RLX_F32) {
                k = (const float *)a->k + lo * stride + kvh * D;
                v = (const float *)a->v + lo * stride + kvh * D;
                ld = stride;
            } else {
                widen_block(a, a->k, lo, hi, kvh, kw);
                widen_block(a, a->v, lo, hi, kvh, vw);
                k = kw, v = vw, ld = D;
            }
            for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
                gemm_block(a, i0, R, h, lo, hi, k, v, ld, a->scratch, inv);
        }
}

/* out (S, Hq, D) = grouped-query attention of q (S, Hq, D) over k / v (T, Hkv, D); see
 * rlx_attn_args. */
void rlx_cpu_attention(const struct rlx_attn_args *a)
{
    if (a->S == 1 && split_fits(a)) {
        attend_split(a);
        return;
    }
    if (a->S >= RLX_ATTN_FLASH_MIN_S) {
        const struct attn_simd *sd = rlx_cpu_attn_simd(a);
        if (sd) {
            rlx_cpu_attn_flash(a, sd);
            return;
        }
    }
    if (a->S >= RLX_ATTN_GEMM_MIN_S) {
        if (a->D > 0) /* (D == 0: out is empty) */
            attend_gemm(a);
        return;
    }
    const int64_t pairs = a->S * a->Hq;
    const int64_t work = pairs * a->T * a->D * 2; /* multiply-adds, upper bound */
    int64_t ntasks = work / RLX_CPU_GRAIN_FMA;
    const int64_t threads = rlx_pool_threads();
    if (ntasks > threads) ntasks = threads;
    if (ntasks > a->S * a->Hkv) ntasks = a->S * a->Hkv;
    if (ntasks < 1) ntasks = 1;
    struct attn_ctx c = {.a = a, .ntasks = ntasks};
    rlx_parallel_for(ntasks, 1, attend_tasks, &c);
}

/* For S >= RLX_ATTN_GEMM_MIN_S: one block of scores and its row sums, and for f16 / bf16 K / V
 * two widened blocks of up to T rows; otherwise per pool thread T + D floats (the per-pair path)
 * or RLX_ATTN_PART_FLOATS (the split-key path for S == 1). */
size_t rlx_cpu_attention_scratch(const struct rlx_attn_args *a)
{
    const int64_t S = a->S, T = a->T;
    /* the flash path's, when it may be taken (whichever ISA the call then finds, the larger need) */
    const size_t flash = S >= RLX_ATTN_FLASH_MIN_S && a->D > 0 && a->D % 16 == 0
                             ? (size_t)rlx_pool_threads() * (size_t)rlx_cpu_attn_flash_task_floats(a) +
                                   (size_t)rlx_cpu_attn_amx_shared_floats(a)
                             : 0;
    if (S >= RLX_ATTN_GEMM_MIN_S) {
        const int64_t rows = gemm_rows(S, T);
        const size_t gemm = (size_t)(rows * T + rows) + (a->kv_dtype == RLX_F32 ? 0 : (size_t)(2 * T * a->D));
        return gemm > flash ? gemm : flash;
    }
    size_t per = (size_t)(T + a->D);
    if (S == 1 && split_fits(a) && per < RLX_ATTN_PART_FLOATS) per = RLX_ATTN_PART_FLOATS;
    const size_t pairs = (size_t)rlx_pool_threads() * per;
    return pairs > flash ? pairs : flash;
}
