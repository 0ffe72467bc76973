/*
 * compile.c - rlx_compile: copies the graph, runs the passes in their fixed order, collects the
 * plan's interface (inputs, params, states, outputs) and hands the graph to the device's backend.
 * Also the plan's accessors and rlx_plan_free.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "runtime/plan.h"

struct rlx_compile_opts rlx_compile_opts_default(void)
{
    struct rlx_compile_opts o;
    memset(&o, 0, sizeof o);
    o.fuse = true;
    return o;
}

static rlx_status run_passes(struct rlx_plan *p)
{
    RLX_TRY(rlx_pass_dead_nodes(p->g));
    if (p->opts.fuse) {
        RLX_TRY(rlx_pass_fuse(p->g));
        RLX_TRY(rlx_pass_dead_nodes(p->g));
    }
    RLX_TRY(rlx_pass_shape_infer(p->g));
    RLX_TRY(rlx_pass_assign(p->g, p->dev));
    return rlx_liveness_compute(p->g, &p->lv);
}

static rlx_status collect_interface(struct rlx_plan *p)
{
    const struct rlx_graph *g = p->g;
    int n = g->n_nodes;
    for (int id = 0; id < n; id++) {
        if (g->nodes[id].op == RLX_OP_INPUT) p->n_inputs++;
        if (g->nodes[id].op == RLX_OP_PARAM) p->n_params++;
        if (g->nodes[id].op == RLX_OP_STATE) p->n_states++;
    }
    p->inputs = rlx_calloc((size_t)p->n_inputs, sizeof *p->inputs);
    p->params = rlx_calloc((size_t)p->n_params, sizeof *p->params);
    p->states = rlx_calloc((size_t)p->n_states, sizeof *p->states);
    p->in_host = rlx_calloc((size_t)p->n_inputs, sizeof *p->in_host);
    p->in_set = rlx_calloc((size_t)p->n_inputs, sizeof *p->in_set);
    p->in_buf = rlx_calloc((size_t)p->n_inputs, sizeof *p->in_buf);
    p->in_buf_cap = rlx_calloc((size_t)p->n_inputs, sizeof *p->in_buf_cap);
    p->param = rlx_calloc((size_t)p->n_params, sizeof *p->param);
    p->state = rlx_calloc((size_t)p->n_states, sizeof *p->state);
    p->sizes = rlx_calloc((size_t)n, sizeof *p->sizes);
    p->offsets = rlx_calloc((size_t)n, sizeof *p->offsets);
    p->scratch = rlx_calloc((size_t)n * 2, sizeof *p->scratch);
    p->values = rlx_calloc((size_t)n, sizeof *p->values);
    p->used = rlx_calloc((size_t)n, sizeof *p->used);
    const size_t no = (size_t)g->n_outputs;
    p->out_dst = rlx_calloc(no, sizeof *p->out_dst);
    p->out_dst_bytes = rlx_calloc(no, sizeof *p->out_dst_bytes);
    p->out_buf = rlx_calloc(no, sizeof *p->out_buf);
    p->external = rlx_calloc((size_t)n, sizeof *p->external);
    p->planned_external = rlx_calloc((size_t)n, sizeof *p->planned_external);
    if (!p->inputs || !p->params || !p->states || !p->in_host || !p->in_set || !p->in_buf || !p->in_buf_cap ||
        !p->param || !p->state || !p->sizes || !p->offsets || !p->scratch || !p->values || !p->used || !p->out_dst ||
        !p->out_dst_bytes || !p->out_buf || !p->external || !p->planned_external)
        return RLX_ERR_NOMEM;
    for (int id = 0; id < n; id++)
        for (int k = 0; !g->nodes[id].dead && k < g->nodes[id].n_in; k++) p->used[g->nodes[id].in[k]] = true;
    for (int i = 0; i < g->n_outputs; i++) p->used[g->outputs[i]] = true;
    for (int id = 0; id < n; id++)
        for (int d = 0; !g->nodes[id].dead && d < g->nodes[id].ndim; d++)
            for (int s = 0; s < RLX_MAX_SYMS; s++) p->sym_used[s] |= g->nodes[id].shape[d].coef[s] != 0;
    int ni = 0, np = 0, ns = 0;
    for (int id = 0; id < n; id++) {
        if (g->nodes[id].op == RLX_OP_INPUT) p->inputs[ni++] = id;
        if (g->nodes[id].op == RLX_OP_PARAM) p->params[np++] = id;
        if (g->nodes[id].op == RLX_OP_STATE) p->states[ns++] = id;
    }
    return RLX_OK;
}

rlx_status rlx_compile(const struct rlx_graph *g, struct rlx_device *dev, const struct rlx_compile_opts *opts,
                       struct rlx_plan **out)
{
    if (!g) return rlx_set_error(RLX_ERR_INVALID, "compile: no graph");
    if (!dev) return rlx_set_error(RLX_ERR_INVALID, "compile: no device");
    if (g->n_outputs == 0) return rlx_set_error(RLX_ERR_INVALID, "compile: the graph has no outputs");
    struct rlx_plan *p = rlx_calloc(1, sizeof *p);
    if (!p) return RLX_ERR_NOMEM;
    p->dev = dev;
    p->opts = opts ? *opts : rlx_compile_opts_default();
    snprintf(p->budget_hint, sizeof p->budget_hint, "%s", p->opts.budget_hint ? p->opts.budget_hint : "");
    p->opts.budget_hint = p->budget_hint;
    rlx_status s = rlx_graph_clone(g, &p->g);
    if (s == RLX_OK) s = run_passes(p);
    if (s == RLX_OK) s = collect_interface(p);
    if (s == RLX_OK) s = rlx_plan_check_caps(p);
    if (s == RLX_OK) s = dev->be->plan_compile(dev->ctx, p->g, &p->opts, &p->be_state);
    if (s != RLX_OK) {
        rlx_plan_free(p);
        return s;
    }
    int live = 0;
    for (int id = 0; id < p->g->n_nodes; id++) live += !p->g->nodes[id].dead;
    rlx_log(RLX_LOG_DEBUG, "compiled a plan for '%s': %d of %d nodes live, %d inputs, %d params, %d states, %d outputs",
            dev->name, live, p->g->n_nodes, p->n_inputs, p->n_params, p->n_states, p->g->n_outputs);
    *out = p;
    return RLX_OK;
}

void rlx_plan_free(struct rlx_plan *p)
{
    if (!p) return;
    struct rlx_device *d = p->dev;
    if (p->be_state) d->be->plan_free(d->ctx, p->be_state);
    for (int i = 0; p->in_buf && i < p->n_inputs; i++) rlx_dev_free(d, p->in_buf[i]);
    for (int i = 0; p->param && i < p->n_params; i++)
        if (p->param[i].owned) rlx_dev_free(d, p->param[i].buf);
    for (int i = 0; p->out_buf && i < p->g->n_outputs; i++) rlx_dev_free(d, p->out_buf[i]);
    rlx_dev_free(d, p->arena);
    if (p->shared && p->shared->holder == p) p->shared->holder = NULL;
    rlx_liveness_free(&p->lv);
    free(p->inputs);
    free(p->params);
    free(p->states);
    free(p->in_host);
    free(p->in_set);
    free(p->in_buf);
    free(p->in_buf_cap);
    free(p->param);
    free(p->state);
    free(p->sizes);
    free(p->offsets);
    free(p->scratch);
    free(p->values);
    free(p->used);
    free(p->out_dst);
    free(p->out_dst_bytes);
    free(p->out_buf);
    free(p->external);
    free(p->planned_external);
    free(p->node_seconds);
    rlx_graph_free(p->g);
    free(p);
}

const struct rlx_graph *rlx_plan_graph(const struct rlx_plan *p) { return p->g; }
struct rlx_device *rlx_plan_device(const struct rlx_plan *p) { return p->dev; }
int rlx_plan_input_count(const struct rlx_plan *p) { return p->n_inputs; }
int rlx_plan_param_count(const struct rlx_plan *p) { return p->n_params; }
int rlx_plan_output_count(const struct rlx_plan *p) { return p->g->n_outputs; }

const char *rlx_plan_input_name(const struct rlx_plan *p, int i)
{
    return (i >= 0 && i < p->n_inputs) ? p->g->nodes[p->inputs[i]].name : NULL;
}

const char *rlx_plan_param_name(const struct rlx_plan *p, int i)
{
    return (i >= 0 && i < p->n_params) ? p->g->nodes[p->params[i]].name : NULL;
}

const char *rlx_plan_output_name(const struct rlx_plan *p, int i)
{
    return (i >= 0 && i < p->g->n_outputs) ? p->g->output_names[i] : NULL;
}

int rlx_plan_output_dtype(const struct rlx_plan *p, int i)
{
    return (i >= 0 && i < p->g->n_outputs) ? (int)p->g->nodes[p->g->outputs[i]].dtype : -1;
}

static rlx_status find_name(const char *kind, const char *name, int count,
                            const char *(*get)(const struct rlx_plan *, int), const struct rlx_plan *p, int *out)
{
    for (int i = 0; name && i < count; i++)
        if (strcmp(get(p, i), name) == 0) {
            *out = i;
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_INVALID, "the plan has no %s named '%s'", kind, name ? name : "(null)");
}

rlx_status rlx_plan_input_index(const struct rlx_plan *p, const char *name, int *out)
{
    return find_name("input", name, p->n_inputs, rlx_plan_input_name, p, out);
}

rlx_status rlx_plan_param_index(const struct rlx_plan *p, const char *name, int *out)
{
    return find_name("param", name, p->n_params, rlx_plan_param_name, p, out);
}

rlx_status rlx_plan_output_index(const struct rlx_plan *p, const char *name, int *out)
{
    return find_name("output", name, p->g->n_outputs, rlx_plan_output_name, p, out);
}

static rlx_status index_of_node(const int *ids, int n, int id, const char *kind, int *index)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id) {
            *index = i;
            return RLX_OK;
        }
    return rlx_set_error(RLX_ERR_INVALID, "node %d is not an %s of the plan", id, kind);
}

rlx_status rlx_plan_input_of_node(const struct rlx_plan *p, int id, int *index)
{
    return index_of_node(p->inputs, p->n_inputs, id, "input", index);
}

rlx_status rlx_plan_state_of_node(const struct rlx_plan *p, int id, int *index)
{
    return index_of_node(p->states, p->n_states, id, "state", index);
}
