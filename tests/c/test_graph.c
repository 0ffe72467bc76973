/*
 * test_graph.c - the graph builder, the passes and the runtime from C, on both host backends:
 * a transformer-like block (matmul, rmsnorm, residual add, silu * gate) compiled with and
 * without fusion must agree with a direct scalar computation; symbols are inferred from input
 * shapes; memory is reused; bad shapes, dtypes, ids and missing bindings fail with statuses and
 * leave the plan usable. Runs under valgrind in `make test`.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/rlx.h"

#include "check.h"

enum { D = 8, F = 12 };

/* h = x + silu(x @ Wg^T) * (x @ Wu^T) @ Wd^T ; y = rmsnorm(h) * w */
static struct rlx_graph *block_graph(void)
{
    struct rlx_graph *g;
    rlx_graph_create(&g);
    struct rlx_dim xs[2] = {rlx_dim_sym(RLX_SYM_SEQ), rlx_dim_const(D)};
    struct rlx_dim wgs[2] = {rlx_dim_const(F), rlx_dim_const(D)}, wds[2] = {rlx_dim_const(D), rlx_dim_const(F)};
    struct rlx_dim ws[1] = {rlx_dim_const(D)};
    int x, wg, wu, wd, w, a, b, s, m, dn, h, y;
    rlx_graph_input(g, "x", RLX_F32, 2, xs, &x);
    rlx_graph_param(g, "wg", RLX_F32, 2, wgs, &wg);
    rlx_graph_param(g, "wu", RLX_F32, 2, wgs, &wu);
    rlx_graph_param(g, "wd", RLX_F32, 2, wds, &wd);
    rlx_graph_param(g, "w", RLX_F32, 1, ws, &w);
    struct rlx_attrs tb = {.trans_b = 1}, norm = {.eps = 1e-5f};
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){x, wg}, &tb, &a);
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){x, wu}, &tb, &b);
    rlx_graph_op(g, RLX_OP_SILU, 1, (int[]){a}, NULL, &s);
    rlx_graph_op(g, RLX_OP_MUL, 2, (int[]){s, b}, NULL, &m);
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){m, wd}, &tb, &dn);
    rlx_graph_op(g, RLX_OP_ADD, 2, (int[]){x, dn}, NULL, &h);
    rlx_graph_op(g, RLX_OP_RMSNORM, 2, (int[]){h, w}, &norm, &y);
    rlx_graph_output(g, y, "y");
    rlx_graph_output(g, h, "h");
    return g;
}

static void reference(int seq, const float *x, const float *wg, const float *wu, const float *wd, const float *w,
                      float *y, float *h)
{
    for (int t = 0; t < seq; t++) {
        float m[F];
        for (int f = 0; f < F; f++) {
            double a = 0, b = 0;
            for (int k = 0; k < D; k++) a += x[t * D + k] * wg[f * D + k], b += x[t * D + k] * wu[f * D + k];
            m[f] = (float)(a / (1 + exp(-a)) * b);
        }
        double ss = 0;
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int f = 0; f < F; f++) acc += m[f] * wd[d * F + f];
            h[t * D + d] = (float)(x[t * D + d] + acc);
            ss += (double)h[t * D + d] * h[t * D + d];
        }
        double r = 1.0 / sqrt(ss / D + 1e-5);
        for (int d = 0; d < D; d++) y[t * D + d] = (float)(h[t * D + d] * r * w[d]);
    }
}

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* Outputs bound to host memory: the same bits as read_output; on cpu (which wraps host memory)
 * written in place, so they leave the arena; on ref copied after the run, arena unchanged. The
 * binding lasts one run; a wrong size is refused and leaves the plan usable. */
static void test_bound_outputs(struct rlx_plan *p, const char *device, bool fuse)
{
    enum { SEQ = 5 };
    float x[SEQ * D], y[SEQ * D], h[SEQ * D], by[SEQ * D], bh[SEQ * D];
    for (int i = 0; i < SEQ * D; i++) x[i] = frand();
    struct rlx_host_tensor t = {.data = x, .dtype = RLX_F32, .ndim = 2, .shape = {SEQ, D}};
    const size_t bytes = sizeof(float) * SEQ * D;
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "unbound run");
    const size_t arena = rlx_plan_unshared_bytes(p);
    rlx_plan_read_output(p, 0, y, bytes);
    rlx_plan_read_output(p, 1, h, bytes);
    CHECK(rlx_plan_bind_output(p, 0, by, bytes) == RLX_OK && rlx_plan_bind_output(p, 1, bh, bytes) == RLX_OK,
          "bind outputs");
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "bound run");
    CHECK(memcmp(by, y, bytes) == 0 && memcmp(bh, h, bytes) == 0, "%s fuse=%d: bound outputs == read_output", device,
          fuse);
    float again[SEQ * D];
    CHECK(rlx_plan_read_output(p, 0, again, bytes) == RLX_OK && memcmp(again, y, bytes) == 0, "read after bound run");
    const size_t bound_arena = rlx_plan_unshared_bytes(p);
    if (strcmp(device, "cpu") == 0)
        CHECK(bound_arena < arena, "cpu fuse=%d: bound outputs take no arena space (%zu < %zu)", fuse, bound_arena, arena);
    else
        CHECK(bound_arena == arena, "%s: arena unchanged (%zu == %zu)", device, bound_arena, arena);
    memset(by, 0, bytes);
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "run after the binding");
    CHECK(by[0] == 0.0f && rlx_plan_unshared_bytes(p) == arena, "the binding lasted one run");
    CHECK(rlx_plan_bind_output(p, 1, bh, bytes - 4) == RLX_OK && rlx_plan_set_input(p, 0, &t) == RLX_OK &&
              rlx_plan_run(p) == RLX_ERR_SHAPE && strstr(rlx_last_error(), "output 'h'"),
          "wrong bound size refused");
    CHECK(rlx_plan_bind_output(p, 7, bh, bytes) == RLX_ERR_INVALID, "output index checked");
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "usable after a bad binding");
}

static void test_block(const char *device, bool fuse)
{
    struct rlx_graph *g = block_graph();
    struct rlx_compile_opts o = rlx_compile_opts_default();
    o.fuse = fuse;
    struct rlx_plan *p = NULL;
    CHECK(rlx_compile(g, device, &o, &p) == RLX_OK, "compile %s fuse=%d", device, fuse);
    rlx_graph_free(g);
    if (!p) return;
    static float wg[F * D], wu[F * D], wd[D * F], w[D];
    for (int i = 0; i < F * D; i++) wg[i] = frand(), wu[i] = frand(), wd[i] = frand();
    for (int i = 0; i < D; i++) w[i] = 1 + frand();
    const char *names[] = {"wg", "wu", "wd", "w"};
    const float *data[] = {wg, wu, wd, w};
    for (int i = 0; i < 4; i++) {
        int idx;
        CHECK(rlx_plan_param_index(p, names[i], &idx) == RLX_OK, "param %s", names[i]);
        struct rlx_host_tensor t = {.data = data[i], .dtype = RLX_F32, .ndim = i == 3 ? 1 : 2};
        t.shape[0] = i == 2 ? D : (i == 3 ? D : F);
        t.shape[1] = i == 2 ? F : D;
        CHECK(rlx_plan_set_param(p, idx, &t) == RLX_OK, "set %s", names[i]);
    }
    for (int seq = 1; seq <= 9; seq += 4) { /* one plan, several SEQ */
        float x[9 * D], y[9 * D], h[9 * D], ry[9 * D], rh[9 * D];
        for (int i = 0; i < seq * D; i++) x[i] = frand() * 2;
        struct rlx_host_tensor t = {.data = x, .dtype = RLX_F32, .ndim = 2, .shape = {seq, D}};
        CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK, "set x");
        CHECK(rlx_plan_run(p) == RLX_OK, "run %s seq=%d", device, seq);
        enum rlx_dtype dt;
        int nd;
        int64_t shape[RLX_MAX_DIMS];
        CHECK(rlx_plan_output_shape(p, 0, &dt, &nd, shape) == RLX_OK && nd == 2 && shape[0] == seq && shape[1] == D,
              "output shape");
        CHECK(rlx_plan_read_output(p, 0, y, sizeof(float) * (size_t)(seq * D)) == RLX_OK, "read y");
        CHECK(rlx_plan_read_output(p, 1, h, sizeof(float) * (size_t)(seq * D)) == RLX_OK, "read h");
        reference(seq, x, wg, wu, wd, w, ry, rh);
        double err = 0;
        for (int i = 0; i < seq * D; i++) err = fmax(err, fmax(fabs(y[i] - ry[i]), fabs(h[i] - rh[i])));
        CHECK(err < 1e-4, "%s fuse=%d seq=%d max err %g", device, fuse, seq, err);
    }
    CHECK(rlx_plan_planned_bytes(p) > 0 && rlx_plan_planned_bytes(p) < rlx_plan_unshared_bytes(p),
          "memory reused: %zu < %zu", rlx_plan_planned_bytes(p), rlx_plan_unshared_bytes(p));
    test_bound_outputs(p, device, fuse);
    /* errors leave the plan usable */
    float x[D] = {0};
    struct rlx_host_tensor bad = {.data = x, .dtype = RLX_I32, .ndim = 2, .shape = {1, D}};
    CHECK(rlx_plan_set_input(p, 0, &bad) == RLX_ERR_DTYPE, "wrong dtype rejected");
    bad.dtype = RLX_F32;
    bad.shape[1] = D + 1;
    CHECK(rlx_plan_set_input(p, 0, &bad) == RLX_OK && rlx_plan_run(p) == RLX_ERR_SHAPE, "wrong shape rejected");
    CHECK(rlx_plan_run(p) == RLX_ERR_INVALID, "missing input rejected");
    bad.shape[1] = D;
    CHECK(rlx_plan_set_input(p, 0, &bad) == RLX_OK && rlx_plan_run(p) == RLX_OK, "usable after errors");
    rlx_plan_free(p);
}

static int log_count;
static void count_logs(enum rlx_log_level level, const char *msg, void *user)
{
    (void)level;
    if (msg && msg[0]) (*(int *)user)++;
}

/* The log callback hears about compiles and memory plans; none is installed by default. */
static void test_log_callback(void)
{
    rlx_set_log_callback(count_logs, &log_count);
    struct rlx_graph *g = block_graph();
    struct rlx_plan *p = NULL;
    CHECK(rlx_compile(g, "cpu", NULL, &p) == RLX_OK && log_count >= 1, "a compile is logged (%d)", log_count);
    rlx_set_log_callback(NULL, NULL);
    int before = log_count;
    rlx_plan_free(p);
    CHECK(rlx_compile(g, "cpu", NULL, &p) == RLX_OK && log_count == before, "no callback, no calls");
    rlx_plan_free(p);
    rlx_graph_free(g);
}

static void test_errors(void)
{
    struct rlx_graph *g;
    rlx_graph_create(&g);
    struct rlx_dim s2[2] = {rlx_dim_sym(RLX_SYM_SEQ), rlx_dim_const(4)}, s3[2] = {rlx_dim_const(5), rlx_dim_const(3)};
    int a, b, c, ids, tab, e;
    rlx_graph_input(g, "a", RLX_F32, 2, s2, &a);
    rlx_graph_param(g, "b", RLX_F32, 2, s3, &b);
    CHECK(rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){a, b}, NULL, &c) == RLX_ERR_SHAPE, "matmul K mismatch");
    CHECK(strstr(rlx_last_error(), "node 2 (matmul)") && strstr(rlx_last_error(), "(SEQ, 4)"), "message names node");
    CHECK(rlx_graph_node_count(g) == 2, "failed add leaves graph unchanged");
    CHECK(rlx_graph_input(g, "a", RLX_F32, 2, s2, &c) == RLX_ERR_INVALID, "duplicate name");
    struct rlx_dim is[1] = {rlx_dim_sym(RLX_SYM_SEQ)};
    rlx_graph_input(g, "ids", RLX_I32, 1, is, &ids);
    rlx_graph_param(g, "tab", RLX_F32, 2, s3, &tab);
    CHECK(rlx_graph_op(g, RLX_OP_EMBEDDING, 2, (int[]){tab, ids}, NULL, &e) == RLX_OK, "embedding");
    rlx_graph_output(g, e, "e");
    struct rlx_plan *p;
    CHECK(rlx_compile(g, "nope", NULL, &p) == RLX_ERR_INVALID, "unknown device");
    CHECK(rlx_compile(g, "cpu", NULL, &p) == RLX_OK, "compile");
    float t[15] = {0};
    struct rlx_host_tensor tt = {.data = t, .dtype = RLX_F32, .ndim = 2, .shape = {5, 3}};
    int32_t idv[3] = {0, 5, 1};
    struct rlx_host_tensor it = {.data = idv, .dtype = RLX_I32, .ndim = 1, .shape = {3}};
    int pi, ii;
    rlx_plan_param_index(p, "tab", &pi);
    rlx_plan_input_index(p, "ids", &ii);
    CHECK(rlx_plan_run(p) == RLX_ERR_INVALID, "param not set");
    CHECK(rlx_plan_set_param(p, pi, &tt) == RLX_OK, "set tab");
    CHECK(rlx_plan_set_input(p, ii, &it) == RLX_OK && rlx_plan_run(p) == RLX_ERR_RANGE, "id out of range");
    CHECK(rlx_plan_input_index(p, "a", &ii) == RLX_OK, "unused input stays in the interface");
    rlx_plan_free(p);
    rlx_graph_free(g);
}

int main(void)
{
    srand(1);
    const char *devices[] = {"cpu", "ref"};
    for (int d = 0; d < 2; d++)
        for (int f = 0; f < 2; f++) test_block(devices[d], f);
    test_errors();
    test_log_callback();
    rlx_set_num_threads(1); /* joins the pool's workers */
    return check_summary();
}
