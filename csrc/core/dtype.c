/*
 * dtype.c - the dtype traits table (name, block size, bytes per block, conversion of whole blocks
 * to f32 and from f32), the size of n elements, and scalar conversions between the floating-point
 * storage formats. Every size of a tensor in the core comes from rlx_dtype_bytes / rlx_shape_bytes,
 * so a block type (GGUF's Q8_0: 32 elements in 34 bytes; Q4_K: 256 in 144) needs nothing more than
 * its row here (and its layout in quants.c, its quantiser in quantize.c).
 *
 * The rows are listed once (DTYPE_ROWS); the table and a count of its rows are both made from
 * that list, and two static assertions lock them to the enum: the list has exactly
 * RLX_DTYPE_COUNT rows and no index past it, and -Woverride-init (in -Wextra, an error with
 * -Werror) refuses an index listed twice, so every dtype has exactly one row.
 */
#include <assert.h>
#include <string.h>

#include "core/core.h"
#include "core/quants.h"

/* ---- conversions of whole blocks ---------------------------------------------------------- */

static void f32_to_f32(float *dst, const void *src, int64_t n) { memcpy(dst, src, (size_t)n * sizeof *dst); }

static void f16_to_f32(float *dst, const void *src, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = rlx_f16_to_f32(h[i]);
}

static void bf16_to_f32(float *dst, const void *src, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = rlx_bf16_to_f32(h[i]);
}

static void i32_to_f32(float *dst, const void *src, int64_t n)
{
    const int32_t *v = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)v[i];
}

static void u8_to_f32(float *dst, const void *src, int64_t n)
{
    const uint8_t *v = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)v[i];
}

/* ---- conversions from f32 (the block types' are in quantize.c) ---------------------------- */

static int64_t f32_from_f32(void *dst, const float *src, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof *src);
    return -1;
}

static int64_t f16_from_f32(void *dst, const float *src, int64_t n)
{
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = rlx_f32_to_f16(src[i]);
        memcpy((uint8_t *)dst + 2 * i, &h, 2);
        if ((h & 0x7c00u) == 0x7c00u && bad < 0) bad = i;
    }
    return bad;
}

static int64_t bf16_from_f32(void *dst, const float *src, int64_t n)
{
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = rlx_f32_to_bf16(src[i]);
        memcpy((uint8_t *)dst + 2 * i, &h, 2);
        if ((h & 0x7f80u) == 0x7f80u && bad < 0) bad = i;
    }
    return bad;
}

/* ---- the table ---------------------------------------------------------------------------- */

/* X(id, name, block_size, type_size, is_float, to_f32, from_f32) */
#define DTYPE_ROWS(X)                                                                                                  \
    X(RLX_F32, "f32", 1, 4, true, f32_to_f32, f32_from_f32)                                                            \
    X(RLX_F16, "f16", 1, 2, true, f16_to_f32, f16_from_f32)                                                            \
    X(RLX_BF16, "bf16", 1, 2, true, bf16_to_f32, bf16_from_f32)                                                        \
    X(RLX_I32, "i32", 1, 4, false, i32_to_f32, NULL)                                                                   \
    X(RLX_U8, "u8", 1, 1, false, u8_to_f32, NULL)                                                                      \
    X(RLX_Q8_0, "q8_0", 32, RLX_Q8_0_BYTES, true, rlx_q8_0_to_f32, rlx_q8_0_from_f32)                                  \
    X(RLX_Q4_0, "q4_0", 32, RLX_Q4_0_BYTES, true, rlx_q4_0_to_f32, rlx_q4_0_from_f32)                                  \
    X(RLX_Q4_1, "q4_1", 32, RLX_Q4_1_BYTES, true, rlx_q4_1_to_f32, rlx_q4_1_from_f32)                                  \
    X(RLX_Q5_0, "q5_0", 32, RLX_Q5_0_BYTES, true, rlx_q5_0_to_f32, rlx_q5_0_from_f32)                                  \
    X(RLX_Q5_1, "q5_1", 32, RLX_Q5_1_BYTES, true, rlx_q5_1_to_f32, rlx_q5_1_from_f32)                                  \
    X(RLX_Q2_K, "q2_k", 256, RLX_Q2_K_BYTES, true, rlx_q2_k_to_f32, rlx_q2_k_from_f32)                                 \
    X(RLX_Q3_K, "q3_k", 256, RLX_Q3_K_BYTES, true, rlx_q3_k_to_f32, rlx_q3_k_from_f32)                                 \
    X(RLX_Q4_K, "q4_k", 256, RLX_Q4_K_BYTES, true, rlx_q4_k_to_f32, rlx_q4_k_from_f32)                                 \
    X(RLX_Q5_K, "q5_k", 256, RLX_Q5_K_BYTES, true, rlx_q5_k_to_f32, rlx_q5_k_from_f32)                                 \
    X(RLX_Q6_K, "q6_k", 256, RLX_Q6_K_BYTES, true, rlx_q6_k_to_f32, rlx_q6_k_from_f32)

#define AS_ROW(id, nm, bs, ts, fl, to, from)                                                                           \
    [id] = {.name = nm, .block_size = bs, .type_size = ts, .is_float = fl, .to_f32 = to, .from_f32 = from},
#define PLUS_ONE(...) +1

static const struct rlx_dtype_traits dtype_table[] = {DTYPE_ROWS(AS_ROW)};
static_assert(0 DTYPE_ROWS(PLUS_ONE) == RLX_DTYPE_COUNT, "dtype table: one row per dtype");
static_assert(sizeof dtype_table / sizeof dtype_table[0] == RLX_DTYPE_COUNT, "dtype table: a row past the enum");

const struct rlx_dtype_traits *rlx_dtype_traits(enum rlx_dtype dt)
{
    return ((unsigned)dt < RLX_DTYPE_COUNT) ? &dtype_table[dt] : NULL;
}

const char *rlx_dtype_name(enum rlx_dtype dt) { return ((unsigned)dt < RLX_DTYPE_COUNT) ? dtype_table[dt].name : "?"; }

rlx_status rlx_dtype_bytes(enum rlx_dtype dt, int64_t n, size_t *out)
{
    const struct rlx_dtype_traits *t = rlx_dtype_traits(dt);
    if (!t) return rlx_set_error(RLX_ERR_DTYPE, "dtype %d is not an rlx dtype", (int)dt);
    if (n < 0) return rlx_set_error(RLX_ERR_INVALID, "%s: a negative element count (%lld)", t->name, (long long)n);
    if (n % t->block_size)
        return rlx_set_error(RLX_ERR_INVALID,
                             "%s holds blocks of %lld elements; %lld elements are not a whole number "
                             "of blocks",
                             t->name, (long long)t->block_size, (long long)n);
    size_t bytes;
    if (!rlx_size_mul((size_t)(n / t->block_size), t->type_size, &bytes))
        return rlx_set_error(RLX_ERR_RANGE, "%lld elements of %s do not fit in memory's address range", (long long)n,
                             t->name);
    *out = bytes;
    return RLX_OK;
}

rlx_status rlx_shape_bytes(enum rlx_dtype dt, int ndim, const int64_t *shape, size_t *out)
{
    const struct rlx_dtype_traits *t = rlx_dtype_traits(dt);
    if (!t) return rlx_set_error(RLX_ERR_DTYPE, "dtype %d is not an rlx dtype", (int)dt);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return rlx_set_error(RLX_ERR_SHAPE, "dim %d is negative (%lld)", i, (long long)shape[i]);
        if (__builtin_mul_overflow(numel, shape[i], &numel))
            return rlx_set_error(RLX_ERR_RANGE, "a %s tensor of rank %d: the element count overflows", t->name, ndim);
    }
    if (ndim > 0 && shape[ndim - 1] % t->block_size)
        return rlx_set_error(RLX_ERR_SHAPE,
                             "%s holds blocks of %lld elements: rows of %lld elements are not whole "
                             "blocks",
                             t->name, (long long)t->block_size, (long long)shape[ndim - 1]);
    return rlx_dtype_bytes(dt, numel, out);
}

rlx_status rlx_dtype_parse(const char *name, enum rlx_dtype *out)
{
    static const struct {
        const char *alias;
        enum rlx_dtype dt;
    } aliases[] = {
        {"float32", RLX_F32}, {"float16", RLX_F16}, {"bfloat16", RLX_BF16},
        {"int32", RLX_I32},   {"uint8", RLX_U8},    {"bool", RLX_U8},
    };
    for (int dt = 0; name && dt < RLX_DTYPE_COUNT; dt++)
        if (strcmp(name, dtype_table[dt].name) == 0) {
            *out = (enum rlx_dtype)dt;
            return RLX_OK;
        }
    for (size_t i = 0; name && i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(name, aliases[i].alias) == 0) {
            *out = aliases[i].dt;
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_DTYPE,
                         "unknown dtype '%s' (expected f32, f16, bf16, i32, u8, or a GGUF block "
                         "type: q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k)",
                         name ? name : "(null)");
}

/* ---- scalar conversions ------------------------------------------------------------------- */

float rlx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float rlx_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t rlx_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays NaN, quieted */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

uint16_t rlx_f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quieted */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                       /* rounds past 65504: inf */
    if (a < 0x38800000u) {                                                         /* below 2^-14: subnormal */
        if (a < 0x33000000u) return (uint16_t)sign;                                /* below half the least: 0 */
        /* value = man * 2^(E - 150) = q * 2^-24 with q = man >> s, s = 126 - E in [14, 24] */
        const uint32_t man = (a & 0x7fffffu) | 0x800000u, s = 126u - (a >> 23);
        uint32_t q = man >> s, rem = man & ((1u << s) - 1u), half = 1u << (s - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((a >> 13) - ((127u - 15u) << 10)), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
