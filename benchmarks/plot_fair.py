#!/usr/bin/env python3
"""plot_fair: decode speed and memory against context length, from a bench_fair long-suite record.

    python benchmarks/plot_fair.py [RECORD.json] [--out benchmarks/plots/decode-vs-context.png]

Without a record, the newest benchmarks/results/fair-*-long*.json. One column per model of the
record: on top, decode tokens/s (median of the rounds) against the context, for rlx and llama.cpp
with flash attention off and on, and the bandwidth ceiling: the machine's read bandwidth at the
run's thread count (the record's C probe, best pass) divided by the bytes one decode step must
read, every weight once plus the KV cache of that context at its stored width; below, each
worker process's RSS (MiB) against the context, and the weights + KV bytes a step reads. Every
number comes from the record; nothing is typed in here.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

STYLE = {"rlx": ("tab:blue", "o", "rlx"), "llama.cpp fa=off": ("tab:orange", "s", "llama.cpp, flash attention off"),
         "llama.cpp fa=on": ("tab:red", "^", "llama.cpp, flash attention on")}


def newest_record() -> str | None:
    """The newest long-suite record that is a measurement (bench_fair's grade: not_a_measurement
    empty); a smoke, quick or busy-machine record is plotted only when named."""
    paths = sorted(glob.glob(os.path.join(HERE, "results", "fair-*-long*.json")), key=os.path.getmtime)
    paths = [p for p in paths if not json.load(open(p)).get("not_a_measurement", ["ungraded"])]
    return paths[-1] if paths else None


def kv_bytes_per_position(facts: dict, kv: str) -> int:
    return 2 * facts["layers"] * facts["kv_heads"] * facts["head_dim"] * {"f32": 4, "f16": 2, "bf16": 2}[kv]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", nargs="?")
    ap.add_argument("--out", default=os.path.join(HERE, "plots", "decode-vs-context.png"))
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    path = args.record or newest_record()
    if path is None:  # not an error (make bench on a busy machine): nothing that may be plotted
        print("plot_fair: no long-suite record that is a measurement in benchmarks/results/ (run bench_fair.py "
              "--suite long on a quiet machine, or name a record); nothing plotted")
        return 0
    rec = json.load(open(path))
    cells = [c for c in rec["cells"] if c.get("suite") == "long" and c.get("metrics")]
    if not cells:
        raise SystemExit(f"plot_fair: {path} has no long-suite cells with metrics")
    fig, axes = plt.subplots(2, len(cells), figsize=(5.2 * len(cells), 7.5), squeeze=False)
    for col, c in enumerate(cells):
        ctxs = [int(k[3:]) for k in c["metrics"] if k.startswith("tg@")]
        ax = axes[0][col]
        for lab, (color, marker, name) in STYLE.items():
            ys = [c["metrics"][f"tg@{x}"]["tokens"] / float(np.median(c["metrics"][f"tg@{x}"]["times_s"][lab]))
                  if lab in c["metrics"][f"tg@{x}"]["times_s"] else None for x in ctxs]
            if any(y is not None for y in ys):
                ax.plot(ctxs, ys, marker=marker, color=color, label=name)
        bw = rec["bandwidth"].get(str(c["threads"]), {}).get("gbps")
        wbytes = c["facts"]["weights_per_token_bytes"]
        kvp = kv_bytes_per_position(c["facts"], c["kv"])
        if bw:
            xs = np.geomspace(min(ctxs), max(ctxs), 50)
            ax.plot(xs, bw * 1e9 / (wbytes + kvp * xs), "k--", lw=1,
                    label=f"bandwidth ceiling ({bw:.0f} GB/s / (weights + KV))")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctxs)
        ax.set_xticklabels([f"{x // 1024}k" for x in ctxs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("context (positions in the KV cache)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{c['model']} {c['weights']}, KV {c['kv']}, {c['threads']} threads")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1][col]
        for lab, (color, marker, name) in STYLE.items():
            ys = [c["mem"].get(f"ctx{x}", {}).get(lab, {}).get("rss_mib") for x in ctxs]
            if any(y is not None for y in ys):
                ax.plot(ctxs, ys, marker=marker, color=color, label=f"{name}: RSS")
        ax.plot(ctxs, [(wbytes + kvp * x) / 2**20 for x in ctxs], "k:", lw=1, label="weights read + KV at that context")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctxs)
        ax.set_xticklabels([f"{x // 1024}k" for x in ctxs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("context (positions in the KV cache)")
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    m = rec["machine"]
    why = rec.get("not_a_measurement")
    wrap = lambda t: textwrap.fill(t, width=70 * len(cells))  # noqa: E731 - one column is narrow
    head = wrap("NOT A MEASUREMENT (" + "; ".join(why) + ")") + "\n" if why else ""
    fig.suptitle(head + wrap(f"bench_fair {rec['date']}, rlx {rec['rlx']['commit']}, llama-cpp-python "
                             f"{rec['llama_cpp'].get('llama_cpp_python')}; {m['cpu']} ({m['nproc']} cores, "
                             f"{m.get('rlx_isa')})"), fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"plot_fair: {os.path.relpath(args.out)} from {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
