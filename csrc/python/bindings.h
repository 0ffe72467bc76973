/*
 * bindings.h - what the files of the extension module rlx._C share: the module state (the heap
 * type objects and the rlx.Error class), how to reach it from a type or an object, the one
 * function that turns an rlx_status into a Python exception, and the dtype mapping between
 * rlx and NumPy.
 *
 * Every file of csrc/python includes this header before anything else. Only module.c imports the
 * NumPy C API; every other file defines NO_IMPORT_ARRAY before including this header, so all of
 * them share one API table (PY_ARRAY_UNIQUE_SYMBOL below).
 *
 * Nothing here may be called without the GIL, except where a comment says so.
 */
#ifndef RLX_PYTHON_BINDINGS_H
#define RLX_PYTHON_BINDINGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef NPY_NO_DEPRECATED_API
#define NPY_NO_DEPRECATED_API NPY_1_21_API_VERSION
#endif
#define PY_ARRAY_UNIQUE_SYMBOL rlx_py_ARRAY_API
#include <numpy/arrayobject.h>

#include "rlx/rlx.h"

#if PY_VERSION_HEX < 0x030A0000
#error "rlx._C needs Python 3.10 or newer"
#endif

/* Per-module state. Every field is a strong reference owned by the module. */
struct rlx_py_state {
    PyObject *error;           /* rlx.Error, a subclass of RuntimeError */
    PyTypeObject *device_type; /* _C.Device (device_type.c) */
    PyTypeObject *graph_type;  /* _C.Graph (graph_type.c) */
    PyTypeObject *plan_type;   /* _C.Plan (plan_type.c) */
    PyTypeObject *model_type;  /* _C.Model (model_type.c) */
    PyTypeObject *seq_type;    /* _C.Sequence (seq_type.c) */
    PyObject *log_callback;    /* the callable set_log_callback installed in the core, or NULL */
};

/* The module definition (module.c); heap types are created with PyType_FromModuleAndSpec so that
 * their instances find the state through it. */
extern PyModuleDef rlx_py_module_def;

/* The module state for an object whose type (or a base of it) was created by this module;
 * NULL with TypeError set otherwise. */
struct rlx_py_state *rlx_py_state_of(PyObject *obj);
/* The same for a type (a constructor's `type` argument, possibly a subclass). */
struct rlx_py_state *rlx_py_state_of_type(PyTypeObject *type);
/* The module state of the module object itself (module functions get it as `self`). */
struct rlx_py_state *rlx_py_state_of_module(PyObject *module);

/* Maps a status to an exception and raises it; returns 0 (nothing raised) for RLX_OK, else -1.
 * RLX_ERR_INVALID / SHAPE / DTYPE / RANGE raise ValueError, RLX_ERR_NOMEM raises MemoryError,
 * every other status raises rlx.Error. The message is rlx_last_error() of the calling thread (the
 * status name when that is empty), so call it on the thread that made the failing call, right
 * after the call: `if (rlx_py_raise(s)) goto error;`. */
int rlx_py_raise(rlx_status s);

/* rlx.Error as a borrowed pointer: set by the module's exec slot from the state's strong
 * reference, cleared when that module is freed. It exists so rlx_py_raise needs no module
 * lookup. NULL before the module has executed (rlx_py_raise then falls back to RuntimeError). */
extern PyObject *rlx_py_error_borrowed;
/* Called by module.c: exec sets it, free clears it (if it is still that module's class). */
void rlx_py_errors_set(PyObject *error);
void rlx_py_errors_clear(PyObject *error);

/* dtype mapping (plan_type.c) -------------------------------------------------------------- */

/* Whether an array of descriptor d may be handed to the core as dtype dt without conversion:
 * f32 <- float32, f16 <- float16, i32 <- int32, u8 <- uint8 or bool, bf16 <- uint16 (raw bits) or
 * a dtype named "bfloat16" (ml_dtypes); native byte order only. Block types take no array dtype
 * of their own (see rlx_py_host_tensor_from). */
int rlx_py_dtype_matches(PyArray_Descr *d, enum rlx_dtype dt);
/* The NumPy type number used for outputs of dtype dt (bf16 outputs come back as uint16 bits). */
int rlx_py_dtype_to_npy(enum rlx_dtype dt);

/* The module's types: each adds itself to the module and stores its type in the state.
 * Returns 0, or -1 with an exception set. */
int rlx_py_add_device_type(PyObject *module, struct rlx_py_state *st);
int rlx_py_add_graph_type(PyObject *module, struct rlx_py_state *st);
int rlx_py_add_plan_type(PyObject *module, struct rlx_py_state *st);
int rlx_py_add_model_type(PyObject *module, struct rlx_py_state *st);
int rlx_py_add_seq_type(PyObject *module, struct rlx_py_state *st);
int rlx_py_add_transport_type(PyObject *module, struct rlx_py_state *st);

/* Devices (device_type.c). rlx_py_device_from: a new reference to a _C.Device for `obj`, a Device
 * (returned as is) or a device name (opened now); NULL with an exception set. rlx_py_device_get:
 * the core device of a _C.Device (borrowed; lives as long as the object). */
PyObject *rlx_py_device_from(struct rlx_py_state *st, PyObject *obj);
struct rlx_device *rlx_py_device_get(PyObject *device_obj);
/* The core model of a _C.Model (model_type.c; borrowed, lives as long as the object). */
struct rlx_model *rlx_py_model_get(PyObject *model_obj);
/* "key=value" lines into a new dict of str; NULL with an exception set. */
PyObject *rlx_py_key_values(const char *lines);

/* An object's own lock over its core object (lock.c): waited for with the GIL released; a thread
 * that already holds it gets RuntimeError naming `what` instead of a deadlock. GIL held for all. */
#include "pythread.h"
struct rlx_py_lock {
    PyThread_type_lock lock;
    unsigned long owner; /* thread ident of the holder, 0 when free */
};
int rlx_py_lock_init(struct rlx_py_lock *l); /* -1 with MemoryError */
void rlx_py_lock_fini(struct rlx_py_lock *l);
int rlx_py_lock_acquire(struct rlx_py_lock *l, const char *what);
void rlx_py_lock_release(struct rlx_py_lock *l);

/* The SIGBUS handler that turns a fault in a weights file truncated underneath into an error
 * (signals.c); installed once, at import. -1 with an exception set on failure. */
int rlx_py_sigbus_install(void);

/* Ctrl-C during a long core call (signals.c): begin before releasing the GIL, end after taking it
 * back, with the call's status. end returns -1 with KeyboardInterrupt set (or what Python's SIGINT
 * handler raised) when the call was interrupted, else 0. GIL held for both. */
void rlx_py_sigint_begin(void);
int rlx_py_sigint_end(rlx_status s);

/* Conversions for the generator binding (convert.c); -1 / NULL with an exception set on failure. */
struct rlx_model_config;
struct rlx_sample_opts;
/* The C config from the dict rlx.Generator builds (HF field names + qk_norm, layer_windows). */
int rlx_py_config_from_dict(PyObject *d, struct rlx_model_config *c);
/* A weight for the core: an ndarray (C-contiguous, aligned, of a dtype rlx_py_dtype_matches maps)
 * or a tuple (raw: a C-contiguous uint8 array, dtype name, logical shape) for block types. *keep:
 * a new reference to the object whose memory t->data points into (the caller keeps it alive as
 * long as the core reads it). Returns 0, or -1 with an exception naming `name`. */
int rlx_py_host_tensor_from(PyObject *obj, const char *name, struct rlx_host_tensor *t, PyObject **keep);
/* SampleOpts-like object (attributes temperature, top_k, top_p, min_p, repetition_penalty, seed) or
 * None (greedy), checked by rlx_sample_opts_check. */
int rlx_py_sample_opts_from(PyObject *o, struct rlx_sample_opts *out);
/* A 1-D sequence of integer token ids -> a new PyMem_Malloc'd int32 buffer of *n entries (floats refused). */
int32_t *rlx_py_ids_from(PyObject *obj, int64_t *n);
int rlx_py_token_from(PyObject *obj, int32_t *tok);

/* Graph objects (graph_type.c): the wrapped builder, borrowed; NULL with TypeError set if obj is
 * not a _C.Graph. */
struct rlx_graph *rlx_py_graph_get(struct rlx_py_state *st, PyObject *obj);

/* Transport objects (transport_type.c): the wrapped struct rlx_transport (rlx/dist.h), borrowed and
 * valid until the object is closed or freed; NULL with TypeError (not a _C.Transport) or rlx.Error
 * (closed) set. It does not take the object's lock: the caller must not use the pointer while
 * another thread may call the object's methods, and holds a reference to obj while using it. */
struct rlx_transport *rlx_py_transport_get(struct rlx_py_state *st, PyObject *obj);

/* rlx_graph_dump(g) as a str (graph_type.c; Graph.dump and Plan.graph_dump). */
PyObject *rlx_py_dump_graph(const struct rlx_graph *g);

/* Module functions that live with their types (their docs are in the method table). */
PyObject *rlx_py_compile(PyObject *module, PyObject *args, PyObject *kwargs);
extern const char rlx_py_compile_doc[];
PyObject *rlx_py_decoder_params(PyObject *module, PyObject *args, PyObject *kwargs);
extern const char rlx_py_decoder_params_doc[];

#endif
