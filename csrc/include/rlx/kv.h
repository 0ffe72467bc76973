/*
 * kv.h - the key/value cache of one sequence, on a device: for every layer a K and a V buffer of
 * (capacity, row) elements of the cache's dtype (f32, f16 or bf16), row = n_kv_heads * head_dim,
 * of which rows [0, len) are filled. Plans read and write it in place (it is bound to their
 * STATE nodes per run): the host never copies it per step.
 *
 * Capacity grows on demand (rlx_kv_cache_reserve), up to the cache's maximum, keeping rows [0, len)
 * (copied on the device). Small caches on host devices keep every layer's K and V in one buffer
 * (each buffer's rows at an offset there; they grow in steps of 64 positions, by an eighth or
 * more, moved in place; the buffer is address space for up to 2 MiB each, committed as rows are
 * written, in whole 2 MiB pages: about the rows of the capacity) so that their rows fill 2 MiB
 * pages; a cache whose buffers reach 2 MiB each, and every cache on other devices, has a buffer
 * per layer's K and V, grown geometrically and reallocated one at a time. Rows past len hold zeros
 * or stale finite rows of the same cache (a plan that reads them masks them).
 * A cache is not safe to use from two threads at once; distinct caches are.
 */
#ifndef RLX_KV_H
#define RLX_KV_H

#include "rlx/rlx.h"

struct rlx_kv_cache;
struct rlx_buffer;

/* A cache for n_layers layers of `row` elements per position, up to max_capacity positions, of
 * dtype f32 / f16 / bf16, with nothing allocated yet. RLX_ERR_INVALID for sizes < 1 or another
 * dtype; RLX_ERR_RANGE when the maximum's byte count would overflow. */
rlx_status rlx_kv_cache_create(struct rlx_device *dev, int64_t n_layers, int64_t row, int64_t max_capacity,
                               enum rlx_dtype dtype, struct rlx_kv_cache **out);
void rlx_kv_cache_free(struct rlx_kv_cache *kv); /* NULL is a no-op */

/* Accessors; 0 for a NULL cache. */
int64_t rlx_kv_cache_len(const struct rlx_kv_cache *kv);
int64_t rlx_kv_cache_capacity(const struct rlx_kv_cache *kv); /* positions allocated now */
int64_t rlx_kv_cache_max_capacity(const struct rlx_kv_cache *kv);
int64_t rlx_kv_cache_row(const struct rlx_kv_cache *kv);
int64_t rlx_kv_cache_layers(const struct rlx_kv_cache *kv);
enum rlx_dtype rlx_kv_cache_dtype(const struct rlx_kv_cache *kv);
/* Bytes of device memory allocated now (all layers, K and V). */
size_t rlx_kv_cache_bytes(const struct rlx_kv_cache *kv);

/* capacity >= n, copying rows [0, len): small caches on host devices (n rows below 2 MiB per
 * buffer) to max(n, capacity * 9 / 8) rounded up to a multiple of 64 (at most the rows below 2 MiB),
 * the rest to max(n, 2 * capacity, 256); capped at the maximum.
 * RLX_ERR_RANGE (nothing changed) when n exceeds the maximum; RLX_ERR_NOMEM when the device is
 * out of memory (len, capacity and every row unchanged; buffers grown before the failure keep
 * their larger allocation, counted by rlx_kv_cache_bytes, until the next reserve or free). */
rlx_status rlx_kv_cache_reserve(struct rlx_kv_cache *kv, int64_t n);

/* len += n after a plan wrote rows [len, len + n) (RLX_ERR_RANGE past the capacity; len
 * unchanged); len = min(len, n) (RLX_ERR_INVALID for n < 0). */
rlx_status rlx_kv_cache_advance(struct rlx_kv_cache *kv, int64_t n);
rlx_status rlx_kv_cache_truncate(struct rlx_kv_cache *kv, int64_t n);

/* The device buffer holding a layer's K (which 0) or V (which 1), its (capacity, row) elements from
 * byte *offset (layers may share one buffer); NULL (*offset 0) for a bad layer / which or before
 * the first reserve. Valid until the next reserve or free. */
struct rlx_buffer *rlx_kv_cache_buffer(struct rlx_kv_cache *kv, int64_t layer, int which, size_t *offset);

/* Rows [row0, row0 + n) of a layer's K (which 0) or V (which 1) to / from host memory, in the
 * cache's dtype: bytes must be n * row * element size. read needs row0 + n <= len; write needs
 * row0 + n <= capacity (it does not change len). */
rlx_status rlx_kv_cache_read(const struct rlx_kv_cache *kv, int64_t layer, int which, int64_t row0, int64_t n,
                             void *dst, size_t bytes);
rlx_status rlx_kv_cache_write(struct rlx_kv_cache *kv, int64_t layer, int which, int64_t row0, int64_t n,
                              const void *src, size_t bytes);
/* dst's rows [0, src len) = src's, layer by layer, on the device; dst's len = src's. Same device,
 * layers, row and dtype; dst grows as needed. */
rlx_status rlx_kv_cache_copy(struct rlx_kv_cache *dst, const struct rlx_kv_cache *src);

#endif
