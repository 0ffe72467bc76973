/*
 * check.h - the C tests' one assertion. CHECK(cond, fmt, ...) counts a pass, or prints
 * "FAIL file:line: <message> [<rlx_last_error()>]" and counts a failure; check_summary() prints
 * "N passed, M failed" (the line tools/run_c_tests.sh reports) and returns the exit status.
 * Safe from several threads (test_tcp checks from its rank threads): the counters are atomic
 * and a failure is printed with one fputs.
 */
#ifndef RLX_TESTS_CHECK_H
#define RLX_TESTS_CHECK_H

#include <stdatomic.h>
#include <stdio.h>

#include "rlx/rlx.h"

static atomic_int check_passed, check_failed;

static inline void check_fail(const char *file, int line, const char *msg)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "FAIL %s:%d: %s [%s]\n", file, line, msg, rlx_last_error());
    fputs(buf, stdout);
    atomic_fetch_add(&check_failed, 1);
}

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            atomic_fetch_add(&check_passed, 1);                                                                        \
        } else {                                                                                                       \
            char check_msg_[768];                                                                                      \
            snprintf(check_msg_, sizeof check_msg_, __VA_ARGS__);                                                      \
            check_fail(__FILE__, __LINE__, check_msg_);                                                                \
        }                                                                                                              \
    } while (0)

static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", atomic_load(&check_passed), atomic_load(&check_failed));
    return atomic_load(&check_failed) != 0;
}

#endif
