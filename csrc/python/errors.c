/*
 * errors.c - the one place where an rlx_status becomes a Python exception, and the lookups of the
 * module state from objects and from the module.
 *
 * rlx_py_raise reads the calling thread's rlx_last_error(), so it must run on the thread that
 * made the failing core call (the GIL may have been released around that call and re-taken; the
 * message is thread-local, not GIL-local). It never calls back into the core except for the
 * message and the status name.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

PyObject *rlx_py_error_borrowed = NULL;

void rlx_py_errors_set(PyObject *error) { rlx_py_error_borrowed = error; }

void rlx_py_errors_clear(PyObject *error)
{
    if (rlx_py_error_borrowed == error) rlx_py_error_borrowed = NULL;
}

int rlx_py_raise(rlx_status s)
{
    if (s == RLX_OK) return 0;
    const char *msg = rlx_last_error();
    if (msg == NULL || msg[0] == '\0') msg = rlx_status_name(s);
    PyObject *exc;
    switch (s) {
    case RLX_ERR_INVALID:
    case RLX_ERR_SHAPE:
    case RLX_ERR_DTYPE:
    case RLX_ERR_RANGE: exc = PyExc_ValueError; break;
    case RLX_ERR_NOMEM: exc = PyExc_MemoryError; break;
    case RLX_ERR_INTERRUPTED: exc = PyExc_KeyboardInterrupt; break;
    default: exc = rlx_py_error_borrowed != NULL ? rlx_py_error_borrowed : PyExc_RuntimeError; break;
    }
    PyErr_SetString(exc, msg);
    return -1;
}

struct rlx_py_state *rlx_py_state_of(PyObject *obj) { return rlx_py_state_of_type(Py_TYPE(obj)); }

struct rlx_py_state *rlx_py_state_of_type(PyTypeObject *type)
{
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *module = PyType_GetModuleByDef(type, &rlx_py_module_def);
#else
    /* Python 3.10: walk the MRO for the heap type this module created (what 3.11's
     * PyType_GetModuleByDef does). */
    PyObject *module = NULL;
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro) && module == NULL; i++) {
        PyTypeObject *t = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (!PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE)) continue;
        PyObject *m = ((PyHeapTypeObject *)t)->ht_module;
        if (m != NULL && PyModule_GetDef(m) == &rlx_py_module_def) module = m;
    }
    if (module == NULL) PyErr_Format(PyExc_TypeError, "%.200s is not a type of rlx._C", type->tp_name);
#endif
    if (module == NULL) return NULL;
    return (struct rlx_py_state *)PyModule_GetState(module);
}

struct rlx_py_state *rlx_py_state_of_module(PyObject *module)
{
    struct rlx_py_state *st = (struct rlx_py_state *)PyModule_GetState(module);
    if (st == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "rlx._C: module state missing");
    return st;
}
