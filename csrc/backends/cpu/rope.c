/*
 * rope.c - the cpu table's rotary position embedding: element i turned with i + d/2 (rotate-half,
 * Hugging Face's layout) or 2i with 2i + 1 (interleaved: q / k rows as llama.cpp's GGUF converter
 * permutes them, so a GGUF file's weights are read as they are). The angle is computed in
 * float as (float)pos * inv_freq[i] and passed to cosf/sinf, as PyTorch does in float32 for
 * Hugging Face models, so positions far from zero round the same way. Each position's cos/sin
 * are computed once per block of frequencies (on the stack) and reused across heads. Positions
 * are split over the pool. Must never allocate; out may be the same buffer as x.
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <math.h>

/* Frequencies whose cos/sin are held on the stack at once. */
#define ROPE_BLOCK 64

struct rope_ctx {
    float *out;
    const float *x;
    const int32_t *pos;
    const float *inv_freq;
    int64_t h, d;
    int interleaved;
};

static void rope_positions(void *p, int64_t begin, int64_t end)
{
    const struct rope_ctx *c = p;
    const int64_t half = c->d / 2, row = c->h * c->d;
    float cs[ROPE_BLOCK], sn[ROPE_BLOCK];
    for (int64_t t = begin; t < end; t++) {
        const float fpos = (float)c->pos[t];
        for (int64_t i0 = 0; i0 < half; i0 += ROPE_BLOCK) {
            const int64_t nb = half - i0 < ROPE_BLOCK ? half - i0 : ROPE_BLOCK;
            for (int64_t k = 0; k < nb; k++) {
                const float ang = fpos * c->inv_freq[i0 + k];
                cs[k] = cosf(ang);
                sn[k] = sinf(ang);
            }
            for (int64_t hh = 0; hh < c->h; hh++) {
                const float *x = c->x + t * row + hh * c->d;
                float *o = c->out + t * row + hh * c->d;
                for (int64_t k = 0; k < nb; k++) {
                    const int64_t a = c->interleaved ? 2 * (i0 + k) : i0 + k, b = c->interleaved ? a + 1 : a + half;
                    const float x0 = x[a], x1 = x[b];
                    o[a] = x0 * cs[k] - x1 * sn[k];
                    o[b] = x1 * cs[k] + x0 * sn[k];
                }
            }
        }
    }
}

/* out (s, h, d) = RoPE of x (s, h, d) at positions pos (s), inv_freq (d/2): t = pos * inv_freq[i],
 * pair (a, b) = (i, i + d/2) or (2i, 2i + 1) when interleaved; out[a] = x[a] cos t - x[b] sin t,
 * out[b] = x[b] cos t + x[a] sin t */
void rlx_cpu_rope_f32(float *out, const float *x, const int32_t *pos, const float *inv_freq, int64_t s, int64_t h,
                      int64_t d, int interleaved)
{
    struct rope_ctx c = {
        .out = out, .x = x, .pos = pos, .inv_freq = inv_freq, .h = h, .d = d, .interleaved = interleaved};
    /* cost per position: d/2 cos/sin pairs plus h*d cheap floats */
    rlx_parallel_for(s, rlx_cpu_row_grain(RLX_CPU_GRAIN_TRANSC, d + h * d / 8), rope_positions, &c);
}
