#!/usr/bin/env python3
"""bench_generate: text generation with rlx beside llama.cpp and transformers, in one run.

    make bench-quick                                   # set-up + --quick --check
    make bench                                         # set-up + the full run (README table)
    python benchmarks/bench_generate.py --quick        # Qwen3-0.6B, f32+bf16, 2 threads, 1 rep
    python benchmarks/bench_generate.py --check        # + logits equality of the three engines
    python benchmarks/bench_generate.py --models Qwen3-0.6B --dtypes bf16 --threads 2 --engines rlx llama.cpp

What is measured (per model, weight dtype, thread count and engine):
- prefill tok/s at pp128 and pp512: one forward pass over a fresh prompt, logits of its last
  position only (rlx: prefill_get_last_logits; llama.cpp: Llama.eval; transformers: forward
  with logits_to_keep=1 and a new cache);
- decode tok/s, tg64 after a 128-token and after a 1024-token context: the context is prefilled
  and its first token drawn (untimed), then 64 greedy tokens are timed, each one forward pass
  over the KV cache and an argmax (rlx: generate_cached; llama.cpp: Llama.eval([tok]) + argmax
  of llama_get_logits_ith; transformers: forward with past_key_values + argmax);
- time to first token: a fresh 128-token prompt to its first greedy token;
- peak RSS of the process (VmHWM: its own; ru_maxrss would carry the parent's) and its RSS after imports, before the model is loaded.

Every (engine, model, dtype, threads) cell runs in a fresh subprocess (so RSS is per engine),
started with OMP/OPENBLAS/MKL/RLX_NUM_THREADS set; inside it rlx.set_num_threads(t),
llama.cpp n_threads = n_threads_batch = t, torch.set_num_threads(t). A cell loads the model,
warms up (one prefill of the longest prompt and a few decode steps), then measures once.
Repetitions repeat every cell, the engines' order rotating from one repetition to the next,
and the median over repetitions is reported with the rlx/peer ratio.

All engines read the same numbers: benchmarks/common.py writes each model once (random
weights, fixed seed) as a Hugging Face directory (rlx, transformers) and as a GGUF file
(llama.cpp) made from the very same arrays (see common.py for the layout); `--check` proves it
by comparing the three engines' logits on the f32 models (a 160-token prompt, then 3 decode
steps; llama.cpp with an f32 KV cache for the check).

The machine: CPU model (lscpu), read bandwidth (common.BandwidthProbe: a C streaming read of a
1 GiB float32 array by t threads, sampled before, between and after the cells, best pass kept),
and the decode ceiling = bandwidth / bytes of weights read
per token (every 2-D weight and the LM head once) with each engine's fraction of it.

Results: benchmarks/results/generate-<date>.json (git-ignored), a Markdown report on stdout,
and (full runs, or --readme) the "Generation" section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import MODELS, fmt, median  # noqa: E402

ENGINES = ("rlx", "llama.cpp", "transformers")
CHECK_PROMPT = 160
CHECK_STEPS = 3
CHECK_TOL = 1e-3  # max |a - b| / max |reference| on the f32 models


def prompt_ids(model: str, n: int, salt: int = 0) -> list[int]:
    """n token ids, fixed per (model, n, salt), away from the dummy vocab's special ids."""
    import numpy as np
    rng = np.random.default_rng([common.SEED, n, salt, 7])
    return [int(x) for x in rng.integers(300, MODELS[model]["vocab_size"] - 1, size=n)]


# ============================================================================= engines ====

class RlxEngine:
    name = "rlx"

    def load(self, paths, dtype, threads, n_ctx):
        import rlx
        rlx.set_num_threads(threads)
        cfg = rlx.load_config(paths["hf"])
        self.weights = rlx.load_weights(paths["hf"])
        self.gen = (rlx.Generator(cfg, self.weights, device="cpu", dtype=dtype)
                    .with_dynamic_prefill_cache().with_dynamic_decode_cache())
        self.rlx = rlx

    def prefill(self, ids):
        self.gen.prefill_get_last_logits(ids)

    def first_token(self, ids):
        self.gen.prefill(ids)
        return self.gen.step_cached()

    def decode(self, n):
        out = self.gen.generate_cached(n)
        assert len(out) == n, (len(out), n)

    def logits_check(self, prompt, feed):
        import numpy as np
        rows = [np.array(self.gen.prefill_get_last_logits(prompt), dtype=np.float32)]
        for t in feed:
            rows.append(np.array(self.gen.decode_get_logits(t), dtype=np.float32))
        return np.stack(rows)

    def info(self):
        out = {}
        try:
            out["build_info"] = self.rlx.build_info()
        except Exception as e:  # noqa: BLE001
            out["build_info"] = repr(e)
        try:
            k, _ = self.gen.kv_cache(0)
            out["kv_elem_bytes"] = int(k.dtype.itemsize)
        except Exception:  # noqa: BLE001
            pass
        try:
            from threadpoolctl import threadpool_info
            out["blas"] = [{k: d.get(k) for k in ("internal_api", "filepath", "version", "num_threads",
                                                  "architecture")} for d in threadpool_info()]
        except Exception:  # noqa: BLE001
            pass
        return out

    def profile(self, ids):
        """Per-op seconds of one decode step after ids (profiling on only for that)."""
        self.gen.prefill(ids)
        self.gen.step_cached()
        self.gen.profile(True)
        try:
            self.gen.step_cached()
            return self.gen.last_profile()
        finally:
            self.gen.profile(False)


class LlamaCppEngine:
    name = "llama.cpp"

    def load(self, paths, dtype, threads, n_ctx, f32_kv=False):
        import llama_cpp
        import numpy as np
        self.np = np
        self.lib = llama_cpp
        kw = {}
        if f32_kv:
            kw.update(type_k=0, type_v=0)  # GGML_TYPE_F32
        import ctypes
        self.log = []

        @llama_cpp.llama_log_callback
        def cb(level, text, user_data):
            self.log.append(text.decode("utf-8", errors="replace"))
        self._cb = cb  # kept alive while llama.cpp holds it
        llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
        self.llm = llama_cpp.Llama(model_path=paths["gguf"], n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                                   n_threads=threads, n_threads_batch=threads, use_mmap=True,
                                   logits_all=False, verbose=False, **kw)
        self.n_vocab = self.llm.n_vocab()
        self.tok = 0

    def _last_logits(self):
        ptr = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def prefill(self, ids):
        self.llm.reset()
        self.llm.eval(ids)

    def first_token(self, ids):
        self.prefill(ids)
        self.tok = int(self.np.argmax(self._last_logits()))
        return self.tok

    def decode(self, n):
        for _ in range(n):
            self.llm.eval([self.tok])
            self.tok = int(self.np.argmax(self._last_logits()))

    def logits_check(self, prompt, feed):
        np = self.np
        self.prefill(prompt)
        rows = [np.array(self._last_logits(), dtype=np.float32)]
        for t in feed:
            self.llm.eval([t])
            rows.append(np.array(self._last_logits(), dtype=np.float32))
        return np.stack(rows)

    def info(self):
        out = {"llama_cpp_python": getattr(self.lib, "__version__", "?")}
        try:
            out["system_info"] = self.lib.llama_print_system_info().decode(errors="replace")
        except Exception:  # noqa: BLE001
            pass
        import re
        text = "".join(self.log)
        m = re.search(r"K \((\w+)\):.*V \((\w+)\):", text)
        out["kv_type"] = f"{m.group(1)}/{m.group(2)} (read back from llama.cpp's log)" if m else "not read back"
        m = re.search(r"flash_attn\s*=\s*(\w+)", text)
        out["flash_attn"] = m.group(1) if m else None
        return out


class TransformersEngine:
    name = "transformers"

    def load(self, paths, dtype, threads, n_ctx):
        import torch
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        import transformers
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.transformers = transformers
        tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
        try:
            self.model = AutoModelForCausalLM.from_pretrained(paths["hf"], dtype=tdt)
        except TypeError:  # transformers 4.x
            self.model = AutoModelForCausalLM.from_pretrained(paths["hf"], torch_dtype=tdt)
        self.model.eval()
        self.pkv = None
        self.tok = None
        # transformers >= 5.x names the cache argument and output `cache` (past_key_values before).
        import inspect
        self.cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def _fwd(self, ids, pkv):
        """(logits, cache) of one forward pass; only the last position's logits."""
        torch = self.torch
        with torch.inference_mode():
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_kw: pkv})
        return out.logits, getattr(out, self.cache_kw)

    def prefill(self, ids):
        self._fwd(self.torch.tensor([ids]), None)

    def first_token(self, ids):
        logits, self.pkv = self._fwd(self.torch.tensor([ids]), None)
        self.tok = logits[:, -1].argmax(-1, keepdim=True)
        return int(self.tok)

    def decode(self, n):
        for _ in range(n):
            logits, self.pkv = self._fwd(self.tok, self.pkv)
            self.tok = logits[:, -1].argmax(-1, keepdim=True)

    def logits_check(self, prompt, feed):
        import numpy as np
        torch = self.torch
        logits, pkv = self._fwd(torch.tensor([prompt]), None)
        rows = [logits[0, -1].float().numpy().copy()]
        for t in feed:
            logits, pkv = self._fwd(torch.tensor([[t]]), pkv)
            rows.append(logits[0, -1].float().numpy().copy())
        return np.stack(rows)

    def info(self):
        return {"torch": self.torch.__version__, "transformers": self.transformers.__version__,
                "torch_threads": self.torch.get_num_threads()}


ENGINE_CLASSES = {"rlx": RlxEngine, "llama.cpp": LlamaCppEngine, "transformers": TransformersEngine}


# ============================================================================= workers ====

def run_cell(spec: dict) -> dict:
    """One (engine, model, dtype, threads) cell, in this (fresh) process."""
    res = {k: spec[k] for k in ("engine", "model", "dtype", "threads", "rep")}
    res["rss_base_mib"] = common.current_rss_mib()
    eng = ENGINE_CLASSES[spec["engine"]]()
    paths = common.model_paths(spec["model"], spec["dtype"])
    t0 = time.perf_counter()
    eng.load(paths, spec["dtype"], spec["threads"], spec["n_ctx"])
    res["load_s"] = time.perf_counter() - t0
    res["rss_loaded_mib"] = common.current_rss_mib()
    model = spec["model"]

    # Warm-up: the longest prompt once, then a few decode steps.
    t0 = time.perf_counter()
    eng.prefill(prompt_ids(model, max(spec["pp"]), salt=99))
    eng.first_token(prompt_ids(model, min(spec["pp"]), salt=98))
    eng.decode(4)
    res["warmup_s"] = time.perf_counter() - t0

    res["pp_tps"] = {}
    for n in spec["pp"]:
        ids = prompt_ids(model, n, salt=1)
        t0 = time.perf_counter()
        eng.prefill(ids)
        res["pp_tps"][str(n)] = n / (time.perf_counter() - t0)

    res["tg_tps"] = {}
    max_pos = 0
    for ctx, n in spec["tg"]:
        ids = prompt_ids(model, ctx, salt=2)
        t0 = time.perf_counter()
        eng.first_token(ids)
        t1 = time.perf_counter()
        if ctx == spec["ttft_ctx"]:
            res["ttft_ms"] = (t1 - t0) * 1e3
        eng.decode(n)
        res["tg_tps"][str(ctx)] = n / (time.perf_counter() - t1)
        max_pos = max(max_pos, ctx + n + 1)
    if "ttft_ms" not in res:
        ids = prompt_ids(model, spec["ttft_ctx"], salt=2)
        t0 = time.perf_counter()
        eng.first_token(ids)
        res["ttft_ms"] = (time.perf_counter() - t0) * 1e3
    res["kv_positions"] = max_pos
    res["rss_peak_mib"] = common.peak_rss_mib()
    res["info"] = eng.info()
    if spec["engine"] == "rlx" and spec.get("profile", True):
        try:
            res["decode_profile_s"] = eng.profile(prompt_ids(model, spec["ttft_ctx"], salt=2))
        except Exception as e:  # noqa: BLE001
            res["decode_profile_s"] = {"error": repr(e)}
    res["ok"] = True
    return res


def run_check_worker(spec: dict) -> dict:
    import numpy as np
    eng = ENGINE_CLASSES[spec["engine"]]()
    paths = common.model_paths(spec["model"], spec["dtype"])
    n_ctx = CHECK_PROMPT + CHECK_STEPS + 64
    if spec["engine"] == "llama.cpp":
        eng.load(paths, spec["dtype"], spec["threads"], n_ctx, f32_kv=True)
    else:
        eng.load(paths, spec["dtype"], spec["threads"], n_ctx)
    prompt = prompt_ids(spec["model"], CHECK_PROMPT, salt=5)
    feed = prompt_ids(spec["model"], CHECK_STEPS, salt=6)
    logits = eng.logits_check(prompt, feed)
    np.save(spec["out"], logits)
    return {"ok": True, "shape": list(logits.shape)}


def thread_env(threads: int) -> dict:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RLX_NUM_THREADS"):
        env[k] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(flag: str, spec: dict, timeout: float) -> dict:
    """Runs this script with flag + spec in a fresh process; its last 'RESULT ' line is the answer."""
    cmd = [sys.executable, os.path.abspath(__file__), flag, json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=thread_env(spec["threads"]), capture_output=True, text=True,
                           timeout=timeout, cwd=common.ROOT)
    except subprocess.TimeoutExpired:
        return {**spec, "ok": False, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            out = json.loads(line[7:])
            out["wall_s"] = wall
            return out
    tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
    return {**{k: spec.get(k) for k in ("engine", "model", "dtype", "threads", "rep")}, "ok": False,
            "error": f"exit {p.returncode}: " + " | ".join(tail), "wall_s": wall}


def worker_main(flag: str, arg: str) -> None:
    spec = json.loads(arg)
    try:
        out = run_cell(spec) if flag == "--worker" else run_check_worker(spec)
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        out = {**{k: spec.get(k) for k in ("engine", "model", "dtype", "threads", "rep")},
               "ok": False, "error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(out), flush=True)


# ============================================================================== report ====

def check_models(models, engines, threads, log, timeout) -> dict:
    """The three engines' logits on each f32 model; max |diff| / max |transformers| per pair."""
    import numpy as np
    out = {}
    for model in models:
        logits, errors = {}, {}
        for eng in engines:
            path = os.path.join(common.CACHE, f"check-{model}-{eng}.npy")
            if os.path.exists(path):
                os.remove(path)
            spec = {"engine": eng, "model": model, "dtype": "f32", "threads": threads, "rep": 0, "out": path}
            t0 = time.perf_counter()
            r = spawn("--check-worker", spec, timeout)
            if r.get("ok"):
                logits[eng] = np.load(path)
                os.remove(path)
            else:
                errors[eng] = r.get("error")
            log(f"  check {model} {eng}: {'ok' if r.get('ok') else r.get('error')} ({time.perf_counter() - t0:.0f} s)")
        ref_name = "transformers" if "transformers" in logits else next(iter(logits), None)
        pairs = {}
        names = list(logits)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ref = logits[ref_name] if ref_name else logits[b]
                diff = float(np.max(np.abs(logits[a] - logits[b])))
                scale = float(np.max(np.abs(ref)))
                same_argmax = bool(np.all(np.argmax(logits[a], -1) == np.argmax(logits[b], -1)))
                pairs[f"{a} vs {b}"] = {"max_abs": diff, "rel": diff / scale, "argmax_equal": same_argmax,
                                        "pass": diff / scale <= CHECK_TOL}
        out[model] = {"prompt": CHECK_PROMPT, "decode_steps": CHECK_STEPS, "tol_rel": CHECK_TOL,
                      "reference_scale_from": ref_name, "pairs": pairs, "errors": errors,
                      "pass": bool(pairs) and all(p["pass"] for p in pairs.values()) and not errors}
    return out


def summarize(cells: list[dict], spec: dict, machine: dict) -> dict:
    """Medians over repetitions, ratios and targets."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["dtype"], c["threads"], c["engine"]), []).append(c)
    med: dict[tuple, dict] = {}
    for key, cs in groups.items():
        ok = [c for c in cs if c.get("ok")]
        m = {"n_ok": len(ok), "n": len(cs), "errors": [c.get("error") for c in cs if not c.get("ok")]}
        for n in spec["pp"]:
            m[f"pp{n}"] = median([c["pp_tps"].get(str(n)) for c in ok])
        for ctx, n in spec["tg"]:
            m[f"tg{n}@{ctx}"] = median([c["tg_tps"].get(str(ctx)) for c in ok])
        m["ttft_ms"] = median([c.get("ttft_ms") for c in ok])
        m["rss_peak_mib"] = median([c.get("rss_peak_mib") for c in ok])
        m["rss_base_mib"] = median([c.get("rss_base_mib") for c in ok])
        m["load_s"] = median([c.get("load_s") for c in ok])
        model, dtype, threads, _ = key
        bw = machine["bandwidth"].get(str(threads), {}).get("gbps")
        ceil = bw * 1e9 / common.decode_bytes_per_token(model, dtype) if bw else None
        m["ceiling_tps"] = ceil
        tg0 = f"tg{spec['tg'][0][1]}@{spec['tg'][0][0]}"
        m["ceiling_fraction"] = (m[tg0] / ceil) if (ceil and m[tg0]) else None
        # the same fraction per cell, against the bandwidth sampled just before that cell (the
        # machine's bandwidth drifts between phases), median over the repetitions
        bpt = common.decode_bytes_per_token(model, dtype)
        m["ceiling_fraction_paired"] = median([
            c["tg_tps"][str(spec["tg"][0][0])] * bpt / (c["bw_gbps_before"] * 1e9) for c in ok
            if c.get("bw_gbps_before") and c["tg_tps"].get(str(spec["tg"][0][0]))])
        kvb = next((c["info"].get("kv_elem_bytes") for c in ok if c.get("info", {}).get("kv_elem_bytes")), 4)
        kv_pos = max([c.get("kv_positions", 0) for c in ok] or [0])
        m["rss_budget_mib"] = (common.weight_bytes(model, dtype) + common.kv_bytes(model, kv_pos, kvb)) / 2**20
        med[key] = m

    metrics = [f"pp{n}" for n in spec["pp"]] + [f"tg{n}@{ctx}" for ctx, n in spec["tg"]]
    ratios = {}
    for (model, dtype, threads, eng), m in med.items():
        if eng != "rlx":
            continue
        for peer in ("llama.cpp", "transformers"):
            pm = med.get((model, dtype, threads, peer))
            if not pm:
                continue
            r = {k: (m[k] / pm[k]) if (m.get(k) and pm.get(k)) else None for k in metrics}
            r["ttft"] = (pm["ttft_ms"] / m["ttft_ms"]) if (m.get("ttft_ms") and pm.get("ttft_ms")) else None
            ratios[f"{model}|{dtype}|{threads}|{peer}"] = r

    tg0 = f"tg{spec['tg'][0][1]}@{spec['tg'][0][0]}"
    pp_big = f"pp{max(spec['pp'])}"
    targets = []
    t_thr = 2 if 2 in spec["threads"] else max(spec["threads"])
    for model in spec["models"]:
        for dtype in spec["dtypes"]:
            rl = med.get((model, dtype, t_thr, "rlx"))
            if not rl:
                continue
            rc = ratios.get(f"{model}|{dtype}|{t_thr}|llama.cpp", {})
            rt = ratios.get(f"{model}|{dtype}|{t_thr}|transformers", {})

            def add(name, value, need, ok_fn):
                targets.append({"model": model, "dtype": dtype, "threads": t_thr, "target": name,
                                "value": value, "need": need,
                                "met": None if value is None else bool(ok_fn(value))})
            add(f"decode {tg0} vs llama.cpp", rc.get(tg0), ">= 1.0x", lambda v: v >= 1.0)
            add(f"prefill {pp_big} vs llama.cpp", rc.get(pp_big), ">= 0.9x", lambda v: v >= 0.9)
            add(f"decode {tg0} fraction of ceiling (bandwidth sampled before each cell)",
                rl.get("ceiling_fraction_paired"), ">= 80%", lambda v: v >= 0.8)
            add(f"decode {tg0} fraction of ceiling (best bandwidth pass of the run)", rl.get("ceiling_fraction"),
                ">= 80%", lambda v: v >= 0.8)
            rss = rl.get("rss_peak_mib")
            add("peak RSS / (weights + KV)", (rss / rl["rss_budget_mib"]) if rss else None, "<= 1.1x",
                lambda v: v <= 1.1)
            add(f"decode {tg0} vs transformers", rt.get(tg0), ">= 3.0x", lambda v: v >= 3.0)
    return {"medians": {"|".join(map(str, k)): v for k, v in med.items()}, "ratios": ratios,
            "targets": targets, "metrics": metrics}


def markdown(result: dict) -> str:
    spec, mach, summ = result["spec"], result["machine"], result["summary"]
    med = summ["medians"]
    metrics = summ["metrics"]
    L = []
    load = mach.get("loadavg_start"), mach.get("loadavg_end")
    L.append(f"Run {result['date']} ({spec.get('kind', 'full')}; {spec['reps']} repetition(s), "
             f"medians; {result['duration_s'] / 60:.1f} min). Machine: {mach['cpu']} ({mach['nproc']} cores, "
             f"{mach['mem_gib']:.0f} GiB; {', '.join(f for f in mach['flags'] if f in ('avx2', 'avx512f', 'avx512_bf16', 'avx512_vnni', 'amx_bf16')) or 'no AVX2'}); "
             f"load average {load[0]} at start, {load[1]} at end.")
    bws = "; ".join(f"{t} thread(s): {b['gbps']:.1f} GB/s (median of the samples' bests {b['gbps_median']:.1f})"
                    for t, b in sorted(mach["bandwidth"].items()))
    L.append(f"Read bandwidth ({next(iter(mach['bandwidth'].values()))['method']}; 1 GiB; best pass of the "
             f"samples taken before, between and after the cells): {bws}.")
    lkv = sorted({str((c.get("info") or {}).get("kv_type")) for c in result["cells"]
                  if c.get("engine") == "llama.cpp" and c.get("ok")})
    rkv = sorted({str((c.get("info") or {}).get("kv_elem_bytes")) for c in result["cells"]
                  if c.get("engine") == "rlx" and c.get("ok")})
    L.append(f"rlx {result['versions'].get('rlx_commit', '?')} (KV element bytes, read back: {', '.join(rkv)}); "
             f"llama-cpp-python {result['versions'].get('llama_cpp_python', '?')} "
             f"(KV cache {', '.join(lkv)}; flash attention off, the wrapper's default); torch {result['versions'].get('torch', '?')}, "
             f"transformers {result['versions'].get('transformers', '?')}.")
    L.append("")
    cols = [m.replace("@", " @") for m in metrics]
    L.append("| model | dtype | thr | engine | " + " | ".join(f"{c} tok/s" for c in cols) +
             " | TTFT ms | peak RSS MiB | decode % of ceiling |")
    L.append("|" + "---|" * (4 + len(metrics) + 3))
    for model in spec["models"]:
        for dtype in spec["dtypes"]:
            for thr in spec["threads"]:
                ceil = None
                for eng in spec["engines"]:
                    m = med.get(f"{model}|{dtype}|{thr}|{eng}")
                    if not m:
                        continue
                    ceil = m.get("ceiling_tps") or ceil
                    if not m["n_ok"]:
                        err = (m["errors"][0] or "")[:80] if m["errors"] else ""
                        L.append(f"| {model} | {dtype} | {thr} | {eng} | failed: {err} |" + " |" * (len(metrics) + 2))
                        continue
                    frac, fpair = m.get("ceiling_fraction"), m.get("ceiling_fraction_paired")
                    L.append(f"| {model} | {dtype} | {thr} | {eng} | " +
                             " | ".join(fmt(m.get(k)) for k in metrics) +
                             f" | {fmt(m.get('ttft_ms'), 0)} | {fmt(m.get('rss_peak_mib'), 0)} | "
                             f"{fmt(frac * 100 if frac else None, 0)}% ({fmt(fpair * 100 if fpair else None, 0)}%) |")
                for peer in ("llama.cpp", "transformers"):
                    r = summ["ratios"].get(f"{model}|{dtype}|{thr}|{peer}")
                    if r:
                        L.append(f"| | | | *rlx / {peer}* | " + " | ".join(
                            (fmt(r.get(k), 2) + "x") if r.get(k) else "—" for k in metrics) +
                            f" | {(fmt(r.get('ttft'), 2) + 'x') if r.get('ttft') else '—'} | | |")
                if ceil:
                    L.append("| | | | *decode ceiling* | " +
                             " | ".join(fmt(ceil) if k.startswith("tg") else "" for k in metrics) + " | | | |")
    L.append("")
    L.append("Ratios are speed ratios (rlx / peer tok/s; TTFT: peer ms / rlx ms): above 1 means rlx is faster. "
             "Ceiling = read bandwidth at that thread count / bytes of weights read per token; "
             "the % of ceiling column gives the decode tok/s (tg at the shortest context) against the best "
             "bandwidth pass of the run and, in parentheses, the median over repetitions of each cell against "
             "the bandwidth sampled just before it. Bytes of weights per token: "
             f"({', '.join(f'{m} {d}: {common.decode_bytes_per_token(m, d) / 1e9:.2f} GB' for m in spec['models'] for d in spec['dtypes'])}).")
    L.append("")
    L.append(f"Targets ({summ['targets'][0]['threads'] if summ['targets'] else 2} threads):")
    L.append("")
    L.append("| model | dtype | target | value | needed | |")
    L.append("|---|---|---|---|---|---|")
    for t in summ["targets"]:
        v = t["value"]
        if v is None:
            vs = "—"
        elif "ceiling" in t["target"]:
            vs = f"{v * 100:.0f}%"
        else:
            vs = f"{v:.2f}x"
        mark = "n/a" if t["met"] is None else ("met" if t["met"] else "**missed**")
        L.append(f"| {t['model']} | {t['dtype']} | {t['target']} | {vs} | {t['need']} | {mark} |")
    chk = result.get("check")
    if chk:
        L.append("")
        L.append(f"Same numbers (`--check`, f32 models, {CHECK_PROMPT}-token prompt + {CHECK_STEPS} decode steps; "
                 "llama.cpp with an f32 KV cache): max |logit difference| (relative to max |logit|):")
        L.append("")
        for model, c in chk.items():
            parts = [f"{k}: {p['max_abs']:.2e} ({p['rel']:.1e}{'' if p['argmax_equal'] else ', argmax differs'})"
                     for k, p in c["pairs"].items()]
            errs = [f"{k} failed: {v}" for k, v in c["errors"].items()]
            L.append(f"- {model}: {'PASS' if c['pass'] else 'FAIL'} — " + "; ".join(parts + errs))
    prof = [(k, v) for k, v in result.get("profiles", {}).items() if v and "error" not in v]
    if prof:
        L.append("")
        L.append("rlx decode profile (one step after a 128-token context, share of the step's op time):")
        L.append("")
        for k, v in prof:
            tot = sum(v.values()) or 1.0
            top = sorted(v.items(), key=lambda kv: -kv[1])[:5]
            L.append(f"- {k.replace('|', ' ')} threads: " +
                     ", ".join(f"{op} {s / tot * 100:.0f}%" for op, s in top) + f" (total {tot * 1e3:.1f} ms)")
    return "\n".join(L) + "\n"


# ================================================================================ main ====

def versions() -> dict:
    out = {}
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=common.ROOT)
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=common.ROOT)
        out["rlx_commit"] = c.stdout.strip() + ("+dirty" if d.stdout.strip() else "")
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version
    for pkg, key in (("llama_cpp_python", "llama_cpp_python"), ("torch", "torch"),
                     ("transformers", "transformers"), ("numpy", "numpy"), ("gguf", "gguf")):
        try:
            out[key] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[key] = None
    return out


def machine_info(threads: list[int], probe, log) -> dict:
    mi = {"cpu": common.cpu_model(), "nproc": os.cpu_count(), "flags": common.cpu_flags(),
          "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
          "platform": platform.platform(), "python": platform.python_version(),
          "loadavg_start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
          "openblas_env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
          "bandwidth": {}}
    for t in threads:
        log(f"== read bandwidth, {t} thread(s): {probe.sample(t, reps=20):.1f} GB/s (sampled again before each cell)")
    return mi


def main(argv=None) -> int:
    if len(sys.argv) >= 3 and sys.argv[1] in ("--worker", "--check-worker"):
        worker_main(sys.argv[1], sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="Qwen3-0.6B, f32+bf16, 2 threads, pp128 and tg32 at 128 context, 1 repetition")
    ap.add_argument("--check", action="store_true", help="first compare the engines' logits on the f32 models")
    ap.add_argument("--check-only", action="store_true", help="only the logits check")
    ap.add_argument("--models", nargs="+", choices=list(MODELS))
    ap.add_argument("--dtypes", nargs="+", choices=common.DTYPES)
    ap.add_argument("--threads", nargs="+", type=int)
    ap.add_argument("--engines", nargs="+", choices=ENGINES)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--cell-timeout", type=float, default=1800.0, help="seconds per cell (default 1800)")
    ap.add_argument("--readme", dest="readme", action="store_true", default=None,
                    help="write the table into benchmarks/README.md (default: full runs only)")
    ap.add_argument("--no-readme", dest="readme", action="store_false")
    ap.add_argument("--out", help="JSON path (default benchmarks/results/generate-<date>.json)")
    args = ap.parse_args(argv)

    quick = args.quick
    spec = {
        "quick": quick,
        "models": args.models or (["Qwen3-0.6B"] if quick else list(MODELS)),
        "dtypes": args.dtypes or list(common.DTYPES if not quick else ("bf16", "f32")),
        "threads": [t for t in (args.threads or ([2] if quick else [1, 2]))],
        "engines": args.engines or list(ENGINES),
        "reps": args.reps or (1 if quick else 3),
        "pp": [128] if quick else [128, 512],
        "tg": [[128, 32]] if quick else [[128, 64], [1024, 64]],
        "ttft_ctx": 128,
    }
    ncpu = os.cpu_count() or 1
    if any(t > ncpu for t in spec["threads"]):
        print(f"note: {ncpu} CPUs; thread counts above that oversubscribe", file=sys.stderr)
    full = (not quick and spec["models"] == list(MODELS) and spec["dtypes"] == list(common.DTYPES)
            and spec["threads"] == [1, 2] and spec["engines"] == list(ENGINES) and spec["reps"] >= 3)
    spec["kind"] = "quick" if quick else ("full" if full else "custom")
    spec["n_ctx"] = max(max(spec["pp"]), max(c + n for c, n in spec["tg"])) + 64

    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    for model in spec["models"]:
        for dtype in set(spec["dtypes"]) | ({"f32"} if (args.check or args.check_only) else set()):
            common.ensure_model(model, dtype, log=log)
    log("== model files ready")

    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "spec": spec,
              "versions": versions(), "cells": [], "profiles": {}}
    if args.check or args.check_only:
        log("== --check: logits of the f32 models, engine by engine")
        result["check"] = check_models(spec["models"], spec["engines"], max(spec["threads"]), log,
                                       args.cell_timeout)
        for model, c in result["check"].items():
            for k, p in c["pairs"].items():
                log(f"  {model} {k}: max |diff| {p['max_abs']:.3e} rel {p['rel']:.2e} "
                    f"argmax {'equal' if p['argmax_equal'] else 'DIFFERS'} -> {'pass' if p['pass'] else 'FAIL'}")
        if args.check_only:
            ok = all(c["pass"] for c in result["check"].values())
            print(json.dumps(result["check"], indent=1))
            return 0 if ok else 1

    probe = common.BandwidthProbe()
    result["machine"] = machine_info(spec["threads"], probe, log)
    configs = [(m, d, t) for m in spec["models"] for d in spec["dtypes"] for t in spec["threads"]]
    for rep in range(spec["reps"]):
        for ci, (model, dtype, thr) in enumerate(configs):
            k = (rep + ci) % len(spec["engines"])
            order = spec["engines"][k:] + spec["engines"][:k]
            for eng in order:
                cell = {"engine": eng, "model": model, "dtype": dtype, "threads": thr, "rep": rep,
                        "pp": spec["pp"], "tg": spec["tg"], "ttft_ctx": spec["ttft_ctx"], "n_ctx": spec["n_ctx"],
                        "profile": rep == spec["reps"] - 1}
                bw = probe.sample(thr)
                r = spawn("--worker", cell, args.cell_timeout)
                r["bw_gbps_before"] = bw
                result["cells"].append(r)
                if r.get("ok"):
                    summary = ", ".join([f"pp{k} {v:.1f}" for k, v in r["pp_tps"].items()] +
                                        [f"tg@{k} {v:.2f}" for k, v in r["tg_tps"].items()] +
                                        [f"ttft {r['ttft_ms']:.0f} ms", f"rss {r['rss_peak_mib']:.0f} MiB"])
                    if eng == "rlx" and isinstance(r.get("decode_profile_s"), dict):
                        result["profiles"][f"{model}|{dtype}|{thr}"] = r["decode_profile_s"]
                else:
                    summary = "FAILED: " + str(r.get("error"))[:300]
                log(f"rep {rep + 1}/{spec['reps']} {model} {dtype} t{thr} {eng:12s} {summary}")

    result["machine"]["loadavg_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    for t in spec["threads"]:  # once more after the cells; the best pass of all samples is kept
        probe.sample(t, reps=20)
        result["machine"]["bandwidth"][str(t)] = probe.result(t)
        log(f"== read bandwidth, {t} thread(s): best {probe.result(t)['gbps']:.1f} GB/s, "
            f"median of {probe.result(t)['samples']} samples {probe.result(t)['gbps_median']:.1f}")
    probe.close()
    result["duration_s"] = time.perf_counter() - t_start
    for c in result["cells"]:
        info = c.get("info") or {}
        if c.get("engine") == "transformers" and info.get("torch"):
            result["versions"].setdefault("torch_runtime", info["torch"])
    result["summary"] = summarize(result["cells"], spec, result["machine"])
    md = markdown(result)
    result["markdown"] = md

    os.makedirs(common.RESULTS, exist_ok=True)
    out = args.out or os.path.join(common.RESULTS, f"generate-{datetime.date.today().isoformat()}"
                                   f"{'-quick' if quick else ''}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print()
    print(md)
    log(f"== results: {os.path.relpath(out, common.ROOT)}")
    write_readme = args.readme if args.readme is not None else not quick
    if write_readme:
        common.replace_readme_section(os.path.join(HERE, "README.md"), "Generation", readme_body(md))
        log("== benchmarks/README.md: Generation section updated")
    return 0


README_INTRO = """\
`bench_generate.py` runs rlx, llama.cpp (llama-cpp-python) and transformers (PyTorch CPU) one
after another in one invocation on the real Qwen3-0.6B and Llama-3.2-1B shapes with random
weights, f32 and bf16, 1 and 2 threads. `make bench` sets up its extras (`pip install -e
.[bench]`: llama-cpp-python, compiled from source with `CMAKE_ARGS=-DGGML_NATIVE=ON`, which
takes several minutes on 2 cores; transformers; torch==2.13.0 CPU; gguf) and runs the full set
(3 repetitions, about an hour on 2 cores); `make bench-quick` runs `--quick --check`
(Qwen3-0.6B, f32 and bf16, 2 threads, pp128 and tg32, 1 repetition: a few minutes).

- Model files: written once to `benchmarks/.cache/models/` (git-ignored; about 22 GB for both
  models in both dtypes) as a Hugging Face directory (rlx, transformers) and a GGUF file
  (llama.cpp, written with the `gguf` package from the same arrays; Llama's q/k rows permuted
  as llama.cpp's converter does; llama3 RoPE scaling as `rope_freqs.weight`; a dummy vocabulary,
  since token ids are fed directly). `--check` compares the three engines' logits on the f32
  models, which proves they compute the same function on the same numbers.
- Cells: every (engine, model, dtype, threads) runs in a fresh process (peak RSS per engine),
  loads, warms up, then measures prefill (pp128, pp512: one forward, last-position logits),
  decode (tg64 after a 128- and a 1024-token context, greedy, one forward per token), and time
  to first token (128-token prompt). Engine order rotates across repetitions; medians are
  reported. Thread counts: rlx.set_num_threads, llama.cpp n_threads = n_threads_batch,
  torch.set_num_threads, and OMP/OPENBLAS/MKL/RLX_NUM_THREADS.
- Bandwidth: a C kernel (compiled at first use with `cc -O2 -march=native`) sums a 1 GiB
  float32 array, split among t pthreads, with four independent AVX-512 (or AVX) accumulators.
  It is sampled before the run (20 passes), before every cell (5) and after the run (20); the
  best pass is the machine's read bandwidth (other load only lowers a pass), the median of
  the samples is kept beside it. Decode ceiling = that bandwidth / bytes of weights one token
  reads (every 2-D projection and the LM head once, at the stored width). The machine's bandwidth
  drifts between phases (the same pass measured 34 and 56 GB/s minutes apart on this VM), so the
  fraction is also given per cell against the sample taken just before it (median over the
  repetitions). The probe reads anonymous memory; the engines read memory-mapped files.
  Engines in separate processes can draw different phases minutes apart: `bench_fair.py` (section
  "Fair harness") alternates long-lived engine processes round by round, for ratios that both
  engines measured in the same phase.
- The environment is passed through unchanged and recorded in the JSON. Where
  OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set (some machines set them for old OpenBLAS
  builds), they slow a current OpenBLAS: benchmark with both unset in that command alone,
  `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE make bench`.
- Results: `benchmarks/results/generate-<date>.json` (every cell, medians, ratios, machine,
  profiles); the table below is rewritten by every full run (`--readme` forces it for
  other runs; the first line says which run it is).
"""


def readme_body(md: str) -> str:
    return README_INTRO + "\n### Latest results\n\n" + md


if __name__ == "__main__":
    sys.exit(main())
