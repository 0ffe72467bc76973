/*
 * graph_type.c - _C.Graph: a thin, checked wrapper of struct rlx_graph (the graph builder).
 *
 * Values are plain ints (node ids). Dims cross the boundary in one encoded form, produced by
 * rlx/graph.py from strings like "2*SEQ+1":
 *     dim   := int                                  a constant
 *            | (c: int, terms: [(symbol: str, coef: int), ...])   c + sum coef * symbol
 * Symbols are looked up (and created) by name in the graph. Attributes come as a dict whose keys
 * are the fields of struct rlx_attrs (eps, scale, trans_b, causal, window, axis, start, len, dtype, k, norm,
 * shape); an unknown key is a ValueError naming it.
 *
 * Every method runs with the GIL held and is cheap (shape inference only); the GIL is what keeps
 * two Python threads from using one builder at once. rlx_py_compile copies the builder with the
 * GIL held before it releases the GIL, so a graph being extended while another thread compiles it
 * is safe. Nothing here ever aborts on user input: bad values become exceptions.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <stdint.h>
#include <string.h>

struct graph_object {
    PyObject_HEAD struct rlx_graph *g; /* owned; never NULL after tp_new */
};

struct rlx_graph *rlx_py_graph_get(struct rlx_py_state *st, PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, st->graph_type)) {
        PyErr_Format(PyExc_TypeError, "expected an rlx._C.Graph, got %.200s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((struct graph_object *)obj)->g;
}

/* ---------------------------------------------------------------------------------------------
 * Conversions
 * ------------------------------------------------------------------------------------------- */

static int as_int64(PyObject *o, const char *what, int64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.200s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s is out of range", what);
        }
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static int as_int32(PyObject *o, const char *what, int32_t *out)
{
    int64_t v;
    if (as_int64(o, what, &v) < 0) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s is out of range: %lld", what, (long long)v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* A str argument as UTF-8 (borrowed from the str object). */
static const char *as_utf8(PyObject *o, const char *what)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, got %.200s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    return PyUnicode_AsUTF8(o);
}

/* One encoded dim (see the note at the top) into *d. */
static int parse_dim(struct rlx_graph *g, PyObject *o, struct rlx_dim *d)
{
    PyObject *terms = NULL;
    PyObject *term = NULL;
    if (PyLong_Check(o)) {
        int64_t c;
        if (as_int64(o, "dim", &c) < 0) goto error;
        *d = rlx_dim_const(c);
        return 0;
    }
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
        PyErr_Format(PyExc_TypeError, "a dim must be an int or a tuple (c, [(symbol, coef), ...]), got %.200R", o);
        goto error;
    }
    int64_t c;
    if (as_int64(PyTuple_GET_ITEM(o, 0), "dim constant", &c) < 0) goto error;
    *d = rlx_dim_const(c);
    terms = PySequence_Fast(PyTuple_GET_ITEM(o, 1), "dim terms must be a sequence of (symbol, coef)");
    if (terms == NULL) goto error;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(terms); i++) {
        term = PySequence_Fast(PySequence_Fast_GET_ITEM(terms, i), "a dim term must be a (symbol, coef) pair");
        if (term == NULL) goto error;
        if (PySequence_Fast_GET_SIZE(term) != 2) {
            PyErr_SetString(PyExc_TypeError, "a dim term must be a (symbol, coef) pair");
            goto error;
        }
        const char *name = as_utf8(PySequence_Fast_GET_ITEM(term, 0), "symbol name");
        int32_t coef;
        if (name == NULL || as_int32(PySequence_Fast_GET_ITEM(term, 1), "symbol coefficient", &coef) < 0) goto error;
        int sym;
        if (rlx_py_raise(rlx_graph_symbol(g, name, &sym))) goto error;
        if (sym < 0 || sym >= RLX_MAX_SYMS) {
            PyErr_Format(PyExc_ValueError, "symbol '%s' has index %d outside [0, %d)", name, sym, RLX_MAX_SYMS);
            goto error;
        }
        int64_t sum = (int64_t)d->coef[sym] + coef;
        if (sum < INT32_MIN || sum > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "coefficient of symbol '%s' is out of range", name);
            goto error;
        }
        d->coef[sym] = (int32_t)sum;
        Py_CLEAR(term);
    }
    Py_DECREF(terms);
    return 0;
error:
    Py_XDECREF(term);
    Py_XDECREF(terms);
    return -1;
}

/* A sequence of encoded dims into shape[RLX_MAX_DIMS]; sets *ndim. */
static int parse_dims(struct rlx_graph *g, PyObject *o, int *ndim, struct rlx_dim *shape)
{
    PyObject *seq = PySequence_Fast(o, "dims must be a sequence of dims");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > RLX_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%zd dims given; at most %d are supported", n, RLX_MAX_DIMS);
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parse_dim(g, PySequence_Fast_GET_ITEM(seq, i), &shape[i]) < 0) goto error;
    }
    *ndim = (int)n;
    Py_DECREF(seq);
    return 0;
error:
    Py_DECREF(seq);
    return -1;
}

/* The attrs dict into *a (zeroed first). None leaves everything zero. */
static int parse_attrs(struct rlx_graph *g, const char *op_name, PyObject *dict, struct rlx_attrs *a)
{
    memset(a, 0, sizeof *a);
    if (dict == Py_None) return 0;
    if (!PyDict_Check(dict)) {
        PyErr_Format(PyExc_TypeError, "attrs must be a dict or None, got %.200s", Py_TYPE(dict)->tp_name);
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(dict, &pos, &key, &val)) {
        const char *k = as_utf8(key, "attribute name");
        if (k == NULL) return -1;
        if (strcmp(k, "eps") == 0 || strcmp(k, "scale") == 0) {
            double v = PyFloat_AsDouble(val);
            if (v == -1.0 && PyErr_Occurred()) return -1;
            *(k[0] == 'e' ? &a->eps : &a->scale) = (float)v;
        } else if (strcmp(k, "trans_b") == 0 || strcmp(k, "causal") == 0 || strcmp(k, "interleaved") == 0 ||
                   strcmp(k, "norm") == 0) {
            int v = PyObject_IsTrue(val);
            if (v < 0) return -1;
            *(k[0] == 't' ? &a->trans_b : k[0] == 'c' ? &a->causal : k[0] == 'i' ? &a->interleaved : &a->norm) = v;
        } else if (strcmp(k, "k") == 0) {
            if (as_int32(val, "attribute 'k'", &a->k) < 0) return -1;
        } else if (strcmp(k, "window") == 0) {
            if (as_int64(val, "attribute 'window'", &a->window) < 0) return -1;
        } else if (strcmp(k, "axis") == 0) {
            if (as_int32(val, "attribute 'axis'", &a->axis) < 0) return -1;
        } else if (strcmp(k, "start") == 0) {
            if (as_int64(val, "attribute 'start'", &a->start) < 0) return -1;
        } else if (strcmp(k, "len") == 0) {
            if (as_int64(val, "attribute 'len'", &a->len) < 0) return -1;
        } else if (strcmp(k, "shape") == 0) {
            int ndim;
            if (parse_dims(g, val, &ndim, a->shape) < 0) return -1;
            a->ndim = ndim;
        } else if (strcmp(k, "dtype") == 0) {
            const char *name = as_utf8(val, "attribute 'dtype'");
            enum rlx_dtype dt;
            if (name == NULL || rlx_py_raise(rlx_dtype_parse(name, &dt))) return -1;
            a->dtype = (int32_t)dt;
        } else {
            PyErr_Format(PyExc_ValueError,
                         "unknown attribute '%s' for op '%s' (known: eps, scale, trans_b, causal, window, "
                         "axis, start, len, shape, dtype, interleaved, k, norm)",
                         k, op_name);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Methods
 * ------------------------------------------------------------------------------------------- */

static PyObject *graph_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Graph() takes no arguments");
        return NULL;
    }
    struct graph_object *self = (struct graph_object *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (rlx_py_raise(rlx_graph_create(&self->g))) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void graph_dealloc(struct graph_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    rlx_graph_free(self->g);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* input(name, dtype, dims) / param(name, dtype, dims) -> id */
static PyObject *graph_leaf(struct graph_object *self, PyObject *args, PyObject *kwargs, int is_param)
{
    static char *kwlist[] = {"name", "dtype", "dims", NULL};
    const char *name, *dtype_name;
    PyObject *dims;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, is_param ? "ssO:param" : "ssO:input", kwlist, &name, &dtype_name,
                                     &dims))
        return NULL;
    enum rlx_dtype dt;
    if (rlx_py_raise(rlx_dtype_parse(dtype_name, &dt))) return NULL;
    int ndim;
    struct rlx_dim shape[RLX_MAX_DIMS];
    if (parse_dims(self->g, dims, &ndim, shape) < 0) return NULL;
    int id;
    rlx_status s = is_param ? rlx_graph_param(self->g, name, dt, ndim, shape, &id)
                            : rlx_graph_input(self->g, name, dt, ndim, shape, &id);
    if (rlx_py_raise(s)) return NULL;
    return PyLong_FromLong(id);
}

static PyObject *graph_input(struct graph_object *self, PyObject *args, PyObject *kwargs)
{
    return graph_leaf(self, args, kwargs, 0);
}

static PyObject *graph_param(struct graph_object *self, PyObject *args, PyObject *kwargs)
{
    return graph_leaf(self, args, kwargs, 1);
}

/* op(op_name, inputs, attrs=None) -> id */
static PyObject *graph_op(struct graph_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"op", "inputs", "attrs", NULL};
    const char *op_name;
    PyObject *inputs_obj;
    PyObject *attrs_obj = Py_None;
    PyObject *seq = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|O:op", kwlist, &op_name, &inputs_obj, &attrs_obj)) return NULL;
    enum rlx_op op;
    if (rlx_py_raise(rlx_op_parse(op_name, &op))) goto error;
    seq = PySequence_Fast(inputs_obj, "inputs must be a sequence of node ids");
    if (seq == NULL) goto error;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > RLX_MAX_INPUTS) {
        PyErr_Format(PyExc_ValueError, "op '%s': %zd inputs given; at most %d are supported", op_name, n,
                     RLX_MAX_INPUTS);
        goto error;
    }
    int in[RLX_MAX_INPUTS];
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t v;
        if (as_int32(PySequence_Fast_GET_ITEM(seq, i), "a node id", &v) < 0) goto error;
        in[i] = v;
    }
    struct rlx_attrs attrs;
    if (parse_attrs(self->g, op_name, attrs_obj, &attrs) < 0) goto error;
    int id;
    if (rlx_py_raise(rlx_graph_op(self->g, op, (int)n, in, &attrs, &id))) goto error;
    Py_DECREF(seq);
    return PyLong_FromLong(id);
error:
    Py_XDECREF(seq);
    return NULL;
}

/* output(id, name) */
static PyObject *graph_output(struct graph_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"id", "name", NULL};
    int id;
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "is:output", kwlist, &id, &name)) return NULL;
    if (rlx_py_raise(rlx_graph_output(self->g, id, name))) return NULL;
    Py_RETURN_NONE;
}

/* symbol(name) -> index */
static PyObject *graph_symbol(struct graph_object *self, PyObject *arg)
{
    const char *name = as_utf8(arg, "symbol name");
    if (name == NULL) return NULL;
    int sym;
    if (rlx_py_raise(rlx_graph_symbol(self->g, name, &sym))) return NULL;
    return PyLong_FromLong(sym);
}

/* info(id) -> (op_name, dtype_name, (dim strings...), name) */
static PyObject *graph_info(struct graph_object *self, PyObject *arg)
{
    int32_t id;
    if (as_int32(arg, "node id", &id) < 0) return NULL;
    enum rlx_op op;
    enum rlx_dtype dt;
    int ndim;
    struct rlx_dim shape[RLX_MAX_DIMS];
    const char *name;
    if (rlx_py_raise(rlx_graph_node_info(self->g, id, &op, &dt, &ndim, shape, &name))) return NULL;
    PyObject *dims = PyTuple_New(ndim);
    if (dims == NULL) return NULL;
    for (int i = 0; i < ndim; i++) {
        char buf[256];
        rlx_dim_format(self->g, &shape[i], buf, sizeof buf);
        PyObject *s = PyUnicode_FromString(buf);
        if (s == NULL) {
            Py_DECREF(dims);
            return NULL;
        }
        PyTuple_SET_ITEM(dims, i, s);
    }
    return Py_BuildValue("(ssNs)", rlx_op_name(op), rlx_dtype_name(dt), dims, name != NULL ? name : "");
}

PyObject *rlx_py_dump_graph(const struct rlx_graph *g)
{
    size_t need = rlx_graph_dump(g, NULL, 0);
    char *buf = PyMem_Malloc(need + 1);
    if (buf == NULL) return PyErr_NoMemory();
    rlx_graph_dump(g, buf, need + 1);
    PyObject *s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
    PyMem_Free(buf);
    return s;
}

static PyObject *graph_dump(struct graph_object *self, PyObject *unused)
{
    (void)unused;
    return rlx_py_dump_graph(self->g);
}

static PyObject *graph_get_node_count(struct graph_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(rlx_graph_node_count(self->g));
}

static PyMethodDef graph_methods[] = {
    {"input", (PyCFunction)(void (*)(void))graph_input, METH_VARARGS | METH_KEYWORDS,
     "input(name: str, dtype: str, dims) -> int\n\nA named runtime input; returns its node id."},
    {"param", (PyCFunction)(void (*)(void))graph_param, METH_VARARGS | METH_KEYWORDS,
     "param(name: str, dtype: str, dims) -> int\n\nA named weight (bound with Plan.set_param)."},
    {"op", (PyCFunction)(void (*)(void))graph_op, METH_VARARGS | METH_KEYWORDS,
     "op(op: str, inputs: list[int], attrs: dict | None = None) -> int\n\nA compute node; shape errors raise "
     "ValueError naming the node, the op and the shapes."},
    {"output", (PyCFunction)(void (*)(void))graph_output, METH_VARARGS | METH_KEYWORDS,
     "output(id: int, name: str) -> None\n\nMarks a value as a named output (in call order)."},
    {"symbol", (PyCFunction)graph_symbol, METH_O, "symbol(name: str) -> int\n\nThe symbol's index, created if new."},
    {"info", (PyCFunction)graph_info, METH_O,
     "info(id: int) -> (op: str, dtype: str, dims: tuple[str, ...], name: str)"},
    {"dump", (PyCFunction)graph_dump, METH_NOARGS, "dump() -> str\n\nA readable listing of the graph."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef graph_getset[] = {
    {"node_count", (getter)graph_get_node_count, NULL, "Number of nodes (inputs and params included).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot graph_slots[] = {
    {Py_tp_doc, (void *)"Graph()\n\nThe graph builder of the rlx core. Most code uses rlx.Graph, which wraps it."},
    {Py_tp_new, (void *)graph_new},
    {Py_tp_dealloc, (void *)graph_dealloc},
    {Py_tp_methods, graph_methods},
    {Py_tp_getset, graph_getset},
    {0, NULL},
};

static PyType_Spec graph_spec = {
    .name = "rlx._C.Graph",
    .basicsize = sizeof(struct graph_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = graph_slots,
};

int rlx_py_add_graph_type(PyObject *module, struct rlx_py_state *st)
{
    st->graph_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &graph_spec, NULL);
    if (st->graph_type == NULL) return -1;
    return PyModule_AddType(module, st->graph_type);
}
