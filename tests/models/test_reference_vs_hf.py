"""The NumPy reference decoder (rlx.reference.model) against transformers on every HF_CASES
model. Agreement within 1e-4 proves rlx.config, rlx.weights and the reference together."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hf_cases import HF_CASES, case_ids, hf_logits

from rlx.config import load_config
from rlx.reference import forward
from rlx.weights import check_weights, expected_weights, load_weights

CASES = list(HF_CASES)


@pytest.mark.parametrize("hf_model", CASES, indirect=True)
def test_reference_logits_match_transformers(hf_model):
    path, model = hf_model
    cfg = load_config(path)
    ids = case_ids(model, 13)
    ref = forward(cfg, load_weights(path), ids)
    hf = hf_logits(model, ids)
    assert ref.shape == hf.shape == (13, cfg.vocab_size)
    diff = float(np.abs(ref - hf).max())
    print(f"max |ref - hf| = {diff:.3g}")
    assert diff < 1e-4


@pytest.mark.parametrize("hf_model", CASES, indirect=True)
def test_config_matches_transformers(hf_model):
    path, model = hf_model
    cfg, hc = load_config(path), model.config
    assert cfg.model_type == hc.model_type
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias"):
        assert getattr(cfg, name) == getattr(hc, name), name
    assert cfg.rms_norm_eps == pytest.approx(hc.rms_norm_eps)
    assert cfg.rope_theta == hc.rope_parameters["rope_theta"]
    # inverse frequencies within 1 ulp of the ones the model uses
    np.testing.assert_allclose(cfg.rope_inv_freq(), model.model.rotary_emb.inv_freq.numpy(), rtol=2.5e-7, atol=0)
    # per-layer windows as the model's attention layers see them
    for i, layer in enumerate(model.model.layers):
        want = getattr(layer.self_attn, "sliding_window", None) or 0
        assert cfg.layer_window(i) == want, i
    eos = hc.eos_token_id
    assert cfg.eos_token_ids == (tuple(eos) if isinstance(eos, list) else (eos,))
    # sparse layers (Qwen3-MoE) where transformers built a sparse block
    for i, layer in enumerate(model.model.layers):
        assert cfg.layer_sparse(i) == hasattr(layer.mlp, "experts"), i


@pytest.mark.parametrize("hf_model", CASES, indirect=True)
def test_expected_weights_match_the_saved_model(hf_model):
    path, model = hf_model
    cfg = load_config(path)
    w = load_weights(path)
    assert {k: v.shape for k, v in w.items()} == expected_weights(cfg)
    checked = check_weights(cfg, w)
    kept = {id(v) for v in checked.values()} | {id(p) for v in checked.values() if isinstance(v, list) for p in v}
    assert all(id(w[k]) in kept for k in w)  # f32 stays zero-copy, experts' parts too
    # and they are the model's own parameters (transformers 5 holds the experts fused: gate_up_proj
    # (E, 2F, H) with gate rows first, down_proj (E, H, F))
    state = model.state_dict()
    for name, arr in w.items():
        m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight\Z", name)
        if m and m.group(1) + ".gate_up_proj" in state:
            e, F = int(m.group(2)), cfg.moe_intermediate_size
            fused = state[m.group(1) + (".down_proj" if m.group(3) == "down" else ".gate_up_proj")][e].numpy()
            want = fused if m.group(3) == "down" else fused[:F] if m.group(3) == "gate" else fused[F:]
            np.testing.assert_array_equal(arr, want)
            continue
        np.testing.assert_array_equal(arr, state[name].numpy())


@pytest.mark.parametrize("hf_model", ["qwen3_sliding"], indirect=True)
def test_sliding_window_matters(hf_model):
    """Without the window the reference disagrees: the case really exercises sliding layers."""
    path, model = hf_model
    cfg = load_config(path)
    assert [cfg.layer_window(i) for i in range(3)] == [0, 4, 4]
    full = dataclasses.replace(cfg, use_sliding_window=False, layer_types=None)
    ids = case_ids(model, 13)
    assert np.abs(forward(full, load_weights(path), ids) - hf_logits(model, ids)).max() > 1e-2


@pytest.mark.parametrize("hf_model", ["llama_rope_llama3"], indirect=True)
def test_llama3_rope_scaling_matters(hf_model):
    """Without llama3 scaling the reference disagrees: the case really exercises the scaling."""
    path, model = hf_model
    cfg = load_config(path)
    assert cfg.rope_scaling["rope_type"] == "llama3"
    plain = dataclasses.replace(cfg, rope_scaling=None)
    ids = case_ids(model, 13)
    assert np.abs(forward(plain, load_weights(path), ids) - hf_logits(model, ids)).max() > 1e-3
