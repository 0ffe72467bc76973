"""rlx.config: parsing Hugging Face config.json (both RoPE layouts, generation_config.json),
Qwen3 sliding-window layers, inverse RoPE frequencies, and every ConfigError."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlx.config import LlamaConfig, Qwen3Config, config_from_dict, load_config
from rlx.errors import ConfigError

LLAMA = {"model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
QWEN3 = {"model_type": "qwen3", "vocab_size": 131, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
         "tie_word_embeddings": True, "attention_bias": True}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def write(tmp_path, config, generation=None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_llama_from_dir_and_from_file(tmp_path):
    write(tmp_path, LLAMA)
    for path in (tmp_path, tmp_path / "config.json", str(tmp_path)):
        cfg = load_config(path)
        assert isinstance(cfg, LlamaConfig)
        assert cfg.head_dim == 16 and cfg.num_key_value_heads == 2 and not cfg.qk_norm
        assert cfg.rope_scaling is None and cfg.rope_theta == 10000.0
        assert cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
        assert [cfg.layer_window(i) for i in range(2)] == [0, 0]


def test_defaults_follow_transformers():
    cfg = config_from_dict({k: v for k, v in LLAMA.items() if k not in ("num_key_value_heads", "rope_theta")})
    assert cfg.num_key_value_heads == 4 and cfg.rope_theta == 10000.0 and cfg.max_position_embeddings == 2048
    q = config_from_dict({k: v for k, v in QWEN3.items() if k != "head_dim"})
    assert isinstance(q, Qwen3Config) and q.head_dim == 128 and q.qk_norm  # Qwen3Config's default
    assert q.max_position_embeddings == 32768


def test_qwen3_fields(tmp_path):
    cfg = load_config(write(tmp_path, QWEN3))
    assert cfg.rope_theta == 1e6 and cfg.tie_word_embeddings and cfg.attention_bias and not cfg.mlp_bias
    assert cfg.layer_types == ("full_attention",) * 3
    assert cfg.eos_token_ids == () and cfg.bos_token_id is None


def test_rope_layouts_agree():
    legacy = dict(LLAMA, rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING, type="llama3"))
    legacy["rope_scaling"].pop("rope_type")
    v5 = {k: v for k, v in LLAMA.items() if k != "rope_theta"}
    v5["rope_parameters"] = dict(LLAMA3_SCALING, rope_theta=500000.0)
    a, b = config_from_dict(legacy), config_from_dict(v5)
    assert a == b and a.rope_theta == 500000.0 and a.rope_scaling == LLAMA3_SCALING
    np.testing.assert_array_equal(a.rope_inv_freq(), b.rope_inv_freq())
    # "default" means no scaling; the theta inside rope_parameters wins over a top-level one
    c = config_from_dict(dict(LLAMA, rope_theta=1.0, rope_parameters={"rope_type": "default", "rope_theta": 7.0}))
    assert c.rope_scaling is None and c.rope_theta == 7.0
    # original_max_position_embeddings defaults to max_position_embeddings, as in transformers
    s = {k: v for k, v in LLAMA3_SCALING.items() if k != "original_max_position_embeddings"}
    d = config_from_dict(dict(LLAMA, max_position_embeddings=4096, rope_scaling=s))
    assert d.rope_scaling["original_max_position_embeddings"] == 4096


def test_generation_config_overrides_bos_eos(tmp_path):
    write(tmp_path, dict(LLAMA, vocab_size=128256), {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})
    cfg = load_config(tmp_path)
    assert cfg.bos_token_id == 128000 and cfg.eos_token_ids == (128001, 128008, 128009)
    write(tmp_path, dict(LLAMA, eos_token_id=[7, 8]), {"eos_token_id": None})
    assert load_config(tmp_path).eos_token_ids == (7, 8)


def test_eos_forms():
    assert LlamaConfig(97, 64, 96, 2, 4, eos_token_ids=5).eos_token_ids == (5,)
    assert LlamaConfig(97, 64, 96, 2, 4, eos_token_ids=[5, 6]).eos_token_ids == (5, 6)
    assert LlamaConfig(97, 64, 96, 2, 4, eos_token_ids=None).eos_token_ids == ()


def test_to_dict_round_trip():
    for d in (dict(LLAMA, rope_scaling=LLAMA3_SCALING, mlp_bias=True),
              dict(QWEN3, use_sliding_window=True, sliding_window=8, max_window_layers=1, eos_token_id=[1, 2])):
        cfg = config_from_dict(d)
        out = cfg.to_dict()
        json.dumps(out)
        assert out["model_type"] == d["model_type"] and out["qk_norm"] == cfg.qk_norm
        assert config_from_dict(out) == cfg


@pytest.mark.parametrize("use, window, mwl, types, want", [
    (False, 4, 1, None, [0, 0, 0]),
    (True, 4, 1, None, [0, 4, 4]),
    (True, 4, 0, None, [4, 4, 4]),
    (True, 4, 3, None, [0, 0, 0]),
    (True, None, 0, None, [0, 0, 0]),
    (True, 5, 0, ["sliding_attention", "full_attention", "sliding_attention"], [5, 0, 5]),
])
def test_qwen3_layer_windows(use, window, mwl, types, want):
    d = dict(QWEN3, use_sliding_window=use, sliding_window=window, max_window_layers=mwl)
    if types is not None:
        d["layer_types"] = types
    cfg = config_from_dict(d)
    assert [cfg.layer_window(i) for i in range(3)] == want
    with pytest.raises(IndexError):
        cfg.layer_window(3)


def test_qwen3_layer_windows_match_transformers():
    transformers = pytest.importorskip("transformers")
    for use, window, mwl in [(False, 4, 1), (True, 4, 1), (True, 2, 0), (True, None, 0), (True, 4, 5)]:
        hc = transformers.Qwen3Config(**{k: v for k, v in QWEN3.items() if k != "model_type"},
                                      use_sliding_window=use, sliding_window=window, max_window_layers=mwl)
        cfg = config_from_dict(json.loads(hc.to_json_string()))
        want = [hc.sliding_window if t == "sliding_attention" else 0 for t in hc.layer_types]
        assert [cfg.layer_window(i) for i in range(3)] == want


@pytest.mark.parametrize("head_dim, theta, scaling", [
    (16, 10000.0, None), (64, 500000.0, LLAMA3_SCALING), (128, 500000.0, dict(LLAMA3_SCALING, factor=8.0)),
    (16, 10000.0, dict(LLAMA3_SCALING, factor=8.0, original_max_position_embeddings=64)), (128, 1e6, None)])
def test_rope_inv_freq_matches_transformers(head_dim, theta, scaling):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = dict(scaling or {"rope_type": "default"}, rope_theta=theta)
    hc = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                                  max_position_embeddings=131072, rope_parameters=params)
    if scaling is None:
        want, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(hc)
    else:
        want, _ = ROPE_INIT_FUNCTIONS["llama3"](hc)
    cfg = LlamaConfig(97, head_dim * 4, 96, 1, 4, head_dim=head_dim, max_position_embeddings=131072,
                      rope_theta=theta, rope_scaling=scaling)
    got = cfg.rope_inv_freq()
    assert got.dtype == np.float32 and got.shape == (head_dim // 2,)
    np.testing.assert_allclose(got, want.numpy(), rtol=2.5e-7, atol=0)  # <= 1 ulp


@pytest.mark.parametrize("change, words", [
    ({"hidden_size": "64"}, ["hidden_size", "str"]),
    ({"num_hidden_layers": 2.0}, ["num_hidden_layers", "float"]),
    ({"num_attention_heads": True}, ["num_attention_heads", "bool"]),
    ({"rms_norm_eps": "1e-5"}, ["rms_norm_eps", "str"]),
    ({"tie_word_embeddings": "yes"}, ["tie_word_embeddings", "str"]),
    ({"eos_token_id": "2"}, ["eos_token_id"]),
    ({"eos_token_id": [2, "x"]}, ["eos_token_id"]),
    ({"hidden_act": "gelu"}, ["hidden_act", "gelu"]),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ["rope_type", "yarn"]),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, ["rope_type", "linear"]),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, ["rope_type", "dynamic"]),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ["low_freq_factor"]),
    ({"rope_scaling": "llama3"}, ["rope_scaling", "str"]),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, ["rope_parameters", "nested"]),
    ({"partial_rotary_factor": 0.5}, ["partial_rotary_factor"]),
    ({"num_experts": 8}, ["num_experts", "mixture-of-experts", "qwen3_moe"]),
    ({"num_local_experts": 8}, ["num_local_experts"]),
    ({"model_type": "qwen2_moe"}, ["model_type", "qwen2_moe", "only qwen3_moe"]),
    ({"model_type": "mistral"}, ["model_type", "mistral"]),
    ({"model_type": None}, ["model_type"]),
    ({"hidden_size": 0}, ["hidden_size"]),
    ({"vocab_size": -3}, ["vocab_size"]),
    ({"intermediate_size": 0}, ["intermediate_size"]),
    ({"rms_norm_eps": 0}, ["rms_norm_eps"]),
    ({"rope_theta": -1.0}, ["rope_theta"]),
    ({"num_key_value_heads": 3}, ["num_key_value_heads", "3"]),
    ({"num_attention_heads": 6, "num_key_value_heads": 6}, ["num_attention_heads", "hidden_size"]),
    ({"head_dim": 15}, ["head_dim", "15"]),
    ({"bos_token_id": -1}, ["bos_token_id"]),
])
def test_errors_name_the_field(tmp_path, change, words):
    write(tmp_path, dict(LLAMA, **change))
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads"])
def test_missing_required_field(field):
    with pytest.raises(ConfigError, match=field):
        config_from_dict({k: v for k, v in LLAMA.items() if k != field})


@pytest.mark.parametrize("change, words", [
    ({"use_sliding_window": "true"}, ["use_sliding_window"]),
    ({"use_sliding_window": True, "sliding_window": "4"}, ["sliding_window", "str"]),
    ({"use_sliding_window": True, "sliding_window": 0}, ["sliding_window"]),
    ({"layer_types": ["full_attention"]}, ["layer_types"]),
    ({"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, ["layer_types", "chunked"]),
    ({"layer_types": ["sliding_attention"] * 3}, ["layer_types", "sliding_window"]),
    ({"max_window_layers": -1}, ["max_window_layers"]),
])
def test_qwen3_errors(change, words):
    with pytest.raises(ConfigError) as e:
        config_from_dict(dict(QWEN3, **change))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_bad_files(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError):
        load_config(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "nowhere")


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match="hidden_act"):
        Qwen3Config(97, 64, 96, 2, 4, hidden_act="relu")
    with pytest.raises(ConfigError, match="mlp_bias"):
        Qwen3Config(97, 64, 96, 2, 4, mlp_bias=True)
    cfg = LlamaConfig(97, 64, 96, 2, 4, rope_scaling={"rope_type": "default"})
    assert cfg.rope_scaling is None and cfg.head_dim == 16
