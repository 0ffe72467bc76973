/*
 * weights.c - weight stores: named weights on a device, each placed once (used in place where the
 * device reads host memory, uploaded otherwise) and bound by reference into every plan that
 * names them, so N plans over one store cost one copy of the weights (none on the host). Lookups
 * are by exact name over a flat array: a model has a few hundred weights and binding happens per
 * compile, not per step. Never copies a weight it can use in place; never prints.
 *
 * A stacked weight (a mixture's experts, (E, N, K)) may come as E separate parts, as a Hugging Face
 * file holds them (one 2-D tensor per expert, not contiguous). Devices with memory of their own get
 * one buffer with each part uploaded at its place (no copy on the host); devices that read host
 * memory use every part in place and the weight is a table of E pointers (struct rlx_buffer.parts),
 * which only MATMUL_ID reads (binding refuses any other reader). So a Hugging Face MoE model loads
 * without a copy of its experts, as a GGUF file's already stacked experts do.
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
    struct rlx_buffer *buf;   /* owned by the store: a wrapper or an upload; with parts, the table */
    int guard;                /* registration of the host memory used in place, or -1 */
    int64_t n_parts;          /* > 0: a stacked weight used in place from separate parts: buf is a
                                   table (buf->parts pointers, not device memory) over part[] */
    struct rlx_buffer **part; /* (n_parts) the parts' wrappers */
    int *part_guard;          /* (n_parts) their registrations */
};

/* A file weights were read from, as it was at load. */
struct source {
    char *path;
    uint64_t dev, ino;
    int64_t size, mtime_ns;
};

struct rlx_weights {
    struct rlx_device *dev; /* borrowed */
    struct weight *w;       /* (n) */
    int n, cap;
    size_t bytes;
    struct source *src; /* (n_src) */
    int n_src, cap_src;
    atomic_int faulted; /* a read of a weight faulted (guard.c) */
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

/* Frees what one weight holds (its buffer, or its table and parts, and their guards). */
static void release(struct rlx_device *dev, struct weight *w)
{
    rlx_guard_remove(w->guard);
    if (!w->n_parts) {
        rlx_dev_free(dev, w->buf);
    } else {
        for (int64_t i = 0; i < w->n_parts; i++) {
            rlx_guard_remove(w->part_guard[i]);
            rlx_dev_free(dev, w->part[i]);
        }
        free(w->buf->data);
        free(w->buf);
        free(w->part);
        free(w->part_guard);
    }
    w->buf = NULL;
    w->part = NULL;
    w->part_guard = NULL;
    w->n_parts = 0;
}

void rlx_weights_free(struct rlx_weights *ws)
{
    if (!ws) return;
    for (int i = 0; i < ws->n; i++) release(ws->dev, &ws->w[i]);
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

/* Checks a tensor handed to the store (name, description, data, finite block scales); *bytes: its size. */
static rlx_status check_tensor(const char *name, const struct rlx_host_tensor *t, size_t *bytes)
{
    if (!t || (unsigned)t->dtype >= RLX_DTYPE_COUNT || t->ndim < 0 || t->ndim > RLX_MAX_DIMS)
        return rlx_set_error(RLX_ERR_INVALID, "weight '%s': bad tensor description", name);
    rlx_status s = rlx_shape_bytes(t->dtype, t->ndim, t->shape, bytes);
    if (s != RLX_OK) return rlx_error_context(s, "weight '%s'", name);
    if (!t->data && *bytes) return rlx_set_error(RLX_ERR_INVALID, "weight '%s': no data", name);
    const struct rlx_dtype_traits *tr = rlx_dtype_traits(t->dtype);
    const int64_t bad = rlx_blocks_nonfinite(t->dtype, t->data, (int64_t)(*bytes / tr->type_size) * tr->block_size);
    if (bad >= 0)
        return rlx_set_error(RLX_ERR_INVALID,
                             "weight '%s' (%s): block %lld has a NaN or infinite scale (a corrupt file)", name,
                             rlx_dtype_name(t->dtype), (long long)bad);
    return RLX_OK;
}

static rlx_status check_name(const char *name)
{
    if (!name || !name[0] || strlen(name) >= RLX_NAME_MAX)
        return rlx_set_error(RLX_ERR_INVALID, "weight name must be 1..%d characters", RLX_NAME_MAX - 1);
    return RLX_OK;
}

/* Records the placed weight `nw` under its name, replacing (and releasing) one of that name. On
 * failure releases nw. */
static rlx_status install(struct rlx_weights *ws, struct weight *nw)
{
    struct weight *w = find(ws, nw->name);
    if (w) {
        release(ws->dev, w);
        ws->bytes -= w->bytes;
    } else {
        rlx_status s = rlx_grow(&ws->w, &ws->cap, ws->n + 1);
        if (s != RLX_OK) {
            release(ws->dev, nw);
            return s;
        }
        w = &ws->w[ws->n++];
    }
    *w = *nw;
    ws->bytes += w->bytes;
    return RLX_OK;
}

rlx_status rlx_weights_set(struct rlx_weights *ws, const char *name, const struct rlx_host_tensor *t)
{
    RLX_TRY(check_name(name));
    size_t bytes;
    RLX_TRY(check_tensor(name, t, &bytes));
    /* guarded while it is read: for good when used in place, during the upload otherwise */
    int guard;
    RLX_TRY(rlx_guard_add(t->data, bytes, &ws->faulted, &guard));
    struct rlx_buffer *b = NULL;
    size_t cap = 0;
    rlx_status s = rlx_dev_place(ws->dev, t->data, bytes, &b, &cap);
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
    struct weight nw = {.guard = guard, .dtype = t->dtype, .ndim = t->ndim, .bytes = bytes, .buf = b};
    strcpy(nw.name, name);
    memcpy(nw.shape, t->shape, sizeof nw.shape);
    return install(ws, &nw);
}

/* A table over the n parts' wrappers (used in place): not device memory, so made here. */
static rlx_status make_table(struct weight *w, size_t bytes)
{
    struct rlx_buffer *t = rlx_calloc(1, sizeof *t);
    void **ptrs = rlx_calloc((size_t)w->n_parts, sizeof *ptrs);
    if (!t || !ptrs) {
        free(t);
        free(ptrs);
        return RLX_ERR_NOMEM;
    }
    for (int64_t i = 0; i < w->n_parts; i++) ptrs[i] = w->part[i]->data;
    *t = (struct rlx_buffer){.size = bytes, .wrapped = true, .data = ptrs, .parts = w->n_parts};
    w->buf = t;
    return RLX_OK;
}

rlx_status rlx_weights_set_parts(struct rlx_weights *ws, const char *name, int64_t n,
                                 const struct rlx_host_tensor *parts)
{
    RLX_TRY(check_name(name));
    if (n < 1 || n > INT32_MAX || !parts)
        return rlx_set_error(RLX_ERR_INVALID, "weight '%s': needs 1 or more parts", name);
    const struct rlx_host_tensor *p0 = &parts[0];
    if (p0->ndim < 1 || p0->ndim >= RLX_MAX_DIMS)
        return rlx_set_error(RLX_ERR_INVALID, "weight '%s': parts must have rank 1..%d", name, RLX_MAX_DIMS - 1);
    size_t part_bytes = 0, total;
    for (int64_t i = 0; i < n; i++) {
        size_t b;
        rlx_status s = check_tensor(name, &parts[i], &b);
        if (s != RLX_OK) return rlx_error_context(s, "part %lld", (long long)i);
        bool same = parts[i].dtype == p0->dtype && parts[i].ndim == p0->ndim;
        for (int d = 0; same && d < p0->ndim; d++) same = parts[i].shape[d] == p0->shape[d];
        if (!same)
            return rlx_set_error(RLX_ERR_SHAPE, "weight '%s': part %lld differs from part 0 in dtype or shape", name,
                                 (long long)i);
        part_bytes = b;
    }
    if (!rlx_size_mul(part_bytes, (size_t)n, &total))
        return rlx_set_error(RLX_ERR_RANGE, "weight '%s': %lld parts of %zu bytes overflow", name, (long long)n,
                             part_bytes);
    struct weight nw = {.guard = -1, .dtype = p0->dtype, .ndim = p0->ndim + 1, .bytes = total};
    strcpy(nw.name, name);
    nw.shape[0] = n;
    memcpy(nw.shape + 1, p0->shape, (size_t)p0->ndim * sizeof *p0->shape);
    rlx_status s = RLX_OK;
    if (!rlx_dev_can_wrap(ws->dev)) { /* one buffer, each part uploaded at its place: no copy on the host */
        s = rlx_dev_alloc(ws->dev, total, &nw.buf);
        for (int64_t i = 0; s == RLX_OK && i < n; i++) {
            int guard;
            s = rlx_guard_add(parts[i].data, part_bytes, &ws->faulted, &guard);
            if (s == RLX_OK) s = rlx_dev_upload(ws->dev, nw.buf, (size_t)i * part_bytes, parts[i].data, part_bytes);
            rlx_guard_remove(guard);
        }
    } else { /* each part used in place, read through a table */
        nw.part = rlx_calloc((size_t)n, sizeof *nw.part);
        nw.part_guard = rlx_calloc((size_t)n, sizeof *nw.part_guard);
        s = nw.part && nw.part_guard ? RLX_OK : RLX_ERR_NOMEM;
        for (int64_t i = 0; s == RLX_OK && i < n; i++) {
            nw.part_guard[i] = -1;
            s = rlx_guard_add(parts[i].data, part_bytes, &ws->faulted, &nw.part_guard[i]);
            if (s == RLX_OK) s = rlx_dev_wrap(ws->dev, parts[i].data, part_bytes, &nw.part[i]);
            nw.n_parts = i + 1;
        }
        if (s == RLX_OK) s = make_table(&nw, total);
    }
    if (s == RLX_OK) s = rlx_weights_check(ws);
    if (s != RLX_OK) {
        if (nw.buf && !nw.buf->parts) rlx_dev_free(ws->dev, nw.buf); /* the upload */
        for (int64_t i = 0; i < nw.n_parts; i++) {
            rlx_guard_remove(nw.part_guard[i]);
            rlx_dev_free(ws->dev, nw.part[i]);
        }
        if (nw.buf && nw.buf->parts) {
            free(nw.buf->data);
            free(nw.buf);
        }
        free(nw.part);
        free(nw.part_guard);
        return rlx_error_context(s, "weight '%s'", name);
    }
    return install(ws, &nw);
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
            return rlx_set_error(RLX_ERR_IO,
                                 "weights file %s was modified in place since it was loaded (size %lld -> "
                                 "%lld bytes): the model reads it in place, so load the model again",
                                 f->path, (long long)f->size, (long long)st.st_size);
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
    for (int i = 0; i < p->n_params; i++) { /* a table of parts is read by matmul_id alone */
        const struct weight *w = find(ws, p->g->nodes[p->params[i]].name);
        for (int u = p->params[i] + 1; w->n_parts && u < p->g->n_nodes; u++) {
            const struct rlx_node *un = &p->g->nodes[u];
            bool reads = false;
            for (int k = 0; !un->dead && k < un->n_in; k++) reads |= un->in[k] == p->params[i];
            if (reads && !(un->op == RLX_OP_MATMUL_ID && un->in[2] == p->params[i] && un->in[0] != p->params[i] &&
                           un->in[1] != p->params[i]))
                return rlx_set_error(RLX_ERR_UNSUPPORTED,
                                     "weight '%s' is held as %lld parts used in place, which only "
                                     "matmul_id reads; node %d (%s) reads it",
                                     w->name, (long long)w->n_parts, u, rlx_op_name(un->op));
        }
    }
    for (int i = 0; i < p->n_params; i++) {
        const struct weight *w = find(ws, p->g->nodes[p->params[i]].name);
        RLX_TRY(rlx_plan_bind_param_buffer(p, i, w->dtype, w->ndim, w->shape, w->buf));
    }
    return RLX_OK;
}
