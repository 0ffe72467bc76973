#version 450
// cache_write.comp - rows pos[i] of a state (T, row) of dtype f32 / f16 / bf16 = rows[i] (S, row)
// f32, rounded to nearest even. A position outside [0, T) is reported through the status words
// (the run then fails naming it) and its row is not written.
#include "common.glsl"
layout(binding = 0) writeonly buffer Sf { float s_f32[]; };
layout(binding = 0) writeonly buffer Sh { uint16_t s_u16[]; };
layout(binding = 1) readonly buffer R { float rows[]; };
layout(binding = 2) readonly buffer Pos { int pos[]; };
layout(binding = 3) buffer Status { uint status[4]; };   // set flag, node, index, value
layout(push_constant) uniform P {
    uint dtype, S, row, T;
    uint s_off, r_off, p_off; // elements (s_off of the state's dtype)
    uint node, items;         // node id for the report; S * row
} p;

void main()
{
    uint item = group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (item >= p.items) return;
    uint i = item / p.row, c = item % p.row;
    int at = pos[p.p_off + i];
    if (at < 0 || uint(at) >= p.T) {
        if (c == 0u && atomicCompSwap(status[0], 0u, 1u) == 0u) {
            status[1] = p.node;
            status[2] = i;
            status[3] = uint(at);
        }
        return;
    }
    uint dst = p.s_off + uint(at) * p.row + c;
    float v = rows[p.r_off + item];
    if (p.dtype == DT_F32) s_f32[dst] = v;
    else s_u16[dst] = uint16_t(p.dtype == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v));
}
