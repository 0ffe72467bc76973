#version 450
// softmax.comp - out (rows, n) = softmax of each row of x: one workgroup per row, the max and
// the sum of exponentials reduced over the workgroup.
#include "common.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint rows, n;
    uint x_off, o_off;       // elements
} p;

void main()
{
    uint row = group_index();
    if (row >= p.rows) return;
    uint t = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x, base = row * p.n;
    float m = uintBitsToFloat(0xff800000u);
    for (uint j = t; j < p.n; j += wg) m = max(m, x[p.x_off + base + j]);
    m = wg_max(m);
    float s = 0.0;
    for (uint j = t; j < p.n; j += wg) s += exp(x[p.x_off + base + j] - m);
    s = wg_sum(s);
    for (uint j = t; j < p.n; j += wg) o[p.o_off + base + j] = exp(x[p.x_off + base + j] - m) / s;
}
