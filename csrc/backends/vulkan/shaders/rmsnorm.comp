#version 450
// rmsnorm.comp - out (rows, d) = x / sqrt(mean(x^2) + eps) * w (d), one workgroup per row (the
// sum of squares reduced with subgroupAdd, then shared memory). With -DADD (add_rmsnorm): x is
// a + b, also written to `sum`.
#include "common.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
#ifdef ADD
layout(binding = 3) readonly buffer B { float b[]; };
layout(binding = 4) writeonly buffer Sum { float sum[]; };
#endif
layout(push_constant) uniform P {
    uint rows, d;
    float eps;
    uint x_off, w_off, o_off, b_off, s_off;   // elements
} p;

float value(uint j, uint row)
{
#ifdef ADD
    return x[p.x_off + row * p.d + j] + b[p.b_off + row * p.d + j];
#else
    return x[p.x_off + row * p.d + j];
#endif
}

void main()
{
    uint row = group_index();
    if (row >= p.rows) return;
    uint t = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    float ss = 0.0;
    for (uint j = t; j < p.d; j += wg) {
        float v = value(j, row);
#ifdef ADD
        sum[p.s_off + row * p.d + j] = v;
#endif
        ss += v * v;
    }
    float inv = 1.0 / sqrt(wg_sum(ss) / float(p.d) + p.eps);
    for (uint j = t; j < p.d; j += wg) o[p.o_off + row * p.d + j] = value(j, row) * inv * w[p.w_off + j];
}
