"""Leak checks shared by the pipeline and fault suites.

`nothing_left_behind` (not autouse here: a module opts in with an autouse fixture of its own)
fails a test that leaves a thread running, a socket open in this process, or a child process
alive. `ports` is a list the test appends the loopback ports it used to; afterwards each must be
free again: a listener binds it (with SO_REUSEADDR, as the transport's own does, so connections in
TIME_WAIT do not count) and nobody is listening on it.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from leakcheck import children, own_sockets, port_is_free, proc_state


@pytest.fixture
def ports():
    used: list[int] = []
    yield used
    deadline = time.monotonic() + 3.0
    while True:
        busy = [p for p in used if not port_is_free(p)]
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not busy, f"ports still bound after the test: {busy}"


@pytest.fixture
def nothing_left_behind():
    threads = set(threading.enumerate())
    socks = set(own_sockets())
    yield
    deadline = time.monotonic() + 3.0
    while True:
        new_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        new_socks = {fd: l for fd, l in own_sockets().items() if fd not in socks}
        kids = [p for p in children(os.getpid()) if proc_state(p) not in (None, "Z")]
        if not (new_threads or new_socks or kids) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not new_threads, f"threads left running: {new_threads}"
    assert not new_socks, f"sockets left open: {new_socks}"
    assert not kids, f"child processes left running: {kids}"
