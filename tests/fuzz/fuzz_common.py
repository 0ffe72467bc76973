"""What the fuzz targets share: the input format (one fuzzer input holds several files, split at
SEP), a scratch directory that each input rebuilds, and `main`, which runs a target under atheris
(coverage-guided libFuzzer) with rlx's Python modules instrumented.

A target is a module with `test_one_input(data: bytes)` that returns on success or on an
exception the target lists as acceptable, and raises anything else: the fuzzer records that input
under tests/fuzz/crashes/ and stops. Targets never import atheris at module level, so that
tests/fuzz/test_fuzz_replay.py can replay the corpus and the crash files under plain pytest.

Importing this module puts the checkout's root first on sys.path: a target tests the rlx beside
it, never another installed copy.

The scratch directory is $RLX_FUZZ_SCRATCH when set (tools/run_fuzz.sh points it at a temporary
directory it removes afterwards: libFuzzer ends the process without running Python's atexit), else
a temporary directory removed at exit.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SEP = b"\xff\x00--\x00\xff"  # between the files of one input; not valid UTF-8, so no JSON holds it

_root: str | None = None


def split(data: bytes, n: int) -> list[bytes]:
    """The first n files of an input (missing ones empty)."""
    parts = data.split(SEP, n - 1)
    return parts + [b""] * (n - len(parts))


def join(*parts: bytes) -> bytes:
    return SEP.join(parts)


def scratch_root() -> str:
    """This process's scratch directory (created once)."""
    global _root
    if _root is None:
        base = os.environ.get("RLX_FUZZ_SCRATCH")
        if base:
            os.makedirs(base, exist_ok=True)
            _root = tempfile.mkdtemp(prefix="rlx-fuzz-", dir=base)
        else:
            _root = tempfile.mkdtemp(prefix="rlx-fuzz-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
            atexit.register(shutil.rmtree, _root, True)
    return _root


def fresh_dir(name: str = "model") -> str:
    """An empty directory scratch_root()/name (emptied for every input)."""
    path = os.path.join(scratch_root(), name)
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.mkdir(path)
    return path


def main(test_one_input, modules: list[str]) -> None:
    """Runs test_one_input under atheris with `modules` (and every rlx module they import)
    instrumented for coverage; libFuzzer's flags and corpus directories come from sys.argv."""
    import atheris

    with atheris.instrument_imports(include=["rlx"]):
        for m in modules:
            importlib.import_module(m)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
