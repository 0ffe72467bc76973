// common.glsl - included first by every shader: extensions, the dtype ids (enum rlx_dtype; the C
// side static_asserts them), the workgroup-size specialisation constant, exact f16 / bf16
// conversions (integer code: no reliance on a device's conversion rounding or denormal flushing)
// and workgroup reductions (subgroup operations, then one shared slot per subgroup, summed in a
// fixed order so results do not depend on timing).
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;            // the workgroup size: the shader table's, per shader
layout(constant_id = 1) const uint SUBGROUP_SIZE = 32u;   // the device's (informative)

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I32 3
#define DT_U8 4
#define DT_Q8_0 5
#define DT_Q4_0 6
#define DT_Q4_1 7
#define DT_Q5_0 8
#define DT_Q5_1 9
#define DT_Q2_K 10
#define DT_Q3_K 11
#define DT_Q4_K 12
#define DT_Q5_K 13
#define DT_Q6_K 14

// The workgroup's index in a grid of up to maxComputeWorkGroupCount[0] x N groups (the recorder
// splits larger counts into rows of the grid; groups past the count return at once).
uint group_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// f16 / bf16 bits -> f32, exact (f16 subnormals m * 2^-24 are normal f32 values).
float f16_to_f32(uint h)
{
    uint s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0u) {
        float v = float(m) * 5.9604644775390625e-8;
        return s != 0u ? -v : v;
    }
    if (e == 31u) return uintBitsToFloat(s | 0x7f800000u | (m << 13));
    return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}
float bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }

// f32 -> bf16 / f16 bits, rounded to nearest even; NaN stays NaN (quieted), a finite value past
// the largest finite one becomes inf (csrc/core/dtype.c, the same steps).
uint f32_to_bf16(float x)
{
    uint u = floatBitsToUint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}
uint f32_to_f16(float x)
{
    uint u = floatBitsToUint(x);
    uint sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return sign;
        uint man = (a & 0x7fffffu) | 0x800000u, sh = 126u - (a >> 23);
        uint q = man >> sh, rem = man & ((1u << sh) - 1u), hf = 1u << (sh - 1u);
        if (rem > hf || (rem == hf && (q & 1u) != 0u)) q++;
        return sign | q;
    }
    uint h = (a >> 13) - ((127u - 15u) << 10), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
    return sign | h;
}
// x rounded to bf16 (the matmul rule for bf16 weights: kernels.h)
float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Workgroup reductions, called in uniform control flow by every invocation. Workgroups hold at
// most 64 subgroups (the recorder keeps workgroup size / subgroup size <= 64).
shared float red_buf[64];
float wg_sum(float v)
{
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect()) red_buf[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) t += red_buf[i];
    return t;
}
shared vec4 red_buf4[64];
vec4 wg_sum4(vec4 v)
{
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect()) red_buf4[gl_SubgroupID] = v;
    barrier();
    vec4 t = vec4(0.0);
    for (uint i = 0u; i < gl_NumSubgroups; i++) t += red_buf4[i];
    return t;
}
float wg_max(float v)
{
    v = subgroupMax(v);
    barrier();
    if (subgroupElect()) red_buf[gl_SubgroupID] = v;
    barrier();
    float t = red_buf[0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) t = max(t, red_buf[i]);
    return t;
}
