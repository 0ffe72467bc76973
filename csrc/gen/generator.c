/*
 * generator.c - the generator: token history, KV cache, compiled plans and sampling.
 *
 * Three kinds of plan, all from the one decoder builder:
 *   FULL   - every position, no cache: the naive recompute path (logits of the last position);
 *   SEED   - every position, writes each layer's K/V: fills an empty cache;
 *   EXTEND - the positions not cached yet over the cached past: one token per decode step.
 * Cached logits always mean "bring the cache up to the whole history, return the last logits", so
 * prefill, decode and mixed naive / cached use share one path. New K/V rows are written by their
 * kernels straight into the cache's next slots (the plan's K/V outputs are bound there): the cache
 * is never copied or reallocated.
 * Plans are kept in one list keyed by (kind, seq, past) under the policies of model.h: ONESHOT
 * keeps one per kind, LRU the most recently used prefill plans, BUCKETED one decode plan per
 * power-of-two past (the padding rows hidden by masks), DYNAMIC one symbolic plan per kind.
 * Every failing call leaves the history and the cache as they were.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend.h"
#include "core/core.h"
#include "rlx/model.h"

enum plan_kind { KIND_FULL, KIND_SEED, KIND_EXTEND, KIND_COUNT };

#define MAX_MASKS 4 /* distinct layer windows a masked plan may need */

struct plan_slot {
    struct rlx_plan *plan;
    enum plan_kind kind;
    int64_t seq, past;          /* key: the shape it was built for (past: the bucket); -1 = symbolic */
    uint64_t last_used;
    int in_x, in_pos, out_y;    /* "ids" or "hidden"; "pos"; "logits" or "hidden" */
    int *in_pk, *in_pv;         /* (n_layers) EXTEND only */
    int *out_k, *out_v;         /* (n_layers) SEED / EXTEND */
    int n_masks;                /* BUCKETED decode: mask inputs and the window each is for */
    int mask_in[MAX_MASKS];
    int64_t mask_w[MAX_MASKS];
};

struct weight {
    char name[RLX_NAME_MAX];
    struct rlx_host_tensor t;   /* borrowed */
};

struct rlx_generator {
    struct rlx_model_config cfg;
    int64_t layer_begin, layer_end; /* the block of layers this generator runs */
    unsigned ends;              /* RLX_BLOCK_EMBED (input ids, else hidden) | RLX_BLOCK_HEAD (output logits, else hidden) */
    char device[32];
    enum rlx_plan_policy prefill_policy, decode_policy;
    int64_t prefill_capacity, max_past, seq_cap;
    size_t memory_budget;
    char budget_hint[256];
    struct weight *weights;     /* (n_weights) */
    int n_weights, cap_weights;
    int32_t *tokens;            /* (max_position_embeddings) history */
    int32_t *pos;               /* (max_position_embeddings) scratch: absolute positions */
    int64_t n_tokens;
    struct rlx_kv_cache *kv;    /* (n_layers, max_position_embeddings, n_kv_heads * head_dim) */
    float *logits;              /* (vocab) of the position after the cached history */
    float *hidden;              /* (hidden_rows, hidden_size) output of a block without a head */
    int64_t hidden_rows;
    bool logits_valid;          /* logits belong to the current history (cache == history) */
    float *sample_scratch;      /* (vocab) */
    int32_t *sample_idx;        /* (vocab) */
    struct plan_slot *slots;    /* (n_slots) compiled plans */
    int n_slots, cap_slots;
    uint64_t clock;             /* use counter for LRU */
    float *mask;                /* (mask_floats) scratch for BUCKETED masks, grown on demand */
    size_t mask_floats;
    struct rlx_generator_stats stats;
    bool profiling;             /* plans time every node; profile holds the last run's sums per op */
    double profile[RLX_OP_COUNT];
    bool profile_valid;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void slot_clear(struct plan_slot *s)
{
    rlx_plan_free(s->plan);
    free(s->in_pk);
    free(s->in_pv);
    free(s->out_k);
    free(s->out_v);
    memset(s, 0, sizeof *s);
}

rlx_status rlx_generator_create_block(const struct rlx_model_config *cfg, const char *device, int64_t layer_begin,
                                     int64_t layer_end, unsigned ends, struct rlx_generator **out)
{
    RLX_TRY(rlx_model_config_check(cfg));
    if (layer_begin < 0 || layer_end > cfg->n_layers || layer_begin > layer_end)
        return rlx_set_error(RLX_ERR_INVALID, "generator block: layers [%lld, %lld) outside [0, %lld)",
                             (long long)layer_begin, (long long)layer_end, (long long)cfg->n_layers);
    if (ends & ~(unsigned)(RLX_BLOCK_EMBED | RLX_BLOCK_HEAD))
        return rlx_set_error(RLX_ERR_INVALID, "generator block: ends may only be RLX_BLOCK_EMBED | RLX_BLOCK_HEAD");
    if (!device || strlen(device) >= sizeof ((struct rlx_generator *)0)->device)
        return rlx_set_error(RLX_ERR_INVALID, "generator: bad device name");
    const struct rlx_backend *be; /* fail now, not at the first step, for an unknown device */
    RLX_TRY(rlx_backend_find(device, &be));
    struct rlx_generator *g = rlx_calloc(1, sizeof *g);
    if (!g) return RLX_ERR_NOMEM;
    g->cfg = *cfg;
    g->layer_begin = layer_begin;
    g->layer_end = layer_end;
    g->ends = ends;
    strcpy(g->device, device);
    g->prefill_capacity = 1;
    g->max_past = cfg->max_position_embeddings;
    int64_t ctx = cfg->max_position_embeddings, V = cfg->vocab_size, L = layer_end - layer_begin;
    g->tokens = rlx_calloc((size_t)ctx, sizeof *g->tokens);
    g->pos = rlx_calloc((size_t)ctx, sizeof *g->pos);
    g->logits = rlx_calloc((size_t)V, sizeof *g->logits);
    g->sample_scratch = rlx_calloc(rlx_sample_scratch_floats(V), sizeof *g->sample_scratch);
    g->sample_idx = rlx_calloc((size_t)V, sizeof *g->sample_idx);
    rlx_status s = (g->tokens && g->pos && g->logits && g->sample_scratch && g->sample_idx) ? RLX_OK : RLX_ERR_NOMEM;
    if (s == RLX_OK) s = rlx_kv_cache_create(L > 0 ? L : 1, cfg->n_kv_heads * cfg->head_dim, ctx, &g->kv);
    if (s != RLX_OK) {
        rlx_generator_free(g);
        return s;
    }
    *out = g;
    return RLX_OK;
}

rlx_status rlx_generator_create(const struct rlx_model_config *cfg, const char *device, struct rlx_generator **out)
{
    return rlx_generator_create_block(cfg, device, 0, cfg->n_layers, RLX_BLOCK_EMBED | RLX_BLOCK_HEAD, out);
}

void rlx_generator_free(struct rlx_generator *g)
{
    if (!g) return;
    rlx_generator_release_plans(g);
    free(g->slots);
    free(g->mask);
    rlx_kv_cache_free(g->kv);
    free(g->weights);
    free(g->tokens);
    free(g->pos);
    free(g->logits);
    free(g->hidden);
    free(g->sample_scratch);
    free(g->sample_idx);
    free(g);
}

rlx_status rlx_generator_set_weight(struct rlx_generator *g, const char *name, const struct rlx_host_tensor *t)
{
    if (!name || strlen(name) >= RLX_NAME_MAX) return rlx_set_error(RLX_ERR_INVALID, "weight name too long");
    if (t->dtype != RLX_F32 && t->dtype != g->cfg.weight_dtype)
        return rlx_set_error(RLX_ERR_DTYPE, "weight '%s' is %s; this generator takes f32%s%s weights", name,
                             rlx_dtype_name(t->dtype), g->cfg.weight_dtype != RLX_F32 ? " and " : "",
                             g->cfg.weight_dtype != RLX_F32 ? rlx_dtype_name(g->cfg.weight_dtype) : "");
    int i = 0;
    while (i < g->n_weights && strcmp(g->weights[i].name, name) != 0) i++;
    if (i == g->n_weights) {
        RLX_TRY(rlx_grow(&g->weights, &g->cap_weights, g->n_weights + 1));
        g->n_weights++;
        strcpy(g->weights[i].name, name);
    }
    g->weights[i].t = *t;
    rlx_generator_release_plans(g); /* plans hold the old pointers */
    return RLX_OK;
}

rlx_status rlx_generator_set_policy(struct rlx_generator *g, enum rlx_plan_policy prefill, int64_t prefill_capacity,
                                    enum rlx_plan_policy decode, int64_t max_past)
{
    if (prefill != RLX_POLICY_ONESHOT && prefill != RLX_POLICY_LRU && prefill != RLX_POLICY_DYNAMIC)
        return rlx_set_error(RLX_ERR_INVALID, "prefill plans take the oneshot, lru or dynamic policy");
    if (decode != RLX_POLICY_ONESHOT && decode != RLX_POLICY_BUCKETED && decode != RLX_POLICY_DYNAMIC)
        return rlx_set_error(RLX_ERR_INVALID, "decode plans take the oneshot, bucketed or dynamic policy");
    if (prefill_capacity < 1 || max_past < 1)
        return rlx_set_error(RLX_ERR_INVALID, "plan cache capacity and max_past must be >= 1");
    if (rlx_kv_cache_len(g->kv) > 0)
        return rlx_set_error(RLX_ERR_STATE, "plan policies cannot change mid-utterance (the KV cache holds %lld "
                             "positions): call prefill() first", (long long)rlx_kv_cache_len(g->kv));
    g->prefill_policy = prefill;
    g->decode_policy = decode;
    g->prefill_capacity = prefill == RLX_POLICY_LRU ? prefill_capacity : 1;
    g->max_past = max_past < g->cfg.max_position_embeddings ? max_past : g->cfg.max_position_embeddings;
    rlx_generator_release_plans(g);
    return RLX_OK;
}

rlx_status rlx_generator_set_seq_cap(struct rlx_generator *g, int64_t cap)
{
    if (cap < 0 || cap > g->cfg.max_position_embeddings)
        return rlx_set_error(RLX_ERR_INVALID, "compile seq cap %lld outside [1, max_position_embeddings %lld]",
                             (long long)cap, (long long)g->cfg.max_position_embeddings);
    if (rlx_kv_cache_len(g->kv) > 0)
        return rlx_set_error(RLX_ERR_STATE, "the compile seq cap cannot change mid-utterance (the KV cache holds "
                             "%lld positions): call prefill() first", (long long)rlx_kv_cache_len(g->kv));
    g->seq_cap = cap;
    rlx_generator_release_plans(g);
    return RLX_OK;
}

void rlx_generator_set_memory_budget(struct rlx_generator *g, size_t bytes, const char *hint)
{
    g->memory_budget = bytes;
    snprintf(g->budget_hint, sizeof g->budget_hint, "%s", hint ? hint : "");
    rlx_generator_release_plans(g);
}

/* ---- history ------------------------------------------------------------------------------ */

static rlx_status check_token(const struct rlx_generator *g, int32_t t, int64_t where)
{
    if (t < 0 || t >= g->cfg.vocab_size)
        return rlx_set_error(RLX_ERR_RANGE, "token id %d at position %lld is outside [0, %lld)", t, (long long)where,
                             (long long)g->cfg.vocab_size);
    return RLX_OK;
}

rlx_status rlx_generator_prefill(struct rlx_generator *g, const int32_t *ids, int64_t n)
{
    if (n < 1) return rlx_set_error(RLX_ERR_INVALID, "prefill: the context is empty");
    if (n > g->cfg.max_position_embeddings)
        return rlx_set_error(RLX_ERR_RANGE, "prefill: %lld tokens exceed max_position_embeddings %lld", (long long)n,
                             (long long)g->cfg.max_position_embeddings);
    for (int64_t i = 0; i < n; i++) RLX_TRY(check_token(g, ids[i], i));
    memcpy(g->tokens, ids, (size_t)n * sizeof *ids);
    g->n_tokens = n;
    g->logits_valid = false;
    return rlx_kv_cache_truncate(g->kv, 0);
}

void rlx_generator_reset(struct rlx_generator *g)
{
    g->n_tokens = 0;
    g->logits_valid = false;
    rlx_kv_cache_truncate(g->kv, 0); /* cannot fail for 0 */
}

rlx_status rlx_generator_truncate(struct rlx_generator *g, int64_t n)
{
    if (n < 0) return rlx_set_error(RLX_ERR_INVALID, "truncate: negative length %lld", (long long)n);
    if (n >= g->n_tokens) return RLX_OK;
    g->n_tokens = n;
    g->logits_valid = false;
    return rlx_kv_cache_truncate(g->kv, n);
}

rlx_status rlx_generator_append(struct rlx_generator *g, int32_t token)
{
    if (g->n_tokens == 0) return rlx_set_error(RLX_ERR_STATE, "no context: call prefill first");
    if (g->n_tokens >= g->cfg.max_position_embeddings)
        return rlx_set_error(RLX_ERR_RANGE, "the context is full: max_position_embeddings is %lld",
                             (long long)g->cfg.max_position_embeddings);
    RLX_TRY(check_token(g, token, g->n_tokens));
    g->tokens[g->n_tokens++] = token;
    g->logits_valid = false;
    return RLX_OK;
}

int64_t rlx_generator_len(const struct rlx_generator *g) { return g->n_tokens; }

void rlx_generator_block(const struct rlx_generator *g, int64_t *begin, int64_t *end, unsigned *ends)
{
    *begin = g->layer_begin;
    *end = g->layer_end;
    *ends = g->ends;
}
const int32_t *rlx_generator_tokens(const struct rlx_generator *g) { return g->tokens; }
const struct rlx_model_config *rlx_generator_config(const struct rlx_generator *g) { return &g->cfg; }
struct rlx_kv_cache *rlx_generator_kv(struct rlx_generator *g) { return g->kv; }

/* ---- plans -------------------------------------------------------------------------------- */

static rlx_status bind_weights(const struct rlx_generator *g, struct rlx_plan *p)
{
    for (int i = 0; i < rlx_plan_param_count(p); i++) {
        const char *name = rlx_plan_param_name(p, i);
        int w = 0;
        while (w < g->n_weights && strcmp(g->weights[w].name, name) != 0) w++;
        if (w == g->n_weights) return rlx_set_error(RLX_ERR_INVALID, "weight '%s' is missing", name);
        RLX_TRY(rlx_plan_set_param(p, i, &g->weights[w].t));
    }
    return RLX_OK;
}

static rlx_status index_slot(const struct rlx_generator *g, struct plan_slot *s)
{
    struct rlx_plan *p = s->plan;
    RLX_TRY(rlx_plan_input_index(p, (g->ends & RLX_BLOCK_EMBED) ? "ids" : "hidden", &s->in_x));
    RLX_TRY(rlx_plan_input_index(p, "pos", &s->in_pos));
    RLX_TRY(rlx_plan_output_index(p, (g->ends & RLX_BLOCK_HEAD) ? "logits" : "hidden", &s->out_y));
    int64_t n_layers = g->layer_end - g->layer_begin;
    for (int i = 0; i < rlx_plan_input_count(p); i++) {
        const char *name = rlx_plan_input_name(p, i);
        if (strncmp(name, "mask", 4) != 0) continue;
        if (s->n_masks == MAX_MASKS) return rlx_set_error(RLX_ERR_UNSUPPORTED, "more than %d layer windows", MAX_MASKS);
        s->mask_in[s->n_masks] = i;
        s->mask_w[s->n_masks++] = name[4] == '_' ? strtoll(name + 6, NULL, 10) : 0; /* "mask" or "mask_w<W>" */
    }
    if (s->kind == KIND_FULL) return RLX_OK;
    s->out_k = rlx_calloc((size_t)n_layers, sizeof(int));
    s->out_v = rlx_calloc((size_t)n_layers, sizeof(int));
    s->in_pk = rlx_calloc((size_t)n_layers, sizeof(int));
    s->in_pv = rlx_calloc((size_t)n_layers, sizeof(int));
    if (!s->out_k || !s->out_v || !s->in_pk || !s->in_pv) return RLX_ERR_NOMEM;
    for (int64_t l = 0; l < n_layers; l++) { /* local index l, global layer_begin + l in the names */
        char name[RLX_NAME_MAX];
        long long gl = (long long)(g->layer_begin + l);
        snprintf(name, sizeof name, "k.%lld", gl);
        RLX_TRY(rlx_plan_output_index(p, name, &s->out_k[l]));
        snprintf(name, sizeof name, "v.%lld", gl);
        RLX_TRY(rlx_plan_output_index(p, name, &s->out_v[l]));
        if (s->kind != KIND_EXTEND) continue;
        snprintf(name, sizeof name, "past_k.%lld", gl);
        RLX_TRY(rlx_plan_input_index(p, name, &s->in_pk[l]));
        snprintf(name, sizeof name, "past_v.%lld", gl);
        RLX_TRY(rlx_plan_input_index(p, name, &s->in_pv[l]));
    }
    return RLX_OK;
}

static int64_t pow2_ceil(int64_t v)
{
    int64_t r = 1;
    while (r < v) r *= 2;
    return r;
}

/* The key a (kind, seq, past) request maps to under the policies; *bucketed for masked plans. */
static rlx_status plan_key(const struct rlx_generator *g, enum plan_kind kind, int64_t seq, int64_t past,
                           int64_t *kseq, int64_t *kpast, bool *bucketed)
{
    enum rlx_plan_policy pol = kind == KIND_EXTEND ? g->decode_policy : g->prefill_policy;
    *bucketed = pol == RLX_POLICY_BUCKETED;
    *kseq = seq;
    *kpast = past;
    if (pol == RLX_POLICY_DYNAMIC) {
        *kseq = *kpast = -1;
    } else if (*bucketed) {
        if (past > g->max_past)
            return rlx_set_error(RLX_ERR_RANGE, "the cached past of %lld positions exceeds max_past %lld of the "
                                 "bucketed decode cache; this utterance cannot grow further under it (use a larger "
                                 "max_past)", (long long)past, (long long)g->max_past);
        *kpast = pow2_ceil(past);
        if (*kpast > g->max_past) *kpast = g->max_past;
    }
    return RLX_OK;
}

/* Makes room for one more plan of `kind`: ONESHOT keeps one per kind, LRU `capacity` prefill
 * plans; BUCKETED and DYNAMIC keep theirs (one per bucket / one in all). */
static void evict_for(struct rlx_generator *g, enum plan_kind kind)
{
    bool prefill = kind != KIND_EXTEND;
    enum rlx_plan_policy pol = prefill ? g->prefill_policy : g->decode_policy;
    if (pol == RLX_POLICY_BUCKETED || pol == RLX_POLICY_DYNAMIC) return;
    for (;;) {
        int count = 0, victim = -1;
        for (int i = 0; i < g->n_slots; i++) {
            bool same = pol == RLX_POLICY_LRU ? (g->slots[i].kind != KIND_EXTEND) == prefill : g->slots[i].kind == kind;
            if (!same) continue;
            count++;
            if (victim < 0 || g->slots[i].last_used < g->slots[victim].last_used) victim = i;
        }
        if (count < (pol == RLX_POLICY_LRU ? g->prefill_capacity : 1)) return;
        slot_clear(&g->slots[victim]);
        g->slots[victim] = g->slots[--g->n_slots];
    }
}

/* The plan for `kind` at (seq, past), compiled on a miss. */
static rlx_status get_plan(struct rlx_generator *g, enum plan_kind kind, int64_t seq, int64_t past,
                           struct plan_slot **out)
{
    int64_t kseq, kpast;
    bool bucketed;
    RLX_TRY(plan_key(g, kind, seq, past, &kseq, &kpast, &bucketed));
    for (int i = 0; i < g->n_slots; i++) {
        struct plan_slot *s = &g->slots[i];
        if (s->kind == kind && s->seq == kseq && s->past == kpast) {
            s->last_used = ++g->clock;
            g->stats.plan_hits++;
            *out = s;
            return RLX_OK;
        }
    }
    evict_for(g, kind);
    RLX_TRY(rlx_grow(&g->slots, &g->cap_slots, g->n_slots + 1));
    struct plan_slot *s = &g->slots[g->n_slots];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    double t0 = now_seconds();
    bool dynamic = kseq < 0;
    struct rlx_block_spec spec = {
        .layer_begin = g->layer_begin,
        .layer_end = g->layer_end,
        .flags = g->ends | (kind != KIND_FULL ? RLX_BLOCK_KV_OUT : 0u) |
                 (kind == KIND_EXTEND ? RLX_BLOCK_PAST : 0u) | (bucketed ? RLX_BLOCK_MASK : 0u),
        .seq = dynamic ? rlx_dim_sym(RLX_SYM_SEQ) : rlx_dim_const(kseq),
        .past = dynamic ? rlx_dim_sym(RLX_SYM_PAST) : rlx_dim_const(kpast),
    };
    struct rlx_graph *graph;
    RLX_TRY(rlx_decoder_build(&g->cfg, &spec, &graph));
    struct rlx_compile_opts opts = rlx_compile_opts_default();
    opts.memory_budget = g->memory_budget;
    opts.budget_hint = g->budget_hint;
    if (dynamic && g->seq_cap) opts.sym_cap[RLX_SYM_SEQ] = opts.sym_cap[RLX_SYM_PAST] = g->seq_cap;
    rlx_status st = rlx_compile(graph, g->device, &opts, &s->plan);
    rlx_graph_free(graph);
    if (st == RLX_OK) st = bind_weights(g, s->plan);
    if (st == RLX_OK) st = index_slot(g, s);
    if (st == RLX_OK && g->profiling) st = rlx_plan_set_profiling(s->plan, true);
    if (st != RLX_OK) {
        slot_clear(s);
        return st;
    }
    s->seq = kseq;
    s->past = kpast;
    s->last_used = ++g->clock;
    g->n_slots++;
    g->stats.compile_seconds += now_seconds() - t0;
    if (kind == KIND_EXTEND) g->stats.decode_compiles++;
    else g->stats.prefill_compiles++;
    *out = s;
    return RLX_OK;
}

/* Masks of a bucketed plan: (S, B+S) with B = s->past padded rows, of which the first `past` hold
 * the cache. Query i sits at position past+i; key j < B at position j (hidden if j >= past), key
 * B+k at position past+k. Visible: causal and, for window W, position distance < W. */
static rlx_status set_masks(struct rlx_generator *g, struct plan_slot *s, int64_t S, int64_t past)
{
    int64_t B = s->past, T = B + S;
    size_t need = (size_t)(S * T) * (size_t)s->n_masks;
    if (need > g->mask_floats) {
        float *m = realloc(g->mask, need * sizeof *m);
        if (!m) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %zu mask floats", need);
        g->mask = m;
        g->mask_floats = need;
    }
    for (int k = 0; k < s->n_masks; k++) {
        float *m = g->mask + (size_t)(S * T) * (size_t)k;
        int64_t w = s->mask_w[k];
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < T; j++) {
                int64_t qpos = past + i, kpos = j < B ? j : past + (j - B);
                bool ok = (j < past || j >= B) && kpos <= qpos && (w == 0 || qpos - kpos < w);
                m[i * T + j] = ok ? 0.0f : -INFINITY;
            }
        struct rlx_host_tensor t = {.data = m, .dtype = RLX_F32, .ndim = 2, .shape = {S, T}};
        RLX_TRY(rlx_plan_set_input(s->plan, s->mask_in[k], &t));
    }
    return RLX_OK;
}

/* Runs positions [from, from + n) through a plan of `kind` (FULL: from == 0, no cache; SEED / EXTEND:
 * over the cached past [0, from), writing the new rows into the cache). The block's input is the
 * history's ids (embedding blocks) or hidden (n, H). *out: logits (1, V) or hidden (n, H). */
static rlx_status run_positions(struct rlx_generator *g, enum plan_kind kind, const float *hidden, int64_t from, int64_t n,
                                const float **out, int64_t *rows)
{
    int64_t L = g->layer_end - g->layer_begin, row = rlx_kv_cache_row(g->kv), H = g->cfg.hidden_size;
    struct plan_slot *s;
    RLX_TRY(get_plan(g, kind, n, from, &s));
    for (int64_t i = 0; i < n; i++) g->pos[i] = (int32_t)(from + i);
    struct rlx_host_tensor x = {.data = g->tokens + from, .dtype = RLX_I32, .ndim = 1, .shape = {n}};
    if (!(g->ends & RLX_BLOCK_EMBED)) x = (struct rlx_host_tensor){.data = hidden, .dtype = RLX_F32, .ndim = 2, .shape = {n, H}};
    struct rlx_host_tensor pos = {.data = g->pos, .dtype = RLX_I32, .ndim = 1, .shape = {n}};
    RLX_TRY(rlx_plan_set_input(s->plan, s->in_x, &x));
    RLX_TRY(rlx_plan_set_input(s->plan, s->in_pos, &pos));
    if (kind == KIND_EXTEND) {
        int64_t past_rows = s->past > 0 ? s->past : from; /* a bucket pads the past */
        if (s->n_masks) RLX_TRY(set_masks(g, s, n, from));
        for (int64_t l = 0; l < L; l++) {
            struct rlx_host_tensor pk = {.data = rlx_kv_cache_k(g->kv, l), .dtype = RLX_F32, .ndim = 3,
                                         .shape = {past_rows, g->cfg.n_kv_heads, g->cfg.head_dim}};
            struct rlx_host_tensor pv = pk;
            pv.data = rlx_kv_cache_v(g->kv, l);
            RLX_TRY(rlx_plan_set_input(s->plan, s->in_pk[l], &pk));
            RLX_TRY(rlx_plan_set_input(s->plan, s->in_pv[l], &pv));
        }
    }
    if (kind != KIND_FULL) RLX_TRY(rlx_kv_cache_truncate(g->kv, from));
    for (int64_t l = 0; kind != KIND_FULL && l < L; l++) {
        /* the new rows' K and V are written by their kernels straight into the cache's next slot
         * (no copy, no arena space); a failed run leaves them beyond len, unused */
        float *k, *v;
        RLX_TRY(rlx_kv_cache_slot(g->kv, l, n, &k, &v));
        size_t bytes = sizeof(float) * (size_t)(n * row);
        RLX_TRY(rlx_plan_bind_output(s->plan, s->out_k[l], k, bytes));
        RLX_TRY(rlx_plan_bind_output(s->plan, s->out_v[l], v, bytes));
    }
    g->profile_valid = false;
    RLX_TRY(rlx_plan_run(s->plan));
    if (g->profiling) g->profile_valid = rlx_plan_profile(s->plan, g->profile) == RLX_OK;
    if (g->ends & RLX_BLOCK_HEAD) {
        RLX_TRY(rlx_plan_read_output(s->plan, s->out_y, g->logits, sizeof(float) * (size_t)g->cfg.vocab_size));
        *out = g->logits;
        *rows = 1;
    } else {
        if (n > g->hidden_rows) {
            float *h = realloc(g->hidden, sizeof(float) * (size_t)(n * H));
            if (!h) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %lld hidden rows", (long long)n);
            g->hidden = h;
            g->hidden_rows = n;
        }
        RLX_TRY(rlx_plan_read_output(s->plan, s->out_y, g->hidden, sizeof(float) * (size_t)(n * H)));
        *out = g->hidden;
        *rows = n;
    }
    if (kind != KIND_FULL) RLX_TRY(rlx_kv_cache_advance(g->kv, n));
    return RLX_OK;
}

/* The whole history of an embedding block, recomputed or through the cache. */
static rlx_status forward_history(struct rlx_generator *g, bool cached, const float **out, int64_t *rows)
{
    if (g->n_tokens == 0) return rlx_set_error(RLX_ERR_STATE, "no context: call prefill first");
    if (!cached) {
        g->logits_valid = false; /* these are not the cached path's logits */
        return run_positions(g, KIND_FULL, NULL, 0, g->n_tokens, out, rows);
    }
    int64_t from = rlx_kv_cache_len(g->kv);
    if (from == g->n_tokens && g->logits_valid) {
        *out = g->logits;
        *rows = 1;
        return RLX_OK;
    }
    if (from == g->n_tokens) from--; /* recompute the last position to get its output */
    g->logits_valid = false;
    RLX_TRY(run_positions(g, from ? KIND_EXTEND : KIND_SEED, NULL, from, g->n_tokens - from, out, rows));
    g->logits_valid = (g->ends & RLX_BLOCK_HEAD) != 0;
    return RLX_OK;
}

static rlx_status need_full_model(const struct rlx_generator *g)
{
    if ((g->ends & (RLX_BLOCK_EMBED | RLX_BLOCK_HEAD)) != (RLX_BLOCK_EMBED | RLX_BLOCK_HEAD))
        return rlx_set_error(RLX_ERR_STATE, "this generator runs a block without %s: use rlx_generator_forward",
                             (g->ends & RLX_BLOCK_EMBED) ? "the LM head" : "the embedding");
    return RLX_OK;
}

rlx_status rlx_generator_logits_naive(struct rlx_generator *g, const float **logits)
{
    int64_t rows;
    RLX_TRY(need_full_model(g));
    return forward_history(g, false, logits, &rows);
}

rlx_status rlx_generator_logits_cached(struct rlx_generator *g, const float **logits)
{
    int64_t rows;
    RLX_TRY(need_full_model(g));
    return forward_history(g, true, logits, &rows);
}

rlx_status rlx_generator_forward(struct rlx_generator *g, const float *hidden, int64_t n, bool cached,
                                 const float **out, int64_t *rows)
{
    if (g->ends & RLX_BLOCK_EMBED) {
        if (hidden) return rlx_set_error(RLX_ERR_INVALID, "an embedding block takes its input from the history");
        return forward_history(g, cached, out, rows);
    }
    if (!hidden || n < 1) return rlx_set_error(RLX_ERR_INVALID, "forward: no hidden rows given");
    int64_t from = cached ? rlx_kv_cache_len(g->kv) : 0;
    if (from + n > g->cfg.max_position_embeddings)
        return rlx_set_error(RLX_ERR_RANGE, "forward: %lld positions exceed max_position_embeddings %lld",
                             (long long)(from + n), (long long)g->cfg.max_position_embeddings);
    RLX_TRY(run_positions(g, cached ? (from ? KIND_EXTEND : KIND_SEED) : KIND_FULL, hidden, from, n, out, rows));
    g->n_tokens = cached ? from + n : n;
    return RLX_OK;
}

rlx_status rlx_generator_sample(struct rlx_generator *g, const float *logits, const struct rlx_sample_opts *o,
                                uint64_t index, int32_t *token)
{
    bool has_history = g->ends & RLX_BLOCK_EMBED; /* other blocks count positions, not tokens */
    return rlx_generator_sample_with(g, logits, o, index, g->tokens, has_history ? g->n_tokens : 0, token);
}

rlx_status rlx_generator_sample_with(struct rlx_generator *g, const float *logits, const struct rlx_sample_opts *o,
                                     uint64_t index, const int32_t *history, int64_t n_hist, int32_t *token)
{
    return rlx_sample(logits, g->cfg.vocab_size, o, history, n_hist, index, g->sample_scratch, g->sample_idx, token);
}

void rlx_generator_stats(const struct rlx_generator *g, struct rlx_generator_stats *out)
{
    *out = g->stats;
    out->plans_cached = g->n_slots;
    out->planned_bytes = 0;
    for (int i = 0; i < g->n_slots; i++) out->planned_bytes += rlx_plan_planned_bytes(g->slots[i].plan);
}

void rlx_generator_release_decode_plans(struct rlx_generator *g)
{
    for (int i = g->n_slots - 1; i >= 0; i--)
        if (g->slots[i].kind == KIND_EXTEND) {
            slot_clear(&g->slots[i]);
            g->slots[i] = g->slots[--g->n_slots];
        }
}

void rlx_generator_release_plans(struct rlx_generator *g)
{
    for (int i = 0; i < g->n_slots; i++) slot_clear(&g->slots[i]);
    g->n_slots = 0;
}

rlx_status rlx_generator_set_profiling(struct rlx_generator *g, bool on)
{
    for (int i = 0; i < g->n_slots; i++) RLX_TRY(rlx_plan_set_profiling(g->slots[i].plan, on));
    g->profiling = on;
    g->profile_valid = false;
    return RLX_OK;
}

rlx_status rlx_generator_last_profile(const struct rlx_generator *g, double *seconds_by_op)
{
    if (!g->profile_valid)
        return rlx_set_error(RLX_ERR_STATE, g->profiling ? "no forward pass has run since profiling was turned on"
                                                         : "profiling is off: turn it on first");
    memcpy(seconds_by_op, g->profile, sizeof g->profile);
    return RLX_OK;
}
