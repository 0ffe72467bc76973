#version 450
// matvec.comp - out (M, N) = a (M, K) @ W^T for few rows M (decode): one workgroup per output
// column n and group of up to MV_M rows of a; the workgroup streams W's row n once (threads over
// K: 16-element chunks of a block type, single elements of f32 / f16 / bf16), multiplies it with
// the MV_M rows of a, and reduces each sum over the workgroup (subgroupAdd, then shared memory).
// W (N, K) of WTYPE; a and out f32. bf16 weights: every a value is first rounded to bf16
// (kernels.h). Offsets are in elements (a, out, float W) or bytes (block W) of the bound ranges.
#include "common.glsl"
#define W_BINDING 0
#include "weights.glsl"
layout(binding = 1) readonly buffer A { float a[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint M, K, N;            // rows of a, inner dim, rows of W in this dispatch
    uint w_off, w_row;       // W row 0 and the stride of W rows (bytes for block types, else elements)
    uint a_off, o_off;       // a row 0, out (row 0, column 0 of this dispatch's W rows)
    uint o_stride;           // elements per out row
    uint groups;             // N * ceil(M / MV_M)
} p;

#define MV_M 4u

float a_at(uint m, uint k)
{
#if WTYPE == DT_BF16
    return round_bf16(a[p.a_off + m * p.K + k]);
#else
    return a[p.a_off + m * p.K + k];
#endif
}

void main()
{
    uint g = group_index();
    if (g >= p.groups) return;
    uint n = g % p.N, m0 = (g / p.N) * MV_M, rows = min(MV_M, p.M - m0);
    uint t = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    float acc[MV_M];
    for (uint r = 0u; r < MV_M; r++) acc[r] = 0.0;
#ifdef W_BLOCK
    uint row = p.w_off + n * p.w_row;
    for (uint c = t; c < p.K / 16u; c += wg) {
        float v[16];
        deq16(row, c * 16u, v);
        for (uint r = 0u; r < MV_M; r++) {
            if (r >= rows) break;
            float s = 0.0;
            for (uint j = 0u; j < 16u; j++) s += v[j] * a_at(m0 + r, c * 16u + j);
            acc[r] += s;
        }
    }
#else
    uint row = p.w_off + n * p.w_row;
    for (uint k = t; k < p.K; k += wg) {
        float w = load_w(row + k);
        for (uint r = 0u; r < MV_M; r++) {
            if (r >= rows) break;
            acc[r] += w * a_at(m0 + r, k);
        }
    }
#endif
    vec4 s = wg_sum4(vec4(acc[0], acc[1], acc[2], acc[3]));
    if (t == 0u)
        for (uint r = 0u; r < rows; r++) o[p.o_off + (m0 + r) * p.o_stride + n] = s[r];
}
