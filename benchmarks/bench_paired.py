#!/usr/bin/env python3
"""bench_paired: rlx beside llama.cpp in ONE process, block by block, so both see the same
phase of a machine whose memory bandwidth drifts.

    python benchmarks/bench_paired.py [--models ...] [--dtypes ...] [--threads 1 2] [--blocks 16]

Why: on a shared host the read bandwidth switches between phases (on this project's VM: ~35 and
~56 GB/s, minutes apart, see the bandwidth samples in benchmarks/README.md "Generation"), and a
decode step is bound by that bandwidth. bench_generate runs every engine in a process of its own
(for per-engine RSS), minutes apart, so one engine can draw the slow phase more often than the
other; its decode ratios then move by +-20% between runs. Here both engines are loaded in one
process (bench_generate's engine classes, the same model files: safetensors for rlx, GGUF for
llama.cpp, same thread count) and take turns:

- decode: both take the same 128-token prompt, then `--blocks` blocks; in each block each engine
  decodes `--steps` tokens (greedy) and is timed, the first engine alternating between blocks;
  the block's ratio is llama.cpp's time / rlx's time;
- prefill: `--pp-pairs` pairs of one 128-token and of one 512-token prefill each (last-position
  logits), alternating.

Reported per (model, dtype, threads): each engine's median tok/s and the median of the per-block
(per-pair) ratios with their range. Above 1 means rlx is faster. Results: stdout,
benchmarks/results/paired-<date>.json, and the section "Paired with llama.cpp" of
benchmarks/README.md (--no-readme: not there). Needs `make bench`'s extras (llama-cpp-python).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_generate as bg  # noqa: E402
import common  # noqa: E402


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_config(spec: dict) -> dict:
    """One (model, dtype, threads) in this process: both engines loaded, then the blocks."""
    model, dtype, threads = spec["model"], spec["dtype"], spec["threads"]
    paths = common.model_paths(model, dtype)
    rl, lc = bg.RlxEngine(), bg.LlamaCppEngine()
    rl.load(paths, dtype, threads, 1024)
    lc.load(paths, dtype, threads, 1024)
    engines = (rl, lc)
    for e in engines:  # warm-up: weights paged in, plans compiled
        e.prefill(bg.prompt_ids(model, 512, salt=99))
        e.prefill(bg.prompt_ids(model, 128, salt=99))
        e.first_token(bg.prompt_ids(model, 128, salt=98))
        e.decode(2)
    out = {**spec, "ok": True}
    for n in (128, 512):
        pp = bg.prompt_ids(model, n, salt=1)
        times = {"rlx": [], "llama.cpp": []}
        for i in range(spec["pp_pairs"]):
            order = engines if i % 2 == 0 else engines[::-1]
            for e in order:
                times[e.name].append(timed(lambda: e.prefill(pp)))
        out[f"pp{n}"] = pair_stats(times, n)
    prompt = bg.prompt_ids(model, 128, salt=2)
    for e in engines:
        e.first_token(prompt)
    times = {"rlx": [], "llama.cpp": []}
    for i in range(spec["blocks"]):
        order = engines if i % 2 == 0 else engines[::-1]
        for e in order:
            times[e.name].append(timed(lambda: e.decode(spec["steps"])))
    out["decode"] = pair_stats(times, spec["steps"])
    return out


def pair_stats(times: dict, tokens: int) -> dict:
    ratios = [l / r for r, l in zip(times["rlx"], times["llama.cpp"])]
    return {"rlx_tps": tokens / statistics.median(times["rlx"]),
            "llama_cpp_tps": tokens / statistics.median(times["llama.cpp"]),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "n": len(ratios), "rlx_s": times["rlx"], "llama_cpp_s": times["llama.cpp"]}


def markdown(results: list[dict], args, date: str) -> str:
    L = [f"Run {date}: {args.blocks} decode blocks of {args.steps} tokens after a 128-token prompt, "
         f"{args.pp_pairs} pp128 and pp512 pairs; medians.", "",
         "| model | dtype | thr | decode rlx tok/s | decode llama.cpp tok/s | decode rlx / llama.cpp (range) "
         "| pp128 rlx / llama.cpp (range) | pp512 rlx tok/s | pp512 llama.cpp tok/s | pp512 rlx / llama.cpp (range) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if not r.get("ok"):
            L.append(f"| {r['model']} | {r['dtype']} | {r['threads']} | failed: {str(r.get('error'))[:80]} |"
                     + " |" * 6)
            continue
        d, p, q = r["decode"], r["pp512"], r["pp128"]
        L.append(f"| {r['model']} | {r['dtype']} | {r['threads']} | {d['rlx_tps']:.1f} | {d['llama_cpp_tps']:.1f} | "
                 f"**{d['ratio_median']:.2f}x** ({d['ratio_min']:.2f}-{d['ratio_max']:.2f}) | "
                 f"**{q['ratio_median']:.2f}x** ({q['ratio_min']:.2f}-{q['ratio_max']:.2f}) | {p['rlx_tps']:.1f} | "
                 f"{p['llama_cpp_tps']:.1f} | **{p['ratio_median']:.2f}x** ({p['ratio_min']:.2f}-{p['ratio_max']:.2f}) |")
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(common.MODELS), default=list(common.MODELS))
    ap.add_argument("--dtypes", nargs="+", choices=common.DTYPES, default=list(common.DTYPES))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pp-pairs", type=int, default=4)
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        try:
            res = run_config(spec)
        except Exception as e:  # noqa: BLE001 - reported in the table
            res = {**spec, "ok": False, "error": f"{type(e).__name__}: {e}"}
        print("RESULT " + json.dumps(res))
        return 0
    date = datetime.datetime.now().isoformat(timespec="seconds")
    results = []
    for model in args.models:
        for dtype in args.dtypes:
            common.ensure_model(model, dtype)
            for t in args.threads:
                spec = {"model": model, "dtype": dtype, "threads": t, "blocks": args.blocks, "steps": args.steps,
                        "pp_pairs": args.pp_pairs, "engine": "paired", "rep": 0}
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                                   env=bg.thread_env(t), capture_output=True, text=True, cwd=common.ROOT)
                res = next((json.loads(l[7:]) for l in reversed(p.stdout.splitlines()) if l.startswith("RESULT ")),
                           {**spec, "ok": False, "error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"})
                results.append(res)
                if res.get("ok"):
                    print(f"{model} {dtype} t{t}: decode {res['decode']['ratio_median']:.2f}x "
                          f"(rlx {res['decode']['rlx_tps']:.1f}, llama.cpp {res['decode']['llama_cpp_tps']:.1f} tok/s), "
                          f"pp128 {res['pp128']['ratio_median']:.2f}x, pp512 {res['pp512']['ratio_median']:.2f}x", flush=True)
                else:
                    print(f"{model} {dtype} t{t}: FAILED {res.get('error')}", flush=True)
    md = markdown(results, args, date)
    print(md)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"paired-{date[:10]}.json"), "w") as f:
        json.dump({"date": date, "args": vars(args), "results": results}, f, indent=1)
    if not args.no_readme:
        body = __doc__.split("\n\n", 2)[2].strip() + "\n\n" + md
        common.replace_readme_section(os.path.join(HERE, "README.md"), "Paired with llama.cpp", body)
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
