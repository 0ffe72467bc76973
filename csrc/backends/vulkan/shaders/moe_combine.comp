#version 450
// moe_combine.comp - out (S, H) f32 = sum over slots j of w[s, j] * y[s, j] (y (S, n, H)), in slot
// order, w[s, j] = probs[s, ids[s, j]] (probs (S, E)), divided by the sum of the n values (summed
// in slot order) when norm: the cpu kernel's operations, in its order (csrc/backends/cpu/moe.c).
// One invocation per output element. An id outside [0, E) is reported once through the status
// words (the run then fails naming it); the token's row is then zeros.
#include "common.glsl"
layout(binding = 0) readonly buffer Y { float y[]; };
layout(binding = 1) readonly buffer Pr { float probs[]; };
layout(binding = 2) readonly buffer Ids { int ids[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) buffer Status { uint status[4]; };   // set flag, node, index, value
layout(push_constant) uniform P {
    uint S, n, H, E;             // tokens, slots per token, row length, experts
    uint y_off, p_off, ids_off, o_off;   // elements
    uint norm, node, items;      // renormalise; for the status report; S * H
} p;

void main()
{
    uint item = group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (item >= p.items) return;
    uint s = item / p.H, h = item % p.H;
    uint id0 = p.ids_off + s * p.n;
    for (uint j = 0u; j < p.n; j++) {
        int id = ids[id0 + j];
        if (id < 0 || uint(id) >= p.E) {
            o[p.o_off + item] = 0.0;
            if (h == 0u && atomicCompSwap(status[0], 0u, 1u) == 0u) {
                status[1] = p.node;
                status[2] = s * p.n + j;
                status[3] = uint(id);
            }
            return;
        }
    }
    uint pr = p.p_off + s * p.E;
    float total = 0.0;
    if (p.norm != 0u)
        for (uint j = 0u; j < p.n; j++) total += probs[pr + uint(ids[id0 + j])];
    float acc = 0.0;
    for (uint j = 0u; j < p.n; j++) {
        float pw = probs[pr + uint(ids[id0 + j])];
        float w = p.norm != 0u ? pw / total : pw;
        float v = w * y[p.y_off + (s * p.n + j) * p.H + h];
        acc = j == 0u ? v : acc + v;
    }
    o[p.o_off + item] = acc;
}
