/*
 * dims.c - symbolic dims: affine expressions c + sum coef[s] * sym[s] over a graph's symbols.
 * Construction, comparison, evaluation and formatting. Pure functions, no allocation.
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "ir/graph.h"

struct rlx_dim rlx_dim_const(int64_t n)
{
    struct rlx_dim d;
    memset(&d, 0, sizeof d);
    d.c = n;
    return d;
}

struct rlx_dim rlx_dim_sym(int sym)
{
    struct rlx_dim d = rlx_dim_const(0);
    if (sym >= 0 && sym < RLX_MAX_SYMS) d.coef[sym] = 1;
    return d;
}

bool rlx_dim_is_const(const struct rlx_dim *d)
{
    for (int s = 0; s < RLX_MAX_SYMS; s++)
        if (d->coef[s]) return false;
    return true;
}

bool rlx_dim_equal(const struct rlx_dim *a, const struct rlx_dim *b)
{
    if (a->c != b->c) return false;
    for (int s = 0; s < RLX_MAX_SYMS; s++)
        if (a->coef[s] != b->coef[s]) return false;
    return true;
}

struct rlx_dim rlx_dim_add(const struct rlx_dim *a, const struct rlx_dim *b)
{
    struct rlx_dim d = *a;
    d.c += b->c;
    for (int s = 0; s < RLX_MAX_SYMS; s++) d.coef[s] += b->coef[s];
    return d;
}

bool rlx_dim_eval(const struct rlx_dim *d, int n_syms, const int64_t *vals, const bool *bound, int64_t *out)
{
    int64_t v = d->c, term;
    bool overflow = false;
    for (int s = 0; s < n_syms; s++) {
        if (!d->coef[s]) continue;
        if (bound && !bound[s]) return false;
        overflow |= __builtin_mul_overflow((int64_t)d->coef[s], vals[s], &term) || __builtin_add_overflow(v, term, &v);
    }
    *out = overflow ? INT64_MAX : v; /* an extent no size computation accepts */
    return true;
}

void rlx_dim_format(const struct rlx_graph *g, const struct rlx_dim *d, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int s = 0; s < RLX_MAX_SYMS; s++) {
        if (!d->coef[s]) continue;
        const char *name = g ? rlx_graph_symbol_name(g, s) : NULL;
        char tmp[RLX_NAME_MAX + 32];
        if (d->coef[s] == 1)
            snprintf(tmp, sizeof tmp, "%s%s", len ? "+" : "", name ? name : "?");
        else
            snprintf(tmp, sizeof tmp, "%s%d*%s", len ? "+" : "", (int)d->coef[s], name ? name : "?");
        len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s", tmp);
        if (len >= cap) return;
    }
    if (len == 0)
        snprintf(buf, cap, "%lld", (long long)d->c);
    else if (d->c)
        snprintf(buf + len, cap - len, "%+lld", (long long)d->c);
}

void rlx_shape_format(const struct rlx_graph *g, int ndim, const struct rlx_dim *shape, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && len < cap; i++) {
        char d[128];
        rlx_dim_format(g, &shape[i], d, sizeof d);
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", d);
    }
    if (len < cap) snprintf(buf + len, cap - len, ")");
}

bool rlx_shapes_same_numel(int na, const struct rlx_dim *a, int nb, const struct rlx_dim *b)
{
    /* The element count is a polynomial in the symbols; compare it at a few points with large
     * distinct prime values, which cannot all agree for distinct polynomials of this degree. */
    static const int64_t probes[3][RLX_MAX_SYMS] = {
        {1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049, 1051, 1061, 1063, 1069,
         1087, 1091, 1093, 1097, 1103, 1109, 1117, 1123, 1129, 1151, 1153, 1163},
        {2003, 2011, 2017, 2027, 2029, 2039, 2053, 2063, 2069, 2081, 2083, 2087,
         2089, 2099, 2111, 2113, 2129, 2131, 2137, 2141, 2143, 2153, 2161, 2179},
        {7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103},
    };
    static_assert(RLX_MAX_SYMS == 24, "one probe value per symbol in each row above");
    for (int p = 0; p < 3; p++) {
        __int128 na_n = 1, nb_n = 1;
        for (int i = 0; i < na; i++) {
            int64_t v;
            rlx_dim_eval(&a[i], RLX_MAX_SYMS, probes[p], NULL, &v);
            na_n *= v;
        }
        for (int i = 0; i < nb; i++) {
            int64_t v;
            rlx_dim_eval(&b[i], RLX_MAX_SYMS, probes[p], NULL, &v);
            nb_n *= v;
        }
        if (na_n != nb_n) return false;
    }
    return true;
}
