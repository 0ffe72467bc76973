/*
 * test_model.c - the decoder builder, models and sequences from C on a tiny random model that uses
 * every family feature (GQA, q/k norm, biases, a sliding-window layer, untied head): the KV-cached
 * logits must equal the naive recompute at every step, on both host devices, under the one-shot,
 * bucketed (masked rows past the sequence, a sliding-window layer) and dynamic plan policies and
 * with f32, f16 and bf16 caches; sequences of one model interleaved give what each gives alone;
 * fork and save / load continue exactly; on the ref device (memory of its own) the weights cross
 * to the device once for any number of plans and sequences, and a decode step moves a constant
 * number of bytes whatever the past; bad input fails with a status and leaves everything usable. A
 * mixture-of-experts variant (one sparse layer, experts set as parts) checks cached == naive and
 * cpu == ref under every policy, and the refusals of bad parts. Batches of ragged sequences (one
 * entering in chunks) give each sequence's own logits.
 * Runs under valgrind in `make test`. (Parity with transformers and llama2.c is proven in
 * tests/models.)
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/model.h"

#include "check.h"

#define MAX_W 256
static float *bufs[MAX_W];
static int n_bufs;

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* Sets one random array under `name` on each of the ng models that read it (the same memory for all). */
static void set_w(struct rlx_model **gs, int ng, const char *name, int64_t a, int64_t b, float base, float scale)
{
    int64_t n = a * (b ? b : 1);
    float *w = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) w[i] = base + scale * frand();
    bufs[n_bufs++] = w;
    struct rlx_host_tensor t = {.data = w, .dtype = RLX_F32, .ndim = b ? 2 : 1, .shape = {a, b}};
    for (int i = 0; i < ng; i++) {
        rlx_status s = rlx_model_set_weight(gs[i], name, &t);
        CHECK(s == RLX_OK || (s == RLX_ERR_INVALID && strstr(rlx_last_error(), "not read by")), "set %s: %s", name,
              s ? rlx_last_error() : "");
    }
}

static void load(struct rlx_model **gs, int ng, const struct rlx_model_config *c)
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
    for (int i = 0; i < ng; i++) CHECK(rlx_model_set_weight(gs[i], "rope.inv_freq", &t) == RLX_OK, "inv_freq");
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

static const struct rlx_model_config tiny = {.vocab_size = 37,
                                             .hidden_size = 16,
                                             .intermediate_size = 24,
                                             .n_layers = 2,
                                             .n_heads = 4,
                                             .n_kv_heads = 2,
                                             .head_dim = 6,
                                             .max_position_embeddings = 16,
                                             .rms_norm_eps = 1e-6f,
                                             .attention_bias = true,
                                             .qk_norm = true,
                                             .layer_window = {0, 3}};

/* Cached == naive under a plan policy and KV dtype, the prompt run in pieces of 2 positions. */
static void test_cached_equals_naive(struct rlx_device *dev, enum rlx_plan_policy policy, enum rlx_dtype kv_dtype)
{
    const char *device = rlx_device_name(dev);
    struct rlx_model_config c = tiny;
    struct rlx_model *m = NULL;
    struct rlx_seq *g = NULL;
    CHECK(rlx_model_create(&c, dev, 0, c.n_layers, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &m) == RLX_OK, "create");
    if (!m) return;
    n_bufs = 0;
    load(&m, 1, &c);
    CHECK(rlx_seq_create(m, kv_dtype, &g) == RLX_OK, "sequence");
    enum rlx_plan_policy prefill = policy == RLX_POLICY_BUCKETED ? RLX_POLICY_LRU : policy;
    CHECK(rlx_model_set_policy(m, prefill, 2, policy, 16) == RLX_OK, "policy");
    /* the prompt goes in pieces of 2 positions (2 + 2 + 1, the later ones over the cache) */
    CHECK(rlx_model_set_prefill_chunk(m, -1) == RLX_ERR_INVALID && rlx_model_set_prefill_chunk(m, 2) == RLX_OK,
          "prefill chunk");
    int32_t prompt[5] = {1, 7, 3, 30, 2};
    CHECK(rlx_seq_prefill(g, prompt, 5) == RLX_OK, "prefill");
    float naive[37];
    for (int step = 0; step < 7; step++) {
        const float *lg;
        CHECK(rlx_seq_logits_naive(g, &lg) == RLX_OK, "naive: %s", rlx_last_error());
        memcpy(naive, lg, sizeof naive);
        CHECK(rlx_seq_logits_cached(g, &lg) == RLX_OK, "cached: %s", rlx_last_error());
        double err = 0;
        for (int i = 0; i < 37; i++) err = fmax(err, fabs(naive[i] - lg[i]));
        CHECK(err < 1e-4, "%s policy %d kv %s step %d: cached vs naive max diff %g", device, policy,
              rlx_dtype_name(kv_dtype), step, err);
        CHECK(rlx_kv_cache_len(rlx_seq_kv(g)) == rlx_seq_len(g), "cache covers the history");
        int32_t t = argmax(lg, 37);
        CHECK(rlx_seq_append(g, &t, 1) == RLX_OK, "append");
    }
    /* errors leave the sequence usable */
    int32_t bad = 37;
    CHECK(rlx_seq_append(g, &bad, 1) == RLX_ERR_RANGE, "token id >= vocab");
    bad = -1;
    CHECK(rlx_seq_append(g, &bad, 1) == RLX_ERR_RANGE, "token id < 0");
    int32_t two[2] = {1, 99};
    CHECK(rlx_seq_append(g, two, 2) == RLX_ERR_RANGE && rlx_seq_len(g) == 12, "a bad id appends none");
    CHECK(rlx_seq_prefill(g, prompt, 0) == RLX_ERR_INVALID, "empty context");
    int32_t many[17] = {0};
    CHECK(rlx_seq_prefill(g, many, 17) == RLX_ERR_RANGE, "context longer than max_position_embeddings");
    CHECK(rlx_seq_len(g) == 12, "history unchanged by failed calls");
    int32_t fill[4] = {1, 1, 1, 1};
    CHECK(rlx_seq_append(g, fill, 4) == RLX_OK, "fill");
    CHECK(rlx_seq_append(g, fill, 1) == RLX_ERR_RANGE, "context full");
    const float *lg;
    CHECK(rlx_seq_logits_cached(g, &lg) == RLX_OK, "still usable (%s)", rlx_last_error());
    struct rlx_sample_opts o = rlx_sample_opts_greedy();
    int32_t tok;
    CHECK(rlx_seq_sample(g, lg, &o, 0, &tok) == RLX_OK && tok == argmax(lg, 37), "greedy sample");
    if (policy == RLX_POLICY_BUCKETED) { /* a bucketed cache covers max_past positions, then refuses */
        CHECK(rlx_model_set_policy(m, prefill, 2, policy, 12) == RLX_OK && rlx_seq_truncate(g, 12) == RLX_OK &&
                  rlx_seq_logits_cached(g, &lg) == RLX_OK,
              "12 positions under max_past 12");
        CHECK(rlx_seq_append(g, fill, 1) == RLX_OK && rlx_seq_logits_cached(g, &lg) == RLX_ERR_RANGE &&
                  strstr(rlx_last_error(), "max_past 12"),
              "the 13th refused (%s)", rlx_last_error());
    }
    rlx_seq_free(g);
    rlx_model_free(m);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
}

/* Sequences of one model: interleaved steps give what each gives alone; a fork and a saved /
 * loaded state continue exactly; a second prompt appended to a cached one (a chat's next turn)
 * equals one prefill of both. On ref, weights cross once; a decode step moves O(1) bytes. */
static void test_sequences(struct rlx_device *dev)
{
    const char *device = rlx_device_name(dev);
    struct rlx_model_config c = tiny;
    c.max_position_embeddings = 40;
    struct rlx_model *m = NULL;
    struct rlx_device_stats s0, s1, s2, s3;
    rlx_device_stats(dev, &s0);
    CHECK(rlx_model_create(&c, dev, 0, c.n_layers, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &m) == RLX_OK, "create");
    if (!m) return;
    n_bufs = 0;
    load(&m, 1, &c);
    CHECK(rlx_model_set_policy(m, RLX_POLICY_DYNAMIC, 1, RLX_POLICY_DYNAMIC, 40) == RLX_OK, "dynamic");
    rlx_device_stats(dev, &s1);
    int wcount;
    size_t wbytes;
    rlx_model_weights(m, &wcount, &wbytes);
    const bool own_memory = strcmp(device, "ref") == 0;
    if (own_memory)
        CHECK(s1.upload_bytes - s0.upload_bytes == wbytes, "ref: the weights uploaded once (%zu bytes)", wbytes);
    int32_t pa[4] = {1, 7, 3, 30}, pb[6] = {2, 5, 11, 13, 17, 19};
    struct rlx_seq *a = NULL, *b = NULL, *alone = NULL;
    CHECK(rlx_seq_create(m, RLX_F32, &a) == RLX_OK && rlx_seq_create(m, RLX_F32, &b) == RLX_OK &&
              rlx_seq_create(m, RLX_F32, &alone) == RLX_OK,
          "three sequences");
    /* the reference: b alone */
    int32_t want[10];
    CHECK(rlx_seq_prefill(alone, pb, 6) == RLX_OK, "prefill alone");
    for (int i = 0; i < 10; i++) {
        const float *lg;
        CHECK(rlx_seq_logits_cached(alone, &lg) == RLX_OK, "alone step");
        want[i] = argmax(lg, 37);
        rlx_seq_append(alone, &want[i], 1);
    }
    /* a and b interleaved, token by token */
    CHECK(rlx_seq_prefill(a, pa, 4) == RLX_OK && rlx_seq_prefill(b, pb, 6) == RLX_OK, "prefill both");
    int same = 1;
    int64_t step_up = -1, step_down = -1;
    for (int i = 0; i < 10; i++) {
        const float *lg;
        int32_t t;
        rlx_device_stats(dev, &s2);
        CHECK(rlx_seq_logits_cached(a, &lg) == RLX_OK, "a step");
        rlx_device_stats(dev, &s3);
        if (i >= 2) { /* decode steps of a: the same bytes each, whatever its past */
            const int64_t up = (int64_t)(s3.upload_bytes - s2.upload_bytes),
                          down = (int64_t)(s3.download_bytes - s2.download_bytes);
            if (step_up < 0) step_up = up, step_down = down;
            CHECK(up == step_up && down == step_down,
                  "%s: decode step %d moves %lld up / %lld down (first: %lld / %lld)", device, i, (long long)up,
                  (long long)down, (long long)step_up, (long long)step_down);
        }
        t = argmax(lg, 37);
        rlx_seq_append(a, &t, 1);
        CHECK(rlx_seq_logits_cached(b, &lg) == RLX_OK, "b step");
        t = argmax(lg, 37);
        same &= t == want[i];
        rlx_seq_append(b, &t, 1);
    }
    CHECK(same, "%s: b interleaved with a gives its tokens alone", device);
    if (own_memory)
        CHECK(step_up == 8 && step_down == 37 * 4,
              "ref: a decode step uploads the token and its position (%lld bytes) "
              "and downloads the logits (%lld bytes)",
              (long long)step_up, (long long)step_down);
    rlx_device_stats(dev, &s2);
    if (own_memory)
        CHECK(s2.upload_bytes - s1.upload_bytes < 4096, "ref: no weight uploaded again for any plan or sequence");

    /* fork: the copy continues like the original */
    struct rlx_seq *f = NULL;
    CHECK(rlx_seq_fork(a, &f) == RLX_OK && rlx_seq_len(f) == rlx_seq_len(a), "fork");
    const float *la, *lf;
    float keep[37];
    CHECK(rlx_seq_logits_cached(a, &la) == RLX_OK, "a next");
    memcpy(keep, la, sizeof keep);
    CHECK(rlx_seq_logits_cached(f, &lf) == RLX_OK && memcmp(keep, lf, sizeof keep) == 0, "fork: same next logits");

    /* save -> load into a fresh sequence: same next logits */
    size_t n = 0;
    CHECK(rlx_seq_state_size(a, &n) == RLX_OK && n > 0, "state size");
    char *state = malloc(n);
    CHECK(rlx_seq_save(a, state, n) == RLX_OK, "save");
    struct rlx_seq *r = NULL;
    CHECK(rlx_seq_create(m, RLX_F32, &r) == RLX_OK && rlx_seq_load(r, state, n) == RLX_OK, "load");
    const float *lr;
    CHECK(rlx_seq_len(r) == rlx_seq_len(a) && rlx_seq_logits_cached(r, &lr) == RLX_OK &&
              memcmp(keep, lr, sizeof keep) == 0,
          "loaded state: same next logits");
    CHECK(rlx_seq_load(r, state, n - 1) == RLX_ERR_INVALID && rlx_seq_len(r) == rlx_seq_len(a),
          "truncated state refused, "
          "sequence unchanged");
    state[0] ^= 1;
    CHECK(rlx_seq_load(r, state, n) == RLX_ERR_INVALID, "bad magic refused");
    state[0] ^= 1;
    struct rlx_seq *h16 = NULL;
    CHECK(rlx_seq_create(m, RLX_F16, &h16) == RLX_OK && rlx_seq_load(h16, state, n) == RLX_ERR_INVALID &&
              strstr(rlx_last_error(), "f32"),
          "a state of another KV dtype refused (%s)", rlx_last_error());
    free(state);

    /* a next turn appended to the cached prompt == one prefill of the concatenation */
    int32_t turn[5] = {9, 8, 7, 6, 5};
    const float *lt, *lc;
    float whole[37];
    CHECK(rlx_seq_prefill(alone, pa, 4) == RLX_OK && rlx_seq_append(alone, turn, 5) == RLX_OK &&
              rlx_seq_logits_cached(alone, &lc) == RLX_OK,
          "one prefill of both");
    memcpy(whole, lc, sizeof whole);
    CHECK(rlx_seq_prefill(b, pa, 4) == RLX_OK && rlx_seq_logits_cached(b, &lt) == RLX_OK &&
              rlx_seq_append(b, turn, 5) == RLX_OK && rlx_seq_logits_cached(b, &lt) == RLX_OK,
          "prefill then extend");
    double err = 0;
    for (int i = 0; i < 37; i++) err = fmax(err, fabs(whole[i] - lt[i]));
    CHECK(err < 1e-5, "%s: extend == one prefill (max diff %g)", device, err);
    rlx_seq_free(a);
    rlx_seq_free(b);
    rlx_seq_free(alone);
    rlx_seq_free(f);
    rlx_seq_free(r);
    rlx_seq_free(h16);
    rlx_model_free(m);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
    rlx_device_stats(dev, &s3);
    CHECK(s3.allocated_bytes == s0.allocated_bytes, "%s: everything freed", device);
}

/* Two blocks chained by their hidden rows equal the whole model, recomputed and cached. */
static void test_blocks(struct rlx_device *dev)
{
    const char *device = rlx_device_name(dev);
    struct rlx_model_config c = {.vocab_size = 29,
                                 .hidden_size = 16,
                                 .intermediate_size = 20,
                                 .n_layers = 3,
                                 .n_heads = 4,
                                 .n_kv_heads = 2,
                                 .head_dim = 4,
                                 .max_position_embeddings = 16,
                                 .rms_norm_eps = 1e-6f,
                                 .qk_norm = true,
                                 .layer_window = {0, 2, 0}};
    struct rlx_model *mw, *mf, *ml;
    CHECK(rlx_model_create(&c, dev, 0, 3, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &mw) == RLX_OK, "whole");
    CHECK(rlx_model_create(&c, dev, 0, 2, RLX_BLOCK_EMBED, &mf) == RLX_OK, "first");
    CHECK(rlx_model_create(&c, dev, 2, 3, RLX_BLOCK_HEAD, &ml) == RLX_OK, "last");
    n_bufs = 0;
    load((struct rlx_model *[]){mw, mf, ml}, 3, &c); /* each block takes the names it reads */
    struct rlx_seq *whole, *first, *last;
    CHECK(rlx_seq_create(mw, RLX_F32, &whole) == RLX_OK && rlx_seq_create(mf, RLX_F32, &first) == RLX_OK &&
              rlx_seq_create(ml, RLX_F32, &last) == RLX_OK,
          "sequences");
    int32_t prompt[4] = {3, 1, 4, 1};
    for (int cached = 0; cached < 2; cached++) {
        CHECK(rlx_seq_prefill(whole, prompt, 4) == RLX_OK && rlx_seq_prefill(first, prompt, 4) == RLX_OK, "prefill");
        rlx_seq_reset(last);
        for (int step = 0; step < 5; step++) {
            const float *want, *h, *got;
            int64_t rows, rows2;
            CHECK((cached ? rlx_seq_logits_cached(whole, &want) : rlx_seq_logits_naive(whole, &want)) == RLX_OK,
                  "whole logits");
            CHECK(rlx_seq_forward(first, NULL, 0, cached, &h, &rows) == RLX_OK, "first block");
            CHECK(rlx_seq_forward(last, h, rows, cached, &got, &rows2) == RLX_OK && rows2 == 1, "last block");
            double err = 0;
            for (int i = 0; i < 29; i++) err = fmax(err, fabs(want[i] - got[i]));
            CHECK(err < 1e-4, "%s cached=%d step %d: blocks vs whole max diff %g", device, cached, step, err);
            int32_t t = argmax(want, 29);
            CHECK(rlx_seq_append(whole, &t, 1) == RLX_OK && rlx_seq_append(first, &t, 1) == RLX_OK, "append");
        }
    }
    const float *lg;
    CHECK(rlx_seq_logits_naive(first, &lg) == RLX_ERR_STATE, "a block without a head has no logits");
    rlx_seq_free(whole);
    rlx_seq_free(first);
    rlx_seq_free(last);
    rlx_model_free(mw);
    rlx_model_free(mf);
    rlx_model_free(ml);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
}

/* Threads: four sequences of one model stepped from four threads at once (their plan runs take
 * turns inside the model; the pool and the plan cache are shared) give the tokens each gives
 * alone. Run under ThreadSanitizer by tools/run_c_tests.sh --tsan. */
#define N_THREADS 4
#define N_STEPS   8
struct seq_job {
    struct rlx_model *m;
    int32_t prompt[3];
    int32_t got[N_STEPS];
    rlx_status status;
};

static void *run_job(void *arg)
{
    struct seq_job *j = arg;
    struct rlx_seq *s = NULL;
    j->status = rlx_seq_create(j->m, RLX_F16, &s);
    if (j->status == RLX_OK) j->status = rlx_seq_prefill(s, j->prompt, 3);
    for (int i = 0; i < N_STEPS && j->status == RLX_OK; i++) {
        const float *lg;
        j->status = rlx_seq_logits_cached(s, &lg);
        if (j->status != RLX_OK) break;
        j->got[i] = argmax(lg, 37);
        j->status = rlx_seq_append(s, &j->got[i], 1);
    }
    rlx_seq_free(s);
    return NULL;
}

static void test_threads(struct rlx_device *dev)
{
    struct rlx_model_config c = tiny;
    c.max_position_embeddings = 16;
    struct rlx_model *m = NULL;
    CHECK(rlx_model_create(&c, dev, 0, c.n_layers, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &m) == RLX_OK, "create");
    if (!m) return;
    n_bufs = 0;
    load(&m, 1, &c);
    CHECK(rlx_model_set_policy(m, RLX_POLICY_DYNAMIC, 1, RLX_POLICY_BUCKETED, 16) == RLX_OK, "policy");
    struct seq_job alone[N_THREADS], together[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        alone[t] = (struct seq_job){.m = m, .prompt = {t + 1, 2 * t + 3, 5}};
        together[t] = alone[t];
        run_job(&alone[t]);
    }
    pthread_t th[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) CHECK(pthread_create(&th[t], NULL, run_job, &together[t]) == 0, "thread");
    for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < N_THREADS; t++)
        CHECK(alone[t].status == RLX_OK && together[t].status == RLX_OK &&
                  memcmp(alone[t].got, together[t].got, sizeof alone[t].got) == 0,
              "%s: sequence %d stepped beside three others gives its tokens alone", rlx_device_name(dev), t);
    rlx_model_free(m);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
}

static void test_missing_weight(struct rlx_device *cpu)
{
    struct rlx_model_config c = {.vocab_size = 11,
                                 .hidden_size = 8,
                                 .intermediate_size = 8,
                                 .n_layers = 1,
                                 .n_heads = 2,
                                 .n_kv_heads = 1,
                                 .head_dim = 4,
                                 .max_position_embeddings = 8,
                                 .rms_norm_eps = 1e-5f,
                                 .tie_word_embeddings = true};
    struct rlx_model *m;
    struct rlx_seq *g;
    CHECK(rlx_model_create(&c, cpu, 0, 1, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &m) == RLX_OK, "create");
    CHECK(rlx_seq_create(m, RLX_F32, &g) == RLX_OK, "sequence");
    int32_t ids[2] = {1, 2};
    const float *lg;
    CHECK(rlx_seq_prefill(g, ids, 2) == RLX_OK, "prefill");
    CHECK(rlx_seq_logits_naive(g, &lg) == RLX_ERR_INVALID && strstr(rlx_last_error(), "is missing"),
          "missing weight named");
    float w[8 * 4];
    struct rlx_host_tensor t = {.data = w, .dtype = RLX_F32, .ndim = 2, .shape = {8, 4}};
    CHECK(rlx_model_set_weight(m, "lm_head.weight", &t) == RLX_ERR_INVALID && strstr(rlx_last_error(), "not read"),
          "a tied model refuses lm_head");
    CHECK(rlx_model_set_weight(m, "model.layers.0.self_attn.k_proj.weight", &t) == RLX_ERR_SHAPE,
          "a wrong shape refused (%s)", rlx_last_error());
    struct rlx_host_tensor n16 = {.data = w, .dtype = RLX_F16, .ndim = 1, .shape = {8}};
    CHECK(rlx_model_set_weight(m, "model.norm.weight", &n16) == RLX_ERR_DTYPE, "an f16 norm refused");
    struct rlx_param_info *pi;
    int np;
    CHECK(rlx_decoder_params(&c, 0, 1, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &pi, &np) == RLX_OK && np == 12,
          "params of a tied one-layer block: %d", np);
    int kinds[3] = {0, 0, 0};
    for (int i = 0; i < np; i++) kinds[pi[i].kind]++;
    CHECK(kinds[RLX_PARAM_MATRIX] == 8 && kinds[RLX_PARAM_VECTOR] == 3 && kinds[RLX_PARAM_DERIVED] == 1,
          "kinds: %d matrices, %d vectors, %d derived", kinds[0], kinds[1], kinds[2]);
    rlx_decoder_params_free(pi);
    rlx_seq_free(g);
    rlx_model_free(m);
}

/* A mixture of experts (Qwen3-MoE): layer 0 sparse (6 experts, 2 a token, renormalised), layer 1
 * dense. Experts are set as their per-expert parts (a Hugging Face file's layout); the KV-cached
 * logits equal the naive recompute at every step and cpu equals ref; bad parts are refused by
 * name and status. */
#define MOE_E 6
#define MOE_F 10
static void moe_load(struct rlx_model *m, const struct rlx_model_config *c, float *experts)
{
    const int64_t H = c->hidden_size, F = c->moe_intermediate_size;
    n_bufs = 0;
    load(&m, 1, c);
    set_w(&m, 1, "model.layers.0.mlp.gate.weight", MOE_E, H, 0, 1);
    const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int p = 0; p < 3; p++) {
        struct rlx_host_tensor parts[MOE_E];
        for (int e = 0; e < MOE_E; e++)
            parts[e] = (struct rlx_host_tensor){.data = experts + (p * MOE_E + e) * F * H,
                                                .dtype = RLX_F32,
                                                .ndim = 2,
                                                .shape = {p == 2 ? H : F, p == 2 ? F : H}};
        char n[RLX_NAME_MAX];
        snprintf(n, sizeof n, "model.layers.0.mlp.experts.%s.weight", proj[p]);
        CHECK(rlx_model_set_weight_parts(m, n, MOE_E, parts) == RLX_OK, "parts of %s: %s", n, rlx_last_error());
    }
}

static void test_moe(struct rlx_device **devs)
{
    struct rlx_model_config c = tiny;
    c.n_experts = MOE_E, c.n_experts_used = 2, c.moe_intermediate_size = MOE_F, c.norm_topk_prob = true;
    c.layer_sparse[0] = true;
    float *experts = malloc(sizeof(float) * 3 * MOE_E * MOE_F * (size_t)c.hidden_size);
    for (int64_t i = 0; i < 3 * MOE_E * MOE_F * c.hidden_size; i++) experts[i] = 0.5f * frand();
    float first[2][7][37];
    for (int d = 0; d < 2; d++) {
        const enum rlx_plan_policy policies[] = {RLX_POLICY_ONESHOT, RLX_POLICY_BUCKETED, RLX_POLICY_DYNAMIC};
        for (int p = 0; p < 3; p++) {
            struct rlx_model *m = NULL;
            struct rlx_seq *g = NULL;
            CHECK(rlx_model_create(&c, devs[d], 0, c.n_layers, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &m) == RLX_OK,
                  "create: %s", rlx_last_error());
            if (!m) break;
            srand(5); /* the same weights on every device and policy */
            moe_load(m, &c, experts);
            CHECK(rlx_seq_create(m, RLX_F32, &g) == RLX_OK, "sequence");
            enum rlx_plan_policy prefill = policies[p] == RLX_POLICY_BUCKETED ? RLX_POLICY_LRU : policies[p];
            CHECK(rlx_model_set_policy(m, prefill, 2, policies[p], 16) == RLX_OK, "policy");
            int32_t prompt[5] = {4, 9, 3, 30, 2};
            CHECK(rlx_seq_prefill(g, prompt, 5) == RLX_OK, "prefill");
            for (int step = 0; step < 7; step++) {
                const float *lg;
                float naive[37];
                CHECK(rlx_seq_logits_naive(g, &lg) == RLX_OK, "moe naive: %s", rlx_last_error());
                memcpy(naive, lg, sizeof naive);
                CHECK(rlx_seq_logits_cached(g, &lg) == RLX_OK, "moe cached: %s", rlx_last_error());
                double err = 0, across = 0;
                for (int i = 0; i < 37; i++) err = fmax(err, fabs(naive[i] - lg[i]));
                if (p == 0) memcpy(first[d][step], lg, sizeof first[d][step]);
                for (int i = 0; i < 37; i++) across = fmax(across, fabs(first[0][step][i] - lg[i]));
                CHECK(err < 1e-4, "moe %s policy %d step %d: cached vs naive max diff %g", rlx_device_name(devs[d]),
                      policies[p], step, err);
                CHECK(across < 1e-4, "moe %s policy %d step %d: vs cpu one-shot max diff %g", rlx_device_name(devs[d]),
                      policies[p], step, across);
                int32_t t = argmax(lg, 37);
                CHECK(rlx_seq_append(g, &t, 1) == RLX_OK, "append");
            }
            rlx_seq_free(g);
            if (d == 0 && p == 0) { /* refusals: by status and name, the model still usable after */
                struct rlx_host_tensor parts[MOE_E + 1];
                for (int e = 0; e <= MOE_E; e++)
                    parts[e] = (struct rlx_host_tensor){
                        .data = experts, .dtype = RLX_F32, .ndim = 2, .shape = {MOE_F, c.hidden_size}};
                const char *gate = "model.layers.0.mlp.experts.gate_proj.weight";
                CHECK(rlx_model_set_weight_parts(m, gate, MOE_E + 1, parts) == RLX_ERR_SHAPE &&
                          strstr(rlx_last_error(), "takes 6 parts"),
                      "a part too many: %s", rlx_last_error());
                parts[3].shape[1] = c.hidden_size - 1;
                CHECK(rlx_model_set_weight_parts(m, gate, MOE_E, parts) == RLX_ERR_SHAPE &&
                          strstr(rlx_last_error(), "experts.3.gate_proj.weight"),
                      "a mis-shaped part named: %s", rlx_last_error());
                parts[3].shape[1] = c.hidden_size, parts[4].dtype = RLX_F16;
                CHECK(rlx_model_set_weight_parts(m, gate, MOE_E, parts) == RLX_ERR_DTYPE &&
                          strstr(rlx_last_error(), "share a dtype"),
                      "mixed dtypes: %s", rlx_last_error());
                CHECK(rlx_model_set_weight_parts(m, "model.layers.1.mlp.gate_proj.weight", MOE_E, parts) ==
                              RLX_ERR_INVALID &&
                          strstr(rlx_last_error(), "not stacked experts"),
                      "parts of a dense matrix: %s", rlx_last_error());
                CHECK(rlx_model_set_weight(m, "model.layers.0.mlp.gate_proj.weight", &parts[0]) == RLX_ERR_INVALID,
                      "a sparse layer reads no dense MLP");
            }
            rlx_model_free(m);
            for (int i = 0; i < n_bufs; i++) free(bufs[i]);
        }
    }
    free(experts);
    struct rlx_model_config bad = c;
    bad.n_experts_used = MOE_E + 1;
    CHECK(rlx_model_config_check(&bad) == RLX_ERR_INVALID && strstr(rlx_last_error(), "n_experts_used"),
          "k > E refused: %s", rlx_last_error());
    bad = c, bad.moe_intermediate_size = 0;
    CHECK(rlx_model_config_check(&bad) == RLX_ERR_INVALID, "moe_intermediate_size 0 refused");
    bad.layer_sparse[0] = false; /* no sparse layer: the expert fields are not read */
    CHECK(rlx_model_config_check(&bad) == RLX_OK, "a dense model ignores the expert fields: %s", rlx_last_error());
}

/* A batch: three sequences of ragged lengths advanced together (their prompts in one plan, one
 * chunked, then decode steps) give the logits each gives alone; bad batches fail with a status and
 * change nothing. */
static void test_batch(struct rlx_device *dev)
{
    const char *device = rlx_device_name(dev);
    struct rlx_model_config c = tiny;
    struct rlx_model *m = NULL;
    CHECK(rlx_model_create(&c, dev, 0, c.n_layers, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, &m) == RLX_OK, "create");
    if (!m) return;
    n_bufs = 0;
    load(&m, 1, &c);
    const int32_t prompts[3][6] = {{1, 7, 3, 30, 2, 9}, {4}, {11, 12, 13}};
    const int64_t lens[3] = {6, 1, 3};
    struct rlx_seq *alone[3] = {NULL}, *seqs[3] = {NULL};
    for (int b = 0; b < 3; b++) {
        CHECK(rlx_seq_create(m, RLX_F32, &alone[b]) == RLX_OK && rlx_seq_create(m, RLX_F32, &seqs[b]) == RLX_OK,
              "sequences");
        CHECK(rlx_seq_prefill(alone[b], prompts[b], lens[b]) == RLX_OK &&
                  rlx_seq_prefill(seqs[b], prompts[b], lens[b]) == RLX_OK,
              "prefill");
    }
    const float *lg[3];
    /* chunk 4: sequence 0 (6 positions) needs two steps, the others finish in the first */
    CHECK(rlx_seq_batch_logits(seqs, 3, 4, lg) == RLX_OK, "batch chunked: %s", rlx_last_error());
    CHECK(lg[0] == NULL && lg[1] && lg[2] && rlx_kv_cache_len(rlx_seq_kv(seqs[0])) == 4, "sequence 0 still entering");
    for (int step = 0; step < 4; step++) {
        CHECK(rlx_seq_batch_logits(seqs, 3, 4, lg) == RLX_OK, "batch step %d: %s", step, rlx_last_error());
        for (int b = 0; b < 3; b++) {
            const float *want;
            CHECK(lg[b] != NULL && rlx_seq_logits_cached(alone[b], &want) == RLX_OK, "logits");
            if (!lg[b]) continue;
            double err = 0;
            for (int i = 0; i < 37; i++) err = fmax(err, fabs(want[i] - lg[b][i]));
            CHECK(err < 1e-5, "%s batch step %d sequence %d: max diff %g from alone", device, step, b, err);
            int32_t t = argmax(want, 37);
            CHECK(rlx_seq_append(alone[b], &t, 1) == RLX_OK && rlx_seq_append(seqs[b], &t, 1) == RLX_OK, "append");
        }
    }
    /* refusals: a repeated sequence, a sequence without context, another KV dtype, too many */
    struct rlx_seq *twice[2] = {seqs[0], seqs[0]}, *other = NULL, *empty = NULL;
    CHECK(rlx_seq_batch_logits(twice, 2, 0, lg) == RLX_ERR_INVALID, "the same sequence twice");
    CHECK(rlx_seq_create(m, RLX_F16, &other) == RLX_OK && rlx_seq_prefill(other, prompts[1], 1) == RLX_OK, "f16");
    struct rlx_seq *mixed[2] = {seqs[1], other};
    CHECK(rlx_seq_batch_logits(mixed, 2, 0, lg) == RLX_ERR_INVALID, "mixed KV dtypes");
    CHECK(rlx_seq_create(m, RLX_F32, &empty) == RLX_OK, "empty");
    struct rlx_seq *with_empty[2] = {seqs[1], empty};
    CHECK(rlx_seq_batch_logits(with_empty, 2, 0, lg) == RLX_ERR_STATE, "a sequence without context");
    CHECK(rlx_seq_batch_logits(seqs, 0, 0, lg) == RLX_ERR_INVALID &&
              rlx_seq_batch_logits(seqs, RLX_MAX_BATCH + 1, 0, lg) == RLX_ERR_INVALID,
          "batch sizes outside 1..RLX_MAX_BATCH");
    CHECK(rlx_seq_len(seqs[1]) == 5 && rlx_kv_cache_len(rlx_seq_kv(seqs[1])) == 4, "refusals changed nothing");
    CHECK(rlx_seq_batch_logits(seqs, 3, 0, lg) == RLX_OK && lg[0] && lg[1] && lg[2], "still usable");
    rlx_seq_free(other);
    rlx_seq_free(empty);
    for (int b = 0; b < 3; b++) {
        rlx_seq_free(alone[b]);
        rlx_seq_free(seqs[b]);
    }
    rlx_model_free(m);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
}

int main(void)
{
    srand(3);
    const char *names[] = {"cpu", "ref"};
    const enum rlx_plan_policy policies[] = {RLX_POLICY_ONESHOT, RLX_POLICY_BUCKETED, RLX_POLICY_DYNAMIC};
    const enum rlx_dtype kvs[] = {RLX_F32, RLX_F16, RLX_BF16};
    struct rlx_device *devs[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        CHECK(rlx_device_open(names[d], &devs[d]) == RLX_OK, "open %s", names[d]);
        for (int p = 0; p < 3; p++)
            for (int k = 0; k < 3; k++)
                if (k == 0 || p == 1) test_cached_equals_naive(devs[d], policies[p], kvs[k]);
        test_sequences(devs[d]);
        test_batch(devs[d]);
        test_blocks(devs[d]);
        test_threads(devs[d]);
    }
    test_missing_weight(devs[0]);
    test_moe(devs);
    for (int d = 0; d < 2; d++) rlx_device_free(devs[d]);
    rlx_set_num_threads(1);
    return check_summary();
}
