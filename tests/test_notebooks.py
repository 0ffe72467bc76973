"""Executes every notebooks/*.ipynb with nbclient so that none of them rots.

The kernel is this interpreter: a kernelspec named ``python3`` whose argv starts with
``sys.executable`` is written to a temporary directory that is put first on JUPYTER_PATH, so
whatever other python3 kernelspecs the machine has (user, system) cannot win. A first test
checks that a kernel started that way really runs in this environment (same sys.prefix).

Each notebook runs with its own folder (notebooks/) as the working directory; any cell error
fails the test with the cell's source and traceback. The committed files must keep their outputs
cleared.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
MODEL_DIR = Path(os.environ.get("RLX_MODEL") or ROOT.parent / "shared" / "models" / "stories260K" / "hf")

KERNEL = "python3"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """JUPYTER_PATH pointing first at a python3 kernelspec for sys.executable."""
    base = tmp_path_factory.mktemp("jupyter")
    spec_dir = base / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.prefix})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(base)] + ([old] if old else []))
    try:
        yield str(base)
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old


def _run(nb, cwd: Path):
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def _outputs_text(nb) -> str:
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text.append(out.get("text", ""))
            elif "data" in out:
                text.append(out["data"].get("text/plain", ""))
    return "".join(text)


def test_kernel_is_this_environment(kernel_env):
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    assert spec.argv[0] == sys.executable, spec.argv
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import sys; print(sys.prefix); print(sys.executable)")]
    _run(nb, NB_DIR)
    prefix, executable = _outputs_text(nb).split()[:2]
    assert prefix == sys.prefix
    assert os.path.realpath(executable) == os.path.realpath(sys.executable)


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {NB_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_outputs_cleared(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{path.name}: cell {i} has outputs; clear them before committing"
            assert cell.get("execution_count") is None, f"{path.name}: cell {i} has an execution count"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_env):
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip(f"model not found at {MODEL_DIR} (set RLX_MODEL)")
    pytest.importorskip("matplotlib")
    pytest.importorskip("transformers")
    nb = nbformat.read(str(path), as_version=4)
    try:
        _run(nb, path.parent)
    except nbclient.exceptions.CellExecutionError as e:  # carries the cell source and traceback
        pytest.fail(f"{path.name}: a cell raised:\n{e}", pytrace=False)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
