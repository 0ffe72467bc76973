#!/usr/bin/env python3
"""device_check: rlx's Vulkan backend timed on a real GPU beside llama.cpp's own Vulkan build, on
the same GGUF files. Called by benchmarks/device_check.sh (which builds rlx and runs the parity
suite first); see that script for the set-up.

    python benchmarks/device_check.py --out DIR [--model qwen3-0.6b|tiny] [--dtypes f16 q8_0]
                                      [--llama-bench PATH] [--device vulkan]

For each weight dtype a GGUF file of the model (real shapes, random weights N(0, 0.02), norms
around 1; f16, or Q8_0 quantised by gguf-py) is written to benchmarks/.cache/device_check/, then:
- rlx (device "vulkan": the preferred GPU): prefill of a fresh 128- and 512-token prompt (logits
  of the last position), and 64 greedy decode tokens after a 128-token context (bucketed decode
  plans: no compile inside the timed loop), each the median of --reps runs after a warm-up;
- llama.cpp: `llama-bench -m FILE -p 128,512 -n 64 -ngl 99 -o json` with every layer on the GPU,
  when a llama-bench of a Vulkan build is given or found (else the reason is recorded).
Results: OUT/device_check.json and a Markdown table on stdout. Speeds are tokens per second.
`--model tiny` makes a small model for a smoke test of this script (on lavapipe, say).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(HERE, ".cache", "device_check")

MODELS = {
    "qwen3-0.6b": dict(vocab=151936, hidden=1024, ffn=3072, layers=28, heads=16, kv_heads=8, head_dim=128),
    "tiny": dict(vocab=512, hidden=256, ffn=512, layers=2, heads=4, kv_heads=2, head_dim=64),
}


def write_gguf(model: str, dtype: str, log) -> str:
    """The GGUF file of `model` with every 2-D weight in dtype (f16 or q8_0); written once."""
    import gguf
    from gguf import quants as gq

    m = MODELS[model]
    path = os.path.join(CACHE, f"{model}-{dtype}.gguf")
    if os.path.exists(path):
        return path
    os.makedirs(CACHE, exist_ok=True)
    t0 = time.perf_counter()
    w = gguf.GGUFWriter(path + ".tmp", "qwen3")
    w.add_name(f"{model} (random weights, rlx device check)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(4096)
    w.add_embedding_length(m["hidden"])
    w.add_block_count(m["layers"])
    w.add_feed_forward_length(m["ffn"])
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(m["head_dim"])
    w.add_value_length(m["head_dim"])
    w.add_rope_dimension_count(m["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    V = m["vocab"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(len(tokens), V)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types([gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.BYTE] * 256 +
                      [gguf.TokenType.NORMAL] * (V - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(20240611)
    H, D, Hq, Hkv = m["hidden"], m["head_dim"], m["heads"], m["kv_heads"]

    def mat(name, rows, cols):
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02))
        if dtype == "f16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gq.quantize(x, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.02 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", V, H)
    norm("output_norm.weight", H)
    for layer in range(m["layers"]):
        b = f"blk.{layer}."
        norm(b + "attn_norm.weight", H)
        mat(b + "attn_q.weight", Hq * D, H)
        mat(b + "attn_k.weight", Hkv * D, H)
        mat(b + "attn_v.weight", Hkv * D, H)
        mat(b + "attn_output.weight", H, Hq * D)
        norm(b + "attn_q_norm.weight", D)
        norm(b + "attn_k_norm.weight", D)
        norm(b + "ffn_norm.weight", H)
        mat(b + "ffn_gate.weight", m["ffn"], H)
        mat(b + "ffn_up.weight", m["ffn"], H)
        mat(b + "ffn_down.weight", H, m["ffn"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)
    log(f"  wrote {os.path.relpath(path)} ({os.path.getsize(path) / 2**20:.0f} MiB, {time.perf_counter() - t0:.0f} s)")
    return path


def time_rlx(path: str, device: str, reps: int, log) -> dict:
    import rlx

    gen = rlx.Generator.from_pretrained(path, device=device).with_prefill_cache(4).with_decode_cache(1024)
    vocab = gen.config.vocab_size
    rng = np.random.default_rng(1)
    out = {"device": gen.device, "weights": gen.weight_dtypes}
    for n in (128, 512):
        prompt = [int(t) for t in rng.integers(3, vocab, n)]
        gen.prefill_get_last_logits(prompt)          # compiles the plan, warms the device
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            gen.prefill_get_last_logits(prompt)
            ts.append(time.perf_counter() - t0)
        out[f"pp{n}"] = n / statistics.median(ts)
        log(f"  rlx pp{n}: {out[f'pp{n}']:.1f} tok/s")
    prompt = [int(t) for t in rng.integers(3, vocab, 128)]
    ts = []
    for rep in range(reps + 1):
        gen.prefill(prompt)
        gen.step_cached()                            # the context, then the first token (untimed)
        t0 = time.perf_counter()
        gen.generate_cached(64, rlx.SampleOpts.greedy())
        if rep:                                      # the first pass compiles the decode buckets
            ts.append(time.perf_counter() - t0)
    out["tg64@128"] = 64 / statistics.median(ts)
    log(f"  rlx tg64 after 128: {out['tg64@128']:.1f} tok/s")
    return out


def find_llama_bench(given: str | None) -> tuple[str | None, str]:
    for cand in [given, os.environ.get("LLAMA_BENCH"), os.path.join(CACHE, "llama.cpp", "build", "bin", "llama-bench"),
                 shutil.which("llama-bench")]:
        if cand and os.access(cand, os.X_OK):
            return cand, ""
    return None, "no llama-bench of a Vulkan build of llama.cpp (device_check.sh builds one from LLAMA_CPP_SRC)"


def time_llama(bench: str, path: str, reps: int, log) -> dict:
    cmd = [bench, "-m", path, "-p", "128,512", "-n", "64", "-ngl", "99", "-r", str(reps), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    if r.returncode != 0:
        return {"error": f"llama-bench exited {r.returncode}: {r.stderr.strip()[-400:]}"}
    out = {}
    for row in json.loads(r.stdout):
        key = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
        out[key if key != "tg64" else "tg64@0"] = row["avg_ts"]
        out["backend"] = row.get("backends") or row.get("backend")
    log(f"  llama.cpp: {out}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--model", default="qwen3-0.6b", choices=sorted(MODELS))
    ap.add_argument("--dtypes", nargs="+", default=["f16", "q8_0"], choices=["f16", "q8_0"])
    ap.add_argument("--device", default="vulkan")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", default=None)
    args = ap.parse_args(argv)
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    import rlx

    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model,
              "devices": [d for d in rlx.devices() if d["backend"] == "vulkan"], "rlx": {}, "llama.cpp": {}}
    bench, why = find_llama_bench(args.llama_bench)
    if not bench:
        result["llama.cpp"]["skipped"] = why
    for dt in args.dtypes:
        log(f"== {args.model} {dt}")
        path = write_gguf(args.model, dt, log)
        result["rlx"][dt] = time_rlx(path, args.device, args.reps, log)
        if bench:
            result["llama.cpp"][dt] = time_llama(bench, path, args.reps, log)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "device_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    log("\n| weights | engine | pp128 | pp512 | tg64 |")
    log("|---|---|---:|---:|---:|")
    for dt in args.dtypes:
        r = result["rlx"][dt]
        log(f"| {dt} | rlx | {r['pp128']:.0f} | {r['pp512']:.0f} | {r['tg64@128']:.1f} (after 128) |")
        lc = result["llama.cpp"].get(dt, {})
        if "pp128" in lc:
            log(f"| {dt} | llama.cpp | {lc['pp128']:.0f} | {lc['pp512']:.0f} | {lc.get('tg64@0', 0):.1f} (after 0) |")
    if "skipped" in result["llama.cpp"]:
        log(f"llama.cpp: {result['llama.cpp']['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
