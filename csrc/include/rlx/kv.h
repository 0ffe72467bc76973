/*
 * kv.h - the key/value cache of one generation stream: for every layer a K and a V buffer of
 * (capacity, row) f32, row = n_kv_heads * head_dim, of which rows [0, len) are filled.
 *
 * The whole capacity is reserved once at creation; pages are committed only when first written.
 * Pointers returned by rlx_kv_cache_k / _v / _slot stay valid (and never move) until
 * rlx_kv_cache_free, so views of them (NumPy arrays) may be kept. Truncation only lowers len; the
 * rows past len keep their stale contents and are overwritten by later slots.
 * A cache is not safe to use from two threads at once; distinct caches are.
 */
#ifndef RLX_KV_H
#define RLX_KV_H

#include "rlx/rlx.h"

struct rlx_kv_cache;

/* RLX_ERR_INVALID if n_layers, row or capacity < 1 or the total byte count overflows;
 * RLX_ERR_NOMEM (with the byte count) if the address space cannot be reserved. */
rlx_status rlx_kv_cache_create(int64_t n_layers, int64_t row, int64_t capacity, struct rlx_kv_cache **out);
void rlx_kv_cache_free(struct rlx_kv_cache *kv);   /* NULL is a no-op */

/* Accessors; 0 for a NULL cache. */
int64_t rlx_kv_cache_len(const struct rlx_kv_cache *kv);
int64_t rlx_kv_cache_capacity(const struct rlx_kv_cache *kv);
int64_t rlx_kv_cache_row(const struct rlx_kv_cache *kv);
int64_t rlx_kv_cache_layers(const struct rlx_kv_cache *kv);

/* K or V of a layer: (capacity, row), rows [0, len) filled. NULL if kv is NULL or layer is not in
 * [0, n_layers). */
float *rlx_kv_cache_k(struct rlx_kv_cache *kv, int64_t layer);
float *rlx_kv_cache_v(struct rlx_kv_cache *kv, int64_t layer);

/* Where the next n rows of a layer go: rows [len, len + n) of K and of V, (n, row) each. Either
 * out-pointer may be NULL. RLX_ERR_INVALID for a bad layer or n < 0; RLX_ERR_RANGE if
 * len + n > capacity. Writing a slot does not change len; rlx_kv_cache_advance does. */
rlx_status rlx_kv_cache_slot(struct rlx_kv_cache *kv, int64_t layer, int64_t n, float **k_out, float **v_out);

/* Commits n rows written into every layer's slot: len += n. RLX_ERR_INVALID if n < 0;
 * RLX_ERR_RANGE (len unchanged) if len + n > capacity. */
rlx_status rlx_kv_cache_advance(struct rlx_kv_cache *kv, int64_t n);

/* len = min(len, n). RLX_ERR_INVALID if n < 0. */
rlx_status rlx_kv_cache_truncate(struct rlx_kv_cache *kv, int64_t n);

#endif
