/*
 * test_quantize.c - rlx_quantize from C, under valgrind: every real-valued dtype round-trips
 * through its from_f32 / to_f32 within the error its bits allow (an all-zero row stays zero, and
 * f32 is exact), and every bad input is a status with a message, nothing written past the rows
 * asked for. The bytes themselves are held to gguf-py and llama.cpp in
 * tests/unit/test_quantize.py.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define ROWS 3
#define COLS 512

/* x (ROWS, COLS): a smooth wave times a per-row scale, plus a row of zeros */
static void fill(float *x)
{
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            x[r * COLS + c] =
                r == 1 ? 0.0f : (float)(r + 1) * sinf(0.37f * (float)c) * (1.0f + 0.5f * cosf(0.05f * (float)c));
}

/* max |y - x| / max |x| allowed after a round trip (about one step of the type's grid) */
static double bound(enum rlx_dtype dt)
{
    switch (dt) {
    case RLX_F32: return 0.0;
    case RLX_F16: return 1e-3;
    case RLX_BF16: return 8e-3;
    case RLX_Q8_0: return 1.0 / 127;
    case RLX_Q6_K: return 0.05;
    case RLX_Q5_0:
    case RLX_Q5_1:
    case RLX_Q5_K: return 0.1;
    case RLX_Q4_0:
    case RLX_Q4_1:
    case RLX_Q4_K: return 0.2;
    case RLX_Q3_K: return 0.4;
    default: return 0.8; /* Q2_K */
    }
}

static void test_round_trips(void)
{
    float x[ROWS * COLS], y[ROWS * COLS];
    fill(x);
    for (int d = 0; d < RLX_DTYPE_COUNT; d++) {
        const struct rlx_dtype_traits *t = rlx_dtype_traits((enum rlx_dtype)d);
        if (!t->is_float) continue;
        size_t row_bytes = 0;
        CHECK(rlx_dtype_bytes((enum rlx_dtype)d, COLS, &row_bytes) == RLX_OK, "%s: bytes of a row", t->name);
        uint8_t *q = malloc(ROWS * row_bytes + 1);
        q[ROWS * row_bytes] = 0xA5; /* a guard byte past the rows */
        CHECK(rlx_quantize((enum rlx_dtype)d, x, ROWS, COLS, q) == RLX_OK, "%s: quantize", t->name);
        CHECK(q[ROWS * row_bytes] == 0xA5, "%s: wrote past its rows", t->name);
        t->to_f32(y, q, ROWS * COLS);
        for (int r = 0; r < ROWS; r++) {
            double err = 0, amax = 0;
            for (int c = 0; c < COLS; c++) {
                err = fmax(err, fabs((double)y[r * COLS + c] - x[r * COLS + c]));
                amax = fmax(amax, fabs(x[r * COLS + c]));
            }
            CHECK(r == 1 ? err == 0 : err <= bound((enum rlx_dtype)d) * amax, "%s row %d: max error %g of %g", t->name,
                  r, err, amax);
        }
        free(q);
    }
}

static void test_bad_input(void)
{
    float x[2 * 256] = {0};
    uint8_t q[2 * 256 * 2]; /* (2, 256) f16: more than any block type needs */
    CHECK(rlx_quantize(RLX_Q4_K, x, 1, 100, q) == RLX_ERR_SHAPE && strstr(rlx_last_error(), "whole blocks"),
          "rows that are not whole blocks");
    x[300] = NAN;
    CHECK(rlx_quantize(RLX_Q8_0, x, 2, 256, q) == RLX_ERR_INVALID &&
              strstr(rlx_last_error(), "row 1, column 44 holds NaN"),
          "NaN named");
    x[300] = INFINITY;
    CHECK(rlx_quantize(RLX_F16, x, 2, 256, q) == RLX_ERR_INVALID && strstr(rlx_last_error(), "an infinity"),
          "inf named");
    x[300] = 1e9f;
    CHECK(rlx_quantize(RLX_Q6_K, x, 2, 256, q) == RLX_ERR_RANGE && strstr(rlx_last_error(), "row 1, block 0"),
          "an f16 scale that overflows");
    CHECK(rlx_quantize(RLX_F16, x, 2, 256, q) == RLX_ERR_RANGE && strstr(rlx_last_error(), "column 44"),
          "an f16 value that overflows");
    CHECK(rlx_quantize(RLX_I32, x, 1, 4, q) == RLX_ERR_DTYPE, "i32 holds no real numbers");
    CHECK(rlx_quantize(RLX_DTYPE_COUNT, x, 1, 4, q) == RLX_ERR_DTYPE, "not a dtype");
    CHECK(rlx_quantize(RLX_Q8_0, x, -1, 32, q) == RLX_ERR_SHAPE, "a negative shape");
    CHECK(rlx_quantize(RLX_Q8_0, x, 0, 32, NULL) == RLX_OK, "no rows: nothing to do");
}

int main(void)
{
    test_round_trips();
    test_bad_input();
    return check_summary();
}
