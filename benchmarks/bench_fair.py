#!/usr/bin/env python3
"""bench_fair: rlx beside llama.cpp, each engine in a long-lived process of its own, taking turns.

    python benchmarks/bench_fair.py                      # the short suite: every model, f32 + bf16, KV f16 + f32, 1 + 2 threads
    python benchmarks/bench_fair.py --suite long         # contexts 1k-32k, TTFT 2k / 8k, memory against context (2 threads)
    python benchmarks/bench_fair.py --quick              # Qwen3-0.6B bf16, KV f16, 2 threads, 3 rounds: minutes
    python benchmarks/bench_fair.py --smoke              # the harness end to end (2 rounds, pp128, decode@128): no figures
    python benchmarks/bench_fair.py --gguf FILE.gguf     # any GGUF both engines load (quantized types too)

Design (what a skeptic asks, and what this does about it):

- Each engine runs in a worker process of its own (benchmarks/fair_worker.py): rlx, llama.cpp
  with flash attention off and llama.cpp with flash attention on. They load the SAME GGUF file
  (rlx reads it in place through rlx.gguf), hold it for the whole cell group, and take turns:
  in round i every engine runs the measurement once, in an order rotated by i, and only one
  engine runs at a time (the others block on a pipe). After each run the coordinator waits
  `--settle` seconds, longer than any engine's idle spin (OpenBLAS's default ~0.1 s, libgomp's
  and rlx's pool's well under 1 ms), and it records the CPU seconds the OTHER workers used
  while each run was timed (from /proc/PID/stat): the record proves the turns did not overlap.
  Each engine keeps its own defaults otherwise (no OPENBLAS_THREAD_TIMEOUT, no OMP_WAIT_POLICY),
  as a user runs it. Thread settings: OMP/OPENBLAS/RLX_NUM_THREADS = t in every worker's
  environment, rlx.set_num_threads(t), llama.cpp n_threads = n_threads_batch = t.
- llama.cpp runs twice, flash attention off and on (the Python wrapper's default is off, its own
  tools default to auto, which is on for CPU); its KV cache type is set to rlx's (f16 vs f16,
  f32 vs f32). Both settings, the KV bytes, n_ctx and the thread counts are read back from
  llama.cpp (its log and its context), not copied from the request; rlx's KV type and threads
  from rlx. A cell whose read-back differs from what was asked stops the run.
- The gate: before a cell group is timed, every worker computes the logits of the same 8
  prompts of 160 tokens, each followed by 3 decode steps (fed tokens; 32 rows), in the exact
  configuration that is then timed (file, KV type, flash attention, threads). For rlx against each llama.cpp variant,
  with llama.cpp's logits as the reference and scale = max |reference logit| over the rows:
      max |delta| / scale <= tol, tol = 2^-p * sqrt(layers) * 4, where p is the mantissa bits
      (with the implicit one) of the narrowest float in the path: 24 for f32 weights and an
      f32 KV cache, 11 for an f16 KV cache, 8 for bf16 weights or a bf16 KV cache, 4 for
      quantized weights (4 bits or more per weight);
      every row's top-1 token equal, except where llama.cpp's own top-2 margin is below
      2 max |delta| (a near tie that noise of the gate's size may flip);
      float weights: KL(p_llama || p_rlx) <= 1e-3 nats on every row;
      quantized weights (issue 16's rule: rlx no further from f32 than llama.cpp is): a third
      worker, the oracle, runs the same file with every matrix dequantised to f32 (by the gguf
      package's gguf.quants.dequantize, not rlx), f32 activations and an f32 KV cache, then
      exits before anything is timed; per row KL(oracle || rlx) and KL(oracle || llama.cpp), their
      difference averaged per prompt, and the mean over the 8 prompts (--gate-prompts: more, the
      8 among them) must be <= 2 standard errors of that mean (rlx not measurably further from
      the oracle than llama.cpp). The prompts are fixed, and rlx's logits are the same bits on
      every AVX-512 machine, so a chance excursion of the 8 repeats on every run of that file:
      Qwen3-0.6B q6_k failed on the Zen 5 (+4.0e-06 at 1.1e-06 against FA on; the Zen 4's 8
      gate prompts give the same +4.0e-06), where 32 other prompts (salts 101 + 2 i) gave
      -2.6e-08 at 8.7e-07 on the Zen 4. So a gate that fails on this rule alone (sizes and
      top-1 within bounds) widens once to GATE_WIDEN = 8 times its prompts, the 8 among them,
      and the same rule decides there (gate_peers; the record keeps the narrow figures under
      "narrow"): a real excess grows in standard errors with the sample, a chance one does not.
      Two engines equally far from the oracle fail the narrow rule ~2 % of the time (more with
      heavy tails), and both about 0.3 %. The prompts are
      the independent samples: the rows of one prompt share its KV cache, so its rounding, and a
      standard error taken over rows would understate the uncertainty (a first version did so, on
      one prompt with 31 fed tokens, and called 3 % between the engines on Qwen3-0.6B q4_k_m
      "measurably further" at 2.5 row standard errors). Both engines quantise the activations and round
      K/V, so their distances from each other add (Llama-3.2-1B q8_0: each ~9e-4 from the oracle,
      1.3e-3 from each other), which a fixed bound between the engines cannot tell from an error.
  A failure stops the run (exit code 2) before anything is timed; the record keeps the numbers.
  In the long suite every context extension is also compared (the logits after the same tokens)
  and reported; a top-1 disagreement with a margin above the noise stops the run there.
- Statistics: `--rounds` rounds per cell (default 10). Per round the speed ratio rlx / peer =
  t_peer / t_rlx of that round; the cell reports the geometric mean of the per-round ratios with a
  95% percentile bootstrap interval (10,000 resamples of the rounds, fixed seed), and each
  engine's median tok/s. Above 1 means rlx is faster.
- Grade: a record is a measurement only with >= 10 rounds per cell (--rounds, --long-rounds), a
  clean tree, no --smoke / --quick, and a 1-minute load average at most 0.5 at the start of every
  cell group (--wait-quiet waits for it). Otherwise the record says "not a measurement" with the
  reasons, at the top of its table, and --readme refuses to copy it into benchmarks/README.md.
- The record (benchmarks/results/fair-<date>-<suite>.json, its tables beside it in a .md): the rlx commit (a dirty tree is
  refused unless --allow-dirty, which is recorded), llama-cpp-python's version, ggml's library
  versions and system info, each engine's read-back settings, the CPU model and ISA flags, rlx's
  dispatch ISA, the thread settings and environment, the load average at every round, the read
  bandwidth (C probe, common.py) per thread count at the start and before / after every decode
  cell (shared hosts' bandwidth moves within minutes), each worker's peak RSS (VmHWM of its
  own process) and the KV bytes, every timing of every round, and the gate's numbers.

Suites:
- short: pp128 and pp512 (a fresh prompt to its first greedy token), decode (blocks of `--steps`
  greedy tokens at a context of 128 and of 1024: the context is cut back to the same length
  before each block), per (model, weights, KV type, threads).
- long (2 threads unless --threads): TTFT of 2048- and 8192-token prompts, then one context grown
  1k -> 4k -> 16k -> 32k (extensions of the same token stream, timed and compared between the
  engines), decode blocks at each, RSS and KV bytes at each (the memory table).

Files: this one runs the workers (fair_worker.py), the cells and the gate's engines and oracle;
fair_gate.py holds the gate's arithmetic on logits (bench_batch.py's too), fair_report.py a
record's grade and markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from fair_gate import (  # noqa: E402
    GATE_PROMPT,
    GATE_PROMPTS,
    GATE_STEPS,
    GATE_WIDEN,
    PRECISION_BITS,
    compare_logits,
    gate_peers,
    gate_tolerance,
)
from fair_report import MIN_ROUNDS, grade, markdown  # noqa: E402

WORKER = os.path.join(HERE, "fair_worker.py")
LONG_CONTEXTS = (1024, 4096, 16384, 32768)
LONG_TTFT = (2048, 8192)
EXTEND_CHUNK = 4096  # tokens per extension call (both engines, the same chunks)
BOOT = 10000



class StopRun(Exception):
    """A gate or read-back failure: the run stops, the record says why."""


def prompt_ids(vocab: int, n: int, salt: int = 0) -> list[int]:
    """n token ids, fixed per (n, salt), away from the dummy vocabulary's special ids."""
    rng = np.random.default_rng([common.SEED, n, salt, 7])
    return [int(x) for x in rng.integers(300, vocab - 1, size=n)]


# ============================================================================== workers ====

class Worker:
    """One engine in its own process (fair_worker.py), commands over a pipe."""

    def __init__(self, label: str, engine: str, fa, threads: int, logdir: str):
        self.label, self.engine, self.fa, self.threads = label, engine, fa, threads
        self.env = thread_env(threads)
        self.logpath = os.path.join(logdir, f"worker-{label.replace(' ', '_').replace('=', '')}-t{threads}.log")
        self.p = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(self.logpath, "w"), env=self.env, cwd=common.ROOT, text=True,
                                  bufsize=1)
        self.pid = self.p.pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def call(self, **msg) -> dict:
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            tail = open(self.logpath).read()[-2000:]
            raise RuntimeError(f"{self.label}: worker died (exit {self.p.poll()}): {tail}")
        out = json.loads(line)
        if not out.get("ok"):
            raise RuntimeError(f"{self.label}: {msg['cmd']} failed: {out.get('error')}")
        return out

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) this worker has used so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick

    def close(self) -> None:
        try:
            self.call(cmd="quit")
        except Exception:  # noqa: BLE001
            pass
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()


def thread_env(threads: int) -> dict:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RLX_NUM_THREADS"):
        env[k] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = common.ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ================================================================================ stats ====

def ratio_stats(t_rlx: list[float], t_peer: list[float], seed: int = 0) -> dict:
    """Per-round speed ratios t_peer / t_rlx: geometric mean and a 95% percentile bootstrap
    interval over the rounds."""
    r = np.log(np.asarray(t_peer) / np.asarray(t_rlx))
    rng = np.random.default_rng(seed)
    boots = r[rng.integers(0, len(r), size=(BOOT, len(r)))].mean(axis=1) if len(r) > 1 else r
    lo, hi = np.percentile(boots, [2.5, 97.5]) if len(r) > 1 else (r[0], r[0])
    return {"ratio": float(np.exp(r.mean())), "ci95": [float(np.exp(lo)), float(np.exp(hi))],
            "min": float(np.exp(r.min())), "max": float(np.exp(r.max())), "n": int(len(r))}


def rounds(workers: list[Worker], n: int, op, settle: float, log, what: str) -> dict:
    """n rounds; in round i each worker runs op(worker) once (it returns seconds), the order
    rotated by i. Records the times, the other workers' CPU seconds during each run and the
    load average per round."""
    times = {w.label: [] for w in workers}
    other_cpu = {w.label: [] for w in workers}
    load = []
    for i in range(n):
        k = i % len(workers)
        for w in workers[k:] + workers[:k]:
            others = [o for o in workers if o is not w]
            c0 = sum(o.cpu_s() for o in others)
            times[w.label].append(op(w))
            other_cpu[w.label].append(sum(o.cpu_s() for o in others) - c0)
            time.sleep(settle)
        load.append(os.getloadavg()[0])
    rl = workers[0].label
    out = {"times_s": times, "other_workers_cpu_s": other_cpu, "loadavg_1min": load, "ratios": {}}
    for w in workers[1:]:
        out["ratios"][w.label] = ratio_stats(times[rl], times[w.label])
    msg = ", ".join(f"{p} {s['ratio']:.2f}x [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" for p, s in out["ratios"].items())
    log(f"    {what}: rlx / " + msg + f" (load {min(load):.2f}-{max(load):.2f})")
    return out


# ================================================================================= gate ====


def gate_inputs(vocab: int, n: int = GATE_PROMPTS) -> list[tuple[list[int], list[int]]]:
    """The gate's n (prompt, fed tokens) pairs, fixed per vocabulary size; the first GATE_PROMPTS of
    any n are the default gate's, so a larger gate holds the default one's prompts and more."""
    return [(prompt_ids(vocab, GATE_PROMPT, salt=5 + 2 * i), prompt_ids(vocab, GATE_STEPS, salt=6 + 2 * i))
            for i in range(n)]


def gate_logits(w: "Worker", inputs: list, tmp: str) -> np.ndarray:
    """The worker's logits for every gate prompt and its fed tokens, stacked (rows, vocab)."""
    rows = []
    for prompt, feed in inputs:
        path = os.path.join(tmp, f"gate-{w.pid}.npy")
        w.call(cmd="logits", prompt=prompt, feed=feed, out=path)
        rows.append(np.load(path))
        os.remove(path)
    return np.concatenate(rows)


def oracle_worker(args_load: dict, logdir: str, log) -> Worker:
    """The gate's oracle for quantized weights: rlx in a worker of its own, the same file with every
    matrix dequantised to f32 once at load by the gguf package (gguf.quants.dequantize), f32
    activations and an f32 KV cache. The caller closes it before anything is timed."""
    w = Worker("oracle f32", "rlx", None, args_load["threads"], logdir)
    try:
        info = w.call(cmd="load", engine="rlx", gguf=args_load["gguf"], threads=args_load["threads"], kv="f32",
                      n_ctx=args_load["n_ctx"], dtype="f32")
    except BaseException:
        w.close()
        raise
    log(f"    oracle: {args_load['gguf']} dequantised to f32, KV {info['readback']['kv_type']}, loaded in "
        f"{info['load_s']:.1f} s")
    return w


def oracle_logits(args_load: dict, inputs: list, tmp: str, logdir: str, log) -> np.ndarray:
    """The oracle's logits for the gate's inputs (oracle_worker), the worker closed after."""
    w = oracle_worker(args_load, logdir, log)
    try:
        return gate_logits(w, inputs, tmp)
    finally:
        w.close()


def run_gate(workers: list[Worker], vocab: int, wtype: str, kv: str, layers: int, tmp: str, log,
             oracle_load: dict | None = None, logdir: str | None = None, prompts: int = GATE_PROMPTS) -> dict:
    inputs = gate_inputs(vocab, GATE_WIDEN * prompts)
    relative = wtype not in PRECISION_BITS and oracle_load is not None
    by_label = {w.label: w for w in workers}

    def sample(lo: int, hi: int, labels: list[str]):
        logits = {lab: gate_logits(by_label[lab], inputs[lo:hi], tmp) for lab in labels}
        return logits, oracle_logits(oracle_load, inputs[lo:hi], tmp, logdir, log) if relative else None

    tol, bits = gate_tolerance(wtype, kv, layers)
    out = {"prompts": prompts, "prompt": GATE_PROMPT, "decode_steps": GATE_STEPS, "precision_bits": bits,
           "tol_rel": tol, "kl_rule": "relative to the f32 oracle" if relative else "KL(peer || rlx) <= 1e-3",
           "widen": GATE_WIDEN}
    out["peers"] = gate_peers([w.label for w in workers], sample, prompts,
                              lambda k: np.repeat(np.arange(k), 1 + GATE_STEPS), tol, log, "prompt")
    out["pass"] = all(c["pass"] for c in out["peers"].values())
    return out


def check_readback(workers: list[Worker], infos: dict, kv: str, threads: int) -> list[str]:
    bad = []
    for w in workers:
        rb = infos[w.label]["readback"]
        if rb.get("kv_type") != kv:
            bad.append(f"{w.label}: KV type read back {rb.get('kv_type')!r}, asked {kv!r}")
        if rb.get("threads") != threads:
            bad.append(f"{w.label}: threads read back {rb.get('threads')}, asked {threads}")
        if w.engine == "llama.cpp":
            want = "enabled" if w.fa else "disabled"
            if rb.get("flash_attn") != want:
                bad.append(f"{w.label}: flash_attn read back {rb.get('flash_attn')!r}, asked {want!r}")
            if rb.get("threads_batch") != threads:
                bad.append(f"{w.label}: threads_batch read back {rb.get('threads_batch')}, asked {threads}")
    return bad


# ================================================================================ cells ====

def decode_bytes(path: str) -> dict:
    """Bytes of weights one decode step must read, from a GGUF file's tensor table, by part:
    attention (q, k, v, o of every layer), dense MLPs, a mixture's routers (read whole) and experts
    (of each stacked (E, out, in) expert tensor, the k of E experts a token chooses: nbytes * k / E),
    norms, the LM head (output.weight, or the tied embedding) and one embedding row. Returns
    {"parts": {part: bytes}, "active": their sum, "all": every tensor's bytes (a step that read
    every expert), "experts": E, "experts_per_token": k}. The KV cache is not counted."""
    from rlx import gguf as rg
    gf = rg.GGUFFile(path)
    cfg = rg.model_config(gf)
    tied = "lm_head.weight" not in gf.tensors
    E, k = getattr(cfg, "num_experts", 0), getattr(cfg, "num_experts_per_tok", 0)
    parts = dict.fromkeys(("attention", "dense MLP", "router", "experts (k of E)", "norms", "LM head",
                           "embedding row"), 0)
    for name, t in gf.tensors.items():
        if name == "model.embed_tokens.weight":
            parts["embedding row"] += t.nbytes // t.shape[0]
            if tied:
                parts["LM head"] += t.nbytes
        elif name == "lm_head.weight":
            parts["LM head"] += t.nbytes
        elif len(t.shape) == 3:
            parts["experts (k of E)"] += t.nbytes * k // E
        elif name.endswith(".mlp.gate.weight"):
            parts["router"] += t.nbytes
        elif len(t.shape) == 1:
            parts["norms"] += t.nbytes
        elif ".self_attn." in name:
            parts["attention"] += t.nbytes
        elif ".mlp." in name:
            parts["dense MLP"] += t.nbytes
        else:
            raise ValueError(f"{path}: tensor '{name}' has no part in decode_bytes")
    return {"parts": parts, "active": sum(parts.values()), "all": sum(t.nbytes for t in gf.tensors.values()),
            "experts": E, "experts_per_token": k}


def decode_bytes_table(path: str) -> str:
    """decode_bytes(path) as a Markdown table (MB = 1e6 bytes)."""
    d = decode_bytes(path)
    L = [f"Weights one decode step reads, from the tensor table of {os.path.basename(path)} (MB = 1e6 bytes):", "",
         "| part | MB per token |", "|---|---|"]
    for part, b in d["parts"].items():
        if b:
            note = f" ({d['experts_per_token']} of {d['experts']})" if part.startswith("experts") else ""
            L.append(f"| {part.replace(' (k of E)', '')}{note} | {b / 1e6:.1f} |")
    L.append(f"| **active total** | **{d['active'] / 1e6:.1f}** |")
    L.append(f"| every weight of the file (every expert read) | {d['all'] / 1e6:.1f} |")
    return "\n".join(L) + "\n"


def gguf_facts(path: str) -> dict:
    """Shape facts of a GGUF file for the tables and the ceiling: layers, KV heads and head size,
    vocabulary, bytes of weights one decode step reads (decode_bytes: a mixture's chosen experts
    only; the tied embedding as the LM head, an untied one gives one row) and their parts."""
    from rlx import gguf as rg
    gf = rg.GGUFFile(path)
    cfg = rg.model_config(gf)
    d = decode_bytes(path)
    return {"layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "vocab": cfg.vocab_size, "weights_per_token_bytes": d["active"], "decode_bytes": d,
            "file_bytes": os.path.getsize(path), "types": sorted({t.type_name for t in gf.tensors.values()})}


def start_group(model: str, wtype: str, gguf: str, kv: str, threads: int, n_ctx: int, fa_list, logdir: str, log,
                extra_bufts: bool = True):
    workers = [Worker("rlx", "rlx", None, threads, logdir)]
    for fa in fa_list:
        workers.append(Worker(f"llama.cpp fa={'on' if fa else 'off'}", "llama.cpp", fa, threads, logdir))
    infos = {}
    for w in workers:  # one at a time: loading is not timed against anything
        extra = {"extra_bufts": extra_bufts} if w.engine == "llama.cpp" else {}
        infos[w.label] = w.call(cmd="load", engine=w.engine, gguf=gguf, threads=threads, kv=kv, n_ctx=n_ctx, fa=w.fa,
                                **extra)
        rb = infos[w.label]["readback"]
        log(f"    {w.label}: loaded in {infos[w.label]['load_s']:.1f} s, KV {rb.get('kv_type')}, "
            f"threads {rb.get('threads')}" + (f", flash_attn {rb.get('flash_attn')}, KV alloc "
                                              f"{rb.get('kv_alloc_mib')} MiB, weight buffers "
                                              f"{'+'.join(rb.get('weight_buffers') or ['?'])}"
                                              if w.engine == "llama.cpp" else
                                              f", isa {rb.get('isa')}"))
    return workers, infos


def warm_pages(gguf: str, log) -> dict:
    """Reads the whole file once through rlx.mapping.map_file before any engine loads it, so that
    the page cache holds it as the kernel's 2 MiB folios where it can (a file cached earlier through
    4 KiB pages is dropped and read again: rlx.mapping's docstring) and every engine's mapping of
    it, rlx's and llama.cpp's alike, gets the same pages; weight_pages (below) records what each
    engine's process then has."""
    from rlx.mapping import map_file, mapped_pages

    t0 = time.perf_counter()
    data = map_file(gguf)
    int(data[::4096].sum())  # one byte per page faults the file in
    rss, huge = mapped_pages(gguf) or (0, 0)
    del data
    out = {"resident_mib": rss / 2**20, "huge_mib": huge / 2**20, "s": time.perf_counter() - t0}
    log(f"    page cache: {out['huge_mib']:.0f} of {out['resident_mib']:.0f} MiB of {os.path.basename(gguf)} "
        f"through 2 MiB pages ({out['s']:.1f} s)")
    return out


def weight_pages(w: Worker, gguf: str) -> dict:
    """How worker w's process maps the model file: resident MiB, and MiB through 2 MiB pages."""
    from rlx.mapping import mapped_pages

    rss, huge = mapped_pages(gguf, w.pid) or (0, 0)
    return {"resident_mib": rss / 2**20, "huge_mib": huge / 2**20}


_PROBE: list = []  # the read probe's 1 GiB array, made once


def cell_probe(threads: int) -> float:
    """The read probe (best of 5 passes) next to a decode cell: this machine's bandwidth moves
    within minutes on shared hosts (a Zen 4 flipped between ~36 and ~60 GB/s at 2 threads), so each
    decode cell records it before and after its rounds beside the run's start figure."""
    if not _PROBE:
        _PROBE.append(np.ones((1 << 30) // 4, dtype=np.float32))
    return common.read_bandwidth(threads, reps=5, array=_PROBE[0])["gbps"]


def decode_rounds(workers: list[Worker], n: int, ctx: int, tok: int, args, threads: int, log) -> dict:
    """One decode cell's rounds at context ctx, with the read probe before and after them."""
    before = cell_probe(threads)
    r = rounds(workers, n, lambda w: w.call(cmd="decode", n=ctx, tok=tok, steps=args.steps)["s"], args.settle, log,
               f"decode@{ctx} ({args.steps} tokens per block)")
    r["tokens"] = args.steps
    r["bandwidth_gbps"] = [before, cell_probe(threads)]
    log(f"      read probe before / after: {before:.1f} / {r['bandwidth_gbps'][1]:.1f} GB/s")
    return r


def mem_snapshot(workers: list[Worker], gguf: str) -> dict:
    return {w.label: {**{k: v for k, v in w.call(cmd="mem").items() if k != "ok"},
                      "weight_pages": weight_pages(w, gguf)} for w in workers}


def short_group(cell, args, model, wtype, gguf, kv, threads, facts, logdir, tmp, log) -> None:
    vocab = facts["vocab"]
    cell.update({"suite": "short", "model": model, "weights": wtype, "gguf": gguf, "kv": kv, "threads": threads,
                 "facts": facts})
    cell.setdefault("loadavg_start", os.getloadavg())
    cell["page_cache"] = warm_pages(gguf, log)
    workers, infos = start_group(model, wtype, gguf, kv, threads, 2048, args.fa, logdir, log,
                                 args.llama_extra_bufts == "on")
    cell["engines"] = infos
    try:
        bad = check_readback(workers, infos, kv, threads)
        if bad:
            cell["readback_errors"] = bad
            raise StopRun("; ".join(bad))
        cell["gate"] = g = run_gate(workers, vocab, wtype, kv, facts["layers"], tmp, log,
                                    {"gguf": gguf, "threads": threads, "n_ctx": 2048}, logdir, args.gate_prompts)
        if not g["pass"]:
            raise StopRun(f"gate failed: {model} {wtype} KV {kv} t{threads}")
        for w in workers:  # warm-up: pages in, plans compiled, thread pools started
            w.call(cmd="first", ids=prompt_ids(vocab, 512, salt=99))
            w.call(cmd="first", ids=prompt_ids(vocab, 128, salt=98))
            w.call(cmd="decode", n=128, tok=1000, steps=2)
        cell["metrics"] = m = {}
        for n in args.pp:
            ids = prompt_ids(vocab, n, salt=1)
            m[f"pp{n}"] = r = rounds(workers, args.rounds, lambda w: w.call(cmd="first", ids=ids)["s"], args.settle,
                                     log, f"pp{n}")
            r["tokens"] = n
        for ctx in args.tg_ctx:
            ids = prompt_ids(vocab, ctx, salt=2)
            tops = {w.label: w.call(cmd="context", ids=ids)["top1"] for w in workers}
            tok = prompt_ids(vocab, 1, salt=3)[0]
            m[f"tg@{ctx}"] = r = decode_rounds(workers, args.rounds, ctx, tok, args, threads, log)
            r["context_top1"] = tops
            if args.profile:
                cell.setdefault("rlx_profile", {})[f"decode@{ctx}"] = workers[0].call(
                    cmd="profile", n=ctx, tok=tok)["profile_s"]
        cell["mem"] = mem_snapshot(workers, gguf)
        if args.profile:
            for n in args.pp:
                cell.setdefault("rlx_profile", {})[f"prefill@{n}"] = workers[0].call(
                    cmd="profile_prefill", ids=prompt_ids(vocab, n, salt=1))["profile_s"]
        cell["loadavg_end"] = os.getloadavg()
        cell["ok"] = True
    finally:
        for w in workers:
            w.close()


def long_group(cell, args, model, wtype, gguf, kv, threads, facts, logdir, tmp, log) -> None:
    vocab = facts["vocab"]
    ctxs = [c for c in LONG_CONTEXTS if c <= args.max_context]
    cell.update({"suite": "long", "model": model, "weights": wtype, "gguf": gguf, "kv": kv, "threads": threads,
                 "facts": facts, "contexts": ctxs})
    cell.setdefault("loadavg_start", os.getloadavg())
    n_ctx = max(ctxs + list(args.ttft)) + 256
    cell["page_cache"] = warm_pages(gguf, log)
    workers, infos = start_group(model, wtype, gguf, kv, threads, n_ctx, args.fa, logdir, log,
                                 args.llama_extra_bufts == "on")
    cell["engines"] = infos
    try:
        bad = check_readback(workers, infos, kv, threads)
        if bad:
            cell["readback_errors"] = bad
            raise StopRun("; ".join(bad))
        cell["gate"] = g = run_gate(workers, vocab, wtype, kv, facts["layers"], tmp, log,
                                    {"gguf": gguf, "threads": threads, "n_ctx": 2048}, logdir, args.gate_prompts)
        if not g["pass"]:
            raise StopRun(f"gate failed: {model} {wtype} KV {kv} t{threads}")
        for w in workers:
            w.call(cmd="first", ids=prompt_ids(vocab, 512, salt=99))
            w.call(cmd="decode", n=512, tok=1000, steps=2)
        cell["metrics"] = m = {}
        cell["mem"] = {"loaded": mem_snapshot(workers, gguf)}
        for n in args.ttft:
            ids = prompt_ids(vocab, n, salt=1)
            m[f"ttft@{n}"] = r = rounds(workers, args.long_rounds, lambda w: w.call(cmd="first", ids=ids)["s"],
                                        args.settle, log, f"TTFT {n}")
            r["tokens"] = n
            if args.profile:
                cell.setdefault("rlx_profile", {})[f"prefill@{n}"] = workers[0].call(
                    cmd="profile_prefill", ids=ids)["profile_s"]
        stream = prompt_ids(vocab, max(ctxs), salt=4)
        tol, _ = gate_tolerance(wtype, kv, facts["layers"])
        cell["extensions"] = []
        prev = 0
        for ctx in ctxs:
            ext = {"from": prev, "to": ctx, "s": {}, "compare": {}}
            logits = {}
            for w in workers:  # each engine grows its context to ctx (the same tokens, same chunks)
                t = 0.0
                for a in range(prev, ctx, EXTEND_CHUNK):
                    b = min(ctx, a + EXTEND_CHUNK)
                    path = os.path.join(tmp, f"ext-{w.pid}.npy")
                    r = w.call(cmd="context" if a == 0 else "extend", ids=stream[a:b], at=a,
                               out=path if b == ctx else None)  # at: drops what the decode rounds appended
                    t += r["s"]
                logits[w.label] = np.load(path)
                os.remove(path)
                ext["s"][w.label] = t
            for w in workers[1:]:
                ext["compare"][w.label] = c = compare_logits(logits[workers[0].label][None], logits[w.label][None], tol)
                decided = [i for i in c["top1_disagree_rows"] if c["top1_margins"][i] >= 2 * c["max_abs"]]
                log(f"    context {ctx}: rlx vs {w.label} max|d| {c['rel_max']:.1e} x scale, top-1 "
                    f"{'same' if not c['top1_disagree_rows'] else 'DIFFERS'}")
                if decided:
                    cell["extensions"].append(ext)
                    raise StopRun(f"top-1 differs at context {ctx} ({w.label}) with a margin above the noise")
            cell["extensions"].append(ext)
            prev = ctx
            tok = prompt_ids(vocab, 1, salt=3)[0]
            m[f"tg@{ctx}"] = r = decode_rounds(workers, args.long_rounds, ctx, tok, args, threads, log)
            cell["mem"][f"ctx{ctx}"] = mem_snapshot(workers, gguf)
            if args.profile:
                cell.setdefault("rlx_profile", {})[f"decode@{ctx}"] = workers[0].call(cmd="profile", n=ctx,
                                                                                     tok=tok)["profile_s"]
        cell["loadavg_end"] = os.getloadavg()
        cell["ok"] = True
    finally:
        for w in workers:
            w.close()


# ================================================================================== main ====

def git_state(allow_dirty: bool) -> dict:
    c = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=common.ROOT).stdout.strip()
    d = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=common.ROOT).stdout
    dirty = [l for l in d.splitlines() if l.strip()]
    if dirty and not allow_dirty:
        raise SystemExit("bench_fair: the tree has uncommitted changes (a record must name the code it measured):\n"
                         + "\n".join(dirty[:20]) + "\ncommit them, or pass --allow-dirty (recorded)")
    return {"commit": c[:12], "commit_full": c, "dirty": bool(dirty), "dirty_files": dirty[:50],
            "allow_dirty": allow_dirty}


def machine_info() -> dict:
    flags = common.cpu_flags()
    isa = "avx512 (" + ", ".join(f for f in flags if f.startswith(("avx512", "amx"))) + ")" if "avx512f" in flags else \
        ("avx2" if "avx2" in flags else "baseline")
    out = {"cpu": common.cpu_model(), "nproc": os.cpu_count(), "flags": flags, "isa": isa,
           "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
           "platform": platform.platform(), "python": platform.python_version(), "loadavg_start": os.getloadavg(),
           "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_THREAD_TIMEOUT",
                                                   "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "RLX_CPU_ISA")}}
    try:
        import rlx
        out["rlx_isa"] = rlx.build_info().get("isa")
    except Exception as e:  # noqa: BLE001
        out["rlx_isa"] = repr(e)
    return out


def llama_cpp_info() -> dict:
    from importlib.metadata import version
    out = {"llama_cpp_python": version("llama_cpp_python")}
    try:
        import llama_cpp
        libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        import re
        out["path"] = os.path.dirname(llama_cpp.__file__)
        out["libs"] = sorted(f for f in os.listdir(libdir) if re.search(r"\.so\.\d+\.\d+\.\d+$", f))
        out["system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    return out


def wait_quiet(max_load: float, timeout: float, log) -> list:
    """Waits until the 1-minute load average is below max_load (or timeout seconds pass)."""
    t0 = time.time()
    while os.getloadavg()[0] > max_load and time.time() - t0 < timeout:
        time.sleep(15)
    la = os.getloadavg()
    if la[0] > max_load:
        log(f"  note: load average still {la[0]:.2f} after {timeout:.0f} s; measuring anyway (recorded)")
    return list(la)


def run_groups(record: dict, groups: list, run_one, *, out: str, t_start: float, args, log, markdown_fn, title: str,
               readme_section: str) -> int:
    """Runs run_one(cell, group) for each group (a cell dict appended to record["cells"] first),
    waiting for a quiet machine before each when args.wait_quiet; the first StopRun (exit code 2)
    or worker error (1) ends the run. The record is written after every group (a crash keeps what
    was measured) and at the end with its grade and markdown (out and out's .md); with
    args.readme, a graded, complete run replaces readme_section of benchmarks/README.md."""
    code = 0
    try:
        for group in groups:
            cell: dict = {}
            if args.wait_quiet:  # the load the group started at is the one read when the wait let it go
                cell["loadavg_start"] = wait_quiet(args.wait_quiet, 1800, log)
            record["cells"].append(cell)
            try:
                run_one(cell, group)
            except StopRun as e:
                record["stopped"] = str(e)
                log(f"STOPPED: {e}")
                code = 2
                break
            except Exception as e:  # noqa: BLE001 - a worker failed: recorded, the run stops
                record["stopped"] = f"error: {type(e).__name__}: {e}"
                log(f"STOPPED: {record['stopped']}")
                code = 1
                break
            with open(out, "w") as f:
                json.dump(record, f, indent=1, default=str)
    finally:
        record["machine"]["loadavg_end"] = os.getloadavg()
        record["duration_s"] = time.perf_counter() - t_start
        record["not_a_measurement"] = grade(record)
        record["markdown"] = md = markdown_fn(record)
        with open(out, "w") as f:
            json.dump(record, f, indent=1, default=str)
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write(f"# {title}, {record['date']}\n\n" + md)
    print()
    print(md)
    log(f"== record: {os.path.relpath(out, common.ROOT)}")
    if args.readme and record["not_a_measurement"]:
        log("== benchmarks/README.md NOT updated: " + "; ".join(record["not_a_measurement"]))
    if args.readme and not code and not record["not_a_measurement"]:
        rel = os.path.relpath(out, HERE)
        common.replace_readme_section(os.path.join(HERE, "README.md"), readme_section,
                                      md + f"\nRecord: [{rel}]({rel})\n")
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=("short", "long"), default="short")
    ap.add_argument("--quick", action="store_true", help="Qwen3-0.6B bf16, KV f16, 2 threads, 3 rounds")
    ap.add_argument("--smoke", action="store_true",
                    help="the harness end to end, quickly: Qwen3-0.6B bf16, KV f16, 2 threads, 2 rounds, pp128 and "
                         "decode@128 of 4 tokens (long suite: context 1024, TTFT 512); recorded as not a measurement")
    ap.add_argument("--models", nargs="+", choices=list(common.MODELS))
    ap.add_argument("--dtypes", nargs="+", help="weight types: f32 bf16 (model files written on demand)")
    ap.add_argument("--gguf", nargs="+", help="GGUF files to run instead of the generated models")
    ap.add_argument("--kv", nargs="+", choices=("f16", "f32", "bf16"))
    ap.add_argument("--threads", nargs="+", type=int)
    ap.add_argument("--fa", nargs="+", choices=("off", "on"), default=["off", "on"])
    ap.add_argument("--llama-extra-bufts", choices=("on", "off"), default="on",
                    help="llama.cpp's extra weight buffer types (AMX, CPU_REPACK), its default on; off is "
                         "llama-cli's --no-repack, for a machine where they fail (recorded)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--gate-prompts", type=int, default=GATE_PROMPTS,
                    help=f"independent prompts of the logits gate (default {GATE_PROMPTS}; at least that many: the "
                         "first of them are the default gate's, so more prompts only narrow its interval)")
    ap.add_argument("--long-rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=8, help="decode tokens per block")
    ap.add_argument("--settle", type=float, default=0.25, help="seconds between runs")
    ap.add_argument("--pp", nargs="+", type=int, default=[128, 512])
    ap.add_argument("--tg-ctx", nargs="+", type=int, default=[128, 1024])
    ap.add_argument("--ttft", nargs="*", type=int, default=list(LONG_TTFT),
                    help="long suite: prompt lengths of the TTFT cells (none: no TTFT cells)")
    ap.add_argument("--max-context", type=int, default=max(LONG_CONTEXTS))
    ap.add_argument("--profile", action="store_true",
                    help="also record rlx's per-op profile (Generator.profile) of one decode step at each context "
                         "and of one prefill at each prompt length (untimed)")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="before each cell group, wait (up to 30 min) for a 1-minute load average below this")
    ap.add_argument("--allow-dirty", action="store_true")
    ap.add_argument("--out", help="record path (default benchmarks/results/fair-<date>-<suite>.json)")
    ap.add_argument("--readme", action="store_true", help="write the tables into benchmarks/README.md")
    ap.add_argument("--llama-path", help="a folder holding another llama-cpp-python build (pip install --target "
                    "DIR), put first on the path of every process: e.g. one built for AVX2 only, beside "
                    "RLX_CPU_ISA=avx2 (its system_info and path are recorded)")
    args = ap.parse_args()
    if args.llama_path:
        args.llama_path = os.path.abspath(args.llama_path)
        if not os.path.isfile(os.path.join(args.llama_path, "llama_cpp", "__init__.py")):
            ap.error(f"--llama-path {args.llama_path}: no llama_cpp package there")
        sys.path.insert(0, args.llama_path)
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = args.llama_path + (os.pathsep + old if old else "")
    args.fa = [f == "on" for f in args.fa]
    if args.smoke:
        args.models = args.models or ["Qwen3-0.6B"]
        args.dtypes = args.dtypes or ["bf16"]
        args.kv = args.kv or ["f16"]
        args.threads = args.threads or [2]
        args.rounds = min(args.rounds, 2)
        args.long_rounds = min(args.long_rounds, 2)
        args.steps = min(args.steps, 4)
        args.pp, args.tg_ctx = [128], [128]
        args.ttft, args.max_context = [512], 1024
    if args.gate_prompts < GATE_PROMPTS:
        ap.error(f"--gate-prompts takes at least {GATE_PROMPTS} (the default gate's prompts and more)")
    if args.readme and (args.smoke or args.quick or args.allow_dirty or args.rounds < MIN_ROUNDS
                        or (args.suite == "long" and args.long_rounds < MIN_ROUNDS)):
        ap.error(f"--readme takes measurements only: >= {MIN_ROUNDS} rounds, a clean tree, no --smoke / --quick")
    if args.quick:
        args.models = args.models or ["Qwen3-0.6B"]
        args.dtypes = args.dtypes or ["bf16"]
        args.kv = args.kv or ["f16"]
        args.threads = args.threads or [2]
        args.rounds = min(args.rounds, 3)
        args.long_rounds = min(args.long_rounds, 3)
    models = args.models or list(common.MODELS)
    dtypes = args.dtypes or (["bf16"] if args.suite == "long" else ["f32", "bf16"])
    kvs = args.kv or (["f16"] if args.suite == "long" else ["f16", "f32"])
    threads = args.threads or ([2] if args.suite == "long" else [1, 2])

    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    rlx_state = git_state(args.allow_dirty)
    date = datetime.datetime.now().isoformat(timespec="seconds")
    record = {"schema": 1, "date": date, "suite": args.suite, "argv": sys.argv[1:], "rlx": rlx_state,
              "llama_cpp": llama_cpp_info(), "machine": machine_info(),
              "settings": {"smoke": args.smoke, "quick": args.quick, "rounds": args.rounds, "long_rounds": args.long_rounds, "steps": args.steps,
                           "settle_s": args.settle, "fa": args.fa, "llama_extra_bufts": args.llama_extra_bufts,
                           "llama_path": args.llama_path, "pp": args.pp, "tg_ctx": args.tg_ctx,
                           "ttft": args.ttft, "gate_prompts": args.gate_prompts, "gate_prompt": GATE_PROMPT,
                           "gate_steps": GATE_STEPS,
                           "extend_chunk": EXTEND_CHUNK, "bootstrap_resamples": BOOT,
                           "worker_env": {k: thread_env(1)[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                                        "RLX_NUM_THREADS")} | {"note": "= threads"}},
              "bandwidth": {}, "cells": []}
    tag = "-smoke" if args.smoke else "-quick" if args.quick else ""
    out = args.out or os.path.join(common.RESULTS, f"fair-{date[:10]}-{args.suite}{tag}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    logdir = os.path.splitext(out)[0] + "-logs"
    os.makedirs(logdir, exist_ok=True)

    groups = []
    if args.gguf:
        for path in args.gguf:
            name = os.path.splitext(os.path.basename(path))[0]
            wt = name.rsplit("-", 1)[-1].lower() if "-" in name else "?"
            for kv in kvs:
                for t in threads:
                    groups.append((name, wt, os.path.abspath(path), kv, t))
    else:
        for model in models:
            for wt in dtypes:
                paths = common.ensure_model(model, wt, log=log)
                for kv in kvs:
                    if args.suite == "short" and wt == "bf16" and kv == "f32" and not args.kv:
                        continue  # bf16 weights with an f32 cache: asked for explicitly only
                    for t in threads:
                        groups.append((model, wt, paths["gguf"], kv, t))

    for t in sorted(set(threads)):
        record["bandwidth"][str(t)] = common.read_bandwidth(t, reps=10)
        log(f"== read bandwidth, {t} thread(s): {record['bandwidth'][str(t)]['gbps']:.1f} GB/s (best of 10 passes)")

    fn = short_group if args.suite == "short" else long_group

    def run_one(cell, group):
        model, wt, gguf, kv, t = group
        log(f"== {args.suite}: {model} weights {wt}, KV {kv}, {t} thread(s) (load {os.getloadavg()[0]:.2f})")
        fn(cell, args, model, wt, gguf, kv, t, gguf_facts(gguf), logdir, tmp, log)

    tmp = tempfile.mkdtemp(prefix="rlx-fair-")
    return run_groups(record, groups, run_one, out=out, t_start=t_start, args=args, log=log, markdown_fn=markdown,
                      title=f"bench_fair {record['suite']} suite", readme_section=f"Fair harness: {args.suite} suite")


if __name__ == "__main__":
    sys.exit(main())
