#!/usr/bin/env python3
"""bench_compile: what rlx's compile policies cost and save on the Qwen3-0.6B shape.

    python benchmarks/bench_compile.py             # 256 generated tokens per policy
    python benchmarks/bench_compile.py --quick     # 32 tokens, 1 compile rep (< 2 minutes)
    python benchmarks/bench_compile.py --tokens 128 --layers 8 --threads 2

The model: Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128,
intermediate 3072, vocab 151936, tied embeddings, q/k norm, max_position_embeddings 40960) with
random float32 weights generated in memory from a fixed seed (~2.4 GB; no download). Timings do not
depend on the values; greedy tokens are compared across policies as a sanity check (every policy
must produce the same tokens).

Two measurements:
  1. compile time per plan: a fresh generator per policy compiles the prefill plan at SEQ 128 (the
     first cached step after a 128-token prefill) and then one decode plan (one token over a past
     of 128). Reported: compile seconds (graph build + passes + binding, from compile_stats), the
     first run (includes arena allocation), and the plan's planned intermediate bytes.
  2. end to end: a 16-token prompt, then 256 greedy tokens with step_cached, under
       oneshot            exact-shape plans, one decode plan compiled per token
       lru+oneshot        prefill LRU (capacity 4) + one-shot decode
       bucketed           one-shot prefill + bucketed decode (max_past 512)
       dynamic            dynamic prefill + dynamic decode (symbolic SEQ / PAST)
     with compile counts, compile seconds, plans held, planned bytes and tokens per second. The
     policies step round-robin, one token each in turn, so that load from other processes on the
     machine falls on all of them alike.

Results: benchmarks/results/compile-<date>.json (git-ignored) and Markdown tables on stdout.
Threads: --threads (default 2) via rlx.set_num_threads, which sets OpenBLAS's too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

import rlx  # noqa: E402
from rlx.weights import expected_weights  # noqa: E402

SEED = 20240501
PROMPT_LEN = 16
PREFILL_SEQ = 128
MAX_PAST = 512

POLICIES = {
    "oneshot": {},
    "lru+oneshot": {"prefill": ("lru", 4)},
    "bucketed": {"decode": ("bucketed", MAX_PAST)},
    "dynamic": {"prefill": ("dynamic",), "decode": ("dynamic",)},
}


def qwen3_06b(layers: int = 28) -> rlx.Qwen3Config:
    return rlx.Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                           num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                           head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                           rope_theta=1000000.0, tie_word_embeddings=True)


def random_weights(cfg, seed: int = SEED) -> dict[str, np.ndarray]:
    """float32 weights: projections and embeddings N(0, 0.02^2), norms 1 + N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_weights(cfg).items():
        a = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("norm.weight"):
            a *= 0.1
            a += 1.0
        else:
            a *= 0.02
        out[name] = a
    return out


def make_gen(cfg, weights, policy: dict) -> rlx.Generator:
    gen = rlx.Generator(cfg, weights, device="cpu")
    if "prefill" in policy:
        p = policy["prefill"]
        gen = gen.with_prefill_cache(p[1]) if p[0] == "lru" else gen.with_dynamic_prefill_cache()
    if "decode" in policy:
        d = policy["decode"]
        gen = gen.with_decode_cache(d[1]) if d[0] == "bucketed" else gen.with_dynamic_decode_cache()
    return gen


def prompt_ids(cfg, n: int, seed: int = 1) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, cfg.vocab_size, n)]


def mib(b: float) -> float:
    return b / 2**20


# ---- 1. compile time per plan -----------------------------------------------------------------

def _compile_once(cfg, weights, policy: dict, prompt: list[int]) -> dict:
    gen = make_gen(cfg, weights, policy)
    gen.prefill(prompt)
    s0 = gen.compile_stats()
    t0 = time.perf_counter()
    tok = gen.step_cached()                      # compiles + runs the prefill plan at SEQ 128
    t_prefill = time.perf_counter() - t0
    s1 = gen.compile_stats()
    t0 = time.perf_counter()
    gen.decode_get_logits(tok)                   # compiles + runs a decode plan over a past of 128
    t_decode = time.perf_counter() - t0
    s2 = gen.compile_stats()
    # the next step (past 129): bucketed / dynamic hit their plan; one-shot compiles a new one
    gen.step_cached()                            # samples from the logits held: no plan runs
    t0 = time.perf_counter()
    gen.decode_get_logits(gen.tokens[-1])
    t_next = time.perf_counter() - t0
    s3 = gen.compile_stats()
    c_pre = s1["compile_seconds"] - s0["compile_seconds"]
    c_dec = s2["compile_seconds"] - s1["compile_seconds"]
    return {
        "prefill_compile_s": c_pre, "prefill_first_run_s": t_prefill - c_pre,
        "decode_compile_s": c_dec, "decode_first_run_s": t_decode - c_dec,
        "decode_next_s": t_next, "decode_next_compile_s": s3["compile_seconds"] - s2["compile_seconds"],
        "planned_bytes": s3["planned_bytes"], "plans_cached": s3["plans_cached"],
    }


def bench_compile(cfg, weights, reps: int) -> list[dict]:
    """Median over reps fresh generators per policy (interleaved)."""
    prompt = prompt_ids(cfg, PREFILL_SEQ, seed=2)
    kinds = (("oneshot / lru (exact shape)", {}),
             ("bucketed decode", {"decode": ("bucketed", MAX_PAST)}),
             ("dynamic", {"prefill": ("dynamic",), "decode": ("dynamic",)}))
    runs = {label: [] for label, _ in kinds}
    for _ in range(reps):
        for label, policy in kinds:
            runs[label].append(_compile_once(cfg, weights, policy, prompt))
    rows = []
    for label, rs in runs.items():
        row = {"policy": label, "reps": len(rs)}
        for key in rs[0]:
            row[key] = statistics.median(r[key] for r in rs)
        rows.append(row)
    return rows


# ---- 2. end to end ------------------------------------------------------------------------------

def bench_e2e(cfg, weights, n_tokens: int) -> list[dict]:
    """The policies step round-robin, one token each in turn (one generator per policy over the
    same weights), so that a load change on the machine hits every policy alike."""
    prompt = prompt_ids(cfg, PROMPT_LEN, seed=1)
    gens = {name: make_gen(cfg, weights, policy) for name, policy in POLICIES.items()}
    times = {name: [] for name in gens}
    toks = {name: [] for name in gens}
    greedy = rlx.SampleOpts.greedy()
    for gen in gens.values():
        gen.prefill(prompt)
    for i in range(n_tokens):
        for name, gen in gens.items():
            t0 = time.perf_counter()
            toks[name].append(gen.step_cached(greedy))  # the first: prefill (compile + run) + sample
            times[name].append(time.perf_counter() - t0)
        if (i + 1) % 64 == 0:
            print(f"  {i + 1}/{n_tokens} tokens", file=sys.stderr, flush=True)
    rows = []
    for name, gen in gens.items():
        st = gen.compile_stats()
        t = times[name]
        rows.append({
            "policy": name,
            "tokens": toks[name],
            "n_tokens": len(t),
            "total_s": sum(t),
            "first_token_s": t[0],
            "decode_s": sum(t[1:]),
            "decode_median_ms": 1e3 * statistics.median(t[1:]) if len(t) > 1 else 0.0,
            "tok_per_s": len(t) / sum(t),
            "decode_tok_per_s": (len(t) - 1) / sum(t[1:]) if len(t) > 1 else 0.0,
            **{k: st[k] for k in ("prefill_compiles", "decode_compiles", "plan_hits", "compile_seconds",
                                  "plans_cached", "planned_bytes")},
        })
    ref = rows[0]["tokens"]
    for r in rows:
        r["same_tokens_as_oneshot"] = r["tokens"] == ref
    return rows


# ---- report -------------------------------------------------------------------------------------

def markdown(meta: dict, comp: list[dict], e2e: list[dict]) -> str:
    n = meta["n_tokens"]
    out = [f"Qwen3-0.6B shape ({meta['layers']} layers, random f32 weights), {meta['threads']} threads, "
           f"{meta['machine']['cpu']}, {meta['machine']['nproc']} cores.", ""]
    out += [f"Compile time per plan (prefill at SEQ {PREFILL_SEQ}; decode of one token over a past of "
            f"{PREFILL_SEQ}):", "",
            "| plan | prefill compile ms | prefill run s | decode compile ms | decode first run ms | "
            "next decode step ms (compile ms) | planned MiB (all plans held) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for r in comp:
        out.append(f"| {r['policy']} | {1e3 * r['prefill_compile_s']:.1f} | {r['prefill_first_run_s']:.2f} | "
                   f"{1e3 * r['decode_compile_s']:.1f} | {1e3 * r['decode_first_run_s']:.0f} | "
                   f"{1e3 * r['decode_next_s']:.0f} ({1e3 * r['decode_next_compile_s']:.1f}) | "
                   f"{mib(r['planned_bytes']):.1f} |")
    out += ["", f"End to end: {PROMPT_LEN}-token prompt, {n} greedy tokens (step_cached, policies interleaved "
            "token by token):", "",
            "| policy | prefill compiles | decode compiles | plan hits | compile s | plans held | planned MiB | "
            "first token s | decode ms/token (median) | total s | tok/s | same tokens |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|"]
    for r in e2e:
        out.append(f"| {r['policy']} | {r['prefill_compiles']} | {r['decode_compiles']} | {r['plan_hits']} | "
                   f"{r['compile_seconds']:.2f} | {r['plans_cached']} | {mib(r['planned_bytes']):.1f} | "
                   f"{r['first_token_s']:.2f} | {r['decode_median_ms']:.0f} | {r['total_s']:.1f} | "
                   f"{r['tok_per_s']:.2f} | {'yes' if r['same_tokens_as_oneshot'] else 'NO'} |")
    return "\n".join(out)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 generated tokens instead of 256")
    ap.add_argument("--tokens", type=int, default=None, help="generated tokens per policy (default 256)")
    ap.add_argument("--layers", type=int, default=28, help="decoder layers (default 28, Qwen3-0.6B)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=None,
                    help="fresh generators per policy for the compile table (default 3; 1 with --quick)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/compile-<date>.json)")
    args = ap.parse_args(argv)
    n_tokens = args.tokens or (32 if args.quick else 256)
    args.reps = args.reps or (1 if args.quick else 3)

    rlx.set_num_threads(args.threads)
    cfg = qwen3_06b(args.layers)
    t0 = time.perf_counter()
    weights = random_weights(cfg)
    gen_s = time.perf_counter() - t0
    n_params = sum(a.size for a in weights.values())
    print(f"weights: {n_params / 1e6:.0f} M params ({n_params * 4 / 2**30:.2f} GiB f32) in {gen_s:.1f} s",
          file=sys.stderr, flush=True)

    print("compile time per plan ...", file=sys.stderr, flush=True)
    comp = bench_compile(cfg, weights, args.reps)
    print(f"end to end, {n_tokens} tokens per policy ...", file=sys.stderr, flush=True)
    e2e = bench_e2e(cfg, weights, n_tokens)

    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "model": "Qwen3-0.6B shape, random f32 weights (seed %d)" % SEED,
        "layers": args.layers, "params": int(n_params), "threads": rlx.get_num_threads(),
        "n_tokens": n_tokens, "compile_reps": args.reps, "prompt_len": PROMPT_LEN, "prefill_seq": PREFILL_SEQ,
        "max_past": MAX_PAST,
        "machine": {"cpu": cpu_name(), "nproc": os.cpu_count(), "python": platform.python_version()},
        "build_info": rlx.build_info(),
    }
    table = markdown(meta, comp, e2e)
    print(table)
    path = args.out or os.path.join(HERE, "results", f"compile-{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "compile": comp, "e2e": e2e, "markdown": table}, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)
    bad = [r["policy"] for r in e2e if not r["same_tokens_as_oneshot"]]
    if bad:
        print(f"error: policies {bad} produced tokens different from one-shot", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
