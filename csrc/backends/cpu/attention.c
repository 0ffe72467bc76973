/*
 * attention.c - the cpu table's grouped-query attention over past + new keys. One (query i,
 * head h) pair is scored against its visible keys (dot products), softmaxed with the max
 * subtracted, and its output accumulated as a weighted sum of value rows; the two loops over
 * key rows (scores, weighted sum) are compiled per ISA.
 *
 * Threading and scratch: pairs come in blocks, one block per (query, kv head) holding the
 * Hq/Hkv query heads that read the same key/value rows (so the second head finds them in cache).
 * Blocks are dealt round-robin to `ntasks` tasks (ntasks <= rlx_pool_threads(), fewer when the
 * work is small), so causal rows of unequal length balance.
 * rlx_parallel_for runs over the task ids [0, ntasks), and task t keeps its scores in
 * scratch[t * (P+S) .. (t+1) * (P+S)): slices are owned by task id, not by thread or chunk, so
 * they stay distinct however the pool groups task ids into chunks (or runs them all inline).
 * Hence attention_scratch = rlx_pool_threads() * (P+S); the caller must not raise the thread
 * count between sizing the scratch and calling the kernel. Must never allocate.
 */
#include "backends/cpu/cpu.h"

#include "core/pool.h"

#include <math.h>
#include <string.h>

/* sc[j] = scale * q (D) . k[j * stride .. + D] for j < n */
RLX_CPU_CLONES
static void score_rows(float *sc, const float *q, const float *k, int64_t stride, int64_t n, int64_t D,
                       float scale) {
    for (int64_t j = 0; j < n; j++) {
        const float *kj = k + j * stride;
        rlx_cpu_v16 acc0 = {0}, acc1 = {0};
        int64_t e = 0;
        for (; e + 32 <= D; e += 32) {
            rlx_cpu_v16 q0, k0, q1, k1;
            memcpy(&q0, q + e, sizeof q0);
            memcpy(&k0, kj + e, sizeof k0);
            memcpy(&q1, q + e + 16, sizeof q1);
            memcpy(&k1, kj + e + 16, sizeof k1);
            acc0 += q0 * k0;
            acc1 += q1 * k1;
        }
        for (; e + 16 <= D; e += 16) {
            rlx_cpu_v16 q0, k0;
            memcpy(&q0, q + e, sizeof q0);
            memcpy(&k0, kj + e, sizeof k0);
            acc0 += q0 * k0;
        }
        acc0 += acc1;
        float s = 0.0f;
        for (int l = 0; l < 16; l++)
            s += acc0[l];
        for (; e < D; e++)
            s += q[e] * kj[e];
        sc[j] = scale * s;
    }
}

/* o (D) += sum_j p[j] * v[j * stride .. + D] for j < n, skipping p[j] == 0 (masked keys, whose
 * rows may hold anything) */
RLX_CPU_CLONES
static void weigh_rows(float *o, const float *p, const float *v, int64_t stride, int64_t n, int64_t D) {
    for (int64_t j = 0; j < n; j++) {
        if (p[j] == 0.0f)
            continue;
        const float w = p[j];
        const float *vj = v + j * stride;
        int64_t e = 0;
        for (; e + 16 <= D; e += 16) {
            rlx_cpu_v16 ov, vv;
            memcpy(&ov, o + e, sizeof ov);
            memcpy(&vv, vj + e, sizeof vv);
            ov += w * vv;
            memcpy(o + e, &ov, sizeof ov);
        }
        for (; e < D; e++)
            o[e] += w * vj[e];
    }
}

/* out[i, h] (D) = sum_j softmax_j(scale * q[i, h] . k_j + mask) v_j over the keys visible to i;
 * sc: P+S floats of scratch. Keys lo..hi (past first) are split at P into the two arrays. */
static void attend_one(const struct rlx_attn_args *a, int64_t i, int64_t h, float *sc) {
    const int64_t P = a->P, L = P + a->S, D = a->D, stride = a->Hkv * D;
    const int64_t kvh = h / (a->Hq / a->Hkv);
    const float *q = a->q + (i * a->Hq + h) * D;
    float *o = a->out + (i * a->Hq + h) * D;
    int64_t lo = 0, hi = L; /* visible keys: [lo, hi), before the masks */
    if (a->causal && hi > P + i + 1)
        hi = P + i + 1;
    if (a->window > 0 && lo < P + i - a->window + 1)
        lo = P + i - a->window + 1;
    memset(o, 0, (size_t)D * sizeof(float));
    if (lo >= hi)
        return;
    const int64_t mid = lo > P ? lo : (hi < P ? hi : P); /* [lo, mid) past, [mid, hi) new */
    if (mid > lo)
        score_rows(sc + lo, q, a->k_past + lo * stride + kvh * D, stride, mid - lo, D, a->scale);
    if (hi > mid)
        score_rows(sc + mid, q, a->k + (mid - P) * stride + kvh * D, stride, hi - mid, D, a->scale);
    const float *mf = a->mask_f32 ? a->mask_f32 + i * L : NULL;
    const uint8_t *mu = a->mask_u8 ? a->mask_u8 + i * L : NULL;
    float m = -INFINITY;
    for (int64_t j = lo; j < hi; j++) {
        if (mu && !mu[j])
            sc[j] = -INFINITY;
        else if (mf)
            sc[j] += mf[j];
        m = sc[j] > m ? sc[j] : m;
    }
    if (m == -INFINITY)
        return; /* nothing visible: zeros */
    float sum = 0.0f;
    for (int64_t j = lo; j < hi; j++) {
        const float p = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - m);
        sc[j] = p;
        sum += p;
    }
    if (mid > lo)
        weigh_rows(o, sc + lo, a->v_past + lo * stride + kvh * D, stride, mid - lo, D);
    if (hi > mid)
        weigh_rows(o, sc + mid, a->v + (mid - P) * stride + kvh * D, stride, hi - mid, D);
    const float inv = 1.0f / sum;
    for (int64_t e = 0; e < D; e++)
        o[e] *= inv;
}

struct attn_ctx {
    const struct rlx_attn_args *a;
    int64_t ntasks;
};

static void attend_tasks(void *p, int64_t begin, int64_t end) {
    const struct attn_ctx *c = p;
    const struct rlx_attn_args *a = c->a;
    const int64_t G = a->Hq / a->Hkv, blocks = a->S * a->Hkv;
    for (int64_t t = begin; t < end; t++) {
        float *sc = a->scratch + t * (a->P + a->S);
        for (int64_t b = t; b < blocks; b += c->ntasks)
            for (int64_t pr = b * G; pr < (b + 1) * G; pr++)
                attend_one(a, pr / a->Hq, pr % a->Hq, sc);
    }
}

/* out (S, Hq, D) = grouped-query attention of q (S, Hq, D) over k/v past (P, Hkv, D) then new
 * (S, Hkv, D), see rlx_attn_args. */
void rlx_cpu_attention_f32(const struct rlx_attn_args *a) {
    const int64_t pairs = a->S * a->Hq;
    const int64_t work = pairs * (a->P + a->S) * a->D * 2; /* multiply-adds, upper bound */
    int64_t ntasks = work / RLX_CPU_GRAIN_FMA;
    const int64_t threads = rlx_pool_threads();
    if (ntasks > threads)
        ntasks = threads;
    if (ntasks > a->S * a->Hkv)
        ntasks = a->S * a->Hkv;
    if (ntasks < 1)
        ntasks = 1;
    struct attn_ctx c = {.a = a, .ntasks = ntasks};
    rlx_parallel_for(ntasks, 1, attend_tasks, &c);
}

/* P+S scores per task, one task per pool thread at most */
size_t rlx_cpu_attention_scratch(int64_t S, int64_t P) {
    return (size_t)rlx_pool_threads() * (size_t)(P + S);
}
