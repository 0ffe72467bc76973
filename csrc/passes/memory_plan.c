/*
 * memory_plan.c - liveness and the arena plan. Time is the node id (ids are an execution order).
 * A value lives from the step that writes it to the last step that reads it (or to the end, for
 * outputs); two values share arena bytes only if their lifetimes do not overlap, so a kernel's
 * output never overlaps its own inputs, except in place (inplace_input): a pointwise op (silu,
 * silu_mul, add, mul) that is the last reader of an input of its own shape writes its output
 * over that input's bytes, exactly (its kernels read element i of each input before writing
 * element i of the output, on every backend). The SwiGLU MLP's silu_mul then holds two (SEQ, F)
 * values, not three: Llama-3.2-1B's arena for 512-position prefill chunks 52 -> 40 MiB. Sums of
 * sizes are checked: a plan whose arena would not fit a size_t is refused (RLX_ERR_RANGE), never
 * wrapped. Placement is greedy: largest first, lowest offset that fits. The plan is recomputed by
 * the runtime whenever the symbol binding grows.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "passes/passes.h"

/* Which input node id may write its output over (-1: none): an arena root whose last reader is id,
 * of the output's dtype and shape, for the ops whose kernels are pointwise in it (see the top). */
static int inplace_input(const struct rlx_graph *g, const struct rlx_liveness *lv, int id)
{
    const struct rlx_node *nd = &g->nodes[id];
    if (nd->dead || !lv->in_arena[id] || lv->root[id] != id) return -1;
    const int n_in = nd->op == RLX_OP_SILU_MUL                                               ? 2
                     : nd->op == RLX_OP_SILU || nd->op == RLX_OP_ADD || nd->op == RLX_OP_MUL ? 1
                                                                                             : 0;
    for (int k = 0; k < n_in; k++) {
        const struct rlx_node *x = &g->nodes[nd->in[k]];
        const int r = lv->root[nd->in[k]];
        bool same = lv->in_arena[r] && lv->last[r] == id && x->dtype == nd->dtype && x->ndim == nd->ndim;
        for (int d = 0; same && d < nd->ndim; d++) same = rlx_dim_equal(&x->shape[d], &nd->shape[d]);
        if (same) return k;
    }
    return -1;
}

rlx_status rlx_liveness_compute(const struct rlx_graph *g, struct rlx_liveness *lv)
{
    memset(lv, 0, sizeof *lv);
    int n = g->n_nodes;
    lv->n_nodes = n;
    lv->root = rlx_calloc((size_t)n, sizeof *lv->root);
    lv->first = rlx_calloc((size_t)n, sizeof *lv->first);
    lv->last = rlx_calloc((size_t)n, sizeof *lv->last);
    lv->in_arena = rlx_calloc((size_t)n, sizeof *lv->in_arena);
    if (!lv->root || !lv->first || !lv->last || !lv->in_arena) {
        rlx_liveness_free(lv);
        return RLX_ERR_NOMEM;
    }
    for (int id = 0; id < n; id++) {
        const struct rlx_node *nd = &g->nodes[id];
        const bool alias = nd->op == RLX_OP_RESHAPE || nd->op == RLX_OP_CACHE_WRITE; /* the input's memory */
        lv->root[id] = (alias && !nd->dead) ? lv->root[nd->in[0]] : id;
        lv->first[id] = nd->op == RLX_OP_FUSED_OUT ? nd->in[0] : id;
        lv->last[id] = lv->first[id];
        lv->in_arena[id] =
            !nd->dead && !alias && nd->op != RLX_OP_INPUT && nd->op != RLX_OP_PARAM && nd->op != RLX_OP_STATE;
    }
    for (int id = 0; id < n; id++) {
        const struct rlx_node *nd = &g->nodes[id];
        if (nd->dead || nd->op == RLX_OP_FUSED_OUT) continue;
        for (int k = 0; k < nd->n_in; k++) {
            int r = lv->root[nd->in[k]];
            if (lv->last[r] < id) lv->last[r] = id;
        }
        /* an alias keeps its root alive at least until the alias itself */
        if (lv->root[id] != id && lv->last[lv->root[id]] < id) lv->last[lv->root[id]] = id;
    }
    for (int i = 0; i < g->n_outputs; i++) lv->last[lv->root[g->outputs[i]]] = INT_MAX;
    /* in place: in id order, so a chain of them shares one root */
    for (int id = 0; id < n; id++) {
        const int k = inplace_input(g, lv, id);
        if (k < 0) continue;
        const int r = lv->root[g->nodes[id].in[k]];
        lv->root[id] = r;
        lv->in_arena[id] = false;
        if (lv->last[r] < lv->last[id]) lv->last[r] = lv->last[id];
        for (int j = id + 1; j < n; j++) /* the aliases of id (reshapes of it) follow it */
            if (lv->root[j] == id) lv->root[j] = r;
    }
    return RLX_OK;
}

void rlx_liveness_free(struct rlx_liveness *lv)
{
    free(lv->root);
    free(lv->first);
    free(lv->last);
    free(lv->in_arena);
    memset(lv, 0, sizeof *lv);
}

/* the sizes by_size_desc compares, for one qsort on this thread */
static _Thread_local const size_t *tl_sizes;

static int by_size_desc(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    if (tl_sizes[a] != tl_sizes[b]) return tl_sizes[a] < tl_sizes[b] ? 1 : -1;
    return a - b;
}

rlx_status rlx_memory_plan(const struct rlx_liveness *lv, const size_t *sizes, size_t *offsets, int *scratch,
                           size_t *arena_bytes, size_t *unshared_bytes)
{
    int *order = scratch, *placed = scratch + lv->n_nodes; /* placed: sorted by offset */
    int n_order = 0, n_placed = 0;
    size_t total = 0, arena = 0;
    for (int id = 0; id < lv->n_nodes; id++)
        if (lv->in_arena[id]) {
            order[n_order++] = id;
            if (sizes[id] > SIZE_MAX - RLX_ALIGN || !rlx_size_add(total, rlx_align_up(sizes[id]), &total))
                return rlx_set_error(RLX_ERR_RANGE, "the intermediates of this plan sum to more than the address "
                                                    "space holds");
        }
    tl_sizes = sizes;
    qsort(order, (size_t)n_order, sizeof *order, by_size_desc);
    for (int i = 0; i < n_order; i++) {
        int v = order[i];
        size_t need = rlx_align_up(sizes[v]), off = 0;
        int pos = 0; /* insertion point in placed */
        for (int j = 0; j < n_placed; j++) {
            int p = placed[j];
            bool overlap = lv->first[p] <= lv->last[v] && lv->first[v] <= lv->last[p];
            if (!overlap) continue;
            if (off + need <= offsets[p]) break;
            size_t end = offsets[p] + rlx_align_up(sizes[p]);
            if (end > off) off = end;
        }
        offsets[v] = off;
        while (pos < n_placed && offsets[placed[pos]] <= off) pos++;
        memmove(placed + pos + 1, placed + pos, (size_t)(n_placed - pos) * sizeof *placed);
        placed[pos] = v;
        n_placed++;
        if (off + need > arena) arena = off + need;
    }
    *arena_bytes = arena;
    *unshared_bytes = total;
    return RLX_OK;
}
