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
#include "ir/graph.h"
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

/* Frees slot i (the last one takes its place) and the shared arena, which may have been sized for
 * it: the next run allocates what it needs. Lock held, no run in flight. */
static void drop_slot(struct rlx_model *m, int i)
{
    slot_clear(&m->slots[i]);
    m->slots[i] = m->slots[--m->n_slots];
    rlx_shared_arena_release(m->dev, &m->arena);
}

static void release_plans_locked(struct rlx_model *m)
{
    while (m->n_slots) drop_slot(m, m->n_slots - 1);
}

/* RLX_ERR_UNSUPPORTED, before any weight is stored, when the device has no kernel for an op of the
 * block (a mixture-of-experts layer's TOPK / MATMUL_ID / MOE_COMBINE on a backend without them), naming
 * the op: a clear refusal at load instead of a failed compile at the first token. */
static rlx_status check_device_runs(const struct rlx_model_config *cfg, const struct rlx_device *dev,
                                    int64_t layer_begin, int64_t layer_end, unsigned ends)
{
    struct rlx_block_spec spec = {.layer_begin = layer_begin,
                                  .layer_end = layer_end,
                                  .flags = ends,
                                  .seq = rlx_dim_const(1),
                                  .kv_rows = rlx_dim_const(1),
                                  .kv_dtype = RLX_F32};
    struct rlx_graph *g;
    RLX_TRY(rlx_decoder_build(cfg, &spec, NULL, &g, NULL));
    rlx_status s = RLX_OK;
    for (int id = 0; id < g->n_nodes && s == RLX_OK; id++) {
        const enum rlx_op op = g->nodes[id].op;
        if (dev->be->supports_op(dev->ctx, g, id)) continue;
        const bool moe = op == RLX_OP_TOPK || op == RLX_OP_MATMUL_ID || op == RLX_OP_MOE_COMBINE;
        s = rlx_set_error(RLX_ERR_UNSUPPORTED, "device '%s' cannot run this model: it has no kernel for op %s%s",
                          dev->name, rlx_op_name(op),
                          moe ? " (the mixture-of-experts layers of Qwen3-MoE are not implemented on this device)"
                              : "");
    }
    rlx_graph_free(g);
    return s;
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
    RLX_TRY(check_device_runs(cfg, dev, layer_begin, layer_end, ends));
    struct rlx_model *m = rlx_calloc(1, sizeof *m);
    if (!m) return RLX_ERR_NOMEM;
    m->cfg = *cfg;
    m->dev = dev;
    m->layer_begin = layer_begin;
    m->layer_end = layer_end;
    m->ends = ends;
    m->prefill_capacity = 1;
    m->max_past = cfg->max_position_embeddings;
    m->prefill_chunk = RLX_PREFILL_CHUNK_DEFAULT;
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
    free(m->batch_ids);
    free(m->batch_logits);
    rlx_weights_free(m->weights);
    rlx_decoder_params_free(m->params);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* "(2, 3, 4)" into buf */
static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (len < cap) snprintf(buf + len, cap - len, ")");
}

/* The block's param `name`, or RLX_ERR_INVALID naming it. */
static rlx_status find_param(const struct rlx_model *m, const char *name, const struct rlx_param_info **out)
{
    for (int i = 0; name && i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) {
            *out = &m->params[i];
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_INVALID, "weight '%s' is not read by this model's block", name ? name : "(null)");
}

/* t against param pi, whose shape from dim `skip` on it must have (a part of stacked experts: 1) */
static rlx_status check_tensor(const struct rlx_param_info *pi, const char *what, const struct rlx_host_tensor *t,
                               int skip)
{
    bool ok = t->ndim == pi->ndim - skip;
    for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == pi->shape[d + skip];
    if (!ok) {
        char have[96], want[96];
        shape_text(have, sizeof have, t->ndim, t->shape);
        shape_text(want, sizeof want, pi->ndim - skip, pi->shape + skip);
        return rlx_set_error(RLX_ERR_SHAPE, "%s has shape %s, expected %s", what, have, want);
    }
    const struct rlx_dtype_traits *tr = rlx_dtype_traits(t->dtype);
    const bool matrix = pi->kind == RLX_PARAM_MATRIX || pi->kind == RLX_PARAM_EXPERTS;
    if (matrix ? !(tr && tr->is_float) : t->dtype != RLX_F32)
        return rlx_set_error(RLX_ERR_DTYPE, "%s is %s; %s", what, rlx_dtype_name(t->dtype),
                             matrix ? "a matrix takes a real-valued dtype (f32, f16, bf16, q8_0)"
                                    : "norms, biases and rope.inv_freq are f32");
    return RLX_OK;
}

static rlx_status check_weight(const struct rlx_model *m, const char *name, const struct rlx_host_tensor *t)
{
    const struct rlx_param_info *pi;
    RLX_TRY(find_param(m, name, &pi));
    char what[RLX_NAME_MAX + 16];
    snprintf(what, sizeof what, "weight '%s'", name);
    return check_tensor(pi, what, t, 0);
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

rlx_status rlx_model_set_weight_parts(struct rlx_model *m, const char *name, int64_t n,
                                      const struct rlx_host_tensor *parts)
{
    const struct rlx_param_info *pi;
    RLX_TRY(find_param(m, name, &pi));
    if (pi->kind != RLX_PARAM_EXPERTS)
        return rlx_set_error(RLX_ERR_INVALID, "weight '%s' is not stacked experts: it takes one tensor", name);
    if (!parts || n != pi->shape[0])
        return rlx_set_error(RLX_ERR_SHAPE, "weight '%s' takes %lld parts (one per expert), got %lld", name,
                             (long long)pi->shape[0], (long long)n);
    for (int64_t e = 0; e < n; e++) {
        char part[RLX_NAME_MAX + 16], quoted[sizeof part + 16];
        snprintf(part, sizeof part, pi->part_fmt, (int)e);
        snprintf(quoted, sizeof quoted, "weight '%s'", part);
        RLX_TRY(check_tensor(pi, quoted, &parts[e], 1));
        if (parts[e].dtype != parts[0].dtype)
            return rlx_set_error(RLX_ERR_DTYPE, "%s is %s, expert 0 is %s: the experts of a projection share a dtype",
                                 quoted, rlx_dtype_name(parts[e].dtype), rlx_dtype_name(parts[0].dtype));
    }
    rlx_model_lock(m);
    release_plans_locked(m);
    rlx_status s = rlx_weights_set_parts(m->weights, name, n, parts);
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

rlx_status rlx_model_set_prefill_chunk(struct rlx_model *m, int64_t chunk)
{
    if (chunk < 0)
        return rlx_set_error(RLX_ERR_INVALID, "prefill chunk %lld: must be >= 0 (0: whole)", (long long)chunk);
    rlx_model_lock(m);
    m->prefill_chunk = chunk;
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

static_assert(RLX_MAX_BATCH <= RLX_INVARIANT_ROWS, "a decode step's products are kept row by row");

void rlx_model_set_batch_invariant(struct rlx_model *m, bool on)
{
    rlx_model_lock(m);
    if (m->batch_invariant != on) release_plans_locked(m);
    m->batch_invariant = on;
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
    out->planned_bytes = m->arena.cap;
    rlx_model_unlock(m);
}

void rlx_model_release_decode_plans(struct rlx_model *m)
{
    rlx_model_lock(m);
    for (int i = m->n_slots - 1; i >= 0; i--)
        if (m->slots[i].kind == KIND_DECODE || m->slots[i].kind == KIND_BATCH) drop_slot(m, i);
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
            return rlx_set_error(RLX_ERR_RANGE,
                                 "%lld cached positions after this step exceed max_past %lld of the "
                                 "bucketed decode cache; this utterance cannot grow further under it (use a larger "
                                 "max_past)",
                                 (long long)(past + n), (long long)m->max_past);
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
    const bool batch = kind == KIND_BATCH, prefill = kind == KIND_FULL || kind == KIND_PREFILL;
    const enum rlx_plan_policy pol = batch ? RLX_POLICY_LRU : policy_of(m, kind);
    if (pol == RLX_POLICY_BUCKETED || pol == RLX_POLICY_DYNAMIC) return;
    for (;;) {
        int count = 0, victim = -1;
        for (int i = 0; i < m->n_slots; i++) {
            const enum plan_kind k = m->slots[i].kind;
            const bool same = batch                   ? k == KIND_BATCH
                              : pol == RLX_POLICY_LRU ? (k == KIND_FULL || k == KIND_PREFILL) == prefill
                                                      : k == kind;
            if (!same) continue;
            count++;
            if (victim < 0 || m->slots[i].last_used < m->slots[victim].last_used) victim = i;
        }
        if (count < (batch ? BATCH_PLANS : pol == RLX_POLICY_LRU ? m->prefill_capacity : 1)) return;
        drop_slot(m, victim);
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
    const int B = s->batch ? s->batch : 1;
    s->k_state = rlx_calloc((size_t)(B * (L ? L : 1)), sizeof(int));
    s->v_state = rlx_calloc((size_t)(B * (L ? L : 1)), sizeof(int));
    if (!s->k_state || !s->v_state) return RLX_ERR_NOMEM;
    for (int b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++) {
            RLX_TRY(rlx_plan_state_of_node(p, io->k_cache[b][l], &s->k_state[b * L + l]));
            RLX_TRY(rlx_plan_state_of_node(p, io->v_cache[b][l], &s->v_state[b * L + l]));
        }
    memcpy(s->past_sym, io->past_sym, sizeof s->past_sym);
    return RLX_OK;
}

/* Compiles spec's block into a new slot of `kind` (its key fields set by the caller after). */
static rlx_status compile_slot(struct rlx_model *m, enum plan_kind kind, const struct rlx_block_spec *spec,
                               struct plan_slot **out)
{
    evict_for(m, kind);
    RLX_TRY(rlx_grow(&m->slots, &m->cap_slots, m->n_slots + 1));
    struct plan_slot *s = &m->slots[m->n_slots];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->batch = spec->batch;
    const double t0 = now_seconds();
    struct rlx_graph *graph;
    struct rlx_block_io io;
    RLX_TRY(rlx_decoder_build(&m->cfg, spec, m->weights, &graph, &io));
    struct rlx_compile_opts opts = rlx_compile_opts_default();
    opts.memory_budget = m->memory_budget;
    opts.budget_hint = m->budget_hint;
    opts.batch_invariant = m->batch_invariant;
    if (!rlx_dim_is_const(&spec->seq) && m->seq_cap)
        opts.sym_cap[RLX_SYM_SEQ] = opts.sym_cap[RLX_SYM_PAST] = m->seq_cap;
    rlx_status st = rlx_compile(graph, m->dev, &opts, &s->plan);
    rlx_graph_free(graph);
    if (st == RLX_OK) rlx_plan_share_arena(s->plan, &m->arena);
    if (st == RLX_OK) st = rlx_plan_bind_weights(s->plan, m->weights);
    if (st == RLX_OK) st = index_slot(m, s, &io);
    if (st == RLX_OK && m->profiling) st = rlx_plan_set_profiling(s->plan, true);
    if (st != RLX_OK) {
        slot_clear(s);
        return st;
    }
    s->kv_dtype = spec->kv_dtype;
    s->last_used = ++m->clock;
    m->n_slots++;
    m->stats.compile_seconds += now_seconds() - t0;
    if (kind == KIND_DECODE || kind == KIND_BATCH)
        m->stats.decode_compiles++;
    else
        m->stats.prefill_compiles++;
    *out = s;
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
    struct plan_slot *s;
    RLX_TRY(compile_slot(m, kind, &spec, &s));
    s->seq = kseq;
    s->rows = krows;
    s->masked = masked;
    *out = s;
    return RLX_OK;
}

rlx_status rlx_model_batch_plan(struct rlx_model *m, int batch, const int64_t *segs, enum rlx_dtype kv_dtype,
                                struct plan_slot **out)
{
    for (int i = 0; i < m->n_slots; i++) {
        struct plan_slot *s = &m->slots[i];
        if (s->kind == KIND_BATCH && s->batch == batch && s->kv_dtype == kv_dtype &&
            memcmp(s->segs, segs, sizeof *segs * (size_t)batch) == 0) {
            s->last_used = ++m->clock;
            m->stats.plan_hits++;
            *out = s;
            return RLX_OK;
        }
    }
    struct rlx_block_spec spec = {
        .layer_begin = m->layer_begin,
        .layer_end = m->layer_end,
        .flags = m->ends | RLX_BLOCK_CACHE,
        .kv_dtype = kv_dtype,
        .batch = batch,
    };
    int64_t sum = 0;
    for (int b = 0; b < batch; b++) sum += spec.batch_seq[b] = segs[b];
    spec.seq = spec.kv_rows = rlx_dim_const(sum);
    struct plan_slot *s;
    RLX_TRY(compile_slot(m, KIND_BATCH, &spec, &s));
    memcpy(s->segs, segs, sizeof *segs * (size_t)batch);
    s->seq = sum;
    s->rows = -1;
    *out = s;
    return RLX_OK;
}
