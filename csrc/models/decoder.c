/*
 * decoder.c - the ONE decoder builder for Llama 3.2, Qwen3 and Qwen3-MoE. Each family difference is a
 * config field, never a code path of its own: q/k norm (Qwen3), biases, per-layer sliding windows,
 * tied embeddings, head_dim independent of hidden / heads, and per layer a dense or a sparse
 * (mixture-of-experts) MLP. RoPE's inverse frequencies come in as
 * the param "rope.inv_freq", so Llama 3 scaling is data. A block of layers [begin, end) is built
 * with optional ends (embedding, LM head), so the whole model and a pipeline stage are the same
 * code. With the KV cache (RLX_BLOCK_CACHE) each layer writes its new K/V rows into its cache
 * state and attends over the cache; without it, K/V are rounded to the cache dtype so that both
 * compute the same function. Each matrix param takes its dtype from the weight store (a GGUF file
 * mixes them per tensor). The Hugging Face tensor names are made here and nowhere else:
 * rlx_decoder_params lists them by building a block and reading its params back. A batch block
 * (spec->batch) is the same layers over the rows of several sequences: only attention is split per
 * sequence (its rows sliced out, written into and attended over its own cache, concatenated back).
 * Builds graphs only: never runs, never allocates tensors.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ir/graph.h"
#include "rlx/model.h"

rlx_status rlx_model_config_check(const struct rlx_model_config *c)
{
#define POSITIVE(f)                                                                                                    \
    if (c->f < 1) return rlx_set_error(RLX_ERR_INVALID, "model config: " #f " must be >= 1, got %lld", (long long)c->f)
    POSITIVE(vocab_size);
    POSITIVE(hidden_size);
    POSITIVE(intermediate_size);
    POSITIVE(n_layers);
    POSITIVE(n_heads);
    POSITIVE(n_kv_heads);
    POSITIVE(head_dim);
    POSITIVE(max_position_embeddings);
#undef POSITIVE
    if (c->n_layers > RLX_MAX_LAYERS)
        return rlx_set_error(RLX_ERR_INVALID, "model config: n_layers %lld exceeds %d", (long long)c->n_layers,
                             RLX_MAX_LAYERS);
    if (c->n_heads % c->n_kv_heads)
        return rlx_set_error(RLX_ERR_INVALID, "model config: n_heads %lld is not a multiple of n_kv_heads %lld",
                             (long long)c->n_heads, (long long)c->n_kv_heads);
    if (c->head_dim % 2)
        return rlx_set_error(RLX_ERR_INVALID, "model config: head_dim %lld is odd", (long long)c->head_dim);
    if (!(c->rms_norm_eps >= 0.0f) || !isfinite(c->rms_norm_eps))
        return rlx_set_error(RLX_ERR_INVALID, "model config: rms_norm_eps must be a finite number >= 0");
    bool sparse = false;
    for (int64_t l = 0; l < c->n_layers; l++) {
        if (c->layer_window[l] < 0)
            return rlx_set_error(RLX_ERR_INVALID, "model config: layer %lld has a negative window", (long long)l);
        sparse |= c->layer_sparse[l];
    }
    if (sparse && (c->n_experts < 1 || c->n_experts > INT32_MAX || c->n_experts_used < 1 ||
                   c->n_experts_used > c->n_experts || c->moe_intermediate_size < 1))
        return rlx_set_error(RLX_ERR_INVALID,
                             "model config: sparse layers need 1 <= n_experts_used (%lld) <= n_experts "
                             "(%lld) <= %d and moe_intermediate_size (%lld) >= 1",
                             (long long)c->n_experts_used, (long long)c->n_experts, INT32_MAX,
                             (long long)c->moe_intermediate_size);
    return RLX_OK;
}

/* The builder state: the first failure sticks and every later call is a no-op returning -1, so
 * the layer code reads as straight-line math. */
struct bld {
    struct rlx_graph *g;
    rlx_status s;
    const struct rlx_weights *w; /* dtypes of matrix params; NULL: f32 */
};

static int op(struct bld *b, enum rlx_op o, int n_in, const int *in, const struct rlx_attrs *a)
{
    int id = -1;
    if (b->s == RLX_OK) b->s = rlx_graph_op(b->g, o, n_in, in, a, &id);
    return b->s == RLX_OK ? id : -1;
}

/* The param named fmt % layer: made once (a tied LM head finds the embedding's). A matrix takes
 * the store's dtype, anything else is f32. */
static int param(struct bld *b, bool matrix, int ndim, const int64_t *shape, const char *fmt, long long layer)
{
    char name[RLX_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    for (int id = 0; b->s == RLX_OK && id < b->g->n_nodes; id++)
        if (b->g->nodes[id].op == RLX_OP_PARAM && strcmp(b->g->nodes[id].name, name) == 0) return id;
    enum rlx_dtype dt = RLX_F32;
    if (b->s == RLX_OK && matrix && b->w) b->s = rlx_weights_info(b->w, name, &dt, NULL, NULL);
    struct rlx_dim dims[RLX_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = rlx_dim_const(shape[i]);
    int id = -1;
    if (b->s == RLX_OK) b->s = rlx_graph_param(b->g, name, dt, ndim, dims, &id);
    return b->s == RLX_OK ? id : -1;
}

static int input(struct bld *b, const char *name, enum rlx_dtype dt, int ndim, const struct rlx_dim *dims)
{
    int id = -1;
    if (b->s == RLX_OK) b->s = rlx_graph_input(b->g, name, dt, ndim, dims, &id);
    return b->s == RLX_OK ? id : -1;
}

/* The KV cache state "<which>_cache.<layer>" (one sequence) or "<which>_cache.<layer>.<seq>" (a batch's seq). */
static int state(struct bld *b, const char *which, long long layer, int seq, enum rlx_dtype dt, int ndim,
                 const struct rlx_dim *dims)
{
    char name[RLX_NAME_MAX];
    if (seq < 0)
        snprintf(name, sizeof name, "%s_cache.%lld", which, layer);
    else
        snprintf(name, sizeof name, "%s_cache.%lld.%d", which, layer, seq);
    int id = -1;
    if (b->s == RLX_OK) b->s = rlx_graph_state(b->g, name, dt, ndim, dims, &id);
    return b->s == RLX_OK ? id : -1;
}

static int cache_write(struct bld *b, int st, int rows, int pos)
{
    int id = -1;
    if (b->s == RLX_OK) b->s = rlx_graph_cache_write(b->g, st, rows, pos, &id);
    return b->s == RLX_OK ? id : -1;
}

/* Marks id as an output; returns its output index. */
static int output(struct bld *b, int id, const char *name)
{
    if (b->s == RLX_OK) b->s = rlx_graph_output(b->g, id, name);
    return b->s == RLX_OK ? b->g->n_outputs - 1 : -1;
}

/* y (.., out) = x (.., in) @ W^T [+ bias], W = "<prefix>.weight" (out, in) */
static int linear(struct bld *b, int x, int64_t in, int64_t out, bool bias, const char *prefix, long long layer)
{
    char fmt[RLX_NAME_MAX];
    snprintf(fmt, sizeof fmt, "%s.weight", prefix);
    struct rlx_attrs tb = {.trans_b = 1};
    int y = op(b, RLX_OP_MATMUL, 2, (int[]){x, param(b, true, 2, (int64_t[]){out, in}, fmt, layer)}, &tb);
    if (!bias) return y;
    snprintf(fmt, sizeof fmt, "%s.bias", prefix);
    return op(b, RLX_OP_ADD, 2, (int[]){y, param(b, false, 1, (int64_t[]){out}, fmt, layer)}, NULL);
}

static int rmsnorm(struct bld *b, const struct rlx_model_config *c, int x, int64_t d, const char *name, long long layer)
{
    struct rlx_attrs a = {.eps = c->rms_norm_eps};
    return op(b, RLX_OP_RMSNORM, 2, (int[]){x, param(b, false, 1, (int64_t[]){d}, name, layer)}, &a);
}

static int reshape(struct bld *b, int x, int ndim, const struct rlx_dim *shape)
{
    struct rlx_attrs a = {.ndim = ndim};
    for (int i = 0; i < ndim; i++) a.shape[i] = shape[i];
    return op(b, RLX_OP_RESHAPE, 1, (int[]){x}, &a);
}

/* The mask input for layers with window w, made on first use and recorded in io. */
static int mask_input(struct bld *b, const struct rlx_block_spec *spec, struct rlx_block_io *io, int64_t w)
{
    for (int i = 0; i < io->n_masks; i++)
        if (io->mask_window[i] == w) return io->mask[i];
    if (b->s != RLX_OK) return -1;
    if (io->n_masks == RLX_MAX_WINDOWS) {
        b->s = rlx_set_error(RLX_ERR_UNSUPPORTED, "a masked block takes at most %d distinct layer windows",
                             RLX_MAX_WINDOWS);
        return -1;
    }
    char name[RLX_NAME_MAX];
    if (w)
        snprintf(name, sizeof name, "mask_w%lld", (long long)w);
    else
        snprintf(name, sizeof name, "mask");
    int id = input(b, name, RLX_F32, 2, (struct rlx_dim[]){spec->seq, spec->kv_rows});
    io->mask_window[io->n_masks] = w;
    io->mask[io->n_masks++] = id;
    return id;
}

struct inv {
    int pos, inv_freq;
    int pos_of[RLX_MAX_BATCH]; /* batch: sequence b's rows of pos */
};

static int slice_rows(struct bld *b, int x, int64_t start, int64_t len)
{
    struct rlx_attrs a = {.axis = 0, .start = start, .len = len};
    return op(b, RLX_OP_SLICE, 1, (int[]){x}, &a);
}

/* The rows of each sequence of a batch concatenated back in order: parts (batch) -> (sum, ...). */
static int concat_rows(struct bld *b, const int *parts, int n)
{
    int y = parts[0];
    struct rlx_attrs a = {.axis = 0};
    for (int i = 1; i < n; i++) y = op(b, RLX_OP_CONCAT, 2, (int[]){y, parts[i]}, &a);
    return y;
}

/* Attention of one sequence: q (SEQ, Hq, D), k / v (SEQ, Hkv, D) -> (SEQ, Hq, D). */
static int seq_attention(struct bld *b, const struct rlx_model_config *c, const struct rlx_block_spec *spec,
                         struct rlx_block_io *io, const struct inv *in, int q, int k, int v, long long l, int li)
{
    const int64_t Hkv = c->n_kv_heads, D = c->head_dim;
    const bool cached = spec->flags & RLX_BLOCK_CACHE, masked = cached && (spec->flags & RLX_BLOCK_MASK);
    if (cached) { /* the new rows into the cache, then attend over the cache's kv_rows */
        const struct rlx_dim cshape[3] = {spec->kv_rows, rlx_dim_const(Hkv), rlx_dim_const(D)};
        io->k_cache[0][li] = state(b, "k", l, -1, spec->kv_dtype, 3, cshape); /* (kv_rows, Hkv, D) */
        io->v_cache[0][li] = state(b, "v", l, -1, spec->kv_dtype, 3, cshape);
        k = cache_write(b, io->k_cache[0][li], k, in->pos);
        v = cache_write(b, io->v_cache[0][li], v, in->pos);
    } else if (spec->kv_dtype != RLX_F32) { /* the precision a cached run reads back */
        struct rlx_attrs cv = {.dtype = spec->kv_dtype};
        k = op(b, RLX_OP_CONVERT, 1, (int[]){k}, &cv);
        v = op(b, RLX_OP_CONVERT, 1, (int[]){v}, &cv);
    }
    int ain[4] = {q, k, v}, n_in = 3;
    if (masked) ain[n_in++] = mask_input(b, spec, io, c->layer_window[l]);
    struct rlx_attrs aa = {
        .scale = (float)(1.0 / sqrt((double)D)), .causal = !masked, .window = masked ? 0 : c->layer_window[l]};
    return op(b, RLX_OP_ATTENTION, n_in, ain, &aa);
}

/* Attention of a batch: each sequence's q / k / v rows (q (n, Hq, D), k / v (n, Hkv, D)) written
 * into its own caches and attended over them, causal from its past on. -> (SEQ, Hq, D) */
static int batch_attention(struct bld *b, const struct rlx_model_config *c, const struct rlx_block_spec *spec,
                           struct rlx_block_io *io, const struct inv *in, int q, int k, int v, long long l, int li)
{
    const int64_t Hkv = c->n_kv_heads, D = c->head_dim;
    const struct rlx_attrs aa = {.scale = (float)(1.0 / sqrt((double)D)), .causal = 1, .window = c->layer_window[l]};
    int parts[RLX_MAX_BATCH];
    int64_t off = 0;
    for (int s = 0; s < spec->batch; s++) {
        const int64_t n = spec->batch_seq[s];
        struct rlx_dim rows = rlx_dim_sym(io->past_sym[s]);
        rows.c = n;
        const struct rlx_dim cshape[3] = {rows, rlx_dim_const(Hkv), rlx_dim_const(D)}; /* (PASTs + n, Hkv, D) */
        io->k_cache[s][li] = state(b, "k", l, s, spec->kv_dtype, 3, cshape);
        io->v_cache[s][li] = state(b, "v", l, s, spec->kv_dtype, 3, cshape);
        const bool whole = spec->batch == 1;
        int ks = whole ? k : slice_rows(b, k, off, n), vs = whole ? v : slice_rows(b, v, off, n);
        int qs = whole ? q : slice_rows(b, q, off, n);
        int kc = cache_write(b, io->k_cache[s][li], ks, in->pos_of[s]);
        int vc = cache_write(b, io->v_cache[s][li], vs, in->pos_of[s]);
        parts[s] = op(b, RLX_OP_ATTENTION, 3, (int[]){qs, kc, vc}, &aa); /* (n, Hq, D) */
        off += n;
    }
    return concat_rows(b, parts, spec->batch);
}

/* The SwiGLU MLP of a dense layer: h (SEQ, H) -> (SEQ, H). */
static int dense_mlp(struct bld *b, const struct rlx_model_config *c, int h, long long l)
{
    const int64_t H = c->hidden_size, F = c->intermediate_size;
    int gate = linear(b, h, H, F, c->mlp_bias, "model.layers.%lld.mlp.gate_proj", l); /* (SEQ, F) */
    int up = linear(b, h, H, F, c->mlp_bias, "model.layers.%lld.mlp.up_proj", l);     /* (SEQ, F) */
    int m = op(b, RLX_OP_MUL, 2, (int[]){op(b, RLX_OP_SILU, 1, (int[]){gate}, NULL), up}, NULL);
    return linear(b, m, F, H, c->mlp_bias, "model.layers.%lld.mlp.down_proj", l);
}

/* The sparse MLP of a mixture layer (Qwen3-MoE): h (SEQ, H) -> (SEQ, H). The router's softmax
 * probabilities pick each token's k experts (TOPK: as torch.topk, ties included); MATMUL_ID runs
 * the k experts' gate / up and down products on the token (reading those experts' weights only);
 * MOE_COMBINE sums their outputs weighted by the probabilities (renormalised when norm_topk_prob).
 * The experts of each projection are one stacked param (E, out, in). */
static int sparse_mlp(struct bld *b, const struct rlx_model_config *c, const struct rlx_block_spec *spec, int h,
                      long long l)
{
    const int64_t H = c->hidden_size, E = c->n_experts, F = c->moe_intermediate_size;
    int probs = op(b, RLX_OP_SOFTMAX, 1, (int[]){linear(b, h, H, E, false, "model.layers.%lld.mlp.gate", l)}, NULL);
    struct rlx_attrs ka = {.k = (int32_t)c->n_experts_used};
    int ids = op(b, RLX_OP_TOPK, 1, (int[]){probs}, &ka);                                        /* (SEQ, k) i32 */
    int x = reshape(b, h, 3, (struct rlx_dim[]){spec->seq, rlx_dim_const(1), rlx_dim_const(H)}); /* (SEQ, 1, H) */
    int wg = param(b, true, 3, (int64_t[]){E, F, H}, "model.layers.%lld.mlp.experts.gate_proj.weight", l);
    int wu = param(b, true, 3, (int64_t[]){E, F, H}, "model.layers.%lld.mlp.experts.up_proj.weight", l);
    int wd = param(b, true, 3, (int64_t[]){E, H, F}, "model.layers.%lld.mlp.experts.down_proj.weight", l);
    int gate = op(b, RLX_OP_MATMUL_ID, 3, (int[]){x, ids, wg}, NULL); /* (SEQ, k, F) */
    int up = op(b, RLX_OP_MATMUL_ID, 3, (int[]){x, ids, wu}, NULL);   /* (SEQ, k, F) */
    int m = op(b, RLX_OP_MUL, 2, (int[]){op(b, RLX_OP_SILU, 1, (int[]){gate}, NULL), up}, NULL);
    int down = op(b, RLX_OP_MATMUL_ID, 3, (int[]){m, ids, wd}, NULL); /* (SEQ, k, H) */
    struct rlx_attrs ca = {.norm = c->norm_topk_prob};
    return op(b, RLX_OP_MOE_COMBINE, 3, (int[]){down, probs, ids}, &ca); /* (SEQ, H) */
}

/* One decoder layer: x (SEQ, H) -> x (SEQ, H). l: global layer index, li: local. */
static int layer(struct bld *b, const struct rlx_model_config *c, const struct rlx_block_spec *spec,
                 struct rlx_block_io *io, const struct inv *in, int x, long long l, int li)
{
    const int64_t H = c->hidden_size, Hq = c->n_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    const struct rlx_dim S = spec->seq;
    /* attention */
    int h = rmsnorm(b, c, x, H, "model.layers.%lld.input_layernorm.weight", l);
    int q = linear(b, h, H, Hq * D, c->attention_bias, "model.layers.%lld.self_attn.q_proj", l);
    int k = linear(b, h, H, Hkv * D, c->attention_bias, "model.layers.%lld.self_attn.k_proj", l);
    int v = linear(b, h, H, Hkv * D, c->attention_bias, "model.layers.%lld.self_attn.v_proj", l);
    q = reshape(b, q, 3, (struct rlx_dim[]){S, rlx_dim_const(Hq), rlx_dim_const(D)});  /* (SEQ, Hq, D) */
    k = reshape(b, k, 3, (struct rlx_dim[]){S, rlx_dim_const(Hkv), rlx_dim_const(D)}); /* (SEQ, Hkv, D) */
    v = reshape(b, v, 3, (struct rlx_dim[]){S, rlx_dim_const(Hkv), rlx_dim_const(D)}); /* (SEQ, Hkv, D) */
    if (c->qk_norm) {
        q = rmsnorm(b, c, q, D, "model.layers.%lld.self_attn.q_norm.weight", l);
        k = rmsnorm(b, c, k, D, "model.layers.%lld.self_attn.k_norm.weight", l);
    }
    const struct rlx_attrs ra = {.interleaved = c->rope_interleaved};
    q = op(b, RLX_OP_ROPE, 3, (int[]){q, in->pos, in->inv_freq}, &ra);
    k = op(b, RLX_OP_ROPE, 3, (int[]){k, in->pos, in->inv_freq}, &ra);
    int a = spec->batch ? batch_attention(b, c, spec, io, in, q, k, v, l, li)
                        : seq_attention(b, c, spec, io, in, q, k, v, l, li); /* (SEQ, Hq, D) */
    a = reshape(b, a, 2, (struct rlx_dim[]){S, rlx_dim_const(Hq * D)});      /* (SEQ, Hq*D) */
    int o = linear(b, a, Hq * D, H, c->attention_bias, "model.layers.%lld.self_attn.o_proj", l);
    x = op(b, RLX_OP_ADD, 2, (int[]){x, o}, NULL);
    /* SwiGLU MLP, or the mixture of experts on a sparse layer */
    h = rmsnorm(b, c, x, H, "model.layers.%lld.post_attention_layernorm.weight", l);
    int mlp = c->layer_sparse[l] ? sparse_mlp(b, c, spec, h, l) : dense_mlp(b, c, h, l);
    return op(b, RLX_OP_ADD, 2, (int[]){x, mlp}, NULL);
}

rlx_status rlx_decoder_build(const struct rlx_model_config *c, const struct rlx_block_spec *spec,
                             const struct rlx_weights *weights, struct rlx_graph **out, struct rlx_block_io *io_out)
{
    RLX_TRY(rlx_model_config_check(c));
    if (spec->layer_begin < 0 || spec->layer_end > c->n_layers || spec->layer_begin > spec->layer_end)
        return rlx_set_error(RLX_ERR_INVALID, "decoder block: layers [%lld, %lld) outside [0, %lld)",
                             (long long)spec->layer_begin, (long long)spec->layer_end, (long long)c->n_layers);
    if (spec->kv_dtype != RLX_F32 && spec->kv_dtype != RLX_F16 && spec->kv_dtype != RLX_BF16)
        return rlx_set_error(RLX_ERR_INVALID, "decoder block: the KV dtype must be f32, f16 or bf16, got %s",
                             rlx_dtype_name(spec->kv_dtype));
    if (spec->batch) {
        const unsigned need = RLX_BLOCK_CACHE, refused = RLX_BLOCK_MASK | RLX_BLOCK_ALL_LOGITS;
        if (spec->batch < 0 || spec->batch > RLX_MAX_BATCH || (spec->flags & need) != need || (spec->flags & refused))
            return rlx_set_error(RLX_ERR_INVALID,
                                 "decoder block: a batch holds 1..%d sequences and runs over the KV cache "
                                 "without masks or all-position logits (got %d sequences, flags 0x%x)",
                                 RLX_MAX_BATCH, spec->batch, spec->flags);
        int64_t sum = 0;
        for (int s = 0; s < spec->batch; s++) {
            if (spec->batch_seq[s] < 1)
                return rlx_set_error(RLX_ERR_INVALID, "decoder block: batch sequence %d advances %lld rows", s,
                                     (long long)spec->batch_seq[s]);
            sum += spec->batch_seq[s];
        }
        if (!rlx_dim_is_const(&spec->seq) || spec->seq.c != sum)
            return rlx_set_error(RLX_ERR_INVALID, "decoder block: a batch's SEQ must be the constant %lld (its rows)",
                                 (long long)sum);
    }
    struct bld b = {.w = weights};
    RLX_TRY(rlx_graph_create(&b.g));
    struct rlx_block_io io;
    memset(&io, 0, sizeof io);
    io.n_layers = (int)(spec->layer_end - spec->layer_begin);
    const int64_t H = c->hidden_size;
    struct rlx_dim s1[1] = {spec->seq};
    int x;
    if (spec->flags & RLX_BLOCK_EMBED) {
        io.x = input(&b, "ids", RLX_I32, 1, s1);
        int table = param(&b, true, 2, (int64_t[]){c->vocab_size, H}, "model.embed_tokens.weight", 0);
        x = op(&b, RLX_OP_EMBEDDING, 2, (int[]){table, io.x}, NULL); /* (SEQ, H) */
    } else {
        io.x = x = input(&b, "hidden", RLX_F32, 2, (struct rlx_dim[]){spec->seq, rlx_dim_const(H)});
    }
    struct inv in = {.pos = input(&b, "pos", RLX_I32, 1, s1)};
    io.pos = in.pos;
    for (int s = 0, off = 0; s < spec->batch; off += (int)spec->batch_seq[s], s++) {
        char name[16];
        snprintf(name, sizeof name, "PAST%d", s);
        if (b.s == RLX_OK) b.s = rlx_graph_symbol(b.g, name, &io.past_sym[s]);
        in.pos_of[s] = spec->batch == 1 ? in.pos : slice_rows(&b, in.pos, off, spec->batch_seq[s]);
    }
    in.inv_freq = param(&b, false, 1, (int64_t[]){c->head_dim / 2}, "rope.inv_freq", 0);
    for (int64_t l = spec->layer_begin; l < spec->layer_end; l++)
        x = layer(&b, c, spec, &io, &in, x, (long long)l, (int)(l - spec->layer_begin));
    if (spec->flags & RLX_BLOCK_HEAD) {
        if (spec->batch > 1) { /* each sequence's last row: (batch, H) */
            int last[RLX_MAX_BATCH];
            int64_t end = 0;
            for (int s = 0; s < spec->batch; s++) {
                end += spec->batch_seq[s];
                last[s] = slice_rows(&b, x, end - 1, 1);
            }
            x = concat_rows(&b, last, spec->batch);
        } else if (!(spec->flags & RLX_BLOCK_ALL_LOGITS)) {
            x = op(&b, RLX_OP_GATHER_LAST, 1, (int[]){x}, NULL); /* (1, H) */
        }
        x = rmsnorm(&b, c, x, H, "model.norm.weight", 0);
        const char *head = c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
        int w = param(&b, true, 2, (int64_t[]){c->vocab_size, H}, head, 0);
        struct rlx_attrs tb = {.trans_b = 1};
        io.y = output(&b, op(&b, RLX_OP_MATMUL, 2, (int[]){x, w}, &tb), "logits"); /* (1, batch or SEQ, V) */
    } else {
        io.y = output(&b, x, "hidden");
    }
    if (b.s != RLX_OK) {
        rlx_graph_free(b.g);
        return b.s;
    }
    *out = b.g;
    if (io_out) *io_out = io;
    return RLX_OK;
}

rlx_status rlx_decoder_params(const struct rlx_model_config *c, int64_t layer_begin, int64_t layer_end, unsigned ends,
                              struct rlx_param_info **out, int *n)
{
    if (ends & ~(unsigned)(RLX_BLOCK_EMBED | RLX_BLOCK_HEAD))
        return rlx_set_error(RLX_ERR_INVALID, "decoder params: ends may only be RLX_BLOCK_EMBED | RLX_BLOCK_HEAD");
    struct rlx_block_spec spec = {.layer_begin = layer_begin,
                                  .layer_end = layer_end,
                                  .flags = ends,
                                  .seq = rlx_dim_const(1),
                                  .kv_rows = rlx_dim_const(1),
                                  .kv_dtype = RLX_F32};
    struct rlx_graph *g;
    RLX_TRY(rlx_decoder_build(c, &spec, NULL, &g, NULL));
    int count = 0;
    for (int id = 0; id < g->n_nodes; id++) count += g->nodes[id].op == RLX_OP_PARAM;
    struct rlx_param_info *p = rlx_calloc((size_t)count, sizeof *p);
    if (!p) {
        rlx_graph_free(g);
        return RLX_ERR_NOMEM;
    }
    int k = 0;
    for (int id = 0; id < g->n_nodes; id++) {
        const struct rlx_node *nd = &g->nodes[id];
        if (nd->op != RLX_OP_PARAM) continue;
        struct rlx_param_info *pi = &p[k++];
        strcpy(pi->name, nd->name);
        pi->ndim = nd->ndim;
        for (int d = 0; d < nd->ndim; d++) pi->shape[d] = nd->shape[d].c;
        pi->kind = strcmp(nd->name, "rope.inv_freq") == 0 ? RLX_PARAM_DERIVED : RLX_PARAM_VECTOR;
        for (int u = id + 1; u < g->n_nodes; u++) { /* a matmul's b, an embedding's table, stacked experts */
            const struct rlx_node *un = &g->nodes[u];
            if ((un->op == RLX_OP_MATMUL && un->in[1] == id) || (un->op == RLX_OP_EMBEDDING && un->in[0] == id))
                pi->kind = RLX_PARAM_MATRIX;
            if (un->op == RLX_OP_MATMUL_ID && un->in[2] == id) pi->kind = RLX_PARAM_EXPERTS;
        }
        if (pi->kind == RLX_PARAM_EXPERTS) { /* "...mlp.experts.P" -> "...mlp.experts.%d.P" */
            const char *at = strstr(nd->name, ".experts.") + strlen(".experts.");
            snprintf(pi->part_fmt, sizeof pi->part_fmt, "%.*s%%d.%s", (int)(at - nd->name), nd->name, at);
        }
    }
    rlx_graph_free(g);
    *out = p;
    *n = count;
    return RLX_OK;
}

void rlx_decoder_params_free(struct rlx_param_info *p) { free(p); }
