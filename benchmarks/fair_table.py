#!/usr/bin/env python3
"""fair_table: the README's compact table of one or more bench_fair records.

    python benchmarks/fair_table.py RECORD.json [RECORD.json ...]

One table per record, one row per graded cell (model, weights, threads); each column one metric, as rlx's speed over
llama.cpp's with flash attention off / on (the bootstrap median ratio of the record). A cell
whose 95 % interval lies below 1 is a loss, printed in bold with its interval; one whose interval
contains 1 is a tie, printed with its interval; every other cell is a win. Above the table, one
line per record: its file, date, rlx commit, the machine's CPU and the ISA rlx's kernels ran on,
and whether the record is a measurement (bench_fair's grade). Every number comes from the
records; nothing is typed in here.
"""

from __future__ import annotations

import argparse
import json
import os

PEERS = ("llama.cpp fa=off", "llama.cpp fa=on")


def metric_label(m: str) -> str:
    """bench_fair's metric keys as the README names them: pp128, decode @1024, TTFT 2048."""
    kind, _, n = m.partition("@")
    return {"tg": f"decode @{n}", "ttft": f"TTFT {n}"}.get(kind, m)


def ratio_cell(r: dict) -> str:
    lo, hi = r["ci95"]
    s = f"{r['ratio']:.2f}x"
    if hi < 1:
        return f"**{s} [{lo:.2f}, {hi:.2f}]**"
    if lo <= 1:
        return f"{s} (tie [{lo:.2f}, {hi:.2f}])"
    return s


def model_name(cell: dict) -> str:
    """'Qwen3-0.6B-q4_k_m' -> 'Qwen3-0.6B': the weights have their own column."""
    name = cell["model"]
    suffix = "-" + cell["weights"]
    return name[: -len(suffix)] if name.endswith(suffix) else name


def record_line(path: str, rec: dict) -> str:
    m = rec["machine"]
    grade = "graded" if not rec.get("not_a_measurement") else "NOT graded: " + "; ".join(rec["not_a_measurement"])
    isa = m.get("rlx_isa", "?")
    forced = m.get("env", {}).get("RLX_CPU_ISA")
    if forced:
        isa += f" (RLX_CPU_ISA={forced})"
    return (
        f"- `{os.path.basename(path)}`: {rec['date'][:10]}, rlx {rec['rlx']['commit']}, {m['cpu']}, "
        f"{m['nproc']} cores, rlx kernels {isa}, {grade}"
    )


def table(path: str, rec: dict) -> str:
    cells = [c for c in rec["cells"] if c.get("metrics")]
    metrics = list(dict.fromkeys(m for c in cells for m in c["metrics"]))  # the record's order
    lines = [
        record_line(path, rec),
        "",
        "| model | weights | threads | " + " | ".join(map(metric_label, metrics)) + " |",
        "|---|---|---|" + "---|" * len(metrics),
    ]
    for c in cells:
        row = [model_name(c), c["weights"], str(c["threads"])]
        for m in metrics:
            rs = c["metrics"].get(m, {}).get("ratios", {})
            row.append(" / ".join(ratio_cell(rs[k]) for k in PEERS if k in rs) or "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", help="bench_fair record(s), .json")
    args = ap.parse_args()
    print("\n\n".join(table(p, json.load(open(p))) for p in args.records))


if __name__ == "__main__":
    main()
