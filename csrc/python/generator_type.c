/*
 * generator_type.c - _C.Generator: the C generator (csrc/gen) with NumPy weights and Python
 * callbacks. The Python class rlx.Generator wraps it with the documented API; this type offers
 * the primitive steps: prefill, append, logits (naive or cached), sample, step, generate.
 *
 * Ownership: the generator reads the weight arrays in place (zero-copy, f32 C-contiguous only);
 * the dict `weights` keeps them alive as long as the generator. kv_cache() views point into the
 * cache, whose memory never moves for the generator's life; each view holds a reference to the
 * generator.
 *
 * Threads: the GIL is released around every forward pass and sampling; the generator's own lock
 * (waited for with the GIL released) serialises threads sharing one generator. Python callbacks
 * (on_token, adjust) run with the GIL held and the lock held by this thread; a callback that
 * re-enters the same generator gets an exception, not a deadlock.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include "pythread.h"

#include <string.h>

#include "rlx/model.h"

struct gen_object {
    PyObject_HEAD
    struct rlx_generator *gen;   /* owned */
    struct rlx_py_lock lock;
    PyObject *weights;           /* dict: name -> the f32 array the generator reads */
};

static int gen_acquire(struct gen_object *self) { return rlx_py_lock_acquire(&self->lock, "generator"); }
static void gen_release(struct gen_object *self) { rlx_py_lock_release(&self->lock); }

/* ---- construction ------------------------------------------------------------------------- */

static void gen_dealloc(struct gen_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    rlx_generator_free(self->gen); /* before the arrays it reads */
    Py_XDECREF(self->weights);
    rlx_py_lock_fini(&self->lock);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *gen_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"config", "weights", "device", "layer_begin", "layer_end", "embed", "head", NULL};
    PyObject *config, *weights;
    const char *device = "cpu";
    long long begin = 0, end = -1;
    int embed = 1, head = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!|sLLpp:Generator", kwlist, &config, &PyDict_Type, &weights,
                                     &device, &begin, &end, &embed, &head))
        return NULL;
    struct rlx_model_config cfg;
    if (rlx_py_config_from_dict(config, &cfg) < 0) return NULL;
    if (end < 0) end = cfg.n_layers;
    struct gen_object *self = (struct gen_object *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->weights = PyDict_New();
    if (self->weights == NULL || rlx_py_lock_init(&self->lock) < 0) goto error;
    unsigned ends = (embed ? (unsigned)RLX_BLOCK_EMBED : 0u) | (head ? (unsigned)RLX_BLOCK_HEAD : 0u);
    if (rlx_py_raise(rlx_generator_create_block(&cfg, device, begin, end, ends, &self->gen))) goto error;
    Py_ssize_t pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(weights, &pos, &key, &val)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (name == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "weight names must be str");
            goto error;
        }
        PyArrayObject *a = PyArray_Check(val) ? (PyArrayObject *)val : NULL;
        enum rlx_dtype dt = RLX_F32;
        if (a && !rlx_py_dtype_matches(PyArray_DESCR(a), RLX_F32) && rlx_py_dtype_matches(PyArray_DESCR(a), cfg.weight_dtype))
            dt = cfg.weight_dtype;
        if (a == NULL || !rlx_py_dtype_matches(PyArray_DESCR(a), dt) || !PyArray_ISCARRAY_RO(a) ||
            PyArray_NDIM(a) > RLX_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "weight '%s' must be a C-contiguous array of rank <= %d, float32 or %s",
                         name, RLX_MAX_DIMS, rlx_dtype_name(cfg.weight_dtype));
            goto error;
        }
        struct rlx_host_tensor t = {.data = PyArray_DATA(a), .dtype = dt, .ndim = PyArray_NDIM(a)};
        for (int i = 0; i < t.ndim; i++) t.shape[i] = (int64_t)PyArray_DIM(a, i);
        if (rlx_py_raise(rlx_generator_set_weight(self->gen, name, &t))) goto error;
        if (PyDict_SetItem(self->weights, key, val) < 0) goto error;
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

/* ---- methods ------------------------------------------------------------------------------ */

static PyObject *gen_prefill(struct gen_object *self, PyObject *ids_obj)
{
    int64_t n;
    int32_t *ids = rlx_py_ids_from(ids_obj, &n);
    if (ids == NULL) return NULL;
    if (gen_acquire(self) < 0) {
        PyMem_Free(ids);
        return NULL;
    }
    rlx_status s = rlx_generator_prefill(self->gen, ids, n);
    gen_release(self);
    PyMem_Free(ids);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gen_reset(struct gen_object *self, PyObject *unused)
{
    (void)unused;
    if (gen_acquire(self) < 0) return NULL;
    rlx_generator_reset(self->gen);
    gen_release(self);
    Py_RETURN_NONE;
}

static PyObject *gen_truncate(struct gen_object *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if ((n == -1 && PyErr_Occurred()) || gen_acquire(self) < 0) return NULL;
    rlx_status s = rlx_generator_truncate(self->gen, n);
    gen_release(self);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gen_append(struct gen_object *self, PyObject *tok_obj)
{
    int32_t tok;
    if (rlx_py_token_from(tok_obj, &tok) < 0 || gen_acquire(self) < 0) return NULL;
    rlx_status s = rlx_generator_append(self->gen, tok);
    gen_release(self);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

/* Runs the forward pass with the GIL released; the lock must be held. */
static rlx_status forward(struct gen_object *self, int cached, const float **logits)
{
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cached ? rlx_generator_logits_cached(self->gen, logits) : rlx_generator_logits_naive(self->gen, logits);
    Py_END_ALLOW_THREADS
    return s;
}

static PyObject *logits_array(struct gen_object *self, const float *logits)
{
    npy_intp dims[1] = {(npy_intp)rlx_generator_config(self->gen)->vocab_size};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (arr) memcpy(PyArray_DATA((PyArrayObject *)arr), logits, sizeof(float) * (size_t)dims[0]);
    return arr;
}

static PyObject *gen_logits(struct gen_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"cached", NULL};
    int cached = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:logits", kwlist, &cached) || gen_acquire(self) < 0) return NULL;
    const float *logits;
    rlx_status s = forward(self, cached, &logits);
    PyObject *out = s == RLX_OK ? logits_array(self, logits) : NULL;
    gen_release(self);
    if (rlx_py_raise(s)) return NULL;
    return out;
}

/* One step with the lock held: logits, optional adjust(logits array) in place, sample at index,
 * append. Returns the token or -1 with an exception set. */
static long long step_locked(struct gen_object *self, const struct rlx_sample_opts *o, int cached, uint64_t index,
                             PyObject *adjust)
{
    const float *logits;
    int32_t tok = -1;
    rlx_status s = forward(self, cached, &logits);
    if (rlx_py_raise(s)) return -1;
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
        Py_BEGIN_ALLOW_THREADS
        s = rlx_generator_sample(self->gen, row, o, index, &tok);
        Py_END_ALLOW_THREADS
        Py_DECREF(arr);
    } else {
        Py_BEGIN_ALLOW_THREADS
        s = rlx_generator_sample(self->gen, logits, o, index, &tok);
        Py_END_ALLOW_THREADS
    }
    if (rlx_py_raise(s) || rlx_py_raise(rlx_generator_append(self->gen, tok))) return -1;
    return tok;
}

static PyObject *gen_step(struct gen_object *self, PyObject *args, PyObject *kwargs)
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
    if (gen_acquire(self) < 0) return NULL;
    if (index_obj == Py_None) index = (unsigned long long)rlx_generator_len(self->gen);
    long long tok = step_locked(self, &o, cached, index, adjust);
    gen_release(self);
    return tok < 0 ? NULL : PyLong_FromLongLong(tok);
}

static PyObject *gen_generate(struct gen_object *self, PyObject *args, PyObject *kwargs)
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
    if (out == NULL || gen_acquire(self) < 0) {
        Py_XDECREF(out);
        Py_DECREF(stop);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long tok = step_locked(self, &o, cached, (uint64_t)rlx_generator_len(self->gen), Py_None);
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
        if (is_stop < 0) goto error;
        if (is_stop) break;
    }
    gen_release(self);
    Py_DECREF(stop);
    return out;
error:
    gen_release(self);
    Py_DECREF(stop);
    Py_DECREF(out);
    return NULL;
}

static PyObject *gen_sample(struct gen_object *self, PyObject *args, PyObject *kwargs)
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
    if (PyArray_NDIM(arr) != 1 || PyArray_DIM(arr, 0) != rlx_generator_config(self->gen)->vocab_size) {
        PyErr_Format(PyExc_ValueError, "logits must have shape (%lld,)",
                     (long long)rlx_generator_config(self->gen)->vocab_size);
        goto error;
    }
    if (gen_acquire(self) < 0) goto error;
    int32_t tok;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS
    if (history_obj == Py_None) s = rlx_generator_sample(self->gen, PyArray_DATA(arr), &o, index, &tok);
    else s = rlx_generator_sample_with(self->gen, PyArray_DATA(arr), &o, index, history, n_hist, &tok);
    Py_END_ALLOW_THREADS
    gen_release(self);
    if (!rlx_py_raise(s)) out = PyLong_FromLong(tok);
error:
    Py_DECREF(arr);
    PyMem_Free(history);
    return out;
}

/* forward(hidden=None, cached=True): runs the block; see rlx_generator_forward. */
static PyObject *gen_forward(struct gen_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"hidden", "cached", NULL};
    PyObject *hidden_obj = Py_None;
    int cached = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Op:forward", kwlist, &hidden_obj, &cached)) return NULL;
    const struct rlx_model_config *c = rlx_generator_config(self->gen);
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
    if (gen_acquire(self) < 0) goto error;
    const float *y;
    int64_t rows;
    rlx_status s;
    const float *h = hidden ? PyArray_DATA(hidden) : NULL;
    Py_BEGIN_ALLOW_THREADS
    s = rlx_generator_forward(self->gen, h, n, cached != 0, &y, &rows);
    Py_END_ALLOW_THREADS
    if (s == RLX_OK) { /* copy out while the lock keeps the generator's buffer stable */
        int64_t begin, end;
        unsigned ends;
        rlx_generator_block(self->gen, &begin, &end, &ends);
        if (ends & RLX_BLOCK_HEAD) {
            out = logits_array(self, y);
        } else {
            npy_intp dims[2] = {(npy_intp)rows, (npy_intp)c->hidden_size};
            out = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
            if (out) memcpy(PyArray_DATA((PyArrayObject *)out), y, sizeof(float) * (size_t)(rows * c->hidden_size));
        }
    }
    gen_release(self);
    if (rlx_py_raise(s)) Py_CLEAR(out);
error:
    Py_XDECREF(hidden);
    return out;
}

static PyObject *gen_get_tokens(struct gen_object *self, void *closure)
{
    (void)closure;
    int64_t n = rlx_generator_len(self->gen);
    const int32_t *t = rlx_generator_tokens(self->gen);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromLong(t[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    return out;
}

static PyObject *gen_get_n_tokens(struct gen_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(rlx_generator_len(self->gen));
}

static PyObject *gen_get_kv_len(struct gen_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(rlx_kv_cache_len(rlx_generator_kv(self->gen)));
}

static PyObject *kv_view(struct gen_object *self, float *data, int64_t len)
{
    const struct rlx_model_config *c = rlx_generator_config(self->gen);
    npy_intp dims[3] = {(npy_intp)len, (npy_intp)c->n_kv_heads, (npy_intp)c->head_dim};
    PyObject *arr = PyArray_New(&PyArray_Type, 3, dims, NPY_FLOAT32, NULL, data, 0, NPY_ARRAY_C_CONTIGUOUS, NULL);
    if (arr == NULL) return NULL;
    Py_INCREF(self);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *gen_kv_cache(struct gen_object *self, PyObject *layer_obj)
{
    long long layer = PyLong_AsLongLong(layer_obj);
    if (layer == -1 && PyErr_Occurred()) return NULL;
    struct rlx_kv_cache *kv = rlx_generator_kv(self->gen);
    if (layer < 0 || layer >= rlx_kv_cache_layers(kv)) {
        PyErr_Format(PyExc_IndexError, "layer %lld outside [0, %lld)", layer, (long long)rlx_kv_cache_layers(kv));
        return NULL;
    }
    int64_t len = rlx_kv_cache_len(kv);
    PyObject *k = kv_view(self, rlx_kv_cache_k(kv, layer), len);
    PyObject *v = k ? kv_view(self, rlx_kv_cache_v(kv, layer), len) : NULL;
    if (v == NULL) {
        Py_XDECREF(k);
        return NULL;
    }
    return Py_BuildValue("(NN)", k, v);
}

static int parse_policy(const char *s, enum rlx_plan_policy *out)
{
    static const struct {
        const char *name;
        enum rlx_plan_policy p;
    } names[] = {{"oneshot", RLX_POLICY_ONESHOT},
                 {"lru", RLX_POLICY_LRU},
                 {"bucketed", RLX_POLICY_BUCKETED},
                 {"dynamic", RLX_POLICY_DYNAMIC}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].p;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "unknown plan policy '%s' (expected oneshot, lru, bucketed or dynamic)", s);
    return -1;
}

static PyObject *gen_set_policy(struct gen_object *self, PyObject *args)
{
    const char *pf, *dc;
    long long capacity, max_past;
    enum rlx_plan_policy p, d;
    if (!PyArg_ParseTuple(args, "sLsL:set_policy", &pf, &capacity, &dc, &max_past) || parse_policy(pf, &p) < 0 ||
        parse_policy(dc, &d) < 0 || gen_acquire(self) < 0)
        return NULL;
    rlx_status s = rlx_generator_set_policy(self->gen, p, capacity, d, max_past);
    gen_release(self);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gen_set_seq_cap(struct gen_object *self, PyObject *arg)
{
    long long cap = PyLong_AsLongLong(arg);
    if ((cap == -1 && PyErr_Occurred()) || gen_acquire(self) < 0) return NULL;
    rlx_status s = rlx_generator_set_seq_cap(self->gen, cap);
    gen_release(self);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gen_set_memory_budget(struct gen_object *self, PyObject *args)
{
    unsigned long long bytes;
    const char *hint = "";
    if (!PyArg_ParseTuple(args, "K|s:set_memory_budget", &bytes, &hint) || gen_acquire(self) < 0) return NULL;
    rlx_generator_set_memory_budget(self->gen, (size_t)bytes, hint);
    gen_release(self);
    Py_RETURN_NONE;
}

static PyObject *gen_stats(struct gen_object *self, PyObject *unused)
{
    (void)unused;
    struct rlx_generator_stats st;
    rlx_generator_stats(self->gen, &st);
    return Py_BuildValue("{s:L,s:L,s:L,s:d,s:L,s:n}", "prefill_compiles", (long long)st.prefill_compiles,
                         "decode_compiles", (long long)st.decode_compiles, "plan_hits", (long long)st.plan_hits,
                         "compile_seconds", st.compile_seconds,
                         "plans_cached", (long long)st.plans_cached, "planned_bytes", (Py_ssize_t)st.planned_bytes);
}

static PyObject *gen_set_profiling(struct gen_object *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0 || gen_acquire(self) < 0) return NULL;
    rlx_status s = rlx_generator_set_profiling(self->gen, on != 0);
    gen_release(self);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gen_last_profile(struct gen_object *self, PyObject *unused)
{
    (void)unused;
    double sec[RLX_OP_COUNT];
    if (rlx_py_raise(rlx_generator_last_profile(self->gen, sec))) return NULL;
    PyObject *out = PyDict_New();
    for (int op = 0; out && op < RLX_OP_COUNT; op++) {
        if (sec[op] <= 0) continue;
        PyObject *v = PyFloat_FromDouble(sec[op]);
        if (v == NULL || PyDict_SetItemString(out, rlx_op_name((enum rlx_op)op), v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}

static PyObject *gen_release_plans(struct gen_object *self, PyObject *args)
{
    int decode_only = 0;
    if (!PyArg_ParseTuple(args, "|p:release_plans", &decode_only) || gen_acquire(self) < 0) return NULL;
    if (decode_only) rlx_generator_release_decode_plans(self->gen);
    else rlx_generator_release_plans(self->gen);
    gen_release(self);
    Py_RETURN_NONE;
}

static PyMethodDef gen_methods[] = {
    {"prefill", (PyCFunction)gen_prefill, METH_O, "prefill(ids)\n\nReplaces the history with ids; clears the cache."},
    {"reset", (PyCFunction)gen_reset, METH_NOARGS, "reset()\n\nForgets the history and empties the cache."},
    {"truncate", (PyCFunction)gen_truncate, METH_O,
     "truncate(n)\n\nKeeps the first n positions of the history and the cache."},
    {"append", (PyCFunction)gen_append, METH_O, "append(token)\n\nAppends one token to the history."},
    {"logits", (PyCFunction)(void (*)(void))gen_logits, METH_VARARGS | METH_KEYWORDS,
     "logits(cached=True) -> ndarray (vocab,)\n\nNext-token logits after the history (KV-cached or recomputed)."},
    {"step", (PyCFunction)(void (*)(void))gen_step, METH_VARARGS | METH_KEYWORDS,
     "step(opts=None, cached=True, sample_index=None, adjust=None) -> int\n\nLogits, adjust(logits) in place if "
     "given, sample (draw index defaults to the new token's position), append."},
    {"generate", (PyCFunction)(void (*)(void))gen_generate, METH_VARARGS | METH_KEYWORDS,
     "generate(n, opts=None, cached=True, on_token=None, stop_ids=None) -> list[int]\n\nUp to n steps; stops after "
     "a token in stop_ids; on_token(token) after each."},
    {"forward", (PyCFunction)(void (*)(void))gen_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(hidden=None, cached=True) -> ndarray\n\nRuns the block: over the history (embedding blocks) or over "
     "hidden (n, H) rows; returns logits (vocab,) for a block with the head, else hidden (rows, H)."},
    {"sample", (PyCFunction)(void (*)(void))gen_sample, METH_VARARGS | METH_KEYWORDS,
     "sample(logits, opts=None, sample_index=0, history=None) -> int\n\nDraws from a logits row; history (ids) "
     "is the repetition context (default: the generator's own)."},
    {"kv_cache", (PyCFunction)gen_kv_cache, METH_O,
     "kv_cache(layer) -> (k, v)\n\nViews (len, kv_heads, head_dim) of the cache's filled part; they see later "
     "writes but keep their length."},
    {"set_policy", (PyCFunction)gen_set_policy, METH_VARARGS,
     "set_policy(prefill, capacity, decode, max_past)\n\nprefill: 'oneshot', 'lru' or 'dynamic'; decode: 'oneshot', "
     "'bucketed' or 'dynamic'. Refused mid-utterance; drops compiled plans."},
    {"set_seq_cap", (PyCFunction)gen_set_seq_cap, METH_O,
     "set_seq_cap(cap)\n\nBounds SEQ / PAST of dynamic plans (0 = none); drops compiled plans."},
    {"set_memory_budget", (PyCFunction)gen_set_memory_budget, METH_VARARGS,
     "set_memory_budget(bytes, hint='')\n\nRefuse plans whose intermediates exceed bytes (0 = none)."},
    {"set_profiling", (PyCFunction)gen_set_profiling, METH_O,
     "set_profiling(on)\n\nTime every op of every forward pass (small overhead)."},
    {"last_profile", (PyCFunction)gen_last_profile, METH_NOARGS,
     "last_profile() -> dict[str, float]\n\nSeconds per op of the last forward pass."},
    {"stats", (PyCFunction)gen_stats, METH_NOARGS, "stats() -> dict of compile counts, seconds and planned bytes"},
    {"release_plans", (PyCFunction)gen_release_plans, METH_VARARGS,
     "release_plans(decode_only=False)\n\nFrees compiled plans; they are rebuilt on demand."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef gen_getset[] = {
    {"tokens", (getter)gen_get_tokens, NULL, "The history (list of ints).", NULL},
    {"kv_len", (getter)gen_get_kv_len, NULL, "Positions held by the KV cache.", NULL},
    {"n_tokens", (getter)gen_get_n_tokens, NULL, "Length of the history.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot gen_slots[] = {
    {Py_tp_doc, (void *)"Generator(config: dict, weights: dict[str, ndarray], device='cpu'): the C generator."},
    {Py_tp_new, (void *)gen_new},
    {Py_tp_dealloc, (void *)gen_dealloc},
    {Py_tp_methods, gen_methods},
    {Py_tp_getset, gen_getset},
    {0, NULL},
};

static PyType_Spec gen_spec = {
    .name = "rlx._C.Generator",
    .basicsize = sizeof(struct gen_object),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = gen_slots,
};

int rlx_py_add_generator_type(PyObject *module, struct rlx_py_state *st)
{
    st->generator_type = PyType_FromModuleAndSpec(module, &gen_spec, NULL);
    if (st->generator_type == NULL) return -1;
    return PyModule_AddType(module, (PyTypeObject *)st->generator_type);
}
