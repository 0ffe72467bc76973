"""rlx.weights: safetensors loading (single, sharded, f32 zero-copy, f16/bf16 conversion, broken
files) and checking tensors against a config (missing / extra / mis-shaped, plain dicts)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from rlx.config import LlamaConfig, Qwen3Config
from rlx.errors import WeightsError
from rlx.weights import check_weights, expected_weights, load_weights

CFG = LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1)


def random_weights(cfg, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in expected_weights(cfg).items()}


def test_expected_weights_names_and_shapes():
    e = expected_weights(CFG)
    assert e["model.embed_tokens.weight"] == (11, 8) and e["lm_head.weight"] == (11, 8)
    assert e["model.layers.1.self_attn.q_proj.weight"] == (8, 8)
    assert e["model.layers.1.self_attn.k_proj.weight"] == (4, 8)
    assert e["model.layers.0.self_attn.o_proj.weight"] == (8, 8)
    assert e["model.layers.0.mlp.down_proj.weight"] == (8, 12)
    assert not any(k.endswith(".bias") or "q_norm" in k for k in e)
    assert len(e) == 1 + 2 * 9 + 2

    b = expected_weights(LlamaConfig(11, 8, 12, 1, 2, 1, head_dim=6, attention_bias=True, mlp_bias=True,
                                     tie_word_embeddings=True))
    assert "lm_head.weight" not in b
    assert b["model.layers.0.self_attn.q_proj.weight"] == (12, 8)
    assert b["model.layers.0.self_attn.o_proj.weight"] == (8, 12)
    for name, n in {"q_proj": 12, "k_proj": 6, "v_proj": 6, "o_proj": 8}.items():
        assert b[f"model.layers.0.self_attn.{name}.bias"] == (n,)
    for name, n in {"gate_proj": 12, "up_proj": 12, "down_proj": 8}.items():
        assert b[f"model.layers.0.mlp.{name}.bias"] == (n,)

    q = expected_weights(Qwen3Config(11, 8, 12, 1, 2, 1, head_dim=4))
    assert q["model.layers.0.self_attn.q_norm.weight"] == (4,)
    assert q["model.layers.0.self_attn.k_norm.weight"] == (4,)


def test_single_file_f32_is_zero_copy_and_read_only(tmp_path):
    w = random_weights(CFG)
    save_file(w, str(tmp_path / "model.safetensors"))
    for path in (tmp_path, tmp_path / "model.safetensors"):
        got = load_weights(path)
        assert set(got) == set(w)
        for k, arr in got.items():
            np.testing.assert_array_equal(arr, w[k])
            assert arr.dtype == np.float32 and arr.flags.c_contiguous
            assert not arr.flags.owndata and not arr.flags.writeable
            base = arr
            while base.base is not None and not isinstance(base, np.memmap):
                base = base.base
            assert isinstance(base, np.memmap), k  # a view of the file's memory map
            with pytest.raises(ValueError):
                arr[...] = 0
        checked = check_weights(CFG, got)
        assert all(checked[k] is got[k] for k in got)  # no copy on check either
    # two tensors of one file share one mapping
    a, b = got["model.norm.weight"], got["lm_head.weight"]
    assert a.base is not None and b.base is not None


def test_sharded(tmp_path):
    w = random_weights(CFG, seed=1)
    names = sorted(w)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: w[k] for k in keys}, str(tmp_path / fname))
        weight_map.update({k: fname for k in keys})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = load_weights(tmp_path)
    assert set(got) == set(w)
    for k in w:
        np.testing.assert_array_equal(got[k], w[k])
    check_weights(CFG, got)

    # a shard listed in the index but missing on disk
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightsError, match="model-00002-of-00002"):
        load_weights(tmp_path)
    # an index naming a tensor its shard lacks
    weight_map = {"a": "x.safetensors", "b": "x.safetensors"}
    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "x.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(WeightsError, match="'b'"):
        load_weights(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{broken")
    with pytest.raises(WeightsError, match="index"):
        load_weights(tmp_path)


def test_half_dtypes_stay_half_and_widen_like_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    g = torch.Generator().manual_seed(0)
    t = {"bf": (torch.randn(5, 7, generator=g) * 100).to(torch.bfloat16),
         "hf": (torch.randn(3, 4, generator=g) * 100).to(torch.float16),
         "special": torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40, -3.5]).to(torch.bfloat16)}
    save_torch(t, str(tmp_path / "model.safetensors"))
    got = load_weights(tmp_path)
    stored = {"bf": "bfloat16", "hf": "float16", "special": "bfloat16"}
    for k, v in t.items():
        # kept in the stored dtype, zero-copy (a view of the read-only map), widened exactly like torch
        assert got[k].dtype.name == stored[k] and got[k].shape == tuple(v.shape) and not got[k].flags.writeable
        assert not got[k].flags.owndata
        wide = got[k].astype(np.float32)
        np.testing.assert_array_equal(wide, v.float().numpy())
        assert np.array_equal(np.signbit(wide), np.signbit(v.float().numpy()))


def test_unaligned_f32_is_copied_aligned(tmp_path):
    # safetensors' own writer never does this, but a valid file may put f32 data after 3 bf16 values
    header = json.dumps({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
                         "b": {"dtype": "F32", "shape": [5], "data_offsets": [6, 26]}}).encode()
    header += b" " * (-len(header) % 8)
    data = np.ones(3, np.float32).view(np.uint32).astype(np.uint32) >> 16
    body = data.astype("<u2").tobytes() + np.arange(5, dtype="<f4").tobytes()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + body)
    got = load_weights(tmp_path)
    assert got["b"].flags.aligned and not got["b"].flags.writeable
    np.testing.assert_array_equal(got["b"], np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(got["a"].astype(np.float32), np.ones(3, np.float32))


def test_unsupported_dtype(tmp_path):
    save_file({"x": np.zeros(3, np.int32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match="'x'.*I32"):
        load_weights(tmp_path)


@pytest.mark.parametrize("cut", [0, 4, 9, 40, -1, -50])
def test_truncated_file(tmp_path, cut):
    save_file(random_weights(CFG), str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:cut])
    with pytest.raises(WeightsError, match="model.safetensors"):
        load_weights(tmp_path)


@pytest.mark.parametrize("content", [
    b"\xff" * 64,
    (10).to_bytes(8, "little") + b"not json!!",
    (2).to_bytes(8, "little") + b"[]",
    (len(b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}')).to_bytes(8, "little")
    + b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}' + b"\0" * 8,
])
def test_malformed_file(tmp_path, content):
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(WeightsError, match="model.safetensors"):
        load_weights(tmp_path)


def test_no_weights_here(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_weights(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_weights(tmp_path / "missing.safetensors")


def test_check_reports_every_problem_with_both_shapes():
    w = random_weights(CFG)
    del w["model.layers.1.mlp.up_proj.weight"]
    w["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 8), np.float32)
    w["model.layers.0.self_attn.q_proj.bias"] = np.zeros(8, np.float32)
    with pytest.raises(WeightsError) as e:
        check_weights(CFG, w)
    msg = str(e.value)
    assert "3 weight problem" in msg
    assert "model.layers.1.mlp.up_proj.weight" in msg and "(12, 8)" in msg
    assert "model.layers.0.self_attn.k_proj.weight" in msg and "(8, 8)" in msg and "(4, 8)" in msg
    assert "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'" in msg


def test_check_message_is_capped():
    cfg = LlamaConfig(11, 8, 12, 200, 2, 1)
    with pytest.raises(WeightsError) as e:
        check_weights(cfg, {})
    assert 100 < len(str(e.value)) <= 2100


def test_tied_lm_head_is_accepted_and_ignored():
    cfg = LlamaConfig(11, 8, 12, 1, 2, 1, tie_word_embeddings=True)
    w = random_weights(cfg)
    w["lm_head.weight"] = w["model.embed_tokens.weight"]
    out = check_weights(cfg, w)
    assert "lm_head.weight" not in out
    w["lm_head.weight"] = np.zeros((11, 9), np.float32)
    with pytest.raises(WeightsError, match=r"lm_head.weight.*\(11, 9\).*\(11, 8\)"):
        check_weights(cfg, w)


def test_plain_dict_conversion():
    w = random_weights(CFG)
    w["model.norm.weight"] = w["model.norm.weight"].astype(np.float16)
    w["lm_head.weight"] = np.asfortranarray(w["lm_head.weight"])
    w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"].astype(np.float64)
    out = check_weights(CFG, w)
    for k, arr in out.items():
        assert arr.dtype == np.float32 and arr.flags.c_contiguous
    assert out["model.layers.0.input_layernorm.weight"] is w["model.layers.0.input_layernorm.weight"]
    np.testing.assert_array_equal(out["model.norm.weight"], w["model.norm.weight"].astype(np.float32))
    np.testing.assert_array_equal(out["lm_head.weight"], w["lm_head.weight"])
    w["model.norm.weight"] = np.zeros(8, np.int32)
    with pytest.raises(WeightsError, match="model.norm.weight.*int32"):
        check_weights(CFG, w)
