/*
 * transport_type.c - _C.Transport: one Python type over struct rlx_transport (rlx/dist.h), made
 * by Transport.tcp(...) (the TCP mesh of the core) or adopted from another module's capsule with
 * Transport.from_capsule(...) (rlx._mpi; the capsule contract is in distributed/mpi.h). Also exports the
 * core-API capsule rlx._mpi needs, and rlx_py_transport_get for other files of the extension.
 *
 * Buffers: send takes any C-contiguous bytes-like object or array; recv and broadcast write into a
 * writable C-contiguous buffer. The Py_buffer is held across the call, so the memory cannot move
 * or be freed while the GIL is released.
 *
 * Threads: every blocking call runs with the GIL released. The core transport is used by one
 * thread at a time, so every use takes the object's own lock (waited for with the GIL released;
 * re-entry from the same thread is an exception, not a deadlock), as in plan_type.c. close() waits
 * for a call in progress on another thread to finish (at most the transport's timeout). Use after
 * close raises rlx.Error.
 *
 * Not GC-tracked: a Transport refers only to a str and, when adopted, to the capsule.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include "pythread.h"

#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "distributed/mpi.h"
#include "rlx/dist.h"

struct transport_object {
    PyObject_HEAD struct rlx_transport *t; /* owned; NULL once closed */
    struct rlx_py_lock lock;               /* held by the one thread using `t` */
    int rank, world;                       /* kept so that they still read after close */
    PyObject *name;                        /* str: ops->name */
    PyObject *capsule;                     /* the capsule it was adopted from (keeps its provider alive), or NULL */
};

static void transport_dealloc(struct transport_object *self);

/* ---------------------------------------------------------------------------------------------
 * The lock
 * ------------------------------------------------------------------------------------------- */

/* Takes the lock and checks the transport is open; -1 with an exception otherwise. */
static int transport_acquire(struct transport_object *self)
{
    if (rlx_py_lock_acquire(&self->lock, "transport") < 0) return -1;
    if (self->t == NULL) {
        rlx_py_lock_release(&self->lock);
        PyErr_SetString(rlx_py_error_borrowed != NULL ? rlx_py_error_borrowed : PyExc_RuntimeError,
                        "this transport is closed");
        return -1;
    }
    return 0;
}

static void transport_release(struct transport_object *self) { rlx_py_lock_release(&self->lock); }

/* ---------------------------------------------------------------------------------------------
 * Construction and destruction
 * ------------------------------------------------------------------------------------------- */

/* A new object of type cls owning t (closed here on failure). */
static PyObject *wrap(PyTypeObject *cls, struct rlx_transport *t, PyObject *capsule)
{
    struct transport_object *self = (struct transport_object *)cls->tp_alloc(cls, 0);
    if (self == NULL) {
        Py_BEGIN_ALLOW_THREADS t->ops->close(t);
        Py_END_ALLOW_THREADS return NULL;
    }
    self->t = t;
    self->rank = t->rank;
    self->world = t->world;
    self->capsule = Py_XNewRef(capsule);
    self->name = PyUnicode_FromString(t->ops->name != NULL ? t->ops->name : "?");
    if (self->name == NULL || rlx_py_lock_init(&self->lock) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void transport_dealloc(struct transport_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->t != NULL) {
        struct rlx_transport *t = self->t;
        self->t = NULL;
        /* Unreachable from elsewhere now; closing may wait (MPI_Finalize). */
        Py_BEGIN_ALLOW_THREADS t->ops->close(t);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->capsule);
    Py_XDECREF(self->name);
    rlx_py_lock_fini(&self->lock);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Copies of the address strings (and token), so that nothing Python-owned is read without the GIL. */
struct tcp_args {
    char **addrs; /* (world) owned strings */
    char *token;  /* owned, or NULL */
    int world;
};

static void tcp_args_free(struct tcp_args *a)
{
    for (int i = 0; a->addrs != NULL && i < a->world; i++) PyMem_Free(a->addrs[i]);
    PyMem_Free(a->addrs);
    PyMem_Free(a->token);
}

static char *copy_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = PyMem_Malloc(n);
    if (c == NULL)
        PyErr_NoMemory();
    else
        memcpy(c, s, n);
    return c;
}

static int tcp_args_fill(struct tcp_args *a, int world, PyObject *addrs, PyObject *token)
{
    PyObject *seq = PySequence_Fast(addrs, "addrs must be a list of \"host:port\" strings");
    if (seq == NULL) return -1;
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(seq) != world) {
        PyErr_Format(PyExc_ValueError, "addrs has %zd entries for a world of %d", PySequence_Fast_GET_SIZE(seq), world);
        goto done;
    }
    a->world = world;
    a->addrs = PyMem_Calloc((size_t)world, sizeof *a->addrs);
    if (a->addrs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < world; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "addrs[%d] must be a \"host:port\" str, got %.200s", i,
                         Py_TYPE(item)->tp_name);
            goto done;
        }
        const char *s = PyUnicode_AsUTF8(item);
        if (s == NULL || (a->addrs[i] = copy_str(s)) == NULL) goto done;
    }
    if (token != Py_None) {
        if (!PyUnicode_Check(token)) {
            PyErr_Format(PyExc_TypeError, "token must be a str or None, got %.200s", Py_TYPE(token)->tp_name);
            goto done;
        }
        const char *s = PyUnicode_AsUTF8(token);
        if (s == NULL || (a->token = copy_str(s)) == NULL) goto done;
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

/* Seconds (float) -> milliseconds for the core, > 0. */
static int timeout_ms_of(double timeout, int *out)
{
    if (!(timeout > 0) || timeout * 1000.0 > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "timeout must be > 0 and at most %d seconds, got %g", INT_MAX / 1000, timeout);
        return -1;
    }
    *out = timeout * 1000.0 < 1.0 ? 1 : (int)(timeout * 1000.0 + 0.5);
    return 0;
}

static PyObject *transport_tcp(PyTypeObject *cls, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"rank",    "world", "addrs",        "listen_fd", "max_message_bytes",
                             "timeout", "token", "allow_remote", NULL};
    int rank, world, listen_fd = -1, allow_remote = 0;
    PyObject *addrs, *token = Py_None;
    Py_ssize_t max_bytes = 0;
    double timeout = 60.0;
    struct tcp_args a = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiO|indOp:tcp", kwlist, &rank, &world, &addrs, &listen_fd,
                                     &max_bytes, &timeout, &token, &allow_remote))
        return NULL;
    struct rlx_tcp_opts opts = {.token = NULL, .allow_remote = allow_remote};
    if (world < 1 || rank < 0 || rank >= world) {
        PyErr_Format(PyExc_ValueError, "rank %d is not in a world of %d", rank, world);
        goto error;
    }
    if (max_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "max_message_bytes must be >= 0 (0 = 1 GiB), got %zd", max_bytes);
        goto error;
    }
    if (timeout_ms_of(timeout, &opts.timeout_ms) < 0 || tcp_args_fill(&a, world, addrs, token) < 0) goto error;
    opts.max_message_bytes = (size_t)max_bytes;
    opts.token = a.token;
    struct rlx_transport *t = NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s =
        rlx_tcp_transport_create(rank, world, (const char *const *)a.addrs, listen_fd, &opts, &t);
    Py_END_ALLOW_THREADS listen_fd = -1; /* consumed by the core, whatever the outcome */
    tcp_args_free(&a);
    if (rlx_py_raise(s)) return NULL;
    return wrap(cls, t, NULL);
error:
    if (listen_fd >= 0) close(listen_fd);
    tcp_args_free(&a);
    return NULL;
}

/* Non-NULL context marks a capsule whose transport has been adopted (distributed/mpi.h). */
static const char adopted_marker[] = "adopted by rlx._C.Transport";

static PyObject *transport_from_capsule(PyTypeObject *cls, PyObject *capsule)
{
    if (!PyCapsule_IsValid(capsule, RLX_TRANSPORT_CAPSULE)) {
        PyErr_Format(PyExc_TypeError, "from_capsule() needs a capsule named \"%s\", got %.200s", RLX_TRANSPORT_CAPSULE,
                     Py_TYPE(capsule)->tp_name);
        return NULL;
    }
    if (PyCapsule_GetContext(capsule) != NULL) {
        PyErr_SetString(PyExc_ValueError, "this transport capsule has already been adopted");
        return NULL;
    }
    struct rlx_transport *t = PyCapsule_GetPointer(capsule, RLX_TRANSPORT_CAPSULE);
    if (t == NULL) return NULL;
    if (PyCapsule_SetContext(capsule, (void *)adopted_marker) < 0) return NULL;
    return wrap(cls, t, capsule); /* from here the object owns t (wrap closes it on failure) */
}

/* ---------------------------------------------------------------------------------------------
 * Messages
 * ------------------------------------------------------------------------------------------- */

/* tag from a Python int: 0 <= tag < 2^32 (the core checks the user range). */
static int tag_of(long long v, uint32_t *out)
{
    if (v < 0 || v > (long long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "tag %lld is out of range (user tags are 0 <= tag < 2^24)", v);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) == 0) return 0;
    /* No buffer at all: TypeError; a buffer of the wrong kind (NumPy says ValueError, others
     * BufferError): ValueError. Either way with one message saying what is needed. */
    PyObject *exc = PyErr_ExceptionMatches(PyExc_TypeError) ? PyExc_TypeError
                    : PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_ValueError)
                        ? PyExc_ValueError
                        : NULL;
    if (exc != NULL) {
        PyErr_Clear();
        PyErr_Format(exc, "%s must be a %sC-contiguous bytes-like object or array, got %.200s", what,
                     writable ? "writable " : "", Py_TYPE(obj)->tp_name);
    }
    return -1;
}

static PyObject *transport_send(struct transport_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dst", "tag", "data", NULL};
    int dst;
    long long tag_v;
    PyObject *data;
    uint32_t tag;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iLO:send", kwlist, &dst, &tag_v, &data) || tag_of(tag_v, &tag) < 0)
        return NULL;
    Py_buffer view;
    if (get_buffer(data, &view, 0, "send: data") < 0) return NULL;
    if (transport_acquire(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    rlx_status s;
    struct rlx_transport *t = self->t;
    Py_BEGIN_ALLOW_THREADS s = t->ops->send(t, dst, tag, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS transport_release(self);
    PyBuffer_Release(&view);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *transport_recv(struct transport_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"src", "tag", "out", NULL};
    int src;
    long long tag_v;
    PyObject *out;
    uint32_t tag;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iLO:recv", kwlist, &src, &tag_v, &out) || tag_of(tag_v, &tag) < 0)
        return NULL;
    Py_buffer view;
    if (get_buffer(out, &view, 1, "recv: out") < 0) return NULL;
    if (transport_acquire(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    rlx_status s;
    size_t got = 0;
    struct rlx_transport *t = self->t;
    Py_BEGIN_ALLOW_THREADS s = t->ops->recv(t, src, tag, view.buf, (size_t)view.len, &got);
    Py_END_ALLOW_THREADS transport_release(self);
    PyBuffer_Release(&view);
    if (rlx_py_raise(s)) return NULL;
    return PyLong_FromSize_t(got);
}

static PyObject *transport_recv_bytes(struct transport_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"src", "tag", "max_bytes", NULL};
    int src;
    long long tag_v;
    Py_ssize_t max_bytes;
    uint32_t tag;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iLn:recv_bytes", kwlist, &src, &tag_v, &max_bytes) ||
        tag_of(tag_v, &tag) < 0)
        return NULL;
    if (max_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "recv_bytes: max_bytes must be >= 0, got %zd", max_bytes);
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, max_bytes);
    if (bytes == NULL) return NULL;
    if (transport_acquire(self) < 0) {
        Py_DECREF(bytes);
        return NULL;
    }
    rlx_status s;
    size_t got = 0;
    struct rlx_transport *t = self->t;
    char *buf = PyBytes_AS_STRING(bytes); /* a fresh object only this thread can see */
    Py_BEGIN_ALLOW_THREADS s = t->ops->recv(t, src, tag, buf, (size_t)max_bytes, &got);
    Py_END_ALLOW_THREADS transport_release(self);
    if (rlx_py_raise(s)) {
        Py_DECREF(bytes);
        return NULL;
    }
    if ((Py_ssize_t)got != max_bytes && _PyBytes_Resize(&bytes, (Py_ssize_t)got) < 0) return NULL;
    return bytes;
}

static PyObject *transport_broadcast(struct transport_object *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"root", "buf", NULL};
    int root;
    PyObject *buf;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO:broadcast", kwlist, &root, &buf)) return NULL;
    Py_buffer view;
    if (get_buffer(buf, &view, 1, "broadcast: buf") < 0) return NULL;
    if (transport_acquire(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    rlx_status s;
    struct rlx_transport *t = self->t;
    Py_BEGIN_ALLOW_THREADS s = t->ops->broadcast(t, root, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS transport_release(self);
    PyBuffer_Release(&view);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *transport_barrier(struct transport_object *self, PyObject *unused)
{
    (void)unused;
    if (transport_acquire(self) < 0) return NULL;
    rlx_status s;
    struct rlx_transport *t = self->t;
    Py_BEGIN_ALLOW_THREADS s = t->ops->barrier(t);
    Py_END_ALLOW_THREADS transport_release(self);
    if (rlx_py_raise(s)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *transport_close(struct transport_object *self, PyObject *unused)
{
    (void)unused;
    if (self->t == NULL) Py_RETURN_NONE;
    if (transport_acquire(self) < 0) {
        if (self->t != NULL) return NULL;
        PyErr_Clear(); /* closed by another thread meanwhile */
        Py_RETURN_NONE;
    }
    struct rlx_transport *t = self->t;
    self->t = NULL;
    Py_BEGIN_ALLOW_THREADS t->ops->close(t);
    Py_END_ALLOW_THREADS transport_release(self);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
 * Properties
 * ------------------------------------------------------------------------------------------- */

static PyObject *transport_get_rank(struct transport_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->rank);
}

static PyObject *transport_get_world(struct transport_object *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->world);
}

static PyObject *transport_get_name(struct transport_object *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->name);
}

static PyObject *transport_get_closed(struct transport_object *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->t == NULL);
}

static PyObject *transport_repr(struct transport_object *self)
{
    return PyUnicode_FromFormat("<rlx.Transport %U rank=%d world=%d%s>", self->name, self->rank, self->world,
                                self->t == NULL ? " closed" : "");
}

static PyMethodDef transport_methods[] = {
    {"tcp", (PyCFunction)(void (*)(void))transport_tcp, METH_CLASS | METH_VARARGS | METH_KEYWORDS,
     "tcp(rank: int, world: int, addrs: list[str], listen_fd: int = -1, max_message_bytes: int = 0,\n"
     "    timeout: float = 60.0, token: str | None = None, allow_remote: bool = False) -> Transport\n\n"
     "Builds the TCP mesh (blocks until every connection is up and its handshake done, or the\n"
     "timeout). addrs[i] is rank i's \"host:port\". listen_fd, when >= 0, is a bound listening socket\n"
     "this call consumes: it is closed on every path once the arguments parse. max_message_bytes 0\n"
     "means 1 GiB; timeout is in seconds and bounds the set-up and then each message as a whole.\n"
     "token: a shared secret each connection proves (HMAC challenge-response; frames MAC'd); None or\n"
     "\"\" for none, in which case only loopback peers are accepted unless allow_remote."},
    {"from_capsule", (PyCFunction)transport_from_capsule, METH_CLASS | METH_O,
     "from_capsule(capsule) -> Transport\n\nAdopts a transport made by another module (rlx._mpi.create())."},
    {"send", (PyCFunction)(void (*)(void))transport_send, METH_VARARGS | METH_KEYWORDS,
     "send(dst: int, tag: int, data: bytes-like | np.ndarray) -> None\n\n"
     "Sends a C-contiguous buffer to rank dst with a tag (0 <= tag < 2^24)."},
    {"recv", (PyCFunction)(void (*)(void))transport_recv, METH_VARARGS | METH_KEYWORDS,
     "recv(src: int, tag: int, out: writable buffer | np.ndarray) -> int\n\n"
     "Receives the next message from rank src into out; returns its size in bytes. A different tag\n"
     "is rlx.Error, a message larger than out is ValueError (either way the message is consumed)."},
    {"recv_bytes", (PyCFunction)(void (*)(void))transport_recv_bytes, METH_VARARGS | METH_KEYWORDS,
     "recv_bytes(src: int, tag: int, max_bytes: int) -> bytes\n\nAs recv, into a new bytes object."},
    {"broadcast", (PyCFunction)(void (*)(void))transport_broadcast, METH_VARARGS | METH_KEYWORDS,
     "broadcast(root: int, buf: writable buffer | np.ndarray) -> None\n\n"
     "Every rank calls it with the same root and size; afterwards every buf equals root's."},
    {"barrier", (PyCFunction)transport_barrier, METH_NOARGS,
     "barrier() -> None\n\nWaits until every rank has called it."},
    {"close", (PyCFunction)transport_close, METH_NOARGS,
     "close() -> None\n\nCloses the connections (idempotent). Later calls raise rlx.Error."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef transport_getset[] = {
    {"rank", (getter)transport_get_rank, NULL, "This process's rank.", NULL},
    {"world", (getter)transport_get_world, NULL, "The number of ranks.", NULL},
    {"name", (getter)transport_get_name, NULL, "The implementation: 'tcp' or 'mpi'.", NULL},
    {"closed", (getter)transport_get_closed, NULL, "Whether close() has been called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot transport_slots[] = {
    {Py_tp_doc, (void *)"Messages between the ranks of a fixed world (rlx/dist.h); made by Transport.tcp() "
                        "or Transport.from_capsule(). Use rlx.distributed.TcpTransport / MpiTransport."},
    {Py_tp_dealloc, (void *)transport_dealloc},
    {Py_tp_repr, (void *)transport_repr},
    {Py_tp_methods, transport_methods},
    {Py_tp_getset, transport_getset},
    {0, NULL},
};

static PyType_Spec transport_spec = {
    .name = "rlx._C.Transport",
    .basicsize = sizeof(struct transport_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = transport_slots,
};

/* ---------------------------------------------------------------------------------------------
 * For the rest of the extension, and for rlx._mpi
 * ------------------------------------------------------------------------------------------- */

struct rlx_transport *rlx_py_transport_get(struct rlx_py_state *st, PyObject *obj)
{
    /* The type is not in the module state: its dealloc slot identifies it (no subclasses). */
    if (PyType_GetSlot(Py_TYPE(obj), Py_tp_dealloc) != (void *)transport_dealloc) {
        PyErr_Format(PyExc_TypeError, "expected an rlx._C.Transport, got %.200s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    struct transport_object *self = (struct transport_object *)obj;
    if (self->t == NULL) {
        PyErr_SetString(st != NULL && st->error != NULL ? st->error : PyExc_RuntimeError, "this transport is closed");
        return NULL;
    }
    return self->t;
}

static const struct rlx_core_api core_api = {
    .version = RLX_CORE_API_VERSION,
    .set_error = rlx_set_error,
    .raise_status = rlx_py_raise,
};

int rlx_py_add_transport_type(PyObject *module, struct rlx_py_state *st)
{
    (void)st;
    PyTypeObject *type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &transport_spec, NULL);
    if (type == NULL) return -1;
    int rc = PyModule_AddType(module, type);
    Py_DECREF(type); /* the module's attribute keeps it */
    if (rc < 0) return -1;
    PyObject *capsule = PyCapsule_New((void *)&core_api, RLX_CORE_API_CAPSULE, NULL);
    if (capsule == NULL) return -1;
    rc = PyModule_AddObjectRef(module, "_core_api", capsule);
    Py_DECREF(capsule);
    return rc;
}
