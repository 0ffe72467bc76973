/*
 * mpi_module.c - the extension module rlx._mpi: create(), that makes an MPI transport (mpi.c) and
 * hands it over as a capsule for rlx._C.Transport.from_capsule (the capsule contract is in
 * distributed/mpi.h), and abandon() (rlx_mpi_abandon). Built only where mpicc works (setup.py), like mpi.c; every other
 * build sees an empty file.
 *
 * rlx._mpi links no core source: its rlx_set_error forwards to rlx._C's and its failures are raised
 * by rlx._C's rlx_py_raise (both through rlx._C's core-API capsule), so a message lands in the
 * thread-local buffer rlx._C reads and becomes the same exception as anywhere else in rlx.
 */
#if defined(RLX_WITH_MPI)

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>

#include "core/core.h"
#include "distributed/mpi.h"

/* rlx._C's core API: set once by module exec (under the GIL, before any create), then only read. */
static const struct rlx_core_api *core_api;

rlx_status rlx_set_error(rlx_status s, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return core_api->set_error(s, "%s", msg);
}

/* Destructor of a capsule nobody adopted: it still owns the transport. */
static void capsule_destructor(PyObject *capsule)
{
    if (PyCapsule_GetContext(capsule) != NULL) return;
    struct rlx_transport *t = PyCapsule_GetPointer(capsule, RLX_TRANSPORT_CAPSULE);
    if (t != NULL)
        t->ops->close(t);
    else
        PyErr_Clear();
}

static PyObject *create(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"max_message_bytes", "timeout", NULL};
    Py_ssize_t max_bytes = 0;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|nd:create", kwlist, &max_bytes, &timeout)) return NULL;
    if (max_bytes < 0 || !(timeout > 0) || timeout * 1000.0 > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "create: need max_message_bytes >= 0 and 0 < timeout <= %d s, got %zd and %g",
                     INT_MAX / 1000, max_bytes, timeout);
        return NULL;
    }
    struct rlx_mpi_opts opts = {.max_message_bytes = (size_t)max_bytes, .timeout_ms = (int)(timeout * 1000.0 + 0.5)};
    struct rlx_transport *t = NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_mpi_transport_create(&opts, &t);
    Py_END_ALLOW_THREADS if (core_api->raise_status(s)) return NULL;
    PyObject *capsule = PyCapsule_New(t, RLX_TRANSPORT_CAPSULE, capsule_destructor);
    if (capsule == NULL) t->ops->close(t);
    return capsule;
}

static PyObject *abandon(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    rlx_mpi_abandon();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"create", (PyCFunction)(void (*)(void))create, METH_VARARGS | METH_KEYWORDS,
     "create(max_message_bytes: int = 0, timeout: float = 60.0) -> capsule\n\n"
     "Creates the MPI transport (collective over MPI_COMM_WORLD) as a capsule for\n"
     "rlx._C.Transport.from_capsule; failures raise like every rlx call. Use rlx.distributed.MpiTransport."},
    {"abandon", abandon, METH_NOARGS,
     "abandon() -> None\n\n"
     "This process will not finalise MPI (closing the last transport leaves it initialised): for a rank\n"
     "ending with an error, whose peers might never reach MPI_Finalize. Exiting then makes mpirun end\n"
     "the job. Cannot be undone."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module)
{
    (void)module;
    core_api = PyCapsule_Import(RLX_CORE_API_CAPSULE, 0);
    if (core_api == NULL) return -1;
    if (core_api->version != RLX_CORE_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "rlx._mpi was built for core API %u, rlx._C has %u: rebuild rlx",
                     RLX_CORE_API_VERSION, core_api->version);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static PyModuleDef mpi_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlx._mpi",
    .m_doc = "rlx._mpi: the MPI transport of rlx. Use rlx.distributed.MpiTransport.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__mpi(void) { return PyModuleDef_Init(&mpi_module_def); }

#endif
