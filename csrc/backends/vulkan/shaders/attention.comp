#version 450
// attention.comp - grouped-query attention over a KV cache, streamed: one workgroup per (query
// row i, query head h), reading its kv head's keys and values in chunks of CH positions. Per
// chunk: one subgroup per key computes q . k (lanes over D, subgroupAdd), the chunk's scores go
// to shared memory, and the running maximum, the running sum of exponentials and each
// invocation's share of the D output values are rescaled and updated (online softmax), so any
// number of positions streams through a fixed amount of shared memory.
// q (S, Hq, D) f32, k / v (T, Hkv, D) of KVTYPE, out (S, Hq, D) f32, mask (S, T) f32 additive or
// u8 (1 = attend). Query i sits at position T - S + i; key j is visible if j <= T - S + i (causal),
// j > T - S + i - window (window > 0) and its mask allows; no visible key gives zeros (kernels.h).
#include "common.glsl"
layout(binding = 0) readonly buffer Q { float q[]; };
#if KVTYPE == DT_F32
layout(binding = 1) readonly buffer K { float k_f32[]; };
layout(binding = 2) readonly buffer V { float v_f32[]; };
float k_at(uint i) { return k_f32[i]; }
float v_at(uint i) { return v_f32[i]; }
#else
layout(binding = 1) readonly buffer K { uint16_t k_u16[]; };
layout(binding = 2) readonly buffer V { uint16_t v_u16[]; };
#if KVTYPE == DT_F16
float k_at(uint i) { return f16_to_f32(uint(k_u16[i])); }
float v_at(uint i) { return f16_to_f32(uint(v_u16[i])); }
#else
float k_at(uint i) { return bf16_to_f32(uint(k_u16[i])); }
float v_at(uint i) { return bf16_to_f32(uint(v_u16[i])); }
#endif
#endif
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) readonly buffer Mf { float mask_f32[]; };
layout(binding = 4) readonly buffer Mu { uint8_t mask_u8[]; };
layout(push_constant) uniform P {
    uint S, T, Hq, Hkv, D, group;    // group = Hq / Hkv
    float scale;
    uint causal;
    int window;
    uint mask_kind;                  // 0 none, 1 f32, 2 u8
    uint q_off, k_off, v_off, o_off, m_off;   // elements
    uint groups;                     // S * Hq
} p;

#define CH 128u                      // positions per chunk == the workgroup size (shader table)
#define MAX_D 512u                   // head dims the shared q row holds (supports_op refuses more)
shared float qs[MAX_D];
shared float ps[CH];

void main()
{
    uint g = group_index();
    if (g >= p.groups) return;
    const float NEG_INF = uintBitsToFloat(0xff800000u);
    uint i = g / p.Hq, h = g % p.Hq, kvh = h / p.group, t = gl_LocalInvocationID.x;
    for (uint e = t; e < p.D; e += CH) qs[e] = q[p.q_off + (i * p.Hq + h) * p.D + e];
    barrier();
    int qpos = int(p.T - p.S + i), lo = 0, hi = int(p.T);   // visible keys lie in [lo, hi)
    if (p.causal != 0u) hi = min(hi, qpos + 1);
    if (p.window > 0) lo = max(lo, qpos - p.window + 1);
    uint stride = p.Hkv * p.D, kbase = p.k_off + kvh * p.D, vbase = p.v_off + kvh * p.D;
    float run_max = NEG_INF, run_sum = 0.0, acc[MAX_D / CH];
    for (uint r = 0u; r < MAX_D / CH; r++) acc[r] = 0.0;
    for (int c0 = lo; c0 < hi; c0 += int(CH)) {
        for (uint jj = gl_SubgroupID; jj < CH; jj += gl_NumSubgroups) {
            int j = c0 + int(jj);
            float s = 0.0;
            if (j < hi)
                for (uint e = gl_SubgroupInvocationID; e < p.D; e += gl_SubgroupSize)
                    s += qs[e] * k_at(kbase + uint(j) * stride + e);
            s = subgroupAdd(s);
            if (subgroupElect()) {
                float sc = NEG_INF;
                if (j < hi) {
                    sc = s * p.scale;
                    uint at = p.m_off + i * p.T + uint(j);
                    if (p.mask_kind == 1u) sc += mask_f32[at];
                    else if (p.mask_kind == 2u && uint(mask_u8[at]) == 0u) sc = NEG_INF;
                }
                ps[jj] = sc;
            }
        }
        barrier();
        float mine = ps[t];
        float new_max = max(run_max, wg_max(mine));
        float pj = new_max == NEG_INF ? 0.0 : exp(mine - new_max);
        float alpha = run_max == NEG_INF ? 0.0 : exp(run_max - new_max);
        ps[t] = pj;
        run_sum = run_sum * alpha + wg_sum(pj);   // its barriers publish ps
        uint n = uint(min(int(CH), hi - c0));
        for (uint r = 0u; r < MAX_D / CH; r++) {
            uint e = t + CH * r;
            if (e >= p.D) break;
            float a = acc[r] * alpha;
            for (uint jj = 0u; jj < n; jj++) a += ps[jj] * v_at(vbase + uint(c0 + int(jj)) * stride + e);
            acc[r] = a;
        }
        run_max = new_max;
        barrier();                                 // every read of ps before the next chunk's writes
    }
    for (uint r = 0u; r < MAX_D / CH; r++) {
        uint e = t + CH * r;
        if (e < p.D) o[p.o_off + (i * p.Hq + h) * p.D + e] = run_sum > 0.0 ? acc[r] / run_sum : 0.0;
    }
}
