#!/usr/bin/env python3
"""bench_ops: rlx's CPU kernels beside NumPy, op by op, on the real shapes of Qwen3-0.6B and
Llama-3.2-1B.

    python benchmarks/bench_ops.py                     # threads 1 and 2 (capped at nproc)
    python benchmarks/bench_ops.py --threads 1 --quick
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_ops.py   # see README

Matmul: GFLOP/s of a one-op rlx graph, x (M, K) @ W^T with W (N, K) (``transpose_b``, compiled for
"cpu"), at M = 1 (decode), 128 and 512 (prefill), beside NumPy's ``x @ W.T`` and beside a direct
ctypes call of cblas_sgemm (cblas_sgemv for M = 1) in the very OpenBLAS that rlx links, into a
preallocated output: "cblas direct" is the library with no rlx around it, so a gap splits into
"the library" (cblas vs numpy) and "rlx" (rlx vs cblas: its overhead, or its own kernel where
rlx does not call OpenBLAS, as for its matvec at M <= 4). Memory-bound ops (rmsnorm, silu*mul, add,
softmax, rope, decode attention over a 1024-token past): GB/s of the bytes they must read and
write, beside a NumPy equivalent. Every contender runs in the same process, interleaved rep by
rep, with the same thread count; the median is reported.

Each thread count runs in its own worker process started with OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS and RLX_NUM_THREADS set before anything is imported; inside it
``rlx.set_num_threads(t)`` and (when threadpoolctl is installed) ``threadpool_limits(t)`` set the
same number again and threadpoolctl reports which OpenBLAS builds and kernels are loaded.
OPENBLAS_THREAD_TIMEOUT=4 is set too (--blas-thread-timeout): a process holding two OpenBLAS
builds has two thread pools, and an idle pool's threads spin ~0.1 s after each call, taking a core
from the other pool's next (interleaved) call; with 4 they sleep at once, for both libraries.

Results: benchmarks/results/ops-<date>.json (git-ignored) and a Markdown table on stdout.
Requirements: the rlx venv (numpy); threadpoolctl is optional (kernel report and thread
control; without it the environment variables alone set the thread counts).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (name, hidden, q_out (heads*head_dim), kv_out, intermediate, vocab)
MODELS = {
    "Qwen3-0.6B": dict(hidden=1024, q=2048, kv=1024, inter=3072, vocab=151936),
    "Llama-3.2-1B": dict(hidden=2048, q=2048, kv=512, inter=8192, vocab=128256),
}


def matmul_shapes(m: dict) -> list[tuple[str, int, int]]:
    """(projection, N, K) for W (N, K); identical shapes are measured once."""
    h = m["hidden"]
    shapes = [("q_proj", m["q"], h), ("k/v_proj", m["kv"], h), ("o_proj", h, m["q"]),
              ("gate/up_proj", m["inter"], h), ("down_proj", h, m["inter"]), ("lm_head", m["vocab"], h)]
    out, seen = [], {}
    for name, n, k in shapes:
        if (n, k) in seen:
            out[seen[(n, k)]] = (out[seen[(n, k)]][0] + "+" + name.split("/")[0], n, k)
            continue
        seen[(n, k)] = len(out)
        out.append((name, n, k))
    return out


# ----------------------------------------------------------------------------------------------
# worker: everything below runs in the per-thread-count process
# ----------------------------------------------------------------------------------------------


def time_interleaved(fns: dict, budget: float, min_reps: int, max_reps: int, check=None) -> dict:
    """Runs each fn once (warm-up; check(outputs) sees what they returned), then runs them
    round-robin, rotating the order each rep, for `budget` seconds of the slowest (at least
    min_reps, at most max_reps reps). When the slowest warm-up took over SLOW seconds the warm-ups
    count as rep 0 and only min_reps - 1 more are run. Returns {name: [seconds]}."""
    names = list(fns)
    warm, outs = {}, {}
    for n in names:
        t0 = time.perf_counter()
        outs[n] = fns[n]()
        warm[n] = time.perf_counter() - t0
    if check is not None:
        check(outs)
    outs.clear()
    slowest = max(warm.values())
    if slowest > SLOW:
        times = {n: [warm[n]] for n in names}
        reps = max(1, min_reps - 1)
    else:
        times = {n: [] for n in names}
        reps = int(min(max_reps, max(min_reps, budget / max(slowest, 1e-7))))
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
    return times


SLOW = 1.0


class Cblas:
    """cblas_sgemm / cblas_sgemv of the OpenBLAS that rlx._C has loaded (found in /proc/self/maps),
    called directly through ctypes."""

    def __init__(self):
        path = None
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                base = os.path.basename(p)
                if base.startswith("libopenblas") and ".so" in base and "numpy" not in p:
                    path = p
                    break
        if path is None:
            raise RuntimeError("rlx's OpenBLAS not found in /proc/self/maps")
        self.path = path
        lib = ctypes.CDLL(path)
        self.sgemm = lib.cblas_sgemm
        self.sgemm.restype = None
        self.sgemv = lib.cblas_sgemv
        self.sgemv.restype = None
        self.c_float = ctypes.c_float

    def matmul_tb(self, out, x, w):
        """out (M, N) = x (M, K) @ w (N, K)^T: sgemv for one row, else sgemm with w transposed."""
        m, k = x.shape
        n = w.shape[0]
        px, pw, po = x.ctypes.data, w.ctypes.data, out.ctypes.data
        one, zero = self.c_float(1.0), self.c_float(0.0)
        if m == 1:  # RowMajor=101, NoTrans=111, Trans=112
            self.sgemv(101, 111, n, k, one, ctypes.c_void_p(pw), k, ctypes.c_void_p(px), 1, zero,
                       ctypes.c_void_p(po), 1)
        else:
            self.sgemm(101, 111, 112, m, n, k, one, ctypes.c_void_p(px), k, ctypes.c_void_p(pw), k, zero,
                       ctypes.c_void_p(po), n)


def bench_matmul(rlx, np, threads: int, quick: bool, log) -> list[dict]:
    rng = np.random.default_rng(0)
    try:
        cblas = Cblas()
    except (OSError, RuntimeError, AttributeError) as e:
        log(f"  (no direct cblas column: {e})")
        cblas = None
    ms = (1, 128) if quick else (1, 128, 512)
    rows = []
    for model, cfg in MODELS.items():
        for proj, n, k in matmul_shapes(cfg):
            w = (rng.standard_normal((n, k), dtype=np.float32) * 0.02)
            g = rlx.Graph()
            x_in = g.input("x", ("SEQ", k))
            w_p = g.param("w", (n, k))
            g.output(g.matmul(x_in, w_p, transpose_b=True), "y")
            plan = rlx.compile(g, device="cpu")
            plan.set_param("w", w)
            for m in ms:
                x = rng.standard_normal((m, k), dtype=np.float32)
                flops = 2.0 * m * n * k
                out_c = np.empty((m, n), np.float32)
                # (the names are deleted at the end of each loop: F821 is ruff reading the del, not a bug)
                fns = {"rlx": lambda: plan.run({"x": x})[0], "numpy": lambda: x @ w.T}  # noqa: F821
                if cblas is not None:
                    fns["cblas"] = lambda: cblas.matmul_tb(out_c, x, w) or out_c  # noqa: F821
                errs = {}

                def check(outs):  # the warm-up outputs must agree
                    ref = outs["numpy"]
                    scale = float(np.max(np.abs(ref))) + 1e-30
                    for name, o in outs.items():
                        errs[name] = float(np.max(np.abs(o - ref))) / scale

                times = time_interleaved(fns, 0.15 if quick else 0.3, min_reps=3, max_reps=10 if quick else 40,
                                         check=check)
                err = max(errs.values())
                if err > 1e-4:
                    log(f"  WARNING: results differ from numpy's by {err:g} (relative to max |y|)")
                med = {name: statistics.median(t) for name, t in times.items()}
                row = dict(kind="matmul", model=model, op=proj, M=m, N=n, K=k, threads=threads,
                           flops=flops, weight_bytes=4 * n * k, rel_err=err, reps=len(times["rlx"]),
                           seconds={name: med[name] for name in med},
                           gflops={name: flops / med[name] / 1e9 for name in med},
                           weight_gbs={name: 4.0 * n * k / med[name] / 1e9 for name in med})
                row["ratio_rlx_numpy"] = med["numpy"] / med["rlx"]
                row["min_seconds"] = {name: min(t) for name, t in times.items()}
                row["ratio_rlx_numpy_best"] = row["min_seconds"]["numpy"] / row["min_seconds"]["rlx"]
                if "cblas" in med:
                    row["ratio_cblas_numpy"] = med["numpy"] / med["cblas"]
                    row["ratio_rlx_cblas"] = med["cblas"] / med["rlx"]
                rows.append(row)
                log(f"  {model:13s} {proj:22s} M={m:<4d} N={n:<6d} K={k:<5d} "
                    + "  ".join(f"{name} {row['gflops'][name]:7.1f}" for name in med)
                    + f"  GFLOP/s  rlx/numpy {row['ratio_rlx_numpy']:.2f}  ({row['reps']} reps)")
                del x, out_c, fns
            del plan, w
            gc.collect()
    return rows


def bench_memory(rlx, np, threads: int, quick: bool, log) -> list[dict]:
    rng = np.random.default_rng(1)
    f32 = np.float32
    rows = []

    def rnd(*shape):
        return rng.standard_normal(shape, dtype=f32)

    def run(name, desc, graph_fn, inputs, numpy_fn, nbytes, params=None, atol=1e-4):
        g = rlx.Graph()
        graph_fn(g)
        plan = rlx.compile(g, device="cpu")
        for pn, pv in (params or {}).items():
            plan.set_param(pn, pv)
        (got,) = plan.run(inputs)
        ref = numpy_fn()
        err = float(np.max(np.abs(got.reshape(ref.shape) - ref)))
        if not err <= atol * max(1.0, float(np.max(np.abs(ref)))):
            log(f"  WARNING {name}: rlx differs from the NumPy equivalent by {err:g}")
        times = time_interleaved({"rlx": lambda: plan.run(inputs), "numpy": numpy_fn},
                                 0.1 if quick else 0.4, min_reps=3, max_reps=30 if quick else 200)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = dict(kind="memory", op=name, shape=desc, threads=threads, bytes=nbytes, max_abs_err=err,
                   reps=len(times["rlx"]), seconds=med, gbs={k: nbytes / v / 1e9 for k, v in med.items()})
        row["ratio_rlx_numpy"] = med["numpy"] / med["rlx"]
        row["min_seconds"] = {k: min(v) for k, v in times.items()}
        row["ratio_rlx_numpy_best"] = row["min_seconds"]["numpy"] / row["min_seconds"]["rlx"]
        rows.append(row)
        log(f"  {name:18s} {desc:34s} rlx {row['gbs']['rlx']:7.2f}  numpy {row['gbs']['numpy']:7.2f} GB/s"
            f"  rlx/numpy {row['ratio_rlx_numpy']:.2f}  ({row['reps']} reps)")

    S = 128 if quick else 512
    eps = 1e-6

    # rmsnorm over Llama-3.2-1B's hidden size, a prefill's rows
    H = 2048
    x, wn = rnd(S, H), rnd(H)

    def g_rms(g):
        g.output(g.rmsnorm(g.input("x", ("SEQ", H)), g.param("w", (H,)), eps=eps), "y")

    run("rmsnorm", f"({S}, {H})", g_rms, {"x": x},
        lambda: x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * wn,
        4 * (2 * S * H + H), params={"w": wn})

    # silu(gate) * up over Llama-3.2-1B's intermediate size (fused to silu_mul by the compiler)
    I = 8192
    a, b = rnd(S, I), rnd(S, I)

    def g_silu(g):
        g.output(g.mul(g.silu(g.input("a", ("SEQ", I))), g.input("b", ("SEQ", I))), "y")

    run("silu*mul (fused)", f"({S}, {I}) x2", g_silu, {"a": a, "b": b},
        lambda: a / (1.0 + np.exp(-a)) * b, 4 * 3 * S * I)

    # residual add at the hidden size
    r1, r2 = rnd(S, H), rnd(S, H)

    def g_add(g):
        g.output(g.add(g.input("a", ("SEQ", H)), g.input("b", ("SEQ", H))), "y")

    run("add", f"({S}, {H}) x2", g_add, {"a": r1, "b": r2}, lambda: r1 + r2, 4 * 3 * S * H)

    # softmax over attention scores: 16 heads x S queries x S keys
    sm = rnd(16 * S, S)

    def np_softmax():
        e = np.exp(sm - sm.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def g_sm(g):
        g.output(g.softmax(g.input("x", ("R", S))), "y")

    run("softmax", f"({16 * S}, {S})", g_sm, {"x": sm}, np_softmax, 4 * 2 * 16 * S * S)

    # rope on Qwen3's q: 16 heads x 128, rotate-half, theta 1e6
    Hq, D = 16, 128
    q = rnd(S, Hq, D)
    pos = np.arange(S, dtype=np.int32)
    inv_freq = (1.0 / (1e6 ** (np.arange(0, D, 2, dtype=np.float64) / D))).astype(f32)

    def np_rope():
        ang = pos[:, None].astype(f32) * inv_freq[None, :]
        cos = np.cos(ang)[:, None, :]
        sin = np.sin(ang)[:, None, :]
        x1, x2 = q[..., : D // 2], q[..., D // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def g_rope(g):
        g.output(g.rope(g.input("x", ("SEQ", Hq, D)), g.input("pos", ("SEQ",), dtype="i32"),
                        g.param("inv_freq", (D // 2,))), "y")

    run("rope", f"({S}, {Hq}, {D})", g_rope, {"x": q, "pos": pos}, np_rope,
        4 * (2 * S * Hq * D + S + D // 2), params={"inv_freq": inv_freq}, atol=1e-3)

    # decode attention: one query, 16 q heads / 8 kv heads x 128, over a 1024-token past
    P, Hkv = 1024, 8
    qd, kd, vd = rnd(1, Hq, D), rnd(1, Hkv, D), rnd(1, Hkv, D)
    kp, vp = rnd(P, Hkv, D), rnd(P, Hkv, D)
    scale = 1.0 / np.sqrt(D)

    def np_attn():
        kk = np.concatenate([kp, kd], axis=0).transpose(1, 2, 0)       # (Hkv, D, P+1)
        vv = np.concatenate([vp, vd], axis=0).transpose(1, 0, 2)       # (Hkv, P+1, D)
        qq = qd.reshape(Hkv, Hq // Hkv, D)                              # (Hkv, G, D)
        s = (qq @ kk) * scale
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        return (s @ vv).reshape(1, Hq, D)

    def g_attn(g):
        qv = g.input("q", ("SEQ", Hq, D))
        kv_ = g.input("k", ("SEQ", Hkv, D))
        vv_ = g.input("v", ("SEQ", Hkv, D))
        kpv = g.input("k_past", ("PAST", Hkv, D))
        vpv = g.input("v_past", ("PAST", Hkv, D))
        g.output(g.attention(qv, kv_, vv_, kpv, vpv), "y")

    run("attention decode", f"q 1x{Hq}x{D}, past {P}x{Hkv}x{D}", g_attn,
        {"q": qd, "k": kd, "v": vd, "k_past": kp, "v_past": vp}, np_attn,
        4 * (2 * Hq * D + 2 * Hkv * D + 2 * P * Hkv * D))
    return rows


def worker(threads: int, quick: bool, only: str) -> dict:
    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    import numpy as np

    sys.path.insert(0, ROOT)
    import rlx

    rlx.set_num_threads(threads)
    limiter = None
    info = None
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        limiter = threadpool_limits(limits=threads, user_api="blas")
        info = threadpool_info()
    except ImportError:
        log("  (threadpoolctl not installed: thread counts come from OPENBLAS_NUM_THREADS alone)")
    log(f"== threads={threads}")
    result = dict(threads=threads, threadpool_info=info, rlx_build_info=dict(rlx.build_info()),
                  rlx_num_threads=rlx.get_num_threads(), rows=[])
    t0 = time.perf_counter()
    if only in ("all", "matmul"):
        result["rows"] += bench_matmul(rlx, np, threads, quick, log)
    if only in ("all", "memory"):
        result["rows"] += bench_memory(rlx, np, threads, quick, log)
    result["seconds"] = time.perf_counter() - t0
    del limiter
    return result


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------


def cpu_facts() -> dict:
    facts = {"model_name": platform.processor() or "?", "flags": [], "nproc": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        for line in text.splitlines():
            if line.startswith("model name") and facts["model_name"] in ("?", "", platform.processor()):
                facts["model_name"] = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                facts["flags"] = sorted(f for f in flags if f.startswith(("avx", "fma", "amx", "f16c")))
                break
    except OSError:
        pass
    try:
        facts["loadavg"] = os.getloadavg()
    except OSError:
        pass
    return facts


def markdown(results: list[dict]) -> str:
    lines = []
    mm = [r for res in results for r in res["rows"] if r["kind"] == "matmul"]
    if mm:
        has_cblas = any("cblas" in r["gflops"] for r in mm)
        lines.append("### Matmul, GFLOP/s (x (M, K) @ W(N, K)^T, f32)\n")
        head = "| model | proj | M | N | K | threads | rlx | numpy | " + ("cblas direct | " if has_cblas else "") \
            + "rlx/numpy | best-of rlx/numpy | " + ("cblas/numpy | rlx/cblas |" if has_cblas else "")
        lines.append(head)
        lines.append("|" + "---|" * (head.count("|") - 1))
        for r in mm:
            g = r["gflops"]
            cells = [r["model"], r["op"], r["M"], r["N"], r["K"], r["threads"], f"{g['rlx']:.1f}", f"{g['numpy']:.1f}"]
            if has_cblas:
                cells.append(f"{g['cblas']:.1f}" if "cblas" in g else "-")
            cells.append(f"**{r['ratio_rlx_numpy']:.2f}**")
            cells.append(f"{r['ratio_rlx_numpy_best']:.2f}")
            if has_cblas:
                cells += [f"{r.get('ratio_cblas_numpy', float('nan')):.2f}", f"{r.get('ratio_rlx_cblas', float('nan')):.2f}"]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines.append("")
        # summary per (threads, M)
        lines.append("| threads | M | rlx/numpy: min | median | max | best-of median | "
                     + ("cblas/numpy median | rlx/cblas median |" if has_cblas else ""))
        lines.append("|---|---|---|---|---|---|" + ("---|---|" if has_cblas else ""))
        for t in sorted({r["threads"] for r in mm}):
            for m in sorted({r["M"] for r in mm}):
                sel = [r for r in mm if r["threads"] == t and r["M"] == m]
                rs = [r["ratio_rlx_numpy"] for r in sel]
                cells = [t, m, f"{min(rs):.2f}", f"{statistics.median(rs):.2f}", f"{max(rs):.2f}",
                         f"{statistics.median([r['ratio_rlx_numpy_best'] for r in sel]):.2f}"]
                if has_cblas:
                    for key in ("ratio_cblas_numpy", "ratio_rlx_cblas"):
                        rc = [r[key] for r in sel if key in r]
                        cells.append(f"{statistics.median(rc):.2f}" if rc else "-")
                lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines.append("")
    mem = [r for res in results for r in res["rows"] if r["kind"] == "memory"]
    if mem:
        lines.append("### Memory-bound ops, GB/s (bytes that must be read + written)\n")
        lines.append("| op | shape | threads | MB moved | rlx GB/s | numpy GB/s | rlx/numpy | best-of rlx/numpy |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in mem:
            lines.append(f"| {r['op']} | {r['shape']} | {r['threads']} | {r['bytes'] / 1e6:.1f} | {r['gbs']['rlx']:.2f} "
                         f"| {r['gbs']['numpy']:.2f} | **{r['ratio_rlx_numpy']:.2f}** | {r['ratio_rlx_numpy_best']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default=None,
                    help="comma-separated thread counts (default: 1,2 capped at the number of CPUs)")
    ap.add_argument("--quick", action="store_true", help="M in (1, 128), smaller ops, fewer reps")
    ap.add_argument("--only", choices=("all", "matmul", "memory"), default="all")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/ops-<date>.json)")
    ap.add_argument("--blas-thread-timeout", default="4",
                    help="OPENBLAS_THREAD_TIMEOUT for the workers (2^N cycles an idle OpenBLAS thread spins "
                         "before sleeping; 4 = sleep at once, so the two OpenBLAS pools in one process do not "
                         "steal cores from each other between interleaved calls); 'default' leaves it unset")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker is not None:
        json.dump(worker(args.worker, args.quick, args.only), sys.stdout)
        return 0

    ncpu = os.cpu_count() or 1
    if args.threads:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
    else:
        threads = sorted({1, min(2, ncpu)})
    env_note = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if any(env_note.values()):
        print(f"note: {env_note} is set; it pins OpenBLAS's kernel choice (numpy's bundled OpenBLAS "
              "included). To benchmark numpy as shipped, run this command under "
              "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`.", file=sys.stderr)
    t_start = time.perf_counter()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = []
    for t in threads:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t), RLX_NUM_THREADS=str(t))
        if args.blas_thread_timeout != "default":
            env["OPENBLAS_THREAD_TIMEOUT"] = str(int(args.blas_thread_timeout))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(t), "--only", args.only]
        if args.quick:
            cmd.append("--quick")
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            print(f"worker for {t} threads failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout))
    elapsed = time.perf_counter() - t_start

    doc = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), cpu=cpu_facts(),
               python=sys.version.split()[0], env=env_note,
               openblas_thread_timeout=args.blas_thread_timeout, loadavg_start=load_start, quick=args.quick, total_seconds=elapsed,
               results=results)
    try:
        import numpy

        doc["numpy"] = numpy.__version__
    except ImportError:
        pass
    out = args.out or os.path.join(HERE, "results", f"ops-{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)

    print(f"## bench_ops — {doc['date']}, {doc['cpu']['model_name']} ({ncpu} CPUs; "
          f"{' '.join(doc['cpu']['flags'])}), numpy {doc.get('numpy')}, {elapsed:.0f} s, "
          f"load average at the end {doc['cpu'].get('loadavg')}, OPENBLAS_THREAD_TIMEOUT {args.blas_thread_timeout}\n")
    for res in results:
        for lib in res.get("threadpool_info") or []:
            print(f"- threads={res['threads']}: {lib.get('filepath')} — {lib.get('internal_api')} "
                  f"{lib.get('version')}, kernel {lib.get('architecture')}, {lib.get('threading_layer')}, "
                  f"num_threads {lib.get('num_threads')}")
    print(f"- rlx.build_info(): {results[0]['rlx_build_info'] if results else {}}\n")
    print(markdown(results))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
