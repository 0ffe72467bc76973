/*
 * weights.c - weight stores: named weights on a device, each placed once (used in place where the
 * device reads host memory, uploaded otherwise) and bound by reference into every plan that
 * names them, so N plans over one store cost one copy of the weights (none on the host). Lookups
 * are by exact name over a flat array: a model has a few hundred weights and binding happens per
 * compile, not per step. Never copies a weight it can use in place; never prints.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "runtime/plan.h"

struct weight {
    char name[RLX_NAME_MAX];
    enum rlx_dtype dtype;
    int ndim;
    int64_t shape[RLX_MAX_DIMS];
    size_t bytes;
    struct rlx_buffer *buf;     /* owned by the store: a wrapper or an upload */
};

struct rlx_weights {
    struct rlx_device *dev;     /* borrowed */
    struct weight *w;           /* (n) */
    int n, cap;
    size_t bytes;
};

rlx_status rlx_weights_create(struct rlx_device *dev, struct rlx_weights **out)
{
    if (!dev) return rlx_set_error(RLX_ERR_INVALID, "weights: no device");
    struct rlx_weights *ws = rlx_calloc(1, sizeof *ws);
    if (!ws) return RLX_ERR_NOMEM;
    ws->dev = dev;
    *out = ws;
    return RLX_OK;
}

void rlx_weights_free(struct rlx_weights *ws)
{
    if (!ws) return;
    for (int i = 0; i < ws->n; i++) rlx_dev_free(ws->dev, ws->w[i].buf);
    free(ws->w);
    free(ws);
}

static struct weight *find(const struct rlx_weights *ws, const char *name)
{
    for (int i = 0; name && i < ws->n; i++)
        if (strcmp(ws->w[i].name, name) == 0) return &ws->w[i];
    return NULL;
}

rlx_status rlx_weights_set(struct rlx_weights *ws, const char *name, const struct rlx_host_tensor *t)
{
    if (!name || !name[0] || strlen(name) >= RLX_NAME_MAX)
        return rlx_set_error(RLX_ERR_INVALID, "weight name must be 1..%d characters", RLX_NAME_MAX - 1);
    if (!t || (unsigned)t->dtype >= RLX_DTYPE_COUNT || t->ndim < 0 || t->ndim > RLX_MAX_DIMS)
        return rlx_set_error(RLX_ERR_INVALID, "weight '%s': bad tensor description", name);
    size_t bytes;
    rlx_status s = rlx_shape_bytes(t->dtype, t->ndim, t->shape, &bytes);
    if (s != RLX_OK) return rlx_error_context(s, "weight '%s'", name);
    if (!t->data && bytes) return rlx_set_error(RLX_ERR_INVALID, "weight '%s': no data", name);
    struct rlx_buffer *b = NULL;
    size_t cap = 0;
    s = rlx_dev_place(ws->dev, t->data, bytes, &b, &cap);
    if (s != RLX_OK) {
        rlx_dev_free(ws->dev, b);
        return rlx_error_context(s, "weight '%s'", name);
    }
    struct weight *w = find(ws, name);
    if (w) {
        rlx_dev_free(ws->dev, w->buf);
        ws->bytes -= w->bytes;
    } else {
        s = rlx_grow(&ws->w, &ws->cap, ws->n + 1);
        if (s != RLX_OK) {
            rlx_dev_free(ws->dev, b);
            return s;
        }
        w = &ws->w[ws->n++];
        strcpy(w->name, name);
    }
    w->dtype = t->dtype;
    w->ndim = t->ndim;
    memcpy(w->shape, t->shape, sizeof w->shape);
    w->bytes = bytes;
    w->buf = b;
    ws->bytes += bytes;
    return RLX_OK;
}

rlx_status rlx_weights_info(const struct rlx_weights *ws, const char *name, enum rlx_dtype *dt, int *ndim,
                            int64_t shape[RLX_MAX_DIMS])
{
    const struct weight *w = find(ws, name);
    if (!w) return rlx_set_error(RLX_ERR_INVALID, "weight '%s' is missing", name ? name : "(null)");
    if (dt) *dt = w->dtype;
    if (ndim) *ndim = w->ndim;
    if (shape) memcpy(shape, w->shape, sizeof w->shape);
    return RLX_OK;
}

int rlx_weights_count(const struct rlx_weights *ws) { return ws->n; }
size_t rlx_weights_bytes(const struct rlx_weights *ws) { return ws->bytes; }

rlx_status rlx_plan_bind_weights(struct rlx_plan *p, const struct rlx_weights *ws)
{
    if (ws->dev != rlx_plan_device(p))
        return rlx_set_error(RLX_ERR_INVALID, "the weights are on device '%s', the plan on '%s'", ws->dev->name,
                             rlx_plan_device(p)->name);
    /* check every param first, so a failure leaves the plan's bindings as they were */
    for (int i = 0; i < p->n_params; i++) {
        const struct rlx_node *n = &p->g->nodes[p->params[i]];
        const struct weight *w = find(ws, n->name);
        if (!w) return rlx_set_error(RLX_ERR_INVALID, "weight '%s' is missing", n->name);
        bool ok = w->dtype == n->dtype && w->ndim == n->ndim;
        for (int d = 0; ok && d < n->ndim; d++) ok = w->shape[d] == n->shape[d].c;
        if (!ok) {
            char want[160];
            rlx_shape_format(p->g, n->ndim, n->shape, want, sizeof want);
            return rlx_set_error(RLX_ERR_SHAPE, "weight '%s' does not fit its param (%s %s)", n->name,
                                 rlx_dtype_name(n->dtype), want);
        }
    }
    for (int i = 0; i < p->n_params; i++) {
        const struct weight *w = find(ws, p->g->nodes[p->params[i]].name);
        RLX_TRY(rlx_plan_bind_param_buffer(p, i, w->dtype, w->ndim, w->shape, w->buf));
    }
    return RLX_OK;
}
