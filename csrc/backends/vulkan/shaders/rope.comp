#version 450
// rope.comp - out (s, h, d) = RoPE of x (s, h, d) at positions pos (s) with inv_freq (d/2), one
// pair per invocation: t = float(pos) * inv_freq[i] (one f32 product, as PyTorch), the pair
// (i, i + d/2), or (2i, 2i + 1) when interleaved, rotated by t. sin and cos are computed here
// (Cody-Waite reduction by pi/2 in three parts, then Cephes' single-precision polynomials), not by
// the device's sin / cos, whose accuracy on large angles varies between GPUs.
#include "common.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer F { float inv_freq[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint s, h, d, interleaved;
    uint x_off, p_off, f_off, o_off; // elements
    uint items;                      // s * h * d / 2
} p;

void sin_cos(float x, out float sn, out float cs)
{
    float q = round(x * 0.636619772367581343);
    precise float r = ((x - q * 1.5703125) - q * 4.837512969970703125e-4) - q * 7.54978995489188216e-8;
    float z = r * r;
    float sr = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    float cr = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    int k = int(q) & 3;
    sn = k == 0 ? sr : k == 1 ? cr : k == 2 ? -sr : -cr;
    cs = k == 0 ? cr : k == 1 ? -sr : k == 2 ? -cr : sr;
}

void main()
{
    uint item = group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (item >= p.items) return;
    uint half_d = p.d / 2u, i = item % half_d, head = item / half_d, t = head / p.h;
    precise float ang = float(pos[p.p_off + t]) * inv_freq[p.f_off + i];
    float sn, cs;
    sin_cos(ang, sn, cs);
    uint base = head * p.d, ia = p.interleaved != 0u ? 2u * i : i, ib = p.interleaved != 0u ? 2u * i + 1u : i + half_d;
    float x0 = x[p.x_off + base + ia], x1 = x[p.x_off + base + ib];
    o[p.o_off + base + ia] = x0 * cs - x1 * sn;
    o[p.o_off + base + ib] = x1 * cs + x0 * sn;
}
