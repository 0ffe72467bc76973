/*
 * quantize.c - f32 rows to every real-valued dtype of the table (the traits' from_f32, and
 * rlx_quantize, which checks the input and the result): f16 and bf16 by rounding to nearest even,
 * and the GGUF block types as ggml's reference quantisers make them, so that a file rlx writes
 * holds the bytes llama.cpp's own tools would write.
 *
 * - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (and bf16, f16): byte for byte gguf-py's quantize (the tests'
 *   oracle), which is ggml's reference: the same float32 operations in the same order (no fused
 *   multiply-add: the build is ISO C11, whose default is -ffp-contract=off), the scale rounded to
 *   f16 after its inverse is taken from the f32 value.
 * - Q2_K .. Q6_K: the scale searches of ggml's reference quantisers (no importance matrix, as
 *   llama-quantize without --imatrix), rewritten here: per group a search over candidate scales
 *   for the one of least (weighted) squared or absolute error, then the group scales (and minimums)
 *   quantised to 4 / 6 / 8 bits against one f16 super-scale, then a last pass that gives every
 *   element the nearest level of its group's stored scale and minimum. The same float operations
 *   in the same order as ggml, so the bytes agree with llama.cpp's where the tests can ask it.
 *
 * Layouts are quants.c's (the dequantisers); comments there say where each bit lives. Every
 * quantiser writes whole blocks, never allocates, never fails; it returns the index of the first
 * block whose f16 scale (or, for f16 / bf16, element) overflowed to inf, or -1, and rlx_quantize
 * turns that into an error. Defined for any finite input: the degenerate blocks whose scale is so
 * small that its inverse overflows get the codes x86 (and so NumPy and ggml there) gives them.
 */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "core/quants.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Stores v as an f16 at p; false when it rounded to inf (a scale too large for the type). */
static bool put_half(uint8_t *p, float v)
{
    const uint16_t h = rlx_f32_to_f16(v);
    memcpy(p, &h, 2);
    return (h & 0x7c00u) != 0x7c00u;
}

static float get_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return rlx_f16_to_f32(h);
}

/* (int32_t)v as x86's cvttss2si computes it: toward zero, and INT32_MIN for NaN or a value past
 * int32 (C leaves those undefined). NumPy's float -> integer casts (gguf-py's) and ggml's casts
 * compile to it, and narrowing INT32_MIN keeps its low byte, 0: the code such a degenerate element
 * (x / d with 1 / d = inf) gets there. */
static int32_t trunc_i32(float v)
{
    if (!(v >= -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
    return (int32_t)v;
}

/* The element of largest magnitude (the first of equals) and that magnitude. */
static float signed_max(const float *x, int n, float *amax)
{
    float m = 0, a = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > a) {
            a = fabsf(x[i]);
            m = x[i];
        }
    *amax = a;
    return m;
}

static void min_max(const float *x, int n, float *mn, float *mx)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    *mn = lo;
    *mx = hi;
}

/* ---- 32-element blocks -------------------------------------------------------------------- */

/* Q8_0: d = max|x| / 127; q = round(x / d) (halves away from zero). */
int64_t rlx_q8_0_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, b += RLX_Q8_0_BYTES) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        if (!put_half(b, d) && bad < 0) bad = blk;
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)trunc_i32(roundf(x[j] * id));
    }
    return bad;
}

/* Q4_0 / Q5_0: d = (the element of largest magnitude) / -2^(bits-1), q = trunc(x / d + 2^(bits-1)
 * + 0.5) capped at 2^bits - 1, so that element gets code 0 and the block spans [-8 d, 7 d]. */
int64_t rlx_q4_0_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, b += RLX_Q4_0_BYTES) {
        float amax;
        const float d = signed_max(x, 32, &amax) / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        if (!put_half(b, d) && bad < 0) bad = blk;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            const uint8_t v = (uint8_t)trunc_i32(x[j] * id + 8.5f);
            q[j] = v < 15 ? v : 15;
        }
        for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
    return bad;
}

int64_t rlx_q5_0_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, b += RLX_Q5_0_BYTES) {
        float amax;
        const float d = signed_max(x, 32, &amax) / -16.0f, id = d != 0 ? 1.0f / d : 0.0f;
        if (!put_half(b, d) && bad < 0) bad = blk;
        uint8_t q[32];
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) {
            const uint8_t v = (uint8_t)trunc_i32(x[j] * id + 16.5f);
            q[j] = v < 31 ? v : 31;
            qh |= (uint32_t)(q[j] >> 4) << j;
        }
        for (int k = 0; k < 4; k++) b[2 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
    }
    return bad;
}

/* Q4_1 / Q5_1: m = min x, d = (max x - m) / (2^bits - 1), q = trunc((x - m) / d + 0.5). */
int64_t rlx_q4_1_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, b += RLX_Q4_1_BYTES) {
        float mn, mx;
        min_max(x, 32, &mn, &mx);
        const float d = (mx - mn) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
        if ((!put_half(b, d) || !put_half(b + 2, mn)) && bad < 0) bad = blk;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            const uint8_t v = (uint8_t)trunc_i32((x[j] - mn) * id + 0.5f);
            q[j] = v < 15 ? v : 15;
        }
        for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
    return bad;
}

int64_t rlx_q5_1_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, b += RLX_Q5_1_BYTES) {
        float mn, mx;
        min_max(x, 32, &mn, &mx);
        const float d = (mx - mn) / 31.0f, id = d != 0 ? 1.0f / d : 0.0f;
        if ((!put_half(b, d) || !put_half(b + 2, mn)) && bad < 0) bad = blk;
        uint8_t q[32];
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) {
            const uint8_t v = (uint8_t)trunc_i32((x[j] - mn) * id + 0.5f);
            q[j] = v < 31 ? v : 31;
            qh |= (uint32_t)(q[j] >> 4) << j;
        }
        for (int k = 0; k < 4; k++) b[4 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
    }
    return bad;
}

/* ---- K types: the searches ---------------------------------------------------------------- */

/* A group whose largest magnitude is below this is all zeros (ggml's GROUP_MAX_EPS). */
#define GROUP_EPS 1e-15f

/* The nearest integer to v, ties to even, with NaN as 0 and |v| capped at 2^22 - 1 (only
 * degenerate groups, whose range is subnormal, get there). Adding and taking away 1.5 * 2^23
 * rounds in the FPU's mode, to nearest even (ggml's nearest_int rounds the same way), and unlike
 * rintf it needs no library call on plain x86-64. */
static int nearest(float v)
{
    if (!(v > -4194303.0f)) return v < 0 ? -4194303 : 0;
    if (v > 4194303.0f) v = 4194303.0f;
    return (int)((v + 12582912.0f) - 12582912.0f);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Codes for inverse scale is (q[i] = clamp(round(is x[i]), -nmax, nmax - 1)) and their weighted
 * sums with w = x^2: *slx = sum w x q, *sl2 = sum w q^2. */
static void signed_codes(int n, int nmax, const float *x, float is, int8_t *q, float *slx, float *sl2)
{
    float sx = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest(is * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        q[i] = (int8_t)l;
        sx += w * x[i] * (float)l;
        s2 += w * (float)l * (float)l;
    }
    *slx = sx;
    *sl2 = s2;
}

/* Symmetric codes q in [-nmax, nmax) and scale s for x (n) minimising sum w (x - s q)^2, w = x^2:
 * 19 candidate inverse scales -(nmax + k / 10) / xm (k = -9..9; xm the element of largest
 * magnitude), each with its least-squares scale sum w x q / sum w q^2; the candidate with the
 * largest (sum w x q)^2 / sum w q^2 (the largest drop in error) wins. Returns s; q (n) holds
 * code + nmax. (ggml's make_qx_quants with rmse_type 1.) */
static float search_signed(int n, int nmax, const float *x, uint8_t *q)
{
    int8_t cur[32], best[32]; /* (n) */
    float amax;
    const float xm = signed_max(x, n, &amax);
    if (amax < GROUP_EPS) {
        memset(q, 0, (size_t)n);
        return 0;
    }
    float slx, sl2;
    signed_codes(n, nmax, x, (float)-nmax / xm, best, &slx, &sl2);
    float scale = sl2 != 0 ? slx / sl2 : 0.0f, gain = scale * slx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        signed_codes(n, nmax, x, -((float)nmax + 0.1f * (float)k) / xm, cur, &slx, &sl2);
        if (sl2 > 0 && slx * slx > gain * sl2) {
            memcpy(best, cur, (size_t)n);
            scale = slx / sl2;
            gain = scale * slx;
        }
    }
    for (int i = 0; i < n; i++) q[i] = (uint8_t)(best[i] + nmax);
    return scale;
}

/* The same problem solved another way (ggml's make_q3_quants with do_rmse): codes from the inverse
 * scale -nmax / xm, then up to 5 sweeps that move each code to the one its own least-squares fit
 * asks for, kept when the fit's (sum w x q)^2 / sum w q^2 grows. Returns s; q (n) = code + nmax. */
static float search_signed_sweeps(int n, int nmax, const float *x, uint8_t *q)
{
    int8_t l[16]; /* (n) */
    float amax;
    const float xm = signed_max(x, n, &amax);
    if (amax < GROUP_EPS) {
        memset(q, 0, (size_t)n);
        return 0;
    }
    float slx, sl2;
    signed_codes(n, nmax, x, (float)-nmax / xm, l, &slx, &sl2);
    for (int sweep = 0; sweep < 5; sweep++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float tx = slx - w * x[i] * (float)l[i];
            if (tx > 0) {
                float t2 = sl2 - w * (float)l[i] * (float)l[i];
                const int nl = clampi(nearest(x[i] * t2 / tx), -nmax, nmax - 1);
                if (nl != l[i]) {
                    tx += w * x[i] * (float)nl;
                    t2 += w * (float)nl * (float)nl;
                    if (t2 > 0 && tx * tx * sl2 > slx * slx * t2) {
                        l[i] = (int8_t)nl;
                        slx = tx;
                        sl2 = t2;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) q[i] = (uint8_t)(l[i] + nmax);
    return sl2 > 0 ? slx / sl2 : 0.0f;
}

/* Affine codes q in [0, nmax] with x ~ s q - m (m >= 0), for x (n) and weights w (n), minimising
 * sum w |err| (mad) or sum w err^2: first the codes of the plain range [min(x, 0), max x], then
 * nstep + 1 candidate inverse scales (nmax + rmin + k rdelta) / range; for each, the weighted
 * least-squares s and offset of its codes (the offset held <= 0, refitting s when it must be);
 * the candidate of least error wins, and later candidates are placed from the best offset so far.
 * Returns s, *m_out = m; q (n) the codes. (ggml's make_qkx2_quants.) */
static float search_affine(int n, int nmax, const float *x, const float *w, uint8_t *q, float *m_out, float rmin,
                           float rdelta, int nstep, bool mad)
{
    uint8_t aux[32]; /* (n) */
    float lo = x[0], hi = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(q, 0, (size_t)n);
        *m_out = -lo;
        return 0;
    }
    float is = (float)nmax / (hi - lo), scale = 1 / is, best = 0;
    for (int i = 0; i < n; i++) {
        q[i] = (uint8_t)clampi(nearest(is * (x[i] - lo)), 0, nmax);
        const float e = scale * (float)q[i] + lo - x[i];
        best += w[i] * (mad ? fabsf(e) : e * e);
    }
    for (int k = 0; k <= nstep; k++) {
        is = (rmin + rdelta * (float)k + (float)nmax) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(is * (x[i] - lo)), 0, nmax);
            aux[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)l * (float)l;
            sxl += w[i] * (float)l * x[i];
        }
        const float det = sum_w * sl2 - sl * sl;
        if (det > 0) {
            float s = (sum_w * sxl - sum_x * sl) / det, off = (sl2 * sum_x - sl * sxl) / det;
            if (off > 0) {
                off = 0;
                s = sxl / sl2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                const float e = s * (float)aux[i] + off - x[i];
                err += w[i] * (mad ? fabsf(e) : e * e);
            }
            if (err < best) {
                memcpy(q, aux, (size_t)n);
                best = err;
                scale = s;
                lo = off;
            }
        }
    }
    *m_out = -lo;
    return scale;
}

/* ---- K types: the blocks ------------------------------------------------------------------ */

/* Q2_K (84 bytes): 16 groups of 16, 2-bit codes, x ~ (d sc) q - (dmin m) with 4-bit sc and m.
 * Per group search_affine (weights |x|, absolute error); sc, m = round(15 s / max s), likewise m. */
int64_t rlx_q2_k_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 256; blk++, x += 256, b += RLX_Q2_K_BYTES) {
        uint8_t L[256];
        float s[16], m[16], w[16], smax = 0, mmax = 0;
        for (int g = 0; g < 16; g++) {
            for (int i = 0; i < 16; i++) w[i] = fabsf(x[16 * g + i]);
            s[g] = search_affine(16, 3, x + 16 * g, w, L + 16 * g, &m[g], -0.5f, 0.1f, 15, true);
            if (s[g] > smax) smax = s[g];
            if (m[g] > mmax) mmax = m[g];
        }
        uint8_t *sc = b, *qs = b + 16;
        bool ok = true;
        if (smax > 0) {
            const float is = 15.0f / smax;
            for (int g = 0; g < 16; g++) sc[g] = (uint8_t)clampi(nearest(is * s[g]), 0, 15);
            ok &= put_half(b + 80, smax / 15.0f);
        } else {
            memset(sc, 0, 16);
            put_half(b + 80, 0.0f);
        }
        if (mmax > 0) {
            const float is = 15.0f / mmax;
            for (int g = 0; g < 16; g++) sc[g] |= (uint8_t)(clampi(nearest(is * m[g]), 0, 15) << 4);
            ok &= put_half(b + 82, mmax / 15.0f);
        } else {
            put_half(b + 82, 0.0f);
        }
        if (!ok && bad < 0) bad = blk;
        const float d = get_half(b + 80), dmin = get_half(b + 82);
        for (int g = 0; g < 16; g++) {
            const float dg = d * (float)(sc[g] & 0x0F);
            if (dg == 0) continue;
            const float mg = dmin * (float)(sc[g] >> 4);
            for (int i = 0; i < 16; i++) L[16 * g + i] = (uint8_t)clampi(nearest((x[16 * g + i] + mg) / dg), 0, 3);
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *c = L + 128 * h + l;
                qs[32 * h + l] = (uint8_t)(c[0] | c[32] << 2 | c[64] << 4 | c[96] << 6);
            }
    }
    return bad;
}

/* Q3_K (110 bytes): 16 groups of 16, 3-bit signed codes, x ~ (d sc) q with 6-bit signed sc. Per
 * group search_signed_sweeps; sc = round(-32 s / s*) (s* the scale of largest magnitude). */
int64_t rlx_q3_k_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 256; blk++, x += 256, b += RLX_Q3_K_BYTES) {
        uint8_t L[256];
        float s[16], smax = 0, amax = 0;
        for (int g = 0; g < 16; g++) {
            s[g] = search_signed_sweeps(16, 4, x + 16 * g, L + 16 * g);
            if (fabsf(s[g]) > amax) {
                amax = fabsf(s[g]);
                smax = s[g];
            }
        }
        uint8_t *hm = b, *qs = b + 32, *sp = b + 96;
        memset(sp, 0, 12);
        if (smax != 0) {
            const float is = -32.0f / smax;
            for (int g = 0; g < 16; g++) {
                const int l = clampi(nearest(is * s[g]), -32, 31) + 32;
                if (g < 8)
                    sp[g] = (uint8_t)(l & 0x0F);
                else
                    sp[g - 8] |= (uint8_t)((l & 0x0F) << 4);
                sp[8 + g % 4] |= (uint8_t)((l >> 4) << (2 * (g / 4)));
            }
            if (!put_half(b + 108, 1 / is) && bad < 0) bad = blk;
        } else {
            put_half(b + 108, 0.0f);
        }
        const float d = get_half(b + 108);
        for (int g = 0; g < 16; g++) {
            const int lo = g < 8 ? sp[g] & 0x0F : sp[g - 8] >> 4;
            const int sc = (lo | ((sp[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
            const float dg = d * (float)sc;
            if (dg == 0) continue;
            for (int i = 0; i < 16; i++) L[16 * g + i] = (uint8_t)(clampi(nearest(x[16 * g + i] / dg), -4, 3) + 4);
        }
        memset(hm, 0, 32);
        for (int e = 0; e < 256; e++)
            if (L[e] > 3) {
                hm[e % 32] |= (uint8_t)(1u << (e / 32));
                L[e] -= 4;
            }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *c = L + 128 * h + l;
                qs[32 * h + l] = (uint8_t)(c[0] | c[32] << 2 | c[64] << 4 | c[96] << 6);
            }
    }
    return bad;
}

/* The 12 bytes of 6-bit scales and minimums of a Q4_K / Q5_K block (quants.c's k4_scale_min reads
 * them back): groups 0..3 in the low 6 bits of bytes g and g + 4, groups 4..7 split into a nibble
 * of byte g + 4 and 2 bits at the top of bytes g - 4 (scale) and g (minimum). */
static void put_k4_scales(uint8_t *p, const uint8_t *sc, const uint8_t *m)
{
    for (int g = 0; g < 8; g++) {
        if (g < 4) {
            p[g] = sc[g];
            p[g + 4] = m[g];
        } else {
            p[g + 4] = (uint8_t)((sc[g] & 0x0F) | (m[g] & 0x0F) << 4);
            p[g - 4] |= (uint8_t)((sc[g] >> 4) << 6);
            p[g] |= (uint8_t)((m[g] >> 4) << 6);
        }
    }
}

/* Q4_K / Q5_K (144 / 176 bytes): 8 groups of 32, nmax = 15 / 31, x ~ (d sc) q - (dmin m) with 6-bit
 * sc and m. Per group search_affine (weights rms(group) + |x|, squared error); sc = round(63 s /
 * max s), likewise m. Writes d, dmin and the scales; returns whether both halves are finite;
 * L (256) gets the final codes. */
static bool k4_block(uint8_t *b, const float *x, int nmax, float rmin, int nstep, uint8_t *L)
{
    float s[8], m[8], w[32], smax = 0, mmax = 0;
    for (int g = 0; g < 8; g++) {
        const float *xg = x + 32 * g;
        float sum2 = 0;
        for (int i = 0; i < 32; i++) sum2 += xg[i] * xg[i];
        const float rms = sqrtf(sum2 / 32);
        for (int i = 0; i < 32; i++) w[i] = rms + fabsf(xg[i]);
        s[g] = search_affine(32, nmax, xg, w, L + 32 * g, &m[g], rmin, 0.1f, nstep, false);
        if (s[g] > smax) smax = s[g];
        if (m[g] > mmax) mmax = m[g];
    }
    const float is = smax > 0 ? 63.0f / smax : 0.0f, im = mmax > 0 ? 63.0f / mmax : 0.0f;
    uint8_t sc[8], mq[8];
    for (int g = 0; g < 8; g++) {
        sc[g] = (uint8_t)clampi(nearest(is * s[g]), 0, 63);
        mq[g] = (uint8_t)clampi(nearest(im * m[g]), 0, 63);
    }
    put_k4_scales(b + 4, sc, mq);
    const bool ok = put_half(b, smax / 63.0f) & put_half(b + 2, mmax / 63.0f);
    const float d = get_half(b), dmin = get_half(b + 2);
    for (int g = 0; g < 8; g++) {
        const float dg = d * (float)sc[g];
        if (dg == 0) continue;
        const float mg = dmin * (float)mq[g];
        for (int i = 0; i < 32; i++) L[32 * g + i] = (uint8_t)clampi(nearest((x[32 * g + i] + mg) / dg), 0, nmax);
    }
    return ok;
}

int64_t rlx_q4_k_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 256; blk++, x += 256, b += RLX_Q4_K_BYTES) {
        uint8_t L[256];
        if (!k4_block(b, x, 15, -1.0f, 20, L) && bad < 0) bad = blk;
        uint8_t *qs = b + 16;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
    }
    return bad;
}

int64_t rlx_q5_k_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 256; blk++, x += 256, b += RLX_Q5_K_BYTES) {
        uint8_t L[256];
        if (!k4_block(b, x, 31, -0.5f, 15, L) && bad < 0) bad = blk;
        uint8_t *qh = b + 16, *qs = b + 48;
        memset(qh, 0, 32);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
                qs[32 * c + l] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
            }
    }
    return bad;
}

/* Q6_K (210 bytes): 16 groups of 16, 6-bit signed codes, x ~ (d sc) q with int8 sc. Per group
 * search_signed; sc = round(-128 s / s*) capped at 127 (s* the scale of largest magnitude); a block
 * of zeros is all zero bytes. */
int64_t rlx_q6_k_from_f32(void *dst, const float *x, int64_t n)
{
    int64_t bad = -1;
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 256; blk++, x += 256, b += RLX_Q6_K_BYTES) {
        uint8_t L[256];
        float s[16], smax = 0, amax = 0;
        for (int g = 0; g < 16; g++) {
            s[g] = search_signed(16, 32, x + 16 * g, L + 16 * g);
            if (fabsf(s[g]) > amax) {
                amax = fabsf(s[g]);
                smax = s[g];
            }
        }
        memset(b, 0, RLX_Q6_K_BYTES);
        if (amax < GROUP_EPS) continue;
        uint8_t *ql = b, *qh = b + 128;
        int8_t sc[16];
        const float is = -128.0f / smax;
        if (!put_half(b + 208, 1 / is) && bad < 0) bad = blk;
        for (int g = 0; g < 16; g++) sc[g] = (int8_t)clampi(nearest(is * s[g]), -128, 127);
        memcpy(b + 192, sc, 16);
        const float d = get_half(b + 208);
        for (int g = 0; g < 16; g++) {
            const float dg = d * (float)sc[g];
            if (dg == 0) continue;
            for (int i = 0; i < 16; i++) L[16 * g + i] = (uint8_t)(clampi(nearest(x[16 * g + i] / dg), -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *c = L + 128 * h + l;
                ql[64 * h + l] = (uint8_t)((c[0] & 0x0F) | (c[64] & 0x0F) << 4);
                ql[64 * h + 32 + l] = (uint8_t)((c[32] & 0x0F) | (c[96] & 0x0F) << 4);
                qh[32 * h + l] = (uint8_t)(c[0] >> 4 | (c[32] >> 4) << 2 | (c[64] >> 4) << 4 | (c[96] >> 4) << 6);
            }
    }
    return bad;
}

/* ---- the checked entry point -------------------------------------------------------------- */

rlx_status rlx_quantize(enum rlx_dtype dt, const float *x, int64_t rows, int64_t cols, void *dst)
{
    const struct rlx_dtype_traits *t = rlx_dtype_traits(dt);
    if (!t) return rlx_set_error(RLX_ERR_DTYPE, "dtype %d is not an rlx dtype", (int)dt);
    if (!t->from_f32)
        return rlx_set_error(RLX_ERR_DTYPE, "%s holds no real numbers: nothing is quantised to it", t->name);
    if (rows < 0 || cols < 0)
        return rlx_set_error(RLX_ERR_SHAPE, "quantize to %s: a negative shape (%lld, %lld)", t->name, (long long)rows,
                             (long long)cols);
    if (cols % t->block_size)
        return rlx_set_error(RLX_ERR_SHAPE, "quantize to %s: rows of %lld values are not whole blocks of %lld", t->name,
                             (long long)cols, (long long)t->block_size);
    size_t row_bytes;
    RLX_TRY(rlx_dtype_bytes(dt, cols, &row_bytes));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            if (!isfinite(x[r * cols + c]))
                return rlx_set_error(RLX_ERR_INVALID, "quantize to %s: row %lld, column %lld holds %s", t->name,
                                     (long long)r, (long long)c, isnan(x[r * cols + c]) ? "NaN" : "an infinity");
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        const int64_t bad = t->from_f32((uint8_t *)dst + (size_t)r * row_bytes, xr, cols);
        if (bad >= 0) {
            if (t->block_size == 1)
                return rlx_set_error(RLX_ERR_RANGE,
                                     "quantize to %s: row %lld, column %lld (%g) is past the "
                                     "largest finite %s",
                                     t->name, (long long)r, (long long)bad, (double)xr[bad], t->name);
            float amax = 0;
            for (int64_t c = bad * t->block_size; c < (bad + 1) * t->block_size; c++) amax = fmaxf(amax, fabsf(xr[c]));
            return rlx_set_error(RLX_ERR_RANGE,
                                 "quantize to %s: row %lld, block %lld (values up to %g): its f16 "
                                 "scale overflows (%s cannot hold such values)",
                                 t->name, (long long)r, (long long)bad, (double)amax, t->name);
        }
    }
    return RLX_OK;
}
