/*
 * sample.h - choosing the next token from a row of logits.
 *
 * Randomness is counter-based: the uniform number used for a draw is a pure function of
 * (seed, sample_index), so the same seed gives the same tokens however generation is chunked.
 */
#ifndef RLX_SAMPLE_H
#define RLX_SAMPLE_H

#include "rlx/rlx.h"

struct rlx_sample_opts {
    float temperature;        /* 0 = greedy (argmax, lowest id on ties); must be >= 0 */
    int32_t top_k;            /* 0 = off; keep the k most likely */
    float top_p;              /* 1 = off; keep the smallest most-likely set whose mass >= top_p, (0, 1] */
    float min_p;              /* 0 = off; keep tokens with p >= min_p * p_max, [0, 1] */
    float repetition_penalty; /* 1 = off; > 0; logits of tokens in the history: l > 0 ? l / r : l * r */
    uint64_t seed;
};

/* temperature 0, top_k 0, top_p 1, min_p 0, repetition_penalty 1, seed 0 */
struct rlx_sample_opts rlx_sample_opts_greedy(void);
/* RLX_ERR_INVALID naming the field if an option is out of range. */
rlx_status rlx_sample_opts_check(const struct rlx_sample_opts *o);

/* The uniform double in [0, 1) for draw `index` under `seed` (a counter-based hash). */
double rlx_rng_uniform(uint64_t seed, uint64_t index);

/* Floats of scratch rlx_sample needs for a vocabulary of n (it also needs n int32 of idx). */
size_t rlx_sample_scratch_floats(int64_t vocab);

/* Picks a token from logits (vocab) - not modified. Order of processing: repetition penalty over
 * the distinct ids of history (n_hist, may be NULL when 0), then greedy if temperature == 0, else
 * temperature, top_k, softmax, top_p, min_p, renormalise, and draw with
 * rlx_rng_uniform(seed, sample_index). scratch: rlx_sample_scratch_floats(vocab) floats; idx: vocab
 * int32. Never allocates. Errors: bad options (RLX_ERR_INVALID), vocab < 1, non-finite logits
 * everywhere (RLX_ERR_RANGE). */
rlx_status rlx_sample(const float *logits, int64_t vocab, const struct rlx_sample_opts *o, const int32_t *history,
                      int64_t n_hist, uint64_t sample_index, float *scratch, int32_t *idx, int32_t *out_token);

#endif
