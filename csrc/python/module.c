/*
 * module.c - the extension module rlx._C: multi-phase initialisation, the module state, the
 * NumPy C-API import, and the small module-level functions (build facts, threads, backends).
 *
 * Each type lives in its own file and exposes one add_type function; the exec slot calls them in
 * the order of the `add_types` table below, so adding a type is one line there. This file never
 * holds type-specific code and never keeps Python objects in C globals (the one exception,
 * rlx_py_error_borrowed, is a borrowed alias of the state's rlx.Error; see bindings.h).
 *
 * The core's log callback (rlx_set_log_callback) is process-wide; set_log_callback installs a
 * trampoline whose user pointer is this module's state, so the Python callable lives in the state
 * and is read only with the GIL held (the core may log from any thread, GIL held or not).
 */
#include "bindings.h"

#include <limits.h>
#include <string.h>

/* One per type file, called in order by module_exec. */
static int (*const add_types[])(PyObject *module, struct rlx_py_state *st) = {
    rlx_py_add_device_type, rlx_py_add_graph_type, rlx_py_add_plan_type,
    rlx_py_add_model_type,  rlx_py_add_seq_type,   rlx_py_add_transport_type,
};

/* ---------------------------------------------------------------------------------------------
 * Module functions
 * ------------------------------------------------------------------------------------------- */

/* rlx_build_info()'s "key=value" lines as a dict of str, plus num_threads. */
static PyObject *build_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *info = rlx_py_key_values(rlx_build_info());
    PyObject *value = info ? PyLong_FromLong(rlx_get_num_threads()) : NULL;
    if (value == NULL || PyDict_SetItemString(info, "num_threads", value) < 0) Py_CLEAR(info);
    Py_XDECREF(value);
    return info;
}

/* The dtype traits table: a tuple of dicts (id, name, block_size, type_size, is_float) in enum
 * order, from which rlx.dtypes builds the Python side's tables. */
static PyObject *dtypes(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *out = PyTuple_New(RLX_DTYPE_COUNT);
    for (int dt = 0; out && dt < RLX_DTYPE_COUNT; dt++) {
        const struct rlx_dtype_traits *t = rlx_dtype_traits((enum rlx_dtype)dt);
        PyObject *row =
            Py_BuildValue("{s:i,s:s,s:L,s:n,s:O}", "id", dt, "name", t->name, "block_size", (long long)t->block_size,
                          "type_size", (Py_ssize_t)t->type_size, "is_float", t->is_float ? Py_True : Py_False);
        if (row == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, dt, row);
    }
    return out;
}

static PyObject *set_num_threads(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n > INT_MAX || n < INT_MIN) {
        PyErr_Format(PyExc_ValueError, "set_num_threads: %ld is out of range", n);
        return NULL;
    }
    /* Resizing the pool may wait for its workers: never hold the GIL for that. */
    Py_BEGIN_ALLOW_THREADS rlx_set_num_threads((int)n);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *get_num_threads(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(rlx_get_num_threads());
}

/* rlx_backends() "cpu,ref" -> ["cpu", "ref"] */
static PyObject *backends(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *list = PyList_New(0);
    PyObject *item = NULL;
    if (list == NULL) goto error;
    const char *p = rlx_backends();
    while (p != NULL && *p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (n > 0) {
            item = PyUnicode_FromStringAndSize(p, (Py_ssize_t)n);
            if (item == NULL || PyList_Append(list, item) < 0) goto error;
            Py_CLEAR(item);
        }
        p = comma != NULL ? comma + 1 : p + n;
    }
    return list;
error:
    Py_XDECREF(item);
    Py_XDECREF(list);
    return NULL;
}

/* rlx_devices_describe()'s records as a list of dicts of str. */
static PyObject *devices(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    char buf[16384];
    Py_BEGIN_ALLOW_THREADS rlx_devices_describe(buf, sizeof buf); /* the first call probes the Vulkan driver */
    Py_END_ALLOW_THREADS PyObject *list = PyList_New(0);
    for (char *rec = buf; list && *rec;) {
        char *end = strstr(rec, "\n\n");
        if (end) end[1] = '\0';
        PyObject *d = rlx_py_key_values(rec);
        if (!d || PyList_Append(list, d) < 0) Py_CLEAR(list);
        Py_XDECREF(d);
        rec = end ? end + 2 : rec + strlen(rec);
    }
    return list;
}

/* to_f32(raw, dtype) -> float32 array: the dtype table's conversion of whole blocks (the oracle
 * tests hold against gguf-py's dequantize). raw: a C-contiguous uint8 array of whole blocks. */
static PyObject *to_f32(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *raw_obj;
    const char *name;
    if (!PyArg_ParseTuple(args, "Os:to_f32", &raw_obj, &name)) return NULL;
    enum rlx_dtype dt;
    if (rlx_py_raise(rlx_dtype_parse(name, &dt))) return NULL;
    const struct rlx_dtype_traits *t = rlx_dtype_traits(dt);
    PyArrayObject *raw = (PyArrayObject *)PyArray_FROM_OTF(raw_obj, NPY_UINT8, NPY_ARRAY_IN_ARRAY);
    if (raw == NULL) return NULL;
    PyObject *out = NULL;
    const size_t nbytes = (size_t)PyArray_NBYTES(raw);
    if (nbytes % t->type_size) {
        PyErr_Format(PyExc_ValueError, "%zu bytes are not whole %s blocks of %zu bytes", nbytes, t->name, t->type_size);
        goto done;
    }
    npy_intp n = (npy_intp)(nbytes / t->type_size) * (npy_intp)t->block_size;
    out = PyArray_SimpleNew(1, &n, NPY_FLOAT32);
    if (out) {
        const void *src = PyArray_DATA(raw);
        float *dst = PyArray_DATA((PyArrayObject *)out);
        Py_BEGIN_ALLOW_THREADS t->to_f32(dst, src, (int64_t)n);
        Py_END_ALLOW_THREADS
    }
done:
    Py_DECREF(raw);
    return out;
}

/* blocks_nonfinite(raw, dtype) -> int: rlx_blocks_nonfinite over whole blocks (-1: none). */
static PyObject *blocks_nonfinite(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *raw_obj;
    const char *name;
    if (!PyArg_ParseTuple(args, "Os:blocks_nonfinite", &raw_obj, &name)) return NULL;
    enum rlx_dtype dt;
    if (rlx_py_raise(rlx_dtype_parse(name, &dt))) return NULL;
    const struct rlx_dtype_traits *t = rlx_dtype_traits(dt);
    PyArrayObject *raw = (PyArrayObject *)PyArray_FROM_OTF(raw_obj, NPY_UINT8, NPY_ARRAY_IN_ARRAY);
    if (raw == NULL) return NULL;
    const size_t nbytes = (size_t)PyArray_NBYTES(raw);
    PyObject *out = NULL;
    if (nbytes % t->type_size) {
        PyErr_Format(PyExc_ValueError, "%zu bytes are not whole %s blocks of %zu bytes", nbytes, t->name, t->type_size);
    } else {
        int64_t bad;
        Py_BEGIN_ALLOW_THREADS bad =
            rlx_blocks_nonfinite(dt, PyArray_DATA(raw), (int64_t)(nbytes / t->type_size) * t->block_size);
        Py_END_ALLOW_THREADS out = PyLong_FromLongLong(bad);
    }
    Py_DECREF(raw);
    return out;
}

/* quantize(x, dtype) -> uint8 array (rows, bytes per row): x (..., cols) converted to float32 (a
 * copy only when it is not C-contiguous float32), each row of cols values quantised to dtype by
 * rlx_quantize with the GIL released; rows = the product of the leading dims (1 for a vector). */
static PyObject *quantize(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *x_obj;
    const char *name;
    if (!PyArg_ParseTuple(args, "Os:quantize", &x_obj, &name)) return NULL;
    enum rlx_dtype dt;
    if (rlx_py_raise(rlx_dtype_parse(name, &dt))) return NULL;
    PyArrayObject *x = (PyArrayObject *)PyArray_FROM_OTF(x_obj, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (x == NULL) return NULL;
    PyObject *out = NULL;
    const int nd = PyArray_NDIM(x);
    if (nd < 1) {
        PyErr_SetString(PyExc_ValueError, "quantize: x must have at least one dimension");
        goto done;
    }
    const npy_intp cols = PyArray_DIM(x, nd - 1), rows = cols ? PyArray_SIZE(x) / cols : 0;
    size_t row_bytes;
    if (rlx_py_raise(rlx_dtype_bytes(dt, cols, &row_bytes))) goto done;
    npy_intp dims[2] = {rows, (npy_intp)row_bytes};
    out = PyArray_SimpleNew(2, dims, NPY_UINT8);
    if (out == NULL) goto done;
    const float *src = PyArray_DATA(x);
    void *dst = PyArray_DATA((PyArrayObject *)out);
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_quantize(dt, src, (int64_t)rows, (int64_t)cols, dst);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) Py_CLEAR(out);
done:
    Py_DECREF(x);
    return out;
}

/* The core's log callback: takes the GIL (the core may log from a pool thread, or from a thread
 * that released it around a run), calls st->log_callback(level, msg), and reports an exception it
 * raises as unraisable (a log line must never fail a run). Nothing once the interpreter is going. */
static void log_trampoline(enum rlx_log_level level, const char *msg, void *user)
{
#if PY_VERSION_HEX >= 0x030D0000
    if (!Py_IsInitialized() || Py_IsFinalizing()) return;
#else
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
#endif
    struct rlx_py_state *st = user;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *fn = st->log_callback;
    if (fn != NULL) {
        Py_INCREF(fn); /* the callback may replace itself */
        PyObject *r = PyObject_CallFunction(fn, "is", (int)level, msg);
        if (r == NULL) PyErr_WriteUnraisable(fn);
        Py_XDECREF(r);
        Py_DECREF(fn);
    }
    PyGILState_Release(gil);
}

static PyObject *set_log_callback(PyObject *module, PyObject *fn)
{
    struct rlx_py_state *st = rlx_py_state_of_module(module);
    if (st == NULL) return NULL;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "set_log_callback: expected a callable or None, got %T", fn);
        return NULL;
    }
    if (fn == Py_None) {
        rlx_set_log_callback(NULL, NULL);
        Py_CLEAR(st->log_callback);
    } else {
        Py_XSETREF(st->log_callback, Py_NewRef(fn));
        rlx_set_log_callback(log_trampoline, st);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"set_log_callback", set_log_callback, METH_O,
     "set_log_callback(fn: Callable[[int, str], object] | None) -> None\n\nfn(level, message) receives the core's "
     "log lines (level 0 debug, 1 info, 2 warning), from any thread, with the GIL held; None stops them. "
     "rlx.logs routes them to the logging module (logger 'rlx.core')."},
    {"build_info", build_info, METH_NOARGS,
     "build_info() -> dict[str, str | int]\n\nStatic build facts (blas, blas_config, cc, cflags, isa, "
     "backends) plus the current num_threads."},
    {"set_num_threads", set_num_threads, METH_O,
     "set_num_threads(n: int) -> None\n\nThreads for the CPU kernels and OpenBLAS together; n <= 0 "
     "restores the default (online CPUs)."},
    {"get_num_threads", get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"backends", backends, METH_NOARGS,
     "backends() -> list[str]\n\nThe backends compiled in that can run here (\"vulkan\" only with a usable device)."},
    {"devices", devices, METH_NOARGS,
     "devices() -> list[dict[str, str]]\n\nThe devices that can be opened: name, backend, and for a GPU its name, "
     "driver, type, subgroup size, memory and limits."},
    {"to_f32", to_f32, METH_VARARGS,
     "to_f32(raw: uint8 array of whole blocks, dtype: str) -> float32 array\n\nThe core's conversion of a dtype's "
     "blocks to f32 (dequantisation for the GGUF block types)."},
    {"blocks_nonfinite", blocks_nonfinite, METH_VARARGS,
     "blocks_nonfinite(raw: uint8 array of whole blocks, dtype: str) -> int\n\nThe first block whose f16 scale or "
     "minimum is NaN or infinite, or -1 (always -1 for dtypes without scales). Weights with one are refused."},
    {"quantize", quantize, METH_VARARGS,
     "quantize(x: float array (..., cols), dtype: str) -> uint8 array (rows, bytes per row)\n\nEach row of x "
     "(as float32) converted to dtype: f32, f16, bf16 or a GGUF block type, quantised as gguf-py / ggml do (GIL "
     "released). ValueError for rows that are not whole blocks, NaN or inf in x, or values too large for the "
     "dtype's f16 scales."},
    {"dtypes", dtypes, METH_NOARGS,
     "dtypes() -> tuple[dict, ...]\n\nThe core's dtype traits (id, name, block_size, type_size, is_float), in id "
     "order."},
    {"compile", (PyCFunction)(void (*)(void))rlx_py_compile, METH_VARARGS | METH_KEYWORDS, rlx_py_compile_doc},
    {"decoder_params", (PyCFunction)(void (*)(void))rlx_py_decoder_params, METH_VARARGS | METH_KEYWORDS,
     rlx_py_decoder_params_doc},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------------
 * Module lifecycle
 * ------------------------------------------------------------------------------------------- */

static int module_exec(PyObject *module)
{
    struct rlx_py_state *st = rlx_py_state_of_module(module);
    if (st == NULL) return -1;
    if (PyArray_ImportNumPyAPI() < 0) return -1;
    st->error = PyErr_NewExceptionWithDoc(
        "rlx.Error",
        "An rlx failure that is not a bad argument (ValueError) or lack of memory (MemoryError): "
        "unsupported op or device, wrong state, I/O, or an internal error.",
        PyExc_RuntimeError, NULL);
    if (st->error == NULL) return -1;
    if (PyModule_AddObjectRef(module, "Error", st->error) < 0) return -1;
    rlx_py_errors_set(st->error);
    if (rlx_py_sigbus_install() < 0) return -1;
    for (size_t i = 0; i < sizeof add_types / sizeof add_types[0]; i++) {
        if (add_types[i](module, st) < 0) return -1;
    }
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    struct rlx_py_state *st = (struct rlx_py_state *)PyModule_GetState(module);
    if (st == NULL) return 0;
    Py_VISIT(st->error);
    Py_VISIT(st->device_type);
    Py_VISIT(st->graph_type);
    Py_VISIT(st->plan_type);
    Py_VISIT(st->model_type);
    Py_VISIT(st->seq_type);
    Py_VISIT(st->log_callback);
    return 0;
}

static int module_clear(PyObject *module)
{
    struct rlx_py_state *st = (struct rlx_py_state *)PyModule_GetState(module);
    if (st == NULL) return 0;
    if (st->log_callback != NULL) rlx_set_log_callback(NULL, NULL); /* before the callable and the state go */
    Py_CLEAR(st->log_callback);
    if (st->error != NULL) rlx_py_errors_clear(st->error);
    Py_CLEAR(st->error);
    Py_CLEAR(st->device_type);
    Py_CLEAR(st->graph_type);
    Py_CLEAR(st->plan_type);
    Py_CLEAR(st->model_type);
    Py_CLEAR(st->seq_type);
    return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

PyModuleDef rlx_py_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlx._C",
    .m_doc = "rlx._C: the C core of rlx (graph builder, compiler, plans). Use the rlx package.",
    .m_size = sizeof(struct rlx_py_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&rlx_py_module_def); }
