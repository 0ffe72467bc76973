#!/usr/bin/env python3
"""bench_pipeline: pipeline-parallel decode on one host, world 1..4, Qwen3-0.6B shape.

    .venv/bin/python benchmarks/bench_pipeline.py                 # hop latency + world 1..4 (README table)
    .venv/bin/python benchmarks/bench_pipeline.py --worlds 1 2 --new 8 --hops 500   # quicker
    .venv/bin/python benchmarks/bench_pipeline.py --readme        # also rewrite README's "Pipeline" table
    .venv/bin/python benchmarks/bench_pipeline.py --worlds 1 2 4 --many --threads 1   # + requests in flight

What is measured:
- per-hop latency: rank 0 and rank 1 (two processes, TcpTransport on 127.0.0.1) bounce a
  (1, 1024) float32 message (4 KiB: one token's hidden state at hidden_size 1024) back and forth;
  the median round trip over --hops trips (after 200 warm-up trips) and its half (one hop). The
  same for a (16, 1024) message (a 16-token prompt's hidden rows).
- decode: for each world W, W rank processes, each started with `python bench_pipeline.py
  --rank R ...` and a loopback listener handed over by file descriptor (as `python -m rlx pipeline`
  does), each generating ONLY its block's weights in memory (random f32, seeded per tensor name,
  so the blocks are the same tensors whatever the world) and building a PipelineDecodeStage with
  bucketed decode plans (with_decode_cache(64)). A 16-token prompt and 32 greedy new tokens through
  PipelineCoordinator.forward_step; one untimed warm-up utterance (compiles every plan), then a
  timed one: prefill (the first step) and decode (the other 31 steps) separately, tok/s = 31 /
  decode seconds. Per rank: co.timings over the decode steps (compute, send, wait per token) and
  peak RSS (ru_maxrss), next to world 1.

The model: Qwen3-0.6B's shapes (28 layers, hidden 1024, 16 q / 8 kv heads of 128, intermediate
3072, vocabulary 151936, tied embeddings, q/k norms) with max_position_embeddings 1024 instead of
40960 (the KV cache is allocated for it). f32 weights: 2.4 GB for the whole model, of which the
tied embedding / LM head is 0.62 GB: the embedding rank and rank 0 (LM head) both hold it.

Every process uses --threads rlx threads (default: all cores). With W processes on a machine of
fewer cores than W x threads the cores are oversubscribed; in a decode step only one rank computes
at a time (the others block in recv/broadcast), so this costs less than it looks, but it is not
W machines. Results: benchmarks/results/pipeline-<date>.json (git-ignored) and a Markdown report
on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
RESULTS = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")

SEED = 20240611
QWEN3_06B = {
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "attention_bias": False, "use_sliding_window": False,
    "bos_token_id": None, "eos_token_id": 151645,
}
MAX_PAST = 64


def rss_mb() -> float:
    """Peak RSS of this process: VmHWM (ru_maxrss is inherited from the launcher across fork/exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def current_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def block_weights(cfg, spec) -> dict[str, np.ndarray]:
    """The block's tensors only, each drawn from a generator seeded with (SEED, crc32(name)):
    2-D weights N(0, 0.02), norms 1 + N(0, 0.02)."""
    from rlx.distributed import block_weight_filter
    from rlx.weights import expected_weights

    out = {}
    for name, shape in expected_weights(cfg).items():
        if not block_weight_filter(name, cfg, spec):
            continue
        rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= 0.02
        if len(shape) == 1:
            a += 1.0
        out[name] = a
    return out


# ------------------------------------------------------------------------------------------------
# One rank (a subprocess)
# ------------------------------------------------------------------------------------------------

def rank_hop(args, transport) -> dict:
    t = transport
    out = {}
    for rows in (1, 16):
        msg = np.random.default_rng(0).standard_normal((rows, 1024)).astype(np.float32)
        buf = np.empty_like(msg)
        trips = []
        for i in range(200 + args.hops):
            t0 = time.perf_counter()
            if t.rank == 0:
                t.send_array(1, 1, msg)
                t.recv_array(1, 2, buf)
            else:
                t.recv_array(0, 1, buf)
                t.send_array(0, 2, buf)
            if i >= 200:
                trips.append(time.perf_counter() - t0)
        if t.rank == 0:
            assert np.array_equal(buf, msg)
            out[f"rtt_{rows}x1024_us"] = {"median": statistics.median(trips) * 1e6,
                                         "p10": float(np.percentile(trips, 10)) * 1e6,
                                         "p90": float(np.percentile(trips, 90)) * 1e6, "n": len(trips)}
        t.barrier()
    return out


def rank_decode(args, transport) -> dict:
    import rlx
    from rlx.config import config_from_dict
    from rlx.distributed import BlockSpec, PipelineCoordinator, ProcessGroup

    rank, world = transport.rank, transport.world
    rss_start = current_rss_mb()
    cfg = config_from_dict(QWEN3_06B)
    spec = BlockSpec.for_rank(cfg, rank, world)
    t0 = time.perf_counter()
    weights = block_weights(cfg, spec)
    t_weights = time.perf_counter() - t0
    t0 = time.perf_counter()
    stage = rlx.PipelineDecodeStage(cfg, "cpu", rank, world, weights).with_decode_cache(MAX_PAST)
    t_build = time.perf_counter() - t0
    weight_bytes = sum(a.nbytes for a in weights.values())
    co = PipelineCoordinator(ProcessGroup(transport))
    prompt = [int(x) for x in np.random.default_rng(1).integers(0, cfg.vocab_size, args.prompt)]

    def utterance():
        stage.reset()
        t0 = time.perf_counter()
        tok = co.forward_step(stage, prompt, lambda logits: stage.sample(logits))
        t1 = time.perf_counter()
        before = dict(co.timings)
        ids = [tok]
        for _ in range(args.new - 1):
            tok = co.forward_step(stage, [tok], lambda logits: stage.sample(logits))
            ids.append(tok)
        t2 = time.perf_counter()
        steps = args.new - 1
        per_tok = {k: (co.timings[k] - before[k]) / steps * 1e3 for k in ("compute", "send", "wait")}
        return ids, t1 - t0, t2 - t1, per_tok

    co.barrier()
    utterance()                       # warm-up: compiles the prefill plan and every decode bucket
    co.barrier()
    ids, prefill_s, decode_s, per_tok = utterance()
    co.barrier()
    return {"rank": rank, "role": stage.role.value, "layers": [spec.layer_begin, spec.layer_end - 1],
            "tensors": stage.weight_count(), "weight_gb": weight_bytes / 1e9,
            "weights_s": t_weights, "build_s": t_build, "rss_start_mb": rss_start,
            "rss_now_mb": current_rss_mb(), "peak_rss_mb": rss_mb(),
            "prefill_s": prefill_s, "decode_s": decode_s, "tok_s": (args.new - 1) / decode_s,
            "per_token_ms": per_tok, "ids": ids}


def rank_many(args, transport) -> dict:
    """Micro-batched decode: `world` requests in flight (PipelineCoordinator.generate_many), each a
    distinct --prompt-token prompt and --new greedy tokens; one untimed warm-up round, then a timed
    one. Aggregate tok/s = requests x new / seconds (their prefills included)."""
    import rlx
    from rlx.config import config_from_dict
    from rlx.distributed import PipelineCoordinator, ProcessGroup

    rank, world = transport.rank, transport.world
    cfg = config_from_dict(QWEN3_06B)
    stage = rlx.PipelineDecodeStage(cfg, "cpu", rank, world, block_weights(cfg, _spec(cfg, rank, world)))
    stage = stage.with_decode_cache(MAX_PAST)
    co = PipelineCoordinator(ProcessGroup(transport))
    n_req = args.inflight or world
    prompts = [[int(x) for x in np.random.default_rng(1 + j).integers(0, cfg.vocab_size, args.prompt)]
               for j in range(n_req)]
    co.barrier()
    co.generate_many(stage, prompts, 4, lambda logits, j: stage.sample(logits))  # warm-up: compiles
    co.barrier()
    before = dict(co.timings)
    t0 = time.perf_counter()
    ids = co.generate_many(stage, prompts, args.new, lambda logits, j: stage.sample(logits))
    seconds = time.perf_counter() - t0
    co.barrier()
    steps = co.timings["steps"] - before["steps"]
    per_step = {k: (co.timings[k] - before[k]) / max(steps, 1) * 1e3 for k in ("compute", "send", "wait")}
    return {"rank": rank, "requests": n_req, "seconds": seconds, "tok_s": n_req * args.new / seconds,
            "per_step_ms": per_step, "ids": ids}


def _spec(cfg, rank, world):
    from rlx.distributed import BlockSpec

    return BlockSpec.for_rank(cfg, rank, world)


def rank_main(args) -> int:
    import rlx
    from rlx.distributed import TcpTransport

    if args.threads:
        rlx.set_num_threads(args.threads)
    listener = socket.socket(fileno=args.listen_fd)
    with TcpTransport(args.rank, args.world, args.addrs.split(","), listener=listener, timeout=600) as t:
        listener.close()
        res = {"hop": rank_hop, "decode": rank_decode, "many": rank_many}[args.mode](args, t)
    res["threads"] = rlx.get_num_threads()
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------

def launch(args, mode: str, world: int) -> list[dict]:
    from rlx.distributed import free_loopback_addrs

    addrs, listeners = free_loopback_addrs(world)
    env = dict(os.environ)
    if args.threads:
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RLX_NUM_THREADS"):
            env[k] = str(args.threads)
    procs = []
    try:
        for r in range(world):
            fd = listeners[r].fileno()
            cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--rank", str(r), "--world", str(world),
                   "--addrs", ",".join(addrs), "--listen-fd", str(fd), "--threads", str(args.threads),
                   "--prompt", str(args.prompt), "--new", str(args.new), "--hops", str(args.hops),
                   "--inflight", str(args.inflight)]
            procs.append(subprocess.Popen(cmd, pass_fds=(fd,), stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT))
        for s in listeners:
            s.close()
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    finally:
        for s in listeners:
            s.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r, (p, out) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            raise SystemExit(f"{mode} world {world}: rank {r} exited with {p.returncode}")
        line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
        results.append(json.loads(line[len("RESULT "):]))
    return results


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def report(data: dict) -> str:
    hop = data["hop"]
    lines = []
    lines.append(f"Machine: {data['cpus']} CPUs, load average {data['load_before']} before / {data['load_after']} "
                 f"after (other jobs were running: figures are measured under load). rlx threads per rank: "
                 f"{data['threads']}. Qwen3-0.6B shape, random f32 weights, prompt {data['prompt']} tokens, "
                 f"{data['new']} new tokens (decode tok/s over the last {data['new'] - 1}), bucketed decode "
                 f"plans (max_past {MAX_PAST}), TCP on 127.0.0.1, one process per rank.")
    lines.append("")
    lines.append("| message | round trip, median (p10-p90) | one hop |")
    lines.append("|---|---|---|")
    for rows in (1, 16):
        h = hop[f"rtt_{rows}x1024_us"]
        lines.append(f"| ({rows}, 1024) f32, {rows * 4} KiB | {h['median']:.0f} us ({h['p10']:.0f}-{h['p90']:.0f}) "
                     f"| {h['median'] / 2:.0f} us |")
    lines.append("")
    lines.append("| world | decode tok/s | vs world 1 | prefill 16 tok (s) | per rank: layers, weights GB, peak RSS MB, "
                 "compute / send / wait ms per token |")
    lines.append("|---|---|---|---|---|")
    base = None
    for w, ranks in sorted(data["decode"].items(), key=lambda kv: int(kv[0])):
        r0 = ranks[0]
        if base is None:
            base = r0["tok_s"]
        cells = []
        for r in ranks:
            pt = r["per_token_ms"]
            cells.append(f"r{r['rank']} {r['layers'][0]}..{r['layers'][1]}{'+head' if r['rank'] == 0 else ''}"
                         f"{'+embed' if r['rank'] == int(w) - 1 else ''}: {r['weight_gb']:.2f} GB, "
                         f"{r['peak_rss_mb']:.0f} MB, {pt['compute']:.1f} / {pt['send']:.2f} / {pt['wait']:.1f}")
        lines.append(f"| {w} | {r0['tok_s']:.2f} | {r0['tok_s'] / base:.2f}x | {r0['prefill_s']:.2f} | "
                     + "<br>".join(cells) + " |")
    lines.append("")
    peak = {w: max(r["peak_rss_mb"] for r in ranks) for w, ranks in data["decode"].items()}
    total = {w: sum(r["peak_rss_mb"] for r in ranks) for w, ranks in data["decode"].items()}
    if data.get("many"):
        one = data["decode"].get("1", [None])[0]
        lines.append("")
        lines.append("Micro-batched (PipelineCoordinator.generate_many, `world` requests in flight): aggregate "
                     "tok/s of all requests (prefills included), against W x world 1's one-request decode tok/s "
                     "(the issue's target: >= 0.8).")
        lines.append("")
        lines.append("| world | requests | aggregate tok/s | / (W x world-1 tok/s) | per rank: compute / send / wait "
                     "ms per step |")
        lines.append("|---|---|---|---|---|")
        for w, ranks in sorted(data["many"].items(), key=lambda kv: int(kv[0])):
            r0 = ranks[0]
            share = f"{r0['tok_s'] / (int(w) * one['tok_s']):.2f}" if one else "-"
            cells = [f"r{r['rank']}: {r['per_step_ms']['compute']:.1f} / {r['per_step_ms']['send']:.2f} / "
                     f"{r['per_step_ms']['wait']:.1f}" for r in ranks]
            lines.append(f"| {w} | {r0['requests']} | {r0['tok_s']:.2f} | {share} | " + "<br>".join(cells) + " |")
    lines.append("")
    lines.append("Largest rank's peak RSS vs world 1: " + ", ".join(
        f"world {w} {peak[w]:.0f} MB ({peak[w] / peak['1']:.2f}x; all ranks together {total[w]:.0f} MB)"
        for w in sorted(peak, key=int)) if "1" in peak else "")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--hops", type=int, default=2000)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--readme", action="store_true", help="print the README table only (no file written)")
    # internal: one rank
    p.add_argument("--many", action="store_true",
                   help="also micro-batched decode: world requests in flight (generate_many) per world")
    p.add_argument("--inflight", type=int, default=0, help="requests in flight with --many (default: world)")
    p.add_argument("--mode", choices=["hop", "decode", "many"], default=None)
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--addrs")
    p.add_argument("--listen-fd", type=int)
    args = p.parse_args()
    if args.mode:
        return rank_main(args)
    if args.new < 2 or args.prompt + args.new > MAX_PAST:
        raise SystemExit(f"need --new >= 2 and --prompt + --new <= {MAX_PAST}")

    data = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpus": os.cpu_count(),
            "threads": args.threads, "prompt": args.prompt, "new": args.new, "load_before": loadavg()}
    print(f"[bench_pipeline] hop latency ({args.hops} round trips)...", file=sys.stderr, flush=True)
    data["hop"] = launch(args, "hop", 2)[0]
    data["decode"] = {}
    for w in args.worlds:
        print(f"[bench_pipeline] decode world {w}...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        ranks = launch(args, "decode", w)
        ids = {tuple(r["ids"]) for r in ranks}
        assert len(ids) == 1, f"world {w}: ranks disagree on the tokens"
        data["decode"][str(w)] = ranks
        print(f"[bench_pipeline]   {ranks[0]['tok_s']:.2f} tok/s ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    ids = {tuple(ranks[0]["ids"]) for ranks in data["decode"].values()}
    data["same_tokens_every_world"] = len(ids) == 1
    if args.many:
        data["many"] = {}
        for w in args.worlds:
            print(f"[bench_pipeline] micro-batched world {w}...", file=sys.stderr, flush=True)
            ranks = launch(args, "many", w)
            assert len({json.dumps(r["ids"]) for r in ranks}) == 1, f"world {w}: ranks disagree on the tokens"
            data["many"][str(w)] = ranks
            print(f"[bench_pipeline]   {ranks[0]['tok_s']:.2f} tok/s aggregate, {ranks[0]['requests']} in flight",
                  file=sys.stderr, flush=True)
    data["load_after"] = loadavg()
    text = report(data)
    print(text)
    if not data["same_tokens_every_world"]:
        print("WARNING: the worlds generated different tokens", file=sys.stderr)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"pipeline-{datetime.date.today().isoformat()}.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"[bench_pipeline] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
