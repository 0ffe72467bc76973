"""fair_report: what a fair-harness record says: its grade (why it is not a measurement, if it is
not) and its markdown (tables, gate, bytes per token, memory). Used by bench_fair.py and
bench_batch.py; pure functions of the record."""

from __future__ import annotations

import numpy as np
from fair_gate import widened_note

QUIET_LOAD = 0.5  # 1-minute load average above which a cell group's figures are not a measurement
MIN_ROUNDS = 10


def grade(record: dict) -> list[str]:
    """Why this record is not a measurement (empty: it is one)."""
    why, st = [], record["settings"]
    if st.get("smoke"):
        why.append("smoke run (--smoke: the harness checked end to end, the figures mean nothing)")
    if st.get("quick"):
        why.append("--quick")
    if st["rounds"] < MIN_ROUNDS or (record["suite"] == "long" and st["long_rounds"] < MIN_ROUNDS):
        why.append(f"fewer than {MIN_ROUNDS} rounds per cell")
    if record["rlx"]["dirty"]:
        why.append("uncommitted changes in the tree (--allow-dirty)")
    busy = [c["loadavg_start"][0] for c in record["cells"] if c.get("loadavg_start")]
    if busy and max(busy) > QUIET_LOAD:
        why.append(f"machine busy: 1-minute load average up to {max(busy):.2f} at the start of a cell group "
                   f"(> {QUIET_LOAD})")
    if record.get("stopped"):
        why.append("the run stopped before its end")
    return why


def fmt_ratio(s: dict) -> str:
    return f"**{s['ratio']:.2f}x** [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"


def metric_label(k: str) -> str:
    if k.startswith("pp"):
        return f"prefill {k}"
    if k.startswith("ttft@"):
        return f"TTFT {k[5:]}"
    return f"decode @{k[3:]}"


def speed(r: dict, label: str, key: str) -> float:
    return r["tokens"] / float(np.median(r["times_s"][label]))


def cell_probe(r: dict) -> str:
    bw = r.get("bandwidth_gbps")
    return f"{bw[0]:.1f} / {bw[1]:.1f}" if bw else "—"


def bytes_per_token_lines(record: dict) -> list[str]:
    """The bytes-per-decoded-token table: per decode cell, the weights a step must read (the file's
    tensor table: decode_bytes) plus the KV cache at that context, the bandwidth ceiling they give,
    and for each engine its tok/s and the bytes per token that tok/s implies at the measured read
    bandwidth (bandwidth / tok/s: what the engine could have read per token, an upper bound)."""
    L = ["", "Bytes per decoded token (weights a step must read, from the file's tensor table, plus the KV cache at "
         "the context; implied = read bandwidth / measured tok/s, the most an engine can have read per token; "
         "GB = 1e9 bytes; read BW: the probe at the run's start; probe at the cell: before / after its rounds, "
         "where recorded):", "",
         "| model | KV | thr | metric | must read GB | of which weights | all weights GB | read BW GB/s "
         "| ceiling tok/s | rlx implied GB | llama.cpp FA off implied GB | FA on implied GB | probe at the cell GB/s |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = 0
    for c in record["cells"]:
        f, bw = c.get("facts", {}), record["bandwidth"].get(str(c.get("threads")), {}).get("gbps")
        if not c.get("metrics") or "decode_bytes" not in f or not bw:
            continue
        kvp = 2 * f["layers"] * f["kv_heads"] * f["head_dim"] * {"f32": 4, "f16": 2, "bf16": 2}[c["kv"]]
        for key, r in c["metrics"].items():
            if not key.startswith("tg@"):
                continue
            need = f["weights_per_token_bytes"] + kvp * int(key[3:])

            def implied(lab):
                return f"{bw / speed(r, lab, key):.3f}" if lab in r["times_s"] else "—"

            L.append(f"| {c['model']} | {c['kv']} | {c['threads']} | {metric_label(key)} | {need / 1e9:.3f} "
                     f"| {f['weights_per_token_bytes'] / 1e9:.3f} | {f['decode_bytes']['all'] / 1e9:.3f} | {bw:.1f} "
                     f"| {bw * 1e9 / need:.1f} | {implied('rlx')} | {implied('llama.cpp fa=off')} "
                     f"| {implied('llama.cpp fa=on')} | {cell_probe(r)} |")
            rows += 1
    return L if rows else []


def weight_pages_lines(cells: list) -> list[str]:
    """The model file's pages as each engine's process mapped them (MiB through 2 MiB pages of MiB
    resident), after the file was read once through rlx.mapping (warm_pages)."""
    L = []
    for c in cells:
        snap = c.get("mem", {})
        snap = snap.get(f"ctx{c['contexts'][-1]}", {}) if c.get("suite") == "long" else snap
        if c.get("page_cache") and snap and all("weight_pages" in v for v in snap.values()):
            pc = c["page_cache"]
            L.append(f"- {c['model']} {c['weights']} t{c['threads']}: page cache {pc['huge_mib']:.0f} of "
                     f"{pc['resident_mib']:.0f} MiB in 2 MiB pages before loading; " + ", ".join(
                         f"{lab} {v['weight_pages']['huge_mib']:.0f} of {v['weight_pages']['resident_mib']:.0f}"
                         for lab, v in snap.items()))
    if not L:
        return []
    return ["", "The model file's pages in each engine's process at the end (MiB mapped through 2 MiB pages, of "
            "MiB resident; the file was read once through rlx.mapping before any engine loaded it, so the page "
            "cache holds 2 MiB folios where the kernel can, and every engine's mapping gets them):", ""] + L


def record_head(record: dict, what: str, settings: str) -> list[str]:
    """A record's opening paragraph (bench_fair's and bench_batch's): NOT A MEASUREMENT where it is not
    one, then the run (`what`), the rlx commit, llama.cpp's versions, the machine and its load,
    `settings` (the harness's own sentence) and llama.cpp's weight buffers when they were off."""
    L, m = [], record["machine"]
    if record.get("not_a_measurement"):
        L.append("**NOT A MEASUREMENT** — " + "; ".join(record["not_a_measurement"]) + ". Quote nothing from "
                 "this table.")
        L.append("")
    L.append(f"Run {record['date']} ({what}; rlx {record['rlx']['commit']}"
             f"{' DIRTY (--allow-dirty)' if record['rlx']['dirty'] else ''}; llama-cpp-python "
             f"{record['llama_cpp'].get('llama_cpp_python')}, {', '.join(record['llama_cpp'].get('libs') or [])}). "
             f"Machine: {m['cpu']}, {m['nproc']} cores, ISA {m['isa']} (rlx dispatch: {m.get('rlx_isa')}); "
             f"load average {m['loadavg_start'][0]:.2f} at start, {m.get('loadavg_end', [float('nan')])[0]:.2f} at end. "
             + settings
             + (" llama.cpp ran with its extra weight buffers (AMX, CPU_REPACK) off (--llama-extra-bufts off, "
                "llama-cli's --no-repack)." if record["settings"].get("llama_extra_bufts") == "off" else ""))
    L.append("")
    return L


def gate_parts(g: dict) -> list[str]:
    """A gate's comparisons as the tables quote them, one per peer: max |delta| / scale and its
    tolerance, the largest KL, top-1 agreement; quantized weights: the mean KL from the f32 oracle,
    rlx vs the peer, the paired difference and its standard error, and whether the gate widened."""
    return [f"{p}: {v['rel_max']:.1e} (tol {v['tol_rel']:.0e}), KL {v['kl_max']:.0e}, top-1 {v['top1_agree']}/{v['rows']}"
            + (f", from the oracle {v['oracle']['kl_rlx_mean']:.2e} vs {v['oracle']['kl_peer_mean']:.2e} "
               f"({v['oracle']['diff_mean']:+.1e}, se {v['oracle']['diff_se']:.1e})" if v.get("oracle") else "")
            + widened_note(v) for p, v in g["peers"].items()]


def markdown(record: dict) -> str:
    st = record["settings"]
    L = record_head(record, f"{record['suite']} suite",
                    f"{st['rounds']} rounds per cell ({st['long_rounds']} in the long suite), decode blocks of "
                    f"{st['steps']} tokens; ratio = geometric mean of the per-round rlx / llama.cpp speed ratios "
                    "[95% bootstrap interval]; above 1: rlx faster.")
    L.append("| model | weights | KV | thr | metric | rlx tok/s | llama.cpp FA off tok/s | llama.cpp FA on tok/s "
             "| rlx / FA off | rlx / FA on | load (1 min) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in record["cells"]:
        if not c.get("metrics"):
            continue
        for k, r in c["metrics"].items():
            labs = list(r["times_s"])
            peers = {lab: r["ratios"][lab] for lab in labs[1:]}
            def tps(lab):
                return f"{speed(r, lab, k):.1f}" if lab in r["times_s"] else "—"
            def rat(lab):
                return fmt_ratio(peers[lab]) if lab in peers else "—"
            if k.startswith("ttft@"):
                rl = f"{np.median(r['times_s']['rlx']) * 1e3:.0f} ms"
                off = (f"{np.median(r['times_s']['llama.cpp fa=off']) * 1e3:.0f} ms"
                       if "llama.cpp fa=off" in r["times_s"] else "—")
                on = (f"{np.median(r['times_s']['llama.cpp fa=on']) * 1e3:.0f} ms"
                      if "llama.cpp fa=on" in r["times_s"] else "—")
            else:
                rl, off, on = tps("rlx"), tps("llama.cpp fa=off"), tps("llama.cpp fa=on")
            ld = r["loadavg_1min"]
            L.append(f"| {c['model']} | {c['weights']} | {c['kv']} | {c['threads']} | {metric_label(k)} | {rl} | {off} "
                     f"| {on} | {rat('llama.cpp fa=off')} | {rat('llama.cpp fa=on')} | {min(ld):.2f}-{max(ld):.2f} |")
    L.append("")
    L.append("Gate (rlx against each llama.cpp variant, before timing; max |delta logit| relative to the largest "
             "llama.cpp logit, KL(llama.cpp || rlx) in nats, top-1 agreement over the rows; quantized weights: mean "
             "KL from the f32 oracle, rlx vs llama.cpp, paired difference per prompt and its standard error):")
    L.append("")
    for c in record["cells"]:
        g = c.get("gate")
        if not g:
            continue
        L.append(f"- {c['model']} {c['weights']} KV {c['kv']} t{c['threads']}: {'PASS' if g['pass'] else 'FAIL'} — "
                 + "; ".join(gate_parts(g)))
    L += bytes_per_token_lines(record)
    mems = [c for c in record["cells"] if c.get("suite") == "long" and c.get("mem")]
    if mems:
        L.append("")
        L.append("Memory against context (RSS of each worker process, MiB; rlx KV: the bytes its cache holds now, "
                 "its capacity, which grows geometrically; llama.cpp KV: bytes per cell times the tokens in use, "
                 "while it allocates the cache for n_ctx up front (kv_alloc_mib in the record)):")
        L.append("")
        L.append("| model | weights | KV | context | rlx RSS | rlx KV held | llama.cpp FA off RSS | FA on RSS "
                 "| llama.cpp KV in use |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for c in mems:
            for k, snap in c["mem"].items():
                if not k.startswith("ctx"):
                    continue
                def g(lab, f):
                    v = snap.get(lab, {}).get(f)
                    return "—" if v is None else (f"{v:.0f}" if f != "kv_bytes" else f"{v / 2**20:.0f}")
                L.append(f"| {c['model']} | {c['weights']} | {c['kv']} | {k[3:]} | {g('rlx', 'rss_mib')} | "
                         f"{g('rlx', 'kv_bytes')} | {g('llama.cpp fa=off', 'rss_mib')} | "
                         f"{g('llama.cpp fa=on', 'rss_mib')} | {g('llama.cpp fa=on', 'kv_bytes')} |")
    L.append("")
    L.append("Peak RSS per worker process (MiB, VmHWM of each engine's own process):")
    L.append("")
    for c in record["cells"]:
        snap = c.get("mem", {})
        snap = snap.get(f"ctx{c['contexts'][-1]}", {}) if c.get("suite") == "long" else snap
        if snap:
            L.append(f"- {c['model']} {c['weights']} KV {c['kv']} t{c['threads']} ({c['suite']}): " + ", ".join(
                f"{lab} {v['peak_rss_mib']:.0f}" for lab, v in snap.items()))
    L += weight_pages_lines(record["cells"])
    profs = [c for c in record["cells"] if c.get("rlx_profile")]
    if profs:
        L.append("")
        L.append("rlx per-op profile (Generator.profile; one untimed run each; ms and share of the ops' time):")
        L.append("")
        for c in profs:
            for k, p in c["rlx_profile"].items():
                tot = sum(p.values()) or 1.0
                top = sorted(p.items(), key=lambda kv: -kv[1])[:4]
                L.append(f"- {c['model']} {c['weights']} KV {c['kv']} t{c['threads']} {k}: total {tot * 1e3:.1f} ms; "
                         + ", ".join(f"{op} {v * 1e3:.1f} ({v / tot * 100:.0f}%)" for op, v in top))
    if record.get("stopped"):
        L.append("")
        L.append(f"**Run stopped: {record['stopped']}**")
    return "\n".join(L) + "\n"
