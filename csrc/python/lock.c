/*
 * lock.c - the one way a binding object serialises threads over its core object (a plan, a
 * sequence, a transport): a PyThread lock waited for with the GIL released, and the holder's
 * thread ident, so that a thread re-entering an object it already holds (a callback, a finalizer
 * during a run) gets a RuntimeError instead of a deadlock. Call every function with the GIL held.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include "pythread.h"

int rlx_py_lock_init(struct rlx_py_lock *l)
{
    l->owner = 0;
    l->lock = PyThread_allocate_lock();
    if (l->lock == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void rlx_py_lock_fini(struct rlx_py_lock *l)
{
    if (l->lock != NULL) PyThread_free_lock(l->lock);
    l->lock = NULL;
}

int rlx_py_lock_acquire(struct rlx_py_lock *l, const char *what)
{
    if (!PyThread_acquire_lock(l->lock, NOWAIT_LOCK)) {
        if (l->owner == PyThread_get_thread_ident()) {
            PyErr_Format(PyExc_RuntimeError,
                         "this %s is already in use by the current thread (a callback may not "
                         "call back into it)",
                         what);
            return -1;
        }
        Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(l->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    l->owner = PyThread_get_thread_ident();
    return 0;
}

void rlx_py_lock_release(struct rlx_py_lock *l)
{
    l->owner = 0;
    PyThread_release_lock(l->lock);
}
