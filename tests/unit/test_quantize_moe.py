"""rlx.quantize and dtype= for a mixture of experts (Qwen3-MoE, llama.cpp's "qwen3moe"), against
things rlx did not write.

- The model: a random-initialised Qwen3MoeForCausalLM made by transformers (hidden 256, 3 layers,
  6 experts of 256, 2 a token, every layer sparse and renormalised: the form a qwen3moe GGUF
  holds), saved with save_pretrained (one tensor per expert).
- The file read back by gguf-py's GGUFReader: architecture, the expert keys, the tensor names
  (experts stacked per projection and layer, GGUF dims [in, out, E]; the router [H, E] F32 with the
  router's values), each tensor's type as the recipe gives it; Q8_0 experts byte for byte
  gguf-py's quantize of the experts stacked in expert order; K-type experts: gguf-py's dequantize
  of the file's bytes equals rlx's, and each expert's slice is that expert's weights within the
  K types' error bounds of test_quantize (a slice of another expert would be off by ~1.4).
- The f32 file gives transformers' logits (1e-4, as tests/models); each quantised file, run
  packed on the ref device, gives bit for bit the logits of the f32 model holding gguf-py's
  dequantisation of its tensors, and its KL against the f32 model grows as the types narrow
  (test_quantize's dense-model bounds do not hold for a mixture: see the test); dtype="q8_0" /
  "q4_k_m" at load gives the file's logits and greedy tokens bit for bit on every device.
- With llama-cpp-python installed: the f32 file rlx writes, quantised by llama.cpp's
  llama_model_quantize and by rlx.quantize, gives the same tensors, types and bytes, for 6 experts
  and for 8 (llama.cpp's Mixtral rules: attn_v / attn_k q8_0, attn_output q5_k).
- What a qwen3moe file cannot hold (dense layers, norm_topk_prob False) is refused by name.
"""

from __future__ import annotations

import json
import re

import gguf
import numpy as np
import pytest
from gguf import quants as gq
from test_quantize import llama_quantize, log_softmax, teacher_forced, tensors

import rlx
from rlx import _C
from rlx.errors import ConfigError
from rlx.quantize import RECIPES, tensor_type
from rlx.weights import Packed, expert_parts

BASE = dict(vocab_size=256, hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128, rms_norm_eps=1e-6,
            rope_theta=1e6, tie_word_embeddings=False, num_experts=6, num_experts_per_tok=2, norm_topk_prob=True,
            bos_token_id=None, eos_token_id=[3])
# test_quantize's relative RMS error bounds of the K types on N(0, 1) data
K_BOUNDS = {"q4_k": 0.098, "q6_k": 0.022}


def make_hf(path, **change):
    """A transformers Qwen3-MoE of BASE (+ change) with norms 1 + N(0, 0.2) and matrices
    N(0, 1 / in_features) (an untrained model whose logits are not flat), saved to path."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(**dict(BASE, **change))
    config._attn_implementation = "eager"
    torch.manual_seed(7)
    model = transformers.Qwen3MoeForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]))
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def hf_moe(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("moe") / "hf")


def hf_logits(model, ids) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0].numpy()


def stacked(weights: dict, name: str, cfg) -> np.ndarray:
    """A stacked experts tensor (E, out, in) from a Hugging Face file's parts, in expert order."""
    return np.stack([np.asarray(weights[p], np.float32) for p in expert_parts(cfg)[name]])


# ---------------------------------------------------------------------------------------------
# The file, read back by gguf-py
# ---------------------------------------------------------------------------------------------

def test_file_read_back_by_gguf_py(hf_moe, tmp_path):
    src, _ = hf_moe
    cfg = rlx.load_config(src)
    hf = rlx.load_weights(src)
    types = rlx.quantize(src, tmp_path / "q4_k_m.gguf", type="q4_k_m")
    r = gguf.GGUFReader(str(tmp_path / "q4_k_m.gguf"))
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    a = "qwen3moe."
    assert kv["general.architecture"] == "qwen3moe" and kv["general.file_type"] == 15
    assert (kv[a + "block_count"], kv[a + "embedding_length"], kv[a + "feed_forward_length"],
            kv[a + "attention.head_count"], kv[a + "attention.head_count_kv"], kv[a + "attention.key_length"],
            kv[a + "expert_count"], kv[a + "expert_used_count"], kv[a + "expert_feed_forward_length"]) == \
        (3, 256, 512, 4, 2, 64, 6, 2, 256)
    t = {x.name: x for x in r.tensors}
    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_norm",
                 "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}
    assert set(t) == {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{p}.weight" for i in range(3) for p in per_layer}
    assert {n: x.tensor_type.name.lower() for n, x in t.items()} == types
    for i in range(3):
        router = t[f"blk.{i}.ffn_gate_inp.weight"]
        assert router.tensor_type == gguf.GGMLQuantizationType.F32 and list(map(int, router.shape)) == [256, 6]
        assert np.array_equal(np.asarray(router.data), hf[f"model.layers.{i}.mlp.gate.weight"])
        for proj, part in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            x = t[f"blk.{i}.ffn_{proj}_exps.weight"]
            want_type = "q6_k" if proj == "down" and i == 2 else "q4_k"  # layer 2: q4_k_m's "more bits" (n = 3)
            assert x.tensor_type.name.lower() == want_type == tensor_type("q4_k_m", x.name, (6, 256, 256), cfg)
            assert list(map(int, x.shape)) == [256, 256, 6]  # ne = [in, out, E]
            values = stacked(hf, f"model.layers.{i}.mlp.experts.{part}.weight", cfg)
            deq = gq.dequantize(np.asarray(x.data), x.tensor_type).reshape(6, 256, 256)
            raw = np.asarray(x.data).reshape(6 * 256, -1)
            assert np.array_equal(deq.reshape(-1, 256), _C.to_f32(raw.reshape(-1), want_type).reshape(-1, 256))
            assert np.array_equal(raw, _C.quantize(values.reshape(-1, 256), want_type))
            for e in range(6):  # each slice is its own expert's weights, within the type's error
                err = np.sqrt(np.mean((deq[e] - values[e]) ** 2) / np.mean(values[e] ** 2))
                assert err < K_BOUNDS[want_type], (x.name, e, err)


def test_q8_0_experts_equal_gguf_py(hf_moe, tmp_path):
    """Q8_0 (which gguf-py quantises): every 3-D expert tensor byte for byte gguf-py's quantize of
    the experts stacked in expert order; norms and routers f32, as llama.cpp writes them."""
    src, _ = hf_moe
    cfg = rlx.load_config(src)
    hf = rlx.load_weights(src)
    types = rlx.quantize(src, tmp_path / "q8_0.gguf", type="q8_0")
    t = tensors(tmp_path / "q8_0.gguf")
    for name, parts in expert_parts(cfg).items():
        g = rlx.gguf.gguf_name(name, "qwen3moe")
        assert types[g] == "q8_0"
        want = gq.quantize(stacked(hf, name, cfg), gguf.GGMLQuantizationType.Q8_0)
        assert np.array_equal(np.asarray(t[g].data), want), g
    assert {types[f"blk.{i}.ffn_gate_inp.weight"] for i in range(3)} == {"f32"}
    assert {types[f"blk.{i}.ffn_norm.weight"] for i in range(3)} == {"f32"}


def test_moe_recipe_rules():
    """llama.cpp's rules on a mixture: experts by their projection and layer, the router never
    quantised (even in f16 / bf16 files), and 8-expert models' Mixtral rules."""
    cfg = rlx.config.config_from_dict(dict(BASE, model_type="qwen3_moe", num_hidden_layers=16))
    more_bits = [0, 1, 4, 7, 10, 13, 14, 15]
    shape = (6, 256, 256)
    assert [tensor_type("q4_k_m", f"blk.{i}.ffn_down_exps.weight", shape, cfg) for i in range(16)] == \
        ["q6_k" if i in more_bits else "q4_k" for i in range(16)]
    assert {tensor_type("q4_k_m", f"blk.{i}.ffn_{p}_exps.weight", shape, cfg) for i in range(16)
            for p in ("gate", "up")} == {"q4_k"}
    assert [tensor_type("q3_k_m", f"blk.{i}.ffn_down_exps.weight", shape, cfg) for i in range(2)] == ["q5_k", "q4_k"]
    for r in RECIPES:
        assert tensor_type(r, "blk.3.ffn_gate_inp.weight", (6, 256), cfg) is None
    assert tensor_type("f16", "blk.3.ffn_up_exps.weight", shape, cfg) == "f16"
    for part in ("attn_v", "attn_k", "attn_output"):
        assert tensor_type("q4_k_m", f"blk.3.{part}.weight", (256, 256), cfg) == "q4_k"  # 6 experts: no change
    mixtral = rlx.config.config_from_dict(dict(BASE, model_type="qwen3_moe", num_hidden_layers=16, num_experts=8))
    for r in ("q4_0", "q4_k_m", "q3_k_l", "q8_0"):
        assert tensor_type(r, "blk.3.attn_v.weight", (256, 256), mixtral) == "q8_0"
        assert tensor_type(r, "blk.3.attn_k.weight", (256, 256), mixtral) == "q8_0"
    assert tensor_type("q4_k_m", "blk.3.attn_output.weight", (256, 256), mixtral) == "q5_k"
    assert tensor_type("q3_k_l", "blk.3.attn_output.weight", (256, 256), mixtral) == "q3_k"
    assert tensor_type("q4_k", "blk.3.attn_v.weight", (256, 256), mixtral) == "q4_k"  # pure: no rules


@pytest.mark.parametrize("experts, recipes", [(6, ["q4_k_m", "q2_k", "q3_k_m", "q4_0", "q5_k_s", "f16"]),
                                              (8, ["q4_k_m", "q3_k_l", "q4_0"])])
def test_files_equal_llama_quantize(tmp_path, experts, recipes):
    """The f32 qwen3moe file rlx writes, quantised by llama.cpp's llama_model_quantize and by
    rlx.quantize: every tensor of the same type with the same bytes."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (make bench installs it) is not here")
    src, _ = make_hf(tmp_path / "hf", num_experts=experts)
    f32 = tmp_path / "f32.gguf"
    rlx.quantize(src, f32, type="f32")
    for r in recipes:
        llama_quantize(f32, tmp_path / "llama.gguf", RECIPES[r].file_type)
        got = rlx.quantize(f32, tmp_path / "rlx.gguf", type=r)
        a, b = tensors(tmp_path / "llama.gguf"), tensors(tmp_path / "rlx.gguf")
        assert {n: x.tensor_type.name.lower() for n, x in a.items()} == got, r
        data = [n for n in a if not np.array_equal(np.asarray(a[n].data), np.asarray(b[n].data))]
        assert not data, f"{r}: bytes differ: {data}"


# ---------------------------------------------------------------------------------------------
# Logits and tokens
# ---------------------------------------------------------------------------------------------

def test_logits_from_quantised_files(hf_moe, tmp_path):
    """The f32 file gives transformers' logits. Each quantised file, executed packed on the ref
    device, gives bit for bit the logits of the f32 model holding gguf-py's dequantisation of its
    tensors; teacher-forced against the f32 model its KL grows as the types narrow.

    test_quantize's per-type KL / top-1 bounds (dense models) are not asserted here: a mixture's
    router picks its top-k, and a near-tie between the k-th and (k+1)-th expert flips under any
    perturbation, after which the token runs another expert and, through attention, every later
    position differs. This model has such ties (a 2nd / 3rd router probability gap of 1.8e-4 in
    layer 1 at position 9), so even q8_0 flips some routes. Measured (mean KL in nats / top-1 over
    32 positions, ref): q8_0 4.9e-3 / 0.78, q6_k 3.6e-2 / 0.62, q4_k_m 9.4e-2 / 0.38, q4_0 0.12 / 0.34
    (the dense Qwen3 of test_quantize: 1.8e-4 / 0.94 at q8_0)."""
    src, model = hf_moe
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 256, 32)]
    rlx.quantize(src, tmp_path / "f32.gguf", type="f32")
    f32 = teacher_forced(rlx.Generator.from_pretrained(tmp_path / "f32.gguf", device="ref", kv_dtype="f32"), ids)
    assert np.abs(f32 - hf_logits(model, ids)).max() <= 1e-4
    cfg = rlx.load_config(src)
    p = log_softmax(f32)
    kl = {}
    for r in ("q8_0", "q6_k", "q4_k_m", "q4_0"):
        rlx.quantize(src, tmp_path / f"{r}.gguf", type=r)
        gf = rlx.gguf.GGUFFile(tmp_path / f"{r}.gguf")
        assert any(t.quantized and len(t.shape) == 3 for t in gf.tensors.values())
        dequantised = {n: gq.dequantize(np.asarray(t.data), gguf.GGMLQuantizationType[t.type_name]).reshape(t.shape)
                       if t.quantized else t.data for n, t in gf.tensors.items()}
        packed = teacher_forced(rlx.Generator.from_pretrained(tmp_path / f"{r}.gguf", device="ref", kv_dtype="f32"),
                                ids)
        assert np.array_equal(packed, teacher_forced(rlx.Generator(cfg, dequantised, device="ref", kv_dtype="f32"),
                                                     ids)), r
        q = log_softmax(packed)
        kl[r] = float((np.exp(p) * (p - q)).sum(-1).mean())
    assert kl["q8_0"] < kl["q6_k"] < kl["q4_k_m"] < kl["q4_0"], kl


@pytest.mark.parametrize("recipe", ["q8_0", "q4_k_m"])
def test_dtype_at_load_equals_the_file(hf_moe, tmp_path, device, recipe):
    """Generator(cfg, weights, dtype=recipe) holds the file's bytes (each expert part the slice of
    its stacked tensor; the router f32) and gives its logits and greedy tokens bit for bit."""
    from rlx.quantize import quantize_weights

    src, _ = hf_moe
    cfg = rlx.load_config(src)
    rlx.quantize(src, tmp_path / "m.gguf", type=recipe)
    gf = rlx.gguf.GGUFFile(tmp_path / "m.gguf")
    in_memory = quantize_weights(cfg, rlx.load_weights(src), recipe)
    parts = expert_parts(cfg)
    for name, t in gf.tensors.items():
        got = [in_memory[p] for p in parts[name]] if name in parts else [in_memory[name]]
        if isinstance(got[0], Packed):
            assert {g.dtype for g in got} == {t.type_name.lower()}
            assert np.array_equal(np.concatenate([g.data for g in got]), t.data.reshape(-1, t.data.shape[-1])), name
        else:
            assert np.array_equal(np.stack(got).reshape(t.data.shape), t.data) and got[0].dtype == t.data.dtype, name
    mem = rlx.Generator(cfg, rlx.load_weights(src), device=device, dtype=recipe, kv_dtype="f32")
    f = rlx.Generator.from_pretrained(tmp_path / "m.gguf", device=device, kv_dtype="f32")
    assert mem.weight_dtypes == f.weight_dtypes
    ids = [3, 77, 12, 250, 9, 41]
    assert np.array_equal(mem.prefill_get_last_logits(ids), f.prefill_get_last_logits(ids))
    assert np.array_equal(mem.decode_get_logits(5), f.decode_get_logits(5))
    mem.prefill(ids)
    f.prefill(ids)
    greedy = rlx.SampleOpts.greedy()
    assert mem.generate_cached(12, greedy) == f.generate_cached(12, greedy)


# ---------------------------------------------------------------------------------------------
# What a qwen3moe file cannot hold
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [({"mlp_only_layers": [1]}, "layers [1] are dense"),
                                           ({"decoder_sparse_step": 2}, "layers [0, 2] are dense"),
                                           ({"norm_topk_prob": False}, "norm_topk_prob = False")])
def test_what_a_qwen3moe_file_cannot_hold_is_refused(tmp_path, change, words):
    from safetensors.numpy import save_file

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(dict(BASE, model_type="qwen3_moe", **change)))
    cfg = rlx.load_config(hf)
    save_file({n: np.zeros(s, np.float32) for n, s in rlx.weights.expected_weights(cfg).items()},
              str(hf / "model.safetensors"))
    with pytest.raises(ConfigError, match=re.escape(words)):
        rlx.quantize(hf, tmp_path / "dst.gguf", type="q8_0")
    assert not list(tmp_path.glob("dst.gguf*"))
