/*
 * test_kv.c - standalone checks of the KV cache (rlx/kv.h): creation and its argument checks,
 * slots, advance, truncate, overflow past capacity, writing rows and reading them back, and
 * pointers that stay put for the cache's lifetime. It prints one line per failed check and ends
 * with "N passed, M failed"; it exits non-zero if anything failed. It must never depend on
 * anything but the public headers and the C library.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rlx/kv.h"

#include "check.h"

/* The value stored at (layer, position, column) of K (kv = 0) or V (kv = 1). */
static float val(int64_t layer, int kv, int64_t pos, int64_t col) {
    return (float)(layer * 100000 + kv * 50000 + pos * 100 + col);
}

static void test_create(void) {
    struct rlx_kv_cache *kv = (struct rlx_kv_cache *)&check_passed; /* must stay untouched on error */
    struct rlx_kv_cache *const sentinel = kv;
    CHECK(rlx_kv_cache_create(0, 8, 16, &kv) == RLX_ERR_INVALID && kv == sentinel, "n_layers 0 rejected");
    CHECK(rlx_kv_cache_create(2, 0, 16, &kv) == RLX_ERR_INVALID && kv == sentinel, "row 0 rejected");
    CHECK(rlx_kv_cache_create(2, 8, -1, &kv) == RLX_ERR_INVALID && kv == sentinel, "capacity -1 rejected");
    CHECK(rlx_kv_cache_create(2, INT64_MAX / 2, 4, &kv) == RLX_ERR_INVALID && kv == sentinel,
          "capacity * row overflow rejected");
    CHECK(rlx_kv_cache_create(INT64_MAX / 4, 1 << 20, 1 << 20, &kv) == RLX_ERR_INVALID && kv == sentinel,
          "total size overflow rejected");
    CHECK(rlx_kv_cache_create(1, 8, 8, NULL) == RLX_ERR_INVALID, "NULL out rejected");
    /* 2^48 bytes: representable, but beyond a 47-bit user address space. */
    rlx_status s = rlx_kv_cache_create(1, (int64_t)1 << 20, (int64_t)1 << 25, &kv);
    CHECK(s == RLX_ERR_NOMEM && kv == sentinel && strstr(rlx_last_error(), "281474976710656") != NULL,
          "an impossible reservation -> RLX_ERR_NOMEM with the byte count (%d: %s)", s, rlx_last_error());
    if (s == RLX_OK)
        rlx_kv_cache_free(kv);
    rlx_kv_cache_free(NULL);
    CHECK(rlx_kv_cache_len(NULL) == 0 && rlx_kv_cache_k(NULL, 0) == NULL, "NULL cache accessors");
}

static void test_use(void) {
    const int64_t layers = 3, row = 8, cap = 10;
    struct rlx_kv_cache *kv = NULL;
    CHECK(rlx_kv_cache_create(layers, row, cap, &kv) == RLX_OK && kv, "create");
    if (!kv)
        return;
    CHECK(rlx_kv_cache_len(kv) == 0 && rlx_kv_cache_capacity(kv) == cap && rlx_kv_cache_row(kv) == row &&
              rlx_kv_cache_layers(kv) == layers, "accessors");
    float *k0[3], *v0[3];
    for (int64_t l = 0; l < layers; l++) {
        k0[l] = rlx_kv_cache_k(kv, l);
        v0[l] = rlx_kv_cache_v(kv, l);
    }
    CHECK(k0[0] && v0[0] && k0[0] != v0[0] && k0[1] != k0[0], "distinct buffers");
    CHECK(rlx_kv_cache_k(kv, layers) == NULL && rlx_kv_cache_v(kv, -1) == NULL, "bad layer -> NULL");

    /* Prefill 4 rows, then decode 1 row at a time up to capacity. */
    int64_t steps[] = {4, 1, 1, 1, 1, 1, 1};
    int64_t pos = 0;
    int ok_slot = 1;
    for (size_t st = 0; st < sizeof steps / sizeof steps[0]; st++) {
        int64_t n = steps[st];
        for (int64_t l = 0; l < layers; l++) {
            float *k = NULL, *v = NULL;
            ok_slot &= rlx_kv_cache_slot(kv, l, n, &k, &v) == RLX_OK;
            ok_slot &= k == k0[l] + pos * row && v == v0[l] + pos * row;
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < row; c++) {
                    k[i * row + c] = val(l, 0, pos + i, c);
                    v[i * row + c] = val(l, 1, pos + i, c);
                }
        }
        ok_slot &= rlx_kv_cache_len(kv) == pos; /* writing a slot does not advance */
        ok_slot &= rlx_kv_cache_advance(kv, n) == RLX_OK;
        pos += n;
        ok_slot &= rlx_kv_cache_len(kv) == pos;
    }
    CHECK(ok_slot && pos == cap, "slots land at len and advance commits (pos %lld)", (long long)pos);

    int same = 1;
    for (int64_t l = 0; l < layers; l++) {
        same &= rlx_kv_cache_k(kv, l) == k0[l] && rlx_kv_cache_v(kv, l) == v0[l];
        for (int64_t p = 0; p < cap; p++)
            for (int64_t c = 0; c < row; c++)
                same &= k0[l][p * row + c] == val(l, 0, p, c) && v0[l][p * row + c] == val(l, 1, p, c);
    }
    CHECK(same, "read back every row; pointers stable");

    /* Full: slot and advance refuse, state unchanged. */
    float *k = (float *)&same, *v = (float *)&same;
    CHECK(rlx_kv_cache_slot(kv, 0, 1, &k, &v) == RLX_ERR_RANGE && k == (float *)&same, "slot past capacity");
    CHECK(rlx_kv_cache_slot(kv, 0, 0, &k, NULL) == RLX_OK && k == k0[0] + cap * row, "empty slot at the end");
    CHECK(rlx_kv_cache_advance(kv, 1) == RLX_ERR_RANGE && rlx_kv_cache_len(kv) == cap, "advance past capacity");
    CHECK(rlx_kv_cache_slot(kv, layers, 0, &k, &v) == RLX_ERR_INVALID, "slot bad layer");
    CHECK(rlx_kv_cache_slot(kv, 0, -1, &k, &v) == RLX_ERR_INVALID, "slot n < 0");
    CHECK(rlx_kv_cache_advance(kv, -1) == RLX_ERR_INVALID, "advance n < 0");

    /* Truncate: len = min(len, n); the kept rows are intact and new rows overwrite the rest. */
    CHECK(rlx_kv_cache_truncate(kv, 20) == RLX_OK && rlx_kv_cache_len(kv) == cap, "truncate above len is a no-op");
    CHECK(rlx_kv_cache_truncate(kv, -1) == RLX_ERR_INVALID && rlx_kv_cache_len(kv) == cap, "truncate n < 0");
    CHECK(rlx_kv_cache_truncate(kv, 6) == RLX_OK && rlx_kv_cache_len(kv) == 6, "truncate to 6");
    CHECK(rlx_kv_cache_slot(kv, 2, 4, &k, &v) == RLX_OK && k == k0[2] + 6 * row && v == v0[2] + 6 * row,
          "slot after truncate");
    CHECK(rlx_kv_cache_slot(kv, 2, 5, &k, &v) == RLX_ERR_RANGE, "slot after truncate respects capacity");
    k[0] = -1.0f;
    CHECK(rlx_kv_cache_advance(kv, 1) == RLX_OK && k0[2][6 * row] == -1.0f && k0[2][5 * row] == val(2, 0, 5, 0),
          "overwrite after truncate");
    CHECK(rlx_kv_cache_truncate(kv, 0) == RLX_OK && rlx_kv_cache_len(kv) == 0, "truncate to 0");
    CHECK(rlx_kv_cache_k(kv, 1) == k0[1], "pointers stable after truncate");
    rlx_kv_cache_free(kv);
}

static void test_large_reserve(void) {
    /* 32 layers x 2 x 32768 x 1024 f32 = 8 GiB reserved, only touched pages committed. */
    struct rlx_kv_cache *kv = NULL;
    rlx_status s = rlx_kv_cache_create(32, 1024, 32768, &kv);
    CHECK(s == RLX_OK || s == RLX_ERR_NOMEM, "large reservation: status %d (%s)", s, s ? rlx_last_error() : "");
    if (s != RLX_OK)
        return;
    float *k = NULL, *v = NULL;
    CHECK(rlx_kv_cache_slot(kv, 31, 1, &k, &v) == RLX_OK, "slot in the last layer");
    k[1023] = 1.0f;
    v[1023] = 2.0f;
    CHECK(rlx_kv_cache_advance(kv, 1) == RLX_OK && rlx_kv_cache_k(kv, 31)[1023] == 1.0f &&
              rlx_kv_cache_v(kv, 31)[1023] == 2.0f && rlx_kv_cache_k(kv, 0)[0] == 0.0f,
          "write at the far end; untouched memory reads zero");
    rlx_kv_cache_free(kv);
}

int main(void) {
    test_create();
    test_use();
    test_large_reserve();
    return check_summary();
}
