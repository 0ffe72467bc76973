#!/usr/bin/env python3
"""bench_invariant: what batch-invariant plans (Generator.with_batch_invariant) cost a batched
decode step, against the default plans, in one process, taking turns.

    python benchmarks/bench_invariant.py --gguf FILE.gguf [--batch 1 4 8 16] [--rounds 5] [--out R.json]

One Generator over the file (KV f16, --threads threads). Per B: B sequences over fixed random
prompts of 64 tokens, each prompt and its first token run alone (default plans); then --rounds
rounds, each timing a block of
--steps batched decode steps with the default plans and one with batch-invariant plans (the order
alternating by round; each block after one untimed step that compiles the mode's plans, which
switching drops). Before any timing, the two modes' logits of one batched step are compared: the
invariant plans' must equal, bit for bit, each sequence's logits decoded alone, and the default
plans' must agree with them within bench_fair's gate tolerance (the same function up to summation
order), or the run stops. Reported per B: each mode's median ms a step and the geometric mean of
the per-round ratios invariant / default with a 95% bootstrap interval (bench_fair.ratio_stats);
the record carries the rlx commit (bench_fair.git_state: a dirty tree refused unless
--allow-dirty), the machine (bench_fair.machine_info: CPU, flags, rlx's ISA) and its load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_fair as bf  # noqa: E402
from fair_gate import gate_tolerance  # noqa: E402

PROMPT = 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 4, 8, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", help="record path (JSON; a .md table beside it)")
    ap.add_argument("--allow-dirty", action="store_true")
    args = ap.parse_args()
    if any(not 1 <= b <= 16 for b in args.batch):
        ap.error("--batch: sizes 1..16")
    import rlx

    rlx.set_num_threads(args.threads)
    gen = rlx.Generator.from_pretrained(args.gguf, kv_dtype="f16")
    layers = gen._config.num_hidden_layers
    wtype = gen.dtype or "mixed"  # a mixed file (Q4_K_M): gate_tolerance gives block types 4 bits
    state = bf.git_state(args.allow_dirty)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "rlx": state,
              "machine": bf.machine_info(), "gguf": os.path.basename(args.gguf), "quant": rlx.build_info()["quant"],
              "threads": args.threads, "rounds": args.rounds, "steps": args.steps, "cells": []}
    rng = np.random.default_rng(0)
    vocab = gen._config.vocab_size
    rows = []
    for B in args.batch:
        prompts = [[int(t) for t in rng.integers(0, vocab, PROMPT)] for _ in range(B)]
        # each prompt three times (alone, default batch, invariant batch), its prompt and first token
        # alone, so that the next step is one decode position per sequence over the same cache
        trio = [[gen.new_sequence() for _ in range(B)] for _ in range(3)]
        gen.with_batch_invariant(False)  # the prompts through the default (prefill) kernels
        for group in trio:
            for s, p in zip(group, prompts):
                s.prefill(p)
                s.step_cached()
        alone, seqs_d, seqs = trio
        want = [a._c.logits(cached=True) for a in alone]
        default = gen.with_batch_invariant(False).logits_batch(seqs_d)
        invariant = gen.with_batch_invariant(True).logits_batch(seqs)
        tol = gate_tolerance(wtype, "f16", layers)[0]
        for i in range(B):
            if not np.array_equal(invariant[i], want[i]):
                sys.exit(f"B={B}: batch-invariant logits of sequence {i} differ from its own alone: stopped")
            if float(np.abs(default[i] - want[i]).max()) > tol * float(np.abs(want[i]).max()):
                sys.exit(f"B={B}: default logits of sequence {i} beyond the gate's tolerance: stopped")
            seqs[i].append(int(np.argmax(want[i])))  # one uncached position each again
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for mode in ((False, True) if r % 2 == 0 else (True, False)):
                gen.with_batch_invariant(mode)
                gen.step_batch(seqs)
                t = time.perf_counter()
                for _ in range(args.steps):
                    gen.step_batch(seqs)
                times[mode].append((time.perf_counter() - t) / args.steps * 1e3)
        ratio = bf.ratio_stats(times[False], times[True])  # invariant / default, per round
        record["cells"].append({"B": B, "default_ms": times[False], "invariant_ms": times[True], "ratio": ratio})
        lo, hi = ratio["ci95"]
        rows.append(f"| {B} | {np.median(times[False]):.1f} | {np.median(times[True]):.1f} | "
                    f"{ratio['ratio']:.2f}x [{lo:.2f}, {hi:.2f}] |")
        print(rows[-1], flush=True)
    record["loadavg_end"] = os.getloadavg()
    m = record["machine"]
    head = (f"bench_invariant, {record['date']}, rlx {state['commit']}{' (dirty)' if state['dirty'] else ''}, "
            f"{record['gguf']}, {m['cpu']}, ISA {m['rlx_isa']} (quant {record['quant']}), {args.threads} threads, "
            f"{args.rounds} rounds of {args.steps} steps, load {m['loadavg_start'][0]:.2f} -> "
            f"{record['loadavg_end'][0]:.2f}\n\n"
            "| B | default ms a step | invariant ms a step | invariant / default |\n|---|---|---|---|\n")
    print(head + "\n".join(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(head + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
