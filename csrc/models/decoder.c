/*
 * decoder.c - the ONE decoder builder for Llama 3.2 and Qwen3. Each family difference is a config
 * field, never a code path of its own: q/k norm (Qwen3), biases, per-layer sliding windows,
 * tied embeddings, head_dim independent of hidden / heads. RoPE's inverse frequencies come in as
 * the param "rope.inv_freq", so Llama 3 scaling is data. A block of layers [begin, end) is built
 * with optional ends (embedding, LM head), so the whole model and a pipeline stage are the same
 * code. Builds graphs only: never runs, never allocates tensors.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "ir/graph.h"
#include "rlx/model.h"

rlx_status rlx_model_config_check(const struct rlx_model_config *c)
{
#define POSITIVE(f)                                                                                \
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
    if (c->head_dim % 2) return rlx_set_error(RLX_ERR_INVALID, "model config: head_dim %lld is odd", (long long)c->head_dim);
    if (!(c->rms_norm_eps >= 0.0f)) return rlx_set_error(RLX_ERR_INVALID, "model config: rms_norm_eps must be >= 0");
    if (c->weight_dtype != RLX_F32 && c->weight_dtype != RLX_BF16 && c->weight_dtype != RLX_F16)
        return rlx_set_error(RLX_ERR_INVALID, "model config: weight_dtype must be f32, bf16 or f16, got %s",
                             rlx_dtype_name(c->weight_dtype));
    for (int64_t l = 0; l < c->n_layers; l++)
        if (c->layer_window[l] < 0)
            return rlx_set_error(RLX_ERR_INVALID, "model config: layer %lld has a negative window", (long long)l);
    return RLX_OK;
}

/* The builder state: the first failure sticks and every later call is a no-op returning -1, so
 * the layer code reads as straight-line math. */
struct bld {
    struct rlx_graph *g;
    rlx_status s;
};

static int op(struct bld *b, enum rlx_op o, int n_in, const int *in, const struct rlx_attrs *a)
{
    int id = -1;
    if (b->s == RLX_OK) b->s = rlx_graph_op(b->g, o, n_in, in, a, &id);
    return b->s == RLX_OK ? id : -1;
}

static int param(struct bld *b, enum rlx_dtype dt, int ndim, const int64_t *shape, const char *fmt, long long layer)
{
    char name[RLX_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
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

static void output(struct bld *b, int id, const char *fmt, long long layer)
{
    char name[RLX_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    if (b->s == RLX_OK) b->s = rlx_graph_output(b->g, id, name);
}

/* y (.., out) = x (.., in) @ W^T [+ bias], W = "<prefix>.weight" (out, in) of the weight dtype */
static int linear(struct bld *b, const struct rlx_model_config *c, int x, int64_t in, int64_t out, bool bias,
                  const char *prefix, long long layer)
{
    char fmt[RLX_NAME_MAX];
    snprintf(fmt, sizeof fmt, "%s.weight", prefix);
    struct rlx_attrs tb = {.trans_b = 1};
    int y = op(b, RLX_OP_MATMUL, 2, (int[]){x, param(b, c->weight_dtype, 2, (int64_t[]){out, in}, fmt, layer)}, &tb);
    if (!bias) return y;
    snprintf(fmt, sizeof fmt, "%s.bias", prefix);
    return op(b, RLX_OP_ADD, 2, (int[]){y, param(b, RLX_F32, 1, (int64_t[]){out}, fmt, layer)}, NULL);
}

static int rmsnorm(struct bld *b, const struct rlx_model_config *c, int x, int64_t d, const char *name, long long layer)
{
    struct rlx_attrs a = {.eps = c->rms_norm_eps};
    return op(b, RLX_OP_RMSNORM, 2, (int[]){x, param(b, RLX_F32, 1, (int64_t[]){d}, name, layer)}, &a);
}

static int reshape(struct bld *b, int x, int ndim, const struct rlx_dim *shape)
{
    struct rlx_attrs a = {.ndim = ndim};
    for (int i = 0; i < ndim; i++) a.shape[i] = shape[i];
    return op(b, RLX_OP_RESHAPE, 1, (int[]){x}, &a);
}

struct block_io {
    int pos, inv_freq;
    struct rlx_dim seq, past;
};

/* The mask input for a layer with window w ("mask" or "mask_w<w>"), made on first use. */
static int mask_input(struct bld *b, const struct rlx_block_spec *spec, int64_t w)
{
    char name[RLX_NAME_MAX];
    if (w) snprintf(name, sizeof name, "mask_w%lld", (long long)w);
    else snprintf(name, sizeof name, "mask");
    for (int id = 0; b->s == RLX_OK && id < b->g->n_nodes; id++)
        if (b->g->nodes[id].op == RLX_OP_INPUT && strcmp(b->g->nodes[id].name, name) == 0) return id;
    struct rlx_dim total = (spec->flags & RLX_BLOCK_PAST) ? rlx_dim_add(&spec->past, &spec->seq) : spec->seq;
    return input(b, name, RLX_F32, 2, (struct rlx_dim[]){spec->seq, total});
}

/* One decoder layer: x (SEQ, H) -> x (SEQ, H). */
static int layer(struct bld *b, const struct rlx_model_config *c, const struct rlx_block_spec *spec,
                 const struct block_io *io, int x, long long l)
{
    const int64_t H = c->hidden_size, Hq = c->n_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    const struct rlx_dim S = io->seq;
    /* attention */
    int h = rmsnorm(b, c, x, H, "model.layers.%lld.input_layernorm.weight", l);
    int q = linear(b, c, h, H, Hq * D, c->attention_bias, "model.layers.%lld.self_attn.q_proj", l);
    int k = linear(b, c, h, H, Hkv * D, c->attention_bias, "model.layers.%lld.self_attn.k_proj", l);
    int v = linear(b, c, h, H, Hkv * D, c->attention_bias, "model.layers.%lld.self_attn.v_proj", l);
    q = reshape(b, q, 3, (struct rlx_dim[]){S, rlx_dim_const(Hq), rlx_dim_const(D)});     /* (SEQ, Hq, D) */
    k = reshape(b, k, 3, (struct rlx_dim[]){S, rlx_dim_const(Hkv), rlx_dim_const(D)});    /* (SEQ, Hkv, D) */
    v = reshape(b, v, 3, (struct rlx_dim[]){S, rlx_dim_const(Hkv), rlx_dim_const(D)});    /* (SEQ, Hkv, D) */
    if (c->qk_norm) {
        q = rmsnorm(b, c, q, D, "model.layers.%lld.self_attn.q_norm.weight", l);
        k = rmsnorm(b, c, k, D, "model.layers.%lld.self_attn.k_norm.weight", l);
    }
    q = op(b, RLX_OP_ROPE, 3, (int[]){q, io->pos, io->inv_freq}, NULL);
    k = op(b, RLX_OP_ROPE, 3, (int[]){k, io->pos, io->inv_freq}, NULL);
    if (spec->flags & RLX_BLOCK_KV_OUT) {
        output(b, k, "k.%lld", l);
        output(b, v, "v.%lld", l);
    }
    int in[6] = {q, k, v}, n_in = 3;
    if (spec->flags & RLX_BLOCK_PAST) {
        struct rlx_dim pshape[3] = {io->past, rlx_dim_const(Hkv), rlx_dim_const(D)};
        char name[RLX_NAME_MAX];
        snprintf(name, sizeof name, "past_k.%lld", l);
        in[n_in++] = input(b, name, RLX_F32, 3, pshape);
        snprintf(name, sizeof name, "past_v.%lld", l);
        in[n_in++] = input(b, name, RLX_F32, 3, pshape);
    }
    bool masked = spec->flags & RLX_BLOCK_MASK;
    if (masked) in[n_in++] = mask_input(b, spec, c->layer_window[l]);
    struct rlx_attrs aa = {.scale = (float)(1.0 / sqrt((double)D)), .causal = 1,
                           .window = masked ? 0 : c->layer_window[l]};
    int a = op(b, RLX_OP_ATTENTION, n_in, in, &aa);                                       /* (SEQ, Hq, D) */
    a = reshape(b, a, 2, (struct rlx_dim[]){S, rlx_dim_const(Hq * D)});                  /* (SEQ, Hq*D) */
    int o = linear(b, c, a, Hq * D, H, c->attention_bias, "model.layers.%lld.self_attn.o_proj", l);
    x = op(b, RLX_OP_ADD, 2, (int[]){x, o}, NULL);
    /* SwiGLU MLP */
    h = rmsnorm(b, c, x, H, "model.layers.%lld.post_attention_layernorm.weight", l);
    int gate = linear(b, c, h, H, c->intermediate_size, c->mlp_bias, "model.layers.%lld.mlp.gate_proj", l);
    int up = linear(b, c, h, H, c->intermediate_size, c->mlp_bias, "model.layers.%lld.mlp.up_proj", l);
    int m = op(b, RLX_OP_MUL, 2, (int[]){op(b, RLX_OP_SILU, 1, (int[]){gate}, NULL), up}, NULL);
    int down = linear(b, c, m, c->intermediate_size, H, c->mlp_bias, "model.layers.%lld.mlp.down_proj", l);
    return op(b, RLX_OP_ADD, 2, (int[]){x, down}, NULL);
}

rlx_status rlx_decoder_build(const struct rlx_model_config *c, const struct rlx_block_spec *spec, struct rlx_graph **out)
{
    RLX_TRY(rlx_model_config_check(c));
    if (spec->layer_begin < 0 || spec->layer_end > c->n_layers || spec->layer_begin > spec->layer_end)
        return rlx_set_error(RLX_ERR_INVALID, "decoder block: layers [%lld, %lld) outside [0, %lld)",
                             (long long)spec->layer_begin, (long long)spec->layer_end, (long long)c->n_layers);
    struct bld b = {0};
    RLX_TRY(rlx_graph_create(&b.g));
    const int64_t H = c->hidden_size;
    struct block_io io = {.seq = spec->seq, .past = spec->past};
    struct rlx_dim s1[1] = {spec->seq};
    int x;
    if (spec->flags & RLX_BLOCK_EMBED) {
        int ids = input(&b, "ids", RLX_I32, 1, s1);
        int table = param(&b, c->weight_dtype, 2, (int64_t[]){c->vocab_size, H}, "model.embed_tokens.weight", 0);
        x = op(&b, RLX_OP_EMBEDDING, 2, (int[]){table, ids}, NULL);                     /* (SEQ, H) */
    } else {
        x = input(&b, "hidden", RLX_F32, 2, (struct rlx_dim[]){spec->seq, rlx_dim_const(H)});
    }
    io.pos = input(&b, "pos", RLX_I32, 1, s1);
    io.inv_freq = param(&b, RLX_F32, 1, (int64_t[]){c->head_dim / 2}, "rope.inv_freq", 0);
    for (int64_t l = spec->layer_begin; l < spec->layer_end; l++) x = layer(&b, c, spec, &io, x, (long long)l);
    if (spec->flags & RLX_BLOCK_HEAD) {
        if (!(spec->flags & RLX_BLOCK_ALL_LOGITS)) x = op(&b, RLX_OP_GATHER_LAST, 1, (int[]){x}, NULL); /* (1, H) */
        x = rmsnorm(&b, c, x, H, "model.norm.weight", 0);
        const char *head = c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
        int w = -1;
        if (b.s == RLX_OK && c->tie_word_embeddings && (spec->flags & RLX_BLOCK_EMBED)) {
            for (int id = 0; id < b.g->n_nodes; id++) /* reuse the embedding param */
                if (b.g->nodes[id].op == RLX_OP_PARAM && strcmp(b.g->nodes[id].name, head) == 0) w = id;
        }
        if (w < 0) w = param(&b, c->weight_dtype, 2, (int64_t[]){c->vocab_size, H}, head, 0);
        struct rlx_attrs tb = {.trans_b = 1};
        output(&b, op(&b, RLX_OP_MATMUL, 2, (int[]){x, w}, &tb), "logits", 0);            /* (1 or SEQ, V) */
    } else {
        output(&b, x, "hidden", 0);
    }
    if (b.s != RLX_OK) {
        rlx_graph_free(b.g);
        return b.s;
    }
    *out = b.g;
    return RLX_OK;
}
