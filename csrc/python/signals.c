/*
 * signals.c - Ctrl-C during a long core call, and SIGBUS from weights files truncated underneath.
 *
 * Ctrl-C. Python's own SIGINT handler only sets a flag that
 * the interpreter checks between bytecodes, which never happens while a plan runs with the GIL
 * released. So around such a call the binding puts a handler of its own in front: it calls
 * rlx_interrupt() (the core then stops before its next kernel with RLX_ERR_INTERRUPTED) and then
 * Python's handler, so the interpreter sees the signal too and raises KeyboardInterrupt once the
 * call has returned. The handler is installed only when Python's is (never over SIG_IGN or
 * SIG_DFL), counted so that overlapping calls from several threads install it once, and removed
 * when the last one ends. Install and removal happen with the GIL held (which serialises them).
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <signal.h>
#include <string.h>

/* ---- SIGBUS ----------------------------------------------------------------------------------
 * Installed once, at import, in front of whatever handler was there (pytest's faulthandler, say):
 * a fault in a weight the core uses in place is absorbed by rlx_guard_fault (the read completes
 * with zeros and the model's next check raises); any other goes to the previous handler, or, when
 * that was the default action, the default action is restored and the faulting read retried. */
static struct sigaction bus_previous;

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    if (rlx_guard_fault(info->si_addr)) return;
    if (bus_previous.sa_flags & SA_SIGINFO) {
        bus_previous.sa_sigaction(sig, info, uctx);
    } else if (bus_previous.sa_handler != SIG_DFL && bus_previous.sa_handler != SIG_IGN) {
        bus_previous.sa_handler(sig);
    } else {
        signal(SIGBUS, SIG_DFL); /* the read faults again and the process dies as it would have */
    }
}

int rlx_py_sigbus_install(void)
{
    static bool done;
    if (done) return 0;
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigbus;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
    if (sigaction(SIGBUS, &ours, &bus_previous) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    done = true;
    return 0;
}

/* ---- SIGINT ------------------------------------------------------------------------------------ */

static int depth; /* calls inside begin / end (GIL held for every change) */
static bool installed;
static struct sigaction previous; /* Python's handler while ours is in front */

static void on_sigint(int sig)
{
    rlx_interrupt();
    if (!(previous.sa_flags & SA_SIGINFO) && previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN)
        previous.sa_handler(sig);
}

void rlx_py_sigint_begin(void)
{
    if (depth++ > 0) return;
    struct sigaction now;
    if (sigaction(SIGINT, NULL, &now) != 0 || (now.sa_flags & SA_SIGINFO) || now.sa_handler == SIG_DFL ||
        now.sa_handler == SIG_IGN)
        return; /* Python does not handle SIGINT here: leave it alone */
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_handler = on_sigint;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = now.sa_flags & SA_RESTART;
    previous = now;
    installed = sigaction(SIGINT, &ours, NULL) == 0;
}

int rlx_py_sigint_end(rlx_status s)
{
    if (--depth == 0) {
        if (installed) sigaction(SIGINT, &previous, NULL);
        installed = false;
        rlx_interrupt_clear(); /* also when the last call finished before it saw the flag */
    }
    if (s != RLX_ERR_INTERRUPTED) return 0;
    if (PyErr_CheckSignals() < 0) return -1; /* Python's handler ran: KeyboardInterrupt (or the user's) */
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    return -1;
}
