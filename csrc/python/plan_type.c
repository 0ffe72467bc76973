/*
 * plan_type.c - _C.compile and _C.Plan: a compiled graph bound to one backend, its weights, and
 * running it on NumPy inputs.
 *
 * Ownership: a Plan owns its struct rlx_plan, and keeps every array whose memory the plan points
 * into (set_param is zero-copy when it can be) in the dict `params`, so a weight lives at least
 * as long as the plan uses it. Inputs are converted to C-contiguous aligned arrays (a copy only
 * when the layout needs it; never a dtype cast) and are only ever read. Outputs are fresh arrays,
 * or arrays the caller hands to run(out=), written in place (checked not to overlap what the run
 * reads).
 *
 * Threads: the GIL is released around compile, upload, run and output copies. The core plan is
 * not safe from two threads at once, so every use of it takes the plan's own lock; a contended
 * lock is waited for with the GIL released. The lock is never waited for while the GIL is held,
 * and a thread re-entering a plan it is already using (a finalizer during run) gets an exception
 * rather than a deadlock. Memory used while the GIL is released is either Python-owned and pinned
 * by a reference (arrays) or allocated before the release.
 *
 * Not GC-tracked: a Plan refers only to str/tuple objects and to arrays the caller handed over.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include "pythread.h"

#include <string.h>

struct plan_object {
    PyObject_HEAD struct rlx_plan *plan; /* owned; never NULL for a constructed object */
    struct rlx_py_lock lock;             /* held by the one thread using `plan` */
    PyObject *params;                    /* dict: param name -> the array the plan reads */
    PyObject *input_names;               /* tuple of str, in plan input order */
    PyObject *param_names;               /* tuple of str, in plan param order */
    PyObject *output_names;              /* tuple of str, in output order */
    PyObject *device;                    /* _C.Device: outlives the plan */
    int *input_dtypes;                   /* (n_inputs) enum rlx_dtype, -1 when unknown (the core checks) */
    int *param_dtypes;                   /* (n_params) as above */
};

/* ---------------------------------------------------------------------------------------------
 * dtypes
 * ------------------------------------------------------------------------------------------- */

int rlx_py_dtype_matches(PyArray_Descr *d, enum rlx_dtype dt)
{
    if (!PyDataType_ISNOTSWAPPED(d)) return 0;
    npy_intp size = PyDataType_ELSIZE(d);
    char kind = d->kind;
    switch (dt) {
    case RLX_F32: return kind == 'f' && size == 4;
    case RLX_F16: return kind == 'f' && size == 2;
    case RLX_I32: return kind == 'i' && size == 4;
    case RLX_U8: return (kind == 'u' || kind == 'b') && size == 1;
    case RLX_BF16: return size == 2 && (kind == 'u' || strstr(d->typeobj->tp_name, "bfloat16") != NULL);
    default: return 0;
    }
}

int rlx_py_dtype_to_npy(enum rlx_dtype dt)
{
    switch (dt) {
    case RLX_F32: return NPY_FLOAT32;
    case RLX_F16: return NPY_FLOAT16;
    case RLX_I32: return NPY_INT32;
    case RLX_U8: return NPY_UINT8;
    case RLX_BF16: return NPY_UINT16;
    default: return -1;
    }
}

/* The NumPy name of an rlx dtype, for messages. */
static const char *npy_name(int dt)
{
    static const char *const names[RLX_DTYPE_COUNT] = {
        [RLX_F32] = "float32", [RLX_F16] = "float16", [RLX_BF16] = "bfloat16 or uint16",
        [RLX_I32] = "int32",   [RLX_U8] = "uint8",
    };
    return dt >= 0 && dt < RLX_DTYPE_COUNT && names[dt] ? names[dt] : "raw blocks (no array dtype)";
}

/* ---------------------------------------------------------------------------------------------
 * The plan lock
 * ------------------------------------------------------------------------------------------- */

static int plan_acquire(struct plan_object *self) { return rlx_py_lock_acquire(&self->lock, "plan"); }
static void plan_release(struct plan_object *self) { rlx_py_lock_release(&self->lock); }

/* ---------------------------------------------------------------------------------------------
 * Construction (compile) and destruction
 * ------------------------------------------------------------------------------------------- */

/* A tuple of the n names given by name_of(plan, i). */
static PyObject *names_tuple(const struct rlx_plan *p, int n, const char *(*name_of)(const struct rlx_plan *, int))
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        const char *name = name_of(p, i);
        PyObject *s = PyUnicode_FromString(name != NULL ? name : "");
        if (s == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

/* dtypes[i] = the dtype of the compiled graph's node of kind `op` named names[i] (-1 if none). */
static int leaf_dtypes(const struct rlx_plan *p, enum rlx_op kind, PyObject *names, int **out)
{
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    int *dts = PyMem_Malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (dts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) dts[i] = -1;
    const struct rlx_graph *g = rlx_plan_graph(p);
    int count = g != NULL ? rlx_graph_node_count(g) : 0;
    for (int id = 0; id < count; id++) {
        enum rlx_op op;
        enum rlx_dtype dt;
        int ndim;
        struct rlx_dim shape[RLX_MAX_DIMS];
        const char *name;
        if (rlx_graph_node_info(g, id, &op, &dt, &ndim, shape, &name) != RLX_OK || op != kind || name == NULL) continue;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (strcmp(PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i)), name) == 0) dts[i] = (int)dt;
        }
    }
    *out = dts;
    return 0;
}

/* Index of name in the tuple names, or -1 (no exception). */
static Py_ssize_t find_name(PyObject *names, PyObject *name)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        if (PyUnicode_Compare(PyTuple_GET_ITEM(names, i), name) == 0) return i;
    }
    return -1;
}

static void plan_dealloc(struct plan_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    /* The plan goes before the arrays it points into and the device it lives on. */
    rlx_plan_free(self->plan);
    Py_XDECREF(self->params);
    Py_XDECREF(self->input_names);
    Py_XDECREF(self->param_names);
    Py_XDECREF(self->output_names);
    Py_XDECREF(self->device);
    PyMem_Free(self->input_dtypes);
    PyMem_Free(self->param_dtypes);
    rlx_py_lock_fini(&self->lock);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* caps {symbol name: int} into opts->sym_cap, resolved against g without creating symbols. */
static int parse_caps(const struct rlx_graph *g, PyObject *caps, struct rlx_compile_opts *opts)
{
    if (caps == Py_None) return 0;
    if (!PyDict_Check(caps)) {
        PyErr_Format(PyExc_TypeError, "caps must be a dict {symbol: int} or None, got %.200s", Py_TYPE(caps)->tp_name);
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(caps, &pos, &key, &val)) {
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "caps keys must be symbol names (str)");
            return -1;
        }
        const char *name = PyUnicode_AsUTF8(key);
        if (name == NULL) return -1;
        int sym = -1;
        for (int s = 0; s < rlx_graph_symbol_count(g) && s < RLX_MAX_SYMS; s++) {
            const char *sname = rlx_graph_symbol_name(g, s);
            if (sname != NULL && strcmp(sname, name) == 0) sym = s;
        }
        if (sym < 0) {
            PyErr_Format(PyExc_ValueError, "caps: unknown symbol '%s'", name);
            return -1;
        }
        long long v = PyLong_AsLongLong(val);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "caps: symbol '%s' has a negative cap %lld", name, v);
            return -1;
        }
        opts->sym_cap[sym] = (int64_t)v;
    }
    return 0;
}

const char rlx_py_compile_doc[] =
    "compile(graph: Graph, device: str | Device = 'cpu', fuse: bool = True, caps: dict[str, int] | None = None) -> "
    "Plan\n\nCompiles a copy of graph for a device (a name such as 'cpu' or 'ref' opens one for this plan).\n"
    "caps bounds symbols (e.g. {'SEQ': 512}) for capacity planning. The graph is not modified.";

PyObject *rlx_py_compile(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"graph", "device", "fuse", "caps", NULL};
    PyObject *graph_obj, *device_arg = NULL, *device = NULL;
    int fuse = 1;
    PyObject *caps = Py_None;
    struct rlx_graph *copy = NULL;
    struct rlx_plan *plan = NULL;
    struct plan_object *self = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OpO:compile", kwlist, &graph_obj, &device_arg, &fuse, &caps))
        return NULL;
    struct rlx_py_state *st = rlx_py_state_of_module(module);
    if (st == NULL) goto error;
    if (device_arg == NULL) {
        PyObject *cpu = PyUnicode_FromString("cpu");
        device = cpu ? rlx_py_device_from(st, cpu) : NULL;
        Py_XDECREF(cpu);
    } else {
        device = rlx_py_device_from(st, device_arg);
    }
    if (device == NULL) goto error;
    struct rlx_graph *g = rlx_py_graph_get(st, graph_obj);
    if (g == NULL) goto error;
    /* A private copy, so another thread may keep extending g while this one compiles. */
    if (rlx_py_raise(rlx_graph_clone(g, &copy))) goto error;
    struct rlx_compile_opts opts = rlx_compile_opts_default();
    opts.fuse = fuse != 0;
    if (parse_caps(copy, caps, &opts) < 0) goto error;
    rlx_status s;
    struct rlx_device *dev = rlx_py_device_get(device);
    Py_BEGIN_ALLOW_THREADS s = rlx_compile(copy, dev, &opts, &plan);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) goto error;
    rlx_graph_free(copy);
    copy = NULL;

    self = (struct plan_object *)st->plan_type->tp_alloc(st->plan_type, 0);
    if (self == NULL) {
        rlx_plan_free(plan);
        goto error;
    }
    self->plan = plan;
    if (rlx_py_lock_init(&self->lock) < 0) goto error;
    self->params = PyDict_New();
    self->input_names = names_tuple(plan, rlx_plan_input_count(plan), rlx_plan_input_name);
    self->param_names = names_tuple(plan, rlx_plan_param_count(plan), rlx_plan_param_name);
    self->output_names = names_tuple(plan, rlx_plan_output_count(plan), rlx_plan_output_name);
    self->device = device;
    device = NULL;
    if (self->params == NULL || self->input_names == NULL || self->param_names == NULL || self->output_names == NULL ||
        self->device == NULL)
        goto error;
    if (leaf_dtypes(plan, RLX_OP_INPUT, self->input_names, &self->input_dtypes) < 0 ||
        leaf_dtypes(plan, RLX_OP_PARAM, self->param_names, &self->param_dtypes) < 0)
        goto error;
    return (PyObject *)self;
error:
    rlx_graph_free(copy);
    Py_XDECREF(self);
    Py_XDECREF(device);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * set_param / run
 * ------------------------------------------------------------------------------------------- */

/* ", "-joined names, for messages (new reference). */
static PyObject *joined(PyObject *names)
{
    PyObject *sep = PyUnicode_FromString(", ");
    if (sep == NULL) return NULL;
    PyObject *s = PyUnicode_Join(sep, names);
    Py_DECREF(sep);
    return s;
}

/* Index of the `what` (input / param / output) called name in the tuple names; -1 with TypeError
 * (not a str) or ValueError (unknown: the message lists the plan's names). */
static Py_ssize_t name_index(PyObject *names, PyObject *name, const char *what)
{
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "%s names must be str, got %.200s", what, Py_TYPE(name)->tp_name);
        return -1;
    }
    Py_ssize_t i = find_name(names, name);
    if (i >= 0) return i;
    PyObject *all = joined(names);
    if (all == NULL) return -1;
    PyErr_Format(PyExc_ValueError, "unknown %s %R (this plan's %ss: %U)", what, name, what, all);
    Py_DECREF(all);
    return -1;
}

/* Fills t from a C-contiguous aligned array whose dtype has been checked. */
static int host_tensor(PyArrayObject *arr, int dt, const char *what, PyObject *name, struct rlx_host_tensor *t)
{
    int ndim = PyArray_NDIM(arr);
    if (ndim > RLX_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s %R has %d dims; at most %d are supported", what, name, ndim, RLX_MAX_DIMS);
        return -1;
    }
    t->data = PyArray_DATA(arr);
    t->dtype = (enum rlx_dtype)dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = (int64_t)PyArray_DIM(arr, d);
    return 0;
}

/* The dtype an array must have for this input/param; -1 (unknown) accepts what maps to an rlx dtype. */
static int check_dtype(PyArrayObject *arr, int want, const char *what, PyObject *name, int *dt_out)
{
    PyArray_Descr *d = PyArray_DESCR(arr);
    if (want >= 0) {
        if (!rlx_py_dtype_matches(d, (enum rlx_dtype)want)) {
            PyErr_Format(PyExc_ValueError, "%s %R: expected dtype %s (%s), got %S", what, name,
                         rlx_dtype_name((enum rlx_dtype)want), npy_name(want), (PyObject *)d);
            return -1;
        }
        *dt_out = want;
        return 0;
    }
    for (int dt = 0; dt < RLX_DTYPE_COUNT; dt++) {
        if (rlx_py_dtype_matches(d, (enum rlx_dtype)dt)) {
            *dt_out = dt;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "%s %R: dtype %S has no rlx equivalent", what, name, (PyObject *)d);
    return -1;
}

/* set_param of a block-type weight given as (raw uint8 blocks, dtype name, logical shape): the
 * tuple rlx.Packed.raw() makes (checked by rlx_py_host_tensor_from; dtype and shape by the core). */
static PyObject *set_param_blocks(struct plan_object *self, Py_ssize_t idx, PyObject *name, PyObject *tuple)
{
    const char *cname = PyUnicode_AsUTF8(name);
    struct rlx_host_tensor t;
    PyObject *keep = NULL;
    if (cname == NULL || rlx_py_host_tensor_from(tuple, cname, &t, &keep) < 0) return NULL;
    if (plan_acquire(self) < 0) {
        Py_DECREF(keep);
        return NULL;
    }
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_plan_set_param(self->plan, (int)idx, &t);
    Py_END_ALLOW_THREADS int failed = rlx_py_raise(s) || PyDict_SetItem(self->params, name, keep) < 0;
    plan_release(self);
    Py_DECREF(keep);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyObject *plan_set_param(struct plan_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"name", "array", NULL};
    PyObject *name, *obj;
    PyArrayObject *given = NULL;
    PyArrayObject *arr = NULL;
    int locked = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO:set_param", kwlist, &name, &obj)) return NULL;
    Py_ssize_t idx = name_index(self->param_names, name, "param");
    if (idx < 0) goto error;
    if (PyTuple_Check(obj)) return set_param_blocks(self, idx, name, obj);
    given = (PyArrayObject *)PyArray_FROM_O(obj);
    if (given == NULL) goto error;
    int dt;
    if (check_dtype(given, self->param_dtypes[idx], "param", name, &dt) < 0) goto error;
    /* The same object when already C-contiguous and aligned (zero-copy), else one copy. */
    arr = (PyArrayObject *)PyArray_FROM_OF((PyObject *)given, NPY_ARRAY_IN_ARRAY);
    if (arr == NULL) goto error;
    struct rlx_host_tensor t;
    if (host_tensor(arr, dt, "param", name, &t) < 0) goto error;
    if (plan_acquire(self) < 0) goto error;
    locked = 1;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_plan_set_param(self->plan, (int)idx, &t);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) goto error;
    /* The plan now reads arr: keep it (dropping the array it read before). */
    if (PyDict_SetItem(self->params, name, (PyObject *)arr) < 0) goto error;
    plan_release(self);
    Py_DECREF(arr);
    Py_DECREF(given);
    Py_RETURN_NONE;
error:
    if (locked) plan_release(self);
    Py_XDECREF(arr);
    Py_XDECREF(given);
    return NULL;
}

/* True when the bytes of two arrays (contiguous ones: [data, data + nbytes)) intersect. */
static int arrays_overlap(PyArrayObject *a, PyArrayObject *b)
{
    const char *pa = PyArray_DATA(a), *pb = PyArray_DATA(b);
    npy_intp na = PyArray_NBYTES(a), nb = PyArray_NBYTES(b);
    return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

/* Checks run()'s `out` (dict output name -> array, or None) and fills bound[i] with a borrowed
 * reference to output i's array, or NULL. Each array must be an ndarray of the output's dtype,
 * C-contiguous, aligned and writeable, and share no bytes with an input, a param or another
 * out array (the kernels write it while they read those). */
static int check_out(struct plan_object *self, PyObject *out, PyArrayObject **arrs, Py_ssize_t n_in,
                     PyArrayObject **bound)
{
    Py_ssize_t n_out = PyTuple_GET_SIZE(self->output_names);
    if (out == NULL || out == Py_None) return 0;
    if (!PyDict_Check(out)) {
        PyErr_Format(PyExc_TypeError, "run(out=) takes a dict {output name: array}, got %.200s", Py_TYPE(out)->tp_name);
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(out, &pos, &key, &val)) {
        Py_ssize_t i = name_index(self->output_names, key, "output");
        if (i < 0) return -1;
        if (!PyArray_Check(val)) {
            PyErr_Format(PyExc_TypeError, "out %R must be a numpy.ndarray, got %.200s", key, Py_TYPE(val)->tp_name);
            return -1;
        }
        PyArrayObject *a = (PyArrayObject *)val;
        if (!PyArray_ISCARRAY(a)) {
            PyErr_Format(PyExc_ValueError, "out %R must be a writeable, C-contiguous, aligned array", key);
            return -1;
        }
        int dt = rlx_plan_output_dtype(self->plan, (int)i);
        if (!rlx_py_dtype_matches(PyArray_DESCR(a), (enum rlx_dtype)dt)) {
            PyErr_Format(PyExc_ValueError, "out %R must be %s, got %S", key, npy_name(dt),
                         (PyObject *)PyArray_DESCR(a));
            return -1;
        }
        bound[i] = a;
    }
    for (Py_ssize_t i = 0; i < n_out; i++) {
        if (bound[i] == NULL) continue;
        PyObject *name = PyTuple_GET_ITEM(self->output_names, i);
        for (Py_ssize_t j = 0; j < n_in; j++)
            if (arrays_overlap(bound[i], arrs[j])) {
                PyErr_Format(PyExc_ValueError, "out %R shares memory with input %R", name,
                             PyTuple_GET_ITEM(self->input_names, j));
                return -1;
            }
        for (Py_ssize_t j = 0; j < i; j++)
            if (bound[j] != NULL && arrays_overlap(bound[i], bound[j])) {
                PyErr_Format(PyExc_ValueError, "out %R shares memory with out %R", name,
                             PyTuple_GET_ITEM(self->output_names, j));
                return -1;
            }
        pos = 0;
        while (PyDict_Next(self->params, &pos, &key, &val))
            if (PyArray_Check(val) && arrays_overlap(bound[i], (PyArrayObject *)val)) {
                PyErr_Format(PyExc_ValueError, "out %R shares memory with param %R", name, key);
                return -1;
            }
    }
    return 0;
}

static PyObject *plan_run(struct plan_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"inputs", "out", NULL};
    PyObject *inputs, *out = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:run", kwlist, &inputs, &out)) return NULL;
    Py_ssize_t n_in = PyTuple_GET_SIZE(self->input_names);
    Py_ssize_t n_out = PyTuple_GET_SIZE(self->output_names);
    PyArrayObject **arrs = NULL, **bound = NULL;
    struct rlx_host_tensor *tensors = NULL;
    PyObject *outs = NULL;
    int locked = 0;
    rlx_status s = RLX_OK;
    if (!PyDict_Check(inputs)) {
        PyErr_Format(PyExc_TypeError, "run() takes a dict {input name: array}, got %.200s", Py_TYPE(inputs)->tp_name);
        goto error;
    }
    arrs = PyMem_Calloc((size_t)(n_in > 0 ? n_in : 1), sizeof *arrs);
    tensors = PyMem_Calloc((size_t)(n_in > 0 ? n_in : 1), sizeof *tensors);
    bound = PyMem_Calloc((size_t)(n_out > 0 ? n_out : 1), sizeof *bound);
    if (arrs == NULL || tensors == NULL || bound == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(inputs, &pos, &key, &val)) {
        if (name_index(self->input_names, key, "input") < 0) goto error;
    }
    for (Py_ssize_t i = 0; i < n_in; i++) {
        PyObject *name = PyTuple_GET_ITEM(self->input_names, i);
        PyObject *item = PyDict_GetItemWithError(inputs, name);
        if (item == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "missing input %R", name);
            goto error;
        }
        arrs[i] = (PyArrayObject *)PyArray_FROM_OF(item, NPY_ARRAY_IN_ARRAY);
        if (arrs[i] == NULL) goto error;
        int dt;
        if (check_dtype(arrs[i], self->input_dtypes[i], "input", name, &dt) < 0 ||
            host_tensor(arrs[i], dt, "input", name, &tensors[i]) < 0)
            goto error;
    }
    if (check_out(self, out, arrs, n_in, bound) < 0) goto error;
    if (plan_acquire(self) < 0) goto error;
    locked = 1;
    rlx_py_sigint_begin();
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n_in && s == RLX_OK; i++) s =
        rlx_plan_set_input(self->plan, (int)i, &tensors[i]);
    for (Py_ssize_t i = 0; i < n_out && s == RLX_OK; i++)
        if (bound[i] != NULL)
            s = rlx_plan_bind_output(self->plan, (int)i, PyArray_DATA(bound[i]), (size_t)PyArray_NBYTES(bound[i]));
    if (s == RLX_OK) s = rlx_plan_run(self->plan);
    Py_END_ALLOW_THREADS if (rlx_py_sigint_end(s) < 0 || rlx_py_raise(s)) goto error;
    outs = PyList_New(n_out);
    if (outs == NULL) goto error;
    for (Py_ssize_t i = 0; i < n_out; i++) {
        enum rlx_dtype dt;
        int ndim;
        int64_t shape[RLX_MAX_DIMS];
        if (rlx_py_raise(rlx_plan_output_shape(self->plan, (int)i, &dt, &ndim, shape))) goto error;
        npy_intp dims[RLX_MAX_DIMS];
        for (int d = 0; d < ndim; d++) dims[d] = (npy_intp)shape[d];
        if (bound[i] != NULL) { /* written by the run; its shape must be the output's too */
            if (PyArray_NDIM(bound[i]) != ndim || !PyArray_CompareLists(PyArray_DIMS(bound[i]), dims, ndim)) {
                PyErr_Format(PyExc_ValueError, "out %R has the output's size but not its shape",
                             PyTuple_GET_ITEM(self->output_names, i));
                goto error;
            }
            Py_INCREF(bound[i]);
            PyList_SET_ITEM(outs, i, (PyObject *)bound[i]);
            continue;
        }
        PyObject *o = PyArray_SimpleNew(ndim, dims, rlx_py_dtype_to_npy(dt));
        if (o == NULL) goto error;
        PyList_SET_ITEM(outs, i, o);
    }
    /* The fresh arrays are reachable only from this thread: fill them without the GIL. */
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n_out && s == RLX_OK; i++)
    {
        if (bound[i] != NULL) continue;
        PyArrayObject *o = (PyArrayObject *)PyList_GET_ITEM(outs, i);
        s = rlx_plan_read_output(self->plan, (int)i, PyArray_DATA(o), (size_t)PyArray_NBYTES(o));
    }
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) goto error;
    plan_release(self);
    for (Py_ssize_t i = 0; i < n_in; i++) Py_DECREF(arrs[i]);
    PyMem_Free(arrs);
    PyMem_Free(tensors);
    PyMem_Free(bound);
    return outs;
error:
    if (locked) plan_release(self);
    if (arrs != NULL) {
        for (Py_ssize_t i = 0; i < n_in; i++) Py_XDECREF(arrs[i]);
    }
    PyMem_Free(arrs);
    PyMem_Free(tensors);
    PyMem_Free(bound);
    Py_XDECREF(outs);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Inspection
 * ------------------------------------------------------------------------------------------- */

static PyObject *plan_graph_dump(struct plan_object *self, PyObject *unused)
{
    (void)unused;
    if (plan_acquire(self) < 0) return NULL;
    PyObject *s = rlx_py_dump_graph(rlx_plan_graph(self->plan));
    plan_release(self);
    return s;
}

static PyObject *plan_bytes(struct plan_object *self, size_t (*fn)(const struct rlx_plan *))
{
    if (plan_acquire(self) < 0) return NULL;
    size_t n = fn(self->plan);
    plan_release(self);
    return PyLong_FromSize_t(n);
}

static PyObject *plan_get_planned_bytes(struct plan_object *self, void *closure)
{
    (void)closure;
    return plan_bytes(self, rlx_plan_planned_bytes);
}

static PyObject *plan_get_unshared_bytes(struct plan_object *self, void *closure)
{
    (void)closure;
    return plan_bytes(self, rlx_plan_unshared_bytes);
}

static PyObject *plan_get_inputs(struct plan_object *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->input_names);
}

static PyObject *plan_get_params(struct plan_object *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->param_names);
}

static PyObject *plan_get_outputs(struct plan_object *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->output_names);
}

static PyObject *plan_get_device(struct plan_object *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(rlx_device_name(rlx_py_device_get(self->device)));
}

static PyObject *plan_repr(struct plan_object *self)
{
    return PyUnicode_FromFormat("<rlx.Plan device='%s' inputs=%R params=%zd outputs=%R>",
                                rlx_device_name(rlx_py_device_get(self->device)), self->input_names,
                                PyTuple_GET_SIZE(self->param_names), self->output_names);
}

static PyMethodDef plan_methods[] = {
    {"set_param", (PyCFunction)(void (*)(void))plan_set_param, METH_VARARGS | METH_KEYWORDS,
     "set_param(name: str, array: np.ndarray) -> None\n\n"
     "Binds a weight. Zero-copy when the array is C-contiguous, aligned and of the param's dtype (the plan\n"
     "keeps a reference; later writes to the array are seen by later runs on host backends); a matching\n"
     "dtype with another layout is copied once. A block-type (GGUF) param takes the tuple (raw uint8 blocks,\n"
     "dtype name, logical shape), as rlx.Packed.raw() gives. Wrong dtype or shape, or an unknown name:\n"
     "ValueError."},
    {"run", (PyCFunction)(void (*)(void))plan_run, METH_VARARGS | METH_KEYWORDS,
     "run(inputs: dict[str, np.ndarray], out: dict[str, np.ndarray] | None = None) -> list[np.ndarray]\n\n"
     "Runs the plan; returns the output arrays in output order: fresh ones, or for the outputs named in\n"
     "`out` the given arrays, written by the run (on host backends by the kernels themselves: no copy, no\n"
     "arena space). An out array must be a writeable C-contiguous aligned ndarray of the output's dtype\n"
     "and shape sharing no memory with an input, a param or another out array (else ValueError; its\n"
     "contents are undefined after a failed run). Inputs are never modified and never cast: a dtype\n"
     "mismatch, a missing or unknown input raises ValueError. Releases the GIL; threads sharing one plan\n"
     "take turns."},
    {"graph_dump", (PyCFunction)plan_graph_dump, METH_NOARGS, "graph_dump() -> str\n\nThe compiled graph."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"planned_bytes", (getter)plan_get_planned_bytes, NULL,
     "Bytes of the intermediate arena for the last run (before a run: for the caps or constant shapes).", NULL},
    {"unshared_bytes", (getter)plan_get_unshared_bytes, NULL, "Sum of all intermediates' sizes without reuse.", NULL},
    {"inputs", (getter)plan_get_inputs, NULL, "Input names, in order.", NULL},
    {"params", (getter)plan_get_params, NULL, "Param names, in order.", NULL},
    {"outputs", (getter)plan_get_outputs, NULL, "Output names, in the order run() returns them.", NULL},
    {"device", (getter)plan_get_device, NULL, "The name of the device this plan runs on.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_doc, (void *)"A compiled graph for one backend; made by rlx.compile()."},
    {Py_tp_dealloc, (void *)plan_dealloc},
    {Py_tp_repr, (void *)plan_repr},
    {Py_tp_methods, plan_methods},
    {Py_tp_getset, plan_getset},
    {0, NULL},
};

static PyType_Spec plan_spec = {
    .name = "rlx._C.Plan",
    .basicsize = sizeof(struct plan_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = plan_slots,
};

int rlx_py_add_plan_type(PyObject *module, struct rlx_py_state *st)
{
    st->plan_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &plan_spec, NULL);
    if (st->plan_type == NULL) return -1;
    return PyModule_AddType(module, st->plan_type);
}
