/*
 * assign.c - backend assignment. A plan runs on one backend; this pass asks the backend's
 * supports_op about every live node and refuses the compile, naming the node, when one is not
 * supported. There is no silent fallback to another backend.
 */
#include <stdio.h>

#include "core/core.h"
#include "passes/passes.h"

/* "f32, q8_0": the dtypes of a node's inputs, for the refusal message. */
static const char *operand_dtypes(const struct rlx_graph *g, const struct rlx_node *n)
{
    static _Thread_local char buf[128];
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < n->n_in && len < sizeof buf; k++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", k ? ", " : "",
                                rlx_dtype_name(g->nodes[n->in[k]].dtype));
    return buf;
}

rlx_status rlx_pass_assign(const struct rlx_graph *g, const struct rlx_device *dev)
{
    const struct rlx_backend *be = dev->be;
    for (int id = 0; id < g->n_nodes; id++) {
        const struct rlx_node *n = &g->nodes[id];
        if (n->dead) continue;
        if (!be->supports_op(dev->ctx, g, id))
            return rlx_set_error(RLX_ERR_UNSUPPORTED, "device '%s' does not support node %d (%s, %s%s%s)", dev->name,
                                 id, rlx_op_name(n->op), rlx_dtype_name(n->dtype), n->n_in > 1 ? " from " : "",
                                 n->n_in > 1 ? operand_dtypes(g, n) : "");
    }
    return RLX_OK;
}
