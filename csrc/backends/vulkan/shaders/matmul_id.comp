#version 450
// matmul_id.comp - out (R, N) f32, R = S * n rows: row r = s * n + j is a[s, A == 1 ? 0 : j] (K)
// times W[ids[r]]^T, W (E, N, K) of WTYPE the stacked experts; matvec.comp's product (one
// workgroup per output column and row: the workgroup streams the expert's row once, threads over
// K, 16-element chunks of a block type; a reduction over the workgroup), so a row reads only the
// expert its id names. A dispatch binds the experts [e0, e0 + experts) (stacked experts bigger
// than one binding may span are bound in pieces): rows of other experts are left to another
// dispatch. An id outside [0, E) is reported once through the status words (the run then fails
// naming it) by the piece with e0 == 0, which writes zeros in its row. bf16 weights: every a
// value is first rounded to bf16 (kernels.h).
#include "common.glsl"
#define W_BINDING 0
#include "weights.glsl"
layout(binding = 1) readonly buffer A { float a[]; };
layout(binding = 2) readonly buffer Ids { int ids[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) buffer Status { uint status[4]; };   // set flag, node, index, value
layout(push_constant) uniform P {
    uint R, n, A, K, N;          // rows, slots per token, rows of a per token (1 or n), inner dim, columns
    uint E, e0, experts;         // experts in all, the first bound here, how many are bound
    uint w_off, w_row, w_expert; // expert e0's row 0, the strides of rows and experts (bytes for block types,
                                 // else elements)
    uint a_off, ids_off, o_off;  // elements
    uint node, groups;           // for the status report; R * N
} p;

float a_at(uint i)
{
#if WTYPE == DT_BF16
    return round_bf16(a[i]);
#else
    return a[i];
#endif
}

void main()
{
    uint g = group_index();
    if (g >= p.groups) return;
    uint col = g % p.N, r = g / p.N;
    uint t = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    int id = ids[p.ids_off + r];          // one value for the whole workgroup: its returns are uniform
    if (id < 0 || uint(id) >= p.E) {
        if (p.e0 != 0u) return;
        if (t == 0u) {
            o[p.o_off + r * p.N + col] = 0.0;
            if (col == 0u && atomicCompSwap(status[0], 0u, 1u) == 0u) {
                status[1] = p.node;
                status[2] = r;
                status[3] = uint(id);
            }
        }
        return;
    }
    if (uint(id) < p.e0 || uint(id) >= p.e0 + p.experts) return;
    uint s = r / p.n, j = r % p.n;
    uint arow = p.a_off + (s * p.A + (p.A == 1u ? 0u : j)) * p.K;
    uint row = p.w_off + (uint(id) - p.e0) * p.w_expert + col * p.w_row;
    float acc = 0.0;
#ifdef W_BLOCK
    for (uint c = t; c < p.K / 16u; c += wg) {
        float v[16];
        deq16(row, c * 16u, v);
        float sum = 0.0;
        for (uint i = 0u; i < 16u; i++) sum += v[i] * a_at(arow + c * 16u + i);
        acc += sum;
    }
#else
    for (uint k = t; k < p.K; k += wg) acc += load_w(row + k) * a_at(arow + k);
#endif
    float total = wg_sum(acc);
    if (t == 0u) o[p.o_off + r * p.N + col] = total;
}
