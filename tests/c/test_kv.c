/*
 * test_kv.c - standalone checks of the KV cache (rlx/kv.h) on every device compiled in: creation
 * and its argument checks, growth on demand (rows kept, copied on the device, nothing crossing to
 * the host), writing rows and reading them back, advance and truncate, copying a cache, and the
 * byte counts of f32 / f16 / bf16 caches, and buffers of over 2 MiB (host devices map them at a 2
 * MiB boundary, trimmed, for huge pages) written and read at both ends. It prints one line per
 * failed check and ends with "N passed, M failed"; it exits non-zero if anything failed. It depends
 * on the public headers and the C library only.
 */
#include <stdint.h>
#include <stdio.h>
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
    CHECK(rlx_kv_cache_len(NULL) == 0 && rlx_kv_cache_buffer(NULL, 0, 0) == NULL, "NULL cache accessors");
}

static void test_use(struct rlx_device *dev)
{
    const int64_t layers = 3, row = 8, max = 600;
    struct rlx_kv_cache *kv = NULL;
    CHECK(rlx_kv_cache_create(dev, layers, row, max, RLX_F32, &kv) == RLX_OK && kv, "create");
    if (!kv) return;
    CHECK(rlx_kv_cache_len(kv) == 0 && rlx_kv_cache_capacity(kv) == 0 && rlx_kv_cache_max_capacity(kv) == max &&
              rlx_kv_cache_row(kv) == row && rlx_kv_cache_layers(kv) == layers && rlx_kv_cache_bytes(kv) == 0 &&
              rlx_kv_cache_buffer(kv, 0, 0) == NULL,
          "a new cache holds nothing");
    CHECK(rlx_kv_cache_reserve(kv, 10) == RLX_OK && rlx_kv_cache_capacity(kv) == 256 &&
              rlx_kv_cache_bytes(kv) == (size_t)(256 * row * 4 * layers * 2),
          "the first reserve takes 256 positions (%lld)", (long long)rlx_kv_cache_capacity(kv));
    CHECK(rlx_kv_cache_buffer(kv, 0, 0) != rlx_kv_cache_buffer(kv, 0, 1) && rlx_kv_cache_buffer(kv, 3, 0) == NULL &&
              rlx_kv_cache_buffer(kv, 0, 2) == NULL,
          "distinct buffers; bad layer / which -> NULL");

    /* rows [0, 200) of every layer written, then advanced */
    float buf[200 * 8];
    int ok = 1;
    for (int64_t l = 0; l < layers; l++)
        for (int which = 0; which < 2; which++) {
            for (int64_t p = 0; p < 200; p++)
                for (int64_t c = 0; c < row; c++) buf[p * row + c] = val(l, which, p, c);
            ok &= rlx_kv_cache_write(kv, l, which, 0, 200, buf, sizeof buf) == RLX_OK;
        }
    CHECK(ok && rlx_kv_cache_len(kv) == 0, "write does not change len");
    CHECK(rlx_kv_cache_read(kv, 0, 0, 0, 1, buf, 8 * 4) == RLX_ERR_RANGE, "read past len refused");
    CHECK(rlx_kv_cache_advance(kv, 200) == RLX_OK && rlx_kv_cache_len(kv) == 200, "advance 200");

    /* growth keeps the rows and moves nothing across the host boundary */
    struct rlx_device_stats before, after;
    rlx_device_stats(dev, &before);
    CHECK(rlx_kv_cache_reserve(kv, 300) == RLX_OK && rlx_kv_cache_capacity(kv) == 512, "grow to 512");
    rlx_device_stats(dev, &after);
    CHECK(after.upload_bytes == before.upload_bytes && after.download_bytes == before.download_bytes &&
              after.copy_bytes - before.copy_bytes == (uint64_t)(200 * row * 4 * layers * 2),
          "growth copies the 200 filled rows on the device (%llu bytes)",
          (unsigned long long)(after.copy_bytes - before.copy_bytes));
    CHECK(rlx_kv_cache_reserve(kv, 599) == RLX_OK && rlx_kv_cache_capacity(kv) == 600, "growth stops at the maximum");
    CHECK(rlx_kv_cache_reserve(kv, 601) == RLX_ERR_RANGE && rlx_kv_cache_capacity(kv) == 600,
          "past the maximum refused");
    int same = 1;
    for (int64_t l = 0; l < layers; l++)
        for (int which = 0; which < 2; which++) {
            same &= rlx_kv_cache_read(kv, l, which, 0, 200, buf, sizeof buf) == RLX_OK;
            for (int64_t p = 0; p < 200; p++)
                for (int64_t c = 0; c < row; c++) same &= buf[p * row + c] == val(l, which, p, c);
        }
    CHECK(same, "every row read back after two growths");
    CHECK(rlx_kv_cache_read(kv, 0, 0, 0, 2, buf, 3) == RLX_ERR_SHAPE, "a wrong byte count refused");
    CHECK(rlx_kv_cache_write(kv, 0, 0, 599, 2, buf, 2 * 8 * 4) == RLX_ERR_RANGE, "write past capacity refused");

    /* advance / truncate */
    CHECK(rlx_kv_cache_advance(kv, 401) == RLX_ERR_RANGE && rlx_kv_cache_len(kv) == 200, "advance past capacity");
    CHECK(rlx_kv_cache_advance(kv, -1) == RLX_ERR_INVALID, "advance n < 0");
    CHECK(rlx_kv_cache_truncate(kv, 900) == RLX_OK && rlx_kv_cache_len(kv) == 200, "truncate above len is a no-op");
    CHECK(rlx_kv_cache_truncate(kv, -1) == RLX_ERR_INVALID && rlx_kv_cache_len(kv) == 200, "truncate n < 0");
    CHECK(rlx_kv_cache_truncate(kv, 6) == RLX_OK && rlx_kv_cache_len(kv) == 6, "truncate to 6");

    /* copy: another cache of the same shape gets the filled rows */
    struct rlx_kv_cache *dst = NULL, *other = NULL;
    CHECK(rlx_kv_cache_create(dev, layers, row, max, RLX_F32, &dst) == RLX_OK, "create a copy target");
    CHECK(rlx_kv_cache_copy(dst, kv) == RLX_OK && rlx_kv_cache_len(dst) == 6 && rlx_kv_cache_capacity(dst) == 256,
          "copy: len and capacity");
    same = rlx_kv_cache_read(dst, 2, 1, 0, 6, buf, 6 * 8 * 4) == RLX_OK;
    for (int64_t p = 0; p < 6; p++) same &= buf[p * row + 3] == val(2, 1, p, 3);
    CHECK(same, "copy: rows equal");
    CHECK(rlx_kv_cache_create(dev, layers, row, max, RLX_F16, &other) == RLX_OK &&
              rlx_kv_cache_copy(other, kv) == RLX_ERR_INVALID,
          "copy between dtypes refused");
    rlx_kv_cache_free(dst);
    rlx_kv_cache_free(other);
    rlx_kv_cache_free(kv);
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
    CHECK(bytes[0] == (size_t)1000 * 64 * 4 * 4 * 2 && bytes[1] * 2 == bytes[0] && bytes[2] * 2 == bytes[0],
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
        test_use(dev);
        test_big_buffers(dev);
        test_dtypes(dev);
        rlx_device_free(dev);
    }
    return check_summary();
}
