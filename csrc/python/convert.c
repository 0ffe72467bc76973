/*
 * convert.c - Python values into the core's structs for the model and sequence bindings: the model
 * config dict, weights (arrays, or raw blocks with their dtype), SampleOpts-like objects, token id
 * sequences. Each returns 0 / a pointer, or -1 / NULL with an exception set; nothing here keeps a
 * reference to its input unless it says so.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <string.h>

#include "rlx/model.h"

static int get_int(PyObject *d, const char *key, int64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_ValueError, "model config: missing '%s'", key);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)x;
    return 0;
}

static int get_bool(PyObject *d, const char *key, bool *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    if (v == NULL) {
        PyErr_Format(PyExc_ValueError, "model config: missing '%s'", key);
        return -1;
    }
    int t = PyObject_IsTrue(v);
    if (t < 0) return -1;
    *out = t != 0;
    return 0;
}

/* The C config from the dict rlx.Generator builds (HF field names + "qk_norm", "layer_windows", and for
 * a mixture of experts "layer_sparse" with num_experts, num_experts_per_tok, moe_intermediate_size,
 * norm_topk_prob). */
int rlx_py_config_from_dict(PyObject *d, struct rlx_model_config *c)
{
    memset(c, 0, sizeof *c);
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "config must be a dict");
        return -1;
    }
    if (get_int(d, "vocab_size", &c->vocab_size) || get_int(d, "hidden_size", &c->hidden_size) ||
        get_int(d, "intermediate_size", &c->intermediate_size) || get_int(d, "num_hidden_layers", &c->n_layers) ||
        get_int(d, "num_attention_heads", &c->n_heads) || get_int(d, "num_key_value_heads", &c->n_kv_heads) ||
        get_int(d, "head_dim", &c->head_dim) || get_int(d, "max_position_embeddings", &c->max_position_embeddings) ||
        get_bool(d, "tie_word_embeddings", &c->tie_word_embeddings) ||
        get_bool(d, "attention_bias", &c->attention_bias) || get_bool(d, "mlp_bias", &c->mlp_bias) ||
        get_bool(d, "qk_norm", &c->qk_norm))
        return -1;
    PyObject *ri = PyDict_GetItemString(d, "rope_interleaved"); /* optional: GGUF Llama files set it */
    if (ri != NULL) {
        int t = PyObject_IsTrue(ri);
        if (t < 0) return -1;
        c->rope_interleaved = t != 0;
    }
    PyObject *eps = PyDict_GetItemString(d, "rms_norm_eps");
    if (eps == NULL) {
        PyErr_SetString(PyExc_ValueError, "model config: missing 'rms_norm_eps'");
        return -1;
    }
    double e = PyFloat_AsDouble(eps);
    if (e == -1.0 && PyErr_Occurred()) return -1;
    c->rms_norm_eps = (float)e;
    if (c->n_layers < 1 || c->n_layers > RLX_MAX_LAYERS) {
        PyErr_Format(PyExc_ValueError, "model config: num_hidden_layers must be in 1..%d", RLX_MAX_LAYERS);
        return -1;
    }
    /* optional: a mixture of experts (Qwen3-MoE); "layer_sparse" marks its sparse layers */
    PyObject *sparse = PyDict_GetItemString(d, "layer_sparse");
    if (sparse != NULL && sparse != Py_None) {
        if (get_int(d, "num_experts", &c->n_experts) || get_int(d, "num_experts_per_tok", &c->n_experts_used) ||
            get_int(d, "moe_intermediate_size", &c->moe_intermediate_size) ||
            get_bool(d, "norm_topk_prob", &c->norm_topk_prob))
            return -1;
        PyObject *seq = PySequence_Fast(sparse, "layer_sparse must be a sequence of bools");
        if (seq == NULL) return -1;
        if (PySequence_Fast_GET_SIZE(seq) != c->n_layers) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "layer_sparse must hold one bool per layer");
            return -1;
        }
        for (int64_t l = 0; l < c->n_layers; l++) {
            int t = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, l));
            if (t < 0) {
                Py_DECREF(seq);
                return -1;
            }
            c->layer_sparse[l] = t != 0;
        }
        Py_DECREF(seq);
    }
    PyObject *win = PyDict_GetItemString(d, "layer_windows");
    if (win != NULL && win != Py_None) {
        PyObject *seq = PySequence_Fast(win, "layer_windows must be a sequence of ints");
        if (seq == NULL) return -1;
        if (PySequence_Fast_GET_SIZE(seq) != c->n_layers) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "layer_windows must hold one int per layer");
            return -1;
        }
        for (int64_t l = 0; l < c->n_layers; l++) {
            long long w = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, l));
            if (w == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            c->layer_window[l] = (int64_t)w;
        }
        Py_DECREF(seq);
    }
    return 0;
}

int rlx_py_host_tensor_from(PyObject *obj, const char *name, struct rlx_host_tensor *t, PyObject **keep)
{
    memset(t, 0, sizeof *t);
    *keep = NULL;
    if (PyTuple_Check(obj)) { /* (raw uint8 blocks, dtype name, logical shape) */
        PyObject *raw, *shape;
        const char *dtn;
        if (!PyArg_ParseTuple(obj, "OsO:weight", &raw, &dtn, &shape)) return -1;
        if (rlx_py_raise(rlx_dtype_parse(dtn, &t->dtype))) return -1;
        PyArrayObject *a = PyArray_Check(raw) ? (PyArrayObject *)raw : NULL;
        if (!a || PyArray_TYPE(a) != NPY_UINT8 || !PyArray_ISCARRAY_RO(a)) {
            PyErr_Format(PyExc_ValueError, "weight '%s': raw blocks must be a C-contiguous uint8 array", name);
            return -1;
        }
        PyObject *seq = PySequence_Fast(shape, "a weight's logical shape must be a sequence of ints");
        if (!seq) return -1;
        t->ndim = (int)PySequence_Fast_GET_SIZE(seq);
        int bad = t->ndim < 1 || t->ndim > RLX_MAX_DIMS;
        for (int i = 0; !bad && i < t->ndim; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == -1 && PyErr_Occurred()) bad = 1;
            t->shape[i] = (int64_t)v;
        }
        Py_DECREF(seq);
        if (bad) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "weight '%s': rank must be 1..%d", name, RLX_MAX_DIMS);
            return -1;
        }
        size_t bytes;
        if (rlx_py_raise(rlx_shape_bytes(t->dtype, t->ndim, t->shape, &bytes))) return -1;
        if ((size_t)PyArray_NBYTES(a) != bytes) {
            PyErr_Format(PyExc_ValueError, "weight '%s': %s of this shape holds %zu bytes, the raw array %zd", name,
                         dtn, bytes, (Py_ssize_t)PyArray_NBYTES(a));
            return -1;
        }
        t->data = PyArray_DATA(a);
        *keep = Py_NewRef(raw);
        return 0;
    }
    PyArrayObject *a = PyArray_Check(obj) ? (PyArrayObject *)obj : NULL;
    int dt = -1;
    for (int i = 0; a && i < RLX_DTYPE_COUNT && dt < 0; i++)
        if (rlx_py_dtype_matches(PyArray_DESCR(a), (enum rlx_dtype)i)) dt = i;
    if (!a || dt < 0 || !PyArray_ISCARRAY_RO(a) || PyArray_NDIM(a) > RLX_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError,
                     "weight '%s' must be a C-contiguous array of rank <= %d (float32, float16 or "
                     "bfloat16), or (raw uint8 blocks, dtype, shape)",
                     name, RLX_MAX_DIMS);
        return -1;
    }
    t->data = PyArray_DATA(a);
    t->dtype = (enum rlx_dtype)dt;
    t->ndim = PyArray_NDIM(a);
    for (int i = 0; i < t->ndim; i++) t->shape[i] = (int64_t)PyArray_DIM(a, i);
    *keep = Py_NewRef(obj);
    return 0;
}

int rlx_py_sample_opts_from(PyObject *o, struct rlx_sample_opts *out)
{
    *out = rlx_sample_opts_greedy();
    if (o == Py_None) return 0;
    struct {
        const char *name;
        int is_float;
        void *dst;
    } fields[] = {
        {"temperature", 1, &out->temperature},
        {"top_k", 0, &out->top_k},
        {"top_p", 1, &out->top_p},
        {"min_p", 1, &out->min_p},
        {"repetition_penalty", 1, &out->repetition_penalty},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        PyObject *v = PyObject_GetAttrString(o, fields[i].name);
        if (v == NULL) return -1;
        if (fields[i].is_float) {
            double x = PyFloat_AsDouble(v);
            Py_DECREF(v);
            if (x == -1.0 && PyErr_Occurred()) return -1;
            *(float *)fields[i].dst = (float)x;
        } else {
            long x = PyLong_AsLong(v);
            Py_DECREF(v);
            if (x == -1 && PyErr_Occurred()) return -1;
            if (x < 0 || x > INT32_MAX) {
                PyErr_Format(PyExc_ValueError, "%s must be in [0, 2**31), got %ld", fields[i].name, x);
                return -1;
            }
            *(int32_t *)fields[i].dst = (int32_t)x;
        }
    }
    PyObject *seed = PyObject_GetAttrString(o, "seed");
    if (seed == NULL) return -1;
    unsigned long long s = PyLong_AsUnsignedLongLongMask(seed);
    Py_DECREF(seed);
    if (s == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    out->seed = (uint64_t)s;
    return rlx_py_raise(rlx_sample_opts_check(out));
}

/* ids (any int sequence) -> a new int32 buffer (PyMem_Malloc) of *n entries, range-checked to
 * int32 (the generator checks the vocabulary). */
int32_t *rlx_py_ids_from(PyObject *obj, int64_t *n)
{
    PyArrayObject *any = (PyArrayObject *)PyArray_FROM_OF(obj, NPY_ARRAY_IN_ARRAY);
    if (any == NULL) return NULL;
    if (PyArray_SIZE(any) > 0 && !PyArray_ISINTEGER(any)) { /* never truncate 1.5 to 1 */
        PyErr_Format(PyExc_TypeError, "token ids must be integers, got an array of %s",
                     PyArray_DESCR(any)->typeobj->tp_name);
        Py_DECREF(any);
        return NULL;
    }
    PyArrayObject *arr =
        (PyArrayObject *)PyArray_FROM_OTF((PyObject *)any, NPY_INT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    Py_DECREF(any);
    if (arr == NULL) return NULL;
    int32_t *out = NULL;
    if (PyArray_NDIM(arr) != 1) {
        PyErr_Format(PyExc_ValueError, "token ids must be a 1-D sequence, got %d dimensions", PyArray_NDIM(arr));
        goto error;
    }
    *n = (int64_t)PyArray_DIM(arr, 0);
    out = PyMem_Malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
    if (out == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    const int64_t *src = PyArray_DATA(arr);
    for (int64_t i = 0; i < *n; i++) {
        if (src[i] < INT32_MIN || src[i] > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "token id %lld at position %lld is out of range", (long long)src[i],
                         (long long)i);
            PyMem_Free(out);
            out = NULL;
            goto error;
        }
        out[i] = (int32_t)src[i];
    }
error:
    Py_DECREF(arr);
    return out;
}

int rlx_py_token_from(PyObject *obj, int32_t *tok)
{
    long long t = PyLong_AsLongLong(obj);
    if (t == -1 && PyErr_Occurred()) return -1;
    if (t < INT32_MIN || t > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "token id %lld is out of range", t);
        return -1;
    }
    *tok = (int32_t)t;
    return 0;
}
