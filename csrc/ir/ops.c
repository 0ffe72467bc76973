/*
 * ops.c - the op table: each op's name, arity and shape rule. A shape rule reads the node's
 * inputs (already inferred), checks dtypes and shapes, and sets the node's dtype and shape. Its
 * error names the node, the op and the shapes involved. Adding an op to enum rlx_op fails to
 * compile until this table knows it.
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "ir/graph.h"

#define IN(k) (&g->nodes[n->in[k]])

static rlx_status fail(const struct rlx_graph *g, int id, const struct rlx_node *n, rlx_status s, const char *why)
{
    char shapes[768];
    size_t len = 0;
    shapes[0] = '\0';
    for (int k = 0; k < n->n_in && len < sizeof shapes; k++) {
        const struct rlx_node *in = IN(k);
        char sh[160];
        rlx_shape_format(g, in->ndim, in->shape, sh, sizeof sh);
        len += (size_t)snprintf(shapes + len, sizeof shapes - len, "%s%%%d %s%s", k ? ", " : "", n->in[k],
                                rlx_dtype_name(in->dtype), sh);
    }
    return rlx_set_error(s, "node %d (%s): %s; inputs: %s", id, rlx_op_table[n->op].name, why, shapes);
}

static void set_out(struct rlx_node *n, enum rlx_dtype dt, int ndim, const struct rlx_dim *shape)
{
    n->dtype = dt;
    n->ndim = ndim;
    for (int i = 0; i < ndim; i++) n->shape[i] = shape[i];
}

static bool all_f32(const struct rlx_graph *g, const struct rlx_node *n, int count)
{
    for (int k = 0; k < count; k++)
        if (IN(k)->dtype != RLX_F32) return false;
    return true;
}

static bool same_shape(const struct rlx_node *a, const struct rlx_node *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (!rlx_dim_equal(&a->shape[i], &b->shape[i])) return false;
    return true;
}

static bool const_dim(const struct rlx_dim *d, int64_t *v)
{
    if (!rlx_dim_is_const(d)) return false;
    *v = d->c;
    return true;
}

static rlx_status infer_leaf(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    (void)g, (void)id, (void)n;
    return RLX_OK;
}

static bool is_lowp(enum rlx_dtype dt) { return dt == RLX_BF16 || dt == RLX_F16; }

/* A weight of a matmul, an embedding or a matmul_id: any real-valued dtype (f32, 16-bit, the block
 * types). A block type must be stored in rows (..., K) of constant K in whole blocks. */
static bool weight_fits(const struct rlx_node *w, enum rlx_dtype *bad_block)
{
    const struct rlx_dtype_traits *t = rlx_dtype_traits(w->dtype);
    int64_t k;
    *bad_block = RLX_DTYPE_COUNT;
    if (!t || !t->is_float) return false;
    if (t->block_size > 1 && (w->ndim < 2 || !const_dim(&w->shape[w->ndim - 1], &k) || k % t->block_size)) {
        *bad_block = w->dtype;
        return false;
    }
    return true;
}

/* Shape ops move whole elements: block types stay out of them. */
static bool elementwise_dtype(enum rlx_dtype dt) { return rlx_dtype_traits(dt)->block_size == 1; }

static rlx_status infer_matmul(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *a = IN(0), *b = IN(1);
    enum rlx_dtype bad = RLX_DTYPE_COUNT; /* set by weight_fits, which a failed dtype test skips */
    if (a->dtype != RLX_F32 || !weight_fits(b, &bad))
        return fail(g, id, n, RLX_ERR_DTYPE,
                    bad != RLX_DTYPE_COUNT ? "a block-type b must be (N, K) with K a whole number of blocks"
                                           : "matmul takes f32 a and a real-valued b (f32, f16, bf16, q8_0)");
    if (b->dtype != RLX_F32 && !n->attrs.trans_b)
        return fail(g, id, n, RLX_ERR_DTYPE, "a b other than f32 must be stored (N, K) and read with trans_b");
    if (a->ndim < 1 || b->ndim != 2) return fail(g, id, n, RLX_ERR_SHAPE, "a must have rank >= 1 and b rank 2");
    const struct rlx_dim *kb = n->attrs.trans_b ? &b->shape[1] : &b->shape[0];
    const struct rlx_dim *nb = n->attrs.trans_b ? &b->shape[0] : &b->shape[1];
    if (!rlx_dim_equal(&a->shape[a->ndim - 1], kb))
        return fail(g, id, n, RLX_ERR_SHAPE,
                    n->attrs.trans_b ? "a (..., K) and b (N, K) disagree on K"
                                     : "a (..., K) and b (K, N) disagree on K");
    struct rlx_dim shape[RLX_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[a->ndim - 1] = *nb;
    set_out(n, RLX_F32, a->ndim, shape);
    return RLX_OK;
}

static rlx_status infer_embedding(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *t = IN(0), *ids = IN(1);
    enum rlx_dtype bad = RLX_DTYPE_COUNT; /* set by weight_fits, which a failed dtype test skips */
    if (!weight_fits(t, &bad) || ids->dtype != RLX_I32)
        return fail(g, id, n, RLX_ERR_DTYPE, "embedding takes a real-valued table (rows of whole blocks) and i32 ids");
    if (t->ndim != 2 || ids->ndim < 1 || ids->ndim > RLX_MAX_DIMS - 1)
        return fail(g, id, n, RLX_ERR_SHAPE, "table must be (V, D) and ids of rank 1..3");
    struct rlx_dim shape[RLX_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof shape);
    shape[ids->ndim] = t->shape[1];
    set_out(n, RLX_F32, ids->ndim + 1, shape);
    return RLX_OK;
}

static rlx_status infer_rmsnorm(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0), *w = IN(1);
    if (!all_f32(g, n, 2)) return fail(g, id, n, RLX_ERR_DTYPE, "rmsnorm takes f32 x and w");
    if (x->ndim < 1 || w->ndim != 1 || !rlx_dim_equal(&x->shape[x->ndim - 1], &w->shape[0]))
        return fail(g, id, n, RLX_ERR_SHAPE, "x must be (..., D) and w (D)");
    if (!(n->attrs.eps >= 0.0f)) return fail(g, id, n, RLX_ERR_INVALID, "eps must be >= 0");
    set_out(n, RLX_F32, x->ndim, x->shape);
    return RLX_OK;
}

static rlx_status infer_add_rmsnorm(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *a = IN(0), *b = IN(1), *w = IN(2);
    if (!all_f32(g, n, 3)) return fail(g, id, n, RLX_ERR_DTYPE, "add_rmsnorm takes f32 inputs");
    if (!same_shape(a, b) || a->ndim < 1 || w->ndim != 1 || !rlx_dim_equal(&a->shape[a->ndim - 1], &w->shape[0]))
        return fail(g, id, n, RLX_ERR_SHAPE, "a and b must be equal (..., D) and w (D)");
    set_out(n, RLX_F32, a->ndim, a->shape);
    return RLX_OK;
}

static rlx_status infer_rope(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0), *pos = IN(1), *f = IN(2);
    if (x->dtype != RLX_F32 || pos->dtype != RLX_I32 || f->dtype != RLX_F32)
        return fail(g, id, n, RLX_ERR_DTYPE, "rope takes f32 x, i32 positions and f32 inv_freq");
    int64_t d, half;
    if (x->ndim != 3 || pos->ndim != 1 || f->ndim != 1 || !const_dim(&x->shape[2], &d) || d % 2 ||
        !const_dim(&f->shape[0], &half) || half * 2 != d || !rlx_dim_equal(&pos->shape[0], &x->shape[0]))
        return fail(g, id, n, RLX_ERR_SHAPE, "x must be (S, H, D) with constant even D, positions (S), inv_freq (D/2)");
    set_out(n, RLX_F32, 3, x->shape);
    return RLX_OK;
}

static rlx_status infer_unary(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0);
    if (x->dtype != RLX_F32) return fail(g, id, n, RLX_ERR_DTYPE, "takes f32");
    if (x->ndim < 1) return fail(g, id, n, RLX_ERR_SHAPE, "needs rank >= 1");
    set_out(n, RLX_F32, x->ndim, x->shape);
    return RLX_OK;
}

static rlx_status infer_binary(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *a = IN(0), *b = IN(1);
    if (!all_f32(g, n, 2)) return fail(g, id, n, RLX_ERR_DTYPE, "takes f32 operands");
    bool ok = a->ndim >= 1 && b->ndim >= 1 && b->ndim <= a->ndim;
    for (int i = 0; ok && i < b->ndim; i++) ok = rlx_dim_equal(&b->shape[b->ndim - 1 - i], &a->shape[a->ndim - 1 - i]);
    if (!ok) return fail(g, id, n, RLX_ERR_SHAPE, "b's shape must equal the trailing dims of a's shape");
    set_out(n, RLX_F32, a->ndim, a->shape);
    return RLX_OK;
}

static rlx_status infer_silu_mul(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    if (!all_f32(g, n, 2)) return fail(g, id, n, RLX_ERR_DTYPE, "takes f32 operands");
    if (!same_shape(IN(0), IN(1)) || IN(0)->ndim < 1)
        return fail(g, id, n, RLX_ERR_SHAPE, "a and b must have equal shapes");
    set_out(n, RLX_F32, IN(0)->ndim, IN(0)->shape);
    return RLX_OK;
}

static bool is_kv_dtype(enum rlx_dtype dt) { return dt == RLX_F32 || is_lowp(dt); }

/* Inputs: q, k, v [, mask]. */
static rlx_status infer_attention(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *q = IN(0), *k = IN(1), *v = IN(2);
    if (q->dtype != RLX_F32 || !is_kv_dtype(k->dtype) || v->dtype != k->dtype)
        return fail(g, id, n, RLX_ERR_DTYPE, "q must be f32, k and v f32, f16 or bf16 (the same dtype)");
    int64_t hq, hkv, d;
    if (q->ndim != 3 || !same_shape(k, v) || k->ndim != 3 || !const_dim(&q->shape[1], &hq) ||
        !const_dim(&k->shape[1], &hkv) || !const_dim(&q->shape[2], &d) || !rlx_dim_equal(&k->shape[2], &q->shape[2]))
        return fail(g, id, n, RLX_ERR_SHAPE, "q must be (S, Hq, D), k and v (T, Hkv, D) with constant heads and D");
    if (hkv < 1 || hq % hkv) return fail(g, id, n, RLX_ERR_SHAPE, "query heads must be a multiple of kv heads");
    int64_t s, t;
    if (const_dim(&q->shape[0], &s) && const_dim(&k->shape[0], &t) && t < s)
        return fail(g, id, n, RLX_ERR_SHAPE, "fewer keys than queries (T < S): the queries are the last T positions");
    if (n->n_in == 4) {
        const struct rlx_node *m = IN(3);
        if (m->dtype != RLX_F32 && m->dtype != RLX_U8)
            return fail(g, id, n, RLX_ERR_DTYPE, "mask must be f32 (additive) or u8 (1 = attend)");
        if (m->ndim != 2 || !rlx_dim_equal(&m->shape[0], &q->shape[0]) || !rlx_dim_equal(&m->shape[1], &k->shape[0]))
            return fail(g, id, n, RLX_ERR_SHAPE, "mask must be (S, T)");
    }
    if (n->attrs.window < 0) return fail(g, id, n, RLX_ERR_INVALID, "window must be >= 0");
    if (!(n->attrs.scale > 0.0f)) return fail(g, id, n, RLX_ERR_INVALID, "scale must be > 0");
    set_out(n, RLX_F32, 3, q->shape);
    return RLX_OK;
}

/* Inputs: state (T, ...), rows f32 (S, ...), pos i32 (S). The state must be a STATE leaf or an
 * earlier write to one: the write lands in the state's own memory. */
static rlx_status infer_cache_write(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *st = IN(0), *rows = IN(1), *pos = IN(2);
    if (st->op != RLX_OP_STATE && st->op != RLX_OP_CACHE_WRITE)
        return fail(g, id, n, RLX_ERR_INVALID, "the first input must be a state (or a write to one)");
    if (!is_kv_dtype(st->dtype) || rows->dtype != RLX_F32 || pos->dtype != RLX_I32)
        return fail(g, id, n, RLX_ERR_DTYPE, "takes an f32, f16 or bf16 state, f32 rows and i32 positions");
    bool ok =
        st->ndim >= 1 && rows->ndim == st->ndim && pos->ndim == 1 && rlx_dim_equal(&pos->shape[0], &rows->shape[0]);
    for (int i = 1; ok && i < st->ndim; i++) ok = rlx_dim_equal(&st->shape[i], &rows->shape[i]);
    if (!ok) return fail(g, id, n, RLX_ERR_SHAPE, "rows must be (S, ...) with the state's trailing dims, pos (S)");
    set_out(n, st->dtype, st->ndim, st->shape);
    return RLX_OK;
}

static rlx_status infer_convert(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0);
    if (x->dtype != RLX_F32 || !is_kv_dtype((enum rlx_dtype)n->attrs.dtype))
        return fail(g, id, n, RLX_ERR_DTYPE, "converts f32 to f32, f16 or bf16 (attrs.dtype)");
    if (x->ndim < 1) return fail(g, id, n, RLX_ERR_SHAPE, "needs rank >= 1");
    set_out(n, (enum rlx_dtype)n->attrs.dtype, x->ndim, x->shape);
    return RLX_OK;
}

static rlx_status infer_gather_last(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0);
    if (!elementwise_dtype(x->dtype)) return fail(g, id, n, RLX_ERR_DTYPE, "takes no block types");
    if (x->ndim < 1) return fail(g, id, n, RLX_ERR_SHAPE, "needs rank >= 1");
    struct rlx_dim shape[RLX_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = rlx_dim_const(1);
    set_out(n, x->dtype, x->ndim, shape);
    return RLX_OK;
}

static bool norm_axis(int ndim, int32_t *axis)
{
    if (*axis < 0) *axis += ndim;
    return *axis >= 0 && *axis < ndim;
}

static rlx_status infer_concat(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *a = IN(0), *b = IN(1);
    if (a->dtype != b->dtype || !elementwise_dtype(a->dtype))
        return fail(g, id, n, RLX_ERR_DTYPE, "operands must share a dtype (not a block type)");
    if (a->ndim != b->ndim || !norm_axis(a->ndim, &n->attrs.axis))
        return fail(g, id, n, RLX_ERR_SHAPE, "operands must share a rank and the axis must be inside it");
    for (int i = 0; i < a->ndim; i++)
        if (i != n->attrs.axis && !rlx_dim_equal(&a->shape[i], &b->shape[i]))
            return fail(g, id, n, RLX_ERR_SHAPE, "dims other than the axis must agree");
    struct rlx_dim shape[RLX_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[n->attrs.axis] = rlx_dim_add(&a->shape[n->attrs.axis], &b->shape[n->attrs.axis]);
    set_out(n, a->dtype, a->ndim, shape);
    return RLX_OK;
}

static rlx_status infer_slice(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0);
    if (!elementwise_dtype(x->dtype)) return fail(g, id, n, RLX_ERR_DTYPE, "takes no block types");
    if (x->ndim < 1 || !norm_axis(x->ndim, &n->attrs.axis))
        return fail(g, id, n, RLX_ERR_SHAPE, "the axis must be inside x's rank");
    if (n->attrs.len < 1) return fail(g, id, n, RLX_ERR_INVALID, "len must be >= 1");
    int64_t extent;
    if (const_dim(&x->shape[n->attrs.axis], &extent)) {
        int64_t start = n->attrs.start < 0 ? extent + n->attrs.start : n->attrs.start;
        if (start < 0 || start + n->attrs.len > extent)
            return fail(g, id, n, RLX_ERR_SHAPE, "start/len fall outside the axis");
    }
    struct rlx_dim shape[RLX_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[n->attrs.axis] = rlx_dim_const(n->attrs.len);
    set_out(n, x->dtype, x->ndim, shape);
    return RLX_OK;
}

static rlx_status infer_reshape(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0);
    if (!elementwise_dtype(x->dtype)) return fail(g, id, n, RLX_ERR_DTYPE, "takes no block types");
    if (n->attrs.ndim < 1 || n->attrs.ndim > RLX_MAX_DIMS)
        return fail(g, id, n, RLX_ERR_SHAPE, "target rank must be 1..4");
    for (int i = 0; i < n->attrs.ndim; i++)
        for (int s = 0; s < RLX_MAX_SYMS; s++)
            if (n->attrs.shape[i].coef[s] < 0 || (n->attrs.shape[i].coef[s] && s >= g->n_syms))
                return fail(g, id, n, RLX_ERR_SHAPE, "target shape uses a negative coefficient or an undefined symbol");
    if (!rlx_shapes_same_numel(x->ndim, x->shape, n->attrs.ndim, n->attrs.shape)) {
        char sh[160], why[256];
        rlx_shape_format(g, n->attrs.ndim, n->attrs.shape, sh, sizeof sh);
        snprintf(why, sizeof why, "target shape %s does not hold the same number of elements", sh);
        return fail(g, id, n, RLX_ERR_SHAPE, why);
    }
    set_out(n, x->dtype, n->attrs.ndim, n->attrs.shape);
    return RLX_OK;
}

static rlx_status infer_fused_out(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *p = IN(0);
    if (p->op != RLX_OP_ADD_RMSNORM) return fail(g, id, n, RLX_ERR_INTERNAL, "input is not a fused producer");
    set_out(n, p->dtype, p->ndim, p->shape);
    return RLX_OK;
}

/* Inputs: x (..., N). Output i32 (..., k). */
static rlx_status infer_topk(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *x = IN(0);
    if (x->dtype != RLX_F32) return fail(g, id, n, RLX_ERR_DTYPE, "topk takes f32");
    int64_t len;
    if (x->ndim < 1 || !const_dim(&x->shape[x->ndim - 1], &len))
        return fail(g, id, n, RLX_ERR_SHAPE, "x must be (..., N) with constant N");
    if (n->attrs.k < 1 || n->attrs.k > len) return fail(g, id, n, RLX_ERR_INVALID, "k must be in [1, N]");
    struct rlx_dim shape[RLX_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = rlx_dim_const(n->attrs.k);
    set_out(n, RLX_I32, x->ndim, shape);
    return RLX_OK;
}

/* Inputs: a (S, A, K), ids (S, n), w (E, N, K). Output (S, n, N). */
static rlx_status infer_matmul_id(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *a = IN(0), *ids = IN(1), *w = IN(2);
    enum rlx_dtype bad = RLX_DTYPE_COUNT; /* set by weight_fits, which a failed dtype test skips */
    if (a->dtype != RLX_F32 || ids->dtype != RLX_I32 || !weight_fits(w, &bad))
        return fail(g, id, n, RLX_ERR_DTYPE,
                    bad != RLX_DTYPE_COUNT ? "a block-type w must be (E, N, K) with K a whole number of blocks"
                                           : "matmul_id takes f32 a, i32 ids and a real-valued w");
    int64_t slots, rows, experts, wn;
    if (a->ndim != 3 || ids->ndim != 2 || w->ndim != 3 || !rlx_dim_equal(&a->shape[0], &ids->shape[0]) ||
        !const_dim(&ids->shape[1], &slots) || !const_dim(&a->shape[1], &rows) || (rows != 1 && rows != slots) ||
        !const_dim(&w->shape[0], &experts) || experts < 1 || !const_dim(&w->shape[1], &wn) ||
        !rlx_dim_equal(&a->shape[2], &w->shape[2]))
        return fail(g, id, n, RLX_ERR_SHAPE,
                    "a must be (S, A, K) with A = 1 or n, ids (S, n), w (E, N, K) "
                    "with constant E, N and n");
    set_out(n, RLX_F32, 3, (struct rlx_dim[]){a->shape[0], ids->shape[1], w->shape[1]});
    return RLX_OK;
}

/* Inputs: y (S, n, H), probs (S, E), ids (S, n). Output (S, H). */
static rlx_status infer_moe_combine(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_node *y = IN(0), *p = IN(1), *ids = IN(2);
    if (y->dtype != RLX_F32 || p->dtype != RLX_F32 || ids->dtype != RLX_I32)
        return fail(g, id, n, RLX_ERR_DTYPE, "moe_combine takes f32 y and probs, i32 ids");
    int64_t e;
    if (y->ndim != 3 || p->ndim != 2 || ids->ndim != 2 || !rlx_dim_equal(&y->shape[0], &p->shape[0]) ||
        !rlx_dim_equal(&y->shape[0], &ids->shape[0]) || !rlx_dim_equal(&y->shape[1], &ids->shape[1]) ||
        !const_dim(&p->shape[1], &e) || e < 1)
        return fail(g, id, n, RLX_ERR_SHAPE, "y must be (S, n, H), probs (S, E) with constant E, ids (S, n)");
    set_out(n, RLX_F32, 2, (struct rlx_dim[]){y->shape[0], y->shape[2]});
    return RLX_OK;
}

/* The rows, listed once: X(op, name, min inputs, max inputs, user-visible, shape rule). The table
 * and a count of the rows are both made from this list; the static assertions below lock them to
 * the enum (exactly RLX_OP_COUNT rows, none past it), and -Woverride-init (an error here) refuses
 * an op listed twice, so every op has exactly one row. */
#define OP_ROWS(X)                                                                                                     \
    X(RLX_OP_INPUT, "input", 0, 0, false, infer_leaf)                                                                  \
    X(RLX_OP_PARAM, "param", 0, 0, false, infer_leaf)                                                                  \
    X(RLX_OP_MATMUL, "matmul", 2, 2, true, infer_matmul)                                                               \
    X(RLX_OP_EMBEDDING, "embedding", 2, 2, true, infer_embedding)                                                      \
    X(RLX_OP_RMSNORM, "rmsnorm", 2, 2, true, infer_rmsnorm)                                                            \
    X(RLX_OP_ROPE, "rope", 3, 3, true, infer_rope)                                                                     \
    X(RLX_OP_SOFTMAX, "softmax", 1, 1, true, infer_unary)                                                              \
    X(RLX_OP_SILU, "silu", 1, 1, true, infer_unary)                                                                    \
    X(RLX_OP_ADD, "add", 2, 2, true, infer_binary)                                                                     \
    X(RLX_OP_MUL, "mul", 2, 2, true, infer_binary)                                                                     \
    X(RLX_OP_ATTENTION, "attention", 3, 4, true, infer_attention)                                                      \
    X(RLX_OP_GATHER_LAST, "gather_last", 1, 1, true, infer_gather_last)                                                \
    X(RLX_OP_CONCAT, "concat", 2, 2, true, infer_concat)                                                               \
    X(RLX_OP_SLICE, "slice", 1, 1, true, infer_slice)                                                                  \
    X(RLX_OP_RESHAPE, "reshape", 1, 1, true, infer_reshape)                                                            \
    X(RLX_OP_SILU_MUL, "silu_mul", 2, 2, false, infer_silu_mul)                                                        \
    X(RLX_OP_ADD_RMSNORM, "add_rmsnorm", 3, 3, false, infer_add_rmsnorm)                                               \
    X(RLX_OP_FUSED_OUT, "fused_out", 1, 1, false, infer_fused_out)                                                     \
    X(RLX_OP_STATE, "state", 0, 0, false, infer_leaf)                                                                  \
    X(RLX_OP_CACHE_WRITE, "cache_write", 3, 3, false, infer_cache_write)                                               \
    X(RLX_OP_CONVERT, "convert", 1, 1, true, infer_convert)                                                            \
    X(RLX_OP_TOPK, "topk", 1, 1, true, infer_topk)                                                                     \
    X(RLX_OP_MATMUL_ID, "matmul_id", 3, 3, true, infer_matmul_id)                                                      \
    X(RLX_OP_MOE_COMBINE, "moe_combine", 3, 3, true, infer_moe_combine)

#define AS_ROW(op, nm, lo, hi, usr, fn) [op] = {.name = nm, .min_in = lo, .max_in = hi, .user = usr, .infer = fn},
#define PLUS_ONE(...)                   +1

const struct rlx_op_info rlx_op_table[] = {OP_ROWS(AS_ROW)};
static_assert(0 OP_ROWS(PLUS_ONE) == RLX_OP_COUNT, "op table: one row per op");
static_assert(sizeof rlx_op_table / sizeof rlx_op_table[0] == RLX_OP_COUNT, "op table: a row past the enum");

rlx_status rlx_infer_node(const struct rlx_graph *g, int id, struct rlx_node *n)
{
    const struct rlx_op_info *info = &rlx_op_table[n->op];
    if (n->n_in < info->min_in || n->n_in > info->max_in)
        return rlx_set_error(RLX_ERR_INVALID, "node %d (%s): takes %d..%d inputs, got %d", id, info->name, info->min_in,
                             info->max_in, n->n_in);
    return info->infer(g, id, n);
}

const char *rlx_op_name(enum rlx_op op) { return ((unsigned)op < RLX_OP_COUNT) ? rlx_op_table[op].name : "?"; }

rlx_status rlx_op_parse(const char *name, enum rlx_op *out)
{
    for (int op = 0; name && op < RLX_OP_COUNT; op++)
        if (strcmp(rlx_op_table[op].name, name) == 0) {
            *out = (enum rlx_op)op;
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_INVALID, "unknown op '%s'", name ? name : "(null)");
}
