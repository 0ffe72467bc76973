/*
 * status.c - status names, the thread-local error message, the interrupt flag, the logging
 * callback and checked allocation. The error message is the only channel by which the core explains a failure; it
 * never prints.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static _Thread_local char last_error[512];

const char *rlx_last_error(void) { return last_error; }

rlx_status rlx_set_error(rlx_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    for (char *c = last_error; *c; c++)
        if (*c == '\n') *c = ' ';
    return s;
}

rlx_status rlx_error_context(rlx_status s, const char *fmt, ...)
{
    char prefix[256], rest[sizeof last_error];
    memcpy(rest, last_error, sizeof rest);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return rlx_set_error(s, "%s: %s", prefix, rest);
}

const char *rlx_status_name(rlx_status s)
{
    switch (s) {
    case RLX_OK: return "RLX_OK";
    case RLX_ERR_INVALID: return "RLX_ERR_INVALID";
    case RLX_ERR_SHAPE: return "RLX_ERR_SHAPE";
    case RLX_ERR_DTYPE: return "RLX_ERR_DTYPE";
    case RLX_ERR_RANGE: return "RLX_ERR_RANGE";
    case RLX_ERR_NOMEM: return "RLX_ERR_NOMEM";
    case RLX_ERR_UNSUPPORTED: return "RLX_ERR_UNSUPPORTED";
    case RLX_ERR_STATE: return "RLX_ERR_STATE";
    case RLX_ERR_IO: return "RLX_ERR_IO";
    case RLX_ERR_INTERNAL: return "RLX_ERR_INTERNAL";
    case RLX_ERR_INTERRUPTED: return "RLX_ERR_INTERRUPTED";
    default: return "RLX_ERR_UNKNOWN";
    }
}

/* Lock-free on every platform rlx builds for, so setting it from a signal handler is safe. */
static atomic_int interrupt_flag;
static_assert(ATOMIC_INT_LOCK_FREE == 2, "the interrupt flag must be lock-free (signal handlers set it)");

void rlx_interrupt(void) { atomic_store(&interrupt_flag, 1); }
void rlx_interrupt_clear(void) { atomic_store(&interrupt_flag, 0); }
bool rlx_interrupted(void) { return atomic_load_explicit(&interrupt_flag, memory_order_relaxed) != 0; }

/* The callback and its user pointer are set rarely (at start-up); reads are racy-but-benign only
 * if set concurrently with logging, which the header forbids implicitly by "set once". */
static rlx_log_fn log_fn;
static void *log_user;

void rlx_set_log_callback(rlx_log_fn fn, void *user)
{
    log_fn = fn;
    log_user = user;
}

void rlx_log(enum rlx_log_level level, const char *fmt, ...)
{
    if (!log_fn) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_fn(level, msg, log_user);
}

void *rlx_calloc_at(size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) rlx_set_error(RLX_ERR_NOMEM, "out of memory allocating %zu x %zu bytes (%s:%d)", n, size, file, line);
    return p;
}

rlx_status rlx_grow_at(void **p, int *cap, int need, size_t size, const char *file, int line)
{
    if (need <= *cap) return RLX_OK;
    int ncap = *cap ? *cap : 8;
    while (ncap < need) ncap *= 2;
    void *np = realloc(*p, (size_t)ncap * size);
    if (!np)
        return rlx_set_error(RLX_ERR_NOMEM, "out of memory growing an array to %d x %zu bytes (%s:%d)", ncap, size,
                             file, line);
    memset((char *)np + (size_t)*cap * size, 0, (size_t)(ncap - *cap) * size);
    *p = np;
    *cap = ncap;
    return RLX_OK;
}
