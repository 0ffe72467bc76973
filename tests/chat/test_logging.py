"""Logging goes through the standard logging module under "rlx", quiet by default; the C core's
lines (rlx_set_log_callback) arrive on "rlx.core" from whatever thread logs them."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

import numpy as np

import rlx


def small_plan():
    g = rlx.Graph()
    x = g.input("x", ("SEQ", 8))
    g.output(g.matmul(x, g.param("w", (8, 8))), "y")
    return rlx.compile(g, device="cpu")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_core_log_lines_reach_the_rlx_core_logger_from_any_thread():
    core = logging.getLogger("rlx.core")
    h = Records()
    core.addHandler(h)
    old = core.level
    core.setLevel(logging.DEBUG)
    try:
        small_plan()
        t = threading.Thread(target=small_plan)  # logs from a thread that is not the main one
        t.start()
        t.join()
    finally:
        core.removeHandler(h)
        core.setLevel(old)
    lines = [r.getMessage() for r in h.records if "compiled a plan" in r.getMessage()]
    assert len(lines) == 2 and all(r.levelno == logging.DEBUG for r in h.records)
    assert {r.thread for r in h.records if "compiled a plan" in r.getMessage()} == {threading.get_ident(), t.ident}


def test_quiet_by_default():
    code = ("import rlx, numpy as np\n"
            "g = rlx.Graph(); x = g.input('x', ('SEQ', 4)); g.output(g.matmul(x, g.param('w', (4, 4))), 'y')\n"
            "p = rlx.compile(g); p.set_param('w', np.eye(4, dtype=np.float32))\n"
            "p.run({'x': np.ones((2, 4), np.float32)})\n"
            "import logging; logging.getLogger('rlx.core').warning('not shown: no handler configured')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""


def test_a_failing_callback_never_fails_the_run(monkeypatch):
    def bad(level, msg):
        raise RuntimeError("callback broke")

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))

    rlx._C.set_log_callback(bad)
    try:
        plan = small_plan()
        plan.set_param("w", np.eye(8, dtype=np.float32))
        (y,) = plan.run({"x": np.ones((3, 8), np.float32)})
    finally:
        import rlx.logs as logs
        rlx._C.set_log_callback(logs._from_core)
    np.testing.assert_array_equal(y, np.ones((3, 8), np.float32))
    assert seen and all(str(e) == "callback broke" for e in seen)  # reported as unraisable
