// weights.glsl - reading a weight matrix of dtype WTYPE (a -D define) bound at binding W_BINDING:
//   f32, f16, bf16:  float load_w(uint i)            element i of the bound range, widened exactly
//   block types:     void deq16(uint row, uint k0, out float v[16])
//                    elements k0 .. k0+15 (k0 a multiple of 16) of the row starting at byte `row`,
//                    dequantised inside the shader with the float operations, in the order, of
//                    csrc/core/quants.c (`precise`: no contraction into fma), so a value here is
//                    bit for bit the one gguf-py's dequantize gives.
// Layouts (ggml's; see quants.c): every f16 scale sits at an even byte offset of its block and
// every block size is even, so scales are read through the 16-bit view of the same binding.
#if WTYPE == DT_F32
layout(binding = W_BINDING) readonly buffer Wf { float w_f32[]; };
float load_w(uint i) { return w_f32[i]; }
#elif WTYPE == DT_F16
layout(binding = W_BINDING) readonly buffer Wh { uint16_t w_u16[]; };
float load_w(uint i) { return f16_to_f32(uint(w_u16[i])); }
#elif WTYPE == DT_BF16
layout(binding = W_BINDING) readonly buffer Wh { uint16_t w_u16[]; };
float load_w(uint i) { return bf16_to_f32(uint(w_u16[i])); }
#else
#define W_BLOCK 1
layout(binding = W_BINDING) readonly buffer Wb { uint8_t w_u8[]; };
layout(binding = W_BINDING) readonly buffer Wh { uint16_t w_u16[]; };
uint u8(uint byte) { return uint(w_u8[byte]); }
int i8(uint byte) { return bitfieldExtract(int(w_u8[byte]), 0, 8); }
float half_at(uint byte) { return f16_to_f32(uint(w_u16[byte >> 1])); }
uint u32_at(uint byte) { return u8(byte) | u8(byte + 1u) << 8 | u8(byte + 2u) << 16 | u8(byte + 3u) << 24; }

#if WTYPE == DT_Q8_0          // 34 bytes / 32: f16 d, int8 q[32]; d * q
#define W_BLOCK_SIZE 32u
#define W_TYPE_SIZE 34u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 32u) * 34u, j0 = k0 % 32u;
    float d = half_at(b);
    for (uint j = 0u; j < 16u; j++) { precise float y = d * float(i8(b + 2u + j0 + j)); v[j] = y; }
}
#elif WTYPE == DT_Q4_0        // 18 / 32: f16 d, 16 bytes of nibbles (low: 0..15, high: 16..31); d * (q - 8)
#define W_BLOCK_SIZE 32u
#define W_TYPE_SIZE 18u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 32u) * 18u, sh = (k0 % 32u) == 0u ? 0u : 4u;
    float d = half_at(b);
    for (uint j = 0u; j < 16u; j++) { precise float y = d * float(int((u8(b + 2u + j) >> sh) & 15u) - 8); v[j] = y; }
}
#elif WTYPE == DT_Q4_1        // 20 / 32: f16 d, f16 m, 16 bytes of nibbles; d * q + m
#define W_BLOCK_SIZE 32u
#define W_TYPE_SIZE 20u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 32u) * 20u, sh = (k0 % 32u) == 0u ? 0u : 4u;
    float d = half_at(b), m = half_at(b + 2u);
    for (uint j = 0u; j < 16u; j++) { precise float y = d * float((u8(b + 4u + j) >> sh) & 15u) + m; v[j] = y; }
}
#elif WTYPE == DT_Q5_0        // 22 / 32: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles; d * (q - 16)
#define W_BLOCK_SIZE 32u
#define W_TYPE_SIZE 22u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 32u) * 22u, j0 = k0 % 32u, sh = j0 == 0u ? 0u : 4u;
    float d = half_at(b);
    uint qh = u32_at(b + 2u);
    for (uint j = 0u; j < 16u; j++) {
        int q = int(((u8(b + 6u + j) >> sh) & 15u) | ((qh >> (j0 + j)) & 1u) << 4);
        precise float y = d * float(q - 16);
        v[j] = y;
    }
}
#elif WTYPE == DT_Q5_1        // 24 / 32: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles; d * q + m
#define W_BLOCK_SIZE 32u
#define W_TYPE_SIZE 24u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 32u) * 24u, j0 = k0 % 32u, sh = j0 == 0u ? 0u : 4u;
    float d = half_at(b), m = half_at(b + 2u);
    uint qh = u32_at(b + 4u);
    for (uint j = 0u; j < 16u; j++) {
        uint q = ((u8(b + 8u + j) >> sh) & 15u) | ((qh >> (j0 + j)) & 1u) << 4;
        precise float y = d * float(q) + m;
        v[j] = y;
    }
}
#elif WTYPE == DT_Q2_K        // 84 / 256: scales[16] (4-bit scale | 4-bit min), qs[64], f16 d, f16 dmin
#define W_BLOCK_SIZE 256u
#define W_TYPE_SIZE 84u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 256u) * 84u, e0 = k0 % 256u, g = e0 / 16u;
    float d = half_at(b + 80u), dmin = half_at(b + 82u);
    uint sc = u8(b + g);
    precise float dl = d * float(sc & 15u);
    precise float ml = dmin * float(sc >> 4);
    uint h = e0 / 128u, k = (e0 % 128u) / 32u, l0 = e0 % 32u;
    for (uint j = 0u; j < 16u; j++) {
        uint q = (u8(b + 16u + 32u * h + l0 + j) >> (2u * k)) & 3u;
        precise float y = dl * float(q) - ml;
        v[j] = y;
    }
}
#elif WTYPE == DT_Q3_K        // 110 / 256: hmask[32], qs[64], 12 bytes of 6-bit scales, f16 d
#define W_BLOCK_SIZE 256u
#define W_TYPE_SIZE 110u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 256u) * 110u, e0 = k0 % 256u, g = e0 / 16u;
    uint lo = g < 8u ? u8(b + 96u + g) & 15u : u8(b + 96u + g - 8u) >> 4;
    uint hi = (u8(b + 104u + g % 4u) >> (2u * (g / 4u))) & 3u;
    int sc = int(lo | hi << 4) - 32;
    float d = half_at(b + 108u);
    precise float dl = d * float(sc);
    uint h = e0 / 128u, k = (e0 % 128u) / 32u, l0 = e0 % 32u;
    for (uint j = 0u; j < 16u; j++) {
        uint l = l0 + j;
        int q = int((u8(b + 32u + 32u * h + l) >> (2u * k)) & 3u) - (((u8(b + l) >> (4u * h + k)) & 1u) != 0u ? 0 : 4);
        precise float y = dl * float(q);
        v[j] = y;
    }
}
#else                          // Q4_K, Q5_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 groups of 32
// Scale and minimum of group g from the 12 packed bytes at `p` (ggml's get_scale_min_k4).
void k4_scale_min(uint p, uint g, out uint sc, out uint m)
{
    if (g < 4u) {
        sc = u8(p + g) & 63u;
        m = u8(p + g + 4u) & 63u;
    } else {
        sc = (u8(p + g + 4u) & 15u) | (u8(p + g - 4u) >> 6) << 4;
        m = (u8(p + g + 4u) >> 4) | (u8(p + g) >> 6) << 4;
    }
}
#if WTYPE == DT_Q4_K          // 144 / 256: ..., qs[128] (chunk c of 64: low nibbles 64c.., high 64c+32..)
#define W_BLOCK_SIZE 256u
#define W_TYPE_SIZE 144u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 256u) * 144u, e0 = k0 % 256u, g = e0 / 32u, l0 = e0 % 32u;
    float d = half_at(b), dmin = half_at(b + 2u);
    uint sc, m;
    k4_scale_min(b + 4u, g, sc, m);
    precise float dl = d * float(sc);
    precise float ml = dmin * float(m);
    uint sh = (g % 2u) * 4u;
    for (uint j = 0u; j < 16u; j++) {
        uint q = (u8(b + 16u + 32u * (g / 2u) + l0 + j) >> sh) & 15u;
        precise float y = dl * float(q) - ml;
        v[j] = y;
    }
}
#elif WTYPE == DT_Q5_K        // 176 / 256: ..., qh[32] (bit g of byte l: element 32g + l), qs[128] as Q4_K
#define W_BLOCK_SIZE 256u
#define W_TYPE_SIZE 176u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 256u) * 176u, e0 = k0 % 256u, g = e0 / 32u, l0 = e0 % 32u;
    float d = half_at(b), dmin = half_at(b + 2u);
    uint sc, m;
    k4_scale_min(b + 4u, g, sc, m);
    precise float dl = d * float(sc);
    precise float ml = dmin * float(m);
    uint sh = (g % 2u) * 4u;
    for (uint j = 0u; j < 16u; j++) {
        uint l = l0 + j;
        uint q = ((u8(b + 48u + 32u * (g / 2u) + l) >> sh) & 15u) | ((u8(b + 16u + l) >> g) & 1u) << 4;
        precise float y = dl * float(q) - ml;
        v[j] = y;
    }
}
#elif WTYPE == DT_Q6_K        // 210 / 256: ql[128], qh[64], int8 scales[16], f16 d
#define W_BLOCK_SIZE 256u
#define W_TYPE_SIZE 210u
void deq16(uint row, uint k0, out float v[16])
{
    uint b = row + (k0 / 256u) * 210u, e0 = k0 % 256u;
    float d = half_at(b + 208u);
    precise float dl = d * float(i8(b + 192u + e0 / 16u));
    uint h = e0 / 128u, k = (e0 % 128u) / 32u, l0 = e0 % 32u;
    for (uint j = 0u; j < 16u; j++) {
        uint l = l0 + j;
        uint lo = u8(b + 64u * h + 32u * (k % 2u) + l);
        int q = int((k >= 2u ? lo >> 4 : lo & 15u) | ((u8(b + 128u + 32u * h + l) >> (2u * k)) & 3u) << 4) - 32;
        precise float y = dl * float(q);
        v[j] = y;
    }
}
#else
#error "weights.glsl: unknown WTYPE"
#endif
#endif
#endif
