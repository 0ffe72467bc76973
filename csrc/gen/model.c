/*
 * model.c - the model: a config, a weight store on a device, and the plans compiled for it, which
 * every sequence of the model shares (model.h). Weights are checked against the block's param list
 * (rlx_decoder_params: name, shape, dtype rule) as they are stored, and placed once. Plans are kept
 * in one list keyed by (kind, SEQ, cache rows, KV dtype) under the policies of model.h: ONESHOT
 * keeps one per kind, LRU the most recently used prefill plans, BUCKETED one decode plan per
 * power-of-two number of cache rows (the rows past the sequence hidden by masks), DYNAMIC one
 * symbolic plan per kind. Weights are bound into each plan by reference (rlx_plan_bind_weights):
 * N plans cost one copy of the weights. The plan list and every run are guarded by the model's
 * mutex, so sequences on several threads take turns. Never prints.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "gen/gen.h"
#include "runtime/plan.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rlx_model_lock(struct rlx_model *m) { pthread_mutex_lock(&m->lock); }
void rlx_model_unlock(struct rlx_model *m) { pthread_mutex_unlock(&m->lock); }

static void slot_clear(struct plan_slot *s)
{
    rlx_plan_free(s->plan);
    free(s->k_state);
    free(s->v_state);
    memset(s, 0, sizeof *s);
}

static void release_plans_locked(struct rlx_model *m)
{
    for (int i = 0; i < m->n_slots; i++) slot_clear(&m->slots[i]);
    m->n_slots = 0;
}

rlx_status rlx_model_create(const struct rlx_model_config *cfg, struct rlx_device *dev, int64_t layer_begin,
                            int64_t layer_end, unsigned ends, struct rlx_model **out)
{
    RLX_TRY(rlx_model_config_check(cfg));
    if (!dev) return rlx_set_error(RLX_ERR_INVALID, "model: no device");
    if (layer_begin < 0 || layer_end > cfg->n_layers || layer_begin > layer_end)
        return rlx_set_error(RLX_ERR_INVALID, "model block: layers [%lld, %lld) outside [0, %lld)",
                             (long long)layer_begin, (long long)layer_end, (long long)cfg->n_layers);
    if (ends & ~(unsigned)(RLX_BLOCK_EMBED | RLX_BLOCK_HEAD))
        return rlx_set_error(RLX_ERR_INVALID, "model block: ends may only be RLX_BLOCK_EMBED | RLX_BLOCK_HEAD");
    struct rlx_model *m = rlx_calloc(1, sizeof *m);
    if (!m) return RLX_ERR_NOMEM;
    m->cfg = *cfg;
    m->dev = dev;
    m->layer_begin = layer_begin;
    m->layer_end = layer_end;
    m->ends = ends;
    m->prefill_capacity = 1;
    m->max_past = cfg->max_position_embeddings;
    rlx_status s = rlx_decoder_params(cfg, layer_begin, layer_end, ends, &m->params, &m->n_params);
    if (s == RLX_OK) s = rlx_weights_create(dev, &m->weights);
    if (s == RLX_OK && pthread_mutex_init(&m->lock, NULL) != 0) s = rlx_set_error(RLX_ERR_NOMEM, "model: no mutex");
    if (s != RLX_OK) {
        rlx_weights_free(m->weights);
        rlx_decoder_params_free(m->params);
        free(m);
        return s;
    }
    *out = m;
    return RLX_OK;
}

void rlx_model_free(struct rlx_model *m)
{
    if (!m) return;
    assert(atomic_load(&m->n_seqs) == 0 && "a model freed before its sequences");
    release_plans_locked(m);
    free(m->slots);
    rlx_weights_free(m->weights);
    rlx_decoder_params_free(m->params);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static rlx_status check_weight(const struct rlx_model *m, const char *name, const struct rlx_host_tensor *t)
{
    const struct rlx_param_info *pi = NULL;
    for (int i = 0; name && i < m->n_params && !pi; i++)
        if (strcmp(m->params[i].name, name) == 0) pi = &m->params[i];
    if (!pi) return rlx_set_error(RLX_ERR_INVALID, "weight '%s' is not read by this model's block", name ? name : "(null)");
    bool ok = t->ndim == pi->ndim;
    for (int d = 0; ok && d < pi->ndim; d++) ok = t->shape[d] == pi->shape[d];
    if (!ok)
        return rlx_set_error(RLX_ERR_SHAPE, "weight '%s' has shape (%lld%s%lld), expected (%lld%s%lld)", name,
                             (long long)(t->ndim > 0 ? t->shape[0] : 0), t->ndim > 1 ? ", " : "",
                             (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)pi->shape[0],
                             pi->ndim > 1 ? ", " : "", (long long)(pi->ndim > 1 ? pi->shape[1] : 0));
    const struct rlx_dtype_traits *tr = rlx_dtype_traits(t->dtype);
    if (pi->kind == RLX_PARAM_MATRIX ? !(tr && tr->is_float) : t->dtype != RLX_F32)
        return rlx_set_error(RLX_ERR_DTYPE, "weight '%s' is %s; %s", name, rlx_dtype_name(t->dtype),
                             pi->kind == RLX_PARAM_MATRIX ? "a matrix takes a real-valued dtype (f32, f16, bf16, q8_0)"
                                                          : "norms, biases and rope.inv_freq are f32");
    return RLX_OK;
}

rlx_status rlx_model_set_weight(struct rlx_model *m, const char *name, const struct rlx_host_tensor *t)
{
    if (!t) return rlx_set_error(RLX_ERR_INVALID, "weight '%s': no tensor", name ? name : "(null)");
    RLX_TRY(check_weight(m, name, t));
    rlx_model_lock(m);
    release_plans_locked(m); /* plans point at the weight being replaced */
    rlx_status s = rlx_weights_set(m->weights, name, t);
    rlx_model_unlock(m);
    return s;
}

rlx_status rlx_model_set_policy(struct rlx_model *m, enum rlx_plan_policy prefill, int64_t prefill_capacity,
                                enum rlx_plan_policy decode, int64_t max_past)
{
    if (prefill != RLX_POLICY_ONESHOT && prefill != RLX_POLICY_LRU && prefill != RLX_POLICY_DYNAMIC)
        return rlx_set_error(RLX_ERR_INVALID, "prefill plans take the oneshot, lru or dynamic policy");
    if (decode != RLX_POLICY_ONESHOT && decode != RLX_POLICY_BUCKETED && decode != RLX_POLICY_DYNAMIC)
        return rlx_set_error(RLX_ERR_INVALID, "decode plans take the oneshot, bucketed or dynamic policy");
    if (prefill_capacity < 1 || max_past < 1)
        return rlx_set_error(RLX_ERR_INVALID, "plan cache capacity and max_past must be >= 1");
    rlx_model_lock(m);
    m->prefill_policy = prefill;
    m->decode_policy = decode;
    m->prefill_capacity = prefill == RLX_POLICY_LRU ? prefill_capacity : 1;
    m->max_past = max_past < m->cfg.max_position_embeddings ? max_past : m->cfg.max_position_embeddings;
    release_plans_locked(m);
    rlx_model_unlock(m);
    return RLX_OK;
}

rlx_status rlx_model_set_seq_cap(struct rlx_model *m, int64_t cap)
{
    if (cap < 0 || cap > m->cfg.max_position_embeddings)
        return rlx_set_error(RLX_ERR_INVALID, "compile seq cap %lld outside [1, max_position_embeddings %lld]",
                             (long long)cap, (long long)m->cfg.max_position_embeddings);
    rlx_model_lock(m);
    m->seq_cap = cap;
    release_plans_locked(m);
    rlx_model_unlock(m);
    return RLX_OK;
}

void rlx_model_set_memory_budget(struct rlx_model *m, size_t bytes, const char *hint)
{
    rlx_model_lock(m);
    m->memory_budget = bytes;
    snprintf(m->budget_hint, sizeof m->budget_hint, "%s", hint ? hint : "");
    release_plans_locked(m);
    rlx_model_unlock(m);
}

rlx_status rlx_model_set_profiling(struct rlx_model *m, bool on)
{
    rlx_status s = RLX_OK;
    rlx_model_lock(m);
    for (int i = 0; i < m->n_slots && s == RLX_OK; i++) s = rlx_plan_set_profiling(m->slots[i].plan, on);
    if (s == RLX_OK) m->profiling = on;
    rlx_model_unlock(m);
    return s;
}

const struct rlx_model_config *rlx_model_config(const struct rlx_model *m) { return &m->cfg; }
struct rlx_device *rlx_model_device(const struct rlx_model *m) { return m->dev; }

void rlx_model_block(const struct rlx_model *m, int64_t *begin, int64_t *end, unsigned *ends)
{
    *begin = m->layer_begin;
    *end = m->layer_end;
    *ends = m->ends;
}

void rlx_model_weights(const struct rlx_model *m, int *count, size_t *bytes)
{
    *count = rlx_weights_count(m->weights);
    *bytes = rlx_weights_bytes(m->weights);
}

rlx_status rlx_model_add_source(struct rlx_model *m, const char *path, uint64_t dev, uint64_t ino, int64_t size,
                                int64_t mtime_ns)
{
    rlx_model_lock(m);
    rlx_status s = rlx_weights_add_source(m->weights, path, dev, ino, size, mtime_ns);
    rlx_model_unlock(m);
    return s;
}

void rlx_model_stats(struct rlx_model *m, struct rlx_model_stats *out)
{
    rlx_model_lock(m);
    *out = m->stats;
    out->plans_cached = m->n_slots;
    out->planned_bytes = 0;
    for (int i = 0; i < m->n_slots; i++) out->planned_bytes += rlx_plan_planned_bytes(m->slots[i].plan);
    rlx_model_unlock(m);
}

void rlx_model_release_decode_plans(struct rlx_model *m)
{
    rlx_model_lock(m);
    for (int i = m->n_slots - 1; i >= 0; i--)
        if (m->slots[i].kind == KIND_DECODE) {
            slot_clear(&m->slots[i]);
            m->slots[i] = m->slots[--m->n_slots];
        }
    rlx_model_unlock(m);
}

void rlx_model_release_plans(struct rlx_model *m)
{
    rlx_model_lock(m);
    release_plans_locked(m);
    rlx_model_unlock(m);
}

/* ---- plans -------------------------------------------------------------------------------- */

static int64_t pow2_ceil(int64_t v)
{
    int64_t r = 1;
    while (r < v) r *= 2;
    return r;
}

static enum rlx_plan_policy policy_of(const struct rlx_model *m, enum plan_kind kind)
{
    return kind == KIND_DECODE ? m->decode_policy : m->prefill_policy;
}

/* The key a request for n positions after `past` maps to under the policies. */
static rlx_status plan_key(const struct rlx_model *m, enum plan_kind kind, int64_t n, int64_t past, int64_t *kseq,
                           int64_t *krows, bool *masked)
{
    const enum rlx_plan_policy pol = policy_of(m, kind);
    *masked = false;
    *kseq = n;
    *krows = kind == KIND_FULL ? 0 : past + n;
    if (pol == RLX_POLICY_DYNAMIC) {
        *kseq = *krows = -1;
    } else if (pol == RLX_POLICY_BUCKETED) {
        if (past + n > m->max_past)
            return rlx_set_error(RLX_ERR_RANGE, "%lld cached positions after this step exceed max_past %lld of the "
                                 "bucketed decode cache; this utterance cannot grow further under it (use a larger "
                                 "max_past)", (long long)(past + n), (long long)m->max_past);
        *krows = pow2_ceil(past + n);
        if (*krows > m->max_past) *krows = m->max_past;
        *masked = true;
    }
    return RLX_OK;
}

/* Makes room for one more plan of `kind`: ONESHOT keeps one per kind, LRU `capacity` prefill
 * plans (FULL and PREFILL together); BUCKETED and DYNAMIC keep theirs (one per bucket / one in
 * all). */
static void evict_for(struct rlx_model *m, enum plan_kind kind)
{
    const bool prefill = kind != KIND_DECODE;
    const enum rlx_plan_policy pol = policy_of(m, kind);
    if (pol == RLX_POLICY_BUCKETED || pol == RLX_POLICY_DYNAMIC) return;
    for (;;) {
        int count = 0, victim = -1;
        for (int i = 0; i < m->n_slots; i++) {
            const bool same = pol == RLX_POLICY_LRU ? (m->slots[i].kind != KIND_DECODE) == prefill : m->slots[i].kind == kind;
            if (!same) continue;
            count++;
            if (victim < 0 || m->slots[i].last_used < m->slots[victim].last_used) victim = i;
        }
        if (count < (pol == RLX_POLICY_LRU ? m->prefill_capacity : 1)) return;
        slot_clear(&m->slots[victim]);
        m->slots[victim] = m->slots[--m->n_slots];
    }
}

/* The plan indices of the built block's interface. */
static rlx_status index_slot(const struct rlx_model *m, struct plan_slot *s, const struct rlx_block_io *io)
{
    struct rlx_plan *p = s->plan;
    RLX_TRY(rlx_plan_input_of_node(p, io->x, &s->in_x));
    RLX_TRY(rlx_plan_input_of_node(p, io->pos, &s->in_pos));
    s->out_y = io->y;
    s->n_masks = io->n_masks;
    for (int k = 0; k < io->n_masks; k++) {
        RLX_TRY(rlx_plan_input_of_node(p, io->mask[k], &s->mask_in[k]));
        s->mask_w[k] = io->mask_window[k];
    }
    if (s->kind == KIND_FULL) return RLX_OK;
    const int64_t L = m->layer_end - m->layer_begin;
    s->k_state = rlx_calloc((size_t)(L ? L : 1), sizeof(int));
    s->v_state = rlx_calloc((size_t)(L ? L : 1), sizeof(int));
    if (!s->k_state || !s->v_state) return RLX_ERR_NOMEM;
    for (int64_t l = 0; l < L; l++) {
        RLX_TRY(rlx_plan_state_of_node(p, io->k_cache[l], &s->k_state[l]));
        RLX_TRY(rlx_plan_state_of_node(p, io->v_cache[l], &s->v_state[l]));
    }
    return RLX_OK;
}

rlx_status rlx_model_plan(struct rlx_model *m, enum plan_kind kind, int64_t n, int64_t past, enum rlx_dtype kv_dtype,
                          struct plan_slot **out)
{
    int64_t kseq, krows;
    bool masked;
    RLX_TRY(plan_key(m, kind, n, past, &kseq, &krows, &masked));
    for (int i = 0; i < m->n_slots; i++) {
        struct plan_slot *s = &m->slots[i];
        if (s->kind == kind && s->seq == kseq && s->rows == krows && s->kv_dtype == kv_dtype) {
            s->last_used = ++m->clock;
            m->stats.plan_hits++;
            *out = s;
            return RLX_OK;
        }
    }
    evict_for(m, kind);
    RLX_TRY(rlx_grow(&m->slots, &m->cap_slots, m->n_slots + 1));
    struct plan_slot *s = &m->slots[m->n_slots];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    const double t0 = now_seconds();
    const bool dynamic = kseq < 0;
    const struct rlx_dim seq = dynamic ? rlx_dim_sym(RLX_SYM_SEQ) : rlx_dim_const(kseq);
    const struct rlx_dim sym_past = rlx_dim_sym(RLX_SYM_PAST);
    struct rlx_block_spec spec = {
        .layer_begin = m->layer_begin,
        .layer_end = m->layer_end,
        .flags = m->ends | (kind != KIND_FULL ? RLX_BLOCK_CACHE : 0u) | (masked ? RLX_BLOCK_MASK : 0u),
        .seq = seq,
        .kv_rows = dynamic ? rlx_dim_add(&sym_past, &seq) : rlx_dim_const(krows > 0 ? krows : 1),
        .kv_dtype = kv_dtype,
    };
    struct rlx_graph *graph;
    struct rlx_block_io io;
    RLX_TRY(rlx_decoder_build(&m->cfg, &spec, m->weights, &graph, &io));
    struct rlx_compile_opts opts = rlx_compile_opts_default();
    opts.memory_budget = m->memory_budget;
    opts.budget_hint = m->budget_hint;
    if (dynamic && m->seq_cap) opts.sym_cap[RLX_SYM_SEQ] = opts.sym_cap[RLX_SYM_PAST] = m->seq_cap;
    rlx_status st = rlx_compile(graph, m->dev, &opts, &s->plan);
    rlx_graph_free(graph);
    if (st == RLX_OK) st = rlx_plan_bind_weights(s->plan, m->weights);
    if (st == RLX_OK) st = index_slot(m, s, &io);
    if (st == RLX_OK && m->profiling) st = rlx_plan_set_profiling(s->plan, true);
    if (st != RLX_OK) {
        slot_clear(s);
        return st;
    }
    s->seq = kseq;
    s->rows = krows;
    s->kv_dtype = kv_dtype;
    s->masked = masked;
    s->last_used = ++m->clock;
    m->n_slots++;
    m->stats.compile_seconds += now_seconds() - t0;
    if (kind == KIND_DECODE) m->stats.decode_compiles++;
    else m->stats.prefill_compiles++;
    *out = s;
    return RLX_OK;
}
