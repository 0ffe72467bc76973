/*
 * kv_cache.c - the per-sequence key/value cache (contract: rlx/kv.h), in device memory. Each layer
 * has a K and a V buffer of (capacity, row) elements; plans bind them as states and write new rows
 * in place, so the host never sees them per step. Two layouts by size:
 *   - small (host devices, while a buffer's rows fill less than a 2 MiB page): every buffer in one
 *     mapping, the arena, buffer b's rows from b * capacity * row_bytes. Capacity grows by an eighth
 *     or more, in steps of SMALL_STEP positions, and the rows move up in place (back to front);
 *     the arena's whole 2 MiB pages go to huge pages, which one buffer each could not fill. Why:
 *     the decode attention reads every row each step, through 4 KiB pages at 13-15 GB/s and
 *     through 2 MiB pages at 23-25 (Zen 4, one thread, a C harness over Qwen3-0.6B's 28 layers'
 *     f16 caches); Qwen3-0.6B below 1024 positions and Llama-3.2-1B below 2048 had every buffer in
 *     4 KiB pages (benchmarks/README.md, "small caches in one mapping").
 *   - one buffer each (device memory, and past the small layout): capacity grows geometrically (at
 *     least MIN_CAPACITY positions, doubling, capped at the maximum), copying the filled rows on the
 *     device one buffer at a time (allocate, copy, free the old one), so a growth holds one layer's
 *     K or V twice, not the whole cache (Qwen3-0.6B, f16, growing past 16384 positions: 32 MiB more
 *     at the peak instead of 1792 MiB); leaving the arena, each buffer's rows are given back
 *     (rlx_dev_discard) once copied out.
 * On host devices the memory is lazily committed mappings, so a cache costs the pages its rows
 * touch (in the arena's 2 MiB pages that is about the rows of its capacity); before a step writes
 * its rows the cache tells the device which rows it will hold (rlx_dev_settle), and host devices
 * move the whole 2 MiB pages of them to huge pages (host.c).
 * Never prints or exits; every size is computed with checked arithmetic.
 */
#include "rlx/kv.h"

#include <stdlib.h>

#include "backends/backend.h"
#include "core/core.h"

#define MIN_CAPACITY 256
#define SMALL_BYTES  ((size_t)2 << 20) /* a buffer below this many bytes lives in the arena */
#define SMALL_STEP   64                /* the arena's capacity: a multiple of this many positions */

struct rlx_kv_cache {
    struct rlx_device *dev; /* borrowed */
    int64_t n_layers;
    int64_t row;      /* elements per cached position: n_kv_heads * head_dim */
    int64_t capacity; /* positions allocated per layer */
    int64_t max_capacity;
    int64_t len; /* positions filled, in [0, capacity] */
    enum rlx_dtype dtype;
    size_t row_bytes;         /* bytes of one position of one layer's K (or V) */
    struct rlx_buffer **buf;  /* (n_layers, 2): K then V of each layer, (buf_cap[b], row) each; NULL
                                while the arena holds them */
    int64_t *buf_cap;         /* (n_layers, 2): positions of each buffer, >= capacity (more where a
                                growth failed part way) */
    struct rlx_buffer *arena; /* the small layout: (n_layers * 2, capacity, row), room for
                                 (n_layers * 2, arena_max, row); NULL otherwise */
    int64_t arena_max;        /* the most positions per buffer the arena takes; 0: no arena */
};

rlx_status rlx_kv_cache_create(struct rlx_device *dev, int64_t n_layers, int64_t row, int64_t max_capacity,
                               enum rlx_dtype dtype, struct rlx_kv_cache **out)
{
    if (!dev || !out) return rlx_set_error(RLX_ERR_INVALID, "kv cache: no device");
    if (n_layers < 1 || row < 1 || max_capacity < 1)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: n_layers, row and capacity must be >= 1, got %lld, %lld, %lld",
                             (long long)n_layers, (long long)row, (long long)max_capacity);
    if (dtype != RLX_F32 && dtype != RLX_F16 && dtype != RLX_BF16)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: dtype must be f32, f16 or bf16, got %s",
                             rlx_dtype_name(dtype));
    size_t row_bytes, layer_bytes, total;
    if (rlx_dtype_bytes(dtype, row, &row_bytes) != RLX_OK ||
        !rlx_size_mul(row_bytes, (size_t)max_capacity, &layer_bytes) ||
        !rlx_size_mul(layer_bytes, (size_t)n_layers * 2, &total))
        return rlx_set_error(RLX_ERR_RANGE, "kv cache: %lld layers x 2 x %lld positions x %lld %s overflows",
                             (long long)n_layers, (long long)max_capacity, (long long)row, rlx_dtype_name(dtype));
    struct rlx_kv_cache *kv = rlx_calloc(1, sizeof *kv);
    if (!kv) return RLX_ERR_NOMEM;
    kv->buf = rlx_calloc((size_t)n_layers * 2, sizeof *kv->buf);
    kv->buf_cap = rlx_calloc((size_t)n_layers * 2, sizeof *kv->buf_cap);
    if (!kv->buf || !kv->buf_cap) {
        free(kv->buf);
        free(kv->buf_cap);
        free(kv);
        return RLX_ERR_NOMEM;
    }
    kv->dev = dev;
    kv->n_layers = n_layers;
    kv->row = row;
    kv->max_capacity = max_capacity;
    kv->dtype = dtype;
    kv->row_bytes = row_bytes;
    if (rlx_dev_settles(dev)) {
        const int64_t fit = (int64_t)((SMALL_BYTES - 1) / row_bytes);
        kv->arena_max = fit < max_capacity ? fit : max_capacity;
    }
    *out = kv;
    return RLX_OK;
}

void rlx_kv_cache_free(struct rlx_kv_cache *kv)
{
    if (!kv) return;
    for (int64_t b = 0; b < kv->n_layers * 2; b++) rlx_dev_free(kv->dev, kv->buf[b]);
    rlx_dev_free(kv->dev, kv->arena);
    free(kv->buf);
    free(kv->buf_cap);
    free(kv);
}

int64_t rlx_kv_cache_len(const struct rlx_kv_cache *kv) { return kv ? kv->len : 0; }
int64_t rlx_kv_cache_capacity(const struct rlx_kv_cache *kv) { return kv ? kv->capacity : 0; }
int64_t rlx_kv_cache_max_capacity(const struct rlx_kv_cache *kv) { return kv ? kv->max_capacity : 0; }
int64_t rlx_kv_cache_row(const struct rlx_kv_cache *kv) { return kv ? kv->row : 0; }
int64_t rlx_kv_cache_layers(const struct rlx_kv_cache *kv) { return kv ? kv->n_layers : 0; }
enum rlx_dtype rlx_kv_cache_dtype(const struct rlx_kv_cache *kv) { return kv ? kv->dtype : RLX_F32; }

size_t rlx_kv_cache_bytes(const struct rlx_kv_cache *kv)
{
    /* fits: every buf_cap <= max_capacity, whose total was checked at creation */
    size_t n = 0;
    for (int64_t b = 0; kv && b < kv->n_layers * 2; b++) n += kv->row_bytes * (size_t)kv->buf_cap[b];
    return n;
}

/* Rows [0, n) are about to be held: their whole 2 MiB pages go to huge pages (host devices), the
 * ones already written in small pages one buffer a call (a move costs milliseconds); in the arena,
 * every buffer's rows (the extent of all of them: rows past len are few there). */
static void settle(struct rlx_kv_cache *kv, int64_t n)
{
    const int64_t nb = kv->n_layers * 2;
    if (kv->arena) {
        (void)rlx_dev_settle(kv->dev, kv->arena, kv->row_bytes * (size_t)(nb * kv->capacity), true);
        return;
    }
    bool move = true;
    for (int64_t b = 0; b < nb; b++)
        if (rlx_dev_settle(kv->dev, kv->buf[b], kv->row_bytes * (size_t)n, move)) move = false;
}

/* The small layout, capacity -> cap (<= arena_max): buffer b's rows [0, len) move from b * capacity
 * to b * cap rows, the last buffer first, each in pieces from its end no longer than the distance,
 * so no copy overlaps itself or a row not yet moved. Host copies (the only devices with an arena)
 * do not fail; a failure would leave the rows moved so far, and is returned. */
static rlx_status grow_arena(struct rlx_kv_cache *kv, int64_t cap)
{
    const int64_t nb = kv->n_layers * 2;
    const size_t rb = kv->row_bytes;
    if (!kv->arena) {
        rlx_status s = rlx_dev_alloc(kv->dev, rb * (size_t)(nb * kv->arena_max), &kv->arena);
        if (s != RLX_OK) return rlx_error_context(s, "kv cache: %lld positions", (long long)cap);
    }
    const int64_t old = kv->capacity;
    kv->capacity = cap; /* settle the new extent first: the rows moved into it fault in huge pages */
    settle(kv, cap);
    for (int64_t b = nb - 1; b > 0 && kv->len; b--) {
        const size_t from = rb * (size_t)(b * old), to = rb * (size_t)(b * cap), gap = to - from;
        for (size_t left = rb * (size_t)kv->len; left;) {
            const size_t piece = left < gap ? left : gap;
            left -= piece;
            RLX_TRY(rlx_dev_copy(kv->dev, kv->arena, to + left, kv->arena, from + left, piece));
        }
    }
    for (int64_t b = 0; b < nb; b++) kv->buf_cap[b] = cap;
    return RLX_OK;
}

/* Out of the arena into one buffer each of cap positions: all allocated first (a failure frees
 * them and leaves the arena as it was), then each buffer's rows copied (host copies do not fail)
 * and their arena bytes given back, so the move holds about one buffer twice; then the arena freed. */
static rlx_status leave_arena(struct rlx_kv_cache *kv, int64_t cap, int64_t n)
{
    const int64_t nb = kv->n_layers * 2;
    const size_t rb = kv->row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        rlx_status s = rlx_dev_alloc(kv->dev, rb * (size_t)cap, &kv->buf[b]);
        if (s != RLX_OK) {
            for (int64_t c = 0; c <= b; c++) rlx_dev_free(kv->dev, kv->buf[c]), kv->buf[c] = NULL;
            return rlx_error_context(s, "kv cache: growing to %lld positions", (long long)cap);
        }
    }
    for (int64_t b = 0; b < nb; b++) {
        (void)rlx_dev_settle(kv->dev, kv->buf[b], rb * (size_t)n, true);
        RLX_TRY(rlx_dev_copy(kv->dev, kv->buf[b], 0, kv->arena, rb * (size_t)(b * kv->capacity), rb * (size_t)kv->len));
        rlx_dev_discard(kv->dev, kv->arena, rb * (size_t)(b * kv->capacity), rb * (size_t)kv->capacity);
        kv->buf_cap[b] = cap;
    }
    rlx_dev_free(kv->dev, kv->arena);
    kv->arena = NULL;
    kv->capacity = cap;
    settle(kv, n);
    return RLX_OK;
}

rlx_status rlx_kv_cache_reserve(struct rlx_kv_cache *kv, int64_t n)
{
    if (n <= kv->capacity) {
        settle(kv, n);
        return RLX_OK;
    }
    if (n > kv->max_capacity)
        return rlx_set_error(RLX_ERR_RANGE, "kv cache: %lld positions exceed its maximum of %lld", (long long)n,
                             (long long)kv->max_capacity);
    if (n <= kv->arena_max && (kv->arena || kv->capacity == 0)) {
        int64_t cap = kv->capacity + kv->capacity / 8;
        cap = cap < n ? n : cap;
        cap = (cap + SMALL_STEP - 1) / SMALL_STEP * SMALL_STEP;
        return grow_arena(kv, cap < kv->arena_max ? cap : kv->arena_max);
    }
    int64_t cap = kv->capacity * 2 > MIN_CAPACITY ? kv->capacity * 2 : MIN_CAPACITY;
    cap = cap < n ? n : cap;
    cap = cap > kv->max_capacity ? kv->max_capacity : cap;
    if (kv->arena) return leave_arena(kv, cap, n);
    /* Buffer by buffer: at most one is held twice. A failure leaves len, capacity and every row
     * as they were; the buffers grown before it keep their size (buf_cap) and are skipped next time. */
    for (int64_t b = 0; b < kv->n_layers * 2; b++) {
        if (kv->buf_cap[b] >= cap) continue;
        struct rlx_buffer *fresh = NULL;
        rlx_status s = rlx_dev_alloc(kv->dev, kv->row_bytes * (size_t)cap, &fresh);
        /* before the copy: nothing written yet, so nothing to move (the pages fault in huge), and marked
         * so: a later step's one move is not spent on these pages */
        if (s == RLX_OK) rlx_dev_settle(kv->dev, fresh, kv->row_bytes * (size_t)n, true);
        if (s == RLX_OK && kv->buf[b] && kv->len)
            s = rlx_dev_copy(kv->dev, fresh, 0, kv->buf[b], 0, kv->row_bytes * (size_t)kv->len);
        if (s != RLX_OK) {
            rlx_dev_free(kv->dev, fresh);
            return rlx_error_context(s, "kv cache: growing to %lld positions", (long long)cap);
        }
        rlx_dev_free(kv->dev, kv->buf[b]);
        kv->buf[b] = fresh;
        kv->buf_cap[b] = cap;
    }
    kv->capacity = cap;
    settle(kv, n);
    return RLX_OK;
}

rlx_status rlx_kv_cache_advance(struct rlx_kv_cache *kv, int64_t n)
{
    if (n < 0) return rlx_set_error(RLX_ERR_INVALID, "kv cache: advance by %lld rows (must be >= 0)", (long long)n);
    if (n > kv->capacity - kv->len)
        return rlx_set_error(RLX_ERR_RANGE, "kv cache: advancing %lld rows after %lld exceeds the capacity %lld",
                             (long long)n, (long long)kv->len, (long long)kv->capacity);
    kv->len += n;
    return RLX_OK;
}

rlx_status rlx_kv_cache_truncate(struct rlx_kv_cache *kv, int64_t n)
{
    if (n < 0) return rlx_set_error(RLX_ERR_INVALID, "kv cache: truncate to %lld rows (must be >= 0)", (long long)n);
    if (n < kv->len) kv->len = n;
    return RLX_OK;
}

/* Buffer b's memory and the byte offset of its row 0 there. */
static struct rlx_buffer *where(const struct rlx_kv_cache *kv, int64_t b, size_t *offset)
{
    *offset = kv->arena ? kv->row_bytes * (size_t)(b * kv->capacity) : 0;
    return kv->arena ? kv->arena : kv->buf[b];
}

struct rlx_buffer *rlx_kv_cache_buffer(struct rlx_kv_cache *kv, int64_t layer, int which, size_t *offset)
{
    *offset = 0;
    if (!kv || layer < 0 || layer >= kv->n_layers || (which != 0 && which != 1)) return NULL;
    return where(kv, layer * 2 + which, offset);
}

/* Checks a row range of one buffer and the host byte count; returns the byte offset. */
static rlx_status rows_at(const struct rlx_kv_cache *kv, int64_t layer, int which, int64_t row0, int64_t n,
                          int64_t limit, size_t bytes, size_t *offset)
{
    if (layer < 0 || layer >= kv->n_layers || (which != 0 && which != 1))
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: layer %lld / which %d outside [0, %lld) / {0, 1}",
                             (long long)layer, which, (long long)kv->n_layers);
    if (row0 < 0 || n < 0 || n > limit - row0)
        return rlx_set_error(RLX_ERR_RANGE, "kv cache: rows [%lld, %lld) outside [0, %lld)", (long long)row0,
                             (long long)(row0 + n), (long long)limit);
    if (bytes != kv->row_bytes * (size_t)n)
        return rlx_set_error(RLX_ERR_SHAPE, "kv cache: %lld rows hold %zu bytes, got %zu", (long long)n,
                             kv->row_bytes * (size_t)n, bytes);
    *offset = kv->row_bytes * (size_t)row0;
    return RLX_OK;
}

rlx_status rlx_kv_cache_read(const struct rlx_kv_cache *kv, int64_t layer, int which, int64_t row0, int64_t n,
                             void *dst, size_t bytes)
{
    size_t off, base;
    RLX_TRY(rows_at(kv, layer, which, row0, n, kv->len, bytes, &off));
    const struct rlx_buffer *b = where(kv, layer * 2 + which, &base);
    return n ? rlx_dev_download(kv->dev, b, base + off, dst, bytes) : RLX_OK;
}

rlx_status rlx_kv_cache_write(struct rlx_kv_cache *kv, int64_t layer, int which, int64_t row0, int64_t n,
                              const void *src, size_t bytes)
{
    size_t off, base;
    RLX_TRY(rows_at(kv, layer, which, row0, n, kv->capacity, bytes, &off));
    struct rlx_buffer *b = where(kv, layer * 2 + which, &base);
    return n ? rlx_dev_upload(kv->dev, b, base + off, src, bytes) : RLX_OK;
}

rlx_status rlx_kv_cache_copy(struct rlx_kv_cache *dst, const struct rlx_kv_cache *src)
{
    if (dst->dev != src->dev || dst->n_layers != src->n_layers || dst->row != src->row || dst->dtype != src->dtype)
        return rlx_set_error(RLX_ERR_INVALID, "kv cache: copying between caches of different devices or shapes");
    RLX_TRY(rlx_kv_cache_reserve(dst, src->len));
    for (int64_t b = 0; b < src->n_layers * 2 && src->len; b++) {
        size_t to, from;
        struct rlx_buffer *d = where(dst, b, &to);
        const struct rlx_buffer *s = where(src, b, &from);
        RLX_TRY(rlx_dev_copy(dst->dev, d, to, s, from, src->row_bytes * (size_t)src->len));
    }
    dst->len = src->len;
    return RLX_OK;
}
