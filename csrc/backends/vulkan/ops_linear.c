/*
 * ops_linear.c - the ops that read weights: matmul (matvec.comp for a few rows with W stored
 * (N, K), one workgroup per output column; matmul.comp's tiled GEMM otherwise) and embedding
 * (embedding.comp), for weights of every real-valued dtype: f32, f16, bf16 and the GGUF block
 * types, which the shaders dequantise (weights.glsl). A weight, an activation or an output bigger
 * than one binding may span is split: W by rows, a and out by rows, each piece a dispatch of its
 * own. Never prints.
 */
#include <stddef.h>

#include "backends/vulkan/record.h"
#include "core/core.h"

/* matvec.comp's push constants */
struct pc_matvec {
    uint32_t M, K, N, w_off, w_row, a_off, o_off, o_stride, groups;
};
/* matmul.comp's push constants */
struct pc_matmul {
    uint32_t M, K, N, w_off, w_row, a_off, o_off, o_stride, trans_b, tiles_n, groups;
};
/* embedding.comp's push constants */
struct pc_embedding {
    uint32_t n, d, vocab, v0, vrows, w_off, w_row, ids_off, o_off, node, r0, items;
};
static_assert(sizeof(struct pc_matmul) <= RLX_VK_PUSH_BYTES && sizeof(struct pc_embedding) <= RLX_VK_PUSH_BYTES,
              "push constants fit the layout");

/* The shaders' dtype ids (common.glsl's DT_*) are enum rlx_dtype's, and the per-dtype variants
 * of each shader are listed in dtype order in shaders.list (f32, f16, bf16, then the block types). */
static_assert(RLX_F32 == 0 && RLX_F16 == 1 && RLX_BF16 == 2 && RLX_I32 == 3 && RLX_U8 == 4 && RLX_Q8_0 == 5 &&
                  RLX_Q4_0 == 6 && RLX_Q4_1 == 7 && RLX_Q5_0 == 8 && RLX_Q5_1 == 9 && RLX_Q2_K == 10 &&
                  RLX_Q3_K == 11 && RLX_Q4_K == 12 && RLX_Q5_K == 13 && RLX_Q6_K == 14 && RLX_DTYPE_COUNT == 15,
              "common.glsl's DT_* ids");
static_assert(RLX_VK_SH_MATVEC_Q6_K - RLX_VK_SH_MATVEC_F32 == 12 &&
                  RLX_VK_SH_MATMUL_Q6_K - RLX_VK_SH_MATMUL_F32 == 12 &&
                  RLX_VK_SH_EMBEDDING_Q6_K - RLX_VK_SH_EMBEDDING_F32 == 12,
              "shaders.list lists one variant per weight dtype, in dtype order");

/* The variant of `first` (an _F32 shader) for weights of dtype dt. */
static enum rlx_vk_shader variant(enum rlx_vk_shader first, enum rlx_dtype dt)
{
    return (enum rlx_vk_shader)(first + (dt <= RLX_BF16 ? (int)dt : (int)dt - 2));
}

/* Bytes of one stored row of a weight whose rows hold `len` elements. */
static uint64_t row_bytes(enum rlx_dtype dt, int64_t len)
{
    const struct rlx_dtype_traits *t = rlx_dtype_traits(dt);
    return (uint64_t)(len / t->block_size) * t->type_size;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static rlx_status too_big(const struct rlx_vk_rec *r, const char *what, uint64_t bytes)
{
    return rlx_set_error(RLX_ERR_UNSUPPORTED,
                         "node %d (%s): %s of %llu bytes exceeds the %llu bytes one binding may "
                         "span on this device (maxStorageBufferRange)",
                         r->node, r->op, what, (unsigned long long)bytes, (unsigned long long)rlx_vk_span_limit(r));
}

rlx_status rlx_vk_op_matmul(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *a = &v[nd->in[0]], *w = &v[nd->in[1]], *out = &v[id];
    const int64_t M = rlx_vk_rows(a), K = a->shape[a->ndim - 1], N = out->shape[out->ndim - 1];
    if (M == 0 || N == 0) return RLX_OK;
    if (K == 0) return rlx_vk_record_zero(r, rlx_vk_tbuf(out), out->offset, rlx_vk_tbytes(out));
    const bool trans = nd->attrs.trans_b != 0, block = rlx_dtype_traits(w->dtype)->block_size > 1;
    const uint64_t limit = rlx_vk_span_limit(r), wrow = row_bytes(w->dtype, trans ? K : N);
    /* W rows, and rows of a and out, per dispatch */
    const int64_t wn = trans ? min64(N, (int64_t)(limit / wrow)) : N;
    int64_t am = min64(M, min64((int64_t)(limit / ((uint64_t)K * 4)), (int64_t)(limit / ((uint64_t)N * 4))));
    if (!trans && rlx_vk_tbytes(w) > limit) return too_big(r, "a (K, N) weight", rlx_vk_tbytes(w));
    if (wn < 1) return too_big(r, "one weight row", wrow);
    if (am < 1) return too_big(r, "one row", (uint64_t)(K > N ? K : N) * 4);
    /* the matvec shader up to 8 rows (each row alone: the same bits whatever rows are beside it), the
     * tiled one beyond; a batch-invariant plan keeps a decode step's rows on the matvec, 8 a dispatch
     * (b (K, N), never a weight's layout: one row a dispatch) */
    bool vec = trans && M <= 8;
    if (r->batch_invariant && M <= RLX_INVARIANT_ROWS) {
        vec = trans;
        am = min64(am, trans ? 8 : 1);
    }
    const enum rlx_vk_shader sh = variant(vec ? RLX_VK_SH_MATVEC_F32 : RLX_VK_SH_MATMUL_F32, w->dtype);
    const uint32_t w_row = block ? (uint32_t)wrow : rlx_vk_u32(trans ? K : N);
    for (int64_t m0 = 0; m0 < M; m0 += am) {
        const int64_t mr = min64(am, M - m0);
        for (int64_t n0 = 0; n0 < N; n0 += wn) {
            const int64_t nr = min64(wn, N - n0);
            struct pc_matmul pc = {.M = rlx_vk_u32(mr),
                                   .K = rlx_vk_u32(K),
                                   .N = rlx_vk_u32(nr),
                                   .w_row = w_row,
                                   .o_stride = rlx_vk_u32(N),
                                   .trans_b = trans,
                                   .tiles_n = rlx_vk_u32((nr + 63) / 64)};
            const uint64_t groups =
                vec ? (uint64_t)nr * (uint64_t)((mr + 3) / 4) : pc.tiles_n * (uint64_t)((mr + 63) / 64);
            pc.groups = rlx_vk_u32((int64_t)groups);
            struct rlx_vk_bind b[3] = {
                {.buf = rlx_vk_tbuf(w),
                 .offset = w->offset + (uint64_t)n0 * wrow,
                 .bytes = trans ? (uint64_t)nr * wrow : rlx_vk_tbytes(w),
                 .off = &pc.w_off,
                 .unit = block ? 1u : (uint32_t)rlx_dtype_traits(w->dtype)->type_size},
                {.buf = rlx_vk_tbuf(a),
                 .offset = a->offset + (uint64_t)(m0 * K) * 4,
                 .bytes = (uint64_t)(mr * K) * 4,
                 .off = &pc.a_off,
                 .unit = 4},
                {.buf = rlx_vk_tbuf(out),
                 .offset = out->offset + (uint64_t)(m0 * N + n0) * 4,
                 .bytes = (uint64_t)((mr - 1) * N + nr) * 4,
                 .write = true,
                 .off = &pc.o_off,
                 .unit = 4},
            };
            if (vec) {
                struct pc_matvec mv = {
                    .M = pc.M, .K = pc.K, .N = pc.N, .w_row = pc.w_row, .o_stride = pc.o_stride, .groups = pc.groups};
                b[0].off = &mv.w_off, b[1].off = &mv.a_off, b[2].off = &mv.o_off;
                RLX_TRY(rlx_vk_dispatch(r, sh, b, 3, &mv, sizeof mv, groups));
            } else {
                RLX_TRY(rlx_vk_dispatch(r, sh, b, 3, &pc, sizeof pc, groups));
            }
        }
    }
    return RLX_OK;
}

rlx_status rlx_vk_op_embedding(struct rlx_vk_rec *r, const struct rlx_graph *g, int id, const struct rlx_tensor *v)
{
    const struct rlx_node *nd = &g->nodes[id];
    const struct rlx_tensor *table = &v[nd->in[0]], *ids = &v[nd->in[1]], *out = &v[id];
    const int64_t n = rlx_tensor_numel(ids), V = table->shape[0], d = table->shape[1];
    if (n == 0 || d == 0) return RLX_OK;
    const bool block = rlx_dtype_traits(table->dtype)->block_size > 1;
    const uint64_t limit = rlx_vk_span_limit(r), wrow = row_bytes(table->dtype, d);
    const int64_t vr = min64(V, (int64_t)(limit / wrow)), nr_max = min64(n, (int64_t)(limit / ((uint64_t)d * 4)));
    if (vr < 1) return too_big(r, "one table row", wrow);
    if (nr_max < 1) return too_big(r, "one output row", (uint64_t)d * 4);
    const enum rlx_vk_shader sh = variant(RLX_VK_SH_EMBEDDING_F32, table->dtype);
    for (int64_t r0 = 0; r0 < n; r0 += nr_max) {
        const int64_t nr = min64(nr_max, n - r0);
        for (int64_t v0 = 0; v0 < V; v0 += vr) {
            const int64_t rows = min64(vr, V - v0);
            struct pc_embedding pc = {.n = rlx_vk_u32(nr),
                                      .d = rlx_vk_u32(d),
                                      .vocab = rlx_vk_u32(V),
                                      .v0 = rlx_vk_u32(v0),
                                      .vrows = rlx_vk_u32(rows),
                                      .w_row = block ? (uint32_t)wrow : rlx_vk_u32(d),
                                      .node = rlx_vk_u32(id),
                                      .r0 = rlx_vk_u32(r0),
                                      .items = rlx_vk_u32(block ? nr * (d / 16) : nr * d)};
            struct rlx_vk_bind b[4] = {
                {.buf = rlx_vk_tbuf(table),
                 .offset = table->offset + (uint64_t)v0 * wrow,
                 .bytes = (uint64_t)rows * wrow,
                 .off = &pc.w_off,
                 .unit = block ? 1u : (uint32_t)rlx_dtype_traits(table->dtype)->type_size},
                {.buf = rlx_vk_tbuf(ids),
                 .offset = ids->offset + (uint64_t)r0 * 4,
                 .bytes = (uint64_t)nr * 4,
                 .off = &pc.ids_off,
                 .unit = 4},
                {.buf = rlx_vk_tbuf(out),
                 .offset = out->offset + (uint64_t)(r0 * d) * 4,
                 .bytes = (uint64_t)(nr * d) * 4,
                 .write = true,
                 .off = &pc.o_off,
                 .unit = 4},
                rlx_vk_status(r),
            };
            RLX_TRY(rlx_vk_dispatch(r, sh, b, 4, &pc, sizeof pc, rlx_vk_groups(r, sh, pc.items)));
        }
    }
    return RLX_OK;
}

enum rlx_vk_shader rlx_vk_weight_shader(enum rlx_vk_shader first, enum rlx_dtype dt) { return variant(first, dt); }
