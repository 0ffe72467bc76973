#version 450
// eltwise.comp - one value per invocation: out (n) = silu(a), silu(a) * b, a + b, a * b, with b
// (nb) broadcast over a's leading dims (b[i % nb]) for add and mul.
#include "common.glsl"
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint op;                 // 0 silu, 1 silu_mul, 2 add, 3 mul
    uint n, nb;
    uint a_off, b_off, o_off; // elements
} p;

void main()
{
    uint i = group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    float x = a[p.a_off + i], r;
    if (p.op == 0u) r = x / (1.0 + exp(-x));
    else if (p.op == 1u) r = x / (1.0 + exp(-x)) * b[p.b_off + i];
    else if (p.op == 2u) r = x + b[p.b_off + i % p.nb];
    else r = x * b[p.b_off + i % p.nb];
    o[p.o_off + i] = r;
}
