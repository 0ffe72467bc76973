/*
 * dead_nodes.c - dead-node elimination: keeps what the outputs depend on. Inputs and params
 * that nothing uses stay (they are part of the graph's interface) but are never computed.
 */
#include <stdlib.h>

#include "core/core.h"
#include "passes/passes.h"

rlx_status rlx_pass_dead_nodes(struct rlx_graph *g)
{
    bool *live = rlx_calloc((size_t)g->n_nodes, sizeof *live);
    if (!live) return RLX_ERR_NOMEM;
    for (int i = 0; i < g->n_outputs; i++) live[g->outputs[i]] = true;
    /* Ids are topological, so one backward sweep propagates liveness to every producer. A live
     * companion (fused_out) makes its producer live; a live producer keeps its companion. */
    for (int id = g->n_nodes - 1; id >= 0; id--) {
        struct rlx_node *n = &g->nodes[id];
        if (!live[id] && n->op == RLX_OP_ADD_RMSNORM && n->companion >= 0 && live[n->companion]) live[id] = true;
        if (!live[id]) continue;
        for (int k = 0; k < n->n_in; k++) live[n->in[k]] = true;
    }
    for (int id = 0; id < g->n_nodes; id++) {
        struct rlx_node *n = &g->nodes[id];
        if (n->op == RLX_OP_ADD_RMSNORM && live[id] && n->companion >= 0) live[n->companion] = true;
        n->dead = !live[id] && n->op != RLX_OP_INPUT && n->op != RLX_OP_PARAM;
    }
    free(live);
    return RLX_OK;
}
