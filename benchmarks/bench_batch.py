#!/usr/bin/env python3
"""bench_batch: aggregate decode speed of B sequences decoding together, rlx beside llama.cpp.

    python benchmarks/bench_batch.py --wait-quiet 0.5   # B = 1 2 4 8 16, Qwen3-0.6B bf16 + q4_k_m GGUF, KV f16, 2 threads
    python benchmarks/bench_batch.py --smoke            # the harness end to end (B = 1 2, 2 rounds, 4 steps): no figures
    python benchmarks/bench_batch.py --gguf FILE.gguf --batch 1 8 --threads 1 2 [--gate-sequences 32]

What it measures: B sequences of one model, each with its own prompt and its own KV cache, advanced
together one token each per step, in one engine call per step (rlx: Generator.step_batch, one plan;
llama.cpp: one llama_decode of a llama_batch carrying one token per sequence). Aggregate decode
tok/s = B * S / seconds of S such steps. The questions: how much does batching buy each engine
(B = k against B = 1: decode reads every weight once per step, so B sequences should cost little
more than one), and how does rlx's batched decode compare with llama.cpp's own.

Design: bench_fair's, reused (its functions are imported, not copied):
- One worker process per engine (benchmarks/fair_worker.py, its batch_* commands): rlx, llama.cpp
  with flash attention off, llama.cpp with it on. All load the SAME GGUF file; KV cache type
  matched (f16 by default); threads t everywhere (environment, rlx.set_num_threads, llama.cpp
  n_threads = n_threads_batch = t). Load settings are read back and checked (check_readback).
- Per B, each worker opens B sequences (batch_open). llama.cpp gets a context of its own for
  them: n_seq_max = B, a KV cache per sequence (kv_unified false: this build's default, and
  llama-batched-bench's unless -kvu), n_ctx = B * n_ctx_seq so that every sequence has n_ctx_seq
  cells; flash attention, KV types, threads, n_seq_max, n_ctx_seq and kv_unified are read back
  from its log and context and checked.
- Prompts: per B, B distinct prompts (fixed random ids) of lengths spread evenly over
  [--prompt-min, --prompt-max] (32..96: ragged; the mean, 64, is the same at every B, so the
  ratio B = k / B = 1 compares the same mean context). The same prompts for every engine.
- The gate, per B, before B is timed: every worker runs batches of B prompts, each in one
  batched pass and then 3 batched steps feeding fixed tokens (batch_logits): the timed batch and
  as many more of B (other ids, the same lengths) as make at least 8 sequences (gate_reps: 8
  batches of 1, 4 of 2, ..., 1 of 8 or 16; --gate-sequences N: at least N, the default's among
  them, recorded: the prompts are fixed and rlx's logits the same bits on every run, so a chance
  excursion of the default gate repeats on every run of a file, as bench_fair's --gate-prompts).
  rlx's (sequences * 4) rows of logits are compared with each llama.cpp variant's by
  fair_gate.compare_logits with its tolerance (gate_tolerance) and its KL rule:
  16/32-bit weights, KL(llama.cpp || rlx) <= 1e-3 on every row; quantized weights, rlx's mean KL
  from the f32 oracle (bench_fair.oracle_worker: the same file dequantised to f32, f32 KV, run on
  the same batches before the group's first B is timed and closed) no larger than llama.cpp's
  beyond two standard errors of the paired difference over the sequences; a gate failing on that
  rule alone widens once to 8 times its batches and decides there (fair_gate.gate_peers; the
  wider batches' oracle logits from an oracle worker started for them). Why relative: both
  engines quantise activations and round K/V, so they differ from each other by about as much as
  each from the oracle (Llama-3.2-1B q4_k_m: KL 2.5e-3 between them, ~2e-3 each from the oracle),
  beyond any fixed bound that would still catch a real error. A failure stops the run (exit code
  2) before B is timed.
- Timing: one untimed block per worker (plans compiled, pages in), then --rounds rounds (10); in
  round i every worker runs one block, in an order rotated by i, one at a time, --settle seconds
  after each (bench_fair.rounds, which also records the CPU seconds the other workers used during
  each run and the load average). A block: every sequence is cut back to its prompt, fed one
  fixed token, then S = --steps (16) batched greedy steps are timed inside the worker (greedy:
  rlx's argmax in C; llama.cpp: NumPy argmax of each sequence's llama_get_logits_ith row).
- Statistics: per B, rlx / llama.cpp = geometric mean of the per-round speed ratios with a 95 %
  bootstrap interval (bench_fair.ratio_stats); each engine's scaling B = k against B = 1 =
  geometric mean over rounds i of (k / t_k[i]) / (1 / t_1[i]) with the same bootstrap, t_1[i] the
  B = 1 block the worker ran beside the batch's in the same round: every worker keeps one more
  sequence (a "ref" batch slot: B = 1's prompt and token; llama.cpp: a second context of its own,
  n_seq_max 1, which its peak RSS includes), and in each round of B > 1 runs its block right after
  the batch's (even rounds) or right before (odd ones). Until 2026-12-07 t_1[i] was the i-th round
  of the B = 1 cell, timed minutes earlier: this host's speed moves by a third between such
  minutes (Qwen3-0.6B Q4_K_M, rlx: 2.20x-2.94x at B = 8 over five records), so that figure is kept
  in the record as scaling_vs_b1_cell, not in the table. Targets of issue 13: rlx's scaling >= 3x
  at B = 8; rlx / llama.cpp >= 1.0 at every B.
- Grade: fair_report.grade (>= 10 rounds, a clean tree, no --smoke, a quiet machine at the start of
  every group, a run that reached its end); otherwise the record says "not a measurement".

The record: benchmarks/results/batch-<date>[-smoke].json and its table as .md (git-ignored), with
everything bench_fair records (commit, versions, machine and ISA, read-back settings of every
context, every timing of every round, the other workers' CPU seconds, the load averages, the gate's
numbers, peak RSS per worker), the prompts' lengths and the greedy tokens of each engine's last
block (agreement reported, not gated).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_fair as bf  # noqa: E402
import common  # noqa: E402
import fair_gate as fg  # noqa: E402
import fair_report as fr  # noqa: E402

MODEL = "Qwen3-0.6B"
GATE_STEPS = fg.GATE_STEPS  # bench_fair's: fed tokens after each prompt
GATE_SEQUENCES = 8  # the gate's independent sequences per B, at least (gate_reps)
BATCHES = (1, 2, 4, 8, 16)
LOAD_N_CTX = 512  # the Llama object's own context (idle in this benchmark; the batch contexts are separate)


# ============================================================================== inputs ====

def prompt_lengths(b: int, lo: int, hi: int) -> list[int]:
    """b prompt lengths spread evenly over [lo, hi]; one prompt: the middle. The mean is
    (lo + hi) / 2 (to rounding) at every b."""
    if b == 1:
        return [(lo + hi) // 2]
    return [int(round(lo + (hi - lo) * i / (b - 1))) for i in range(b)]


def batch_inputs(vocab: int, b: int, lo: int, hi: int, rep: int = 0) -> dict:
    """The prompts, the gate's feed tokens and the timed blocks' first tokens of b sequences,
    fixed per (b, sequence); rep > 0: another batch of b like it (other ids, the same lengths),
    for the gate's extra sequences."""
    lens = prompt_lengths(b, lo, hi)
    r = 100_000 * rep
    return {"lengths": lens,
            "prompts": [bf.prompt_ids(vocab, n, salt=r + 1000 * b + i) for i, n in enumerate(lens)],
            "feed": [bf.prompt_ids(vocab, GATE_STEPS, salt=r + 2000 * b + i) for i in range(b)],
            "tok": [bf.prompt_ids(vocab, 1, salt=r + 3000 * b + i)[0] for i in range(b)]}


def gate_reps(b: int, sequences: int = GATE_SEQUENCES) -> int:
    """Batches of b the gate runs: enough for `sequences` independent sequences (--gate-sequences)."""
    return -(-sequences // b)


def gate_batches(vocab: int, b: int, args, widen: int = 1) -> list[dict]:
    """The gate's batches of b: the timed one (rep 0) first, then the others gate_reps asks;
    widen: that many times as many (fair_gate.gate_peers' wider gate), the narrow ones first."""
    return [batch_inputs(vocab, b, args.prompt_min, args.prompt_max, r)
            for r in range(widen * gate_reps(b, args.gate_sequences))]


def n_ctx_seq_for(hi: int, steps: int) -> int:
    """Cells per sequence in llama.cpp's batch context: the longest prompt, the gate's feed or a
    timed block (one fed token and its steps), rounded up to 256."""
    need = hi + max(GATE_STEPS, steps + 1) + 1
    return -(-need // 256) * 256


def scaling_stats(t_k: list[float], t_1: list[float], k: int) -> dict:
    """An engine's aggregate speed at B = k against B = 1, per round i (k / t_k[i]) / (1 / t_1[i]):
    geometric mean and 95 % bootstrap interval (bench_fair.ratio_stats's)."""
    return bf.ratio_stats([t / k for t in t_k], t_1)


def ensure_gguf(wtype: str, log) -> str:
    """Qwen3-0.6B's GGUF file of weight type wtype: bf16 written by common.py, the block types from
    it by rlx.quantize (as bench_fair's q8_0 / q4_k_m files were)."""
    bf16 = common.ensure_model(MODEL, "bf16", log=log)["gguf"]
    if wtype == "bf16":
        return bf16
    path = os.path.join(common.MODEL_DIR, f"{MODEL}-{wtype}.gguf")
    if not os.path.exists(path):
        import rlx
        log(f"== writing {os.path.relpath(path, common.ROOT)} from the bf16 file (rlx.quantize, {wtype})")
        rlx.quantize(bf16, path + ".tmp", type=wtype)
        os.replace(path + ".tmp", path)
    return path


# =============================================================================== checks ====

def check_batch_readback(workers, rbs: dict, kv: str, threads: int, b: int, n_ctx_seq: int) -> list[str]:
    """The batch contexts' settings as asked: bench_fair's checks (KV type, threads, flash
    attention), and llama.cpp's sequences and cells per sequence."""
    bad = bf.check_readback(workers, {lab: {"readback": rb} for lab, rb in rbs.items()}, kv, threads)
    for w in workers:
        rb = rbs[w.label]
        if rb.get("batch") != b:
            bad.append(f"{w.label}: {rb.get('batch')} sequences opened, asked {b}")
        if w.engine == "llama.cpp":
            if rb.get("n_seq_max") != b or rb.get("n_seq_max_ctx") != b:
                bad.append(f"{w.label}: n_seq_max read back {rb.get('n_seq_max')} / {rb.get('n_seq_max_ctx')}, "
                           f"asked {b}")
            if not isinstance(rb.get("n_ctx_seq"), int) or rb["n_ctx_seq"] < n_ctx_seq:
                bad.append(f"{w.label}: n_ctx_seq read back {rb.get('n_ctx_seq')}, asked {n_ctx_seq}")
    return bad


def batch_logits(w, b: int, inputs: list[dict], tmp: str) -> np.ndarray:
    """A worker's logits for the gate's batches of b (one batched pass each, then the fed steps),
    stacked sequence-major: (len(inputs) * b * (1 + GATE_STEPS), vocab)."""
    rows = []
    for inp in inputs:
        path = os.path.join(tmp, f"bgate-{w.pid}.npy")
        w.call(cmd="batch_logits", prompts=inp["prompts"], feed=inp["feed"], out=path)
        a = np.load(path)
        os.remove(path)
        rows.append(a.reshape(-1, a.shape[-1]))
    return np.concatenate(rows)


def batch_oracle(gguf: str, threads: int, batches: dict, n_ctx_seq: int, logdir: str, tmp: str, log) -> dict:
    """The f32 oracle's logits for the batches {b: [batch of b, ...]} (bench_fair.oracle_worker: the
    file's matrices dequantised to f32, f32 KV), before anything is timed; the worker closed."""
    w = bf.oracle_worker({"gguf": gguf, "threads": threads, "n_ctx": LOAD_N_CTX}, logdir, log)
    try:
        out = {}
        for b, inputs in batches.items():
            w.call(cmd="batch_open", b=b, n_ctx_seq=n_ctx_seq)
            out[b] = batch_logits(w, b, inputs, tmp)
        return out
    finally:
        w.close()


def batch_gate(workers, inputs: list[dict], n: int, b: int, wtype: str, kv: str, layers: int, tmp: str, log,
               oracle=None) -> dict:
    """bench_fair's gate (gate_peers) on batches of b: rlx's logits against each llama.cpp
    variant's, with bench_fair's tolerance, over the first n batches of `inputs` (gate_batches),
    widened to GATE_WIDEN * n of them where the relative KL rule alone fails. oracle(lo, hi): the
    f32 oracle's logits for batches lo..hi-1 (quantized weights; None: the absolute rule). A
    sequence's rows share its KV cache: the sequence is the unit."""
    by_label = {w.label: w for w in workers}

    def sample(lo: int, hi: int, labels: list[str]):
        logits = {lab: batch_logits(by_label[lab], b, inputs[lo:hi], tmp) for lab in labels}
        return logits, oracle(lo, hi) if oracle is not None else None

    tol, bits = fg.gate_tolerance(wtype, kv, layers)
    out = {"rows_per_sequence": 1 + GATE_STEPS, "sequences": n * b, "batches": n, "widen": fg.GATE_WIDEN,
           "precision_bits": bits, "tol_rel": tol,
           "kl_rule": "relative to the f32 oracle" if oracle is not None else "KL(peer || rlx) <= 1e-3"}
    out["peers"] = fg.gate_peers([w.label for w in workers], sample, n,
                                 lambda k: np.repeat(np.arange(k * b), 1 + GATE_STEPS), tol, log, "sequence")
    out["pass"] = all(c["pass"] for c in out["peers"].values())
    return out


# ================================================================================ group ====

def batch_group(cell, args, name, wtype, gguf, kv, threads, facts, logdir, tmp, log) -> None:
    vocab = facts["vocab"]
    n_ctx_seq = n_ctx_seq_for(args.prompt_max, args.steps)
    cell.update({"suite": "batch", "model": name, "weights": wtype, "gguf": gguf, "kv": kv, "threads": threads,
                 "facts": facts, "n_ctx_seq": n_ctx_seq, "batches": {}})
    cell.setdefault("loadavg_start", os.getloadavg())
    cell["page_cache"] = bf.warm_pages(gguf, log)
    workers, infos = bf.start_group(name, wtype, gguf, kv, threads, LOAD_N_CTX, args.fa, logdir, log,
                                    args.llama_extra_bufts == "on")
    cell["engines"] = infos
    try:
        bad = bf.check_readback(workers, infos, kv, threads)
        if bad:
            cell["readback_errors"] = bad
            raise bf.StopRun("; ".join(bad))
        narrow = None  # the oracle's logits for every B's narrow gate, before the first B is timed
        if wtype not in fg.PRECISION_BITS:
            narrow = batch_oracle(gguf, threads, {b: gate_batches(vocab, b, args) for b in args.batch}, n_ctx_seq,
                                  logdir, tmp, log)
        ref = batch_inputs(vocab, 1, args.prompt_min, args.prompt_max)  # B = 1's prompt and token
        for w in workers:  # one sequence kept beside every batch: its B = 1 block is timed in each round
            w.call(cmd="batch_open", b=1, n_ctx_seq=n_ctx_seq, slot="ref")
            path = os.path.join(tmp, f"bref-{w.pid}.npy")
            w.call(cmd="batch_logits", prompts=ref["prompts"], feed=ref["feed"], out=path, slot="ref")
            os.remove(path)
            w.call(cmd="batch_decode", n=ref["lengths"], tok=ref["tok"], steps=2, slot="ref")
        cell["ref_b1"] = {"prompt_lengths": ref["lengths"], "steps": args.steps}
        for b in args.batch:
            inp = batch_inputs(vocab, b, args.prompt_min, args.prompt_max)
            cb = cell["batches"][str(b)] = {"b": b, "prompt_lengths": inp["lengths"], "loadavg_start": os.getloadavg()}
            rbs = {w.label: w.call(cmd="batch_open", b=b, n_ctx_seq=n_ctx_seq)["readback"] for w in workers}
            cb["readback"] = rbs
            lc = [rb for lab, rb in rbs.items() if lab != "rlx"]
            log(f"  B={b}: prompts {inp['lengths'][0]}..{inp['lengths'][-1]} tokens" + (
                f"; llama.cpp n_ctx {lc[0].get('n_ctx')}, n_ctx_seq {lc[0].get('n_ctx_seq')}, kv_unified "
                f"{lc[0].get('kv_unified')}, n_seq_max {lc[0].get('n_seq_max')}" if lc else ""))
            bad = check_batch_readback(workers, rbs, kv, threads, b, n_ctx_seq)
            if bad:
                cb["readback_errors"] = bad
                raise bf.StopRun("; ".join(bad))
            batches = gate_batches(vocab, b, args, fg.GATE_WIDEN)
            n = gate_reps(b, args.gate_sequences)

            def oracle(lo, hi, b=b, batches=batches, n=n):  # the narrow gate's precomputed, a wider one's run now
                if (lo, hi) == (0, n):
                    return narrow[b]
                return batch_oracle(gguf, threads, {b: batches[lo:hi]}, n_ctx_seq, logdir, tmp, log)[b]

            cb["gate"] = g = batch_gate(workers, batches, n, b, wtype, kv, facts["layers"], tmp, log,
                                        oracle if narrow else None)
            if not g["pass"]:
                raise bf.StopRun(f"gate failed: {name} KV {kv} t{threads} B={b}")
            ns = inp["lengths"]
            for w in workers:  # warm-up: the batch's plans compiled, pages in
                w.call(cmd="batch_decode", n=ns, tok=inp["tok"], steps=2)
            last, ref_t, nblk = {}, {w.label: [] for w in workers}, {w.label: 0 for w in workers}

            def block(w):
                def ref_block():
                    ref_t[w.label].append(w.call(cmd="batch_decode", n=ref["lengths"], tok=ref["tok"],
                                                 steps=args.steps, slot="ref")["s"])
                first = b > 1 and nblk[w.label] % 2 == 1  # odd rounds: the B = 1 block before the batch's
                nblk[w.label] += 1
                if first:
                    ref_block()
                r = w.call(cmd="batch_decode", n=ns, tok=inp["tok"], steps=args.steps)
                if b > 1 and not first:
                    ref_block()
                last[w.label] = r["tokens"]
                return r["s"]

            cb.update(bf.rounds(workers, args.rounds, block, args.settle, log,
                                f"B={b} ({args.steps} steps, {b * args.steps} tokens per block)"))
            cb["tokens"] = b * args.steps
            cb["last_block_tokens"] = last
            if b > 1:  # against the B = 1 block of the same round
                cb["ref_b1_times_s"] = ref_t
                cb["scaling_vs_b1"] = {lab: scaling_stats(cb["times_s"][lab], ref_t[lab], b) for lab in ref_t}
            else:
                cb["scaling_vs_b1"] = {lab: scaling_stats(t, t, 1) for lab, t in cb["times_s"].items()}
            log(f"    B={b} against B=1 in the same rounds: " + ", ".join(
                f"{lab} {v['ratio']:.2f}x [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]" for lab, v in cb["scaling_vs_b1"].items()))
            rl = np.asarray(last["rlx"])
            cb["token_agreement"] = {lab: float(np.mean(rl == np.asarray(t))) for lab, t in last.items()
                                     if lab != "rlx"}
        one = cell["batches"].get("1")
        if one:  # against the B = 1 cell's rounds, by index (minutes apart): kept beside the paired figure
            for k, cb in cell["batches"].items():
                cb["scaling_vs_b1_cell"] = {lab: scaling_stats(cb["times_s"][lab], one["times_s"][lab], int(k))
                                            for lab in cb["times_s"]}
            s = {k: cb["scaling_vs_b1_cell"]["rlx"]["ratio"] for k, cb in cell["batches"].items()}
            log("    rlx scaling vs the B=1 cell: " + ", ".join(f"B={k} {v:.2f}x" for k, v in s.items()))
        cell["mem"] = {lab: {k: v for k, v in m.items() if k != "kv_bytes"}
                       for lab, m in bf.mem_snapshot(workers, gguf).items()}
        cell["loadavg_end"] = os.getloadavg()
        cell["ok"] = True
    finally:
        for w in workers:
            w.close()


# =============================================================================== report ====

def markdown(record: dict) -> str:
    st = record["settings"]
    L = fr.record_head(record, "batched decode",
                       f"{st['rounds']} rounds per B, blocks of {st['steps']} batched steps after ragged prompts of "
                       f"{st['prompt_min']}..{st['prompt_max']} tokens; aggregate tok/s = B x steps / seconds "
                       "(median over rounds); ratios = geometric mean of per-round ratios [95% bootstrap interval]; "
                       "rlx / llama.cpp above 1: rlx faster; 'x B=1': the engine's own aggregate speed against a "
                       "B=1 block of its own timed in the same round (one sequence, B=1's prompt, kept beside the "
                       "batch; its block right after the batch's in even rounds, right before in odd ones), "
                       "geometric mean of the per-round ratios [95% bootstrap interval].")
    L.append("| model | KV | thr | B | rlx tok/s | llama.cpp FA off | llama.cpp FA on | rlx / FA off | rlx / FA on "
             "| rlx x B=1 | FA off x B=1 | FA on x B=1 | load (1 min) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in record["cells"]:
        for k, r in c.get("batches", {}).items():
            if "times_s" not in r:
                continue

            def tps(lab):
                return f"{r['tokens'] / float(np.median(r['times_s'][lab])):.1f}" if lab in r["times_s"] else "—"

            def rat(lab):
                return fr.fmt_ratio(r["ratios"][lab]) if lab in r["ratios"] else "—"

            def sc(lab):
                s = r.get("scaling_vs_b1", {}).get(lab)
                return f"{s['ratio']:.2f}x [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" if s else "—"
            ld = r["loadavg_1min"]
            L.append(f"| {c['model']} | {c['kv']} | {c['threads']} | {k} | {tps('rlx')} | {tps('llama.cpp fa=off')} "
                     f"| {tps('llama.cpp fa=on')} | {rat('llama.cpp fa=off')} | {rat('llama.cpp fa=on')} | {sc('rlx')} "
                     f"| {sc('llama.cpp fa=off')} | {sc('llama.cpp fa=on')} | {min(ld):.2f}-{max(ld):.2f} |")
    L.append("")
    n_gate = record["settings"].get("gate_sequences", GATE_SEQUENCES)
    L.append("Gate per B (rlx's batched logits against each llama.cpp variant's, batches of B making at least "
             f"{n_gate} sequences x (prompt + {GATE_STEPS} fed tokens) rows, before B is timed; max |delta| / "
             "scale, KL(llama.cpp || rlx), top-1; quantized weights: mean KL from the f32 oracle, rlx vs llama.cpp, "
             "paired difference per sequence and its standard error), and the greedy tokens of the last timed block "
             "equal to rlx's (not gated):")
    L.append("")
    for c in record["cells"]:
        for k, r in c.get("batches", {}).items():
            g = r.get("gate")
            if not g:
                continue
            parts = fr.gate_parts(g)
            agree = r.get("token_agreement")
            L.append(f"- {c['model']} KV {c['kv']} t{c['threads']} B={k}: {'PASS' if g['pass'] else 'FAIL'} — "
                     + "; ".join(parts) + ("; tokens equal: " + ", ".join(f"{p} {v:.0%}" for p, v in agree.items())
                                           if agree else ""))
    ctxs = []
    for c in record["cells"]:
        for k, r in c.get("batches", {}).items():
            rb = r.get("readback", {}).get("llama.cpp fa=off") or r.get("readback", {}).get("llama.cpp fa=on")
            if rb:
                ctxs.append(f"B={k} n_ctx {rb.get('n_ctx')} (n_ctx_seq {rb.get('n_ctx_seq')}, kv_unified "
                            f"{rb.get('kv_unified')}, KV {rb.get('kv_alloc_mib')} MiB)")
        if ctxs:
            L.append("")
            L.append(f"llama.cpp batch contexts, {c['model']}: " + "; ".join(ctxs) + ".")
            ctxs = []
    mem = [c for c in record["cells"] if c.get("mem")]
    if mem:
        L.append("")
        L.append("Peak RSS per worker process after every B (MiB, VmHWM): " + "; ".join(
            f"{c['model']} t{c['threads']}: " + ", ".join(f"{lab} {v['peak_rss_mib']:.0f}" for lab, v in c["mem"].items())
            for c in mem) + ".")
        L += fr.weight_pages_lines(record["cells"])
    if record.get("stopped"):
        L.append("")
        L.append(f"**Run stopped: {record['stopped']}**")
    return "\n".join(L) + "\n"


# ================================================================================= main ====

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="the harness end to end, quickly: B = 1 2, 2 rounds, blocks of 4 steps; recorded as not a "
                         "measurement")
    ap.add_argument("--gguf", nargs="+", help="GGUF files (default: Qwen3-0.6B bf16 and q4_k_m, written on demand)")
    ap.add_argument("--weights", nargs="+", default=["bf16", "q4_k_m"],
                    help="weight types of the default files (bf16, or a type rlx.quantize writes)")
    ap.add_argument("--batch", nargs="+", type=int, help=f"batch sizes (default {' '.join(map(str, BATCHES))})")
    ap.add_argument("--kv", choices=("f16", "f32", "bf16"), default="f16")
    ap.add_argument("--threads", nargs="+", type=int, default=[2])
    ap.add_argument("--fa", nargs="+", choices=("off", "on"), default=["off", "on"])
    ap.add_argument("--llama-extra-bufts", choices=("on", "off"), default="on",
                    help="llama.cpp's extra weight buffer types (AMX, CPU_REPACK), its default on; off is "
                         "llama-cli's --no-repack, for a machine where they fail (recorded)")
    ap.add_argument("--gate-sequences", type=int, default=GATE_SEQUENCES,
                    help=f"the gate's sequences per B, at least (default {GATE_SEQUENCES}; more: the timed batch and more "
                         "batches of B, the default gate's among them; recorded)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=16, help="batched decode steps per timed block")
    ap.add_argument("--prompt-min", type=int, default=32)
    ap.add_argument("--prompt-max", type=int, default=96)
    ap.add_argument("--settle", type=float, default=0.25, help="seconds between runs")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="before each group, wait (up to 30 min) for a 1-minute load average below this")
    ap.add_argument("--allow-dirty", action="store_true")
    ap.add_argument("--out", help="record path (default benchmarks/results/batch-<date>[-smoke].json)")
    ap.add_argument("--readme", action="store_true", help="write the tables into benchmarks/README.md")
    args = ap.parse_args()
    args.fa = [f == "on" for f in args.fa]
    if args.smoke:
        args.batch = args.batch or [1, 2]
        args.rounds = min(args.rounds, 2)
        args.steps = min(args.steps, 4)
    args.batch = sorted(set(args.batch or BATCHES))
    if any(not 1 <= b <= 16 for b in args.batch):
        ap.error("--batch: sizes 1..16 (rlx batches at most 16 sequences per step)")
    if args.gate_sequences < GATE_SEQUENCES:
        ap.error(f"--gate-sequences takes at least {GATE_SEQUENCES} (the default gate's sequences and more)")
    if not 1 <= args.prompt_min <= args.prompt_max:
        ap.error("--prompt-min / --prompt-max: 1 <= min <= max")
    if args.readme and (args.smoke or args.allow_dirty or args.rounds < fr.MIN_ROUNDS):
        ap.error(f"--readme takes measurements only: >= {fr.MIN_ROUNDS} rounds, a clean tree, no --smoke")

    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    rlx_state = bf.git_state(args.allow_dirty)
    date = datetime.datetime.now().isoformat(timespec="seconds")
    record = {"schema": 1, "date": date, "suite": "batch", "argv": sys.argv[1:], "rlx": rlx_state,
              "llama_cpp": bf.llama_cpp_info(), "machine": bf.machine_info(),
              "settings": {"smoke": args.smoke, "quick": False, "rounds": args.rounds, "long_rounds": args.rounds,
                           "steps": args.steps, "batch": args.batch, "settle_s": args.settle, "fa": args.fa,
                           "llama_extra_bufts": args.llama_extra_bufts,
                           "kv": args.kv, "threads": args.threads, "prompt_min": args.prompt_min,
                           "prompt_max": args.prompt_max, "gate_steps": GATE_STEPS,
                           "gate_sequences": args.gate_sequences, "load_n_ctx": LOAD_N_CTX,
                           "bootstrap_resamples": bf.BOOT,
                           "worker_env": {k: bf.thread_env(1)[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                                           "RLX_NUM_THREADS")} | {"note": "= threads"}},
              "bandwidth": {}, "cells": []}
    out = args.out or os.path.join(common.RESULTS, f"batch-{date[:10]}{'-smoke' if args.smoke else ''}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    logdir = os.path.splitext(out)[0] + "-logs"
    os.makedirs(logdir, exist_ok=True)

    files = [(os.path.splitext(os.path.basename(p))[0], p) for p in args.gguf] if args.gguf else \
        [(f"{MODEL}-{wt}", ensure_gguf(wt, log)) for wt in args.weights]
    groups = []
    for name, path in files:
        wt = name.rsplit("-", 1)[-1].lower() if "-" in name else "?"
        for t in args.threads:
            groups.append((name, wt, os.path.abspath(path), t))

    for t in sorted(set(args.threads)):
        record["bandwidth"][str(t)] = common.read_bandwidth(t, reps=10)
        log(f"== read bandwidth, {t} thread(s): {record['bandwidth'][str(t)]['gbps']:.1f} GB/s (best of 10 passes)")

    def run_one(cell, group):
        name, wt, gguf, t = group
        log(f"== batch: {name}, KV {args.kv}, {t} thread(s), B = {' '.join(map(str, args.batch))} "
            f"(load {os.getloadavg()[0]:.2f})")
        batch_group(cell, args, name, wt, gguf, args.kv, t, bf.gguf_facts(gguf), logdir, tmp, log)

    tmp = tempfile.mkdtemp(prefix="rlx-batch-")
    return bf.run_groups(record, groups, run_one, out=out, t_start=t_start, args=args, log=log, markdown_fn=markdown,
                         title="bench_batch", readme_section="Batched decode: graded record")


if __name__ == "__main__":
    sys.exit(main())
