/*
 * gen.h - what the model (model.c) and its sequences (seq.c) share inside gen/: the model's
 * struct, its plan cache keyed by (kind, SEQ, cache rows, KV dtype) under the policies of model.h,
 * and the lock that makes one model's plan runs take turns. Internal to gen/.
 */
#ifndef RLX_GEN_GEN_H
#define RLX_GEN_GEN_H

#include <pthread.h>
#include <stdatomic.h>

#include "rlx/model.h"
#include "runtime/plan.h"

/* FULL: every position, no cache (the naive recompute); PREFILL / DECODE: positions over the cache
 * from position 0 / after a cached past (the prefill / decode policy decides how they are kept). */
enum plan_kind { KIND_FULL, KIND_PREFILL, KIND_DECODE, KIND_BATCH };
/* BATCH: several sequences advanced by a few positions each over their caches in one plan
 * (rlx_seq_step_batch), keyed by the rows of each; the BATCH_PLANS most recently used are kept. */
#define BATCH_PLANS 16

struct plan_slot {
    struct rlx_plan *plan;
    enum plan_kind kind;
    int64_t seq, rows;       /* key: SEQ and the cache rows read (FULL: 0); -1 = symbolic */
    enum rlx_dtype kv_dtype; /* key */
    bool masked;             /* bucketed: rows past the sequence hidden by masks */
    uint64_t last_used;
    int in_x, in_pos, out_y; /* plan indices: "ids" or "hidden"; "pos"; "logits" or "hidden" */
    int *k_state, *v_state;  /* (batch or 1, n_layers) plan state indices (cached kinds) */
    int n_masks;
    int mask_in[RLX_MAX_WINDOWS]; /* plan input indices */
    int64_t mask_w[RLX_MAX_WINDOWS];
    int batch;                   /* BATCH: sequences (key) */
    int64_t segs[RLX_MAX_BATCH]; /* BATCH: the rows each advances (key) */
    int past_sym[RLX_MAX_BATCH]; /* BATCH: symbol of each one's cached past */
};

struct rlx_model {
    struct rlx_model_config cfg;
    struct rlx_device *dev; /* borrowed */
    int64_t layer_begin, layer_end;
    unsigned ends; /* RLX_BLOCK_EMBED | RLX_BLOCK_HEAD */
    struct rlx_weights *weights;
    struct rlx_param_info *params; /* (n_params) what the block reads */
    int n_params;
    enum rlx_plan_policy prefill_policy, decode_policy;
    int64_t prefill_capacity, max_past, seq_cap;
    int64_t prefill_chunk; /* a cached run of a block with the head: at most this many positions a plan run */
    size_t memory_budget;
    bool batch_invariant; /* plans compiled batch-invariant (rlx_model_set_batch_invariant) */
    char budget_hint[256];
    struct plan_slot *slots; /* (n_slots) compiled plans */
    int n_slots, cap_slots;
    struct rlx_shared_arena arena; /* the plans' intermediates: they run one at a time, so they share
                                      one arena of the largest run's size (released with any plan) */
    uint64_t clock;                /* use counter for LRU */
    struct rlx_model_stats stats;
    bool profiling;
    int32_t *batch_ids;  /* scratch of batch runs: (2, rows) ids and positions */
    float *batch_logits; /* scratch of batch runs: (batch, V) */
    size_t batch_ids_bytes, batch_logits_bytes;
    pthread_mutex_t lock; /* held for every plan lookup, compile and run (and the batch scratch) */
    atomic_int n_seqs;    /* live sequences: rlx_model_free asserts none */
};

void rlx_model_lock(struct rlx_model *m);
void rlx_model_unlock(struct rlx_model *m);
/* The plan for `kind` over n positions after `past` cached ones with a cache of kv_dtype, compiled
 * on a miss (the lock must be held). */
rlx_status rlx_model_plan(struct rlx_model *m, enum plan_kind kind, int64_t n, int64_t past, enum rlx_dtype kv_dtype,
                          struct plan_slot **out);
/* The BATCH plan for `batch` sequences advancing segs[b] rows each (lock held). */
rlx_status rlx_model_batch_plan(struct rlx_model *m, int batch, const int64_t *segs, enum rlx_dtype kv_dtype,
                                struct plan_slot **out);

#endif
