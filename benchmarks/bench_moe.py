#!/usr/bin/env python3
"""bench_moe: Qwen3-MoE decode, rlx beside llama.cpp, on one Qwen3-30B-A3B-shaped GGUF file.

    python benchmarks/bench_moe.py --kv f16 --threads 2 --wait-quiet 0.5   # the graded run (builds the file once)
    python benchmarks/bench_moe.py --smoke --allow-dirty                    # a tiny model end to end: no figures
    python benchmarks/bench_moe.py --build-only                             # the file and its bytes-per-token table

The model: Qwen3-30B-A3B's shape per layer, unchanged (hidden 2048; 32 query and 4 KV heads of
128; 128 experts of 768, 8 a token; every layer sparse, renormalised; vocabulary 151936; untied
LM head; RoPE theta 1e6), and ONLY the layer count scaled: 48 -> 8 (--layers), so the Q4_K_M file
is 3.45 GB instead of 18.55 GB (rlx's tensor types, the same as llama-quantize's). The 48-layer
file would take a 61 GB bf16 source to build, and its 18.55 GB would have to sit in the page
cache beside three engine processes on a 24 GiB machine shared with others. 8 layers keep the
work of a layer exactly the real model's; a decode step must read 0.53 GB of weights (1.92 GB
for 48 layers), the LM head's share larger than in the real model. Building the 8-layer file
(an 11.2 GB bf16 source, written then deleted, and the quantisation) takes ~10 minutes on 2
cores, once.

The file is made as llama.cpp's own flow makes one: a bf16 GGUF as convert_hf_to_gguf.py writes it
(arch "qwen3moe", experts stacked per projection and layer, the router f32) with a dummy
vocabulary (bench_fair feeds ids, never text), then `rlx.quantize(bf16 -> q4_k_m)` (the bytes
llama-quantize writes, tested in tests/unit/test_quantize_moe.py); the bf16 file is deleted
afterwards. Weights are N(0, 0.02), norms 1 + N(0, 0.02), seeded per tensor (the same file on
every machine). Files: benchmarks/.cache/models/ (or $RLX_BENCH_CACHE/models/), git-ignored.

Random weights route uniformly-ish: the router's logits are near i.i.d. across experts, so each
token's 8 experts are close to a uniform draw of 128 and consecutive tokens share few of them
(a trained model's routing is skewed and repeats more). Each decode step therefore reads a fresh
~8/128 of every layer's experts, near the worst case for caches, for both engines alike.

Then benchmarks/bench_fair.py runs on the file (every rule of the fair harness: one process per
engine, llama.cpp with flash attention off and on, the logits gate before timing, rounds, ratios
with bootstrap intervals, the record); options this script does not know are passed to it. Its
record's "bytes per decoded token" table sets, for each decode cell, the bytes a step must read
(the active experts' share of the file's tensor table: `bench_fair.decode_bytes`) beside what
each engine's measured tok/s implies at the machine's measured read bandwidth (bandwidth / tok/s,
an upper bound on what it read). This script prints the same tensor-table breakdown first.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

FORMAT_VERSION = "1"  # of the files this script writes (the .done marker)

# Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B), the layer count aside
QWEN3_30B_A3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=768, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
                     max_position_embeddings=40960, tie_word_embeddings=False)
# the smoke model: the same kinds of tensors, tiny (K-quant rows: every width a multiple of 256)
TINY = dict(QWEN3_30B_A3B, vocab_size=2048, hidden_size=256, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
            max_position_embeddings=4096)


def model_config(shape: dict, layers: int):
    import rlx
    return rlx.config.config_from_dict(dict(shape, model_type="qwen3_moe", num_hidden_layers=layers))


def _random(seed: list[int], shape: tuple[int, ...], norm: bool) -> np.ndarray:
    rng = np.random.default_rng([common.SEED, *seed])
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(0.02)
    if norm:
        x += np.float32(1.0)
    return x


def write_bf16_source(cfg, path: str, log) -> None:
    """cfg's model as a bf16 qwen3moe GGUF file, as llama.cpp's converter lays it out: matrices and
    stacked experts (E, out, in) bf16, norms and the router f32; a dummy SentencePiece-style
    vocabulary. Written tensor by tensor (one stacked expert tensor in memory at a time)."""
    import gguf
    import ml_dtypes

    from rlx import gguf as rg
    from rlx.weights import block_params

    w = gguf.GGUFWriter(path + ".tmp", "qwen3moe")
    common.add_header(w, f"Qwen3-30B-A3B-shaped, {cfg.num_hidden_layers} layers (random weights, rlx benchmark)",
                      gguf.LlamaFileType.MOSTLY_BF16, cfg, rope_dims=False, vocab_size=False)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    common.add_dummy_vocab(w, cfg.vocab_size)

    params = [(name, shape) for name, shape, kind in block_params(cfg) if kind != "derived"]

    def f32(name: str, shape) -> bool:  # norms and the router stay f32, as the converter writes them
        return len(shape) == 1 or name.endswith(".mlp.gate.weight")

    for name, shape in params:
        bf16 = not f32(name, shape)
        w.add_tensor_info(rg.gguf_name(name, "qwen3moe"), shape, np.dtype(np.uint16 if bf16 else np.float32),
                          int(np.prod(shape)) * (2 if bf16 else 4),
                          raw_dtype=gguf.GGMLQuantizationType.BF16 if bf16 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.perf_counter()
    for index, (name, shape) in enumerate(params):
        if f32(name, shape):
            w.write_tensor_data(_random([index], shape, norm=len(shape) == 1))
            continue
        out = np.empty(shape, dtype=ml_dtypes.bfloat16)
        if len(shape) == 3:  # stacked experts: one expert at a time
            for e in range(shape[0]):
                out[e] = _random([index, e], shape[1:], norm=False)
        else:
            out[...] = _random([index], shape, norm=False)
        w.write_tensor_data(out.view(np.uint16))
        if len(shape) == 3:
            log(f"  {name} {shape}: {time.perf_counter() - t0:.0f} s")
    w.close()
    os.replace(path + ".tmp", path)


def ensure_model(shape: dict, layers: int, type: str, tag: str, threads: int, keep_source: bool, log) -> str:
    """The model's `type` GGUF file under the cache (written once); returns its path."""
    import rlx
    from rlx.weights import block_params

    cfg = model_config(shape, layers)
    os.makedirs(common.MODEL_DIR, exist_ok=True)
    base = os.path.join(common.MODEL_DIR, f"{tag}-{layers}L")
    dst = f"{base}-{type}.gguf"
    if _done(dst):
        return dst
    src = f"{base}-bf16.gguf"
    if not _done(src):
        n = sum(int(np.prod(s)) for _, s, kind in block_params(cfg) if kind != "derived")
        log(f"== writing the bf16 source {os.path.relpath(src, common.ROOT)} ({n / 1e9:.2f}B parameters)")
        write_bf16_source(cfg, src, log)
        _mark_done(src)
    log(f"== rlx.quantize -> {os.path.relpath(dst, common.ROOT)} ({type}, {threads} threads)")
    t0 = time.perf_counter()
    rlx.quantize(src, dst, type=type, threads=threads)
    _mark_done(dst)
    log(f"   {os.path.getsize(dst) / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s")
    if not keep_source:
        os.remove(src)
        os.remove(src + ".done")
    return dst


def _done(path: str) -> bool:
    try:
        with open(path + ".done") as f:
            return f.read().strip() == FORMAT_VERSION and os.path.isfile(path)
    except OSError:
        return False


def _mark_done(path: str) -> None:
    with open(path + ".done", "w") as f:
        f.write(FORMAT_VERSION + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Other options go to bench_fair.py (e.g. --kv f16 --threads 1 2 --rounds 10 "
                                        "--wait-quiet 0.5 --allow-dirty --out PATH).")
    ap.add_argument("--layers", type=int, help="layers of the model (default 8; the smoke model: 2)")
    ap.add_argument("--type", default="q4_k_m", help="rlx.quantize recipe of the file (default q4_k_m)")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny model (hidden 256, 16 experts, 4 a token) and bench_fair --smoke: the code path only")
    ap.add_argument("--build-only", action="store_true", help="write the file, print its bytes table, stop")
    ap.add_argument("--keep-source", action="store_true", help="keep the bf16 source file")
    ap.add_argument("--build-threads", type=int, default=2, help="rlx.quantize threads (default 2)")
    args, fair_args = ap.parse_known_args()
    shape, tag = (TINY, "Qwen3-MoE-tiny") if args.smoke else (QWEN3_30B_A3B, "Qwen3-30B-A3B")
    layers = args.layers or (2 if args.smoke else 8)
    if layers < 1:
        ap.error("--layers must be positive")

    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    path = ensure_model(shape, layers, args.type, tag, args.build_threads, args.keep_source, log)
    import bench_fair
    print(bench_fair.decode_bytes_table(path), flush=True)
    if args.build_only:
        return 0
    cmd = [sys.executable, os.path.join(HERE, "bench_fair.py"), "--gguf", path] + (["--smoke"] if args.smoke else [])
    if "--out" not in fair_args:  # a record of its own, never bench_fair's dense record of the day
        smoke = "-smoke" if args.smoke else ""
        cmd += ["--out", os.path.join(HERE, "results", f"moe-{datetime.date.today().isoformat()}{smoke}.json")]
    log("== " + " ".join(cmd[1:] + fair_args))
    return subprocess.call(cmd + fair_args)


if __name__ == "__main__":
    sys.exit(main())
