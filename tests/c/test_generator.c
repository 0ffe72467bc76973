/*
 * test_generator.c - the decoder builder and the generator from C on a tiny random model that
 * uses every family feature (GQA, q/k norm, biases, a sliding-window layer, untied head): the
 * KV-cached logits must equal the naive recompute at every step, on both host backends and under
 * the one-shot, bucketed (masked padding, a sliding-window layer) and dynamic plan policies; bad input fails with a status and leaves the generator usable. Runs under
 * valgrind in `make test`. (Parity with transformers and llama2.c is proven in tests/models.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/model.h"

#include "check.h"

#define MAX_W 256
static float *bufs[MAX_W];
static int n_bufs;

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* Sets one random array under `name` on each of the ng generators (the same memory for all). */
static void set_w(struct rlx_generator **gs, int ng, const char *name, int64_t a, int64_t b, float base, float scale)
{
    int64_t n = a * (b ? b : 1);
    float *w = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) w[i] = base + scale * frand();
    bufs[n_bufs++] = w;
    struct rlx_host_tensor t = {.data = w, .dtype = RLX_F32, .ndim = b ? 2 : 1, .shape = {a, b}};
    for (int i = 0; i < ng; i++) CHECK(rlx_generator_set_weight(gs[i], name, &t) == RLX_OK, "set %s", name);
}

static void load(struct rlx_generator **gs, int ng, const struct rlx_model_config *c)
{
    int64_t H = c->hidden_size, D = c->head_dim, q = c->n_heads * D, kv = c->n_kv_heads * D, F = c->intermediate_size;
    char n[RLX_NAME_MAX];
    set_w(gs, ng, "model.embed_tokens.weight", c->vocab_size, H, 0, 1);
    set_w(gs, ng, "lm_head.weight", c->vocab_size, H, 0, 0.5f);
    set_w(gs, ng, "model.norm.weight", H, 0, 1, 0.2f);
    float *inv = malloc(sizeof(float) * (size_t)(D / 2));
    for (int64_t i = 0; i < D / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * (double)i / (double)D);
    bufs[n_bufs++] = inv;
    struct rlx_host_tensor t = {.data = inv, .dtype = RLX_F32, .ndim = 1, .shape = {D / 2}};
    for (int i = 0; i < ng; i++) CHECK(rlx_generator_set_weight(gs[i], "rope.inv_freq", &t) == RLX_OK, "inv_freq");
    for (int l = 0; l < c->n_layers; l++) {
#define W(fmt, a, b, base, sc) (snprintf(n, sizeof n, fmt, l), set_w(gs, ng, n, a, b, base, sc))
        W("model.layers.%d.input_layernorm.weight", H, 0, 1, 0.2f);
        W("model.layers.%d.post_attention_layernorm.weight", H, 0, 1, 0.2f);
        W("model.layers.%d.self_attn.q_proj.weight", q, H, 0, 0.5f);
        W("model.layers.%d.self_attn.k_proj.weight", kv, H, 0, 0.5f);
        W("model.layers.%d.self_attn.v_proj.weight", kv, H, 0, 0.5f);
        W("model.layers.%d.self_attn.o_proj.weight", H, q, 0, 0.5f);
        W("model.layers.%d.self_attn.q_proj.bias", q, 0, 0, 0.2f);
        W("model.layers.%d.self_attn.k_proj.bias", kv, 0, 0, 0.2f);
        W("model.layers.%d.self_attn.v_proj.bias", kv, 0, 0, 0.2f);
        W("model.layers.%d.self_attn.o_proj.bias", H, 0, 0, 0.2f);
        W("model.layers.%d.self_attn.q_norm.weight", D, 0, 1, 0.2f);
        W("model.layers.%d.self_attn.k_norm.weight", D, 0, 1, 0.2f);
        W("model.layers.%d.mlp.gate_proj.weight", F, H, 0, 0.5f);
        W("model.layers.%d.mlp.up_proj.weight", F, H, 0, 0.5f);
        W("model.layers.%d.mlp.down_proj.weight", H, F, 0, 0.5f);
#undef W
    }
}

static int32_t argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

static void test_cached_equals_naive(const char *device, enum rlx_plan_policy policy)
{
    struct rlx_model_config c = {.vocab_size = 37, .hidden_size = 16, .intermediate_size = 24, .n_layers = 2,
                                 .n_heads = 4, .n_kv_heads = 2, .head_dim = 6, .max_position_embeddings = 16,
                                 .rms_norm_eps = 1e-6f, .attention_bias = true, .qk_norm = true,
                                 .layer_window = {0, 3}};
    struct rlx_generator *g = NULL;
    CHECK(rlx_generator_create(&c, device, &g) == RLX_OK, "create");
    if (!g) return;
    n_bufs = 0;
    load(&g, 1, &c);
    enum rlx_plan_policy prefill = policy == RLX_POLICY_BUCKETED ? RLX_POLICY_LRU : policy;
    CHECK(rlx_generator_set_policy(g, prefill, 2, policy, 12) == RLX_OK, "policy");
    int32_t prompt[5] = {1, 7, 3, 30, 2};
    CHECK(rlx_generator_prefill(g, prompt, 5) == RLX_OK, "prefill");
    float naive[37];
    for (int step = 0; step < 8; step++) {
        const float *lg;
        CHECK(rlx_generator_logits_naive(g, &lg) == RLX_OK, "naive");
        memcpy(naive, lg, sizeof naive);
        CHECK(rlx_generator_logits_cached(g, &lg) == RLX_OK, "cached");
        double err = 0;
        for (int i = 0; i < 37; i++) err = fmax(err, fabs(naive[i] - lg[i]));
        CHECK(err < 1e-4, "%s policy %d step %d: cached vs naive max diff %g", device, policy, step, err);
        CHECK(rlx_kv_cache_len(rlx_generator_kv(g)) == rlx_generator_len(g), "cache covers the history");
        CHECK(rlx_generator_append(g, argmax(lg, 37)) == RLX_OK, "append");
    }
    /* errors leave the generator usable */
    CHECK(rlx_generator_append(g, 37) == RLX_ERR_RANGE, "token id >= vocab");
    CHECK(rlx_generator_append(g, -1) == RLX_ERR_RANGE, "token id < 0");
    CHECK(rlx_generator_prefill(g, prompt, 0) == RLX_ERR_INVALID, "empty context");
    int32_t many[17] = {0};
    CHECK(rlx_generator_prefill(g, many, 17) == RLX_ERR_RANGE, "context longer than max_position_embeddings");
    CHECK(rlx_generator_len(g) == 13, "history unchanged by failed calls");
    for (int i = 0; i < 3; i++) CHECK(rlx_generator_append(g, 1) == RLX_OK, "fill");
    CHECK(rlx_generator_append(g, 1) == RLX_ERR_RANGE, "context full");
    const float *lg;
    CHECK(rlx_generator_logits_cached(g, &lg) == RLX_OK, "still usable");
    struct rlx_sample_opts o = rlx_sample_opts_greedy();
    int32_t tok;
    CHECK(rlx_generator_sample(g, lg, &o, 0, &tok) == RLX_OK && tok == argmax(lg, 37), "greedy sample");
    rlx_generator_free(g);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
}

/* Two blocks chained by their hidden rows equal the whole model, recomputed and cached. */
static void test_blocks(const char *device)
{
    struct rlx_model_config c = {.vocab_size = 29, .hidden_size = 16, .intermediate_size = 20, .n_layers = 3,
                                 .n_heads = 4, .n_kv_heads = 2, .head_dim = 4, .max_position_embeddings = 16,
                                 .rms_norm_eps = 1e-6f, .qk_norm = true, .layer_window = {0, 2, 0}};
    struct rlx_generator *whole, *first, *last;
    CHECK(rlx_generator_create(&c, device, &whole) == RLX_OK, "whole");
    CHECK(rlx_generator_create_block(&c, device, 0, 2, RLX_BLOCK_EMBED, &first) == RLX_OK, "first");
    CHECK(rlx_generator_create_block(&c, device, 2, 3, RLX_BLOCK_HEAD, &last) == RLX_OK, "last");
    n_bufs = 0;
    load((struct rlx_generator *[]){whole, first, last}, 3, &c); /* each block binds the names it uses */
    int32_t prompt[4] = {3, 1, 4, 1};
    for (int cached = 0; cached < 2; cached++) {
        CHECK(rlx_generator_prefill(whole, prompt, 4) == RLX_OK && rlx_generator_prefill(first, prompt, 4) == RLX_OK,
              "prefill");
        if (cached) CHECK(rlx_kv_cache_truncate(rlx_generator_kv(last), 0) == RLX_OK, "reset last");
        for (int step = 0; step < 5; step++) {
            const float *want, *h, *got;
            int64_t rows, rows2;
            CHECK((cached ? rlx_generator_logits_cached(whole, &want) : rlx_generator_logits_naive(whole, &want)) ==
                      RLX_OK, "whole logits");
            CHECK(rlx_generator_forward(first, NULL, 0, cached, &h, &rows) == RLX_OK, "first block");
            CHECK(rlx_generator_forward(last, h, rows, cached, &got, &rows2) == RLX_OK && rows2 == 1, "last block");
            double err = 0;
            for (int i = 0; i < 29; i++) err = fmax(err, fabs(want[i] - got[i]));
            CHECK(err < 1e-4, "%s cached=%d step %d: blocks vs whole max diff %g", device, cached, step, err);
            int32_t t = argmax(want, 29);
            CHECK(rlx_generator_append(whole, t) == RLX_OK && rlx_generator_append(first, t) == RLX_OK, "append");
        }
    }
    const float *lg;
    CHECK(rlx_generator_logits_naive(first, &lg) == RLX_ERR_STATE, "a block without a head has no logits");
    rlx_generator_free(whole);
    rlx_generator_free(first);
    rlx_generator_free(last);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
}

static void test_missing_weight(void)
{
    struct rlx_model_config c = {.vocab_size = 11, .hidden_size = 8, .intermediate_size = 8, .n_layers = 1,
                                 .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .max_position_embeddings = 8,
                                 .rms_norm_eps = 1e-5f, .tie_word_embeddings = true};
    struct rlx_generator *g;
    CHECK(rlx_generator_create(&c, "gpu9", &g) == RLX_ERR_INVALID, "unknown device");
    CHECK(rlx_generator_create(&c, "cpu", &g) == RLX_OK, "create");
    int32_t ids[2] = {1, 2};
    const float *lg;
    CHECK(rlx_generator_prefill(g, ids, 2) == RLX_OK, "prefill");
    CHECK(rlx_generator_logits_naive(g, &lg) == RLX_ERR_INVALID && strstr(rlx_last_error(), "is missing"),
          "missing weight named");
    rlx_generator_free(g);
}

int main(void)
{
    srand(3);
    const char *devices[] = {"cpu", "ref"};
    const enum rlx_plan_policy policies[] = {RLX_POLICY_ONESHOT, RLX_POLICY_BUCKETED, RLX_POLICY_DYNAMIC};
    for (int d = 0; d < 2; d++)
        for (int p = 0; p < 3; p++) test_cached_equals_naive(devices[d], policies[p]);
    test_blocks("cpu");
    test_blocks("ref");
    test_missing_weight();
    rlx_set_num_threads(1);
    return check_summary();
}
