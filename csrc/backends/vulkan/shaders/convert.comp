#version 450
// convert.comp - out (n) of dtype f32 / f16 / bf16 = x (n) f32 rounded to nearest even (integer
// code: common.glsl). One value per invocation.
#include "common.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Of { float o_f32[]; };
layout(binding = 1) writeonly buffer Oh { uint16_t o_u16[]; };
layout(push_constant) uniform P {
    uint dtype, n;
    uint x_off, o_off;       // elements (of the output's dtype for o_off)
} p;

void main()
{
    uint i = group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    float v = x[p.x_off + i];
    if (p.dtype == DT_F32) o_f32[p.o_off + i] = v;
    else o_u16[p.o_off + i] = uint16_t(p.dtype == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v));
}
