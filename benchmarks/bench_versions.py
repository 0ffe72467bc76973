#!/usr/bin/env python3
"""bench_versions: this checkout's rlx against another checkout's (a commit before a change), each
in a long-lived worker process of its own, taking turns: "no speed lost" for a refactor.

    python benchmarks/bench_versions.py --before /path/to/old/checkout [--model Qwen3-0.6B --dtype bf16]

Both workers load the same Hugging Face directory (benchmarks/common.py writes it), with the same
thread count and an f32 KV cache (the only KV type older checkouts have), and compile their dynamic
prefill and decode plans during a warm-up. Then `--rounds` rounds; in each, both engines (in an
order that alternates) run a pp128 and a pp512 prefill (fresh sequence, last-row logits) and a
decode block of `--steps` greedy tokens after a 128-token prompt, one engine at a time, with
`--settle` seconds between runs. Before any timing, both compute the logits of the same prompt and
3 decode steps: the same function up to summation order, whose differences the narrowest float on
the path (bf16 activations into a bf16 matvec) may round apart, so they must agree within
bench_fair's gate tolerance, 2^-p sqrt(layers) 4 of the logits' scale (p = 8 for bf16 weights,
24 for f32), or the run stops. Reported per measure: each engine's median seconds and the
geometric mean of the per-round ratios before / after (above 1: this checkout is faster) with a 95%
bootstrap interval. The record (JSON) goes to benchmarks/results/versions-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from fair_gate import gate_tolerance  # noqa: E402

WORKER = r"""
import json, sys, time
import numpy as np
import rlx
threads, path, dtype = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rlx.set_num_threads(threads)
cfg = rlx.load_config(path)
kw = {"kv_dtype": "f32"} if "kv_dtype" in rlx.Generator.__init__.__code__.co_varnames else {}
gen = rlx.Generator(cfg, rlx.load_weights(path), device="cpu", dtype=dtype, **kw)
gen = gen.with_dynamic_prefill_cache().with_dynamic_decode_cache()
print(json.dumps({"ready": rlx.__file__}), flush=True)
for line in sys.stdin:
    m = json.loads(line)
    if m["op"] == "logits":
        rows = [gen.prefill_get_last_logits(m["ids"])] + [gen.decode_get_logits(t) for t in m["feed"]]
        out = {"logits": np.stack(rows).astype(np.float32).tolist()}
    elif m["op"] == "pp":
        t = time.perf_counter(); gen.prefill_get_last_logits(m["ids"]); out = {"s": time.perf_counter() - t}
    elif m["op"] == "tg":
        gen.prefill(m["ids"]); t = time.perf_counter(); gen.generate_cached(m["steps"])
        out = {"s": time.perf_counter() - t}
    else:
        break
    print(json.dumps(out), flush=True)
"""


class Worker:
    def __init__(self, name: str, checkout: str, threads: int, path: str, dtype: str):
        env = dict(os.environ, PYTHONPATH=checkout, OMP_NUM_THREADS=str(threads),
                   OPENBLAS_NUM_THREADS=str(threads), RLX_NUM_THREADS=str(threads))
        self.name = name
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, str(threads), path, dtype], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=checkout)  # -c puts the cwd first
        self.ready = json.loads(self.p.stdout.readline())["ready"]
        if not self.ready.startswith(os.path.join(checkout, "rlx")):
            raise SystemExit(f"{name}: imported rlx from {self.ready}, not from {checkout}")

    def ask(self, **m):
        self.p.stdin.write(json.dumps(m) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def git_head(path: str) -> str:
    r = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    d = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                       text=True)
    return r.stdout.strip() + ("-dirty" if d.stdout.strip() else "")


def boot_ci(ratios: list[float], n: int = 10000) -> tuple[float, float, float]:
    logs = np.log(np.asarray(ratios))
    rng = np.random.default_rng(0)
    means = logs[rng.integers(0, len(logs), size=(n, len(logs)))].mean(axis=1)
    return float(np.exp(logs.mean())), float(np.exp(np.quantile(means, 0.025))), float(np.exp(np.quantile(means, 0.975)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the other checkout (its rlx/_C built in place)")
    ap.add_argument("--model", default="Qwen3-0.6B", choices=list(common.MODELS))
    ap.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--settle", type=float, default=0.25)
    args = ap.parse_args()
    path = common.ensure_model(args.model, args.dtype, need_gguf=False, log=lambda s: print(s, file=sys.stderr))["hf"]
    root = os.path.dirname(HERE)
    load = os.getloadavg()[0]
    ws = [Worker("before", os.path.abspath(args.before), args.threads, path, args.dtype),
          Worker("after", root, args.threads, path, args.dtype)]
    rng = np.random.default_rng(common.SEED)
    vocab = common.MODELS[args.model]["vocab_size"]
    ids = {n: [int(x) for x in rng.integers(300, vocab - 1, size=n)] for n in (128, 512)}
    feed = [int(x) for x in rng.integers(300, vocab - 1, size=3)]
    a, b = (np.array(w.ask(op="logits", ids=ids[128], feed=feed)["logits"]) for w in ws)
    gate = float(np.abs(a - b).max() / np.abs(a).max())
    tol, _ = gate_tolerance(args.dtype, "f32", common.MODELS[args.model]["num_hidden_layers"])
    same_top = bool(np.all(a.argmax(1) == b.argmax(1)))
    print(f"gate: max |before - after| / scale = {gate:.3g} (limit {tol:.3g}); top-1 equal: {same_top}", flush=True)
    if not gate <= tol:
        print("gate failed: not the same function; nothing timed", file=sys.stderr)
        return 2
    for w in ws:  # warm-up: every plan compiled, weights paged in
        w.ask(op="pp", ids=ids[512])
        w.ask(op="tg", ids=ids[128], steps=2)
    times = {w.name: {"pp128": [], "pp512": [], "tg": []} for w in ws}
    for r in range(args.rounds):
        for w in (ws if r % 2 == 0 else ws[::-1]):
            for key, m in (("pp128", dict(op="pp", ids=ids[128])), ("pp512", dict(op="pp", ids=ids[512])),
                           ("tg", dict(op="tg", ids=ids[128], steps=args.steps))):
                time.sleep(args.settle)
                times[w.name][key].append(w.ask(**m)["s"])
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    for w in ws:
        w.close()
    res = {}
    for key in ("pp128", "pp512", "tg"):
        ratios = [tb / ta for tb, ta in zip(times["before"][key], times["after"][key])]
        g, lo, hi = boot_ci(ratios)
        res[key] = dict(before_median_s=float(np.median(times["before"][key])),
                        after_median_s=float(np.median(times["after"][key])), ratio=g, ci95=[lo, hi])
        print(f"{key:6s} before {res[key]['before_median_s'] * 1e3:8.1f} ms  after {res[key]['after_median_s'] * 1e3:8.1f} ms"
              f"  before/after {g:.3f} [{lo:.3f}, {hi:.3f}]", flush=True)
    isa = {}
    try:
        import rlx
        isa = {k: rlx.build_info()[k] for k in ("isa", "quant", "blas_config")}
    except Exception as e:  # noqa: BLE001
        isa = {"error": repr(e)}
    rec = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), args=vars(args),
               before=git_head(args.before), after=git_head(root), workers=[w.ready for w in ws],
               loadavg_start=load, loadavg_end=os.getloadavg()[0], isa=isa, gate=gate, gate_tolerance=tol,
               gate_top1_equal=same_top,
               steps_tokens=args.steps, times=times, results=res)
    os.makedirs(common.RESULTS, exist_ok=True)
    out = os.path.join(common.RESULTS, f"versions-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump(rec, f, indent=1)
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
