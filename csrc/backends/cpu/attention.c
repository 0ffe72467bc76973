/*
 * attention.c - the cpu table's grouped-query attention over past + new keys. One (query i,
 * head h) pair is scored against its visible keys (dot products), softmaxed with the max
 * subtracted, and its output accumulated as a weighted sum of value rows (axpy); the dot and
 * axpy loops are compiled per ISA.
 *
 * Threading and scratch: the pairs are dealt round-robin to `ntasks` tasks (ntasks <=
 * rlx_pool_threads(), fewer when the work is small), so causal rows of unequal length balance.
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

/* a (n) . b (n) */
RLX_CPU_CLONES
static float dot(const float *a, const float *b, int64_t n) {
    rlx_cpu_v16 acc0 = {0}, acc1 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        rlx_cpu_v16 a0, b0, a1, b1;
        memcpy(&a0, a + i, sizeof a0);
        memcpy(&b0, b + i, sizeof b0);
        memcpy(&a1, a + i + 16, sizeof a1);
        memcpy(&b1, b + i + 16, sizeof b1);
        acc0 += a0 * b0;
        acc1 += a1 * b1;
    }
    for (; i + 16 <= n; i += 16) {
        rlx_cpu_v16 a0, b0;
        memcpy(&a0, a + i, sizeof a0);
        memcpy(&b0, b + i, sizeof b0);
        acc0 += a0 * b0;
    }
    acc0 += acc1;
    float s = 0.0f;
    for (int l = 0; l < 16; l++)
        s += acc0[l];
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y (n) += alpha * x (n) */
RLX_CPU_CLONES
static void axpy(float *y, float alpha, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        rlx_cpu_v16 xv, yv;
        memcpy(&xv, x + i, sizeof xv);
        memcpy(&yv, y + i, sizeof yv);
        yv += alpha * xv;
        memcpy(y + i, &yv, sizeof yv);
    }
    for (; i < n; i++)
        y[i] += alpha * x[i];
}

/* y (n) *= alpha */
RLX_CPU_CLONES
static void scal(float *y, float alpha, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        rlx_cpu_v16 yv;
        memcpy(&yv, y + i, sizeof yv);
        yv *= alpha;
        memcpy(y + i, &yv, sizeof yv);
    }
    for (; i < n; i++)
        y[i] *= alpha;
}

/* Row j (0..P+S-1, past first) of k or v for kv head kvh: (D). */
static const float *kv_row(const struct rlx_attn_args *a, const float *past, const float *now, int64_t j,
                           int64_t kvh) {
    return j < a->P ? past + (j * a->Hkv + kvh) * a->D : now + ((j - a->P) * a->Hkv + kvh) * a->D;
}

/* out[i, h] (D) = sum_j softmax_j(scale * q[i, h] . k_j + mask) v_j over the keys visible to i;
 * sc: P+S floats of scratch. */
static void attend_one(const struct rlx_attn_args *a, int64_t i, int64_t h, float *sc) {
    const int64_t L = a->P + a->S, D = a->D;
    const int64_t kvh = h / (a->Hq / a->Hkv);
    const float *q = a->q + (i * a->Hq + h) * D;
    float *o = a->out + (i * a->Hq + h) * D;
    int64_t lo = 0, hi = L - 1; /* visible keys: lo..hi inclusive, before the masks */
    if (a->causal && hi > a->P + i)
        hi = a->P + i;
    if (a->window > 0 && lo < a->P + i - a->window + 1)
        lo = a->P + i - a->window + 1;
    memset(o, 0, (size_t)D * sizeof(float));
    const float *mf = a->mask_f32 ? a->mask_f32 + i * L : NULL;
    const uint8_t *mu = a->mask_u8 ? a->mask_u8 + i * L : NULL;
    float m = -INFINITY;
    for (int64_t j = lo; j <= hi; j++) {
        if (mu && !mu[j]) {
            sc[j] = -INFINITY;
            continue;
        }
        float s = a->scale * dot(q, kv_row(a, a->k_past, a->k, j, kvh), D);
        if (mf)
            s += mf[j];
        sc[j] = s;
        m = s > m ? s : m;
    }
    if (m == -INFINITY)
        return; /* nothing visible: zeros */
    float sum = 0.0f;
    for (int64_t j = lo; j <= hi; j++) {
        const float p = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - m);
        sc[j] = p;
        sum += p;
    }
    for (int64_t j = lo; j <= hi; j++)
        if (sc[j] != 0.0f)
            axpy(o, sc[j], kv_row(a, a->v_past, a->v, j, kvh), D);
    scal(o, 1.0f / sum, D);
}

struct attn_ctx {
    const struct rlx_attn_args *a;
    int64_t ntasks;
};

static void attend_tasks(void *p, int64_t begin, int64_t end) {
    const struct attn_ctx *c = p;
    const struct rlx_attn_args *a = c->a;
    const int64_t pairs = a->S * a->Hq;
    for (int64_t t = begin; t < end; t++) {
        float *sc = a->scratch + t * (a->P + a->S);
        for (int64_t pr = t; pr < pairs; pr += c->ntasks)
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
    if (ntasks > pairs)
        ntasks = pairs;
    if (ntasks < 1)
        ntasks = 1;
    struct attn_ctx c = {.a = a, .ntasks = ntasks};
    rlx_parallel_for(ntasks, 1, attend_tasks, &c);
}

/* P+S scores per task, one task per pool thread at most */
size_t rlx_cpu_attention_scratch(int64_t S, int64_t P) {
    return (size_t)rlx_pool_threads() * (size_t)(P + S);
}
