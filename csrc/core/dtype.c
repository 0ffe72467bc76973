/*
 * dtype.c - the dtype traits table (name, element size) and scalar conversions between the
 * floating-point storage formats. The table is indexed by enum rlx_dtype and locked to its count.
 */
#include <assert.h>
#include <string.h>

#include "core/core.h"

struct dtype_traits {
    const char *name;
    size_t size;
};

static const struct dtype_traits dtype_table[] = {
    [RLX_F32] = {.name = "f32", .size = 4},
    [RLX_F16] = {.name = "f16", .size = 2},
    [RLX_BF16] = {.name = "bf16", .size = 2},
    [RLX_I32] = {.name = "i32", .size = 4},
    [RLX_U8] = {.name = "u8", .size = 1},
};
static_assert(sizeof dtype_table / sizeof dtype_table[0] == RLX_DTYPE_COUNT, "dtype table out of date");

const char *rlx_dtype_name(enum rlx_dtype dt)
{
    return ((unsigned)dt < RLX_DTYPE_COUNT) ? dtype_table[dt].name : "?";
}

size_t rlx_dtype_size(enum rlx_dtype dt) { return ((unsigned)dt < RLX_DTYPE_COUNT) ? dtype_table[dt].size : 0; }

rlx_status rlx_dtype_parse(const char *name, enum rlx_dtype *out)
{
    static const struct {
        const char *alias;
        enum rlx_dtype dt;
    } aliases[] = {
        {"f32", RLX_F32},  {"float32", RLX_F32},  {"f16", RLX_F16}, {"float16", RLX_F16},
        {"bf16", RLX_BF16}, {"bfloat16", RLX_BF16}, {"i32", RLX_I32}, {"int32", RLX_I32},
        {"u8", RLX_U8},    {"uint8", RLX_U8},      {"bool", RLX_U8},
    };
    for (size_t i = 0; name && i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(name, aliases[i].alias) == 0) {
            *out = aliases[i].dt;
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_DTYPE, "unknown dtype '%s' (expected f32, f16, bf16, i32 or u8)",
                         name ? name : "(null)");
}

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
