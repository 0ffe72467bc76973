"""fair_gate: the logits gate both fair harnesses (bench_fair.py, bench_batch.py) run before any
timing, as arithmetic on logits; the harnesses run the engines and the oracle (bench_fair.run_gate,
bench_batch.batch_gate) and hand the logits here. The rule, its tolerance and why it is relative
for quantized weights: bench_fair.py's docstring ("The gate")."""

from __future__ import annotations

import math

import numpy as np

GATE_PROMPTS, GATE_PROMPT, GATE_STEPS = 8, 160, 3  # 8 independent prompts x (1 + 3) rows (--gate-prompts: more)
GATE_WIDEN = 8  # a gate failing on the relative KL rule alone decides on 8x its units (gate_peers)

# mantissa bits (with the implicit one) of the narrowest float a configuration passes through
PRECISION_BITS = {"f32": 24, "f16": 11, "bf16": 8}


def gate_tolerance(wtype: str, kv: str, layers: int) -> tuple[float, int]:
    bits = min(PRECISION_BITS.get(wtype, 4), PRECISION_BITS[kv])
    return 2.0 ** -bits * math.sqrt(layers) * 4, bits


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def kl_rows(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) in nats, one value per row."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def compare_logits(rl: np.ndarray, ref: np.ndarray, tol: float, oracle: np.ndarray | None = None,
                   units: np.ndarray | None = None) -> dict:
    """rlx's logits (rows, vocab) against a peer's (the reference). With `oracle` (quantized
    weights: the same file's weights dequantised, run in f32 with an f32 KV cache), the KL part of
    the gate is relative: rlx's mean KL from the oracle no larger than the peer's, beyond two
    standard errors of the paired difference, taken over independent units (`units`: the unit of
    each row, e.g. its prompt; the rows of one prompt share its KV cache, so they are not
    independent samples; None: each row its own unit); without it, KL(peer || rlx) <= 1e-3 on
    every row."""
    d = np.abs(rl.astype(np.float64) - ref.astype(np.float64))
    scale = float(np.max(np.abs(ref)))
    max_abs = float(d.max())
    kl = kl_rows(ref, rl)
    top_ref, top_rl = np.argmax(ref, -1), np.argmax(rl, -1)
    srt = np.sort(ref, axis=-1)
    margin = srt[:, -1] - srt[:, -2]
    disagree = [int(i) for i in np.nonzero(top_ref != top_rl)[0]]
    decided = [i for i in disagree if margin[i] >= 2 * max_abs]
    rel = max_abs / scale if scale > 0 else float("inf")
    out = {"rows": int(ref.shape[0]), "max_abs": max_abs, "mean_abs": float(d.mean()), "scale": scale,
           "rel_max": rel, "rel_mean": float(d.mean()) / scale if scale else None, "tol_rel": tol,
           "kl_max": float(kl.max()), "kl_mean": float(kl.mean()), "top1_agree": int(ref.shape[0] - len(disagree)),
           "top1_disagree_rows": disagree, "top1_decided_rows": decided, "top1_margins": [float(m) for m in margin]}
    if oracle is None:
        kl_ok = bool(kl.max() <= 1e-3)
    else:
        k_rl, k_ref = kl_rows(oracle, rl), kl_rows(oracle, ref)
        u = np.arange(len(k_rl)) if units is None else np.asarray(units)
        diff = np.array([(k_rl[u == i] - k_ref[u == i]).mean() for i in np.unique(u)])  # one per unit
        se = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else 0.0
        kl_ok = bool(diff.mean() <= 2 * se)
        out["oracle"] = {"kl_rlx_mean": float(k_rl.mean()), "kl_peer_mean": float(k_ref.mean()),
                         "kl_rlx_max": float(k_rl.max()), "kl_peer_max": float(k_ref.max()),
                         "units": int(len(diff)), "diff_per_unit": [float(x) for x in diff],
                         "diff_mean": float(diff.mean()), "diff_se": se,
                         "top1_rlx": int(np.sum(np.argmax(oracle, -1) == top_rl)),
                         "top1_peer": int(np.sum(np.argmax(oracle, -1) == top_ref)), "pass": kl_ok}
    out["pass"] = bool(rel <= tol and not decided and kl_ok)
    return out


def kl_only_failure(c: dict) -> bool:
    """A comparison (compare_logits) that fails on the relative KL rule alone: the size of the
    differences and the top-1 tokens within their bounds."""
    o = c.get("oracle")
    return bool(not c["pass"] and o is not None and not o["pass"] and c["rel_max"] <= c["tol_rel"]
                and not c["top1_decided_rows"])


def widened_note(c: dict) -> str:
    """For a record's table: where the gate widened (gate_peers), the narrow comparison's figures."""
    w = c.get("narrow")
    if not w or not w.get("oracle"):
        return ""
    o, n = c["oracle"], w["oracle"]
    return (f", decided over {o['units']} units after the narrow gate's {n['units']} failed its KL rule "
            f"({n['diff_mean']:+.1e}, se {n['diff_se']:.1e})")


def log_comparison(log, label: str, c: dict, unit: str) -> None:
    o = c.get("oracle")
    log(f"    gate rlx vs {label}: max|d| {c['max_abs']:.2e} = {c['rel_max']:.1e} x scale {c['scale']:.2f} "
        f"(tol {c['tol_rel']:.1e}), KL max {c['kl_max']:.1e}, top-1 {c['top1_agree']}/{c['rows']}"
        + (f"; from the f32 oracle, mean KL rlx {o['kl_rlx_mean']:.2e} vs {o['kl_peer_mean']:.2e} "
           f"(paired difference per {unit} {o['diff_mean']:+.1e}, se {o['diff_se']:.1e} over {o['units']}), "
           f"top-1 {o['top1_rlx']} vs {o['top1_peer']}" if o else "")
        + f" -> {'pass' if c['pass'] else 'FAIL'}")


def gate_peers(labels: list[str], sample, n: int, units, tol: float, log, unit: str) -> dict:
    """The gate's comparisons of rlx (labels[0]) with each peer (labels[1:]) over n draws of
    inputs (a draw: a prompt, or a batch of sequences). sample(lo, hi, labels) -> ({label:
    logits}, oracle logits or None) runs draws lo..hi-1 on the workers named; units(k) labels the
    rows of k draws with their independent units (a prompt or a sequence: compare_logits).
    A peer against which the gate fails on the relative KL rule alone (kl_only_failure) is compared
    once more over GATE_WIDEN * n draws, the n among them, and the wider comparison decides (under
    the same two-standard-error rule); the narrow one is kept under "narrow". Why: the prompts are
    fixed, the per-unit differences heavy-tailed and the rule one-sided at two standard errors, so
    two engines equally far from the oracle fail a narrow gate now and then, and then on every run
    of that file (Qwen3-0.6B q6_k on the Zen 5: +3.6 se over 8 prompts, -0.03 se over 32 others;
    Qwen3-0.6B q4_k_m, bench_batch B = 1: +2.3 se over 8 sequences, +0.9 se over 64 others and
    -1.5 se over 24 of bench_fair's prompts). A real excess grows in standard errors with the
    sample; a chance one does not. Differences of size or top-1 stop the gate at once."""
    logits, oracle = sample(0, n, labels)
    rl = logits[labels[0]]
    out = {}
    for lab in labels[1:]:
        out[lab] = compare_logits(rl, logits[lab], tol, oracle, units(n))
        log_comparison(log, lab, out[lab], unit)
    widen = [lab for lab in labels[1:] if kl_only_failure(out[lab])]
    if widen:
        m = GATE_WIDEN * n
        log(f"    the KL rule alone failed against {', '.join(widen)}: the gate widens to "
            f"{len(np.unique(units(m)))} {unit}s (these {len(np.unique(units(n)))} among them) and decides there")
        more, oracle_more = sample(n, m, [labels[0]] + widen)
        oracle_all = np.concatenate([oracle, oracle_more])
        rl_all = np.concatenate([rl, more[labels[0]]])
        for lab in widen:
            c = compare_logits(rl_all, np.concatenate([logits[lab], more[lab]]), tol, oracle_all, units(m))
            c["narrow"] = out[lab]
            out[lab] = c
            log_comparison(log, lab, c, unit)
    return out
