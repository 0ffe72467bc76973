/*
 * model.h - the decoder builder for the Llama 3.2 and Qwen3 families and the generator that runs
 * it: prefill, naive recompute, KV-cached decode and sampling.
 *
 * One builder makes every graph: a block of layers [layer_begin, layer_end) with optional token
 * embedding at its start, optional final norm + LM head at its end, optional past K/V inputs and
 * new K/V outputs. The whole model is the block of all layers with both ends; a pipeline stage is
 * a smaller block. Weights use the Hugging Face tensor names.
 */
#ifndef RLX_MODEL_H
#define RLX_MODEL_H

#include "rlx/kv.h"
#include "rlx/rlx.h"
#include "rlx/sample.h"

#define RLX_MAX_LAYERS 256

struct rlx_model_config {
    int64_t vocab_size, hidden_size, intermediate_size;
    int64_t n_layers, n_heads, n_kv_heads, head_dim;
    int64_t max_position_embeddings;
    float rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias;      /* bias on q, k, v and o projections */
    bool mlp_bias;            /* bias on gate, up and down projections */
    bool qk_norm;             /* Qwen3: RMSNorm over each head of q and k before RoPE */
    int64_t layer_window[RLX_MAX_LAYERS]; /* sliding window of each layer; 0 = full attention */
    enum rlx_dtype weight_dtype; /* of the 2-D weights (projections, embedding, lm_head): f32, bf16 or f16;
                                    norms and biases are always f32 */
};
/* RLX_ERR_INVALID naming the field when a size is not positive or heads do not divide. */
rlx_status rlx_model_config_check(const struct rlx_model_config *c);

/* What a built block contains. */
enum rlx_block_flags {
    RLX_BLOCK_EMBED = 1 << 0,      /* input "ids" i32 (SEQ) through the embedding; else input "hidden" (SEQ, H) */
    RLX_BLOCK_HEAD = 1 << 1,       /* final norm + LM head -> output "logits" (1, V); else output "hidden" */
    RLX_BLOCK_PAST = 1 << 2,       /* inputs "past_k.L", "past_v.L" (PAST, Hkv, D) per layer L */
    RLX_BLOCK_KV_OUT = 1 << 3,     /* outputs "k.L", "v.L" (SEQ, Hkv, D): the new positions' K/V */
    RLX_BLOCK_MASK = 1 << 4,       /* inputs "mask" f32 (SEQ, PAST+SEQ) for full-attention layers and "mask_w<W>"
                                      for layers with window W, added to the scores (causal stays on; the
                                      kernel's own window is off: the mask carries it) */
    RLX_BLOCK_ALL_LOGITS = 1 << 5, /* with HEAD: logits for every position (SEQ, V) */
};

/* Every block also takes input "pos" i32 (SEQ) (absolute positions) and param "rope.inv_freq"
 * f32 (head_dim / 2). seq and past are the dims to use for SEQ and PAST: constants for a plan
 * specialised to one shape, or symbols (rlx_dim_sym(RLX_SYM_SEQ)) for a dynamic plan. */
struct rlx_block_spec {
    int64_t layer_begin, layer_end;
    unsigned flags;
    struct rlx_dim seq, past;
};
rlx_status rlx_decoder_build(const struct rlx_model_config *cfg, const struct rlx_block_spec *spec,
                             struct rlx_graph **out);

/* ---------------------------------------------------------------------------------------------
 * Generator
 *
 * Holds the token history, a KV cache over the whole context (address space reserved once,
 * pages committed as they fill) and compiled plans. Not safe for concurrent use.
 * ------------------------------------------------------------------------------------------- */

struct rlx_generator;

/* How plans are compiled and kept. Prefill plans (every position of a history) take ONESHOT, LRU or
 * DYNAMIC; decode plans (positions after a cached past) take ONESHOT, BUCKETED or DYNAMIC. */
enum rlx_plan_policy {
    RLX_POLICY_ONESHOT = 0,   /* specialised to the exact shape; one kept per kind, recompiled on change */
    RLX_POLICY_LRU = 1,       /* specialised; the `capacity` most recently used kept (prefill) */
    RLX_POLICY_BUCKETED = 2,  /* decode: PAST rounded up to a power of two (capped at max_past), the
                                 padding hidden by a mask; one plan per bucket: O(log n) compiles */
    RLX_POLICY_DYNAMIC = 3,   /* symbolic SEQ / PAST, compiled once and bound per call */
};

rlx_status rlx_generator_create(const struct rlx_model_config *cfg, const char *device,
                                struct rlx_generator **out);
/* A generator for the block of layers [layer_begin, layer_end) (a pipeline stage). ends:
 * RLX_BLOCK_EMBED (the block embeds the history's token ids; else it takes hidden rows) and/or
 * RLX_BLOCK_HEAD (it ends in the LM head; else it outputs hidden rows). Its KV cache holds only its
 * own layers. rlx_generator_create is the block of all layers with both ends. */
rlx_status rlx_generator_create_block(const struct rlx_model_config *cfg, const char *device, int64_t layer_begin,
                                      int64_t layer_end, unsigned ends, struct rlx_generator **out);
void rlx_generator_free(struct rlx_generator *g);
/* Binds a weight by its Hugging Face name (or "rope.inv_freq"). The generator keeps the pointer
 * (zero-copy) until it is freed or the weight is set again. f32 only. */
rlx_status rlx_generator_set_weight(struct rlx_generator *g, const char *name, const struct rlx_host_tensor *t);
/* prefill_capacity: LRU size (>= 1); max_past: BUCKETED's largest past (>= 1). Fails with
 * RLX_ERR_STATE while the KV cache holds positions (no policy change mid-utterance). Drops plans. */
rlx_status rlx_generator_set_policy(struct rlx_generator *g, enum rlx_plan_policy prefill, int64_t prefill_capacity,
                                    enum rlx_plan_policy decode, int64_t max_past);
/* Bounds SEQ and PAST of dynamic plans (memory planned once at the cap; 0 = max_position_embeddings
 * bounds them and memory grows with use). Drops plans. */
rlx_status rlx_generator_set_seq_cap(struct rlx_generator *g, int64_t cap);
/* Soft memory budget for each plan's intermediates (0 = none); hint is appended to refusals. */
void rlx_generator_set_memory_budget(struct rlx_generator *g, size_t bytes, const char *hint);

/* Replaces the history with ids (n >= 1) and clears the cache. */
rlx_status rlx_generator_prefill(struct rlx_generator *g, const int32_t *ids, int64_t n);
/* Forgets the history and empties the cache (plans are kept). */
void rlx_generator_reset(struct rlx_generator *g);
/* Keeps the first n positions of the history and of the cache (n >= 0; larger n changes nothing). */
rlx_status rlx_generator_truncate(struct rlx_generator *g, int64_t n);
/* Appends one token to the history (range-checked; RLX_ERR_RANGE past max_position_embeddings). */
rlx_status rlx_generator_append(struct rlx_generator *g, int32_t token);
int64_t rlx_generator_len(const struct rlx_generator *g);
/* The block this generator runs: layers [*begin, *end) and its ends (RLX_BLOCK_EMBED | RLX_BLOCK_HEAD). */
void rlx_generator_block(const struct rlx_generator *g, int64_t *begin, int64_t *end, unsigned *ends);
const int32_t *rlx_generator_tokens(const struct rlx_generator *g);
const struct rlx_model_config *rlx_generator_config(const struct rlx_generator *g);
struct rlx_kv_cache *rlx_generator_kv(struct rlx_generator *g);

/* Logits (vocab) of the next token after the whole history by recomputing it all (no cache).
 * The pointer is owned by the generator, valid until its next call. */
rlx_status rlx_generator_logits_naive(struct rlx_generator *g, const float **logits);
/* The same through the KV cache: runs only the positions not cached yet (all of them the first
 * time, one per decode step); afterwards the cache holds the whole history. */
rlx_status rlx_generator_logits_cached(struct rlx_generator *g, const float **logits);
/* Runs the block: an embedding block over its history (hidden must be NULL), recomputed or through
 * the cache as above; a hidden-input block over hidden (n, hidden_size) rows: with cached, positions
 * continuing after the cache (which then grows by n), else positions 0..n-1 (no cache).
 * *out: the logits (1, vocab) of the last position for a block with the head, else hidden rows
 * (rows, hidden_size) of every position run. Owned by the generator until its next call. */
rlx_status rlx_generator_forward(struct rlx_generator *g, const float *hidden, int64_t n, bool cached,
                                 const float **out, int64_t *rows);
/* Samples from logits with draw index `index`, the history as repetition context. */
rlx_status rlx_generator_sample(struct rlx_generator *g, const float *logits, const struct rlx_sample_opts *o,
                                uint64_t index, int32_t *token);
/* The same with an explicit repetition context (history, n_hist ids) instead of the generator's own
 * (a pipeline's last block has no token history of its own). */
rlx_status rlx_generator_sample_with(struct rlx_generator *g, const float *logits, const struct rlx_sample_opts *o,
                                     uint64_t index, const int32_t *history, int64_t n_hist, int32_t *token);

struct rlx_generator_stats {
    int64_t prefill_compiles, decode_compiles, plan_hits;
    double compile_seconds;
    int64_t plans_cached;
    size_t planned_bytes;
};
void rlx_generator_stats(const struct rlx_generator *g, struct rlx_generator_stats *out);
/* Per-op wall time of the last forward pass (RLX_OP_COUNT entries), when profiling is on. */
rlx_status rlx_generator_set_profiling(struct rlx_generator *g, bool on);
rlx_status rlx_generator_last_profile(const struct rlx_generator *g, double *seconds_by_op);
/* Frees compiled decode plans / all plans (they are rebuilt on demand). */
void rlx_generator_release_decode_plans(struct rlx_generator *g);
void rlx_generator_release_plans(struct rlx_generator *g);

#endif
