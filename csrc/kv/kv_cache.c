/*
 * kv_cache.c - the per-stream key/value cache (contract: rlx/kv.h). It reserves the address space
 * for the full capacity of every layer in one anonymous MAP_NORESERVE mapping at creation, so the
 * kernel commits pages only as rows are written, nothing is ever reallocated per step, and every
 * pointer handed out stays put until rlx_kv_cache_free. It must never remap, move or shrink the
 * mapping while the cache lives (callers hold NumPy views into it), and never print or exit.
 *
 * Layout: one mapping of n_layers * 2 blocks of (capacity, row) f32, in the order
 * K[0], V[0], K[1], V[1], ...; block b starts at base + b * capacity * row floats.
 */
#include "rlx/kv.h"

#include <stdlib.h>
#include <sys/mman.h>

#include "core/core.h"

struct rlx_kv_cache {
    int64_t n_layers;
    int64_t row;       /* floats per cached position: n_kv_heads * head_dim */
    int64_t capacity;  /* positions reserved per layer */
    int64_t len;       /* positions filled, in [0, capacity] */
    float *base;       /* (n_layers, 2, capacity, row): K then V of each layer */
    size_t bytes;      /* size of the mapping at base */
};

rlx_status rlx_kv_cache_create(int64_t n_layers, int64_t row, int64_t capacity, struct rlx_kv_cache **out) {
    if (!out)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: out is NULL");
    if (n_layers < 1 || row < 1 || capacity < 1)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: n_layers, row and capacity must be >= 1, got %lld, %lld, %lld",
                             (long long)n_layers, (long long)row, (long long)capacity);
    /* floats = n_layers * 2 * capacity * row, and bytes = floats * 4, must both fit. */
    const uint64_t limit = (uint64_t)(SIZE_MAX < INT64_MAX ? SIZE_MAX : INT64_MAX) / sizeof(float);
    uint64_t floats = (uint64_t)capacity;
    if (floats > limit / (uint64_t)row || (floats *= (uint64_t)row) > limit / 2 ||
        (floats *= 2) > limit / (uint64_t)n_layers)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: %lld layers x 2 x %lld positions x %lld floats overflows",
                             (long long)n_layers, (long long)capacity, (long long)row);
    floats *= (uint64_t)n_layers;
    size_t bytes = (size_t)floats * sizeof(float);

    struct rlx_kv_cache *kv = rlx_calloc(1, sizeof *kv);
    if (!kv)
        return RLX_ERR_NOMEM;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        free(kv);
        return rlx_set_error(RLX_ERR_NOMEM, "kv cache: cannot reserve %zu bytes (%lld layers x 2 x %lld x %lld f32)",
                             bytes, (long long)n_layers, (long long)capacity, (long long)row);
    }
    kv->n_layers = n_layers;
    kv->row = row;
    kv->capacity = capacity;
    kv->len = 0;
    kv->base = p;
    kv->bytes = bytes;
    *out = kv;
    return RLX_OK;
}

void rlx_kv_cache_free(struct rlx_kv_cache *kv) {
    if (!kv)
        return;
    munmap(kv->base, kv->bytes);
    free(kv);
}

int64_t rlx_kv_cache_len(const struct rlx_kv_cache *kv) { return kv ? kv->len : 0; }
int64_t rlx_kv_cache_capacity(const struct rlx_kv_cache *kv) { return kv ? kv->capacity : 0; }
int64_t rlx_kv_cache_row(const struct rlx_kv_cache *kv) { return kv ? kv->row : 0; }
int64_t rlx_kv_cache_layers(const struct rlx_kv_cache *kv) { return kv ? kv->n_layers : 0; }

/* Block b of the layout: (capacity, row). */
static float *block(struct rlx_kv_cache *kv, int64_t b) {
    return kv->base + (size_t)b * (size_t)kv->capacity * (size_t)kv->row;
}

float *rlx_kv_cache_k(struct rlx_kv_cache *kv, int64_t layer) {
    if (!kv || layer < 0 || layer >= kv->n_layers)
        return NULL;
    return block(kv, 2 * layer);
}

float *rlx_kv_cache_v(struct rlx_kv_cache *kv, int64_t layer) {
    if (!kv || layer < 0 || layer >= kv->n_layers)
        return NULL;
    return block(kv, 2 * layer + 1);
}

rlx_status rlx_kv_cache_slot(struct rlx_kv_cache *kv, int64_t layer, int64_t n, float **k_out, float **v_out) {
    if (!kv)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: cache is NULL");
    if (layer < 0 || layer >= kv->n_layers)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: layer %lld is outside [0, %lld)",
                             (long long)layer, (long long)kv->n_layers);
    if (n < 0)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: slot of %lld rows (must be >= 0)", (long long)n);
    if (n > kv->capacity - kv->len)
        return rlx_set_error(RLX_ERR_RANGE, "kv cache: %lld new rows after %lld exceed the capacity %lld",
                             (long long)n, (long long)kv->len, (long long)kv->capacity);
    size_t off = (size_t)kv->len * (size_t)kv->row;
    if (k_out)
        *k_out = block(kv, 2 * layer) + off;
    if (v_out)
        *v_out = block(kv, 2 * layer + 1) + off;
    return RLX_OK;
}

rlx_status rlx_kv_cache_advance(struct rlx_kv_cache *kv, int64_t n) {
    if (!kv)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: cache is NULL");
    if (n < 0)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: advance by %lld rows (must be >= 0)", (long long)n);
    if (n > kv->capacity - kv->len)
        return rlx_set_error(RLX_ERR_RANGE, "kv cache: advancing %lld rows after %lld exceeds the capacity %lld",
                             (long long)n, (long long)kv->len, (long long)kv->capacity);
    kv->len += n;
    return RLX_OK;
}

rlx_status rlx_kv_cache_truncate(struct rlx_kv_cache *kv, int64_t n) {
    if (!kv)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: cache is NULL");
    if (n < 0)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: truncate to %lld rows (must be >= 0)", (long long)n);
    if (n < kv->len)
        kv->len = n;
    return RLX_OK;
}
