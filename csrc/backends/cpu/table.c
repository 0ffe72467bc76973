/*
 * table.c - the "cpu" kernel table: own threaded matvecs for decode and OpenBLAS for larger
 * products, the pool and per-ISA vector loops for the rest (see the other files of backends/cpu). Only collects entry points; must never hold
 * logic or state of its own.
 */
#include "backends/cpu/cpu.h"

const struct rlx_kernels rlx_cpu_kernels = {
    .name = "cpu",
    .matmul_f32 = rlx_cpu_matmul_f32,
    .embedding_f32 = rlx_cpu_embedding_f32,
    .matmul_lowp = rlx_cpu_matmul_lowp,
    .matmul_lowp_scratch = rlx_cpu_matmul_lowp_scratch,
    .embedding_lowp = rlx_cpu_embedding_lowp,
    .matmul_quant = rlx_cpu_matmul_quant,
    .matmul_quant_scratch = rlx_cpu_matmul_quant_scratch,
    .matmul_rows_alone = rlx_cpu_matmul_rows_alone,
    .embedding_quant = rlx_cpu_embedding_quant,
    .convert_f32 = rlx_cpu_convert_f32,
    .rmsnorm_f32 = rlx_cpu_rmsnorm_f32,
    .add_rmsnorm_f32 = rlx_cpu_add_rmsnorm_f32,
    .rope_f32 = rlx_cpu_rope_f32,
    .softmax_f32 = rlx_cpu_softmax_f32,
    .silu_f32 = rlx_cpu_silu_f32,
    .silu_mul_f32 = rlx_cpu_silu_mul_f32,
    .add_f32 = rlx_cpu_add_f32,
    .mul_f32 = rlx_cpu_mul_f32,
    .attention = rlx_cpu_attention,
    .attention_scratch = rlx_cpu_attention_scratch,
    .topk_f32 = rlx_topk_f32,
    .topk_scratch = rlx_topk_scratch,
    .matmul_id = rlx_cpu_matmul_id,
    .matmul_id_scratch = rlx_cpu_matmul_id_scratch,
    .moe_combine_f32 = rlx_cpu_moe_combine_f32,
};
