/*
 * module.c - the extension module rlx._C: multi-phase initialisation, the module state, the
 * NumPy C-API import, and the small module-level functions (build facts, threads, backends).
 *
 * Each type lives in its own file and exposes one add_type function; the exec slot calls them in
 * the order of the `add_types` table below, so adding a type is one line there. This file never
 * holds type-specific code and never keeps Python objects in C globals (the one exception,
 * rlx_py_error_borrowed, is a borrowed alias of the state's rlx.Error; see bindings.h).
 */
#include "bindings.h"

#include <limits.h>
#include <string.h>

/* One per type file, called in order by module_exec. */
static int (*const add_types[])(PyObject *module, struct rlx_py_state *st) = {
    rlx_py_add_graph_type,
    rlx_py_add_plan_type,
    rlx_py_add_generator_type,
    rlx_py_add_transport_type,
};

/* ---------------------------------------------------------------------------------------------
 * Module functions
 * ------------------------------------------------------------------------------------------- */

/* Splits rlx_build_info()'s "key=value" lines into a dict of str, then adds num_threads. */
static PyObject *build_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *info = PyDict_New();
    PyObject *value = NULL;
    if (info == NULL)
        goto error;
    const char *p = rlx_build_info();
    while (p != NULL && *p != '\0') {
        const char *eol = strchr(p, '\n');
        size_t line_len = eol != NULL ? (size_t)(eol - p) : strlen(p);
        const char *eq = memchr(p, '=', line_len);
        if (eq != NULL) {
            PyObject *key = PyUnicode_DecodeUTF8(p, (Py_ssize_t)(eq - p), "replace");
            if (key == NULL)
                goto error;
            value = PyUnicode_DecodeUTF8(eq + 1, (Py_ssize_t)(line_len - (size_t)(eq - p) - 1), "replace");
            if (value == NULL) {
                Py_DECREF(key);
                goto error;
            }
            int rc = PyDict_SetItem(info, key, value);
            Py_DECREF(key);
            Py_CLEAR(value);
            if (rc < 0)
                goto error;
        }
        p = eol != NULL ? eol + 1 : p + line_len;
    }
    value = PyLong_FromLong(rlx_get_num_threads());
    if (value == NULL || PyDict_SetItemString(info, "num_threads", value) < 0)
        goto error;
    Py_DECREF(value);
    return info;
error:
    Py_XDECREF(value);
    Py_XDECREF(info);
    return NULL;
}

static PyObject *set_num_threads(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n > INT_MAX || n < INT_MIN) {
        PyErr_Format(PyExc_ValueError, "set_num_threads: %ld is out of range", n);
        return NULL;
    }
    /* Resizing the pool may wait for its workers: never hold the GIL for that. */
    Py_BEGIN_ALLOW_THREADS
    rlx_set_num_threads((int)n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
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
    if (list == NULL)
        goto error;
    const char *p = rlx_backends();
    while (p != NULL && *p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (n > 0) {
            item = PyUnicode_FromStringAndSize(p, (Py_ssize_t)n);
            if (item == NULL || PyList_Append(list, item) < 0)
                goto error;
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

static PyMethodDef module_methods[] = {
    {"build_info", build_info, METH_NOARGS,
     "build_info() -> dict[str, str | int]\n\nStatic build facts (blas, blas_config, cc, cflags, isa, "
     "backends) plus the current num_threads."},
    {"set_num_threads", set_num_threads, METH_O,
     "set_num_threads(n: int) -> None\n\nThreads for the CPU kernels and OpenBLAS together; n <= 0 "
     "restores the default (online CPUs)."},
    {"get_num_threads", get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"backends", backends, METH_NOARGS, "backends() -> list[str]\n\nThe backends compiled in."},
    {"compile", (PyCFunction)(void (*)(void))rlx_py_compile, METH_VARARGS | METH_KEYWORDS, rlx_py_compile_doc},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------------
 * Module lifecycle
 * ------------------------------------------------------------------------------------------- */

static int module_exec(PyObject *module)
{
    struct rlx_py_state *st = rlx_py_state_of_module(module);
    if (st == NULL)
        return -1;
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    st->error = PyErr_NewExceptionWithDoc(
        "rlx.Error",
        "An rlx failure that is not a bad argument (ValueError) or lack of memory (MemoryError): "
        "unsupported op or device, wrong state, I/O, or an internal error.",
        PyExc_RuntimeError, NULL);
    if (st->error == NULL)
        return -1;
    if (PyModule_AddObjectRef(module, "Error", st->error) < 0)
        return -1;
    rlx_py_errors_set(st->error);
    for (size_t i = 0; i < sizeof add_types / sizeof add_types[0]; i++) {
        if (add_types[i](module, st) < 0)
            return -1;
    }
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    struct rlx_py_state *st = (struct rlx_py_state *)PyModule_GetState(module);
    if (st == NULL)
        return 0;
    Py_VISIT(st->error);
    Py_VISIT(st->graph_type);
    Py_VISIT(st->plan_type);
    Py_VISIT(st->generator_type);
    return 0;
}

static int module_clear(PyObject *module)
{
    struct rlx_py_state *st = (struct rlx_py_state *)PyModule_GetState(module);
    if (st == NULL)
        return 0;
    if (st->error != NULL)
        rlx_py_errors_clear(st->error);
    Py_CLEAR(st->error);
    Py_CLEAR(st->graph_type);
    Py_CLEAR(st->plan_type);
    Py_CLEAR(st->generator_type);
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

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

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&rlx_py_module_def);
}
