"""The real trained model: stories260K (Llama architecture, TinyStories) from ../shared/models.

expected/greedy_once_upon_a_time.json holds what llama2.c's own run.c produces for the prompt
"Once upon a time": the prompt ids, the 64 greedy ids, the text, and the first step's top-5
logits. rlx must reproduce the ids exactly with `generate` and `generate_cached` on every
device, plan policy and KV cache dtype (f16 by default; f32 and bf16), the top-5 within 1e-4
(with an f32 cache, as llama2.c keeps one), and the decoded text exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import rlx

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
MODEL_DIR = SHARED / "models" / "stories260K"
HF_DIR = MODEL_DIR / "hf"
EXPECTED = MODEL_DIR / "expected" / "greedy_once_upon_a_time.json"

pytestmark = pytest.mark.skipif(
    not (HF_DIR / "model.safetensors").is_file() or not EXPECTED.is_file(),
    reason=f"stories260K not found under {MODEL_DIR} (the shared models directory beside the repo)")

TOL = 1e-4
POLICIES = ["oneshot", "dynamic_prefill", "dynamic_decode", "dynamic_both"]
# the default f16 KV cache on every device and policy; f32 and bf16 on one of them
GREEDY_CASES = [(d, p, "f16") for d in rlx.backends() for p in POLICIES] + [("cpu", "dynamic_both", kv)
                                                                      for kv in ("f32", "bf16")]


@pytest.fixture(scope="module")
def expected():
    with open(EXPECTED, encoding="utf-8") as f:
        exp = json.load(f)
    assert exp["prompt_tokens"] == [1, 403, 407, 261, 378]
    assert len(exp["new_tokens"]) == exp["n_new"] == 64
    return exp


def _generator(device: str, policy: str = "oneshot", kv_dtype: str | None = None) -> rlx.Generator:
    gen = rlx.Generator.from_pretrained(HF_DIR, device=device, kv_dtype=kv_dtype)
    if policy in ("dynamic_prefill", "dynamic_both"):
        gen = gen.with_dynamic_prefill_cache()
    if policy in ("dynamic_decode", "dynamic_both"):
        gen = gen.with_dynamic_decode_cache()
    return gen


def test_config_is_the_expected_model():
    cfg = rlx.load_config(HF_DIR)
    assert isinstance(cfg, rlx.LlamaConfig)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim) == (512, 64, 5, 8, 4, 8)
    assert cfg.tie_word_embeddings


def test_first_step_top5(expected, device):
    gen = _generator(device, kv_dtype="f32")
    logits = gen.prefill_get_last_logits(expected["prompt_tokens"])
    assert logits.shape == (512,)
    want_ids = [i for i, _ in expected["first_step_logits_top5"]]
    want_vals = np.array([v for _, v in expected["first_step_logits_top5"]], dtype=np.float64)
    top5 = np.argsort(-logits, kind="stable")[:5].tolist()
    assert top5 == want_ids
    diff = float(np.abs(logits[want_ids].astype(np.float64) - want_vals).max())
    print(f"stories260K {device}: first-step top-5 max |rlx - llama2.c| = {diff:.3g}")
    assert diff <= TOL
    # the naive path computes the same row
    gen.prefill(expected["prompt_tokens"])
    naive = gen._c.logits(cached=False)
    assert np.abs(naive - logits).max() <= TOL


@pytest.mark.parametrize("device,policy,kv_dtype", GREEDY_CASES)
def test_greedy_64(expected, device, policy, kv_dtype):
    prompt, want = expected["prompt_tokens"], expected["new_tokens"]
    gen = _generator(device, policy, kv_dtype)
    gen.prefill(prompt)
    cached = gen.generate_cached(64, rlx.SampleOpts.greedy())
    assert cached == want
    assert gen.tokens == prompt + want
    assert gen.kv_len == len(prompt) + 63
    if policy in ("dynamic_decode", "dynamic_both"):
        # one symbolic decode plan serves all 63 cached steps
        assert gen.compile_stats()["decode_compiles"] == 1

    gen.prefill(prompt)
    naive = gen.generate(64, rlx.SampleOpts.greedy())
    assert naive == want
    assert gen.tokens == prompt + want
    if policy in ("dynamic_prefill", "dynamic_both"):
        # 64 naive recomputes of 64 different lengths, plus the cached prefill: at most one plan
        # per graph kind, not one per length
        assert gen.compile_stats()["prefill_compiles"] <= 2


def test_decoded_text(expected):
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(HF_DIR / "tok512.model"))
    gen = _generator("cpu")
    gen.prefill(expected["prompt_tokens"])
    new = gen.generate_cached(64, rlx.SampleOpts.greedy())
    text = sp.decode(expected["prompt_tokens"] + new)
    assert text == expected["text"]
    assert text.startswith(expected["prompt"])
