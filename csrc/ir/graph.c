/*
 * graph.c - the graph builder: symbols, inputs, params, ops, outputs, cloning and a readable
 * dump. Every node's shape is inferred as it is added, so errors surface at the call that made
 * them, naming the node. A failed add leaves the graph exactly as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ir/graph.h"

static const char *const builtin_syms[RLX_SYM_FIRST_USER] = {"BATCH", "SEQ", "PAST"};

rlx_status rlx_graph_create(struct rlx_graph **out)
{
    struct rlx_graph *g = rlx_calloc(1, sizeof *g);
    if (!g) return RLX_ERR_NOMEM;
    for (int s = 0; s < RLX_SYM_FIRST_USER; s++) snprintf(g->sym_names[s], RLX_NAME_MAX, "%s", builtin_syms[s]);
    g->n_syms = RLX_SYM_FIRST_USER;
    *out = g;
    return RLX_OK;
}

void rlx_graph_free(struct rlx_graph *g)
{
    if (!g) return;
    free(g->nodes);
    free(g->outputs);
    free(g->output_names);
    free(g);
}

rlx_status rlx_graph_clone(const struct rlx_graph *g, struct rlx_graph **out)
{
    struct rlx_graph *c;
    RLX_TRY(rlx_graph_create(&c));
    memcpy(c->sym_names, g->sym_names, sizeof c->sym_names);
    c->n_syms = g->n_syms;
    if (rlx_grow(&c->nodes, &c->cap_nodes, g->n_nodes) || rlx_grow(&c->outputs, &c->cap_outputs, g->n_outputs) ||
        rlx_grow(&c->output_names, &c->cap_output_names, g->n_outputs)) {
        rlx_graph_free(c);
        return RLX_ERR_NOMEM;
    }
    if (g->n_nodes) memcpy(c->nodes, g->nodes, (size_t)g->n_nodes * sizeof *c->nodes);
    if (g->n_outputs) {
        memcpy(c->outputs, g->outputs, (size_t)g->n_outputs * sizeof *c->outputs);
        memcpy(c->output_names, g->output_names, (size_t)g->n_outputs * sizeof *c->output_names);
    }
    c->n_nodes = g->n_nodes;
    c->n_outputs = g->n_outputs;
    *out = c;
    return RLX_OK;
}

rlx_status rlx_graph_symbol(struct rlx_graph *g, const char *name, int *out_sym)
{
    if (!name || !name[0] || strlen(name) >= RLX_NAME_MAX)
        return rlx_set_error(RLX_ERR_INVALID, "symbol name must be 1..%d characters", RLX_NAME_MAX - 1);
    for (const char *c = name; *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_'))
            return rlx_set_error(RLX_ERR_INVALID, "symbol name '%s' may only hold letters, digits and '_'", name);
    for (int s = 0; s < g->n_syms; s++)
        if (strcmp(g->sym_names[s], name) == 0) {
            *out_sym = s;
            return RLX_OK;
        }
    if (g->n_syms == RLX_MAX_SYMS)
        return rlx_set_error(RLX_ERR_INVALID, "too many symbols: at most %d per graph (adding '%s')", RLX_MAX_SYMS,
                             name);
    snprintf(g->sym_names[g->n_syms], RLX_NAME_MAX, "%s", name);
    *out_sym = g->n_syms++;
    return RLX_OK;
}

const char *rlx_graph_symbol_name(const struct rlx_graph *g, int sym)
{
    return (sym >= 0 && sym < g->n_syms) ? g->sym_names[sym] : NULL;
}

int rlx_graph_symbol_count(const struct rlx_graph *g) { return g->n_syms; }

static rlx_status check_name_free(const struct rlx_graph *g, const char *name, const char *what)
{
    if (!name || !name[0] || strlen(name) >= RLX_NAME_MAX)
        return rlx_set_error(RLX_ERR_INVALID, "%s name must be 1..%d characters", what, RLX_NAME_MAX - 1);
    for (int i = 0; i < g->n_nodes; i++)
        if ((g->nodes[i].op == RLX_OP_INPUT || g->nodes[i].op == RLX_OP_PARAM || g->nodes[i].op == RLX_OP_STATE) &&
            strcmp(g->nodes[i].name, name) == 0)
            return rlx_set_error(RLX_ERR_INVALID, "%s name '%s' is already used by node %d", what, name, i);
    return RLX_OK;
}

static rlx_status add_leaf(struct rlx_graph *g, enum rlx_op op, const char *name, enum rlx_dtype dt, int ndim,
                           const struct rlx_dim *shape, int *out_id)
{
    const char *what = rlx_op_table[op].name;
    RLX_TRY(check_name_free(g, name, what));
    if ((unsigned)dt >= RLX_DTYPE_COUNT)
        return rlx_set_error(RLX_ERR_DTYPE, "%s '%s': bad dtype %d", what, name, (int)dt);
    if (ndim < 0 || ndim > RLX_MAX_DIMS)
        return rlx_set_error(RLX_ERR_SHAPE, "%s '%s': rank %d outside 0..%d", what, name, ndim, RLX_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        for (int s = 0; s < RLX_MAX_SYMS; s++) {
            if (shape[i].coef[s] < 0)
                return rlx_set_error(RLX_ERR_SHAPE, "%s '%s': dim %d has a negative symbol coefficient", what, name, i);
            if (shape[i].coef[s] && s >= g->n_syms)
                return rlx_set_error(RLX_ERR_SHAPE, "%s '%s': dim %d uses undefined symbol %d", what, name, i, s);
        }
        if (rlx_dim_is_const(&shape[i]) && shape[i].c < 1)
            return rlx_set_error(RLX_ERR_SHAPE, "%s '%s': dim %d is %lld, must be >= 1", what, name, i,
                                 (long long)shape[i].c);
        if (op == RLX_OP_PARAM && !rlx_dim_is_const(&shape[i]))
            return rlx_set_error(RLX_ERR_SHAPE, "param '%s': dim %d is symbolic; params have constant shapes", name, i);
    }
    RLX_TRY(rlx_grow(&g->nodes, &g->cap_nodes, g->n_nodes + 1));
    struct rlx_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->dtype = dt;
    n->ndim = ndim;
    for (int i = 0; i < ndim; i++) n->shape[i] = shape[i];
    snprintf(n->name, RLX_NAME_MAX, "%s", name);
    n->companion = -1;
    *out_id = g->n_nodes++;
    return RLX_OK;
}

rlx_status rlx_graph_input(struct rlx_graph *g, const char *name, enum rlx_dtype dt, int ndim,
                           const struct rlx_dim *shape, int *out_id)
{
    return add_leaf(g, RLX_OP_INPUT, name, dt, ndim, shape, out_id);
}

rlx_status rlx_graph_param(struct rlx_graph *g, const char *name, enum rlx_dtype dt, int ndim,
                           const struct rlx_dim *shape, int *out_id)
{
    return add_leaf(g, RLX_OP_PARAM, name, dt, ndim, shape, out_id);
}

rlx_status rlx_graph_state(struct rlx_graph *g, const char *name, enum rlx_dtype dt, int ndim,
                           const struct rlx_dim *shape, int *out_id)
{
    return add_leaf(g, RLX_OP_STATE, name, dt, ndim, shape, out_id);
}

static rlx_status add_op(struct rlx_graph *g, enum rlx_op op, int n_inputs, const int *inputs,
                         const struct rlx_attrs *attrs, int *out_id, bool internal)
{
    if ((unsigned)op >= RLX_OP_COUNT) return rlx_set_error(RLX_ERR_INVALID, "unknown op %d", (int)op);
    if (!internal && !rlx_op_table[op].user)
        return rlx_set_error(RLX_ERR_INVALID, "op '%s' cannot be added directly (use the builder call for it)",
                             rlx_op_table[op].name);
    if (n_inputs < 0 || n_inputs > RLX_MAX_INPUTS)
        return rlx_set_error(RLX_ERR_INVALID, "node %d (%s): %d inputs, at most %d", g->n_nodes, rlx_op_table[op].name,
                             n_inputs, RLX_MAX_INPUTS);
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i] < 0 || inputs[i] >= g->n_nodes)
            return rlx_set_error(RLX_ERR_INVALID, "node %d (%s): input %d refers to node %d, which does not exist",
                                 g->n_nodes, rlx_op_table[op].name, i, inputs[i]);
    struct rlx_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.n_in = n_inputs;
    for (int i = 0; i < n_inputs; i++) n.in[i] = inputs[i];
    if (attrs) n.attrs = *attrs;
    n.companion = -1;
    RLX_TRY(rlx_infer_node(g, g->n_nodes, &n));
    RLX_TRY(rlx_grow(&g->nodes, &g->cap_nodes, g->n_nodes + 1));
    g->nodes[g->n_nodes] = n;
    *out_id = g->n_nodes++;
    return RLX_OK;
}

rlx_status rlx_graph_op(struct rlx_graph *g, enum rlx_op op, int n_inputs, const int *inputs,
                        const struct rlx_attrs *attrs, int *out_id)
{
    return add_op(g, op, n_inputs, inputs, attrs, out_id, false);
}

rlx_status rlx_graph_cache_write(struct rlx_graph *g, int state, int rows, int pos, int *out_id)
{
    return add_op(g, RLX_OP_CACHE_WRITE, 3, (int[]){state, rows, pos}, NULL, out_id, true);
}

rlx_status rlx_graph_output(struct rlx_graph *g, int id, const char *name)
{
    if (id < 0 || id >= g->n_nodes) return rlx_set_error(RLX_ERR_INVALID, "output: node %d does not exist", id);
    if (!name || !name[0] || strlen(name) >= RLX_NAME_MAX)
        return rlx_set_error(RLX_ERR_INVALID, "output name must be 1..%d characters", RLX_NAME_MAX - 1);
    for (int i = 0; i < g->n_outputs; i++)
        if (strcmp(g->output_names[i], name) == 0)
            return rlx_set_error(RLX_ERR_INVALID, "output name '%s' is already used", name);
    RLX_TRY(rlx_grow(&g->outputs, &g->cap_outputs, g->n_outputs + 1));
    RLX_TRY(rlx_grow(&g->output_names, &g->cap_output_names, g->n_outputs + 1));
    g->outputs[g->n_outputs] = id;
    snprintf(g->output_names[g->n_outputs], RLX_NAME_MAX, "%s", name);
    g->n_outputs++;
    return RLX_OK;
}

int rlx_graph_node_count(const struct rlx_graph *g) { return g->n_nodes; }

rlx_status rlx_graph_node_info(const struct rlx_graph *g, int id, enum rlx_op *op, enum rlx_dtype *dt, int *ndim,
                               struct rlx_dim *shape, const char **name)
{
    if (id < 0 || id >= g->n_nodes) return rlx_set_error(RLX_ERR_INVALID, "node %d does not exist", id);
    const struct rlx_node *n = &g->nodes[id];
    if (op) *op = n->op;
    if (dt) *dt = n->dtype;
    if (ndim) *ndim = n->ndim;
    if (shape)
        for (int i = 0; i < n->ndim; i++) shape[i] = n->shape[i];
    if (name) *name = n->name;
    return RLX_OK;
}

size_t rlx_graph_dump(const struct rlx_graph *g, char *buf, size_t cap)
{
    size_t len = 0;
    char line[1024], shape[256];
#define EMIT(...)                                                                                                      \
    do {                                                                                                               \
        int k_ = snprintf(line, sizeof line, __VA_ARGS__);                                                             \
        if (k_ > 0) {                                                                                                  \
            if (len < cap) snprintf(buf + len, cap - len, "%s", line);                                                 \
            len += (size_t)k_;                                                                                         \
        }                                                                                                              \
    } while (0)
    if (cap) buf[0] = '\0';
    for (int i = 0; i < g->n_nodes; i++) {
        const struct rlx_node *n = &g->nodes[i];
        if (n->dead) continue;
        rlx_shape_format(g, n->ndim, n->shape, shape, sizeof shape);
        EMIT("%%%d = %s", i, rlx_op_table[n->op].name);
        if (n->name[0]) EMIT(" '%s'", n->name);
        for (int k = 0; k < n->n_in; k++) EMIT("%s%%%d", k ? ", " : " ", n->in[k]);
        EMIT(" : %s%s\n", rlx_dtype_name(n->dtype), shape);
    }
    for (int i = 0; i < g->n_outputs; i++) EMIT("output '%s' = %%%d\n", g->output_names[i], g->outputs[i]);
#undef EMIT
    return len;
}
