/*
 * guard.h - ranges of host memory whose faults (SIGBUS: a mapped file truncated underneath) are
 * turned into a flag instead of a dead process (guard.c). Internal: the weight stores register the
 * weights they use in place; rlx_guard_fault is public (rlx.h), for the SIGBUS handler.
 */
#ifndef RLX_RUNTIME_GUARD_H
#define RLX_RUNTIME_GUARD_H

#include <stdatomic.h>
#include <stddef.h>

#include "rlx/rlx.h"

/* Registers [p, p + bytes): a fault there sets *flag to 1. *id: the registration (-1 when bytes
 * is 0), for rlx_guard_remove, which ignores -1. */
rlx_status rlx_guard_add(const void *p, size_t bytes, atomic_int *flag, int *id);
void rlx_guard_remove(int id);

#endif
