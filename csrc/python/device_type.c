/*
 * device_type.c - _C.Device: one open device (struct rlx_device, an instance of a backend). Plans,
 * models and sequences made on it hold a reference to it, so the device is freed only after every
 * object whose memory it owns. Also rlx_py_device_from, which turns the `device=` argument every
 * constructor takes (a name or a Device) into a Device.
 *
 * Threads: the core device is safe to use from several threads; this object keeps no state of its
 * own beyond the pointer, so it needs no lock.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <string.h>

struct device_object {
    PyObject_HEAD struct rlx_device *dev; /* owned */
};

static void device_dealloc(struct device_object *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    rlx_device_free(self->dev);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *device_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"name", NULL};
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s:Device", kwlist, &name)) return NULL;
    struct rlx_device *dev = NULL;
    rlx_status s;
    Py_BEGIN_ALLOW_THREADS s = rlx_device_open(name, &dev);
    Py_END_ALLOW_THREADS if (rlx_py_raise(s)) return NULL;
    struct device_object *self = (struct device_object *)type->tp_alloc(type, 0);
    if (self == NULL) {
        rlx_device_free(dev);
        return NULL;
    }
    self->dev = dev;
    return (PyObject *)self;
}

PyObject *rlx_py_device_from(struct rlx_py_state *st, PyObject *obj)
{
    if (PyObject_TypeCheck(obj, st->device_type)) return Py_NewRef(obj);
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "device must be a str (\"cpu\", \"ref\", \"vulkan\") or an rlx Device, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return PyObject_CallOneArg((PyObject *)st->device_type, obj);
}

struct rlx_device *rlx_py_device_get(PyObject *obj) { return ((struct device_object *)obj)->dev; }

static PyObject *device_get_name(struct device_object *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(rlx_device_name(self->dev));
}

static PyObject *device_stats(struct device_object *self, PyObject *unused)
{
    (void)unused;
    struct rlx_device_stats s;
    rlx_device_stats(self->dev, &s);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:n,s:n}", "upload_bytes", (unsigned long long)s.upload_bytes,
                         "download_bytes", (unsigned long long)s.download_bytes, "copy_bytes",
                         (unsigned long long)s.copy_bytes, "uploads", (unsigned long long)s.uploads, "downloads",
                         (unsigned long long)s.downloads, "allocated_bytes", (Py_ssize_t)s.allocated_bytes,
                         "wrapped_bytes", (Py_ssize_t)s.wrapped_bytes);
}

/* "key=value" lines into a dict (module.c's build_info does the same for the build's). */
PyObject *rlx_py_key_values(const char *p)
{
    PyObject *d = PyDict_New();
    while (d && p && *p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq) {
            PyObject *k = PyUnicode_DecodeUTF8(p, (Py_ssize_t)(eq - p), "replace");
            PyObject *v = PyUnicode_DecodeUTF8(eq + 1, (Py_ssize_t)(len - (size_t)(eq - p) - 1), "replace");
            if (!k || !v || PyDict_SetItem(d, k, v) < 0) Py_CLEAR(d);
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        p = eol ? eol + 1 : p + len;
    }
    return d;
}

static PyObject *device_describe(struct device_object *self, PyObject *unused)
{
    (void)unused;
    char buf[2048];
    rlx_device_describe(self->dev, buf, sizeof buf);
    PyObject *d = rlx_py_key_values(buf);
    PyObject *name = d ? PyUnicode_FromString(rlx_device_name(self->dev)) : NULL;
    if (!name || PyDict_SetItemString(d, "name", name) < 0) Py_CLEAR(d);
    Py_XDECREF(name);
    return d;
}

static PyObject *device_repr(struct device_object *self)
{
    return PyUnicode_FromFormat("rlx.Device('%s')", rlx_device_name(self->dev));
}

static PyMethodDef device_methods[] = {
    {"stats", (PyCFunction)device_stats, METH_NOARGS,
     "stats() -> dict\n\nBytes moved since the device was opened (upload_bytes host->device, download_bytes,\n"
     "copy_bytes device->device, uploads, downloads) and held now (allocated_bytes, wrapped_bytes: host memory\n"
     "used in place)."},
    {"describe", (PyCFunction)device_describe, METH_NOARGS,
     "describe() -> dict\n\nWhat the backend says about itself."},
    {NULL, NULL, 0, NULL},
};

static PyObject *device_get_zero_copy(struct device_object *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(rlx_device_zero_copy(self->dev));
}

static PyGetSetDef device_getset[] = {
    {"name", (getter)device_get_name, NULL, "The device's name (\"cpu\").", NULL},
    {"zero_copy", (getter)device_get_zero_copy, NULL,
     "Whether kernels read host memory in place (cpu); False for devices with memory of their own (ref, vulkan), "
     "to which every weight and input is uploaded.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot device_slots[] = {
    {Py_tp_doc,
     (void *)"Device(name): an open device (\"cpu\", \"ref\", \"vulkan\", \"vulkan:N\"; see rlx.devices()); it "
             "owns the memory of the plans, models and sequences made on it."},
    {Py_tp_new, (void *)device_new},
    {Py_tp_dealloc, (void *)device_dealloc},
    {Py_tp_repr, (void *)device_repr},
    {Py_tp_methods, device_methods},
    {Py_tp_getset, device_getset},
    {0, NULL},
};

static PyType_Spec device_spec = {
    .name = "rlx._C.Device",
    .basicsize = sizeof(struct device_object),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = device_slots,
};

int rlx_py_add_device_type(PyObject *module, struct rlx_py_state *st)
{
    st->device_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &device_spec, NULL);
    if (st->device_type == NULL) return -1;
    return PyModule_AddType(module, st->device_type);
}
