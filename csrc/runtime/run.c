/*
 * run.c - binding and running a plan: params (bound to a weight store's memory, or set for this
 * plan alone: used in place where the device reads host memory), inputs (kept until the run
 * returns), states (device memory bound per run: the KV caches), symbol inference from input
 * shapes, the memory plan for the binding (remade only when the binding outgrows the last one),
 * placement of every value, and reading outputs back. Every size is computed with checked
 * arithmetic (rlx_shape_bytes): a binding whose sizes would overflow is refused, never wrapped.
 * Every failure leaves the plan usable for the next run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "runtime/plan.h"

static void format_host_shape(const struct rlx_host_tensor *t, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < t->ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, ")");
}

/* Checks a host tensor's description and returns its size in bytes. */
static rlx_status check_host_tensor(const struct rlx_host_tensor *t, const char *kind, const char *name, size_t *bytes)
{
    if (!t || (unsigned)t->dtype >= RLX_DTYPE_COUNT || t->ndim < 0 || t->ndim > RLX_MAX_DIMS)
        return rlx_set_error(RLX_ERR_INVALID, "%s '%s': bad tensor description", kind, name);
    rlx_status s = rlx_shape_bytes(t->dtype, t->ndim, t->shape, bytes);
    if (s != RLX_OK) return rlx_error_context(s, "%s '%s'", kind, name);
    if (!t->data && *bytes) return rlx_set_error(RLX_ERR_INVALID, "%s '%s': no data", kind, name);
    return RLX_OK;
}

/* Bytes of node id's value under symbol values vals. */
static rlx_status node_bytes(const struct rlx_plan *p, int id, const int64_t *vals, size_t *bytes)
{
    const struct rlx_node *n = &p->g->nodes[id];
    int64_t shape[RLX_MAX_DIMS];
    rlx_plan_eval_shape(p, id, vals, shape);
    for (int d = 0; d < n->ndim; d++)
        if (shape[d] < 0) shape[d] = 0; /* a negative extent is reported by place_values */
    rlx_status s = rlx_shape_bytes(n->dtype, n->ndim, shape, bytes);
    return s == RLX_OK ? s : rlx_error_context(s, "node %d (%s)", id, rlx_op_name(n->op));
}

static rlx_status check_param_fit(const struct rlx_plan *p, int index, enum rlx_dtype dt, int ndim,
                                  const int64_t *shape)
{
    const struct rlx_node *n = &p->g->nodes[p->params[index]];
    if (dt != n->dtype)
        return rlx_set_error(RLX_ERR_DTYPE, "param '%s' is %s, got %s", n->name, rlx_dtype_name(n->dtype),
                             rlx_dtype_name(dt));
    bool ok = ndim == n->ndim;
    for (int i = 0; ok && i < n->ndim; i++) ok = shape[i] == n->shape[i].c;
    if (!ok) {
        char want[160], got[160];
        struct rlx_host_tensor t = {.ndim = ndim};
        memcpy(t.shape, shape, sizeof(int64_t) * (size_t)ndim);
        rlx_shape_format(p->g, n->ndim, n->shape, want, sizeof want);
        format_host_shape(&t, got, sizeof got);
        return rlx_set_error(RLX_ERR_SHAPE, "param '%s' has shape %s, got %s", n->name, want, got);
    }
    return RLX_OK;
}

static void unbind_param(struct rlx_plan *p, int index)
{
    if (p->param[index].owned) rlx_dev_free(p->dev, p->param[index].buf);
    p->param[index] = (struct rlx_binding){0};
}

rlx_status rlx_plan_set_param(struct rlx_plan *p, int index, const struct rlx_host_tensor *t)
{
    if (index < 0 || index >= p->n_params) return rlx_set_error(RLX_ERR_INVALID, "param index %d out of range", index);
    const struct rlx_node *n = &p->g->nodes[p->params[index]];
    size_t bytes;
    RLX_TRY(check_host_tensor(t, "param", n->name, &bytes));
    RLX_TRY(check_param_fit(p, index, t->dtype, t->ndim, t->shape));
    unbind_param(p, index); /* a param buffer is replaced, not grown: it may be a wrapper */
    struct rlx_buffer *b = NULL;
    size_t cap = 0;
    rlx_status s = rlx_dev_place(p->dev, t->data, bytes, &b, &cap);
    if (s != RLX_OK) {
        rlx_dev_free(p->dev, b);
        return s;
    }
    p->param[index] = (struct rlx_binding){.buf = b, .offset = 0, .owned = true};
    return RLX_OK;
}

/* Called by rlx_plan_bind_weights (weights.c) for each param. */
rlx_status rlx_plan_bind_param_buffer(struct rlx_plan *p, int index, enum rlx_dtype dt, int ndim, const int64_t *shape,
                                      struct rlx_buffer *buf)
{
    RLX_TRY(check_param_fit(p, index, dt, ndim, shape));
    unbind_param(p, index);
    p->param[index] = (struct rlx_binding){.buf = buf, .offset = 0, .owned = false};
    return RLX_OK;
}

rlx_status rlx_plan_set_input(struct rlx_plan *p, int index, const struct rlx_host_tensor *t)
{
    if (index < 0 || index >= p->n_inputs) return rlx_set_error(RLX_ERR_INVALID, "input index %d out of range", index);
    const struct rlx_node *n = &p->g->nodes[p->inputs[index]];
    size_t bytes;
    RLX_TRY(check_host_tensor(t, "input", n->name, &bytes));
    if (t->dtype != n->dtype)
        return rlx_set_error(RLX_ERR_DTYPE, "input '%s' is %s, got %s", n->name, rlx_dtype_name(n->dtype),
                             rlx_dtype_name(t->dtype));
    if (t->ndim != n->ndim) {
        char want[160];
        rlx_shape_format(p->g, n->ndim, n->shape, want, sizeof want);
        return rlx_set_error(RLX_ERR_SHAPE, "input '%s' has rank %d, got rank %d (expected shape %s)", n->name, n->ndim,
                             t->ndim, want);
    }
    p->in_host[index] = *t;
    p->in_set[index] = true;
    return RLX_OK;
}

rlx_status rlx_plan_bind_state(struct rlx_plan *p, int index, struct rlx_buffer *buf, size_t offset)
{
    if (index < 0 || index >= p->n_states) return rlx_set_error(RLX_ERR_INVALID, "state index %d out of range", index);
    if (!buf || offset > buf->size)
        return rlx_set_error(RLX_ERR_INVALID, "state '%s': no memory to bind", p->g->nodes[p->states[index]].name);
    p->state[index] = (struct rlx_binding){.buf = buf, .offset = offset};
    return RLX_OK;
}

rlx_status rlx_plan_bind_output(struct rlx_plan *p, int index, void *dst, size_t bytes)
{
    if (index < 0 || index >= p->g->n_outputs)
        return rlx_set_error(RLX_ERR_INVALID, "output index %d out of range", index);
    if (!dst && bytes)
        return rlx_set_error(RLX_ERR_INVALID, "output '%s': no memory to bind", p->g->output_names[index]);
    p->out_dst[index] = dst;
    p->out_dst_bytes[index] = bytes;
    return RLX_OK;
}

rlx_status rlx_plan_bind_symbol(struct rlx_plan *p, int sym, int64_t value)
{
    if (sym < 0 || sym >= p->g->n_syms) return rlx_set_error(RLX_ERR_INVALID, "symbol %d is not defined", sym);
    if (value < 0)
        return rlx_set_error(RLX_ERR_RANGE, "symbol %s bound to %lld; must be >= 0", p->g->sym_names[sym],
                             (long long)value);
    p->sym[sym] = value;
    p->sym_explicit[sym] = true;
    return RLX_OK;
}

/* ---- symbols ------------------------------------------------------------------------------ */

static rlx_status input_dim_error(const struct rlx_plan *p, int i, int d, const char *why)
{
    const struct rlx_node *n = &p->g->nodes[p->inputs[i]];
    char want[160], got[160];
    rlx_shape_format(p->g, n->ndim, n->shape, want, sizeof want);
    format_host_shape(&p->in_host[i], got, sizeof got);
    return rlx_set_error(RLX_ERR_SHAPE, "input '%s' dim %d: %s (expected %s, got %s)", n->name, d, why, want, got);
}

/* Solves dims with one unknown symbol until nothing changes, then checks every input dim. */
static rlx_status infer_symbols(struct rlx_plan *p)
{
    bool progress = true;
    while (progress) {
        progress = false;
        for (int i = 0; i < p->n_inputs; i++) {
            const struct rlx_node *n = &p->g->nodes[p->inputs[i]];
            for (int d = 0; p->in_set[i] && d < n->ndim; d++) {
                const struct rlx_dim *e = &n->shape[d];
                int unknown = -1, n_unknown = 0;
                int64_t rest = p->in_host[i].shape[d] - e->c, term;
                bool overflow = false;
                for (int s = 0; s < RLX_MAX_SYMS; s++) {
                    if (!e->coef[s]) continue;
                    if (p->sym_bound[s])
                        overflow |= __builtin_mul_overflow((int64_t)e->coef[s], p->sym[s], &term) ||
                                    __builtin_sub_overflow(rest, term, &rest);
                    else
                        unknown = s, n_unknown++;
                }
                if (n_unknown != 1) continue;
                if (overflow || rest < 0 || rest % e->coef[unknown])
                    return input_dim_error(p, i, d, "no value of its symbol fits");
                p->sym[unknown] = rest / e->coef[unknown];
                p->sym_bound[unknown] = true;
                progress = true;
            }
        }
    }
    for (int i = 0; i < p->n_inputs; i++) {
        const struct rlx_node *n = &p->g->nodes[p->inputs[i]];
        for (int d = 0; p->in_set[i] && d < n->ndim; d++) {
            int64_t v;
            if (!rlx_dim_eval(&n->shape[d], p->g->n_syms, p->sym, p->sym_bound, &v))
                return input_dim_error(p, i, d, "its symbols cannot be inferred; bind them explicitly");
            if (v != p->in_host[i].shape[d]) return input_dim_error(p, i, d, "does not match");
        }
    }
    for (int s = 0; s < p->g->n_syms; s++)
        if (p->sym_bound[s] && p->opts.sym_cap[s] > 0 && p->sym[s] > p->opts.sym_cap[s])
            return rlx_set_error(RLX_ERR_RANGE, "symbol %s = %lld exceeds its compile cap %lld", p->g->sym_names[s],
                                 (long long)p->sym[s], (long long)p->opts.sym_cap[s]);
    return RLX_OK;
}

/* ---- memory ------------------------------------------------------------------------------- */

void rlx_plan_eval_shape(const struct rlx_plan *p, int id, const int64_t *vals, int64_t *shape)
{
    const struct rlx_node *n = &p->g->nodes[id];
    for (int i = 0; i < n->ndim; i++) rlx_dim_eval(&n->shape[i], p->g->n_syms, vals, NULL, &shape[i]);
}

/* Fills sizes for symbol values vals and plans offsets into the given arrays (n_nodes each;
 * scratch 2 * n_nodes); returns the arena bytes and the no-reuse total. */
static rlx_status plan_into(const struct rlx_plan *p, const int64_t *vals, size_t *sizes, size_t *offsets, int *scratch,
                            size_t *arena, size_t *unshared)
{
    for (int id = 0; id < p->g->n_nodes; id++) {
        sizes[id] = 0;
        if (!p->lv.in_arena[id] || p->external[id]) continue;
        RLX_TRY(node_bytes(p, id, vals, &sizes[id]));
    }
    return rlx_memory_plan(&p->lv, sizes, offsets, scratch, arena, unshared);
}

/* A plan for vals in temporary arrays (leaves the plan's own memory plan alone). */
static rlx_status plan_temp(const struct rlx_plan *p, const int64_t *vals, size_t *arena, size_t *unshared)
{
    size_t n = (size_t)p->g->n_nodes;
    size_t *sizes = rlx_calloc(n, sizeof *sizes), *offsets = rlx_calloc(n, sizeof *offsets);
    int *scratch = rlx_calloc(2 * n, sizeof *scratch);
    rlx_status s =
        (sizes && offsets && scratch) ? plan_into(p, vals, sizes, offsets, scratch, arena, unshared) : RLX_ERR_NOMEM;
    free(sizes);
    free(offsets);
    free(scratch);
    return s;
}

/* The smallest power of two >= v (v itself past 2^62, where doubling would overflow). */
static int64_t round_up_pow2(int64_t v)
{
    int64_t r = 1;
    while (r < v && r <= INT64_MAX / 2) r *= 2;
    return r < v ? v : r;
}

/* The arena the plan's runs use (its own or the shared one) holds at least `bytes`. */
static rlx_status ensure_arena(struct rlx_plan *p, size_t bytes)
{
    struct rlx_buffer **buf = p->shared ? &p->shared->buf : &p->arena;
    size_t *cap = p->shared ? &p->shared->cap : &p->arena_cap;
    if (*buf && *cap >= bytes) return RLX_OK;
    struct rlx_buffer *b;
    RLX_TRY(rlx_dev_alloc(p->dev, bytes, &b));
    rlx_dev_free(p->dev, *buf);
    *buf = b;
    *cap = bytes;
    return RLX_OK;
}

/* Makes sure the memory plan covers the current binding. Without caps the binding is rounded up
 * to powers of two, so a growing sequence replans O(log n) times. */
static rlx_status ensure_memory(struct rlx_plan *p)
{
    bool covered =
        p->planned && memcmp(p->external, p->planned_external, sizeof *p->external * (size_t)p->g->n_nodes) == 0;
    for (int s = 0; covered && s < p->g->n_syms; s++)
        if (p->sym_bound[s] && p->sym[s] > p->planned_sym[s]) covered = false;
    if (covered) return ensure_arena(p, p->planned_bytes); /* a shared arena may have been released */
    int64_t target[RLX_MAX_SYMS] = {0};
    for (int s = 0; s < p->g->n_syms; s++) {
        if (!p->sym_bound[s]) continue;
        int64_t cap = p->opts.sym_cap[s];
        target[s] = cap > 0 ? cap : round_up_pow2(p->sym[s] > p->planned_sym[s] ? p->sym[s] : p->planned_sym[s]);
    }
    size_t arena, unshared;
    p->planned = false; /* the offsets are rewritten below; valid again only on success */
    RLX_TRY(plan_into(p, target, p->sizes, p->offsets, p->scratch, &arena, &unshared));
    if (p->opts.memory_budget && arena > p->opts.memory_budget)
        return rlx_set_error(RLX_ERR_NOMEM,
                             "this run needs an estimated %zu bytes (%.1f MiB) of intermediates, above the memory "
                             "budget of %zu bytes (%.1f MiB)%s%s",
                             arena, (double)arena / 1048576.0, p->opts.memory_budget,
                             (double)p->opts.memory_budget / 1048576.0, p->opts.budget_hint[0] ? "; " : "",
                             p->opts.budget_hint);
    RLX_TRY(ensure_arena(p, arena));
    memcpy(p->planned_sym, target, sizeof target);
    memcpy(p->planned_external, p->external, sizeof *p->external * (size_t)p->g->n_nodes);
    rlx_log(RLX_LOG_DEBUG, "memory plan: arena of %zu bytes (%zu without reuse)", arena, unshared);
    p->planned = true;
    p->planned_bytes = arena;
    p->unshared_bytes = unshared;
    return RLX_OK;
}

/* ---- run ---------------------------------------------------------------------------------- */

static rlx_status place_values(struct rlx_plan *p)
{
    const struct rlx_graph *g = p->g;
    for (int i = 0; i < p->n_inputs; i++) {
        const struct rlx_host_tensor *t = &p->in_host[i];
        if (!p->in_set[i]) continue;
        size_t bytes;
        RLX_TRY(check_host_tensor(t, "input", g->nodes[p->inputs[i]].name, &bytes));
        RLX_TRY(rlx_dev_place(p->dev, t->data, bytes, &p->in_buf[i], &p->in_buf_cap[i]));
        p->values[p->inputs[i]].buf = p->in_buf[i];
        p->values[p->inputs[i]].offset = 0;
    }
    for (int i = 0; i < p->n_params; i++) {
        p->values[p->params[i]].buf = p->param[i].buf;
        p->values[p->params[i]].offset = p->param[i].offset;
    }
    for (int i = 0; i < p->n_states; i++) {
        p->values[p->states[i]].buf = p->state[i].buf;
        p->values[p->states[i]].offset = p->state[i].offset;
    }
    for (int id = 0; id < g->n_nodes; id++) {
        const struct rlx_node *n = &g->nodes[id];
        struct rlx_tensor *v = &p->values[id];
        v->dtype = n->dtype;
        v->ndim = n->ndim;
        rlx_plan_eval_shape(p, id, p->sym, v->shape);
        for (int d = 0; d < n->ndim; d++)
            if (v->shape[d] < 0 && !n->dead)
                return rlx_set_error(RLX_ERR_SHAPE, "node %d (%s): dim %d evaluates to %lld for this binding", id,
                                     rlx_op_name(n->op), d, (long long)v->shape[d]);
        if (n->op == RLX_OP_INPUT || n->op == RLX_OP_PARAM || n->op == RLX_OP_STATE || n->dead) continue;
        int r = p->lv.root[id];
        if (r == id && p->external[id]) {
            for (int i = 0; i < g->n_outputs; i++)
                if (p->out_dst[i] && p->lv.root[g->outputs[i]] == id) {
                    RLX_TRY(rlx_dev_wrap(p->dev, p->out_dst[i], p->out_dst_bytes[i], &p->out_buf[i]));
                    v->buf = p->out_buf[i];
                    break;
                }
            v->offset = 0;
        } else if (r == id) {
            v->buf = p->shared ? p->shared->buf : p->arena;
            v->offset = p->offsets[id];
        } else {
            v->buf = p->values[r].buf;
            v->offset = p->values[r].offset;
        }
    }
    return RLX_OK;
}

/* Each used state is bound, and its bytes for this binding fit its memory. */
static rlx_status check_states(const struct rlx_plan *p)
{
    for (int i = 0; i < p->n_states; i++) {
        const int id = p->states[i];
        if (!p->used[id]) continue;
        const struct rlx_node *n = &p->g->nodes[id];
        if (!p->state[i].buf) return rlx_set_error(RLX_ERR_INVALID, "state '%s' is not bound", n->name);
        size_t need;
        RLX_TRY(node_bytes(p, id, p->sym, &need));
        if (need > p->state[i].buf->size - p->state[i].offset)
            return rlx_set_error(RLX_ERR_RANGE, "state '%s' needs %zu bytes for this run; %zu are bound", n->name, need,
                                 p->state[i].buf->size - p->state[i].offset);
    }
    return RLX_OK;
}

/* Slices over a symbolic axis can only be checked once the symbols are bound: do it before any
 * memory is planned for their outputs. */
static rlx_status check_slices(const struct rlx_plan *p)
{
    for (int id = 0; id < p->g->n_nodes; id++) {
        const struct rlx_node *n = &p->g->nodes[id];
        if (n->dead || n->op != RLX_OP_SLICE) continue;
        int64_t shape[RLX_MAX_DIMS];
        rlx_plan_eval_shape(p, n->in[0], p->sym, shape);
        int64_t extent = shape[n->attrs.axis], start = n->attrs.start < 0 ? extent + n->attrs.start : n->attrs.start;
        if (start < 0 || n->attrs.len > extent - start)
            return rlx_set_error(RLX_ERR_RANGE, "node %d (slice): start %lld len %lld fall outside an axis of %lld", id,
                                 (long long)n->attrs.start, (long long)n->attrs.len, (long long)extent);
    }
    return RLX_OK;
}

/* Checks each bound output's size for this binding and marks the roots that are written straight
 * into their bound memory: intermediates (not inputs, params, states or their aliases), one bound
 * output per root, on a device that wraps host memory. Other bound outputs are copied after the
 * run. */
static rlx_status choose_external(struct rlx_plan *p)
{
    const struct rlx_graph *g = p->g;
    memset(p->external, 0, sizeof *p->external * (size_t)g->n_nodes);
    for (int i = 0; i < g->n_outputs; i++) {
        if (!p->out_dst[i]) continue;
        const int id = g->outputs[i], r = p->lv.root[id];
        size_t need;
        RLX_TRY(node_bytes(p, id, p->sym, &need));
        if (need != p->out_dst_bytes[i])
            return rlx_set_error(RLX_ERR_SHAPE, "output '%s' holds %zu bytes for this run, %zu bytes were bound",
                                 g->output_names[i], need, p->out_dst_bytes[i]);
        if (rlx_dev_can_wrap(p->dev) && p->lv.in_arena[r] && need) p->external[r] = true;
    }
    return RLX_OK;
}

static rlx_status run_checked(struct rlx_plan *p)
{
    for (int i = 0; i < p->n_params; i++)
        if (!p->param[i].buf && p->used[p->params[i]])
            return rlx_set_error(RLX_ERR_INVALID, "param '%s' is not set", p->g->nodes[p->params[i]].name);
    for (int i = 0; i < p->n_inputs; i++)
        if (!p->in_set[i] && p->used[p->inputs[i]])
            return rlx_set_error(RLX_ERR_INVALID, "input '%s' is not set", p->g->nodes[p->inputs[i]].name);
    RLX_TRY(infer_symbols(p));
    /* every symbol a live node uses is bound: checked per symbol (sym_used, from compile), then the
     * first node that uses an unbound one found for the message (per node and dimension on every
     * run took ~1 % of a Qwen3-0.6B decode step: ~900 nodes x 24 symbols) */
    bool unbound = false;
    for (int s = 0; s < RLX_MAX_SYMS; s++) unbound |= p->sym_used[s] && !p->sym_bound[s];
    for (int id = 0; unbound && id < p->g->n_nodes; id++) {
        const struct rlx_node *n = &p->g->nodes[id];
        for (int d = 0; !n->dead && d < n->ndim; d++)
            for (int s = 0; s < RLX_MAX_SYMS; s++)
                if (n->shape[d].coef[s] && !p->sym_bound[s])
                    return rlx_set_error(RLX_ERR_INVALID,
                                         "symbol %s is used by node %d but not bound by any input; "
                                         "bind it explicitly",
                                         p->g->sym_names[s], id);
    }
    RLX_TRY(check_states(p));
    RLX_TRY(check_slices(p));
    RLX_TRY(choose_external(p));
    RLX_TRY(ensure_memory(p));
    RLX_TRY(place_values(p));
    if (p->node_seconds) memset(p->node_seconds, 0, sizeof(double) * (size_t)p->g->n_nodes);
    struct rlx_device *d = p->dev;
    RLX_TRY(d->be->plan_run(d->ctx, p->be_state, p->g, p->values, p->node_seconds));
    /* bound outputs the kernels did not write in place */
    for (int i = 0; i < p->g->n_outputs; i++) {
        const int r = p->lv.root[p->g->outputs[i]];
        if (!p->out_dst[i] || (p->external[r] && p->values[r].buf == p->out_buf[i])) continue;
        const struct rlx_tensor *v = &p->values[p->g->outputs[i]];
        RLX_TRY(rlx_dev_download(d, v->buf, v->offset, p->out_dst[i], p->out_dst_bytes[i]));
    }
    return RLX_OK;
}

rlx_status rlx_plan_run(struct rlx_plan *p)
{
    for (int s = 0; s < RLX_MAX_SYMS; s++) p->sym_bound[s] = p->sym_explicit[s];
    p->ran = false;
    if (p->shared) p->shared->holder = NULL; /* this run overwrites the shared arena */
    rlx_status s = run_checked(p);
    /* the binding is for one run only: caller memory is not kept past the return */
    for (int i = 0; i < p->n_inputs; i++) p->in_set[i] = false;
    for (int i = 0; i < p->n_states; i++) p->state[i] = (struct rlx_binding){0};
    for (int i = 0; i < p->g->n_outputs; i++) p->out_dst[i] = NULL;
    for (int k = 0; k < RLX_MAX_SYMS; k++) p->sym_explicit[k] = false;
    p->ran = s == RLX_OK;
    if (p->shared && p->ran) p->shared->holder = p;
    return s;
}

void rlx_plan_share_arena(struct rlx_plan *p, struct rlx_shared_arena *a)
{
    rlx_dev_free(p->dev, p->arena);
    p->arena = NULL;
    p->arena_cap = 0;
    p->shared = a;
    p->ran = false;
    if (p->dev->be->plan_share_workspace) p->dev->be->plan_share_workspace(p->dev->ctx, p->be_state, &a->ws);
}

void rlx_shared_arena_release(struct rlx_device *dev, struct rlx_shared_arena *a)
{
    rlx_dev_free(dev, a->buf);
    free(a->ws.data);
    *a = (struct rlx_shared_arena){0};
}

/* A plan's results are readable: it ran, and no plan sharing its arena ran since. */
static rlx_status check_results(const struct rlx_plan *p)
{
    if (!p->ran) return rlx_set_error(RLX_ERR_STATE, "the plan has no results: run it first");
    if (p->shared && p->shared->holder != p)
        return rlx_set_error(RLX_ERR_STATE, "the plan's results are gone: a plan sharing its arena ran since");
    return RLX_OK;
}

rlx_status rlx_plan_output_shape(const struct rlx_plan *p, int i, enum rlx_dtype *dt, int *ndim,
                                 int64_t shape[RLX_MAX_DIMS])
{
    if (i < 0 || i >= p->g->n_outputs) return rlx_set_error(RLX_ERR_INVALID, "output index %d out of range", i);
    RLX_TRY(check_results(p));
    const struct rlx_tensor *v = &p->values[p->g->outputs[i]];
    *dt = v->dtype;
    *ndim = v->ndim;
    for (int d = 0; d < v->ndim; d++) shape[d] = v->shape[d];
    return RLX_OK;
}

rlx_status rlx_plan_read_output(const struct rlx_plan *p, int i, void *dst, size_t bytes)
{
    if (i < 0 || i >= p->g->n_outputs) return rlx_set_error(RLX_ERR_INVALID, "output index %d out of range", i);
    RLX_TRY(check_results(p));
    const struct rlx_tensor *v = &p->values[p->g->outputs[i]];
    size_t need;
    RLX_TRY(rlx_shape_bytes(v->dtype, v->ndim, v->shape, &need));
    if (bytes != need)
        return rlx_set_error(RLX_ERR_SHAPE, "output '%s' holds %zu bytes, asked for %zu", p->g->output_names[i], need,
                             bytes);
    return rlx_dev_download(p->dev, v->buf, v->offset, dst, bytes);
}

/* Symbol values at the compile caps, or false if a symbol in use has no cap. */
static bool cap_values(const struct rlx_plan *p, int64_t *vals)
{
    for (int s = 0; s < RLX_MAX_SYMS; s++) vals[s] = p->opts.sym_cap[s];
    for (int id = 0; id < p->g->n_nodes; id++)
        for (int d = 0; !p->g->nodes[id].dead && d < p->g->nodes[id].ndim; d++)
            for (int s = 0; s < RLX_MAX_SYMS; s++)
                if (p->g->nodes[id].shape[d].coef[s] && p->opts.sym_cap[s] <= 0) return false;
    return true;
}

rlx_status rlx_plan_check_caps(const struct rlx_plan *p)
{
    int64_t vals[RLX_MAX_SYMS];
    size_t arena, unshared;
    if (!cap_values(p, vals)) return RLX_OK;
    rlx_status s = plan_temp(p, vals, &arena, &unshared);
    return s == RLX_OK ? s : rlx_error_context(s, "at the compile caps");
}

size_t rlx_plan_planned_bytes(const struct rlx_plan *p)
{
    if (p->planned) return p->planned_bytes;
    int64_t vals[RLX_MAX_SYMS];
    size_t arena = 0, unshared = 0;
    if (!cap_values(p, vals) || plan_temp(p, vals, &arena, &unshared) != RLX_OK) return 0;
    return arena;
}

size_t rlx_plan_unshared_bytes(const struct rlx_plan *p)
{
    if (p->planned) return p->unshared_bytes;
    int64_t vals[RLX_MAX_SYMS];
    size_t arena = 0, unshared = 0;
    if (!cap_values(p, vals) || plan_temp(p, vals, &arena, &unshared) != RLX_OK) return 0;
    return unshared;
}

rlx_status rlx_plan_estimate_bytes(const struct rlx_plan *p, const int64_t sym_values[RLX_MAX_SYMS], size_t *out)
{
    size_t arena, unshared, total;
    RLX_TRY(plan_temp(p, sym_values, &arena, &unshared));
    total = arena;
    for (int i = 0; i < p->n_inputs; i++) {
        size_t b;
        RLX_TRY(node_bytes(p, p->inputs[i], sym_values, &b));
        if (!rlx_size_add(total, b, &total))
            return rlx_set_error(RLX_ERR_RANGE, "the estimate for these symbol values overflows");
    }
    *out = total;
    return RLX_OK;
}

rlx_status rlx_plan_set_profiling(struct rlx_plan *p, bool on)
{
    if (!on) {
        free(p->node_seconds);
        p->node_seconds = NULL;
        return RLX_OK;
    }
    if (!p->node_seconds) {
        p->node_seconds = rlx_calloc((size_t)p->g->n_nodes, sizeof *p->node_seconds);
        if (!p->node_seconds) return RLX_ERR_NOMEM;
    }
    return RLX_OK;
}

rlx_status rlx_plan_profile(const struct rlx_plan *p, double *seconds_by_op)
{
    if (!p->node_seconds) return rlx_set_error(RLX_ERR_STATE, "profiling is off for this plan");
    for (int op = 0; op < RLX_OP_COUNT; op++) seconds_by_op[op] = 0;
    for (int id = 0; id < p->g->n_nodes; id++) seconds_by_op[p->g->nodes[id].op] += p->node_seconds[id];
    return RLX_OK;
}
