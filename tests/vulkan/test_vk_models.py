"""Whole models on Vulkan against the CPU backend (the ref backend for block-type weights): decode
at past 0 == prefill of one token under every plan kind, a one-layer model's decode logits, the
bucketed decode policy's tokens, the KV rows a prefill writes, a head-dim bisect, random Qwen3 /
Llama models in f32, f16, bf16 and GGUF block-type weights, random Qwen3-MoE models (experts as parts
in f32, f16, bf16; stacked in GGUF block types), the pipeline stages, and stories260K's
64 expected greedy ids through the staging path. Also what crosses per token with staged memory
(the device counters). Logits agree within 1e-4 (f32 accumulation in another order; with bf16 weights,
within what rounding the activations to bf16 moves them: lowp_tol); tokens exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from vkutil import block_weight, record

import rlx
from rlx.config import config_from_dict
from rlx.weights import expected_weights, expert_parts

VK = "vulkan"
TOL = 1e-4
STORIES = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "stories260K"


def config(family="qwen3", layers=2, head_dim=16, heads=4, kv_heads=2, **kw):
    common = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e4)
    if family == "qwen3":
        return rlx.Qwen3Config(**{**common, "tie_word_embeddings": True, **kw})
    return rlx.LlamaConfig(**{**common, "tie_word_embeddings": False, **kw})


def weights(cfg, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_weights(cfg).items():
        a = 1.0 + 0.2 * rng.standard_normal(shape) if name.endswith("norm.weight") else \
            rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = a.astype(np.float32)
    return out


PROMPT = [3, 17, 5, 42, 8, 33, 1, 60, 2]


def decode_logits(gen, prompt, steps):
    """Prefill logits, then `steps` greedy decode steps' logits, (steps + 1, V)."""
    out = [gen.prefill_get_last_logits(prompt)]
    gen.prefill(prompt)
    for _ in range(steps):
        out.append(gen.decode_get_logits(int(np.argmax(out[-1]))))
    return np.stack(out)


def lowp_tol(cfg, w, dtype, want) -> float:
    """The bound for a model in `dtype` weights: TOL, or for bf16, where both backends round every
    matmul's activations to bf16, at most what that rounding moves the logits. Accumulated in
    another order, an activation a few f32 ulps from a bf16 midpoint rounds to the neighbouring
    value on one backend (the CPU's AVX2 path does this on random Qwen3-MoE): one step of 2^-8 in one
    element, where rounding every activation moves each by up to half a step. Measured: the CPU
    with the bf16-rounded matrices held in f32 (norms stay f32 in both; no activation rounding)
    against `want`."""
    if dtype != "bf16":
        return TOL
    rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) if v.ndim >= 2 else v for k, v in w.items()}
    exact = decode_logits(rlx.Generator(cfg, rounded, device="cpu", dtype="f32"), PROMPT, len(want) - 1)
    return max(TOL, float(np.abs(exact - want).max()))


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_decode_at_past_0_equals_prefill_of_one_token(family):
    cfg = config(family)
    w = weights(cfg)
    want = rlx.Generator(cfg, w, device="cpu", kv_dtype="f32").prefill_get_last_logits([7])
    gen = rlx.Generator(cfg, w, device=VK, kv_dtype="f32")
    got = {"prefill": gen.prefill_get_last_logits([7])}
    gen.prefill([7])
    got["naive"] = gen._c.logits(cached=False)
    gen.with_dynamic_prefill_cache().with_dynamic_decode_cache()   # symbolic PAST bound to 0
    got["dynamic"] = gen.prefill_get_last_logits([7])
    gen.with_decode_cache(32)                                       # a bucket of masked rows
    got["bucketed"] = gen.prefill_get_last_logits([7])
    for kind, g in got.items():
        assert record("one token at past 0 (every plan kind) vs cpu", g, want) <= TOL, kind
        assert np.abs(g - got["prefill"]).max() <= 1e-5, kind


def test_one_layer_decode_logits():
    cfg = config("llama", layers=1)
    w = weights(cfg, 1)
    want = decode_logits(rlx.Generator(cfg, w, device="cpu", kv_dtype="f32"), PROMPT, 8)
    got = decode_logits(rlx.Generator(cfg, w, device=VK, kv_dtype="f32"), PROMPT, 8)
    assert record("one-layer decode logits", got, want) <= TOL


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_bucketed_decode_tokens_equal_cpu(family):
    cfg = config(family, use_sliding_window=True, sliding_window=5, max_window_layers=1) if family == "qwen3" \
        else config(family)
    w = weights(cfg, 2)
    tokens, logits = {}, {}
    for dev in ("cpu", VK):
        gen = rlx.Generator(cfg, w, device=dev).with_decode_cache(64)
        gen.prefill(PROMPT)
        tokens[dev] = gen.generate_cached(16, rlx.SampleOpts.greedy())
        logits[dev] = gen.decode_get_logits(tokens[dev][-1])
    assert tokens[VK] == tokens["cpu"]
    assert record("bucketed decode logits (f16 KV)", logits[VK], logits["cpu"]) <= TOL


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16"])
def test_prefill_kv_rows_equal_cpu(kv):
    cfg = config("qwen3")
    w = weights(cfg, 3)
    rows = {}
    for dev in ("cpu", VK):
        gen = rlx.Generator(cfg, w, device=dev, kv_dtype=kv)
        gen.prefill(PROMPT)
        gen.step_cached()                       # runs the prefill: its K/V rows land in the cache
        rows[dev] = [np.concatenate([a.astype(np.float32).ravel() for a in gen.kv_cache(l)])
                     for l in range(cfg.num_hidden_layers)]
    for l, (a, b) in enumerate(zip(rows[VK], rows["cpu"])):
        ulp = {"f32": 1e-6, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}[kv]   # one rounding step of the cache dtype
        assert record(f"prefill KV rows ({kv} cache)", a, b) <= ulp * np.abs(b).max(), l


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_head_dim_bisect(head_dim):
    cfg = config("qwen3", head_dim=head_dim, heads=2, kv_heads=1)
    w = weights(cfg, head_dim)
    want = decode_logits(rlx.Generator(cfg, w, device="cpu", kv_dtype="f32"), PROMPT, 3)
    got = decode_logits(rlx.Generator(cfg, w, device=VK, kv_dtype="f32"), PROMPT, 3)
    assert record(f"model logits, head_dim {head_dim}", got, want) <= TOL


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_random_models_match_cpu(family, dtype):
    cfg = config(family, layers=3, attention_bias=family == "llama")
    w = weights(cfg, 4)
    want = decode_logits(rlx.Generator(cfg, w, device="cpu", dtype=dtype), PROMPT, 5)
    got = decode_logits(rlx.Generator(cfg, w, device=VK, dtype=dtype), PROMPT, 5)
    assert record(f"random {family} logits, {dtype} weights, f16 KV", got, want) <= lowp_tol(cfg, w, dtype, want)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q5_1", "q4_k", "q6_k"])
def test_block_type_models_match_ref(qtype):
    """Every matrix packed in a GGUF block type (K types need rows of 256: a wider model)."""
    wide = qtype.endswith("_k")
    cfg = config("llama", hidden_size=256 if wide else 64, intermediate_size=256 if wide else 96,
                 head_dim=64 if wide else 16)
    rng = np.random.default_rng(5)
    w = weights(cfg, 5)
    for name, arr in list(w.items()):
        if arr.ndim == 2:
            w[name] = rlx.Packed(*block_weight(qtype, arr.shape[0], arr.shape[1], rng)[0])
    want = decode_logits(rlx.Generator(cfg, w, device="ref", kv_dtype="f32"), PROMPT, 4)
    got = decode_logits(rlx.Generator(cfg, w, device=VK, kv_dtype="f32"), PROMPT, 4)
    assert record(f"llama logits, {qtype} weights, vs ref, relative", got, want, relative=True) <= TOL


def moe_config(hidden=48, ffn=80, experts_ffn=40, head_dim=16):
    """Qwen3-MoE: 3 layers, the middle one dense; 8 experts, 2 a token, renormalised."""
    return config_from_dict(dict(model_type="qwen3_moe", vocab_size=97, hidden_size=hidden, intermediate_size=ffn,
                                 moe_intermediate_size=experts_ffn, num_hidden_layers=3, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=head_dim, num_experts=8, num_experts_per_tok=2,
                                 norm_topk_prob=True, mlp_only_layers=[1], max_position_embeddings=256,
                                 rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=True))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_random_moe_models_match_cpu(dtype):
    cfg = moe_config()
    w = weights(cfg, 6)
    want = decode_logits(rlx.Generator(cfg, w, device="cpu", dtype=dtype), PROMPT, 5)
    got = decode_logits(rlx.Generator(cfg, w, device=VK, dtype=dtype), PROMPT, 5)
    assert record(f"random qwen3_moe logits, {dtype} weights, f16 KV", got, want) <= lowp_tol(cfg, w, dtype, want)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k"])
def test_block_type_moe_models_match_ref(qtype):
    """Every matrix packed in a GGUF block type, the experts stacked (E, N, K) as a GGUF file holds them."""
    wide = qtype.endswith("_k")
    cfg = moe_config(hidden=256 if wide else 64, experts_ffn=256 if wide else 32, ffn=256 if wide else 96,
                     head_dim=64 if wide else 16)
    rng = np.random.default_rng(7)
    w = weights(cfg, 7)
    for name, parts in expert_parts(cfg).items():
        w[name] = np.stack([w.pop(p) for p in parts])
    for name, arr in list(w.items()):
        if arr.ndim >= 2 and not name.endswith("mlp.gate.weight"):
            rows = int(np.prod(arr.shape[:-1]))
            raw = block_weight(qtype, rows, arr.shape[-1], rng)[0][0]
            w[name] = rlx.Packed(raw.reshape(*arr.shape[:-1], -1), qtype, arr.shape)
    want = decode_logits(rlx.Generator(cfg, w, device="ref", kv_dtype="f32"), PROMPT, 4)
    got = decode_logits(rlx.Generator(cfg, w, device=VK, kv_dtype="f32"), PROMPT, 4)
    assert record(f"qwen3_moe logits, {qtype} weights, vs ref, relative", got, want, relative=True) <= TOL


def test_pipeline_stages_on_vulkan_equal_the_cpu_generator():
    cfg = config("qwen3", layers=3)
    w = weights(cfg, 6)
    gen = rlx.Generator(cfg, w, device="cpu")
    stages = [rlx.PipelineDecodeStage(cfg, VK, r, 2, w) for r in range(2)]

    def run_split(tokens):
        return stages[0].forward(hidden=stages[1].forward(tokens=tokens))

    want, got = gen.prefill_get_last_logits(PROMPT), run_split(PROMPT)
    assert record("pipeline stages (2 blocks) logits", got, want) <= TOL
    for _ in range(4):
        tok = int(np.argmax(want))
        want, got = gen.decode_get_logits(tok), run_split([tok])
        assert record("pipeline stages (2 blocks) logits", got, want) <= TOL


def test_staged_memory_moves_weights_once_and_constant_bytes_per_token():
    cfg = config("qwen3")
    w = weights(cfg, 7)
    dev = rlx.Device("vulkan:staging")
    assert dev.describe()["transfers"] == "staged" and not dev.zero_copy
    gen = rlx.Generator(cfg, w, device=dev, kv_dtype="f32")
    wbytes = sum(a.nbytes for a in w.values())
    after_load = gen.device_stats()
    assert after_load["upload_bytes"] == wbytes + cfg.head_dim // 2 * 4   # + rope.inv_freq
    gen.prefill(PROMPT)
    gen.generate_cached(3, rlx.SampleOpts.greedy())
    gen.decode_get_logits(5)   # the cache catches up with the last generated token (two positions)
    steps = []
    for _ in range(6):
        before = gen.device_stats()
        gen.decode_get_logits(5)
        now = gen.device_stats()
        steps.append((now["upload_bytes"] - before["upload_bytes"], now["download_bytes"] - before["download_bytes"]))
    assert set(steps) == {(8, cfg.vocab_size * 4)}   # the token and its position in, the logits out


@pytest.mark.skipif(not (STORIES / "hf" / "model.safetensors").is_file(), reason=f"no stories260K under {STORIES}")
@pytest.mark.parametrize("device,policy", [("vulkan:staging", "bucketed"), ("vulkan", "lru")])
def test_stories260k_gives_its_64_expected_ids(device, policy):
    expected = json.loads((STORIES / "expected" / "greedy_once_upon_a_time.json").read_text())
    gen = rlx.Generator.from_pretrained(STORIES / "hf", device=device)
    gen = gen.with_decode_cache(128) if policy == "bucketed" else gen.with_prefill_cache(4)
    gen.prefill(expected["prompt_tokens"])
    assert gen.generate_cached(len(expected["new_tokens"]), rlx.SampleOpts.greedy()) == expected["new_tokens"]
