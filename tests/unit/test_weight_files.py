"""Weights files that change under a loaded model (the model reads them in place, memory-mapped).

- modified in place (truncated, or rewritten with other bytes): the next step raises rlx.Error
  naming the file, and keeps raising; other models are unaffected;
- replaced by a rename (how downloads and rsync write): the mapping keeps the old file, so nothing
  changes and nothing is raised;
- truncated while the model reads it (the path already names another file, so the check before
  the run passes): the read faults with SIGBUS, which used to kill the process; now the run raises
  rlx.Error and the process lives (checked in a child process, so a regression cannot take pytest
  down with it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

import rlx
from rlx.weights import expected_weights

CFG = rlx.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False)


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
            for n, s in expected_weights(CFG).items()}


def generator(path) -> rlx.Generator:
    gen = rlx.Generator(CFG, rlx.load_weights(path), kv_dtype="f32")
    gen.prefill([1, 2, 3])
    return gen


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(weights(0), path)
    return path


def test_a_file_truncated_in_place_raises_at_the_next_step(model_file, tmp_path):
    gen = generator(model_file)
    gen.generate_cached(2)
    other_path = tmp_path / "other.safetensors"
    safetensors.numpy.save_file(weights(1), other_path)
    other = generator(other_path)
    os.truncate(model_file, 1000)
    for _ in range(2):  # and stays refused
        with pytest.raises(rlx.Error, match=r"model\.safetensors was modified in place"):
            gen.step_cached()
    assert len(gen.tokens) == 5
    assert len(other.generate_cached(3)) == 3


def test_a_file_rewritten_in_place_raises(model_file):
    gen = generator(model_file)
    size = os.path.getsize(model_file)
    with open(model_file, "r+b") as f:  # same size, other bytes: the mapping would show them
        f.seek(size - 64)
        f.write(b"\x7f" * 64)
    st = os.stat(model_file)
    os.utime(model_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # coarse-mtime filesystems
    with pytest.raises(rlx.Error, match="modified in place"):
        gen.generate_cached(1)


def test_a_file_replaced_by_a_rename_changes_nothing(model_file, tmp_path):
    want = generator(model_file).generate_cached(6)
    gen = generator(model_file)
    new = tmp_path / "new.safetensors"
    safetensors.numpy.save_file(weights(2), new)
    os.replace(new, model_file)
    assert gen.generate_cached(6) == want


def test_a_file_truncated_under_a_run_raises_instead_of_sigbus(model_file, tmp_path):
    script = textwrap.dedent(f"""
        import os, rlx
        from tests.unit.test_weight_files import generator, weights
        import safetensors.numpy
        path = {str(model_file)!r}
        gen = generator(path)
        gen.generate_cached(2)
        # The mapped file loses its pages, and its path now names another file (so the check
        # before the run passes): only the fault itself can tell.
        os.truncate(path, 0)
        os.replace(path, {str(tmp_path / "old")!r})
        safetensors.numpy.save_file(weights(3), path)
        try:
            gen.step_cached()
            print("no error")
        except rlx.Error as e:
            print("rlx.Error:", e)
        try:
            gen.step_cached()
        except rlx.Error:
            print("still refused")
        print("alive", len(generator(path).generate_cached(2)))
    """)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root,
                         env={**os.environ, "PYTHONPATH": f"{Path(rlx.__file__).parents[1]}:{root}"})
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    assert lines[0].startswith("rlx.Error: a weights file was truncated while the model used it"), lines
    assert lines[1:] == ["still refused", "alive 2"]
