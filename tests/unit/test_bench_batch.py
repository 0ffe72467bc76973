"""benchmarks/bench_batch.py's arithmetic: the ragged prompt lengths, the inputs fixed per batch, the
llama.cpp cells per sequence, the scaling statistics, and the table from a made-up record. Pure
functions, no engine runs (the harness end to end: `python benchmarks/bench_batch.py --smoke`)."""

import argparse
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
bench_batch = pytest.importorskip("bench_batch")


@pytest.mark.parametrize("b", [1, 2, 4, 8, 16])
def test_prompt_lengths_ragged_same_mean(b):
    lens = bench_batch.prompt_lengths(b, 32, 96)
    assert len(lens) == b and min(lens) >= 32 and max(lens) <= 96
    assert sum(lens) / b == pytest.approx(64, abs=0.5)  # the same mean context at every B
    if b > 1:
        assert lens[0] == 32 and lens[-1] == 96 and len(set(lens)) == b  # ragged: every length differs


def test_batch_inputs_fixed_and_distinct():
    a, b = bench_batch.batch_inputs(1000, 4, 32, 96), bench_batch.batch_inputs(1000, 4, 32, 96)
    assert a == b  # fixed per (b, sequence): the same prompts for every engine and every run
    assert [len(p) for p in a["prompts"]] == a["lengths"]
    assert len({tuple(p[:32]) for p in a["prompts"]}) == 4  # distinct prompts
    assert all(len(f) == bench_batch.GATE_STEPS for f in a["feed"]) and len(a["tok"]) == 4
    assert all(300 <= t < 999 for p in a["prompts"] for t in p)


@pytest.mark.parametrize("b,reps", [(1, 8), (2, 4), (3, 3), (4, 2), (8, 1), (16, 1)])
def test_gate_reps_and_extra_batches(b, reps):
    assert bench_batch.gate_reps(b) == reps and reps * b >= bench_batch.GATE_SEQUENCES
    base = bench_batch.batch_inputs(1000, b, 32, 96)
    assert bench_batch.batch_inputs(1000, b, 32, 96, 0) == base  # rep 0: the timed batch itself
    seqs = {tuple(p) for r in range(reps) for p in bench_batch.batch_inputs(1000, b, 32, 96, r)["prompts"]}
    assert len(seqs) == reps * b  # every gate sequence differs
    assert bench_batch.batch_inputs(1000, b, 32, 96, 1)["lengths"] == base["lengths"]
    more = bench_batch.gate_reps(b, 32)
    assert more * b >= 32 and (more - 1) * b < 32  # --gate-sequences 32: the fewest batches of b that hold 32
    args = argparse.Namespace(prompt_min=32, prompt_max=96, gate_sequences=32)
    gb = bench_batch.gate_batches(1000, b, args)
    assert len(gb) == more and gb[0] == base  # the timed batch first


class _FakeWorker:
    """A worker whose batch_logits are oracle + its own noise (the same for the same prompt)."""

    def __init__(self, label, noise, vocab=64):
        self.label, self.noise, self.vocab, self.pid = label, noise, vocab, id(self)

    def logits(self, prompts, feed):
        out = np.empty((len(prompts), 1 + len(feed[0]), self.vocab), dtype=np.float32)
        for i, (p, f) in enumerate(zip(prompts, feed)):
            for j in range(1 + len(f)):
                rng = np.random.default_rng([sum(p), len(p), j])
                base = rng.normal(size=self.vocab) * 3
                out[i, j] = base + np.random.default_rng([sum(p), j, 7 + int(self.noise * 1000)]).normal(
                    size=self.vocab) * self.noise
        return out

    def call(self, cmd, prompts, feed, out):
        assert cmd == "batch_logits"
        np.save(out, self.logits(prompts, feed))


@pytest.mark.parametrize("b", [1, 4, 16])
def test_batch_gate_relative_to_the_oracle(b, tmp_path):
    """Quantized weights: the batch gate's KL rule is bench_fair's relative one, over the gate's
    sequences (at least 8 at every B); two engines each as far from the oracle pass though further
    than 1e-3 from each other, rlx measurably further fails, on the narrow gate and the wider one."""
    args = argparse.Namespace(prompt_min=32, prompt_max=96, gate_sequences=bench_batch.GATE_SEQUENCES)
    n = bench_batch.gate_reps(b)
    inputs = bench_batch.gate_batches(1000, b, args, bench_batch.bf.GATE_WIDEN)
    assert len(inputs) == bench_batch.bf.GATE_WIDEN * n and inputs[:n] == bench_batch.gate_batches(1000, b, args)
    calls = []

    def oracle(lo, hi):
        calls.append((lo, hi))
        return bench_batch.batch_logits(_FakeWorker("oracle", 0.0), b, inputs[lo:hi], str(tmp_path))

    peer = _FakeWorker("llama.cpp fa=off", 0.2)
    log = []
    g = bench_batch.batch_gate([_FakeWorker("rlx", 0.201), peer], inputs, n, b, "q4_k_m", "f16", 28, str(tmp_path),
                               log.append, oracle)
    c = g["peers"]["llama.cpp fa=off"]
    assert g["kl_rule"] == "relative to the f32 oracle" and g["sequences"] == n * b
    assert c["oracle"]["units"] == n * b and c["kl_max"] > 1e-3 and g["pass"], log
    assert c["rows"] == n * b * (1 + bench_batch.GATE_STEPS) and calls == [(0, n)]  # passed narrow: not widened
    calls.clear()
    g = bench_batch.batch_gate([_FakeWorker("rlx", 0.4), peer], inputs, n, b, "q4_k_m", "f16", 28, str(tmp_path),
                               log.append, oracle)
    c = g["peers"]["llama.cpp fa=off"]
    assert not g["pass"] and "FAIL" in log[-1] and calls == [(0, n), (n, len(inputs))]  # widened, failed again
    assert c["oracle"]["units"] == len(inputs) * b and not c["narrow"]["pass"]
    g = bench_batch.batch_gate([_FakeWorker("rlx", 0.201), peer], inputs, n, b, "bf16", "f16", 28, str(tmp_path),
                               log.append)
    assert g["kl_rule"] == "KL(peer || rlx) <= 1e-3" and not g["pass"]  # 16-bit weights: the absolute rule


def test_n_ctx_seq_for():
    assert bench_batch.n_ctx_seq_for(96, 16) == 256
    assert bench_batch.n_ctx_seq_for(250, 16) == 512  # the longest prompt and a block must fit
    assert bench_batch.n_ctx_seq_for(96, 16) >= 96 + 16 + 1


def test_scaling_stats():
    t1 = [1.0, 1.1, 0.9]
    s = bench_batch.scaling_stats([2.0 * t for t in t1], t1, 8)  # 8 sequences in twice the time: 4x
    assert s["ratio"] == pytest.approx(4.0, rel=1e-12) and s["ci95"] == pytest.approx([4.0, 4.0], rel=1e-12)
    assert bench_batch.scaling_stats(t1, t1, 1)["ratio"] == pytest.approx(1.0)


def _record(stopped=None):
    import bench_fair as bf
    times = {1: {"rlx": [1.0, 1.0], "llama.cpp fa=off": [1.2, 1.2]},
             2: {"rlx": [1.1, 1.1], "llama.cpp fa=off": [2.0, 2.0]}}
    batches = {}
    for b, t in times.items():
        batches[str(b)] = {"b": b, "tokens": 4 * b, "times_s": t, "loadavg_1min": [0.1, 0.2],
                           "ratios": {"llama.cpp fa=off": bf.ratio_stats(t["rlx"], t["llama.cpp fa=off"])},
                           "scaling_vs_b1": {lab: bench_batch.scaling_stats(t[lab], times[1][lab], b) for lab in t},
                           "gate": {"pass": True, "peers": {"llama.cpp fa=off": {
                               "rel_max": 1e-3, "tol_rel": 8e-2, "kl_max": 1e-6, "top1_agree": 4 * b, "rows": 4 * b}}},
                           "token_agreement": {"llama.cpp fa=off": 1.0},
                           "readback": {"llama.cpp fa=off": {"n_ctx": 256 * b, "n_ctx_seq": 256, "kv_unified": "false",
                                                             "kv_alloc_mib": 28.0 * b}}}
    return {"date": "2026-12-01T00:00:00", "suite": "batch", "rlx": {"commit": "abc", "dirty": False},
            "llama_cpp": {"llama_cpp_python": "0.3.36", "libs": []},
            "machine": {"cpu": "cpu", "nproc": 2, "isa": "avx2", "rlx_isa": "avx2", "loadavg_start": (0.1, 0, 0),
                        "loadavg_end": (0.2, 0, 0)},
            "settings": {"smoke": False, "quick": False, "rounds": 10, "long_rounds": 10, "steps": 4,
                         "prompt_min": 32, "prompt_max": 96},
            "cells": [{"model": "m", "kv": "f16", "threads": 2, "loadavg_start": (0.1, 0, 0), "batches": batches,
                       "mem": {"rlx": {"peak_rss_mib": 100.0}}}], "stopped": stopped}


def test_markdown_table():
    import fair_report
    r = _record()
    assert fair_report.grade(r) == []
    md = bench_batch.markdown(r)
    assert "NOT A MEASUREMENT" not in md
    row2 = next(line for line in md.splitlines() if line.startswith("| m | f16 | 2 | 2 |"))
    assert "| 7.3 |" in row2 and "| 4.0 |" in row2  # aggregate tok/s: 8 tokens / 1.1 s, 8 / 2.0 s
    assert "1.82x" in row2  # rlx at B=2 against B=1: 2 * 1.0 / 1.1
    assert "B=2: PASS" in md and "n_ctx_seq 256" in md
    assert "--llama-extra-bufts off" not in md
    r["settings"]["llama_extra_bufts"] = "off"  # said in the record's first paragraph
    assert "extra weight buffers (AMX, CPU_REPACK) off (--llama-extra-bufts off" in bench_batch.markdown(r)
    r = _record(stopped="gate failed")
    r["not_a_measurement"] = fair_report.grade(r)
    md = bench_batch.markdown(r)
    assert md.startswith("**NOT A MEASUREMENT**") and "Run stopped: gate failed" in md
