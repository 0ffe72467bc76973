"""Replays every fuzz target's committed inputs under plain pytest (no atheris, no clang needed): the
seed corpus (tests/fuzz/corpus/<target>/) and the crash files of past findings
(tests/fuzz/crashes/<target>-*), so that a fixed finding stays fixed. Each input must end in
success or one of the target's acceptable exceptions, exactly as under the fuzzer. A C target
(tests/fuzz/<target>.c) is replayed by its replay program (tools/fuzz.mk: the system C compiler with
ASan and UBSan, tests/fuzz/replay_main.c instead of libFuzzer), all of its inputs in one process;
it aborts on a finding. The fuzzing itself runs in `make test` (bounded) and `make fuzz`
(tools/run_fuzz.sh)."""

from __future__ import annotations

import glob
import importlib
import os
import re
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGETS = ("config_file", "weights_file", "tokenizer_dir", "gguf_file")
C_TARGETS = ("tcp_wire",)


def target_files(t: str) -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "corpus", t, "*")) + glob.glob(os.path.join(HERE, "crashes", f"{t}-*")))


def inputs() -> list[tuple[str, str]]:
    return [(t, f) for t in TARGETS for f in target_files(t)]


@pytest.fixture(autouse=True)
def scratch(tmp_path, monkeypatch):
    import fuzz_common

    monkeypatch.setenv("RLX_FUZZ_SCRATCH", str(tmp_path))
    monkeypatch.setattr(fuzz_common, "_root", None)


def test_every_target_has_seeds():
    for t in TARGETS + C_TARGETS:
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


@pytest.fixture(scope="module")
def c_replay() -> dict[str, dict[str, str]]:
    """Each C target's replay program, built (incrementally) by tools/fuzz.mk and run once on all of
    the target's inputs (verbose): what it printed about each input, by file."""
    progs = {t: os.path.join("build", "fuzz", "replay", t) for t in C_TARGETS}
    r = subprocess.run(["make", "-s", "-f", "tools/fuzz.mk", *progs.values()], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"building the replay programs failed:\n{r.stdout}{r.stderr}"
    out = {}
    for t, prog in progs.items():
        files = target_files(t)
        r = subprocess.run([os.path.join(ROOT, prog), *files], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, RLX_FUZZ_VERBOSE="1"))
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
        assert r.returncode == 0, f"{t}'s replay failed (exit {r.returncode}); last lines:\n{tail}"
        assert f"replayed {len(files)} inputs" in r.stdout, tail
        chunks = re.split(r"^== (.*)$", r.stdout, flags=re.M)  # "== FILE" before each input's lines
        out[t] = dict(zip(chunks[1::2], chunks[2::2]))
    return out


@pytest.mark.parametrize("target", C_TARGETS)
def test_replay_c(target, c_replay):
    """Every seed and crash file of a C target ends without a finding (the program aborts on one)."""
    assert sorted(c_replay[target]) == target_files(target)


def test_tcp_wire_seeds_reach_every_outcome(c_replay):
    """The seeds open links on both sides, with and without a token, and pass frames over each; others
    are refused (tests/fuzz/tcp_wire.c prints one line per input)."""
    seeds = {f: text for f, text in c_replay["tcp_wire"].items() if os.path.basename(f).startswith("seed-")}
    runs = [m.groups() for text in seeds.values() for m in re.finditer(
        r"^tcp_wire: (acceptor|connector) (token|no-token): handshake (opened|failed), \d+ peer frames, "
        r"(\d+) received, (\d+) sent$", text, re.M)]
    assert len(runs) == len(seeds) >= 40
    for side in ("acceptor", "connector"):
        for token in ("token", "no-token"):
            mine = [r for r in runs if r[0] == side and r[1] == token]
            assert any(r[2] == "opened" and int(r[3]) >= 3 and int(r[4]) >= 2 for r in mine), (side, token, mine)
            assert any(r[2] == "failed" for r in mine), (side, token, mine)
    assert sum(r[2] == "failed" for r in runs) >= 15, runs
