/*
 * attention_amx.c - the flash path (attention_vec.c; attention.c's header says what it computes) on
 * AMX-BF16 tiles, taken where rlx_cpu_isa() is RLX_CPU_ISA_AMX for K / V cached as f16 or bf16 with
 * D a multiple of 32 and S x T >= RLX_ATTN_AMX_MIN_WORK (rlx_cpu_attn_amx). The f32 items' products run at about the FMA units' peak
 * and were ~63 % of their time; TDPBF16PS multiplies 16 x 16 x 32 bf16 values an instruction.
 *
 * Precision. A tile product multiplies bf16 values (8 significant bits) exactly and sums in f32.
 * Every f16 value is the exact sum of two bf16 values, hi = bf16(x) (round to nearest even) and
 * lo = x - hi (at most 4 significant bits; bf16 has f16's range and more), and a bf16 value is its
 * own hi with lo = 0. The f32 operands are split the same way, hi + lo holding 16 of their 24 bits.
 * Each product is taken as hi.hi + hi.lo + lo.hi (the lo.lo term, ~2^-18 of a term, dropped):
 *   scores S (M, Bc) = Q K^T: Q = scale q (f32) split, K (cache) split exactly;
 *   values O (M, D) += P V: P (the softmax weights, f32 in [0, 1]) split, V split exactly.
 * So each term is within ~2^-17 (relative) of its f32 value. Measured against the ref table's
 * double sums (tests/c/test_attention.c, every f16 / bf16 case with D % 32 == 0): at most 5.7e-6 of
 * the output's scale here, 7.7e-7 on the f32 paths, the bound 1e-4; Qwen3-0.6B with f32 weights,
 * a 2048-token prompt, last logits within 3e-5 of their scale of the f32 path's. (With quantized
 * weights the logits move by more, 2-6 % of the scale on random-weight models: a difference that
 * carries an activation across a step of its 8-bit grid, as any change of summation order does.)
 * For scale: llama.cpp's CPU flash attention rounds Q to f16 (11 bits). TDPBF16PS reads bf16
 * subnormals as 0 and flushes subnormal sums: below 2^-126, nothing a score or a weight is made of.
 *
 * Work. K and V are split and laid out as tiles once per call: for a group of kv heads (their
 * tiles within PACK_BYTES, at least one head), a region packs every block of BC keys, then a region
 * runs the group's items (kv head, query block; the last blocks first, from a shared counter), so a
 * key block is packed once, not once per item that reads it. Per head, tpad x D words each of
 *   Kt hi, lo: per 16 keys and 32 values of d a B tile (16 pairs of d x 16 keys x 2), made from 16
 *     key rows by a 16 x 16 transpose of their 32-bit pairs, then split;
 *   Vp hi, lo: per 32 keys and 16 values of d a B tile (16 pairs of keys x 16 of d x 2), two key
 *     rows interleaved by one word permute, then split; a row that no query may see (the u8 mask)
 *     is zero, so the NaN / inf such a row may hold never meets its weight 0.
 * An item's rows r are the f32 item's columns (query i0 + r / G, head g G + r % G), M of them
 * padded to a multiple of 32 with zero rows that are never output; in its task's scratch:
 *   Qh, Ql (M, D) bf16, the scaled queries split (tile A of the scores: 16 rows x 32 values of d);
 *   S (M, Bc) f32 scores, then weights; Ph, Pl (M, Bc) the weights split (tile A of the values);
 *   O (M, D) f32 the output so far (tiles loaded, multiplied into, stored back); m, l, al (M).
 * A block's keys start at a multiple of BC (where the packed tiles start); the masks (causal,
 * window, u8 -> -inf, the f32 mask added, padding keys -inf), the online softmax (row by row: max,
 * exp with the max taken as 0 while a row has seen only -inf, rescale) are the f32 item's on this
 * layout. Each output is one fixed sequence of instructions whichever thread runs it: the same bits
 * at any thread count. Tiles: 0-3 sums (32 x 32), 4-5 A, 6-7 B.
 *
 * Measured on the Intel Xeon (2 threads, Qwen3-0.6B Q4_K_M GGUF, KV f16, whole prefills, the f32
 * items and these alternating, Generator.profile): 2048 tokens attention 2.74-2.79 -> 2.00-2.04 s
 * (prefill 5.7-5.8 -> 4.9-5.0 s), 8192 tokens 41.6 -> 28.2 s (53.8 -> 39.8 s); Llama-3.2-1B Q4_K_M,
 * 2048 tokens, 7.15 -> 6.66 s. The tile products themselves run at ~55-70 cycles an instruction on
 * this VM (as gemm_bf16.c's do), not the 16 of the specification; blocking them 32 x 32 instead of
 * 16 x 32 (fewer tile loads) changed nothing measurable.
 * Must never allocate.
 */
#include "backends/cpu/attention.h"
#include "backends/cpu/cpu.h"
#include "backends/cpu/pool.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define AX_ATTRS  "amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,f16c,fma"
#define AX_FN     __attribute__((target(AX_ATTRS), always_inline)) static inline
#define AX_TARGET __attribute__((target(AX_ATTRS)))

#define BC         RLX_ATTN_FLASH_BC
#define PACK_BYTES ((int64_t)16 << 20) /* packed K / V of a group of kv heads, at most (or one head's) */

/* Calls with S x T below this keep the f32 items: their attention is a small part of the prefill
 * (whole prefills, Qwen3-0.6B Q4_K_M: pp512 1.58-1.59 -> 1.45-1.47 s on the tiles, below that
 * within the noise), and there the f32 items' rounding costs nothing. Measured besides: with the
 * tiles from S = 8, tests/unit/test_quant_models.py's quantised models (16-token prompts) agreed
 * with the emulation to 1e-4 in 62-65 % of rows instead of the 75 % it asks (its activations' 8-bit
 * grid turns the tiles' ~1e-5 differences into a step more often than the f32 items' ~1e-6). */
#define RLX_ATTN_AMX_MIN_WORK ((int64_t)1 << 18)

int rlx_cpu_attn_amx(const struct rlx_attn_args *a)
{
    return rlx_cpu_isa() >= RLX_CPU_ISA_AMX && (a->kv_dtype == RLX_F16 || a->kv_dtype == RLX_BF16) && a->D > 0 &&
           a->D % 32 == 0 && a->S * a->T >= RLX_ATTN_AMX_MIN_WORK;
}

/* keys padded to whole blocks; kv heads per group (their packed K / V within PACK_BYTES, at least
 * one) */
static int64_t tpad(const struct rlx_attn_args *a) { return (a->T + BC - 1) / BC * BC; }
static int64_t group_heads(const struct rlx_attn_args *a)
{
    const int64_t h = PACK_BYTES / (tpad(a) * a->D * 8);
    return h < 1 ? 1 : h > a->Hkv ? a->Hkv : h;
}

int64_t rlx_cpu_attn_amx_task_floats(int64_t M, int64_t D) { return 2 * M * D + 2 * M * BC + 3 * M; }

int64_t rlx_cpu_attn_amx_shared_floats(const struct rlx_attn_args *a)
{
    if (!(a->kv_dtype == RLX_F16 || a->kv_dtype == RLX_BF16) || a->D <= 0 || a->D % 32 ||
        a->S * a->T < RLX_ATTN_AMX_MIN_WORK || rlx_cpu_isa_native() < RLX_CPU_ISA_AMX)
        return 0;
    return group_heads(a) * tpad(a) * a->D * 2; /* 4 words (K, V; hi, lo) per key and value of d */
}

/* x (32 f32 in x0, x1) split into 32 bf16 hi and 32 bf16 lo, in order */
AX_FN void split2(__m512 x0, __m512 x1, __m512i *hi, __m512i *lo)
{
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    const __m512 h1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    *hi = h;
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0));
}

/* 32 cached values (f16 or bf16 words, in a zmm) split exactly: bf16 is its own hi */
AX_FN void split_kv(__m512i v, const int dt, __m512i *hi, __m512i *lo)
{
    if (dt == RLX_BF16) {
        *hi = v, *lo = _mm512_setzero_si512();
        return;
    }
    split2(_mm512_cvtph_ps(_mm512_castsi512_si256(v)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1)), hi, lo);
}

/* Key rows [k0, k0 + n) of kv head g into one block of Kt hi / lo (BC / 16 x D / 32 tiles of 512
 * words; rows n .. BC zero) */
AX_FN void pack_k(const struct rlx_attn_args *a, int64_t k0, int64_t n, int64_t g, uint16_t *kh, uint16_t *kl,
                  const int dt)
{
    const int64_t D = a->D, rs = a->Hkv * D, ds = D / 32;
    const uint16_t *base = (const uint16_t *)a->k + g * D;
    for (int64_t kg = 0; kg < BC / 16; kg++)
        for (int64_t s = 0; s < ds; s++) {
            __m512i r[16];
            for (int64_t c = 0; c < 16; c++) {
                const int64_t key = kg * 16 + c;
                r[c] = key < n ? _mm512_loadu_si512(base + (k0 + key) * rs + 32 * s) : _mm512_setzero_si512();
            }
            rlx_cpu_transpose16(r); /* r[p]: the 16 keys' values 2p, 2p + 1 of this d range */
            uint16_t *th = kh + (kg * ds + s) * 512, *tl = kl + (kg * ds + s) * 512;
            for (int p = 0; p < 16; p++) {
                __m512i h, l;
                split_kv(r[p], dt, &h, &l);
                _mm512_storeu_si512(th + 32 * p, h);
                _mm512_storeu_si512(tl + 32 * p, l);
            }
        }
}

/* Value rows [k0, k0 + n) of kv head g into one block of Vp hi / lo (BC / 32 x D / 16 tiles of
 * 512 words): rows n .. BC, and rows no query sees (vis[c] == 0), zero */
AX_FN void pack_v(const struct rlx_attn_args *a, int64_t k0, int64_t n, int64_t g, const uint8_t *vis, uint16_t *vh,
                  uint16_t *vl, const int dt)
{
    const int64_t D = a->D, rs = a->Hkv * D, dg = D / 16;
    const uint16_t *base = (const uint16_t *)a->v + g * D;
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                         5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    for (int64_t ks = 0; ks < BC / 32; ks++)
        for (int p = 0; p < 16; p++) {
            const int64_t c0 = ks * 32 + 2 * p, c1 = c0 + 1;
            const int u0 = c0 < n && vis[c0], u1 = c1 < n && vis[c1];
            const uint16_t *r0 = base + (k0 + c0) * rs, *r1 = base + (k0 + c1) * rs;
            for (int64_t d = 0; d < dg; d++) {
                const __m512i x0 = u0 ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(r0 + 16 * d)))
                                      : _mm512_setzero_si512();
                const __m512i x1 = u1 ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(r1 + 16 * d)))
                                      : _mm512_setzero_si512();
                __m512i h, l;
                split_kv(_mm512_permutex2var_epi16(x0, idx, x1), dt, &h, &l);
                _mm512_storeu_si512(vh + (ks * dg + d) * 512 + 32 * p, h);
                _mm512_storeu_si512(vl + (ks * dg + d) * 512 + 32 * p, l);
            }
        }
}

/* tiles of sums 0-3 += A tiles 4, 5 x B tiles 6, 7 */
#define AMX_PRODUCTS4()                                                                                                \
    do {                                                                                                               \
        _tile_dpbf16ps(0, 4, 6);                                                                                       \
        _tile_dpbf16ps(1, 4, 7);                                                                                       \
        _tile_dpbf16ps(2, 5, 6);                                                                                       \
        _tile_dpbf16ps(3, 5, 7);                                                                                       \
    } while (0)

/* Four tiles of sums (0: rows a x columns b, 1: a x b1, 2: a1 x b, 3: a1 x b1) += the split
 * products of two A tiles (hi at ah, ah1; lo at al, al1; rows lda bytes apart) and two B tiles (hi
 * at bh, bh1, lo at bl, bl1; 64 bytes a row): hi.hi, hi.lo, lo.hi; 10 tile loads for 12 products. */
#define AMX_SPLIT4(ah, ah1, al, al1, lda, bh, bh1, bl, bl1)                                                            \
    do {                                                                                                               \
        _tile_loadd(4, ah, lda);                                                                                       \
        _tile_loadd(5, ah1, lda);                                                                                      \
        _tile_loadd(6, bh, 64);                                                                                        \
        _tile_loadd(7, bh1, 64);                                                                                       \
        AMX_PRODUCTS4();                                                                                               \
        _tile_loadd(6, bl, 64);                                                                                        \
        _tile_loadd(7, bl1, 64);                                                                                       \
        AMX_PRODUCTS4();                                                                                               \
        _tile_loadd(4, al, lda);                                                                                       \
        _tile_loadd(5, al1, lda);                                                                                      \
        _tile_loadd(6, bh, 64);                                                                                        \
        _tile_loadd(7, bh1, 64);                                                                                       \
        AMX_PRODUCTS4();                                                                                               \
    } while (0)

/* S (M, np) = Q K^T from the split operands, 32 x 32 at a time */
AX_FN void scores(float *S, const uint16_t *qh, const uint16_t *ql, const uint16_t *kh, const uint16_t *kl, int64_t M,
                  int64_t np, int64_t D)
{
    const int64_t ds = D / 32;
    for (int64_t q0 = 0; q0 < M; q0 += 32)
        for (int64_t kg = 0; kg < np / 16; kg += 2) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t s = 0; s < ds; s++) {
                const int64_t t0 = (kg * ds + s) * 512, t1 = ((kg + 1) * ds + s) * 512;
                AMX_SPLIT4(qh + q0 * D + 32 * s, qh + (q0 + 16) * D + 32 * s, ql + q0 * D + 32 * s,
                           ql + (q0 + 16) * D + 32 * s, D * 2, kh + t0, kh + t1, kl + t0, kl + t1);
            }
            float *o = S + q0 * np + 16 * kg;
            _tile_stored(0, o, np * 4);
            _tile_stored(1, o + 16, np * 4);
            _tile_stored(2, o + 16 * np, np * 4);
            _tile_stored(3, o + 16 * np + 16, np * 4);
        }
}

/* O (M, D) += P V from the split operands, 32 x 32 at a time */
AX_FN void values(float *O, const uint16_t *ph, const uint16_t *pl, const uint16_t *vh, const uint16_t *vl, int64_t M,
                  int64_t np, int64_t D)
{
    const int64_t dg = D / 16;
    for (int64_t q0 = 0; q0 < M; q0 += 32)
        for (int64_t d = 0; d < dg; d += 2) {
            float *o = O + q0 * D + 16 * d;
            _tile_loadd(0, o, D * 4);
            _tile_loadd(1, o + 16, D * 4);
            _tile_loadd(2, o + 16 * D, D * 4);
            _tile_loadd(3, o + 16 * D + 16, D * 4);
            for (int64_t ks = 0; ks < np / 32; ks++) {
                const int64_t t0 = (ks * dg + d) * 512, t1 = t0 + 512;
                AMX_SPLIT4(ph + q0 * np + 32 * ks, ph + (q0 + 16) * np + 32 * ks, pl + q0 * np + 32 * ks,
                           pl + (q0 + 16) * np + 32 * ks, np * 2, vh + t0, vh + t1, vl + t0, vl + t1);
            }
            _tile_stored(0, o, D * 4);
            _tile_stored(1, o + 16, D * 4);
            _tile_stored(2, o + 16 * D, D * 4);
            _tile_stored(3, o + 16 * D + 16, D * 4);
        }
}
#undef AMX_SPLIT4
#undef AMX_PRODUCTS4

/* The f32 item's masks on this layout: S row r (query i0 + r / G) at key k0 + c becomes -inf where
 * the query may not see the key (causal, window, the u8 mask) and for c >= n; the f32 mask is added
 * where it may. */
static void mask_block(const struct rlx_attn_args *a, float *S, int64_t k0, int64_t n, int64_t np, int64_t i0,
                       int64_t mr)
{
    const int64_t G = a->Hq / a->Hkv, R = mr / G;
    for (int64_t ii = 0; ii < R; ii++) {
        const int64_t i = i0 + ii, qpos = a->T - a->S + i;
        for (int64_t c = 0; c < np; c++) {
            const int64_t kpos = k0 + c;
            const int ok = c < n && (!a->causal || kpos <= qpos) && (a->window <= 0 || kpos > qpos - a->window) &&
                           (!a->mask_u8 || a->mask_u8[i * a->T + kpos]);
            const float add = ok && a->mask_f32 ? a->mask_f32[i * a->T + kpos] : 0.0f;
            for (int64_t hh = 0; hh < G; hh++) {
                float *s = S + (ii * G + hh) * np + c;
                *s = ok ? *s + add : -INFINITY;
            }
        }
    }
}

/* The online softmax of the block's rows (as the f32 item's per column): m[r] becomes the running
 * max, S's row the weights exp(s - m[r]) (the max taken as 0 while the row has seen only -inf),
 * al[r] = exp(old m[r] - new m[r]), l[r] = l[r] al[r] + the row's sum; the weights split into Ph, Pl. */
AX_FN void softmax(float *S, uint16_t *ph, uint16_t *pl, int64_t M, int64_t np, float *m, float *l, float *al)
{
    for (int64_t r0 = 0; r0 < M; r0 += 16) {
        _Alignas(64) float mx[16];
        for (int r = 0; r < 16; r++) {
            const float *row = S + (r0 + r) * np;
            __m512 v = _mm512_loadu_ps(row);
            for (int64_t c = 16; c < np; c += 16) v = _mm512_max_ps(v, _mm512_loadu_ps(row + c));
            mx[r] = _mm512_reduce_max_ps(v);
        }
        const __m512 mo = _mm512_loadu_ps(m + r0), mn = _mm512_max_ps(mo, _mm512_load_ps(mx));
        const __m512 mz = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), mn,
                                               _mm512_setzero_ps());
        rlx_cpu_v16 alpha = (rlx_cpu_v16)_mm512_sub_ps(mo, mz);
        rlx_cpu_exp16(&alpha);
        _mm512_storeu_ps(m + r0, mn);
        _mm512_storeu_ps(al + r0, (__m512)alpha);
        _Alignas(64) float zs[16], sums[16];
        _mm512_store_ps(zs, mz);
        for (int r = 0; r < 16; r++) {
            float *row = S + (r0 + r) * np;
            __m512 sum = _mm512_setzero_ps();
            for (int64_t c = 0; c < np; c += 32) {
                rlx_cpu_v16 x0 = (rlx_cpu_v16)_mm512_sub_ps(_mm512_loadu_ps(row + c), _mm512_set1_ps(zs[r]));
                rlx_cpu_v16 x1 = (rlx_cpu_v16)_mm512_sub_ps(_mm512_loadu_ps(row + c + 16), _mm512_set1_ps(zs[r]));
                rlx_cpu_exp16(&x0);
                rlx_cpu_exp16(&x1);
                sum = _mm512_add_ps(sum, _mm512_add_ps((__m512)x0, (__m512)x1));
                __m512i h, lo;
                split2((__m512)x0, (__m512)x1, &h, &lo);
                _mm512_storeu_si512(ph + (r0 + r) * np + c, h);
                _mm512_storeu_si512(pl + (r0 + r) * np + c, lo);
            }
            sums[r] = _mm512_reduce_add_ps(sum);
        }
        _mm512_storeu_ps(l + r0, _mm512_fmadd_ps(_mm512_loadu_ps(l + r0), (__m512)alpha, _mm512_load_ps(sums)));
    }
}

struct amx_ctx {
    const struct rlx_attn_args *a;
    uint16_t *pack;                     /* the group's packed K / V: per head Kh, Kl, Vh, Vl of tpad x D words */
    int64_t g0, ng, nb;                 /* the group's first kv head, its heads, key blocks a head */
    int64_t br, nqb, Mmax, task_floats; /* query positions an item, query blocks, columns an item at most */
    atomic_llong next;                  /* the next item to take */
};

static uint16_t *head_pack(const struct amx_ctx *c, int64_t g)
{
    return c->pack + (g - c->g0) * tpad(c->a) * c->a->D * 4;
}

/* Packs blocks [begin, end) of the group (head-major); a value row no query sees (the u8 mask) is
 * zeroed, as the f32 item zeroes a row none of its queries sees. */
AX_TARGET static void pack_blocks(void *p, int64_t begin, int64_t end)
{
    const struct amx_ctx *c = p;
    const struct rlx_attn_args *a = c->a;
    const int64_t D = a->D, tp = tpad(a);
    for (int64_t j = begin; j < end; j++) {
        const int64_t g = c->g0 + j / c->nb, k0 = j % c->nb * BC, n = a->T - k0 < BC ? a->T - k0 : BC;
        uint8_t vis[BC];
        memset(vis, 1, sizeof vis);
        if (a->mask_u8) {
            memset(vis, 0, sizeof vis);
            for (int64_t i = 0; i < a->S; i++) {
                const int64_t qpos = a->T - a->S + i;
                for (int64_t cc = 0; cc < n; cc++) {
                    const int64_t kpos = k0 + cc;
                    vis[cc] |= (uint8_t)((!a->causal || kpos <= qpos) && (a->window <= 0 || kpos > qpos - a->window) &&
                                         a->mask_u8[i * a->T + kpos]);
                }
            }
        }
        uint16_t *kh = head_pack(c, g) + k0 * D, *kl = kh + tp * D, *vh = kl + tp * D, *vl = vh + tp * D;
        if (a->kv_dtype == RLX_F16) {
            pack_k(a, k0, n, g, kh, kl, RLX_F16);
            pack_v(a, k0, n, g, vis, vh, vl, RLX_F16);
        } else {
            pack_k(a, k0, n, g, kh, kl, RLX_BF16);
            pack_v(a, k0, n, g, vis, vh, vl, RLX_BF16);
        }
    }
}

/* query positions of the item from i0 */
static int64_t a_rows(const struct rlx_attn_args *a, int64_t i0, int64_t br) { return a->S - i0 < br ? a->S - i0 : br; }

/* One item: kv head g, R query positions from i0 (M columns), in the task scratch w */
AX_TARGET static void amx_item(const struct amx_ctx *c, int64_t i0, int64_t R, int64_t g, float *w)
{
    const struct rlx_attn_args *a = c->a;
    const int64_t D = a->D, G = a->Hq / a->Hkv, Hq = a->Hq, mr = R * G, M = (mr + 31) / 32 * 32, Mmax = c->Mmax;
    const int64_t tp = tpad(a);
    uint16_t *qh = (uint16_t *)w, *ql = qh + Mmax * D;
    float *O = w + Mmax * D, *S = O + Mmax * D;
    uint16_t *ph = (uint16_t *)(S + Mmax * BC), *pl = ph + Mmax * BC;
    float *m = (float *)(pl + Mmax * BC), *l = m + Mmax, *al = l + Mmax;
    const uint16_t *pk = head_pack(c, g);

    for (int64_t r = 0; r < M; r++) { /* Qh, Ql: row r = (query i0 + r / G, head g G + r % G), scaled */
        const float *qr = r < mr ? a->q + ((i0 + r / G) * Hq + g * G + r % G) * D : NULL;
        for (int64_t e = 0; e < D; e += 32) {
            __m512i h = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
            if (qr)
                split2(_mm512_mul_ps(_mm512_loadu_ps(qr + e), _mm512_set1_ps(a->scale)),
                       _mm512_mul_ps(_mm512_loadu_ps(qr + e + 16), _mm512_set1_ps(a->scale)), &h, &lo);
            _mm512_storeu_si512(qh + r * D + e, h);
            _mm512_storeu_si512(ql + r * D + e, lo);
        }
        m[r] = -INFINITY, l[r] = 0.0f;
    }
    memset(O, 0, (size_t)(M * D) * sizeof(float));
    int64_t lo, hi, lo_last, hi_last;
    attn_visible(a, i0, &lo, &hi);
    attn_visible(a, i0 + R - 1, &lo_last, &hi_last);
    hi = hi_last; /* from the first row's first key to the last row's last, in whole packed blocks */
    const int64_t qfirst = a->T - a->S + i0, qlast = qfirst + R - 1;
    for (int64_t k0 = lo / BC * BC; k0 < hi; k0 += BC) {
        const int64_t n = hi - k0 < BC ? hi - k0 : BC, np = (n + 31) / 32 * 32;
        const uint16_t *kh = pk + k0 * D, *kl = kh + tp * D, *vh = kl + tp * D, *vl = vh + tp * D;
        scores(S, qh, ql, kh, kl, M, np, D);
        const int whole = n == np && !a->mask_f32 && !a->mask_u8 && (!a->causal || k0 + n - 1 <= qfirst) &&
                          (a->window <= 0 || k0 > qlast - a->window);
        if (!whole) mask_block(a, S, k0, n, np, i0, mr);
        softmax(S, ph, pl, M, np, m, l, al);
        for (int64_t r = 0; r < M; r++) { /* O rows whose max moved: times exp(old max - new max) */
            if (al[r] == 1.0f) continue;
            const __m512 f = _mm512_set1_ps(al[r]);
            for (int64_t e = 0; e < D; e += 16)
                _mm512_storeu_ps(O + r * D + e, _mm512_mul_ps(_mm512_loadu_ps(O + r * D + e), f));
        }
        values(O, ph, pl, vh, vl, M, np, D);
    }
    for (int64_t r = 0; r < mr; r++) { /* out row (query, head) = O row / l; zeros when nothing was visible */
        float *o = a->out + ((i0 + r / G) * Hq + g * G + r % G) * D;
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        for (int64_t e = 0; e < D; e++) o[e] = l[r] == 0.0f ? 0.0f : O[r * D + e] * inv;
    }
}

/* The group's items (kv head, query block; the last blocks first: under a causal mask they see the
 * most keys, so the pool's threads finish together) from a shared counter; the tiles configured
 * once a task */
AX_TARGET static void item_tasks(void *p, int64_t begin, int64_t end)
{
    struct amx_ctx *c = p;
    struct rlx_cpu_tilecfg cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    for (int64_t t = begin; t < end; t++) {
        float *w = c->a->scratch + t * c->task_floats;
        for (int64_t idx; (idx = atomic_fetch_add(&c->next, 1)) < c->ng * c->nqb;) {
            const int64_t qb = c->nqb - 1 - idx / c->ng, g = c->g0 + idx % c->ng, i0 = qb * c->br;
            amx_item(c, i0, a_rows(c->a, i0, c->br), g, w);
        }
    }
    _tile_release();
}

void rlx_cpu_attn_flash_amx(const struct rlx_attn_args *a, int64_t br, int64_t Mmax, int64_t task_floats)
{
    const int64_t threads = rlx_pool_threads(), gh = group_heads(a);
    struct amx_ctx c = {.a = a,
                        .pack = (uint16_t *)(a->scratch + threads * task_floats),
                        .nb = tpad(a) / BC,
                        .br = br,
                        .nqb = (a->S + br - 1) / br,
                        .Mmax = Mmax,
                        .task_floats = task_floats};
    for (c.g0 = 0; c.g0 < a->Hkv; c.g0 += gh) {
        c.ng = a->Hkv - c.g0 < gh ? a->Hkv - c.g0 : gh;
        rlx_parallel_for(c.ng * c.nb, 1, pack_blocks, &c);
        atomic_init(&c.next, 0);
        const int64_t items = c.ng * c.nqb;
        rlx_parallel_for(threads < items ? threads : items, 1, item_tasks, &c);
    }
}
