/*
 * graph.h - the IR's internal layout, shared by the builder, the passes and the runtime.
 *
 * A graph is a list of nodes in topological order: a node only references nodes with smaller
 * ids, so id order is an execution order. Each node produces one value (dtype + shape of
 * symbolic dims). Passes never renumber nodes; they rewrite ops in place and mark nodes dead.
 */
#ifndef RLX_IR_GRAPH_H
#define RLX_IR_GRAPH_H

#include "rlx/rlx.h"

struct rlx_node {
    enum rlx_op op;
    enum rlx_dtype dtype;
    int n_in;
    int in[RLX_MAX_INPUTS]; /* ids of the input nodes, all < this node's id */
    int ndim;
    struct rlx_dim shape[RLX_MAX_DIMS];
    struct rlx_attrs attrs;
    char name[RLX_NAME_MAX]; /* INPUT / PARAM / STATE name; "" otherwise */
    int companion;           /* ADD_RMSNORM: id of its FUSED_OUT node; -1 otherwise */
    bool dead;               /* removed by a pass */
};

struct rlx_graph {
    struct rlx_node *nodes; /* (n_nodes) */
    int n_nodes, cap_nodes;
    char sym_names[RLX_MAX_SYMS][RLX_NAME_MAX];
    int n_syms;
    int *outputs;                       /* (n_outputs) node ids */
    char (*output_names)[RLX_NAME_MAX]; /* (n_outputs) */
    int n_outputs, cap_outputs, cap_output_names;
};

/* Per-op metadata: the table is indexed by enum rlx_op and locked to RLX_OP_COUNT. */
struct rlx_op_info {
    const char *name;
    int min_in, max_in;
    bool user; /* may be added with rlx_graph_op (not INPUT/PARAM/fused) */
    /* Sets n's dtype and shape from its inputs, or fails naming the node and the shapes. */
    rlx_status (*infer)(const struct rlx_graph *g, int id, struct rlx_node *n);
};
extern const struct rlx_op_info rlx_op_table[]; /* RLX_OP_COUNT rows */

/* Builder calls for the internal ops (not addable with rlx_graph_op): a STATE leaf (a named tensor
 * bound per run by its owner, e.g. one layer's K cache; dims may be symbolic), and a CACHE_WRITE
 * of rows at positions pos into a state (see rlx.h). */
rlx_status rlx_graph_state(struct rlx_graph *g, const char *name, enum rlx_dtype dt, int ndim,
                           const struct rlx_dim *shape, int *out_id);
rlx_status rlx_graph_cache_write(struct rlx_graph *g, int state, int rows, int pos, int *out_id);

/* Runs the op's shape rule on node id (checks arity too). */
rlx_status rlx_infer_node(const struct rlx_graph *g, int id, struct rlx_node *n);

/* Dim helpers. */
struct rlx_dim rlx_dim_add(const struct rlx_dim *a, const struct rlx_dim *b);
/* Value of d with symbol values vals, d using symbols below n_syms only (a graph's n_syms: its
 * nodes' dims are checked to); bound[s] false for an unbound symbol used by d -> returns false
 * (bound NULL: all bound). A value that overflows int64 evaluates to INT64_MAX (which every size
 * check refuses). */
bool rlx_dim_eval(const struct rlx_dim *d, int n_syms, const int64_t *vals, const bool *bound, int64_t *out);
/* "(SEQ, 8, 64)" */
void rlx_shape_format(const struct rlx_graph *g, int ndim, const struct rlx_dim *shape, char *buf, size_t cap);
/* True when the element counts of the two shapes are equal for every symbol binding. */
bool rlx_shapes_same_numel(int na, const struct rlx_dim *a, int nb, const struct rlx_dim *b);

#endif
