"""Replays every fuzz target's committed inputs under plain pytest (no atheris needed): the seed
corpus (tests/fuzz/corpus/<target>/) and the crash files of past findings
(tests/fuzz/crashes/<target>-*), so that a fixed finding stays fixed. Each input must end in
success or one of the target's acceptable exceptions, exactly as under the fuzzer. The fuzzing
itself runs in `make test` (bounded) and `make fuzz` (tools/run_fuzz.sh)."""

from __future__ import annotations

import glob
import importlib
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("config_file", "weights_file", "tokenizer_dir", "gguf_file")


def inputs() -> list[tuple[str, str]]:
    out = []
    for t in TARGETS:
        files = glob.glob(os.path.join(HERE, "corpus", t, "*")) + glob.glob(os.path.join(HERE, "crashes", f"{t}-*"))
        out += [(t, f) for f in sorted(files)]
    return out


@pytest.fixture(autouse=True)
def scratch(tmp_path, monkeypatch):
    import fuzz_common

    monkeypatch.setenv("RLX_FUZZ_SCRATCH", str(tmp_path))
    monkeypatch.setattr(fuzz_common, "_root", None)


def test_every_target_has_seeds():
    for t in TARGETS:
        assert len(glob.glob(os.path.join(HERE, "corpus", t, "seed-*"))) >= 5, t


@pytest.mark.parametrize("target, path", inputs(), ids=lambda v: os.path.basename(v))
def test_replay(target, path):
    module = importlib.import_module(target)
    with open(path, "rb") as f:
        module.test_one_input(f.read())


def test_config_seeds_reach_both_outcomes():
    """The seeds exercise both outcomes: some configs load, some are refused."""
    import config_file
    import fuzz_common
    from rlx.config import load_config
    from rlx.errors import ConfigError

    outcomes = []
    for path in sorted(glob.glob(os.path.join(HERE, "corpus", "config_file", "seed-*"))):
        with open(path, "rb") as f:
            config_file.test_one_input(f.read())
        try:  # the directory the input left behind, loaded again
            load_config(os.path.join(fuzz_common.scratch_root(), "model"))
            outcomes.append("loaded")
        except (ConfigError, FileNotFoundError):
            outcomes.append("refused")
    assert outcomes.count("loaded") >= 5 and outcomes.count("refused") >= 3, outcomes
