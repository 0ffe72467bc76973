#!/usr/bin/env python3
"""bench_matvec: does rlx's decode matrix-vector product stream weights as fast as the machine
reads memory? Interleaved with the read-bandwidth probe of bench_generate, pair by pair.

    python benchmarks/bench_matvec.py [--threads 2] [--pairs 8] [--gib 1]

A one-op rlx graph, y (1, N) = x (1, K) @ W^T with W (N, K) of 1 GiB (f32, then bf16 of the
same byte size), runs beside the probe (a C kernel summing a 1 GiB float32 array with the same
thread count; benchmarks/common.py). Each pair is one matvec pass (best of 3) and one probe pass
(best of 3) taken back to back, so both see the same phase of a machine whose bandwidth drifts
(shared hosts); the ratio matvec / probe is reported per pair and as the median over the pairs.
A ratio near 1 means the decode kernel is at the memory bound: a decode step then can only get
faster by reading fewer bytes. Results: stdout, benchmarks/results/matvec-<date>.json and the
section "Decode matvec beside the read probe" of benchmarks/README.md (--no-readme: not there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import numpy as np  # noqa: E402


def best_of(fn, n: int = 3) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--gib", type=float, default=1.0, help="bytes of weights per matrix, GiB")
    ap.add_argument("--no-readme", action="store_true", help="leave benchmarks/README.md alone")
    args = ap.parse_args()

    import rlx
    rlx.set_num_threads(args.threads)
    so = common._read_lib()
    nbytes = int(args.gib * (1 << 30))
    probe = np.ones(nbytes // 4, dtype=np.float32)
    K = 2048
    out = {"date": datetime.date.today().isoformat(), "threads": args.threads, "bytes": nbytes, "dtypes": {}}
    print(f"matvec (1, {K}) @ W^T, W {nbytes / 2**30:.2f} GiB, {args.threads} thread(s), "
          f"beside the read probe; GB/s per pair")
    for dtype in ("f32", "bf16"):
        item = 4 if dtype == "f32" else 2
        N = nbytes // (K * item)
        g = rlx.Graph()
        x = g.input("x", (1, K))
        w = g.param("w", (N, K), dtype=dtype)
        g.output(g.matmul(x, w, transpose_b=True), "y")
        plan = rlx.compile(g)
        if dtype == "f32":
            W = np.full((N, K), 0.5, dtype=np.float32)
        else:
            import ml_dtypes
            W = np.full((N, K), 0.5, dtype=ml_dtypes.bfloat16)
        plan.set_param("w", W)
        xa = np.ones((1, K), dtype=np.float32)
        (y,) = plan.run({"x": xa})
        assert np.all(y == 0.5 * K), "wrong product"
        pairs = []
        for _ in range(args.pairs):
            mv = W.nbytes / best_of(lambda: plan.run({"x": xa})) / 1e9  # noqa: F821 (plan: deleted after the loop)
            pr = probe.nbytes / best_of(lambda: so.read_sum(probe.ctypes.data, probe.size, args.threads)) / 1e9
            pairs.append((mv, pr))
            print(f"  {dtype:5s} matvec {mv:5.1f}   probe {pr:5.1f}   ratio {mv / pr:.3f}")
        ratio = statistics.median(m / p for m, p in pairs)
        out["dtypes"][dtype] = {"pairs_gbps": pairs, "median_ratio": ratio}
        print(f"  {dtype}: median matvec / probe = {ratio:.3f}")
        del plan, W
    rows = "\n".join(f"| {d} | {statistics.median(m for m, _ in r['pairs_gbps']):.1f} | "
                     f"{statistics.median(p for _, p in r['pairs_gbps']):.1f} | {r['median_ratio']:.3f} |"
                     for d, r in out["dtypes"].items())
    body = (__doc__.split("\n\n", 2)[2].strip() + "\n\n"
            f"Run {out['date']}: {args.threads} thread(s), {nbytes / 2**30:.2f} GiB of weights, {args.pairs} pairs "
            "(medians):\n\n| weights | matvec GB/s | probe GB/s | matvec / probe |\n|---|---|---|---|\n" + rows + "\n")
    if not args.no_readme:
        common.replace_readme_section(os.path.join(HERE, "README.md"), "Decode matvec beside the read probe", body)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", f"matvec-{out['date']}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
