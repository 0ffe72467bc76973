/*
 * test_kv.c - standalone checks of the KV cache (rlx/kv.h) on every device compiled in: creation
 * and its argument checks, growth on demand (rows kept, copied on the device, nothing crossing to
 * the host), writing rows and reading them back, advance and truncate, copying a cache, in both
 * layouts (host devices keep small caches in one buffer: many growths in it and out of it), the
 * byte counts of f32 / f16 / bf16 caches, and buffers of over 2 MiB (host devices map them at a 2
 * MiB boundary, trimmed, for huge pages) written and read at both ends. It prints one line per
 * failed check and ends with "N passed, M failed"; it exits non-zero if anything failed. It depends
 * on the public headers and the C library only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/kv.h"

#include "check.h"

/* The value stored at (layer, which, position, column). */
static float val(int64_t layer, int which, int64_t pos, int64_t col)
{
    return (float)(layer * 100000 + which * 50000 + pos * 100 + col);
}

static void test_create(struct rlx_device *dev)
{
    struct rlx_kv_cache *kv = (struct rlx_kv_cache *)&check_passed; /* must stay untouched on error */
    struct rlx_kv_cache *const sentinel = kv;
    CHECK(rlx_kv_cache_create(dev, 0, 8, 16, RLX_F32, &kv) == RLX_ERR_INVALID && kv == sentinel, "n_layers 0 rejected");
    CHECK(rlx_kv_cache_create(dev, 2, 0, 16, RLX_F32, &kv) == RLX_ERR_INVALID && kv == sentinel, "row 0 rejected");
    CHECK(rlx_kv_cache_create(dev, 2, 8, -1, RLX_F32, &kv) == RLX_ERR_INVALID && kv == sentinel,
          "capacity -1 rejected");
    CHECK(rlx_kv_cache_create(dev, 2, 8, 16, RLX_I32, &kv) == RLX_ERR_INVALID && kv == sentinel, "i32 rejected");
    CHECK(rlx_kv_cache_create(dev, 2, INT64_MAX / 2, 4, RLX_F32, &kv) == RLX_ERR_RANGE && kv == sentinel,
          "capacity * row overflow rejected");
    CHECK(rlx_kv_cache_create(dev, INT64_MAX / 4, 1 << 20, 1 << 20, RLX_F16, &kv) == RLX_ERR_RANGE && kv == sentinel,
          "total size overflow rejected");
    CHECK(rlx_kv_cache_create(NULL, 1, 8, 8, RLX_F32, &kv) == RLX_ERR_INVALID, "NULL device rejected");
    CHECK(rlx_kv_cache_create(dev, 1, 8, 8, RLX_F32, NULL) == RLX_ERR_INVALID, "NULL out rejected");
    rlx_kv_cache_free(NULL);
    size_t off = 1;
    CHECK(rlx_kv_cache_len(NULL) == 0 && rlx_kv_cache_buffer(NULL, 0, 0, &off) == NULL && off == 0,
          "NULL cache accessors");
}

/* Whether the cache keeps its layers in one buffer (the small layout of host devices). */
static int shared(struct rlx_kv_cache *kv)
{
    size_t o0 = 1, o1 = 1;
    const struct rlx_buffer *b0 = rlx_kv_cache_buffer(kv, 0, 0, &o0), *b1 = rlx_kv_cache_buffer(kv, 0, 1, &o1);
    return b0 && b0 == b1 && o0 == 0 && o1 == (size_t)rlx_kv_cache_capacity(kv) * rlx_kv_cache_row(kv) * 4;
}

/* Rows of `row` f32: 8 (the small layout on host devices: 32-byte rows) or 4096 (16 KiB rows, 2 MiB
 * at 128 positions: a buffer each from the start). */
static void test_use(struct rlx_device *dev, int64_t row, int small)
{
    const int64_t layers = 3, max = 600;
    const size_t rb = (size_t)row * 4;
    float *buf = malloc(sizeof(float) * 200 * (size_t)row);
    struct rlx_kv_cache *kv = NULL;
    CHECK(buf && rlx_kv_cache_create(dev, layers, row, max, RLX_F32, &kv) == RLX_OK && kv, "create (row %lld)",
          (long long)row);
    if (!kv || !buf) {
        free(buf);
        return;
    }
    size_t off = 1;
    CHECK(rlx_kv_cache_len(kv) == 0 && rlx_kv_cache_capacity(kv) == 0 && rlx_kv_cache_max_capacity(kv) == max &&
              rlx_kv_cache_row(kv) == row && rlx_kv_cache_layers(kv) == layers && rlx_kv_cache_bytes(kv) == 0 &&
              rlx_kv_cache_buffer(kv, 0, 0, &off) == NULL && off == 0,
          "a new cache holds nothing");
    CHECK(rlx_kv_cache_reserve(kv, 200) == RLX_OK && rlx_kv_cache_capacity(kv) == 256 &&
              rlx_kv_cache_bytes(kv) == 256 * rb * layers * 2,
          "the first reserve of 200 takes 256 positions (%lld)", (long long)rlx_kv_cache_capacity(kv));
    CHECK(shared(kv) == small, "row %lld: %s", (long long)row, small ? "one buffer for all layers" : "a buffer each");
    size_t o = 0;
    struct rlx_buffer *last = rlx_kv_cache_buffer(kv, 2, 1, &o);
    CHECK(last && (small ? o == 5 * 256 * rb : o == 0) && rlx_kv_cache_buffer(kv, 3, 0, &o) == NULL && o == 0 &&
              rlx_kv_cache_buffer(kv, 0, 2, &o) == NULL,
          "the last buffer's offset; bad layer / which -> NULL");

    /* rows [0, 200) of every layer written, then advanced */
    int ok = 1;
    for (int64_t l = 0; l < layers; l++)
        for (int which = 0; which < 2; which++) {
            for (int64_t p = 0; p < 200; p++)
                for (int64_t c = 0; c < row; c++) buf[p * row + c] = val(l, which, p, c);
            ok &= rlx_kv_cache_write(kv, l, which, 0, 200, buf, 200 * rb) == RLX_OK;
        }
    CHECK(ok && rlx_kv_cache_len(kv) == 0, "write does not change len");
    CHECK(rlx_kv_cache_read(kv, 0, 0, 0, 1, buf, rb) == RLX_ERR_RANGE, "read past len refused");
    CHECK(rlx_kv_cache_advance(kv, 200) == RLX_OK && rlx_kv_cache_len(kv) == 200, "advance 200");

    /* growth keeps the rows and moves nothing across the host boundary: a buffer each, every buffer's
     * rows copied once into a new one (to 512 positions); one buffer, all but the first moved up in
     * it (to 320: 300 rounded up to 64) */
    struct rlx_device_stats before, after;
    rlx_device_stats(dev, &before);
    CHECK(rlx_kv_cache_reserve(kv, 300) == RLX_OK && rlx_kv_cache_capacity(kv) == (small ? 320 : 512),
          "grow to %d (%lld)", small ? 320 : 512, (long long)rlx_kv_cache_capacity(kv));
    rlx_device_stats(dev, &after);
    const uint64_t moved = 200 * rb * (uint64_t)(small ? layers * 2 - 1 : layers * 2);
    CHECK(after.upload_bytes == before.upload_bytes && after.download_bytes == before.download_bytes &&
              after.copy_bytes - before.copy_bytes == moved,
          "growth copies the 200 filled rows on the device (%llu bytes, expected %llu)",
          (unsigned long long)(after.copy_bytes - before.copy_bytes), (unsigned long long)moved);
    CHECK(rlx_kv_cache_reserve(kv, 599) == RLX_OK && rlx_kv_cache_capacity(kv) == 600, "growth stops at the maximum");
    CHECK(rlx_kv_cache_reserve(kv, 601) == RLX_ERR_RANGE && rlx_kv_cache_capacity(kv) == 600,
          "past the maximum refused");
    CHECK(rlx_kv_cache_bytes(kv) == 600 * rb * layers * 2 && shared(kv) == small, "600 positions, same layout");
    int same = 1;
    for (int64_t l = 0; l < layers; l++)
        for (int which = 0; which < 2; which++) {
            same &= rlx_kv_cache_read(kv, l, which, 0, 200, buf, 200 * rb) == RLX_OK;
            for (int64_t p = 0; p < 200; p++)
                for (int64_t c = 0; c < row; c++) same &= buf[p * row + c] == val(l, which, p, c);
        }
    CHECK(same, "every row read back after two growths");
    CHECK(rlx_kv_cache_read(kv, 0, 0, 0, 2, buf, 3) == RLX_ERR_SHAPE, "a wrong byte count refused");
    CHECK(rlx_kv_cache_write(kv, 0, 0, 599, 2, buf, 2 * rb) == RLX_ERR_RANGE, "write past capacity refused");

    /* advance / truncate */
    CHECK(rlx_kv_cache_advance(kv, 401) == RLX_ERR_RANGE && rlx_kv_cache_len(kv) == 200, "advance past capacity");
    CHECK(rlx_kv_cache_advance(kv, -1) == RLX_ERR_INVALID, "advance n < 0");
    CHECK(rlx_kv_cache_truncate(kv, 900) == RLX_OK && rlx_kv_cache_len(kv) == 200, "truncate above len is a no-op");
    CHECK(rlx_kv_cache_truncate(kv, -1) == RLX_ERR_INVALID && rlx_kv_cache_len(kv) == 200, "truncate n < 0");
    CHECK(rlx_kv_cache_truncate(kv, 6) == RLX_OK && rlx_kv_cache_len(kv) == 6, "truncate to 6");

    /* copy: another cache of the same shape gets the filled rows */
    struct rlx_kv_cache *dst = NULL, *other = NULL;
    CHECK(rlx_kv_cache_create(dev, layers, row, max, RLX_F32, &dst) == RLX_OK, "create a copy target");
    CHECK(rlx_kv_cache_copy(dst, kv) == RLX_OK && rlx_kv_cache_len(dst) == 6 && rlx_kv_cache_capacity(dst) == 64 &&
              shared(dst),
          "copy: len, and capacity 64 in the small layout (%lld)", (long long)rlx_kv_cache_capacity(dst));
    same = 1;
    for (int64_t l = 0; l < layers; l++)
        for (int which = 0; which < 2; which++) {
            same &= rlx_kv_cache_read(dst, l, which, 0, 6, buf, 6 * rb) == RLX_OK;
            for (int64_t p = 0; p < 6; p++) same &= buf[p * row + 3] == val(l, which, p, 3);
        }
    CHECK(same, "copy: rows equal");
    CHECK(rlx_kv_cache_create(dev, layers, row, max, RLX_F16, &other) == RLX_OK &&
              rlx_kv_cache_copy(other, kv) == RLX_ERR_INVALID,
          "copy between dtypes refused");
    rlx_kv_cache_free(dst);
    rlx_kv_cache_free(other);
    rlx_kv_cache_free(kv);
    free(buf);
}

/* The small layout through many growths and out of it: rows of 1024 f32 (4 KiB; below 2 MiB a
 * buffer up to 511 positions), 2 layers, filled a few positions at a time as decode does, then past
 * 511 (a buffer each); every row of every buffer read back at each stage. */
static void test_small_growth(struct rlx_device *dev)
{
    enum { ROW = 1024, LAYERS = 2 };
    static float buf[ROW];
    struct rlx_kv_cache *kv = NULL;
    CHECK(rlx_kv_cache_create(dev, LAYERS, ROW, 4000, RLX_F32, &kv) == RLX_OK && kv, "create");
    if (!kv) return;
    int ok = 1, caps = 0, was_shared = 0;
    int64_t last_cap = 0;
    for (int64_t len = 0; len < 700 && ok;) {
        const int64_t n = len < 100 ? 37 : len < 500 ? 13 : 90; /* a prompt, decode, then a chunk across 511 */
        ok &= rlx_kv_cache_reserve(kv, len + n) == RLX_OK;
        if (rlx_kv_cache_capacity(kv) != last_cap) caps++, last_cap = rlx_kv_cache_capacity(kv);
        was_shared |= shared(kv);
        for (int64_t l = 0; l < LAYERS; l++)
            for (int which = 0; which < 2; which++)
                for (int64_t p = len; p < len + n; p++) {
                    for (int64_t c = 0; c < ROW; c++) buf[c] = val(l, which, p, c);
                    ok &= rlx_kv_cache_write(kv, l, which, p, 1, buf, sizeof buf) == RLX_OK;
                }
        ok &= rlx_kv_cache_advance(kv, n) == RLX_OK;
        len += n;
        for (int64_t l = 0; l < LAYERS; l++)
            for (int which = 0; which < 2; which++)
                for (int64_t p = 0; p < len; p++) {
                    ok &= rlx_kv_cache_read(kv, l, which, p, 1, buf, sizeof buf) == RLX_OK;
                    for (int64_t c = 0; c < ROW; c += 97) ok &= buf[c] == val(l, which, p, c);
                }
    }
    CHECK(ok, "every row of every buffer read back after each growth");
    CHECK(was_shared && !shared(kv) && rlx_kv_cache_capacity(kv) >= 700 && caps > 5,
          "grown in %d steps within one buffer, then a buffer each (capacity %lld)", caps,
          (long long)rlx_kv_cache_capacity(kv));
    CHECK(rlx_kv_cache_bytes(kv) == (size_t)rlx_kv_cache_capacity(kv) * ROW * 4 * LAYERS * 2, "bytes");
    rlx_kv_cache_free(kv);
    struct rlx_device_stats st;
    rlx_device_stats(dev, &st);
    CHECK(st.allocated_bytes == 0, "the arena and the buffers freed (%zu bytes left)", st.allocated_bytes);
}

static void test_dtypes(struct rlx_device *dev)
{
    const enum rlx_dtype dts[3] = {RLX_F32, RLX_F16, RLX_BF16};
    size_t bytes[3];
    for (int i = 0; i < 3; i++) {
        struct rlx_kv_cache *kv = NULL;
        bytes[i] = 0;
        if (rlx_kv_cache_create(dev, 4, 64, 1024, dts[i], &kv) == RLX_OK && rlx_kv_cache_reserve(kv, 1000) == RLX_OK)
            bytes[i] = rlx_kv_cache_bytes(kv);
        CHECK(rlx_kv_cache_dtype(kv) == dts[i], "dtype %s kept", rlx_dtype_name(dts[i]));
        rlx_kv_cache_free(kv);
    }
    /* 1000 positions in the small layout: 1024 (a multiple of 64) */
    CHECK(bytes[0] == (size_t)1024 * 64 * 4 * 4 * 2 && bytes[1] * 2 == bytes[0] && bytes[2] * 2 == bytes[0],
          "f16 / bf16 caches hold half the bytes of f32 (%zu %zu %zu)", bytes[0], bytes[1], bytes[2]);
    struct rlx_device_stats st;
    rlx_device_stats(dev, &st);
    CHECK(st.allocated_bytes == 0, "every cache buffer freed (%zu bytes left)", st.allocated_bytes);
}

static void test_big_buffers(struct rlx_device *dev)
{
    /* rows of 768 f32 (3 KiB): 1000 positions = 2.93 MiB a buffer, then 2000 = 5.86 MiB, neither a
     * multiple of the 2 MiB pages the host devices map them in */
    enum { ROW = 768 };
    static float buf[2 * ROW];
    struct rlx_kv_cache *kv = NULL;
    CHECK(rlx_kv_cache_create(dev, 2, ROW, 4000, RLX_F32, &kv) == RLX_OK && kv, "create");
    if (!kv) return;
    int ok = rlx_kv_cache_reserve(kv, 1000) == RLX_OK && rlx_kv_cache_capacity(kv) == 1000;
    for (int64_t l = 0; l < 2; l++)
        for (int which = 0; which < 2; which++)
            for (int64_t p = 0; p < 1000; p += 999) {
                for (int64_t c = 0; c < ROW; c++) buf[c] = val(l, which, p, c);
                ok &= rlx_kv_cache_write(kv, l, which, p, 1, buf, ROW * 4) == RLX_OK;
            }
    ok &= rlx_kv_cache_advance(kv, 1000) == RLX_OK && rlx_kv_cache_reserve(kv, 1001) == RLX_OK &&
          rlx_kv_cache_capacity(kv) == 2000;
    for (int64_t l = 0; l < 2; l++)
        for (int which = 0; which < 2; which++) {
            for (int64_t c = 0; c < ROW; c++) buf[c] = val(l, which, 1999, c);
            ok &= rlx_kv_cache_write(kv, l, which, 1999, 1, buf, ROW * 4) == RLX_OK;
        }
    CHECK(ok, "2.9 MiB buffers written at both ends, grown to 5.9 MiB, written at the end");
    ok = rlx_kv_cache_advance(kv, 1000) == RLX_OK;
    for (int64_t l = 0; l < 2; l++)
        for (int which = 0; which < 2; which++)
            for (int i = 0; i < 3; i++) {
                const int64_t pos = (int64_t[]){0, 999, 1999}[i];
                ok &= rlx_kv_cache_read(kv, l, which, pos, 1, buf, ROW * 4) == RLX_OK;
                for (int64_t c = 0; c < ROW; c++) ok &= buf[c] == val(l, which, pos, c);
            }
    CHECK(ok, "rows 0, 999 and 1999 read back after the growth");
    rlx_kv_cache_free(kv);
}

int main(void)
{
    const char *names[] = {"cpu", "ref"};
    for (int i = 0; i < 2; i++) {
        struct rlx_device *dev = NULL;
        CHECK(rlx_device_open(names[i], &dev) == RLX_OK, "open %s", names[i]);
        if (!dev) continue;
        test_create(dev);
        test_use(dev, 8, 1);    /* host devices: the small layout */
        test_use(dev, 4096, 0); /* a buffer each */
        test_small_growth(dev);
        test_big_buffers(dev);
        test_dtypes(dev);
        rlx_device_free(dev);
    }
    return check_summary();
}
