/*
 * core.h - internal helpers shared by every part of the C core: setting the thread-local error
 * message, logging, checked allocation, alignment. Nothing here prints or exits.
 */
#ifndef RLX_CORE_CORE_H
#define RLX_CORE_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rlx/rlx.h"

/* Sets this thread's error message (printf-style, truncated to one line) and returns s, so that
 * call sites read `return rlx_set_error(RLX_ERR_SHAPE, "...", ...);`. */
rlx_status rlx_set_error(rlx_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes this thread's current error message with context ("param 'w': <message>") and
 * returns s: `return rlx_error_context(s, "param '%s'", name);` after a failed call. */
rlx_status rlx_error_context(rlx_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sends a message to the log callback, if one is set. */
void rlx_log(enum rlx_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Propagates a failing status. */
#define RLX_TRY(expr)                                                                                                  \
    do {                                                                                                               \
        rlx_status rlx_try_s_ = (expr);                                                                                \
        if (rlx_try_s_ != RLX_OK) return rlx_try_s_;                                                                   \
    } while (0)

/* Checked calloc: on failure sets RLX_ERR_NOMEM with the size, file and line, returns NULL. */
void *rlx_calloc_at(size_t n, size_t size, const char *file, int line);
#define rlx_calloc(n, size) rlx_calloc_at((n), (size), __FILE__, __LINE__)

/* Checked growth of an array *p of *cap elements of `size` bytes to hold at least `need`. */
rlx_status rlx_grow_at(void **p, int *cap, int need, size_t size, const char *file, int line);
#define rlx_grow(p, cap, need) rlx_grow_at((void **)(p), (cap), (need), sizeof(**(p)), __FILE__, __LINE__)

/* The ISAs a hot loop written with vector types is compiled for (RLX_CLONES before it); the loader
 * picks one per machine (cpuid), so the build never depends on -march. A ThreadSanitizer build
 * compiles the baseline only (RLX_NO_CLONES): the loader runs ifunc resolvers before TSan's runtime
 * is up, and instrumented ones crash. */
#ifdef RLX_NO_CLONES
#define RLX_CLONES
#else
#define RLX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

#define RLX_ALIGN 64
static inline size_t rlx_align_up(size_t n) { return (n + RLX_ALIGN - 1) & ~(size_t)(RLX_ALIGN - 1); }

/* Checked size arithmetic: false (and *out untouched) when the exact result does not fit. Every
 * byte count computed from shapes, symbols or caps goes through these (or rlx_shape_bytes). */
static inline bool rlx_size_mul(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}
static inline bool rlx_size_add(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

/* f16 / bf16 conversions: exact widening; narrowing rounds to nearest even (a NaN stays NaN,
 * quieted; a finite value past the largest finite value becomes inf). */
float rlx_f16_to_f32(uint16_t h);
float rlx_bf16_to_f32(uint16_t h);
uint16_t rlx_f32_to_f16(float x);
uint16_t rlx_f32_to_bf16(float x);

#endif
