#version 450
// matmul.comp - out (M, N) = a (M, K) @ W^T (or @ W for an f32 W stored (K, N)) for many rows
// (prefill): tiles of 64 x 64 outputs per workgroup of 256, each invocation 4 x 4 of them in
// registers; K in steps of 16 through shared memory, W's tile dequantised there once per step
// (a 16-element chunk per invocation for block types). W of WTYPE, a and out f32; bf16 weights
// round a to bf16 first (kernels.h). The workgroup size is 256 (the shader table's entry).
#include "common.glsl"
#define W_BINDING 0
#include "weights.glsl"
layout(binding = 1) readonly buffer A { float a[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint M, K, N;            // rows of a, inner dim, columns of out in this dispatch
    uint w_off, w_row;       // W row 0 and the stride of W rows (bytes for block types, else elements)
    uint a_off, o_off;       // a row 0, out (row 0, first column of this dispatch)
    uint o_stride;           // elements per out row
    uint trans_b;            // 1: W is (N, K); 0: W is (K, N), row stride w_row (f32 only)
    uint tiles_n;            // ceil(N / 64)
    uint groups;             // tiles_n * ceil(M / 64)
} p;

#define BM 64u
#define BN 64u
#define BK 16u
shared float As[BK][BM];
shared float Ws[BK][BN];

void main()
{
    uint g = group_index();
    if (g >= p.groups) return;
    uint m_base = (g / p.tiles_n) * BM, n_base = (g % p.tiles_n) * BN;
    uint t = gl_LocalInvocationID.x, tx = t % 16u, ty = t / 16u;
    float acc[4][4];
    for (uint i = 0u; i < 4u; i++)
        for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;
    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
        for (uint q = 0u; q < 4u; q++) {         // a: 64 rows x 16 columns
            uint idx = t + q * 256u, r = idx / BK, c = idx % BK, m = m_base + r, k = k0 + c;
            float v = (m < p.M && k < p.K) ? a[p.a_off + m * p.K + k] : 0.0;
#if WTYPE == DT_BF16
            v = round_bf16(v);
#endif
            As[c][r] = v;
        }
#ifdef W_BLOCK
        if (t < BN) {                            // W: 64 rows, one 16-element chunk each
            uint n = n_base + t;
            float v[16];
            if (n < p.N) deq16(p.w_off + n * p.w_row, k0, v);
            for (uint j = 0u; j < 16u; j++) Ws[j][t] = n < p.N ? v[j] : 0.0;
        }
#else
        for (uint q = 0u; q < 4u; q++) {         // W: 64 rows x 16 columns
            uint idx = t + q * 256u, r = idx / BK, c = idx % BK, n = n_base + r, k = k0 + c;
            float v = 0.0;
            if (n < p.N && k < p.K) v = load_w(p.w_off + (p.trans_b != 0u ? n * p.w_row + k : k * p.w_row + n));
            Ws[c][r] = v;
        }
#endif
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float av[4], wv[4];
            for (uint i = 0u; i < 4u; i++) av[i] = As[kk][ty + 16u * i];
            for (uint j = 0u; j < 4u; j++) wv[j] = Ws[kk][tx + 16u * j];
            for (uint i = 0u; i < 4u; i++)
                for (uint j = 0u; j < 4u; j++) acc[i][j] += av[i] * wv[j];
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++)
        for (uint j = 0u; j < 4u; j++) {
            uint m = m_base + ty + 16u * i, n = n_base + tx + 16u * j;
            if (m < p.M && n < p.N) o[p.o_off + m * p.o_stride + n] = acc[i][j];
        }
}
