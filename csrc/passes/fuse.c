/*
 * fuse.c - fusion written as two pattern -> rewrite rules, each exact (same arithmetic, fewer
 * passes over memory):
 *   mul(silu(a), b) with silu used only there      -> silu_mul(a, b)          (SwiGLU gate)
 *   rmsnorm(add(a, b), w) with a, b of equal shape  -> the add becomes add_rmsnorm(a, b, w), which
 *       writes the sum as itself and the normalised value into the rmsnorm node, turned into
 *       fused_out(add)                               (residual add into the next norm)
 * Node ids never change; the orphaned silu is left for rlx_pass_dead_nodes.
 */
#include <stdlib.h>

#include "core/core.h"
#include "passes/passes.h"

static bool same_shape(const struct rlx_node *a, const struct rlx_node *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (!rlx_dim_equal(&a->shape[i], &b->shape[i])) return false;
    return true;
}

static bool is_output(const struct rlx_graph *g, int id)
{
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == id) return true;
    return false;
}

/* mul(silu(a), b) or mul(b, silu(a)) -> silu_mul(a, b) */
static void fuse_silu_mul(struct rlx_graph *g, const int *uses, int id)
{
    struct rlx_node *m = &g->nodes[id];
    for (int side = 0; side < 2; side++) {
        int s = m->in[side], other = m->in[1 - side];
        const struct rlx_node *sn = &g->nodes[s];
        if (sn->op != RLX_OP_SILU || uses[s] != 1 || is_output(g, s)) continue;
        if (!same_shape(sn, &g->nodes[other])) continue;
        m->op = RLX_OP_SILU_MUL;
        m->in[0] = sn->in[0];
        m->in[1] = other;
        return;
    }
}

/* rmsnorm(add(a, b), w) -> add_rmsnorm(a, b, w) at the add, fused_out at the rmsnorm */
static void fuse_add_rmsnorm(struct rlx_graph *g, int id)
{
    struct rlx_node *norm = &g->nodes[id];
    int s = norm->in[0], w = norm->in[1];
    struct rlx_node *add = &g->nodes[s];
    if (add->op != RLX_OP_ADD || add->companion >= 0) return;
    if (!same_shape(&g->nodes[add->in[0]], &g->nodes[add->in[1]])) return;
    enum rlx_op wop = g->nodes[w].op;
    if (w >= s && wop != RLX_OP_PARAM && wop != RLX_OP_INPUT)
        return; /* a computed weight must exist when the add runs */
    add->op = RLX_OP_ADD_RMSNORM;
    add->n_in = 3;
    add->in[2] = w;
    add->attrs.eps = norm->attrs.eps;
    add->companion = id;
    norm->op = RLX_OP_FUSED_OUT;
    norm->n_in = 1;
    norm->in[0] = s;
}

rlx_status rlx_pass_fuse(struct rlx_graph *g)
{
    int *uses = rlx_calloc((size_t)g->n_nodes, sizeof *uses);
    if (!uses) return RLX_ERR_NOMEM;
    for (int id = 0; id < g->n_nodes; id++) {
        const struct rlx_node *n = &g->nodes[id];
        if (n->dead) continue;
        for (int k = 0; k < n->n_in; k++) uses[n->in[k]]++;
    }
    for (int id = 0; id < g->n_nodes; id++) {
        struct rlx_node *n = &g->nodes[id];
        if (n->dead) continue;
        if (n->op == RLX_OP_MUL)
            fuse_silu_mul(g, uses, id);
        else if (n->op == RLX_OP_RMSNORM)
            fuse_add_rmsnorm(g, id);
    }
    free(uses);
    return RLX_OK;
}
