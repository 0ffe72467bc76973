/*
 * model.h - the decoder builder for the Llama 3.2 and Qwen3 families (Qwen3-MoE included), and the objects that run it:
 * a model (config + weight store + compiled plans, on one device) and its sequences (a token
 * history + a KV cache each).
 *
 * One builder makes every graph: a block of layers [layer_begin, layer_end) with optional token
 * embedding at its start, optional final norm + LM head at its end, and optionally the KV cache as
 * state (each layer writes its new K/V rows into it and attends over it). The whole model is the
 * block of all layers with both ends; a pipeline stage is a smaller block. The Hugging Face tensor
 * names are made here and nowhere else: rlx_decoder_params lists a block's weights.
 */
#ifndef RLX_MODEL_H
#define RLX_MODEL_H

#include "rlx/kv.h"
#include "rlx/rlx.h"
#include "rlx/sample.h"

#define RLX_MAX_LAYERS  256
#define RLX_MAX_WINDOWS 4  /* distinct sliding-window sizes a masked plan may need */
#define RLX_MAX_BATCH   16 /* sequences one batched plan advances */

struct rlx_model_config {
    int64_t vocab_size, hidden_size, intermediate_size;
    int64_t n_layers, n_heads, n_kv_heads, head_dim;
    int64_t max_position_embeddings;
    float rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias;                  /* bias on q, k, v and o projections */
    bool mlp_bias;                        /* bias on gate, up and down projections */
    bool qk_norm;                         /* Qwen3: RMSNorm over each head of q and k before RoPE */
    bool rope_interleaved;                /* q / k rows in llama.cpp's permuted order (GGUF Llama files): RoPE turns
                                 adjacent pairs instead of halves; the same model, read without a copy */
    int64_t layer_window[RLX_MAX_LAYERS]; /* sliding window of each layer; 0 = full attention */
    /* Mixture of experts (Qwen3-MoE): a sparse layer's MLP is a router (E, H) choosing, per token, the
     * n_experts_used experts of highest softmax probability, whose SwiGLU MLPs (gate / up (F, H),
     * down (H, F), F = moe_intermediate_size) are summed weighted by those probabilities
     * (renormalised to sum 1 when norm_topk_prob). Dense layers keep the MLP of intermediate_size. */
    int64_t n_experts, n_experts_used, moe_intermediate_size; /* ignored when no layer is sparse */
    bool norm_topk_prob;
    bool layer_sparse[RLX_MAX_LAYERS]; /* layer l's MLP is the mixture */
};
/* RLX_ERR_INVALID naming the field when a size is not positive, heads do not divide, eps is not a
 * finite number >= 0, or (with a sparse layer) the expert counts do not hold 1 <= n_experts_used <=
 * n_experts <= INT32_MAX. */
rlx_status rlx_model_config_check(const struct rlx_model_config *c);

/* What a built block contains. */
enum rlx_block_flags {
    RLX_BLOCK_EMBED = 1 << 0,      /* input "ids" i32 (SEQ) through the embedding; else input "hidden" (SEQ, H) */
    RLX_BLOCK_HEAD = 1 << 1,       /* final norm + LM head -> output "logits" (1, V); else output "hidden" */
    RLX_BLOCK_CACHE = 1 << 2,      /* states "k_cache.L", "v_cache.L" (kv_rows, Hkv, D) of kv_dtype per layer L:
                                      the new rows are written at positions pos, attention reads all kv_rows */
    RLX_BLOCK_MASK = 1 << 3,       /* with CACHE: inputs f32 (SEQ, kv_rows), one per distinct layer window,
                                      added to the scores; the attention's own causal rule and window are off
                                      (the masks carry them): for caches read past their filled rows */
    RLX_BLOCK_ALL_LOGITS = 1 << 4, /* with HEAD: logits for every position (SEQ, V) */
};

/* Every block also takes input "pos" i32 (SEQ) (absolute positions) and param "rope.inv_freq" f32
 * (head_dim / 2). seq: the dim of SEQ; kv_rows: with CACHE, the cache rows attention reads (PAST +
 * SEQ, or a bucket's constant); constants for a plan specialised to one shape, or expressions of
 * symbols (rlx_dim_sym(RLX_SYM_SEQ)) for a dynamic plan. Without CACHE, K and V are rounded to
 * kv_dtype before attention, so a recomputed forward matches a cached one. */
struct rlx_block_spec {
    int64_t layer_begin, layer_end;
    unsigned flags;
    struct rlx_dim seq, kv_rows;
    enum rlx_dtype kv_dtype; /* f32, f16 or bf16 */
    /* A batch (batch >= 1, with CACHE and without MASK): the SEQ rows are `batch` sequences one after
     * another, sequence b's batch_seq[b] rows (seq is their constant sum; kv_rows is unused). Every
     * projection, norm and MLP runs on all rows at once; each sequence writes into and attends over
     * caches of its own, states "k_cache.L.b" / "v_cache.L.b" (PASTb + batch_seq[b], Hkv, D) with
     * the symbol PASTb (its cached rows before the run) registered in order, so a batch of ragged
     * pasts is one plan. With HEAD (not ALL_LOGITS) the logits are (batch, V): each sequence's last
     * row. batch 0: one sequence, as above. */
    int batch;
    int64_t batch_seq[RLX_MAX_BATCH];
};

/* Where a built block's interface is: node ids in the graph (compiling keeps them) and output
 * indices. Layers are local: index l is layer layer_begin + l. */
struct rlx_block_io {
    int x;   /* input "ids" or "hidden" */
    int pos; /* input "pos" */
    int y;   /* output index of "logits" or "hidden" */
    int n_layers;
    int k_cache[RLX_MAX_BATCH][RLX_MAX_LAYERS], v_cache[RLX_MAX_BATCH][RLX_MAX_LAYERS]; /* CACHE: the state nodes of
                                                                                        sequence b ([0] unbatched) */
    int past_sym[RLX_MAX_BATCH]; /* batch: the symbol PASTb of each sequence */
    int n_masks;
    int mask[RLX_MAX_WINDOWS];            /* MASK: input nodes, one per distinct window */
    int64_t mask_window[RLX_MAX_WINDOWS]; /* the window each mask is for (0 = full attention) */
};

/* Builds a block. weights gives each matrix param's dtype (the store must hold every weight the
 * block names, see rlx_decoder_params; NULL: all f32). io may be NULL. */
rlx_status rlx_decoder_build(const struct rlx_model_config *cfg, const struct rlx_block_spec *spec,
                             const struct rlx_weights *weights, struct rlx_graph **out, struct rlx_block_io *io);

/* The weights a block reads, in build order, each once. */
enum rlx_param_kind {
    RLX_PARAM_MATRIX = 0,  /* a matmul weight or embedding table: any real-valued dtype (f32, f16, bf16, q8_0) */
    RLX_PARAM_VECTOR = 1,  /* a norm weight or a bias: f32 */
    RLX_PARAM_DERIVED = 2, /* computed from the config by the caller, not read from a file: rope.inv_freq, f32 */
    RLX_PARAM_EXPERTS = 3, /* a mixture's experts stacked (E, out_features, in_features), any real-valued dtype:
                               one tensor (a GGUF file's), or E parts named part_fmt (a Hugging Face file's) */
};
struct rlx_param_info {
    char name[RLX_NAME_MAX]; /* Hugging Face name ("model.layers.0.self_attn.q_proj.weight"); stacked
                                           experts: "model.layers.0.mlp.experts.gate_proj.weight" */
    int ndim;
    int64_t shape[3]; /* (out_features, in_features) for projections, (E, out, in) for experts */
    enum rlx_param_kind kind;
    char part_fmt[RLX_NAME_MAX]; /* EXPERTS: the name of part e with "%d" for e, as a Hugging Face file
                                           names it ("model.layers.0.mlp.experts.%d.gate_proj.weight"); else "" */
};
/* *out: an array of *n entries for the block [begin, end) with ends (RLX_BLOCK_EMBED |
 * RLX_BLOCK_HEAD), freed with rlx_decoder_params_free. */
rlx_status rlx_decoder_params(const struct rlx_model_config *cfg, int64_t layer_begin, int64_t layer_end, unsigned ends,
                              struct rlx_param_info **out, int *n);
void rlx_decoder_params_free(struct rlx_param_info *p);

/* ---------------------------------------------------------------------------------------------
 * Models
 *
 * A model holds the config, a weight store on its device and the plans compiled for it, shared by
 * all its sequences. Its plans run one at a time (a mutex inside): sequences of one model may be
 * used from several threads, each sequence by one thread at a time.
 * ------------------------------------------------------------------------------------------- */

struct rlx_model;

/* How plans are compiled and kept. Prefill plans (a cached run from position 0) take ONESHOT, LRU or
 * DYNAMIC; decode plans (positions after a cached past) take ONESHOT, BUCKETED or DYNAMIC; the
 * recomputing forward (no cache) follows the prefill policy. */
enum rlx_plan_policy {
    RLX_POLICY_ONESHOT = 0,  /* specialised to the exact shape; one kept per kind, recompiled on change */
    RLX_POLICY_LRU = 1,      /* specialised; the `capacity` most recently used kept (prefill) */
    RLX_POLICY_BUCKETED = 2, /* decode: the cache rows read rounded up to a power of two (capped at max_past),
                                 the rows past the sequence hidden by a mask; one plan per bucket: O(log n) compiles */
    RLX_POLICY_DYNAMIC = 3,  /* symbolic SEQ / PAST, compiled once and bound per call */
};

/* A model of the block [layer_begin, layer_end) (the whole model: 0, n_layers) with ends
 * (RLX_BLOCK_EMBED: it embeds token ids, else takes hidden rows; RLX_BLOCK_HEAD: it ends in the LM
 * head, else outputs hidden rows) on dev, which the model borrows. */
rlx_status rlx_model_create(const struct rlx_model_config *cfg, struct rlx_device *dev, int64_t layer_begin,
                            int64_t layer_end, unsigned ends, struct rlx_model **out);
/* After its sequences (asserted). */
void rlx_model_free(struct rlx_model *m);
/* Stores a weight by its Hugging Face name (or "rope.inv_freq"): a name the block reads, its shape,
 * and for matrices any real-valued dtype (f32 for norms, biases and rope.inv_freq). Used in place
 * where the device reads host memory (keep it alive and unchanged), else uploaded once. Drops the
 * compiled plans. */
rlx_status rlx_model_set_weight(struct rlx_model *m, const char *name, const struct rlx_host_tensor *t);
/* Stores stacked experts (an RLX_PARAM_EXPERTS name) from its n = E parts, each of the shape of one
 * expert (see rlx_weights_set_parts: used in place where the device reads host memory). */
rlx_status rlx_model_set_weight_parts(struct rlx_model *m, const char *name, int64_t n,
                                      const struct rlx_host_tensor *parts);
/* prefill_capacity: LRU size (>= 1); max_past: BUCKETED's largest number of cache rows (>= 1).
 * Drops plans. */
rlx_status rlx_model_set_policy(struct rlx_model *m, enum rlx_plan_policy prefill, int64_t prefill_capacity,
                                enum rlx_plan_policy decode, int64_t max_past);
/* Bounds SEQ and PAST of dynamic plans (memory planned once at the cap; 0 = max_position_embeddings
 * bounds them and memory grows with use). Drops plans. */
rlx_status rlx_model_set_seq_cap(struct rlx_model *m, int64_t cap);
/* A cached run of a model with the LM head (rlx_seq_logits_cached: a prompt, a next turn) goes
 * through at most `chunk` positions per plan run, the later pieces over the cache the earlier ones
 * wrote, as llama.cpp's n_ubatch does: the intermediates' memory is bounded by the chunk instead
 * of growing with the prompt (0: the whole run at once). Default RLX_PREFILL_CHUNK_DEFAULT. */
#define RLX_PREFILL_CHUNK_DEFAULT 512
rlx_status rlx_model_set_prefill_chunk(struct rlx_model *m, int64_t chunk);
/* Soft memory budget for each plan's intermediates (0 = none); hint is appended to refusals. */
void rlx_model_set_memory_budget(struct rlx_model *m, size_t bytes, const char *hint);
/* Batch-invariant plans from now on (or not; default off): every row of a decode step's products
 * gets the bits it gets in a product of its own (rlx_compile_opts.batch_invariant), so a sequence
 * decoded in a batch of any size (rlx_seq_batch_logits, one position each) gets exactly the logits
 * it gets alone, at the price of the batched kernels (on cpu: products of more rows than the
 * decode kernels keep row by row run as several of them). Prompts are not covered: theirs take
 * the prefill kernels and the prefill attention (run a prompt alone to get its own bits).
 * Drops plans. */
void rlx_model_set_batch_invariant(struct rlx_model *m, bool on);
/* Plans time every node from now on (or stop); each sequence keeps the profile of its last run. */
rlx_status rlx_model_set_profiling(struct rlx_model *m, bool on);

const struct rlx_model_config *rlx_model_config(const struct rlx_model *m);
struct rlx_device *rlx_model_device(const struct rlx_model *m);
/* The block: layers [*begin, *end) and its ends (RLX_BLOCK_EMBED | RLX_BLOCK_HEAD). */
void rlx_model_block(const struct rlx_model *m, int64_t *begin, int64_t *end, unsigned *ends);
/* The store's weight count and bytes. */
void rlx_model_weights(const struct rlx_model *m, int *count, size_t *bytes);
/* A file the weights were read from in place (rlx_weights_add_source): every run then fails with
 * RLX_ERR_IO once it is modified in place or truncated. */
rlx_status rlx_model_add_source(struct rlx_model *m, const char *path, uint64_t dev, uint64_t ino, int64_t size,
                                int64_t mtime_ns);

struct rlx_model_stats {
    int64_t prefill_compiles, decode_compiles, plan_hits;
    double compile_seconds;
    int64_t plans_cached;
    size_t planned_bytes; /* the arena of intermediates the cached plans share, as allocated now */
};
void rlx_model_stats(struct rlx_model *m, struct rlx_model_stats *out);
/* Frees compiled decode plans / all plans (they are rebuilt on demand). */
void rlx_model_release_decode_plans(struct rlx_model *m);
void rlx_model_release_plans(struct rlx_model *m);

/* ---------------------------------------------------------------------------------------------
 * Sequences
 *
 * A token history and a KV cache of its own (on the model's device, of its own dtype), sharing the
 * model's weights and plans: cheap to create and fork. Not safe for concurrent use; distinct
 * sequences are (their plan runs take turns on the model). Every failing call leaves the history
 * and the cache as they were.
 * ------------------------------------------------------------------------------------------- */

struct rlx_seq;

/* kv_dtype: RLX_F32, RLX_F16 or RLX_BF16. */
rlx_status rlx_seq_create(struct rlx_model *m, enum rlx_dtype kv_dtype, struct rlx_seq **out);
/* A new sequence with s's history and cache (copied on the device). */
rlx_status rlx_seq_fork(const struct rlx_seq *s, struct rlx_seq **out);
void rlx_seq_free(struct rlx_seq *s);
struct rlx_model *rlx_seq_model(const struct rlx_seq *s);

/* Replaces the history with ids (n >= 1) and empties the cache. */
rlx_status rlx_seq_prefill(struct rlx_seq *s, const int32_t *ids, int64_t n);
/* Forgets the history and empties the cache. */
void rlx_seq_reset(struct rlx_seq *s);
/* Keeps the first n positions of the history and of the cache (n >= 0; larger n changes nothing). */
rlx_status rlx_seq_truncate(struct rlx_seq *s, int64_t n);
/* Appends ids (n >= 1) to the history, all or none (range-checked; RLX_ERR_RANGE past
 * max_position_embeddings). The next cached forward runs only the positions not cached yet. */
rlx_status rlx_seq_append(struct rlx_seq *s, const int32_t *ids, int64_t n);
int64_t rlx_seq_len(const struct rlx_seq *s);
const int32_t *rlx_seq_tokens(const struct rlx_seq *s);
const struct rlx_kv_cache *rlx_seq_kv(const struct rlx_seq *s);

/* Logits (vocab) of the next token after the whole history by recomputing it all (no cache).
 * Owned by the sequence, valid until its next call. */
rlx_status rlx_seq_logits_naive(struct rlx_seq *s, const float **logits);
/* The same through the KV cache: runs only the positions not cached yet (all of them the first
 * time, one per decode step, the new ones after an append); afterwards the cache holds the whole
 * history. */
rlx_status rlx_seq_logits_cached(struct rlx_seq *s, const float **logits);
/* The same for n sequences of one whole model (embedding and head) at once, in one plan (a
 * batch): each runs its positions not cached yet (at most `chunk` of them when chunk > 0: a long
 * prompt enters in pieces between decode steps), over its own cache; every projection and MLP
 * reads its weights once for all of them. Each sequence appears once; all share one KV dtype;
 * 1 <= n <= RLX_MAX_BATCH. logits[b]: sequence b's next-token logits (vocab) (owned by it until
 * its next call) when its run reached the end of its history, NULL when a chunk left positions
 * uncached. A sequence whose cache and logits are current runs nothing. The logits are those each
 * sequence gets alone (the rows of a batch are computed independently, up to the summation order
 * of the kernels). On failure no sequence's history or cache length changes. */
rlx_status rlx_seq_batch_logits(struct rlx_seq *const *seqs, int n, int64_t chunk, const float **logits);
/* Runs the block: an embedding block over its history (hidden must be NULL), recomputed or through
 * the cache as above; a hidden-input block over hidden (n, hidden_size) rows: with cached, positions
 * continuing after the cache (which then grows by n), else positions 0..n-1 (no cache).
 * *out: the logits (1, vocab) of the last position for a block with the head, else hidden rows
 * (rows, hidden_size) of every position run. Owned by the sequence until its next call. */
rlx_status rlx_seq_forward(struct rlx_seq *s, const float *hidden, int64_t n, bool cached, const float **out,
                           int64_t *rows);
/* Samples from logits with draw index `index`, the history (or an explicit one: a pipeline's last
 * block has no token history of its own) as repetition context. */
rlx_status rlx_seq_sample(struct rlx_seq *s, const float *logits, const struct rlx_sample_opts *o, uint64_t index,
                          int32_t *token);
rlx_status rlx_seq_sample_with(struct rlx_seq *s, const float *logits, const struct rlx_sample_opts *o, uint64_t index,
                               const int32_t *history, int64_t n_hist, int32_t *token);
/* Per-op wall time of the sequence's last forward pass (RLX_OP_COUNT entries), when the model
 * profiles. */
rlx_status rlx_seq_last_profile(const struct rlx_seq *s, double *seconds_by_op);

/* The sequence's state (history and filled cache rows) as bytes: a versioned header naming the
 * model's shape, then the tokens, then each layer's K and V rows in the cache dtype. load checks
 * the header against this sequence (RLX_ERR_INVALID naming what differs) and every length against
 * the buffer before changing anything. */
rlx_status rlx_seq_state_size(const struct rlx_seq *s, size_t *bytes);
rlx_status rlx_seq_save(const struct rlx_seq *s, void *buf, size_t bytes);
rlx_status rlx_seq_load(struct rlx_seq *s, const void *buf, size_t bytes);

#endif
