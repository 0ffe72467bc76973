/*
 * weights.c - weight stores: named weights on a device, each placed once (used in place where the
 * device reads host memory, uploaded otherwise) and bound by reference into every plan that
 * names them, so N plans over one store cost one copy of the weights (none on the host). Lookups
 * are by exact name over a flat array: a model has a few hundred weights and binding happens per
 * compile, not per step. Never copies a weight it can use in place; never prints.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"
#include "runtime/guard.h"
#include "runtime/plan.h"

struct weight {
    char name[RLX_NAME_MAX];
    enum rlx_dtype dtype;
    int ndim;
    int64_t shape[RLX_MAX_DIMS];
    size_t bytes;
    struct rlx_buffer *buf;     /* owned by the store: a wrapper or an upload */
    int guard;                  /* registration of the host memory used in place, or -1 */
};

/* A file weights were read from, as it was at load. */
struct source {
    char *path;
    uint64_t dev, ino;
    int64_t size, mtime_ns;
};

struct rlx_weights {
    struct rlx_device *dev;     /* borrowed */
    struct weight *w;           /* (n) */
    int n, cap;
    size_t bytes;
    struct source *src;         /* (n_src) */
    int n_src, cap_src;
    atomic_int faulted;         /* a read of a weight faulted (guard.c) */
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
    for (int i = 0; i < ws->n; i++) {
        rlx_guard_remove(ws->w[i].guard);
        rlx_dev_free(ws->dev, ws->w[i].buf);
    }
    for (int i = 0; i < ws->n_src; i++) free(ws->src[i].path);
    free(ws->src);
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
    const struct rlx_dtype_traits *tr = rlx_dtype_traits(t->dtype);
    const int64_t bad = rlx_blocks_nonfinite(t->dtype, t->data, (int64_t)(bytes / tr->type_size) * tr->block_size);
    if (bad >= 0)
        return rlx_set_error(RLX_ERR_INVALID, "weight '%s' (%s): block %lld has a NaN or infinite scale (a corrupt file)",
                             name, rlx_dtype_name(t->dtype), (long long)bad);
    /* guarded while it is read: for good when used in place, during the upload otherwise */
    int guard;
    RLX_TRY(rlx_guard_add(t->data, bytes, &ws->faulted, &guard));
    struct rlx_buffer *b = NULL;
    size_t cap = 0;
    s = rlx_dev_place(ws->dev, t->data, bytes, &b, &cap);
    if (s == RLX_OK && !b->wrapped) {
        rlx_guard_remove(guard);
        guard = -1;
    }
    if (s == RLX_OK) s = rlx_weights_check(ws);
    if (s != RLX_OK) {
        rlx_guard_remove(guard);
        rlx_dev_free(ws->dev, b);
        return rlx_error_context(s, "weight '%s'", name);
    }
    struct weight *w = find(ws, name);
    if (w) {
        rlx_guard_remove(w->guard);
        rlx_dev_free(ws->dev, w->buf);
        ws->bytes -= w->bytes;
    } else {
        s = rlx_grow(&ws->w, &ws->cap, ws->n + 1);
        if (s != RLX_OK) {
            rlx_guard_remove(guard);
            rlx_dev_free(ws->dev, b);
            return s;
        }
        w = &ws->w[ws->n++];
        strcpy(w->name, name);
    }
    w->guard = guard;
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

rlx_status rlx_weights_add_source(struct rlx_weights *ws, const char *path, uint64_t dev, uint64_t ino, int64_t size,
                                  int64_t mtime_ns)
{
    if (!path || !path[0]) return rlx_set_error(RLX_ERR_INVALID, "weights source: no path");
    RLX_TRY(rlx_grow(&ws->src, &ws->cap_src, ws->n_src + 1));
    char *copy = rlx_calloc(strlen(path) + 1, 1);
    if (!copy) return RLX_ERR_NOMEM;
    strcpy(copy, path);
    ws->src[ws->n_src++] = (struct source){copy, dev, ino, size, mtime_ns};
    return RLX_OK;
}

rlx_status rlx_weights_check(const struct rlx_weights *ws)
{
    if (atomic_load(&ws->faulted))
        return rlx_set_error(RLX_ERR_IO, "a weights file was truncated while the model used it (a read of its "
                             "mapped pages faulted; they now read as zeros): load the model again");
    for (int i = 0; i < ws->n_src; i++) {
        const struct source *f = &ws->src[i];
        struct stat st;
        if (stat(f->path, &st) != 0) {
            if (errno == ENOENT) continue; /* removed: the mapping keeps the file's data */
            return rlx_set_error(RLX_ERR_IO, "weights file %s: cannot stat it (%s)", f->path, strerror(errno));
        }
        if ((uint64_t)st.st_dev != f->dev || (uint64_t)st.st_ino != f->ino) continue; /* replaced: ours intact */
        const int64_t mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        if ((int64_t)st.st_size != f->size || mtime != f->mtime_ns)
            return rlx_set_error(RLX_ERR_IO, "weights file %s was modified in place since it was loaded (size %lld -> "
                                 "%lld bytes): the model reads it in place, so load the model again", f->path,
                                 (long long)f->size, (long long)st.st_size);
    }
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
