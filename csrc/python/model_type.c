/*
 * model_type.c - _C.Model: a model or pipeline block (struct rlx_model: config, weight store,
 * compiled plans) on a device, shared by every _C.Sequence made from it. The Python class
 * rlx.Generator wraps one with a current sequence; rlx.Model (the high-level API) gives each call a
 * sequence of its own.
 *
 * Ownership: the model reads weight arrays in place where the device reads host memory; the dict
 * `weights` keeps every such object alive as long as the model. The model holds its _C.Device, so
 * the device outlives the model's plans and weights; each sequence holds its model likewise.
 *
 * Threads: the core model serialises its own plan runs and changes (a mutex inside), so this
 * object has no lock of its own; the GIL is released around every call that may upload or compile.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <string.h>

#include "rlx/model.h"

struct model_object {
    PyObject_HEAD struct rlx_model *model; /* owned */
    PyObject *device;                      /* _C.Device */
    PyObject *weights;                     /* dict: name -> the object whose memory the model reads */
};

struct rlx_model *rlx_py_model_get(PyObject *obj) { return ((struct model_object *)obj)->model; }

static void model_dealloc(struct model_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    rlx_model_free(self->model); /* before the arrays it reads and the device it lives on */
    Py_XDECREF(self->weights);
    Py_XDECREF(self->device);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Stores stacked experts from a list of parts (one array or raw tuple per expert). */
static int set_weight_parts(struct model_object *self, PyObject *key, const char *name, PyObject *list)
{
    const Py_ssize_t n = PyList_GET_SIZE(list);
    struct rlx_host_tensor *parts = PyMem_Calloc(n ? (size_t)n : 1, sizeof *parts);
    PyObject *keep = PyList_New(n);
    int rc = -1;
    if (parts == NULL || keep == NULL) {
        if (parts == NULL) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k;
        if (rlx_py_host_tensor_from(PyList_GET_ITEM(list, i), name, &parts[i], &k) < 0) goto done;
        PyList_SET_ITEM(keep, i, k);
    }
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_model_set_weight_parts(self->model, name, (int64_t)n, parts);
    Py_END_ALLOW_THREADS rc = rlx_py_raise(s) ? -1 : PyDict_SetItem(self->weights, key, keep);
done:
    Py_XDECREF(keep);
    PyMem_Free(parts);
    return rc;
}

/* Stores one weight (GIL released for the upload) and keeps what it reads; a list is stacked
 * experts given as their parts. */
static int set_weight(struct model_object *self, PyObject *key, PyObject *val)
{
    const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (name == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "weight names must be str");
        return -1;
    }
    if (PyList_Check(val)) return set_weight_parts(self, key, name, val);
    struct rlx_host_tensor t;
    PyObject *keep;
    if (rlx_py_host_tensor_from(val, name, &t, &keep) < 0) return -1;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_model_set_weight(self->model, name, &t);
    Py_END_ALLOW_THREADS int rc = rlx_py_raise(s) ? -1 : PyDict_SetItem(self->weights, key, keep);
    Py_DECREF(keep);
    return rc;
}

static PyObject *model_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"config", "weights", "device", "layer_begin", "layer_end", "embed", "head", NULL};
    PyObject *config, *weights, *device_arg = NULL;
    long long begin = 0, end = -1;
    int embed = 1, head = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!|OLLpp:Model", kwlist, &config, &PyDict_Type, &weights,
                                     &device_arg, &begin, &end, &embed, &head))
        return NULL;
    struct rlx_py_state *st = rlx_py_state_of_type(type);
    if (st == NULL) return NULL;
    struct rlx_model_config cfg;
    if (rlx_py_config_from_dict(config, &cfg) < 0) return NULL;
    if (end < 0) end = cfg.n_layers;
    PyObject *dname = device_arg ? NULL : PyUnicode_FromString("cpu");
    PyObject *device = device_arg || dname ? rlx_py_device_from(st, device_arg ? device_arg : dname) : NULL;
    Py_XDECREF(dname);
    if (device == NULL) return NULL;
    struct model_object *self = (struct model_object *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(device);
        return NULL;
    }
    self->device = device;
    self->weights = PyDict_New();
    if (self->weights == NULL) goto error;
    unsigned ends = (embed ? (unsigned)RLX_BLOCK_EMBED : 0u) | (head ? (unsigned)RLX_BLOCK_HEAD : 0u);
    if (rlx_py_raise(rlx_model_create(&cfg, rlx_py_device_get(device), begin, end, ends, &self->model))) goto error;
    Py_ssize_t pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(weights, &pos, &key, &val))
        if (set_weight(self, key, val) < 0) goto error;
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static PyObject *model_set_weight(struct model_object *self, PyObject *args)
{
    PyObject *key, *val;
    if (!PyArg_ParseTuple(args, "UO:set_weight", &key, &val) || set_weight(self, key, val) < 0) return NULL;
    Py_RETURN_NONE;
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

static PyObject *model_set_policy(struct model_object *self, PyObject *args)
{
    const char *pf, *dc;
    long long capacity, max_past;
    enum rlx_plan_policy p, d;
    if (!PyArg_ParseTuple(args, "sLsL:set_policy", &pf, &capacity, &dc, &max_past) || parse_policy(pf, &p) < 0 ||
        parse_policy(dc, &d) < 0)
        return NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_model_set_policy(self->model, p, capacity, d, max_past);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *model_set_seq_cap(struct model_object *self, PyObject *arg)
{
    long long cap = PyLong_AsLongLong(arg);
    if (cap == -1 && PyErr_Occurred()) return NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_model_set_seq_cap(self->model, cap);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *model_set_prefill_chunk(struct model_object *self, PyObject *arg)
{
    long long chunk = PyLong_AsLongLong(arg);
    if (chunk == -1 && PyErr_Occurred()) return NULL;
    if (rlx_py_raise(rlx_model_set_prefill_chunk(self->model, chunk))) return NULL;
    Py_RETURN_NONE;
}

static PyObject *model_set_memory_budget(struct model_object *self, PyObject *args)
{
    unsigned long long bytes;
    const char *hint = "";
    if (!PyArg_ParseTuple(args, "K|s:set_memory_budget", &bytes, &hint)) return NULL;
    Py_BEGIN_ALLOW_THREADS rlx_model_set_memory_budget(self->model, (size_t)bytes, hint);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *model_set_batch_invariant(struct model_object *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS rlx_model_set_batch_invariant(self->model, on != 0);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *model_set_profiling(struct model_object *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_model_set_profiling(self->model, on != 0);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *model_stats(struct model_object *self, PyObject *unused)
{
    (void)unused;
    struct rlx_model_stats st;
    Py_BEGIN_ALLOW_THREADS rlx_model_stats(self->model, &st);
    Py_END_ALLOW_THREADS return Py_BuildValue(
        "{s:L,s:L,s:L,s:d,s:L,s:n}", "prefill_compiles", (long long)st.prefill_compiles, "decode_compiles",
        (long long)st.decode_compiles, "plan_hits", (long long)st.plan_hits, "compile_seconds", st.compile_seconds,
        "plans_cached", (long long)st.plans_cached, "planned_bytes", (Py_ssize_t)st.planned_bytes);
}

static PyObject *model_release_plans(struct model_object *self, PyObject *args)
{
    int decode_only = 0;
    if (!PyArg_ParseTuple(args, "|p:release_plans", &decode_only)) return NULL;
    Py_BEGIN_ALLOW_THREADS if (decode_only) rlx_model_release_decode_plans(self->model);
    else rlx_model_release_plans(self->model);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *model_get_weight_bytes(struct model_object *self, void *closure)
{
    (void)closure;
    int count;
    size_t bytes;
    rlx_model_weights(self->model, &count, &bytes);
    return Py_BuildValue("(in)", count, (Py_ssize_t)bytes);
}

static PyObject *model_get_block(struct model_object *self, void *closure)
{
    (void)closure;
    int64_t begin, end;
    unsigned ends;
    rlx_model_block(self->model, &begin, &end, &ends);
    return Py_BuildValue("(LLOO)", (long long)begin, (long long)end, (ends & RLX_BLOCK_EMBED) ? Py_True : Py_False,
                         (ends & RLX_BLOCK_HEAD) ? Py_True : Py_False);
}

static PyObject *model_get_device(struct model_object *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->device);
}

static PyObject *model_get_vocab_size(struct model_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(rlx_model_config(self->model)->vocab_size);
}

const char rlx_py_decoder_params_doc[] =
    "decoder_params(config: dict, layer_begin=0, layer_end=-1, embed=True, head=True) -> list[tuple]\n\n"
    "(name, shape, kind, part_fmt) of every weight the block reads, in build order; kind 0 = matrix (any\n"
    "real-valued dtype), 1 = vector (f32: norms, biases), 2 = derived (rope.inv_freq, computed from the\n"
    "config), 3 = stacked experts (E, out, in), whose parts a Hugging Face file names part_fmt % e (else None).";

PyObject *rlx_py_decoder_params(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"config", "layer_begin", "layer_end", "embed", "head", NULL};
    PyObject *config;
    long long begin = 0, end = -1;
    int embed = 1, head = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|LLpp:decoder_params", kwlist, &config, &begin, &end, &embed,
                                     &head))
        return NULL;
    struct rlx_model_config cfg;
    if (rlx_py_config_from_dict(config, &cfg) < 0) return NULL;
    if (end < 0) end = cfg.n_layers;
    struct rlx_param_info *p = NULL;
    int n = 0;
    unsigned ends = (embed ? (unsigned)RLX_BLOCK_EMBED : 0u) | (head ? (unsigned)RLX_BLOCK_HEAD : 0u);
    if (rlx_py_raise(rlx_decoder_params(&cfg, begin, end, ends, &p, &n))) return NULL;
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *shape = PyTuple_New(p[i].ndim);
        for (int d = 0; shape && d < p[i].ndim; d++) {
            PyObject *v = PyLong_FromLongLong((long long)p[i].shape[d]);
            if (v == NULL)
                Py_CLEAR(shape);
            else
                PyTuple_SET_ITEM(shape, d, v);
        }
        PyObject *row =
            shape ? Py_BuildValue("(sNiz)", p[i].name, shape, (int)p[i].kind, p[i].part_fmt[0] ? p[i].part_fmt : NULL)
                  : NULL;
        if (row == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, row);
    }
    rlx_decoder_params_free(p);
    return out;
}

/* add_source(path, st_dev, st_ino, st_size, st_mtime_ns): a file the weights were read from in place. */
static PyObject *model_add_source(struct model_object *self, PyObject *args)
{
    PyObject *path;
    unsigned long long dev, ino;
    long long size, mtime;
    if (!PyArg_ParseTuple(args, "O&KKLL:add_source", PyUnicode_FSConverter, &path, &dev, &ino, &size, &mtime))
        return NULL;
    rlx_status s = rlx_model_add_source(self->model, PyBytes_AS_STRING(path), dev, ino, size, mtime);
    Py_DECREF(path);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef model_methods[] = {
    {"add_source", (PyCFunction)model_add_source, METH_VARARGS,
     "add_source(path, st_dev, st_ino, st_size, st_mtime_ns)\n\nA file the weights were read from in place, as "
     "os.stat saw it at load: every run raises rlx.Error once it is modified in place or truncated."},
    {"set_weight", (PyCFunction)model_set_weight, METH_VARARGS,
     "set_weight(name, array_or_raw)\n\nStores a weight (see Model); drops the compiled plans."},
    {"set_policy", (PyCFunction)model_set_policy, METH_VARARGS,
     "set_policy(prefill, capacity, decode, max_past)\n\nprefill: 'oneshot', 'lru' or 'dynamic'; decode: 'oneshot', "
     "'bucketed' or 'dynamic'. Drops compiled plans."},
    {"set_seq_cap", (PyCFunction)model_set_seq_cap, METH_O,
     "set_seq_cap(cap)\n\nBounds SEQ / PAST of dynamic plans (0 = none); drops compiled plans."},
    {"set_prefill_chunk", (PyCFunction)model_set_prefill_chunk, METH_O,
     "set_prefill_chunk(n)\n\nCached runs of a model with the head go n positions per plan run (0 = whole)."},
    {"set_memory_budget", (PyCFunction)model_set_memory_budget, METH_VARARGS,
     "set_memory_budget(bytes, hint='')\n\nRefuse plans whose intermediates exceed bytes (0 = none)."},
    {"set_batch_invariant", (PyCFunction)model_set_batch_invariant, METH_O,
     "set_batch_invariant(on)\n\nPlans whose products compute every row as alone (a sequence decoded in a batch "
     "gets its own bits); drops plans."},
    {"set_profiling", (PyCFunction)model_set_profiling, METH_O,
     "set_profiling(on)\n\nTime every op of every forward pass (small overhead); each sequence keeps its last."},
    {"stats", (PyCFunction)model_stats, METH_NOARGS, "stats() -> dict of compile counts, seconds and planned bytes"},
    {"release_plans", (PyCFunction)model_release_plans, METH_VARARGS,
     "release_plans(decode_only=False)\n\nFrees compiled plans; they are rebuilt on demand."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"weight_bytes", (getter)model_get_weight_bytes, NULL, "(count, bytes) of the stored weights.", NULL},
    {"block", (getter)model_get_block, NULL, "(layer_begin, layer_end, embed, head).", NULL},
    {"device", (getter)model_get_device, NULL, "The _C.Device the model lives on.", NULL},
    {"vocab_size", (getter)model_get_vocab_size, NULL, "The vocabulary size.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot model_slots[] = {
    {Py_tp_doc, (void *)"Model(config: dict, weights: dict, device='cpu', layer_begin=0, layer_end=-1, embed=True, "
                        "head=True): a model or pipeline block on a device. A weight is an array (float32, float16, "
                        "bfloat16) or (raw uint8 blocks, dtype name, logical shape); stacked experts may also be a "
                        "list of their parts, one such weight per expert (used in place where the device allows)."},
    {Py_tp_new, (void *)model_new},
    {Py_tp_dealloc, (void *)model_dealloc},
    {Py_tp_methods, model_methods},
    {Py_tp_getset, model_getset},
    {0, NULL},
};

static PyType_Spec model_spec = {
    .name = "rlx._C.Model",
    .basicsize = sizeof(struct model_object),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = model_slots,
};

int rlx_py_add_model_type(PyObject *module, struct rlx_py_state *st)
{
    st->model_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &model_spec, NULL);
    if (st->model_type == NULL) return -1;
    return PyModule_AddType(module, st->model_type);
}
