"""The fair harness's arithmetic (benchmarks/bench_fair.py, fair_gate.py, fair_report.py): the
ratio statistics, the logits gate, the grade that keeps a record which is not a measurement out
of benchmarks/README.md. Pure functions, no engine runs (the harness end to end: `make
bench-smoke`)."""

import json
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
bench_fair = pytest.importorskip("bench_fair")
fair_gate = pytest.importorskip("fair_gate")
fair_report = pytest.importorskip("fair_report")


def test_ratio_stats_constant_ratio():
    s = bench_fair.ratio_stats([1.0, 2.0, 0.5], [2.0, 4.0, 1.0])  # peer twice as slow every round
    assert s["ratio"] == pytest.approx(2.0, rel=1e-12)
    assert s["ci95"] == pytest.approx([2.0, 2.0], rel=1e-12)
    assert s["n"] == 3 and s["min"] == pytest.approx(2.0) and s["max"] == pytest.approx(2.0)


def test_ratio_stats_geometric_mean_and_interval():
    t_rlx = [1.0] * 10
    t_peer = [0.5, 2.0] * 5  # ratios 0.5 and 2: geometric mean 1
    s = bench_fair.ratio_stats(t_rlx, t_peer)
    assert s["ratio"] == pytest.approx(1.0, rel=1e-12)
    lo, hi = s["ci95"]
    assert 0.5 < lo < 1.0 < hi < 2.0  # the interval straddles 1 (a tie) and stays inside the extremes
    assert bench_fair.ratio_stats(t_rlx, t_peer) == s  # fixed seed: the same interval every time


def test_gate_tolerance():
    tol, bits = fair_gate.gate_tolerance("bf16", "f16", 28)
    assert bits == 8 and tol == pytest.approx(2.0 ** -8 * math.sqrt(28) * 4)
    tol, bits = fair_gate.gate_tolerance("f32", "f32", 16)
    assert bits == 24 and tol == pytest.approx(2.0 ** -24 * 4 * 4)
    assert fair_gate.gate_tolerance("q4_k", "f16", 16)[1] == 4  # quantized weights: 4 bits


def _logits(rows=4, vocab=50, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, vocab)).astype(np.float32) * 3


def test_compare_logits_identical_passes():
    ref = _logits()
    c = fair_gate.compare_logits(ref.copy(), ref, tol=1e-6)
    assert c["pass"] and c["max_abs"] == 0.0 and c["top1_agree"] == 4 and c["kl_max"] == pytest.approx(0, abs=1e-12)


def test_compare_logits_fails_on_size_kl_and_decided_top1():
    ref = _logits()
    assert not fair_gate.compare_logits(ref + 0.1, ref, tol=1e-3)["pass"]  # |delta| / scale above tol
    rl = ref.copy()
    j = int(np.argmin(ref[2]))
    rl[2, j] = ref[2].max() + 5.0  # another top-1 by a wide margin: decided, and a large KL
    c = fair_gate.compare_logits(rl, ref, tol=10.0)
    assert not c["pass"] and c["top1_disagree_rows"] == [2] and c["kl_max"] > 1e-3


def test_compare_logits_near_tie_may_flip():
    ref = _logits()
    top = np.argsort(ref[1])[-2:]
    ref[1, top[0]] = ref[1, top[1]] - 1e-4  # llama.cpp's own top-2 margin 1e-4
    rl = ref.copy()
    rl[1, top[0]] += 2e-4  # flips the top-1 with |delta| 2e-4 >= margin / 2
    c = fair_gate.compare_logits(rl, ref, tol=1e-3)
    assert c["top1_disagree_rows"] == [1] and c["pass"]


def test_compare_logits_relative_to_the_oracle():
    """Quantized weights: the KL part is relative to the f32 oracle. Two engines each a similar
    distance from the oracle pass even when they are further than 1e-3 from each other; rlx
    measurably further from the oracle than the peer fails."""
    rng = np.random.default_rng(3)
    oracle = rng.normal(size=(32, 200)) * 3
    peer = oracle + rng.normal(size=oracle.shape) * 0.06
    rl = oracle + rng.normal(size=oracle.shape) * 0.06
    c = fair_gate.compare_logits(rl, peer, tol=1.0)
    assert not c["pass"] and c["kl_max"] > 1e-3  # the fixed rule between the engines stops it
    k_rl, k_peer = fair_gate.kl_rows(oracle, rl), fair_gate.kl_rows(oracle, peer)
    c = fair_gate.compare_logits(rl, peer, tol=1.0, oracle=oracle)
    o = c["oracle"]
    assert o["kl_rlx_mean"] == pytest.approx(k_rl.mean()) and o["kl_peer_mean"] == pytest.approx(k_peer.mean())
    assert o["diff_mean"] == pytest.approx((k_rl - k_peer).mean())
    assert o["diff_se"] == pytest.approx((k_rl - k_peer).std(ddof=1) / math.sqrt(32))
    assert c["pass"] == (o["diff_mean"] <= 2 * o["diff_se"]) and c["pass"]
    worse = oracle + rng.normal(size=oracle.shape) * 0.12  # twice the noise: ~4x the KL
    c = fair_gate.compare_logits(worse, peer, tol=1.0, oracle=oracle)
    assert not c["pass"] and not c["oracle"]["pass"] and c["oracle"]["diff_mean"] > 2 * c["oracle"]["diff_se"]
    better = oracle + rng.normal(size=oracle.shape) * 0.01
    assert fair_gate.compare_logits(better, peer, tol=1.0, oracle=oracle)["pass"]


def test_compare_logits_oracle_units():
    """The paired difference is averaged per unit (a prompt: its rows share one KV cache) and its
    standard error taken over the units: a difference shared by the rows of each unit is one
    sample per unit, not one per row."""
    rng = np.random.default_rng(4)
    oracle = rng.normal(size=(32, 200)) * 3
    peer = oracle + rng.normal(size=oracle.shape) * 0.05
    rl = oracle + rng.normal(size=oracle.shape) * 0.05
    units = np.repeat(np.arange(8), 4)
    c = fair_gate.compare_logits(rl, peer, tol=1.0, oracle=oracle, units=units)
    d = fair_gate.kl_rows(oracle, rl) - fair_gate.kl_rows(oracle, peer)
    per_unit = d.reshape(8, 4).mean(axis=1)
    o = c["oracle"]
    assert o["units"] == 8 and o["diff_per_unit"] == pytest.approx(per_unit)
    assert o["diff_mean"] == pytest.approx(per_unit.mean())
    assert o["diff_se"] == pytest.approx(per_unit.std(ddof=1) / math.sqrt(8))
    assert o["pass"] == (per_unit.mean() <= 2 * o["diff_se"])
    assert len(bench_fair.gate_inputs(1000)) == fair_gate.GATE_PROMPTS  # distinct prompts, fixed
    assert len({tuple(p) for p, _ in bench_fair.gate_inputs(1000)}) == fair_gate.GATE_PROMPTS
    assert bench_fair.gate_inputs(1000) == bench_fair.gate_inputs(1000)
    assert bench_fair.gate_inputs(1000, 12)[: fair_gate.GATE_PROMPTS] == bench_fair.gate_inputs(1000)  # and 4 more
    assert len({tuple(p) for p, _ in bench_fair.gate_inputs(1000, 12)}) == 12


def _gate_sample(rng_seed: int, noise_rl, noise_peer: float = 0.05, rows: int = 4, vocab: int = 200):
    """A gate_peers sample function over fake draws: draw i's oracle logits and each engine's noise
    fixed per (draw, engine); noise_rl(i) rlx's noise on draw i. Records the calls."""
    calls = []

    def draw(i, who, noise):
        base = np.random.default_rng([rng_seed, i]).normal(size=(rows, vocab)) * 3
        return base + np.random.default_rng([rng_seed, i, who]).normal(size=base.shape) * noise

    def sample(lo, hi, labels):
        calls.append((lo, hi, tuple(labels)))
        lg = {lab: np.concatenate([draw(i, k + 1, noise_rl(i) if k == 0 else noise_peer) for i in range(lo, hi)])
              for k, lab in enumerate(labels)}
        return lg, np.concatenate([draw(i, 0, 0.0) for i in range(lo, hi)])

    return sample, calls


def _units(k, rows=4):
    return np.repeat(np.arange(k), rows)


def test_gate_peers_widens_a_kl_only_failure():
    """A narrow gate that fails on the relative KL rule alone is decided on GATE_WIDEN times the
    draws, the narrow ones among them: a chance excess on the first draws (rlx noisier there
    only) passes there, and the narrow comparison is kept."""
    n, m = 8, 8 * fair_gate.GATE_WIDEN
    sample, calls = _gate_sample(11, lambda i: 0.062 if i < n else 0.05)  # narrow +2.6 se, wide +1.0
    log = []
    out = fair_gate.gate_peers(["rlx", "peer"], sample, n, _units, 1.0, log.append, "prompt")
    c = out["peer"]
    assert not c["narrow"]["pass"] and fair_gate.kl_only_failure(c["narrow"]), log
    assert c["pass"] and c["oracle"]["units"] == m and c["rows"] == 4 * m
    assert calls == [(0, n, ("rlx", "peer")), (n, m, ("rlx", "peer"))] and "widens to 64 prompts" in log[1]


def test_gate_peers_real_excess_and_size_failures_stop():
    """rlx further from the oracle on every draw fails the wider gate too; a difference of size
    (beyond tol) stops the narrow gate without widening."""
    n = 8
    sample, calls = _gate_sample(12, lambda i: 0.07)
    out = fair_gate.gate_peers(["rlx", "peer"], sample, n, _units, 1.0, lambda _: None, "prompt")
    assert not out["peer"]["pass"] and not out["peer"]["narrow"]["pass"] and len(calls) == 2
    sample, calls = _gate_sample(12, lambda i: 0.07)
    out = fair_gate.gate_peers(["rlx", "peer"], sample, n, _units, 1e-4, lambda _: None, "prompt")
    assert not out["peer"]["pass"] and "narrow" not in out["peer"] and len(calls) == 1
    sample, calls = _gate_sample(12, lambda i: 0.05)  # equal: passes narrow, never widens
    out = fair_gate.gate_peers(["rlx", "peer"], sample, n, _units, 1.0, lambda _: None, "prompt")
    assert out["peer"]["pass"] and len(calls) == 1


def test_kl_rows():
    p = np.log(np.array([[0.5, 0.5], [0.9, 0.1]]))
    q = np.log(np.array([[0.5, 0.5], [0.5, 0.5]]))
    assert fair_gate.kl_rows(p, q) == pytest.approx([0.0, 0.9 * math.log(1.8) + 0.1 * math.log(0.2)])
    assert fair_gate.kl_rows(p + 7.0, q - 2.0) == pytest.approx(fair_gate.kl_rows(p, q))  # logits, any offset


def _record(**kw):
    r = {"suite": "short", "settings": {"smoke": False, "quick": False, "rounds": 10, "long_rounds": 10},
         "rlx": {"dirty": False}, "cells": [{"loadavg_start": (0.2, 0.3, 0.4)}]}
    for k, v in kw.items():
        if k in r["settings"]:
            r["settings"][k] = v
        elif k == "dirty":
            r["rlx"]["dirty"] = v
        else:
            r[k] = v
    return r


def test_grade():
    assert fair_report.grade(_record()) == []
    assert any("smoke" in w for w in fair_report.grade(_record(smoke=True)))
    assert any("rounds" in w for w in fair_report.grade(_record(rounds=9)))
    assert any("uncommitted" in w for w in fair_report.grade(_record(dirty=True)))
    assert any("busy" in w for w in fair_report.grade(_record(cells=[{"loadavg_start": (1.7, 1.0, 1.0)}])))
    assert any("stopped" in w for w in fair_report.grade(_record(stopped="gate failed")))
    assert fair_report.grade(_record(long_rounds=3)) == []  # long_rounds count only in the long suite
    assert any("rounds" in w for w in fair_report.grade(_record(suite="long", long_rounds=3)))


def test_decode_bytes_counts_the_chosen_experts(tmp_path):
    """decode_bytes on a qwen3moe file (bench_moe's writer, a tiny shape): per part, the bytes
    gguf-py's reader gives the tensors, experts at k / E of theirs; an untied embedding one row."""
    gguf = pytest.importorskip("gguf")
    bench_moe = pytest.importorskip("bench_moe")
    shape = dict(bench_moe.TINY, vocab_size=512, num_experts=8, num_experts_per_tok=2)
    cfg = bench_moe.model_config(shape, 2)
    path = str(tmp_path / "moe-bf16.gguf")
    bench_moe.write_bf16_source(cfg, path, log=lambda msg: None)
    by_name = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    d = bench_fair.decode_bytes(path)
    assert (d["experts"], d["experts_per_token"]) == (8, 2)
    assert d["all"] == sum(by_name.values())
    exps = sum(b for n, b in by_name.items() if "_exps." in n)
    assert d["parts"]["experts (k of E)"] == exps * 2 // 8 and exps > 0
    assert d["parts"]["router"] == sum(b for n, b in by_name.items() if "ffn_gate_inp" in n) == 2 * 8 * 256 * 4
    assert d["parts"]["LM head"] == by_name["output.weight"]
    assert d["parts"]["embedding row"] == by_name["token_embd.weight"] // 512
    assert d["parts"]["attention"] == sum(b for n, b in by_name.items() if ".attn_" in n and "norm" not in n)
    assert d["parts"]["norms"] == sum(b for n, b in by_name.items() if "norm" in n)
    assert d["parts"]["dense MLP"] == 0 and d["active"] == sum(d["parts"].values())


@pytest.mark.parametrize("failure, code", [(None, 0), ("stop", 2), ("crash", 1)])
def test_run_groups_records_every_group_until_the_first_failure(tmp_path, failure, code):
    record = _record(cells=[], date="2026-12-01T00:00:00", machine={})
    out = str(tmp_path / "rec.json")
    ran = []

    def run_one(cell, group):
        ran.append(group)
        cell["loadavg_start"] = (0.1, 0.1, 0.1)
        if group == 2 and failure == "stop":
            raise bench_fair.StopRun("gate failed")
        if group == 2 and failure == "crash":
            raise RuntimeError("worker died")
        cell["ok"] = True

    args = type("Args", (), {"wait_quiet": 0.0, "readme": False})()
    got = bench_fair.run_groups(record, [1, 2, 3], run_one, out=out, t_start=0.0, args=args, log=lambda m: None,
                                markdown_fn=lambda r: f"{len(r['cells'])} cells", title="t", readme_section="s")
    assert got == code
    assert ran == ([1, 2, 3] if failure is None else [1, 2])  # the first failure ends the run
    with open(out) as f:
        saved = json.load(f)
    assert len(saved["cells"]) == len(ran) and saved["cells"][0]["ok"]
    assert (saved.get("stopped") is None) == (failure is None)
    assert (saved["not_a_measurement"] == []) == (failure is None)  # a stopped run is not a measurement
    assert open(str(tmp_path / "rec.md")).read() == f"# t, 2026-12-01T00:00:00\n\n{len(ran)} cells"


def test_run_groups_records_the_load_the_wait_let_go(tmp_path, monkeypatch):
    """With --wait-quiet the group's starting load is the one wait_quiet read when it let the
    group go (the load average can tick up in the moment before the group reads it again)."""
    record = _record(cells=[], date="2026-12-01T00:00:00", machine={})
    monkeypatch.setattr(bench_fair, "wait_quiet", lambda max_load, timeout, log: [0.49, 0.4, 0.3])

    def run_one(cell, group):
        cell.setdefault("loadavg_start", (0.9, 0.9, 0.9))  # what short_group does
        cell["ok"] = True

    args = type("Args", (), {"wait_quiet": 0.5, "readme": False})()
    assert bench_fair.run_groups(record, [1], run_one, out=str(tmp_path / "r.json"), t_start=0.0, args=args,
                                 log=lambda m: None, markdown_fn=lambda r: "", title="t", readme_section="s") == 0
    assert record["cells"][0]["loadavg_start"] == [0.49, 0.4, 0.3] and record["not_a_measurement"] == []


def test_weight_pages_lines():
    """Each engine's pages of the model file, beside the page cache's, per cell; nothing for cells
    recorded before weight_pages existed."""
    pages = {"rlx": {"peak_rss_mib": 1.0, "weight_pages": {"resident_mib": 380.0, "huge_mib": 376.0}},
             "llama.cpp fa=on": {"peak_rss_mib": 1.0, "weight_pages": {"resident_mib": 376.0, "huge_mib": 374.0}}}
    cell = {"suite": "short", "model": "Qwen3-0.6B", "weights": "q4_k_m", "threads": 2,
            "page_cache": {"resident_mib": 376.0, "huge_mib": 374.0, "s": 0.5}, "mem": pages}
    lines = fair_report.weight_pages_lines([cell])
    assert lines[-1] == ("- Qwen3-0.6B q4_k_m t2: page cache 374 of 376 MiB in 2 MiB pages before loading; "
                         "rlx 376 of 380, llama.cpp fa=on 374 of 376")
    long_cell = {**cell, "suite": "long", "contexts": [1024], "mem": {"loaded": {}, "ctx1024": pages}}
    assert fair_report.weight_pages_lines([long_cell])[-1].startswith("- Qwen3-0.6B q4_k_m t2: page cache 374")
    assert fair_report.weight_pages_lines([{**cell, "page_cache": None}]) == []
    old = {**cell, "mem": {"rlx": {"peak_rss_mib": 1.0}}}
    assert fair_report.weight_pages_lines([old]) == []


def test_fair_table_marks_wins_ties_and_losses():
    fair_table = pytest.importorskip("fair_table")

    def ratios(*pairs):  # (ratio, lo, hi) against flash attention off, then on
        return {"ratios": {k: {"ratio": r, "ci95": [lo, hi]} for k, (r, lo, hi) in zip(fair_table.PEERS, pairs)}}

    rec = {
        "date": "2026-12-03T19:00:00",
        "rlx": {"commit": "abc123"},
        "machine": {"cpu": "AMD EPYC", "nproc": 2, "rlx_isa": "avx2", "env": {"RLX_CPU_ISA": "avx2"}},
        "not_a_measurement": [],
        "cells": [
            {"model": "Qwen3-0.6B-q4_k_m", "weights": "q4_k_m", "threads": 2,
             "metrics": {"pp128": ratios((1.5, 1.4, 1.6), (0.9, 0.85, 0.95)),
                         "tg@128": ratios((1.0, 0.97, 1.04), (1.2, 1.1, 1.3))}},
            {"model": "Qwen3-0.6B-q6_k", "weights": "q6_k", "threads": 2, "metrics": {}},  # not run: no row
        ],
    }  # fmt: skip
    out = fair_table.table("results/x.json", rec).splitlines()
    head = "- `x.json`: 2026-12-03, rlx abc123, AMD EPYC, 2 cores, rlx kernels avx2 (RLX_CPU_ISA=avx2)"
    assert out[0].startswith(head)
    assert out[0].endswith("graded")
    assert out[2] == "| model | weights | threads | pp128 | decode @128 |"
    assert out[4] == "| Qwen3-0.6B | q4_k_m | 2 | 1.50x / **0.90x [0.85, 0.95]** | 1.00x (tie [0.97, 1.04]) / 1.20x |"
    assert len(out) == 5
    rec["not_a_measurement"] = ["the run stopped before its end"]
    assert fair_table.table("x.json", rec).splitlines()[0].endswith("NOT graded: the run stopped before its end")


def test_worker_build_info_leaves_vulkan_out_of_the_worker():
    """fair_worker asks rlx.build_info() in a child process: describing the Vulkan backend loads the
    Vulkan loader and its driver, which would count in the rlx worker's peak RSS. The worker's own
    process maps no libvulkan after it, and the child's answer is this build's, with the threads asked."""
    pytest.importorskip("rlx")
    import subprocess

    code = ("import sys; sys.path.insert(0, sys.argv[1]); import fair_worker as fw; bi = fw.rlx_build_info(1); "
            "maps = open('/proc/self/maps').read(); import rlx; "
            "print(bi['isa'] == rlx.build_info()['isa'], bi['blas_threads'], 'libvulkan' in maps)")
    r = subprocess.run([sys.executable, "-c", code, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "1", "False"]
