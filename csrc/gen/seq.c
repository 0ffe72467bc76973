/*
 * seq.c - sequences: a token history and a KV cache of their own over a model's shared weights and
 * plans (model.h). Cached logits always mean "bring the cache up to the whole history, return the
 * last logits", so prefill, decode, appending several tokens (a chat's next turn) and mixed naive /
 * cached use share one path: the plan for the uncached positions runs with the cache bound as its
 * state, writes their K/V rows in place and attends over the cache, so a step moves its inputs
 * (token ids, positions, and for bucketed plans the masks) and its output, never the past.
 * Every failing call leaves the history and the cache length as they were. Never prints.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "gen/gen.h"
#include "runtime/plan.h"

struct rlx_seq {
    struct rlx_model *m;     /* borrowed; outlives the sequence */
    struct rlx_kv_cache *kv; /* (layers of the block, positions, n_kv_heads * head_dim) of kv dtype */
    int32_t *tokens;         /* (cap_tokens) history */
    int32_t *pos;            /* (cap_tokens) scratch: absolute positions of a run */
    int64_t n_tokens, cap_tokens;
    float *logits;     /* (vocab) of the position after the cached history */
    bool logits_valid; /* logits belong to the current history (cache == history) */
    float *hidden;     /* (hidden_rows, hidden_size) output of a block without a head */
    int64_t hidden_rows;
    float *sample_scratch; /* (rlx_sample_scratch_floats(vocab)) */
    int32_t *sample_idx;   /* (vocab) */
    float *mask;           /* (mask_floats) scratch for bucketed masks, grown on demand */
    size_t mask_floats;
    double profile[RLX_OP_COUNT]; /* seconds per op of the last run, when the model profiles */
    bool profile_valid;
};

rlx_status rlx_seq_create(struct rlx_model *m, enum rlx_dtype kv_dtype, struct rlx_seq **out)
{
    const struct rlx_model_config *c = &m->cfg;
    const int64_t L = m->layer_end - m->layer_begin;
    struct rlx_seq *s = rlx_calloc(1, sizeof *s);
    if (!s) return RLX_ERR_NOMEM;
    s->m = m;
    s->logits = rlx_calloc((size_t)c->vocab_size, sizeof *s->logits);
    s->sample_scratch = rlx_calloc(rlx_sample_scratch_floats(c->vocab_size), sizeof *s->sample_scratch);
    s->sample_idx = rlx_calloc((size_t)c->vocab_size, sizeof *s->sample_idx);
    rlx_status st = (s->logits && s->sample_scratch && s->sample_idx) ? RLX_OK : RLX_ERR_NOMEM;
    if (st == RLX_OK)
        st = rlx_kv_cache_create(m->dev, L > 0 ? L : 1, c->n_kv_heads * c->head_dim, c->max_position_embeddings,
                                 kv_dtype, &s->kv);
    if (st != RLX_OK) {
        free(s->logits);
        free(s->sample_scratch);
        free(s->sample_idx);
        free(s);
        return st;
    }
    atomic_fetch_add(&m->n_seqs, 1);
    *out = s;
    return RLX_OK;
}

void rlx_seq_free(struct rlx_seq *s)
{
    if (!s) return;
    rlx_kv_cache_free(s->kv);
    free(s->tokens);
    free(s->pos);
    free(s->logits);
    free(s->hidden);
    free(s->sample_scratch);
    free(s->sample_idx);
    free(s->mask);
    atomic_fetch_sub(&s->m->n_seqs, 1);
    free(s);
}

struct rlx_model *rlx_seq_model(const struct rlx_seq *s) { return s->m; }

/* Room for n tokens (and n positions of scratch). */
static rlx_status need_tokens(struct rlx_seq *s, int64_t n)
{
    if (n <= s->cap_tokens) return RLX_OK;
    int64_t cap = s->cap_tokens * 2 > 64 ? s->cap_tokens * 2 : 64;
    cap = cap < n ? n : cap;
    int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
    if (!t) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for a history of %lld tokens", (long long)cap);
    s->tokens = t;
    int32_t *p = realloc(s->pos, (size_t)cap * sizeof *p);
    if (!p) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for a history of %lld tokens", (long long)cap);
    s->pos = p;
    s->cap_tokens = cap;
    return RLX_OK;
}

rlx_status rlx_seq_fork(const struct rlx_seq *src, struct rlx_seq **out)
{
    struct rlx_seq *s;
    RLX_TRY(rlx_seq_create(src->m, rlx_kv_cache_dtype(src->kv), &s));
    rlx_status st = need_tokens(s, src->n_tokens);
    if (st == RLX_OK) st = rlx_kv_cache_copy(s->kv, src->kv);
    if (st != RLX_OK) {
        rlx_seq_free(s);
        return st;
    }
    if (src->n_tokens) memcpy(s->tokens, src->tokens, (size_t)src->n_tokens * sizeof *s->tokens);
    s->n_tokens = src->n_tokens;
    memcpy(s->logits, src->logits, (size_t)src->m->cfg.vocab_size * sizeof *s->logits);
    s->logits_valid = src->logits_valid;
    *out = s;
    return RLX_OK;
}

/* ---- history ------------------------------------------------------------------------------ */

static rlx_status check_tokens(const struct rlx_seq *s, const int32_t *ids, int64_t n, int64_t at)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->m->cfg.vocab_size)
            return rlx_set_error(RLX_ERR_RANGE, "token id %d at position %lld is outside [0, %lld)", ids[i],
                                 (long long)(at + i), (long long)s->m->cfg.vocab_size);
    return RLX_OK;
}

rlx_status rlx_seq_prefill(struct rlx_seq *s, const int32_t *ids, int64_t n)
{
    if (n < 1) return rlx_set_error(RLX_ERR_INVALID, "prefill: the context is empty");
    if (n > s->m->cfg.max_position_embeddings)
        return rlx_set_error(RLX_ERR_RANGE, "prefill: %lld tokens exceed max_position_embeddings %lld", (long long)n,
                             (long long)s->m->cfg.max_position_embeddings);
    RLX_TRY(check_tokens(s, ids, n, 0));
    RLX_TRY(need_tokens(s, n));
    memcpy(s->tokens, ids, (size_t)n * sizeof *ids);
    s->n_tokens = n;
    s->logits_valid = false;
    return rlx_kv_cache_truncate(s->kv, 0);
}

void rlx_seq_reset(struct rlx_seq *s)
{
    s->n_tokens = 0;
    s->logits_valid = false;
    rlx_kv_cache_truncate(s->kv, 0); /* cannot fail for 0 */
}

rlx_status rlx_seq_truncate(struct rlx_seq *s, int64_t n)
{
    if (n < 0) return rlx_set_error(RLX_ERR_INVALID, "truncate: negative length %lld", (long long)n);
    if (n >= s->n_tokens) return RLX_OK;
    s->n_tokens = n;
    s->logits_valid = false;
    return rlx_kv_cache_truncate(s->kv, n);
}

rlx_status rlx_seq_append(struct rlx_seq *s, const int32_t *ids, int64_t n)
{
    if (n < 1) return rlx_set_error(RLX_ERR_INVALID, "append: no tokens");
    if (s->n_tokens == 0) return rlx_set_error(RLX_ERR_STATE, "no context: call prefill first");
    if (n > s->m->cfg.max_position_embeddings - s->n_tokens)
        return rlx_set_error(RLX_ERR_RANGE,
                             "the context is full: %lld + %lld tokens exceed max_position_embeddings "
                             "%lld",
                             (long long)s->n_tokens, (long long)n, (long long)s->m->cfg.max_position_embeddings);
    RLX_TRY(check_tokens(s, ids, n, s->n_tokens));
    RLX_TRY(need_tokens(s, s->n_tokens + n));
    memcpy(s->tokens + s->n_tokens, ids, (size_t)n * sizeof *ids);
    s->n_tokens += n;
    s->logits_valid = false;
    return RLX_OK;
}

int64_t rlx_seq_len(const struct rlx_seq *s) { return s->n_tokens; }
const int32_t *rlx_seq_tokens(const struct rlx_seq *s) { return s->tokens; }
const struct rlx_kv_cache *rlx_seq_kv(const struct rlx_seq *s) { return s->kv; }

/* ---- running ------------------------------------------------------------------------------ */

/* Masks of a bucketed plan: (S, R), R cache rows of which [0, past) hold the sequence and
 * [past, past + S) are written by this run. Query i sits at position past + i; key j at position j.
 * Visible: j <= past + i and, for window W, past + i - j < W. */
static rlx_status set_masks(struct rlx_seq *s, struct plan_slot *sl, int64_t S, int64_t past)
{
    const int64_t R = sl->rows;
    const size_t per = (size_t)S * (size_t)R, need = per * (size_t)sl->n_masks;
    if (need > s->mask_floats) {
        float *m = realloc(s->mask, need * sizeof *m);
        if (!m) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %zu mask floats", need);
        s->mask = m;
        s->mask_floats = need;
    }
    for (int k = 0; k < sl->n_masks; k++) {
        float *m = s->mask + per * (size_t)k;
        const int64_t w = sl->mask_w[k];
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < R; j++) {
                const int64_t qpos = past + i;
                m[i * R + j] = (j <= qpos && (w == 0 || qpos - j < w)) ? 0.0f : -INFINITY;
            }
        struct rlx_host_tensor t = {.data = m, .dtype = RLX_F32, .ndim = 2, .shape = {S, R}};
        RLX_TRY(rlx_plan_set_input(sl->plan, sl->mask_in[k], &t));
    }
    return RLX_OK;
}

/* Binds layer l's K and V of the cache to a plan's two states. */
static rlx_status bind_layer(struct rlx_plan *p, int k_state, int v_state, struct rlx_kv_cache *kv, int64_t l)
{
    size_t ko, vo;
    struct rlx_buffer *k = rlx_kv_cache_buffer(kv, l, 0, &ko), *v = rlx_kv_cache_buffer(kv, l, 1, &vo);
    RLX_TRY(rlx_plan_bind_state(p, k_state, k, ko));
    return rlx_plan_bind_state(p, v_state, v, vo);
}

/* Runs positions [from, from + n) with the model's lock held: FULL (from == 0, no cache) or over
 * the cache's rows [0, from), writing rows [from, from + n) into it. The block's input is the
 * history's ids (embedding blocks) or hidden (n, H). *out: logits (1, V) or hidden (n, H). */
static rlx_status run_locked(struct rlx_seq *s, enum plan_kind kind, const float *hidden, int64_t from, int64_t n,
                             const float **out, int64_t *rows)
{
    struct rlx_model *m = s->m;
    const int64_t L = m->layer_end - m->layer_begin, H = m->cfg.hidden_size;
    struct plan_slot *sl;
    RLX_TRY(rlx_model_plan(m, kind, n, from, rlx_kv_cache_dtype(s->kv), &sl));
    RLX_TRY(need_tokens(s, n));
    for (int64_t i = 0; i < n; i++) s->pos[i] = (int32_t)(from + i);
    struct rlx_host_tensor x = {.data = s->tokens + from, .dtype = RLX_I32, .ndim = 1, .shape = {n}};
    if (!(m->ends & RLX_BLOCK_EMBED))
        x = (struct rlx_host_tensor){.data = hidden, .dtype = RLX_F32, .ndim = 2, .shape = {n, H}};
    struct rlx_host_tensor pos = {.data = s->pos, .dtype = RLX_I32, .ndim = 1, .shape = {n}};
    RLX_TRY(rlx_plan_set_input(sl->plan, sl->in_x, &x));
    RLX_TRY(rlx_plan_set_input(sl->plan, sl->in_pos, &pos));
    if (kind != KIND_FULL) {
        /* the rows the plan reads: a bucket, or exactly the past and the new ones */
        const int64_t read = sl->rows > 0 ? sl->rows : from + n;
        RLX_TRY(rlx_kv_cache_reserve(s->kv, read));
        if (sl->masked) RLX_TRY(set_masks(s, sl, n, from));
        if (sl->rows < 0) RLX_TRY(rlx_plan_bind_symbol(sl->plan, RLX_SYM_PAST, from));
        for (int64_t l = 0; l < L; l++) RLX_TRY(bind_layer(sl->plan, sl->k_state[l], sl->v_state[l], s->kv, l));
    }
    s->profile_valid = false;
    RLX_TRY(rlx_weights_check(m->weights));
    RLX_TRY(rlx_plan_run(sl->plan));
    RLX_TRY(rlx_weights_check(m->weights)); /* a weights file truncated during the run: garbage */
    if (m->profiling) s->profile_valid = rlx_plan_profile(sl->plan, s->profile) == RLX_OK;
    if (m->ends & RLX_BLOCK_HEAD) {
        RLX_TRY(rlx_plan_read_output(sl->plan, sl->out_y, s->logits, sizeof(float) * (size_t)m->cfg.vocab_size));
        *out = s->logits;
        *rows = 1;
    } else {
        if (n > s->hidden_rows) {
            float *h = realloc(s->hidden, sizeof(float) * (size_t)(n * H));
            if (!h) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %lld hidden rows", (long long)n);
            s->hidden = h;
            s->hidden_rows = n;
        }
        RLX_TRY(rlx_plan_read_output(sl->plan, sl->out_y, s->hidden, sizeof(float) * (size_t)(n * H)));
        *out = s->hidden;
        *rows = n;
    }
    if (kind != KIND_FULL) { /* the cache now holds rows [0, from + n) */
        RLX_TRY(rlx_kv_cache_truncate(s->kv, from));
        RLX_TRY(rlx_kv_cache_advance(s->kv, n));
    }
    return RLX_OK;
}

static rlx_status run_positions(struct rlx_seq *s, enum plan_kind kind, const float *hidden, int64_t from, int64_t n,
                                const float **out, int64_t *rows)
{
    rlx_model_lock(s->m);
    rlx_status st = run_locked(s, kind, hidden, from, n, out, rows);
    rlx_model_unlock(s->m);
    return st;
}

/* The whole history of an embedding block, recomputed or through the cache. */
static rlx_status forward_history(struct rlx_seq *s, bool cached, const float **out, int64_t *rows)
{
    if (s->n_tokens == 0) return rlx_set_error(RLX_ERR_STATE, "no context: call prefill first");
    if (!cached) {
        s->logits_valid = false; /* these are not the cached path's logits */
        return run_positions(s, KIND_FULL, NULL, 0, s->n_tokens, out, rows);
    }
    int64_t from = rlx_kv_cache_len(s->kv);
    if (from == s->n_tokens && s->logits_valid) {
        *out = s->logits;
        *rows = 1;
        return RLX_OK;
    }
    if (from == s->n_tokens) from--; /* recompute the last position to get its output */
    s->logits_valid = false;
    /* With the head, only the last position's output is kept: the run goes in pieces of at most
     * prefill_chunk positions (a block without it returns every row: in one piece), all of them
     * through the plans over the cache (the first at past 0): one plan's intermediates, not a
     * prefill plan's beside them. A piece that fails (an interrupt included) leaves the cache as
     * the call found it. */
    const bool head = (s->m->ends & RLX_BLOCK_HEAD) != 0;
    const int64_t chunk = head ? s->m->prefill_chunk : 0, start = from;
    const bool pieces = chunk > 0 && s->n_tokens - from > chunk;
    double profile[RLX_OP_COUNT] = {0}; /* the pieces' profiles, summed */
    bool profiled = true;
    /* Room for the whole history first: the cache then grows once, not piece by piece (each growth
     * copies every row so far, and a small cache would move through its shared mapping first). */
    if (pieces) RLX_TRY(rlx_kv_cache_reserve(s->kv, s->n_tokens));
    for (;;) {
        const int64_t n = chunk > 0 && s->n_tokens - from > chunk ? chunk : s->n_tokens - from;
        const enum plan_kind kind = from || pieces ? KIND_DECODE : KIND_PREFILL;
        const rlx_status st = run_positions(s, kind, NULL, from, n, out, rows);
        if (st != RLX_OK) {
            (void)rlx_kv_cache_truncate(s->kv, start); /* cannot fail: start >= 0 */
            return st;
        }
        profiled = profiled && s->profile_valid;
        for (int op = 0; profiled && op < RLX_OP_COUNT; op++) profile[op] += s->profile[op];
        from += n;
        if (from == s->n_tokens) break;
    }
    if (profiled) memcpy(s->profile, profile, sizeof profile);
    s->profile_valid = profiled;
    s->logits_valid = head;
    return RLX_OK;
}

static rlx_status need_full_model(const struct rlx_seq *s)
{
    const unsigned both = RLX_BLOCK_EMBED | RLX_BLOCK_HEAD;
    if ((s->m->ends & both) != both)
        return rlx_set_error(RLX_ERR_STATE, "this model runs a block without %s: use rlx_seq_forward",
                             (s->m->ends & RLX_BLOCK_EMBED) ? "the LM head" : "the embedding");
    return RLX_OK;
}

rlx_status rlx_seq_logits_naive(struct rlx_seq *s, const float **logits)
{
    int64_t rows;
    RLX_TRY(need_full_model(s));
    return forward_history(s, false, logits, &rows);
}

rlx_status rlx_seq_logits_cached(struct rlx_seq *s, const float **logits)
{
    int64_t rows;
    RLX_TRY(need_full_model(s));
    return forward_history(s, true, logits, &rows);
}

rlx_status rlx_seq_forward(struct rlx_seq *s, const float *hidden, int64_t n, bool cached, const float **out,
                           int64_t *rows)
{
    if (s->m->ends & RLX_BLOCK_EMBED) {
        if (hidden) return rlx_set_error(RLX_ERR_INVALID, "an embedding block takes its input from the history");
        return forward_history(s, cached, out, rows);
    }
    if (!hidden || n < 1) return rlx_set_error(RLX_ERR_INVALID, "forward: no hidden rows given");
    const int64_t from = cached ? rlx_kv_cache_len(s->kv) : 0;
    if (n > s->m->cfg.max_position_embeddings - from)
        return rlx_set_error(RLX_ERR_RANGE, "forward: %lld positions exceed max_position_embeddings %lld",
                             (long long)(from + n), (long long)s->m->cfg.max_position_embeddings);
    RLX_TRY(need_tokens(s, from + n));
    RLX_TRY(run_positions(s, cached ? (from ? KIND_DECODE : KIND_PREFILL) : KIND_FULL, hidden, from, n, out, rows));
    /* positions: a hidden-input block has no token values (its history reads as zeros) */
    memset(s->tokens + from, 0, (size_t)n * sizeof *s->tokens);
    s->n_tokens = from + n;
    return RLX_OK;
}

/* ---- batches ------------------------------------------------------------------------------ */

/* *p holds at least `need` bytes (contents not kept). */
static rlx_status grow_bytes(void **p, size_t *have, size_t need)
{
    if (need <= *have) return RLX_OK;
    void *q = realloc(*p, need);
    if (!q) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %zu bytes of batch scratch", need);
    *p = q;
    *have = need;
    return RLX_OK;
}

/* Runs the batch's runs (run b: sequence seqs[b] from position from[b], segs[b] positions) in one
 * plan with the model's lock held. */
static rlx_status run_batch_locked(struct rlx_model *m, struct rlx_seq *const *seqs, int B, const int64_t *from,
                                   const int64_t *segs)
{
    const int64_t L = m->layer_end - m->layer_begin, V = m->cfg.vocab_size;
    struct plan_slot *sl;
    RLX_TRY(rlx_model_batch_plan(m, B, segs, rlx_kv_cache_dtype(seqs[0]->kv), &sl));
    int64_t rows = 0;
    for (int b = 0; b < B; b++) rows += segs[b];
    RLX_TRY(grow_bytes((void **)&m->batch_ids, &m->batch_ids_bytes, sizeof(int32_t) * (size_t)(2 * rows)));
    RLX_TRY(grow_bytes((void **)&m->batch_logits, &m->batch_logits_bytes, sizeof(float) * (size_t)(B * V)));
    int32_t *ids = m->batch_ids, *pos = m->batch_ids + rows; /* (rows) each */
    for (int b = 0, r = 0; b < B; b++) {
        struct rlx_seq *s = seqs[b];
        for (int64_t i = 0; i < segs[b]; i++, r++) {
            ids[r] = s->tokens[from[b] + i];
            pos[r] = (int32_t)(from[b] + i);
        }
        /* room for the whole history: a prompt entering in pieces grows the cache once */
        RLX_TRY(rlx_kv_cache_reserve(s->kv, s->n_tokens));
        RLX_TRY(rlx_plan_bind_symbol(sl->plan, sl->past_sym[b], from[b]));
        for (int64_t l = 0; l < L; l++)
            RLX_TRY(bind_layer(sl->plan, sl->k_state[b * L + l], sl->v_state[b * L + l], s->kv, l));
        s->profile_valid = false;
    }
    struct rlx_host_tensor x = {.data = ids, .dtype = RLX_I32, .ndim = 1, .shape = {rows}};
    struct rlx_host_tensor p = {.data = pos, .dtype = RLX_I32, .ndim = 1, .shape = {rows}};
    RLX_TRY(rlx_plan_set_input(sl->plan, sl->in_x, &x));
    RLX_TRY(rlx_plan_set_input(sl->plan, sl->in_pos, &p));
    RLX_TRY(rlx_weights_check(m->weights));
    RLX_TRY(rlx_plan_run(sl->plan));
    RLX_TRY(rlx_weights_check(m->weights)); /* a weights file truncated during the run: garbage */
    RLX_TRY(rlx_plan_read_output(sl->plan, sl->out_y, m->batch_logits, sizeof(float) * (size_t)(B * V)));
    for (int b = 0; b < B; b++) { /* the caches now hold rows [0, from + seg) */
        struct rlx_seq *s = seqs[b];
        if (m->profiling) s->profile_valid = rlx_plan_profile(sl->plan, s->profile) == RLX_OK; /* the batch's */
        RLX_TRY(rlx_kv_cache_truncate(s->kv, from[b]));
        RLX_TRY(rlx_kv_cache_advance(s->kv, segs[b]));
        if (from[b] + segs[b] == s->n_tokens) {
            memcpy(s->logits, m->batch_logits + b * V, sizeof(float) * (size_t)V);
            s->logits_valid = true;
        }
    }
    return RLX_OK;
}

rlx_status rlx_seq_batch_logits(struct rlx_seq *const *seqs, int n, int64_t chunk, const float **logits)
{
    if (n < 1 || n > RLX_MAX_BATCH)
        return rlx_set_error(RLX_ERR_INVALID, "a batch holds 1..%d sequences, got %d", RLX_MAX_BATCH, n);
    if (chunk < 0) return rlx_set_error(RLX_ERR_INVALID, "batch: negative chunk %lld", (long long)chunk);
    struct rlx_model *m = seqs[0]->m;
    for (int b = 0; b < n; b++) {
        const struct rlx_seq *s = seqs[b];
        if (s->m != m) return rlx_set_error(RLX_ERR_INVALID, "batch: sequence %d belongs to another model", b);
        if (rlx_kv_cache_dtype(s->kv) != rlx_kv_cache_dtype(seqs[0]->kv))
            return rlx_set_error(RLX_ERR_INVALID, "batch: sequence %d has a %s KV cache, sequence 0 %s", b,
                                 rlx_dtype_name(rlx_kv_cache_dtype(s->kv)),
                                 rlx_dtype_name(rlx_kv_cache_dtype(seqs[0]->kv)));
        if (s->n_tokens == 0) return rlx_set_error(RLX_ERR_STATE, "batch: sequence %d has no context", b);
        for (int c = 0; c < b; c++)
            if (seqs[c] == s) return rlx_set_error(RLX_ERR_INVALID, "batch: sequences %d and %d are the same", c, b);
    }
    RLX_TRY(need_full_model(seqs[0]));
    /* The runs, longest first (a stable order: batches of the same shape share a plan). */
    struct rlx_seq *run[RLX_MAX_BATCH];
    int64_t from[RLX_MAX_BATCH], segs[RLX_MAX_BATCH];
    int B = 0;
    for (int b = 0; b < n; b++) {
        struct rlx_seq *s = seqs[b];
        int64_t f = rlx_kv_cache_len(s->kv);
        logits[b] = NULL;
        if (f == s->n_tokens && s->logits_valid) {
            logits[b] = s->logits;
            continue;
        }
        if (f == s->n_tokens) f--; /* recompute the last position to get its logits */
        int64_t seg = s->n_tokens - f;
        if (chunk > 0 && seg > chunk) seg = chunk;
        int at = B++;
        while (at > 0 && segs[at - 1] < seg) {
            run[at] = run[at - 1], from[at] = from[at - 1], segs[at] = segs[at - 1];
            at--;
        }
        run[at] = s, from[at] = f, segs[at] = seg;
    }
    if (B == 0) return RLX_OK;
    for (int b = 0; b < B; b++) run[b]->logits_valid = false;
    rlx_model_lock(m);
    rlx_status st = run_batch_locked(m, run, B, from, segs);
    rlx_model_unlock(m);
    RLX_TRY(st);
    for (int b = 0; b < n; b++)
        if (seqs[b]->logits_valid) logits[b] = seqs[b]->logits;
    return RLX_OK;
}

rlx_status rlx_seq_sample(struct rlx_seq *s, const float *logits, const struct rlx_sample_opts *o, uint64_t index,
                          int32_t *token)
{
    const bool has_history = s->m->ends & RLX_BLOCK_EMBED; /* other blocks count positions, not tokens */
    return rlx_seq_sample_with(s, logits, o, index, s->tokens, has_history ? s->n_tokens : 0, token);
}

rlx_status rlx_seq_sample_with(struct rlx_seq *s, const float *logits, const struct rlx_sample_opts *o, uint64_t index,
                               const int32_t *history, int64_t n_hist, int32_t *token)
{
    return rlx_sample(logits, s->m->cfg.vocab_size, o, history, n_hist, index, s->sample_scratch, s->sample_idx, token);
}

rlx_status rlx_seq_last_profile(const struct rlx_seq *s, double *seconds_by_op)
{
    if (!s->profile_valid)
        return rlx_set_error(RLX_ERR_STATE, s->m->profiling
                                                ? "this sequence has run no forward pass since profiling was turned on "
                                                  "(a batched step's profile is read from any sequence of the batch)"
                                                : "profiling is off: turn it on first");
    memcpy(seconds_by_op, s->profile, sizeof s->profile);
    return RLX_OK;
}

/* ---- state -------------------------------------------------------------------------------- */

/* The header of a saved state: fixed-size fields, native byte order (checked by `magic`). */
struct state_header {
    char magic[8];   /* "RLXSEQ1\0" */
    uint32_t endian; /* 0x01020304 as written */
    uint32_t kv_dtype;
    uint64_t config_hash; /* FNV-1a of the config fields that shape the computation */
    int64_t layer_begin, layer_end;
    uint32_t ends, reserved;
    int64_t row; /* n_kv_heads * head_dim */
    int64_t n_tokens, kv_len;
};

static const char state_magic[8] = "RLXSEQ1";

static uint64_t config_hash(const struct rlx_model_config *c)
{
    uint64_t h = 1469598103934665603ull;
    const int64_t f[] = {c->vocab_size,
                         c->hidden_size,
                         c->intermediate_size,
                         c->n_layers,
                         c->n_heads,
                         c->n_kv_heads,
                         c->head_dim,
                         c->max_position_embeddings,
                         c->tie_word_embeddings,
                         c->attention_bias,
                         c->mlp_bias,
                         c->qk_norm,
                         c->rope_interleaved};
    uint32_t eps;
    memcpy(&eps, &c->rms_norm_eps, sizeof eps);
    const unsigned char *parts[3] = {(const unsigned char *)f, (const unsigned char *)c->layer_window,
                                     (const unsigned char *)&eps};
    const size_t sizes[3] = {sizeof f, sizeof(int64_t) * (size_t)c->n_layers, sizeof eps};
    for (int p = 0; p < 3; p++)
        for (size_t i = 0; i < sizes[p]; i++) h = (h ^ parts[p][i]) * 1099511628211ull;
    return h;
}

static void fill_header(const struct rlx_seq *s, struct state_header *h)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, state_magic, sizeof h->magic);
    h->endian = 0x01020304u;
    h->kv_dtype = (uint32_t)rlx_kv_cache_dtype(s->kv);
    h->config_hash = config_hash(&s->m->cfg);
    h->layer_begin = s->m->layer_begin;
    h->layer_end = s->m->layer_end;
    h->ends = s->m->ends;
    h->row = rlx_kv_cache_row(s->kv);
    h->n_tokens = s->n_tokens;
    h->kv_len = rlx_kv_cache_len(s->kv);
}

/* Bytes of a state with these lengths (checked: lengths come from files on load). */
static rlx_status state_bytes(const struct rlx_seq *s, int64_t n_tokens, int64_t kv_len, size_t *out)
{
    size_t row_bytes, rows, tok = (size_t)n_tokens * sizeof(int32_t), total = sizeof(struct state_header);
    RLX_TRY(rlx_dtype_bytes(rlx_kv_cache_dtype(s->kv), rlx_kv_cache_row(s->kv), &row_bytes));
    const size_t layers2 = (size_t)rlx_kv_cache_layers(s->kv) * 2;
    if (!rlx_size_mul(row_bytes, (size_t)kv_len, &rows) || !rlx_size_mul(rows, layers2, &rows) ||
        !rlx_size_add(total, tok, &total) || !rlx_size_add(total, rows, &total))
        return rlx_set_error(RLX_ERR_RANGE, "sequence state: the sizes overflow");
    *out = total;
    return RLX_OK;
}

rlx_status rlx_seq_state_size(const struct rlx_seq *s, size_t *bytes)
{
    return state_bytes(s, s->n_tokens, rlx_kv_cache_len(s->kv), bytes);
}

rlx_status rlx_seq_save(const struct rlx_seq *s, void *buf, size_t bytes)
{
    size_t need;
    RLX_TRY(rlx_seq_state_size(s, &need));
    if (bytes != need) return rlx_set_error(RLX_ERR_SHAPE, "sequence state: %zu bytes given, %zu needed", bytes, need);
    struct state_header h;
    fill_header(s, &h);
    char *p = buf;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    if (s->n_tokens) memcpy(p, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
    p += (size_t)s->n_tokens * sizeof(int32_t);
    size_t row_bytes;
    RLX_TRY(rlx_dtype_bytes(rlx_kv_cache_dtype(s->kv), rlx_kv_cache_row(s->kv), &row_bytes));
    const size_t chunk = row_bytes * (size_t)h.kv_len;
    for (int64_t l = 0; l < rlx_kv_cache_layers(s->kv); l++)
        for (int which = 0; which < 2; which++, p += chunk)
            RLX_TRY(rlx_kv_cache_read(s->kv, l, which, 0, h.kv_len, p, chunk));
    return RLX_OK;
}

rlx_status rlx_seq_load(struct rlx_seq *s, const void *buf, size_t bytes)
{
    struct state_header h, mine;
    if (bytes < sizeof h)
        return rlx_set_error(RLX_ERR_INVALID, "sequence state: %zu bytes are too few for a header", bytes);
    memcpy(&h, buf, sizeof h);
    fill_header(s, &mine);
    if (memcmp(h.magic, state_magic, sizeof h.magic) != 0 || h.endian != mine.endian)
        return rlx_set_error(RLX_ERR_INVALID,
                             "sequence state: not an rlx sequence state of this version and byte order");
    if (h.kv_dtype != mine.kv_dtype)
        return rlx_set_error(RLX_ERR_INVALID, "sequence state: saved with a %s KV cache, this sequence's is %s",
                             rlx_dtype_name((enum rlx_dtype)(h.kv_dtype < RLX_DTYPE_COUNT ? h.kv_dtype : 0)),
                             rlx_dtype_name((enum rlx_dtype)mine.kv_dtype));
    if (h.config_hash != mine.config_hash || h.row != mine.row)
        return rlx_set_error(RLX_ERR_INVALID, "sequence state: saved from a model with another config");
    if (h.layer_begin != mine.layer_begin || h.layer_end != mine.layer_end || h.ends != mine.ends)
        return rlx_set_error(RLX_ERR_INVALID,
                             "sequence state: saved from the block of layers [%lld, %lld), this is "
                             "[%lld, %lld)",
                             (long long)h.layer_begin, (long long)h.layer_end, (long long)mine.layer_begin,
                             (long long)mine.layer_end);
    const int64_t ctx = s->m->cfg.max_position_embeddings;
    if (h.n_tokens < 0 || h.n_tokens > ctx || h.kv_len < 0 || h.kv_len > h.n_tokens)
        return rlx_set_error(RLX_ERR_INVALID,
                             "sequence state: %lld tokens with %lld cached rows do not fit a context "
                             "of %lld",
                             (long long)h.n_tokens, (long long)h.kv_len, (long long)ctx);
    size_t need;
    RLX_TRY(state_bytes(s, h.n_tokens, h.kv_len, &need));
    if (bytes != need)
        return rlx_set_error(RLX_ERR_INVALID,
                             "sequence state: %zu bytes, a state of %lld tokens and %lld cached rows "
                             "has %zu",
                             bytes, (long long)h.n_tokens, (long long)h.kv_len, need);
    const char *p = (const char *)buf + sizeof h;
    const bool embeds = s->m->ends & RLX_BLOCK_EMBED;
    int32_t *toks = NULL;
    if (h.n_tokens) {
        toks = malloc((size_t)h.n_tokens * sizeof *toks);
        if (!toks) return rlx_set_error(RLX_ERR_NOMEM, "out of memory for %lld tokens", (long long)h.n_tokens);
        memcpy(toks, p, (size_t)h.n_tokens * sizeof *toks);
    }
    rlx_status st = embeds ? check_tokens(s, toks, h.n_tokens, 0) : RLX_OK;
    if (st == RLX_OK) st = need_tokens(s, h.n_tokens);
    if (st == RLX_OK) st = rlx_kv_cache_reserve(s->kv, h.kv_len);
    if (st != RLX_OK) {
        free(toks);
        return st;
    }
    p += (size_t)h.n_tokens * sizeof(int32_t);
    size_t row_bytes;
    st = rlx_dtype_bytes(rlx_kv_cache_dtype(s->kv), h.row, &row_bytes);
    const size_t chunk = row_bytes * (size_t)h.kv_len;
    rlx_kv_cache_truncate(s->kv, 0); /* from here on the old state is gone; a failure leaves it empty */
    s->n_tokens = 0;
    s->logits_valid = false;
    for (int64_t l = 0; st == RLX_OK && l < rlx_kv_cache_layers(s->kv); l++)
        for (int which = 0; st == RLX_OK && which < 2; which++, p += chunk)
            st = rlx_kv_cache_write(s->kv, l, which, 0, h.kv_len, p, chunk);
    if (st == RLX_OK) st = rlx_kv_cache_advance(s->kv, h.kv_len);
    if (st == RLX_OK && h.n_tokens) memcpy(s->tokens, toks, (size_t)h.n_tokens * sizeof *toks);
    if (st == RLX_OK) s->n_tokens = h.n_tokens;
    free(toks);
    return st;
}
