"""pytest plugin for tools/run_asan_tests.sh: make sure the ASan build is the one tested.

Loaded with ``-p rlx_asan_check``; it imports ``rlx._C`` at plugin-load time, before
any conftest can put the source tree on sys.path, so that the sanitized copy under
$RLX_ASAN_EXPECT_DIR is what every test gets (sys.modules caches it).
"""

import os
import sys

_EXPECT = os.path.realpath(os.environ["RLX_ASAN_EXPECT_DIR"])


def _check():
    mod = sys.modules.get("rlx._C")
    path = os.path.realpath(getattr(mod, "__file__", "") or "")
    if not path.startswith(_EXPECT + os.sep):
        raise RuntimeError(
            f"rlx._C was imported from {path!r}, not from the ASan build in {_EXPECT!r}")
    return path


import rlx._C  # noqa: E402,F401  (must be first)

_PATH = _check()
print(f"asan: testing rlx._C from {_PATH}", file=sys.stderr, flush=True)


_CURRENT = os.environ.get("RLX_ASAN_CURRENT_TEST")


def pytest_runtest_logstart(nodeid, location):
    # A sanitizer error ends the process mid-test; this file names the test.
    if _CURRENT:
        with open(_CURRENT, "w") as f:
            f.write(nodeid + "\n")


def pytest_sessionfinish(session, exitstatus):
    _check()
