/*
 * test_vulkan.c - the Vulkan backend from C, small enough to run under valgrind (on lavapipe:
 * tools/run_all_tests.sh sets VK_DRIVER_FILES, and RLX_VULKAN_VALIDATION=1 for the validation layer):
 * a graph touching most kernels (embedding of q8_0 rows, rmsnorm, a bf16 matmul, rope, a cache
 * write into an f16 state, attention over it, softmax) against the ref backend, on mapped and on
 * staged memory; a cache position outside the state (RLX_ERR_RANGE naming the node, the plan
 * usable afterwards); an interrupted run; a mixture-of-experts block (router, softmax, topk,
 * matmul_id with q8_0 experts, moe_combine) against ref, with an expert id out of range reported
 * by name; and no validation message. Prints "SKIP" and passes when
 * no Vulkan device is usable. One line per failed check, then "N passed, M failed".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/core.h"
#include "ir/graph.h"
#include "rlx/kv.h"
#include "runtime/plan.h"

#include "check.h"

enum { S = 4, T = 6, V = 9, H = 64, N = 48, HEADS = 3, HD = 16 };

/* Deterministic values in [-1, 1). */
static float val(int i) { return (float)((i * 37 + 11) % 97) / 48.5f - 1.0f; }

struct net {
    struct rlx_plan *p;
    int ids, pos, kc; /* input indices and the state's node id */
    struct rlx_kv_cache *kv;
};

/* ids (S) -> embedding (q8_0 table) -> rmsnorm -> matmul (bf16 W) -> rope -> cache_write into an
 * f16 state (T rows) -> attention of the rows over the state -> softmax; output (S, N). */
static struct rlx_graph *build(int *kc)
{
    struct rlx_graph *g;
    rlx_graph_create(&g);
    int ids, pos, table, norm, w, inv, x;
    rlx_graph_input(g, "ids", RLX_I32, 1, (struct rlx_dim[]){rlx_dim_const(S)}, &ids);
    rlx_graph_input(g, "pos", RLX_I32, 1, (struct rlx_dim[]){rlx_dim_const(S)}, &pos);
    rlx_graph_param(g, "table", RLX_Q8_0, 2, (struct rlx_dim[]){rlx_dim_const(V), rlx_dim_const(H)}, &table);
    rlx_graph_param(g, "norm", RLX_F32, 1, (struct rlx_dim[]){rlx_dim_const(H)}, &norm);
    rlx_graph_param(g, "w", RLX_BF16, 2, (struct rlx_dim[]){rlx_dim_const(N), rlx_dim_const(H)}, &w);
    rlx_graph_param(g, "inv", RLX_F32, 1, (struct rlx_dim[]){rlx_dim_const(HD / 2)}, &inv);
    rlx_graph_op(g, RLX_OP_EMBEDDING, 2, (int[]){table, ids}, NULL, &x);
    rlx_graph_op(g, RLX_OP_RMSNORM, 2, (int[]){x, norm}, &(struct rlx_attrs){.eps = 1e-5f}, &x);
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){x, w}, &(struct rlx_attrs){.trans_b = 1}, &x);
    struct rlx_attrs rs = {.ndim = 3, .shape = {rlx_dim_const(S), rlx_dim_const(HEADS), rlx_dim_const(HD)}};
    rlx_graph_op(g, RLX_OP_RESHAPE, 1, (int[]){x}, &rs, &x);
    rlx_graph_op(g, RLX_OP_ROPE, 3, (int[]){x, pos, inv}, NULL, &x);
    int cw, a;
    rlx_graph_state(g, "k", RLX_F16, 3, (struct rlx_dim[]){rlx_dim_const(T), rlx_dim_const(HEADS), rlx_dim_const(HD)},
                    kc);
    rlx_graph_cache_write(g, *kc, x, pos, &cw);
    rlx_graph_op(g, RLX_OP_ATTENTION, 3, (int[]){x, cw, cw}, &(struct rlx_attrs){.scale = 0.25f, .causal = 1}, &a);
    struct rlx_attrs r2 = {.ndim = 2, .shape = {rlx_dim_const(S), rlx_dim_const(N)}};
    rlx_graph_op(g, RLX_OP_RESHAPE, 1, (int[]){a}, &r2, &a);
    rlx_graph_op(g, RLX_OP_SOFTMAX, 1, (int[]){a}, NULL, &a);
    rlx_graph_output(g, a, "y");
    return g;
}

/* A plan for dev with its params set and its state's memory (a one-layer KV cache). */
static int make(struct rlx_device *dev, struct net *n)
{
    memset(n, 0, sizeof *n);
    struct rlx_graph *g = build(&n->kc);
    int ok = rlx_compile(g, dev, NULL, &n->p) == RLX_OK;
    rlx_graph_free(g);
    if (!ok) return 0;
    static uint8_t table[V * (H / 32) * 34]; /* q8_0 blocks: f16 scale 1/64, int8 values */
    static uint16_t w[N * H];
    static float norm[H], inv[HD / 2];
    for (int b = 0; b < V * H / 32; b++) {
        table[b * 34] = 0x00, table[b * 34 + 1] = 0x24; /* f16 0x2400 = 2^-6 */
        for (int j = 0; j < 32; j++) table[b * 34 + 2 + j] = (uint8_t)(int8_t)(val(b * 32 + j) * 100);
    }
    for (int i = 0; i < N * H; i++) w[i] = rlx_f32_to_bf16(val(i + 5) * 0.2f);
    for (int i = 0; i < H; i++) norm[i] = 1.0f + 0.1f * val(i);
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(100.0f, -(float)i / (HD / 2));
    struct rlx_host_tensor tt = {.data = table, .dtype = RLX_Q8_0, .ndim = 2, .shape = {V, H}};
    struct rlx_host_tensor tn = {.data = norm, .dtype = RLX_F32, .ndim = 1, .shape = {H}};
    struct rlx_host_tensor tw = {.data = w, .dtype = RLX_BF16, .ndim = 2, .shape = {N, H}};
    struct rlx_host_tensor ti = {.data = inv, .dtype = RLX_F32, .ndim = 1, .shape = {HD / 2}};
    int i0, i1, i2, i3;
    ok = rlx_plan_param_index(n->p, "table", &i0) == RLX_OK && rlx_plan_param_index(n->p, "norm", &i1) == RLX_OK &&
         rlx_plan_param_index(n->p, "w", &i2) == RLX_OK && rlx_plan_param_index(n->p, "inv", &i3) == RLX_OK &&
         rlx_plan_set_param(n->p, i0, &tt) == RLX_OK && rlx_plan_set_param(n->p, i1, &tn) == RLX_OK &&
         rlx_plan_set_param(n->p, i2, &tw) == RLX_OK && rlx_plan_set_param(n->p, i3, &ti) == RLX_OK &&
         rlx_plan_input_index(n->p, "ids", &n->ids) == RLX_OK && rlx_plan_input_index(n->p, "pos", &n->pos) == RLX_OK &&
         rlx_kv_cache_create(dev, 1, HEADS * HD, T, RLX_F16, &n->kv) == RLX_OK &&
         rlx_kv_cache_reserve(n->kv, T) == RLX_OK;
    return ok;
}

static void unmake(struct net *n)
{
    rlx_plan_free(n->p);
    rlx_kv_cache_free(n->kv);
}

static rlx_status run(struct net *n, const int32_t *pos, float *out)
{
    static const int32_t ids[S] = {3, 0, 8, 5};
    struct rlx_host_tensor ti = {.data = ids, .dtype = RLX_I32, .ndim = 1, .shape = {S}};
    struct rlx_host_tensor tp = {.data = pos, .dtype = RLX_I32, .ndim = 1, .shape = {S}};
    int st;
    rlx_status s = rlx_plan_set_input(n->p, n->ids, &ti);
    if (s == RLX_OK) s = rlx_plan_set_input(n->p, n->pos, &tp);
    if (s == RLX_OK) s = rlx_plan_state_of_node(n->p, n->kc, &st);
    size_t ko = 0;
    struct rlx_buffer *kb = rlx_kv_cache_buffer(n->kv, 0, 0, &ko);
    if (s == RLX_OK) s = rlx_plan_bind_state(n->p, st, kb, ko);
    if (s == RLX_OK) s = rlx_plan_run(n->p);
    if (s == RLX_OK) s = rlx_plan_read_output(n->p, 0, out, sizeof(float) * S * N);
    return s;
}

static void test_device(const char *name, const float *want)
{
    struct rlx_device *dev = NULL;
    CHECK(rlx_device_open(name, &dev) == RLX_OK, "open %s", name);
    if (!dev) return;
    struct net n;
    CHECK(make(dev, &n), "%s: compile and bind", name);
    static const int32_t pos[S] = {2, 3, 4, 5}, bad[S] = {2, 3, 4, 6};
    float got[S * N];
    CHECK(run(&n, pos, got) == RLX_OK, "%s: run", name);
    double err = 0;
    for (int i = 0; i < S * N; i++) err = fmax(err, fabs((double)got[i] - want[i]));
    CHECK(err < 1e-4, "%s: equals ref (max |diff| %g)", name, err);

    CHECK(run(&n, bad, got) == RLX_ERR_RANGE && strstr(rlx_last_error(), "(cache_write): position 6 of row 3 is "
                                                                         "outside the state's 6 rows"),
          "%s: a position outside the state refused, naming it", name);
    rlx_interrupt();
    CHECK(run(&n, pos, got) == RLX_ERR_INTERRUPTED, "%s: an interrupted run stops before it is submitted", name);
    rlx_interrupt_clear();
    CHECK(run(&n, pos, got) == RLX_OK, "%s: usable after both", name);
    unmake(&n);
    struct rlx_device_stats st;
    rlx_device_stats(dev, &st);
    CHECK(st.allocated_bytes == 0, "%s: everything freed (%zu bytes left)", name, st.allocated_bytes);
    rlx_device_free(dev);
}

/* ---- a mixture-of-experts block ---------------------------------------------------------- */

enum { MS = 5, ME = 6, MK = 2, MF = 7 }; /* tokens, experts, experts a token, rows of an expert (inner dim H) */

/* x (MS, H) @ router (ME, H)^T -> softmax -> topk (MK) -> matmul_id of x with q8_0 experts
 * (ME, MF, H) -> moe_combine (renormalised): out (MS, MF). ids_in: matmul_id and moe_combine take
 * their ids from an input "ids" (MS, MK) instead of topk's. Runs once into out. */
static rlx_status moe_run(struct rlx_device *dev, const int32_t *ids_in, float *out)
{
    struct rlx_graph *g;
    RLX_TRY(rlx_graph_create(&g));
    int x, router, w, p, ids, x3, y, o;
    rlx_graph_input(g, "x", RLX_F32, 2, (struct rlx_dim[]){rlx_dim_const(MS), rlx_dim_const(H)}, &x);
    rlx_graph_param(g, "router", RLX_F32, 2, (struct rlx_dim[]){rlx_dim_const(ME), rlx_dim_const(H)}, &router);
    rlx_graph_param(g, "w", RLX_Q8_0, 3, (struct rlx_dim[]){rlx_dim_const(ME), rlx_dim_const(MF), rlx_dim_const(H)},
                    &w);
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){x, router}, &(struct rlx_attrs){.trans_b = 1}, &p);
    rlx_graph_op(g, RLX_OP_SOFTMAX, 1, (int[]){p}, NULL, &p);
    if (ids_in)
        rlx_graph_input(g, "ids", RLX_I32, 2, (struct rlx_dim[]){rlx_dim_const(MS), rlx_dim_const(MK)}, &ids);
    else
        rlx_graph_op(g, RLX_OP_TOPK, 1, (int[]){p}, &(struct rlx_attrs){.k = MK}, &ids);
    struct rlx_attrs rs = {.ndim = 3, .shape = {rlx_dim_const(MS), rlx_dim_const(1), rlx_dim_const(H)}};
    rlx_graph_op(g, RLX_OP_RESHAPE, 1, (int[]){x}, &rs, &x3);
    rlx_graph_op(g, RLX_OP_MATMUL_ID, 3, (int[]){x3, ids, w}, NULL, &y);
    rlx_graph_op(g, RLX_OP_MOE_COMBINE, 3, (int[]){y, p, ids}, &(struct rlx_attrs){.norm = 1}, &o);
    rlx_graph_output(g, o, "y");
    struct rlx_plan *plan = NULL;
    rlx_status s = rlx_compile(g, dev, NULL, &plan);
    rlx_graph_free(g);
    static float xs[MS * H], rw[ME * H];
    static uint8_t ws[ME * MF * (H / 32) * 34]; /* q8_0 blocks: f16 scale 1/64, int8 values */
    for (int i = 0; i < MS * H; i++) xs[i] = val(i + 3);
    for (int i = 0; i < ME * H; i++) rw[i] = 0.5f * val(i + 7);
    for (int b = 0; b < ME * MF * H / 32; b++) {
        ws[b * 34] = 0x00, ws[b * 34 + 1] = 0x24;
        for (int j = 0; j < 32; j++) ws[b * 34 + 2 + j] = (uint8_t)(int8_t)(val(b * 32 + j + 1) * 100);
    }
    struct rlx_host_tensor tx = {.data = xs, .dtype = RLX_F32, .ndim = 2, .shape = {MS, H}};
    struct rlx_host_tensor tr = {.data = rw, .dtype = RLX_F32, .ndim = 2, .shape = {ME, H}};
    struct rlx_host_tensor tw = {.data = ws, .dtype = RLX_Q8_0, .ndim = 3, .shape = {ME, MF, H}};
    struct rlx_host_tensor ti = {.data = ids_in, .dtype = RLX_I32, .ndim = 2, .shape = {MS, MK}};
    int ix, ii, ir, iw;
    if (s == RLX_OK) s = rlx_plan_param_index(plan, "router", &ir);
    if (s == RLX_OK) s = rlx_plan_param_index(plan, "w", &iw);
    if (s == RLX_OK) s = rlx_plan_set_param(plan, ir, &tr);
    if (s == RLX_OK) s = rlx_plan_set_param(plan, iw, &tw);
    if (s == RLX_OK) s = rlx_plan_input_index(plan, "x", &ix);
    if (s == RLX_OK) s = rlx_plan_set_input(plan, ix, &tx);
    if (s == RLX_OK && ids_in) s = rlx_plan_input_index(plan, "ids", &ii);
    if (s == RLX_OK && ids_in) s = rlx_plan_set_input(plan, ii, &ti);
    if (s == RLX_OK) s = rlx_plan_run(plan);
    if (s == RLX_OK) s = rlx_plan_read_output(plan, 0, out, sizeof(float) * MS * MF);
    rlx_plan_free(plan);
    return s;
}

static void test_moe(const char *name, const float *want)
{
    struct rlx_device *dev = NULL;
    CHECK(rlx_device_open(name, &dev) == RLX_OK, "open %s", name);
    if (!dev) return;
    float got[MS * MF];
    CHECK(moe_run(dev, NULL, got) == RLX_OK, "%s: the mixture runs", name);
    double err = 0, top = 0;
    for (int i = 0; i < MS * MF; i++) {
        err = fmax(err, fabs((double)got[i] - want[i]));
        top = fmax(top, fabs((double)want[i]));
    }
    CHECK(top > 0 && err <= 1e-5 * top, "%s: the mixture equals ref (max |diff| %g of %g)", name, err, top);
    static const int32_t bad[MS * MK] = {0, 1, 2, 3, 4, 5, 5, 6, 1, 0};
    CHECK(moe_run(dev, bad, got) == RLX_ERR_RANGE &&
              strstr(rlx_last_error(), "(matmul_id): expert id 6 (row 3, slot 1) is outside [0, 6)"),
          "%s: an expert id out of range refused, naming it", name);
    struct rlx_device_stats st;
    rlx_device_stats(dev, &st);
    CHECK(st.allocated_bytes == 0, "%s: everything freed after the mixture (%zu bytes left)", name, st.allocated_bytes);
    rlx_device_free(dev);
}

/* The value of `key` in rlx_build_info(), or -1. */
static long long build_fact(const char *key)
{
    const char *p = strstr(rlx_build_info(), key);
    return p ? atoll(p + strlen(key)) : -1;
}

int main(void)
{
    if (!strstr(rlx_backends(), "vulkan")) {
        const char *why = strstr(rlx_build_info(), "vulkan=");
        printf("SKIP: no usable Vulkan device (%s)\n", why ? why : "this build has no Vulkan backend");
        return check_summary();
    }
    struct rlx_device *ref = NULL;
    CHECK(rlx_device_open("ref", &ref) == RLX_OK, "open ref");
    struct net n;
    float want[S * N];
    static const int32_t pos[S] = {2, 3, 4, 5};
    CHECK(ref && make(ref, &n) && run(&n, pos, want) == RLX_OK, "the oracle runs on ref");
    unmake(&n);
    rlx_device_free(ref);
    test_device("vulkan", want);
    test_device("vulkan:staging", want);
    float want_moe[MS * MF];
    CHECK(rlx_device_open("ref", &ref) == RLX_OK && moe_run(ref, NULL, want_moe) == RLX_OK, "the mixture runs on ref");
    rlx_device_free(ref);
    test_moe("vulkan", want_moe);
    test_moe("vulkan:staging", want_moe);
    CHECK(build_fact("vulkan_validation_messages=") == 0, "no validation message (%lld)",
          build_fact("vulkan_validation_messages="));
    return check_summary();
}
