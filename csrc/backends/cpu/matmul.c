/*
 * matmul.c - the cpu table's matrix product: every shape goes to OpenBLAS (sgemv for a single
 * row, sgemm otherwise), which runs its own threads, sized together with the pool by
 * rlx_set_num_threads. This file must never carry a hand-written fallback product, and must
 * never hand OpenBLAS an empty dimension (its argument checker would print).
 */
#include "backends/cpu/cpu.h"

#include "core/pool.h"

#include <cblas.h>
#include <string.h>

/* out (M, N) = a (M, K) @ b, with b (N, K) read transposed when trans_b, else b (K, N). */
void rlx_cpu_matmul_f32(float *out, const float *a, const float *b, int64_t M, int64_t K, int64_t N,
                        int trans_b) {
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        return;
    }
    /* the first pool use applies RLX_NUM_THREADS to OpenBLAS too */
    (void)rlx_pool_threads();
    if (M == 1) {
        /* out (N) = b (N, K) @ a (K) when trans_b, else b (K, N)^T @ a (K) */
        if (trans_b)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)N, (blasint)K, 1.0f, b, (blasint)K, a, 1,
                        0.0f, out, 1);
        else
            cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)K, (blasint)N, 1.0f, b, (blasint)N, a, 1,
                        0.0f, out, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, 1.0f, a, (blasint)K, b, trans_b ? (blasint)K : (blasint)N, 0.0f, out,
                (blasint)N);
}
