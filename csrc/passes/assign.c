/*
 * assign.c - backend assignment. A plan runs on one backend; this pass asks the backend's
 * supports_op about every live node and refuses the compile, naming the node, when one is not
 * supported. There is no silent fallback to another backend.
 */
#include "core/core.h"
#include "passes/passes.h"

rlx_status rlx_pass_assign(const struct rlx_graph *g, const struct rlx_backend *be)
{
    for (int id = 0; id < g->n_nodes; id++) {
        const struct rlx_node *n = &g->nodes[id];
        if (n->dead) continue;
        if (!be->supports_op(g, id))
            return rlx_set_error(RLX_ERR_UNSUPPORTED, "backend '%s' does not support node %d (%s, %s)", be->name, id,
                                 rlx_op_name(n->op), rlx_dtype_name(n->dtype));
    }
    return RLX_OK;
}
