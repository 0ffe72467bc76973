/*
 * seq_type.c - _C.Sequence: one sequence (struct rlx_seq: a token history and a KV cache of its
 * own) over a _C.Model, with NumPy logits and Python callbacks. The Python classes rlx.Sequence and
 * rlx.Generator wrap it with the documented API; this type offers the primitive steps: prefill,
 * append, logits (naive or cached), sample, step, generate, forward, fork, save / load.
 *
 * Ownership: a sequence holds its _C.Model (so the model, its weights and its device outlive it).
 * kv_cache() returns copies of the cached rows, so no view outlives or misreads the cache.
 *
 * Threads: the GIL is released around every forward pass and sampling. The core sequence is not
 * safe from two threads at once, so every use takes the sequence's own lock (waited for with the
 * GIL released); distinct sequences of one model run on any threads (their plan runs take turns
 * inside the model). Python callbacks (on_token, adjust) run with the GIL held and the lock held
 * by this thread; a callback that re-enters the same sequence gets an exception, not a deadlock.
 * Ctrl-C stops a forward pass before its next kernel (signals.c) and raises KeyboardInterrupt:
 * the history and the cache are as before that step, the tokens generate() made before it kept.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <string.h>

#include "rlx/model.h"

struct seq_object {
    PyObject_HEAD struct rlx_seq *seq; /* owned */
    struct rlx_py_lock lock;
    PyObject *model; /* _C.Model */
};

static int seq_acquire(struct seq_object *self) { return rlx_py_lock_acquire(&self->lock, "sequence"); }
static void seq_release(struct seq_object *self) { rlx_py_lock_release(&self->lock); }

static const struct rlx_model_config *cfg_of(struct seq_object *self)
{
    return rlx_model_config(rlx_seq_model(self->seq));
}

/* ---- construction ------------------------------------------------------------------------- */

static void seq_dealloc(struct seq_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    rlx_seq_free(self->seq); /* before its model */
    Py_XDECREF(self->model);
    rlx_py_lock_fini(&self->lock);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* A new object around seq (owned from here on), holding model. */
static PyObject *wrap(PyTypeObject *type, struct rlx_seq *seq, PyObject *model)
{
    struct seq_object *self = (struct seq_object *)type->tp_alloc(type, 0);
    if (self == NULL) {
        rlx_seq_free(seq);
        return NULL;
    }
    self->seq = seq;
    self->model = Py_NewRef(model);
    if (rlx_py_lock_init(&self->lock) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *seq_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"model", "kv_dtype", NULL};
    PyObject *model;
    const char *kv = "f16";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|s:Sequence", kwlist, &model, &kv)) return NULL;
    struct rlx_py_state *st = rlx_py_state_of_type(type);
    if (st == NULL) return NULL;
    if (!PyObject_TypeCheck(model, st->model_type)) {
        PyErr_Format(PyExc_TypeError, "Sequence takes an rlx._C.Model, got %.200s", Py_TYPE(model)->tp_name);
        return NULL;
    }
    enum rlx_dtype dt;
    if (rlx_py_raise(rlx_dtype_parse(kv, &dt))) return NULL;
    struct rlx_seq *seq = NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_seq_create(rlx_py_model_get(model), dt, &seq);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) return NULL;
    return wrap(type, seq, model);
}

static PyObject *seq_fork(struct seq_object *self, PyObject *unused)
{
    (void)unused;
    if (seq_acquire(self) < 0) return NULL;
    struct rlx_seq *copy = NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_seq_fork(self->seq, &copy);
    Py_END_ALLOW_THREADS seq_release(self);
    if (rlx_py_raise(s)) return NULL;
    return wrap(Py_TYPE(self), copy, self->model);
}

/* ---- history ------------------------------------------------------------------------------ */

static PyObject *seq_prefill(struct seq_object *self, PyObject *ids_obj)
{
    int64_t n;
    int32_t *ids = rlx_py_ids_from(ids_obj, &n);
    if (ids == NULL) return NULL;
    if (seq_acquire(self) < 0) {
        PyMem_Free(ids);
        return NULL;
    }
    rlx_status s = rlx_seq_prefill(self->seq, ids, n);
    seq_release(self);
    PyMem_Free(ids);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *seq_reset(struct seq_object *self, PyObject *unused)
{
    (void)unused;
    if (seq_acquire(self) < 0) return NULL;
    rlx_seq_reset(self->seq);
    seq_release(self);
    Py_RETURN_NONE;
}

static PyObject *seq_truncate(struct seq_object *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if ((n == -1 && PyErr_Occurred()) || seq_acquire(self) < 0) return NULL;
    rlx_status s = rlx_seq_truncate(self->seq, n);
    seq_release(self);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

/* append(token) or append([tokens]): all or none. */
static PyObject *seq_append(struct seq_object *self, PyObject *arg)
{
    int64_t n = 1;
    int32_t one, *ids = &one;
    if (PyLong_Check(arg) ? rlx_py_token_from(arg, &one) < 0 : (ids = rlx_py_ids_from(arg, &n)) == NULL) return NULL;
    PyObject *out = NULL;
    if (seq_acquire(self) == 0) {
        rlx_status s = rlx_seq_append(self->seq, ids, n);
        seq_release(self);
        if (!rlx_py_raise(s)) out = Py_NewRef(Py_None);
    }
    if (ids != &one) PyMem_Free(ids);
    return out;
}

/* ---- forward and sampling ----------------------------------------------------------------- */

/* Runs the forward pass with the GIL released, Ctrl-C stopping it (the lock must be held); on
 * RLX_ERR_INTERRUPTED the exception (KeyboardInterrupt) is already set. */
static rlx_status forward(struct seq_object *self, int cached, const float **logits)
{
    rlx_status s;
    rlx_py_sigint_begin();
    Py_BEGIN_ALLOW_THREADS s =
        cached ? rlx_seq_logits_cached(self->seq, logits) : rlx_seq_logits_naive(self->seq, logits);
    Py_END_ALLOW_THREADS rlx_py_sigint_end(s);
    return s;
}

/* rlx_py_raise, except for an interrupt, whose exception forward() has set. */
static int raise_step(rlx_status s) { return s == RLX_ERR_INTERRUPTED ? -1 : rlx_py_raise(s); }

static PyObject *logits_array(struct seq_object *self, const float *logits)
{
    npy_intp dims[1] = {(npy_intp)cfg_of(self)->vocab_size};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (arr) memcpy(PyArray_DATA((PyArrayObject *)arr), logits, sizeof(float) * (size_t)dims[0]);
    return arr;
}

static PyObject *seq_logits(struct seq_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"cached", NULL};
    int cached = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:logits", kwlist, &cached) || seq_acquire(self) < 0) return NULL;
    const float *logits;
    rlx_status s = forward(self, cached, &logits);
    PyObject *out = s == RLX_OK ? logits_array(self, logits) : NULL;
    seq_release(self);
    if (raise_step(s)) return NULL;
    return out;
}

/* One step with the lock held: logits, optional adjust(logits array) in place, sample at index,
 * append. Returns the token or -1 with an exception set. */
static long long step_locked(struct seq_object *self, const struct rlx_sample_opts *o, int cached, uint64_t index,
                             PyObject *adjust)
{
    const float *logits;
    int32_t tok = -1;
    rlx_status s = forward(self, cached, &logits);
    if (raise_step(s)) return -1;
    if (adjust != Py_None) {
        PyObject *arr = logits_array(self, logits);
        if (arr == NULL) return -1;
        PyObject *r = PyObject_CallOneArg(adjust, arr);
        if (r == NULL) {
            Py_DECREF(arr);
            return -1;
        }
        Py_DECREF(r);
        const float *row = PyArray_DATA((PyArrayObject *)arr);
        Py_BEGIN_ALLOW_THREADS s = rlx_seq_sample(self->seq, row, o, index, &tok);
        Py_END_ALLOW_THREADS Py_DECREF(arr);
    } else {
        Py_BEGIN_ALLOW_THREADS s = rlx_seq_sample(self->seq, logits, o, index, &tok);
        Py_END_ALLOW_THREADS
    }
    if (rlx_py_raise(s) || rlx_py_raise(rlx_seq_append(self->seq, &tok, 1))) return -1;
    return tok;
}

static PyObject *seq_step(struct seq_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"opts", "cached", "sample_index", "adjust", NULL};
    PyObject *opts_obj = Py_None, *index_obj = Py_None, *adjust = Py_None;
    int cached = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OpOO:step", kwlist, &opts_obj, &cached, &index_obj, &adjust))
        return NULL;
    if (adjust != Py_None && !PyCallable_Check(adjust)) {
        PyErr_SetString(PyExc_TypeError, "adjust must be callable");
        return NULL;
    }
    struct rlx_sample_opts o;
    if (rlx_py_sample_opts_from(opts_obj, &o) < 0) return NULL;
    unsigned long long index = 0;
    if (index_obj != Py_None) {
        index = PyLong_AsUnsignedLongLong(index_obj);
        if (index == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    if (seq_acquire(self) < 0) return NULL;
    if (index_obj == Py_None) index = (unsigned long long)rlx_seq_len(self->seq);
    long long tok = step_locked(self, &o, cached, index, adjust);
    seq_release(self);
    return tok < 0 ? NULL : PyLong_FromLongLong(tok);
}

static PyObject *seq_generate(struct seq_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"n", "opts", "cached", "on_token", "stop_ids", NULL};
    Py_ssize_t n;
    PyObject *opts_obj = Py_None, *on_token = Py_None, *stop_obj = Py_None;
    int cached = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|OpOO:generate", kwlist, &n, &opts_obj, &cached, &on_token,
                                     &stop_obj))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    if (on_token != Py_None && !PyCallable_Check(on_token)) {
        PyErr_SetString(PyExc_TypeError, "on_token must be callable");
        return NULL;
    }
    struct rlx_sample_opts o;
    if (rlx_py_sample_opts_from(opts_obj, &o) < 0) return NULL;
    PyObject *stop = stop_obj == Py_None ? PyFrozenSet_New(NULL) : PyFrozenSet_New(stop_obj);
    if (stop == NULL) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL || seq_acquire(self) < 0) {
        Py_XDECREF(out);
        Py_DECREF(stop);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long tok = step_locked(self, &o, cached, (uint64_t)rlx_seq_len(self->seq), Py_None);
        PyObject *t = tok < 0 ? NULL : PyLong_FromLongLong(tok);
        if (t == NULL || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            goto error;
        }
        int is_stop = PySet_Contains(stop, t);
        if (on_token != Py_None) {
            PyObject *r = PyObject_CallOneArg(on_token, t);
            if (r == NULL) {
                Py_DECREF(t);
                goto error;
            }
            Py_DECREF(r);
        }
        Py_DECREF(t);
        if (is_stop < 0 || PyErr_CheckSignals() < 0) goto error; /* Ctrl-C: the history keeps the tokens */
        if (is_stop) break;
    }
    seq_release(self);
    Py_DECREF(stop);
    return out;
error:
    seq_release(self);
    Py_DECREF(stop);
    Py_DECREF(out);
    return NULL;
}

static PyObject *seq_sample(struct seq_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"logits", "opts", "sample_index", "history", NULL};
    PyObject *logits_obj, *opts_obj = Py_None, *history_obj = Py_None;
    unsigned long long index = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OKO:sample", kwlist, &logits_obj, &opts_obj, &index,
                                     &history_obj))
        return NULL;
    struct rlx_sample_opts o;
    if (rlx_py_sample_opts_from(opts_obj, &o) < 0) return NULL;
    int32_t *history = NULL;
    int64_t n_hist = 0;
    if (history_obj != Py_None && (history = rlx_py_ids_from(history_obj, &n_hist)) == NULL) return NULL;
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROM_OTF(logits_obj, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
    if (arr == NULL) {
        PyMem_Free(history);
        return NULL;
    }
    PyObject *out = NULL;
    const int64_t V = cfg_of(self)->vocab_size;
    if (PyArray_NDIM(arr) != 1 || PyArray_DIM(arr, 0) != V) {
        PyErr_Format(PyExc_ValueError, "logits must have shape (%lld,)", (long long)V);
        goto error;
    }
    if (seq_acquire(self) < 0) goto error;
    int32_t tok;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS if (history_obj == Py_None) s =
        rlx_seq_sample(self->seq, PyArray_DATA(arr), &o, index, &tok);
    else s = rlx_seq_sample_with(self->seq, PyArray_DATA(arr), &o, index, history, n_hist, &tok);
    Py_END_ALLOW_THREADS seq_release(self);
    if (!rlx_py_raise(s)) out = PyLong_FromLong(tok);
error:
    Py_DECREF(arr);
    PyMem_Free(history);
    return out;
}

/* forward(hidden=None, cached=True): runs the block; see rlx_seq_forward. */
static PyObject *seq_forward(struct seq_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"hidden", "cached", NULL};
    PyObject *hidden_obj = Py_None;
    int cached = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Op:forward", kwlist, &hidden_obj, &cached)) return NULL;
    const struct rlx_model_config *c = cfg_of(self);
    PyArrayObject *hidden = NULL;
    PyObject *out = NULL;
    int64_t n = 0;
    if (hidden_obj != Py_None) {
        hidden = (PyArrayObject *)PyArray_FROM_OTF(hidden_obj, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
        if (hidden == NULL) return NULL;
        if (PyArray_NDIM(hidden) != 2 || PyArray_DIM(hidden, 1) != c->hidden_size) {
            PyErr_Format(PyExc_ValueError, "hidden must have shape (n, %lld)", (long long)c->hidden_size);
            goto error;
        }
        n = (int64_t)PyArray_DIM(hidden, 0);
    }
    if (seq_acquire(self) < 0) goto error;
    const float *y;
    int64_t rows;
    rlx_status s;
    const float *h = hidden ? PyArray_DATA(hidden) : NULL;
    rlx_py_sigint_begin();
    Py_BEGIN_ALLOW_THREADS s = rlx_seq_forward(self->seq, h, n, cached != 0, &y, &rows);
    Py_END_ALLOW_THREADS rlx_py_sigint_end(s);
    if (s == RLX_OK) { /* copy out while the lock keeps the sequence's buffer stable */
        int64_t begin, end;
        unsigned ends;
        rlx_model_block(rlx_seq_model(self->seq), &begin, &end, &ends);
        if (ends & RLX_BLOCK_HEAD) {
            out = logits_array(self, y);
        } else {
            npy_intp dims[2] = {(npy_intp)rows, (npy_intp)c->hidden_size};
            out = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
            if (out) memcpy(PyArray_DATA((PyArrayObject *)out), y, sizeof(float) * (size_t)(rows * c->hidden_size));
        }
    }
    seq_release(self);
    if (raise_step(s)) Py_CLEAR(out);
error:
    Py_XDECREF(hidden);
    return out;
}

/* ---- inspection, state -------------------------------------------------------------------- */

static PyObject *seq_get_tokens(struct seq_object *self, void *closure)
{
    (void)closure;
    if (seq_acquire(self) < 0) return NULL;
    int64_t n = rlx_seq_len(self->seq);
    const int32_t *t = rlx_seq_tokens(self->seq);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromLong(t[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    seq_release(self);
    return out;
}

static PyObject *seq_get_n_tokens(struct seq_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(rlx_seq_len(self->seq));
}

static PyObject *seq_get_kv_len(struct seq_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(rlx_kv_cache_len(rlx_seq_kv(self->seq)));
}

static PyObject *seq_get_kv_dtype(struct seq_object *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(rlx_dtype_name(rlx_kv_cache_dtype(rlx_seq_kv(self->seq))));
}

static PyObject *seq_get_kv_bytes(struct seq_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(rlx_kv_cache_bytes(rlx_seq_kv(self->seq)));
}

static PyObject *seq_get_model(struct seq_object *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->model);
}

/* kv_cache(layer) -> (k, v): copies (kv_len, kv_heads, head_dim) of the cached rows in the cache's
 * dtype (bf16 as uint16 bits). */
static PyObject *seq_kv_cache(struct seq_object *self, PyObject *layer_obj)
{
    long long layer = PyLong_AsLongLong(layer_obj);
    if ((layer == -1 && PyErr_Occurred()) || seq_acquire(self) < 0) return NULL;
    const struct rlx_kv_cache *kv = rlx_seq_kv(self->seq);
    const struct rlx_model_config *c = cfg_of(self);
    PyObject *out[2] = {NULL, NULL};
    if (layer < 0 || layer >= rlx_kv_cache_layers(kv)) {
        PyErr_Format(PyExc_IndexError, "layer %lld outside [0, %lld)", layer, (long long)rlx_kv_cache_layers(kv));
        goto done;
    }
    const int64_t len = rlx_kv_cache_len(kv);
    npy_intp dims[3] = {(npy_intp)len, (npy_intp)c->n_kv_heads, (npy_intp)c->head_dim};
    for (int which = 0; which < 2; which++) {
        out[which] = PyArray_SimpleNew(3, dims, rlx_py_dtype_to_npy(rlx_kv_cache_dtype(kv)));
        if (out[which] == NULL) goto done;
        rlx_status s;
        PyArrayObject *a = (PyArrayObject *)out[which];
        Py_BEGIN_ALLOW_THREADS s =
            rlx_kv_cache_read(kv, layer, which, 0, len, PyArray_DATA(a), (size_t)PyArray_NBYTES(a));
        Py_END_ALLOW_THREADS if (rlx_py_raise(s)) goto done;
    }
    seq_release(self);
    return Py_BuildValue("(NN)", out[0], out[1]);
done:
    seq_release(self);
    Py_XDECREF(out[0]);
    Py_XDECREF(out[1]);
    return NULL;
}

static PyObject *seq_save_state(struct seq_object *self, PyObject *unused)
{
    (void)unused;
    if (seq_acquire(self) < 0) return NULL;
    size_t n = 0;
    PyObject *out = NULL;
    rlx_status s = rlx_seq_state_size(self->seq, &n);
    if (s == RLX_OK && (out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n)) != NULL) {
        char *buf = PyBytes_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS s = rlx_seq_save(self->seq, buf, n);
        Py_END_ALLOW_THREADS
    }
    seq_release(self);
    if (rlx_py_raise(s)) Py_CLEAR(out);
    return out;
}

static PyObject *seq_load_state(struct seq_object *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (seq_acquire(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_seq_load(self->seq, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS seq_release(self);
    PyBuffer_Release(&view);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *seq_last_profile(struct seq_object *self, PyObject *unused)
{
    (void)unused;
    double sec[RLX_OP_COUNT];
    if (seq_acquire(self) < 0) return NULL;
    rlx_status s = rlx_seq_last_profile(self->seq, sec);
    seq_release(self);
    if (rlx_py_raise(s)) return NULL;
    PyObject *out = PyDict_New();
    for (int op = 0; out && op < RLX_OP_COUNT; op++) {
        if (sec[op] <= 0) continue;
        PyObject *v = PyFloat_FromDouble(sec[op]);
        if (v == NULL || PyDict_SetItemString(out, rlx_op_name((enum rlx_op)op), v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}

/* ---- batches ------------------------------------------------------------------------------ */

/* The sequences of a batch call, locked (in address order, so two batches over shared sequences
 * cannot deadlock). */
struct batch {
    int n;
    struct seq_object *obj[RLX_MAX_BATCH];
    struct rlx_seq *seq[RLX_MAX_BATCH];
    const float *logits[RLX_MAX_BATCH];
    struct rlx_sample_opts opts[RLX_MAX_BATCH];
};

static void batch_release(struct batch *b)
{
    for (int i = 0; i < b->n; i++) seq_release(b->obj[i]);
}

static int by_address(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t) * (struct seq_object *const *)a, y = (uintptr_t) * (struct seq_object *const *)b;
    return x < y ? -1 : x > y;
}

/* Fills b from a list of _C.Sequence (distinct, of one model) and locks them; -1 with an exception. */
static int batch_acquire(PyTypeObject *cls, PyObject *seqs, struct batch *b)
{
    PyObject *fast = PySequence_Fast(seqs, "seqs must be a list of sequences");
    if (fast == NULL) return -1;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n < 1 || n > RLX_MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "a batch holds 1..%d sequences, got %zd", RLX_MAX_BATCH, n);
        Py_DECREF(fast);
        return -1;
    }
    b->n = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyObject_TypeCheck(o, cls)) {
            PyErr_Format(PyExc_TypeError, "seqs[%zd] is %s, not a sequence", i, Py_TYPE(o)->tp_name);
            Py_DECREF(fast);
            return -1;
        }
        for (Py_ssize_t j = 0; j < i; j++)
            if (b->obj[j] == (struct seq_object *)o) {
                PyErr_Format(PyExc_ValueError, "seqs[%zd] and seqs[%zd] are the same sequence", j, i);
                Py_DECREF(fast);
                return -1;
            }
        b->obj[i] = (struct seq_object *)o;
    }
    Py_DECREF(fast);
    struct seq_object *sorted[RLX_MAX_BATCH];
    memcpy(sorted, b->obj, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, by_address);
    for (int i = 0; i < n; i++) {
        if (seq_acquire(sorted[i]) < 0) {
            while (i--) seq_release(sorted[i]);
            return -1;
        }
    }
    b->n = (int)n;
    for (int i = 0; i < b->n; i++) b->seq[i] = b->obj[i]->seq;
    return 0;
}

static rlx_status batch_forward(struct batch *b, long long chunk)
{
    rlx_status s;
    rlx_py_sigint_begin();
    Py_BEGIN_ALLOW_THREADS s = rlx_seq_batch_logits(b->seq, b->n, (int64_t)chunk, b->logits);
    Py_END_ALLOW_THREADS rlx_py_sigint_end(s);
    return s;
}

/* The answer of a batch call, then the locks released: per sequence its token (tok given) or a
 * copy of its logits, None where a chunk left positions uncached; NULL with the exception of s. */
static PyObject *batch_result(struct batch *b, rlx_status s, const int32_t *tok)
{
    PyObject *out = s == RLX_OK ? PyList_New(b->n) : NULL;
    for (int i = 0; out && i < b->n; i++) {
        PyObject *item = !b->logits[i] ? Py_NewRef(Py_None)
                         : tok         ? PyLong_FromLong(tok[i])
                                       : logits_array(b->obj[i], b->logits[i]);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, item);
    }
    batch_release(b);
    if (raise_step(s)) return NULL;
    return out;
}

static PyObject *seq_batch_logits(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"seqs", "chunk", NULL};
    PyObject *seqs;
    long long chunk = 0;
    struct batch b;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|L:batch_logits", kwlist, &seqs, &chunk) ||
        batch_acquire((PyTypeObject *)cls, seqs, &b) < 0)
        return NULL;
    rlx_status s = batch_forward(&b, chunk);
    return batch_result(&b, s, NULL);
}

static PyObject *seq_batch_step(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"seqs", "opts", "chunk", NULL};
    PyObject *seqs, *opts_obj = Py_None;
    long long chunk = 0;
    struct batch b;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OL:batch_step", kwlist, &seqs, &opts_obj, &chunk)) return NULL;
    const bool per_seq = PyList_Check(opts_obj) || PyTuple_Check(opts_obj);
    if (per_seq) {
        Py_ssize_t n_seqs = PyObject_Length(seqs);
        if (n_seqs < 0) return NULL;
        if (PySequence_Length(opts_obj) != n_seqs) {
            PyErr_Format(PyExc_ValueError, "opts: %zd options for %zd sequences", PySequence_Length(opts_obj), n_seqs);
            return NULL;
        }
    }
    if (batch_acquire((PyTypeObject *)cls, seqs, &b) < 0) return NULL;
    for (int i = 0; i < b.n; i++) {
        PyObject *o = per_seq ? PySequence_GetItem(opts_obj, i) : Py_NewRef(opts_obj);
        int bad = o == NULL || rlx_py_sample_opts_from(o, &b.opts[i]) < 0;
        Py_XDECREF(o);
        if (bad) {
            batch_release(&b);
            return NULL;
        }
    }
    rlx_status s = batch_forward(&b, chunk);
    int32_t tok[RLX_MAX_BATCH];
    /* each sequence whose logits are ready samples (its draw index: the new token's position); then,
     * when every token has room in its context, all are appended (a failure appends none) */
    for (int i = 0; s == RLX_OK && i < b.n; i++) {
        if (!b.logits[i]) continue;
        Py_BEGIN_ALLOW_THREADS s =
            rlx_seq_sample(b.seq[i], b.logits[i], &b.opts[i], (uint64_t)rlx_seq_len(b.seq[i]), &tok[i]);
        Py_END_ALLOW_THREADS
    }
    int full = -1;
    for (int i = 0; s == RLX_OK && full < 0 && i < b.n; i++)
        if (b.logits[i] && rlx_seq_len(b.seq[i]) >= cfg_of(b.obj[i])->max_position_embeddings) full = i;
    for (int i = 0; s == RLX_OK && full < 0 && i < b.n; i++)
        if (b.logits[i]) s = rlx_seq_append(b.seq[i], &tok[i], 1);
    if (full >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "sequence %d of the batch: the context is full (%lld tokens, max_position_embeddings %lld): no "
                     "token was appended to any sequence",
                     full, (long long)rlx_seq_len(b.seq[full]),
                     (long long)cfg_of(b.obj[full])->max_position_embeddings);
        batch_release(&b);
        return NULL;
    }
    return batch_result(&b, s, tok);
}

static PyMethodDef seq_methods[] = {
    {"batch_logits", (PyCFunction)(void (*)(void))seq_batch_logits, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "batch_logits(seqs, chunk=0) -> list[ndarray | None]\n\nRuns the uncached positions of up to 16 sequences of "
     "one model in one plan (at most chunk each when chunk > 0); each sequence's next-token logits, or None when a "
     "chunk left positions uncached."},
    {"batch_step", (PyCFunction)(void (*)(void))seq_batch_step, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "batch_step(seqs, opts=None, chunk=0) -> list[int | None]\n\nbatch_logits, then each sequence whose logits "
     "are ready samples (opts: one for all or one per sequence; draw index: the new token's position) and appends "
     "its token; None for a sequence still entering in chunks."},
    {"prefill", (PyCFunction)seq_prefill, METH_O, "prefill(ids)\n\nReplaces the history with ids; empties the cache."},
    {"reset", (PyCFunction)seq_reset, METH_NOARGS, "reset()\n\nForgets the history and empties the cache."},
    {"truncate", (PyCFunction)seq_truncate, METH_O,
     "truncate(n)\n\nKeeps the first n positions of the history and the cache."},
    {"append", (PyCFunction)seq_append, METH_O,
     "append(token or ids)\n\nAppends to the history (all or none); the next cached forward runs only the new "
     "positions."},
    {"logits", (PyCFunction)(void (*)(void))seq_logits, METH_VARARGS | METH_KEYWORDS,
     "logits(cached=True) -> ndarray (vocab,)\n\nNext-token logits after the history (KV-cached or recomputed)."},
    {"step", (PyCFunction)(void (*)(void))seq_step, METH_VARARGS | METH_KEYWORDS,
     "step(opts=None, cached=True, sample_index=None, adjust=None) -> int\n\nLogits, adjust(logits) in place if "
     "given, sample (draw index defaults to the new token's position), append."},
    {"generate", (PyCFunction)(void (*)(void))seq_generate, METH_VARARGS | METH_KEYWORDS,
     "generate(n, opts=None, cached=True, on_token=None, stop_ids=None) -> list[int]\n\nUp to n steps; stops after "
     "a token in stop_ids; on_token(token) after each; Ctrl-C raises KeyboardInterrupt after the current token."},
    {"forward", (PyCFunction)(void (*)(void))seq_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(hidden=None, cached=True) -> ndarray\n\nRuns the block: over the history (embedding blocks) or over "
     "hidden (n, H) rows; returns logits (vocab,) for a block with the head, else hidden (rows, H)."},
    {"sample", (PyCFunction)(void (*)(void))seq_sample, METH_VARARGS | METH_KEYWORDS,
     "sample(logits, opts=None, sample_index=0, history=None) -> int\n\nDraws from a logits row; history (ids) "
     "is the repetition context (default: the sequence's own)."},
    {"kv_cache", (PyCFunction)seq_kv_cache, METH_O,
     "kv_cache(layer) -> (k, v)\n\nCopies (kv_len, kv_heads, head_dim) of the layer's cached rows, in the cache "
     "dtype (bf16 as uint16 bits)."},
    {"fork", (PyCFunction)seq_fork, METH_NOARGS, "fork() -> Sequence\n\nA new sequence with this history and cache."},
    {"save_state", (PyCFunction)seq_save_state, METH_NOARGS,
     "save_state() -> bytes\n\nThe history and the cached rows, with a header naming the model's shape."},
    {"load_state", (PyCFunction)seq_load_state, METH_O,
     "load_state(data)\n\nRestores what save_state returned (checked against this sequence's model and KV dtype)."},
    {"last_profile", (PyCFunction)seq_last_profile, METH_NOARGS,
     "last_profile() -> dict[str, float]\n\nSeconds per op of the last forward pass (the model must profile)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef seq_getset[] = {
    {"tokens", (getter)seq_get_tokens, NULL, "The history (list of ints).", NULL},
    {"n_tokens", (getter)seq_get_n_tokens, NULL, "Length of the history.", NULL},
    {"kv_len", (getter)seq_get_kv_len, NULL, "Positions held by the KV cache.", NULL},
    {"kv_dtype", (getter)seq_get_kv_dtype, NULL, "The KV cache's dtype ('f32', 'f16' or 'bf16').", NULL},
    {"kv_bytes", (getter)seq_get_kv_bytes, NULL, "Bytes of device memory the KV cache holds now.", NULL},
    {"model", (getter)seq_get_model, NULL, "The _C.Model.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot seq_slots[] = {
    {Py_tp_doc, (void *)"Sequence(model: _C.Model, kv_dtype='f16'): a history and a KV cache over a model."},
    {Py_tp_new, (void *)seq_new},
    {Py_tp_dealloc, (void *)seq_dealloc},
    {Py_tp_methods, seq_methods},
    {Py_tp_getset, seq_getset},
    {0, NULL},
};

static PyType_Spec seq_spec = {
    .name = "rlx._C.Sequence",
    .basicsize = sizeof(struct seq_object),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = seq_slots,
};

int rlx_py_add_seq_type(PyObject *module, struct rlx_py_state *st)
{
    st->seq_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &seq_spec, NULL);
    if (st->seq_type == NULL) return -1;
    return PyModule_AddType(module, st->seq_type);
}
