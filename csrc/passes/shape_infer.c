/*
 * shape_infer.c - re-runs every live node's shape rule over a (possibly rewritten) graph, so a
 * pass that produced an ill-typed node is caught at compile time, naming the node.
 */
#include "core/core.h"
#include "passes/passes.h"

rlx_status rlx_pass_shape_infer(struct rlx_graph *g)
{
    for (int id = 0; id < g->n_nodes; id++) {
        struct rlx_node *n = &g->nodes[id];
        if (n->dead) continue;
        RLX_TRY(rlx_infer_node(g, id, n));
    }
    return RLX_OK;
}
