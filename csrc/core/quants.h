/*
 * quants.h - the GGUF block types (ggml's layouts, byte for byte): bytes per block and the
 * conversion of whole blocks to f32 (quants.c) and from f32 (quantize.c) that the dtype table
 * (dtype.c) lists for each. Blocks are read and written with memcpy: no alignment needed. See
 * quants.c for each layout.
 */
#ifndef RLX_CORE_QUANTS_H
#define RLX_CORE_QUANTS_H

#include <stdint.h>

/* bytes per block; blocks of 32 elements, or 256 for the K types */
#define RLX_Q4_0_BYTES 18
#define RLX_Q4_1_BYTES 20
#define RLX_Q5_0_BYTES 22
#define RLX_Q5_1_BYTES 24
#define RLX_Q8_0_BYTES 34
#define RLX_Q2_K_BYTES 84
#define RLX_Q3_K_BYTES 110
#define RLX_Q4_K_BYTES 144
#define RLX_Q5_K_BYTES 176
#define RLX_Q6_K_BYTES 210

/* y (n) f32 = the n elements (whole blocks) at src */
void rlx_q4_0_to_f32(float *y, const void *src, int64_t n);
void rlx_q4_1_to_f32(float *y, const void *src, int64_t n);
void rlx_q5_0_to_f32(float *y, const void *src, int64_t n);
void rlx_q5_1_to_f32(float *y, const void *src, int64_t n);
void rlx_q8_0_to_f32(float *y, const void *src, int64_t n);
void rlx_q2_k_to_f32(float *y, const void *src, int64_t n);
void rlx_q3_k_to_f32(float *y, const void *src, int64_t n);
void rlx_q4_k_to_f32(float *y, const void *src, int64_t n);
void rlx_q5_k_to_f32(float *y, const void *src, int64_t n);
void rlx_q6_k_to_f32(float *y, const void *src, int64_t n);

/* the n f32 at x (whole blocks, finite) quantised into dst (quantize.c); returns -1, or the first
 * block whose f16 scale overflowed */
int64_t rlx_q4_0_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q4_1_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q5_0_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q5_1_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q8_0_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q2_k_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q3_k_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q4_k_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q5_k_from_f32(void *dst, const float *x, int64_t n);
int64_t rlx_q6_k_from_f32(void *dst, const float *x, int64_t n);

#endif
