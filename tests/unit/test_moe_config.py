"""Qwen3MoeConfig: Hugging Face config.json fields (transformers 4's num_experts and 5's
num_local_experts), which layers are sparse (decided as transformers decides, checked against the
layers transformers builds), the ranges checked before anything is sized, and the fields refused by
name. The expert weights' names and the store of experts as parts (no copy) are checked too, f16
/ bf16 experts, what a device lacks refused at load, and llama.cpp's qwen3moe GGUF keys (whole
GGUF models: tests/models/test_gguf_models.py; writing and quantising a mixture:
tests/unit/test_quantize_moe.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rlx
from rlx import dtypes as rlx_dtypes
from rlx.config import MAX_EXPERTS, MAX_PARAMETERS, Qwen3MoeConfig, config_from_dict, load_config
from rlx.errors import ConfigError, WeightsError
from rlx.weights import block_params, check_weights, expected_weights, expert_parts

BASE = dict(model_type="qwen3_moe", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=6,
            num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6)


def test_fields_and_defaults():
    cfg = config_from_dict(dict(BASE))
    assert isinstance(cfg, Qwen3MoeConfig) and cfg.qk_norm
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (6, 2, 16, True)
    assert [cfg.layer_sparse(i) for i in range(4)] == [True] * 4
    d = {k: v for k, v in BASE.items() if k != "head_dim"}
    assert config_from_dict(d).head_dim == 32 // 4  # as transformers: hidden / heads when absent
    assert config_from_dict(cfg.to_dict()) == cfg
    with pytest.raises(IndexError):
        cfg.layer_sparse(4)


@pytest.mark.parametrize("step,only,want", [(1, [], [1, 1, 1, 1]), (2, [], [0, 1, 0, 1]), (1, [0, 3], [0, 1, 1, 0]),
                                           (3, [2], [0, 0, 0, 0]), (4, [], [0, 0, 0, 1])])
def test_sparse_layers_as_transformers_builds_them(step, only, want):
    transformers = pytest.importorskip("transformers")
    kw = {k: v for k, v in BASE.items() if k != "model_type"}
    hc = transformers.Qwen3MoeConfig(**kw, decoder_sparse_step=step, mlp_only_layers=only)
    model = transformers.Qwen3MoeForCausalLM(hc)
    built = [int(hasattr(layer.mlp, "experts")) for layer in model.model.layers]
    assert built == want
    cfg = config_from_dict(hc.to_dict())
    assert [int(cfg.layer_sparse(i)) for i in range(4)] == want


def test_transformers_5_config_json(tmp_path):
    """transformers 5 writes num_local_experts (an attribute map of num_experts)."""
    transformers = pytest.importorskip("transformers")
    kw = {k: v for k, v in BASE.items() if k != "model_type"}
    transformers.Qwen3MoeConfig(**kw, mlp_only_layers=[2]).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    cfg = load_config(tmp_path)
    assert cfg.num_experts == saved.get("num_experts", saved.get("num_local_experts")) == 6
    assert cfg.mlp_only_layers == (2,)


@pytest.mark.parametrize("change, words", [
    ({"num_experts_per_tok": 7}, ["num_experts_per_tok", "1..num_experts"]),
    ({"num_experts_per_tok": 0}, ["num_experts_per_tok"]),
    ({"num_experts": -1}, ["num_experts"]),
    ({"num_experts": MAX_EXPERTS + 1}, ["num_experts", str(MAX_EXPERTS)]),
    ({"num_experts": 6, "num_local_experts": 8}, ["num_experts", "num_local_experts", "disagree"]),
    ({"moe_intermediate_size": 0}, ["moe_intermediate_size"]),
    ({"decoder_sparse_step": 0}, ["decoder_sparse_step"]),
    ({"mlp_only_layers": [4]}, ["mlp_only_layers", "num_hidden_layers = 4"]),
    ({"mlp_only_layers": [1, 1]}, ["mlp_only_layers", "twice"]),
    ({"mlp_only_layers": "1"}, ["mlp_only_layers", "list"]),
    ({"norm_topk_prob": "yes"}, ["norm_topk_prob", "bool"]),
    ({"shared_expert_intermediate_size": 64}, ["shared_expert_intermediate_size", "shared expert"]),
    ({"use_sliding_window": True}, ["use_sliding_window"]),
    ({"n_routed_experts": 8}, ["n_routed_experts"]),
    ({"mlp_bias": True}, []),  # ignored, as transformers ignores it: no error
    ({"num_experts": 2**15, "moe_intermediate_size": 2**15, "hidden_size": 2**13, "head_dim": 8},
     ["parameters", "MAX_PARAMETERS"]),
])
def test_errors_name_the_field(change, words):
    d = dict(BASE, **change)
    if not words:
        assert isinstance(config_from_dict(d), Qwen3MoeConfig)
        return
    with pytest.raises(ConfigError) as e:
        config_from_dict(d)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_parameter_count_counts_experts():
    """E experts of 3 F x H matrices per sparse layer, plus the router: a config past the cap is
    refused though its dense sizes are small."""
    big = dict(BASE, num_experts=4096, moe_intermediate_size=2**14, hidden_size=2**12, num_hidden_layers=8)
    n = 8 * (4096 * 2**12 + 3 * 4096 * 2**14 * 2**12)
    assert n > MAX_PARAMETERS
    with pytest.raises(ConfigError, match="parameters"):
        config_from_dict(big)


# Qwen3-30B-A3B's config.json as published (transformers 4.51), training fields included
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}


def test_qwen3_30b_a3b_config():
    """The real config: every layer sparse, 128 experts, 8 a token; its weights (the decoder
    builder's list, every expert a part) add up to the 30.5B parameters it is published with."""
    cfg = config_from_dict(QWEN3_30B_A3B)
    assert isinstance(cfg, Qwen3MoeConfig) and all(cfg.layer_sparse(i) for i in range(48))
    exp = expected_weights(cfg)
    assert len(exp) == 3 + 48 * (4 + 2 + 2 + 1 + 3 * 128)  # embed, norm, head; q/k/v/o, q/k norms, 2 norms, router
    assert sum(int(np.prod(s)) for s in exp.values()) == 30_532_122_624


def test_training_fields_are_ignored():
    cfg = config_from_dict(dict(BASE, router_aux_loss_coef=0.5, output_router_logits=True))
    assert isinstance(cfg, Qwen3MoeConfig)


def test_other_families_with_experts_are_refused():
    with pytest.raises(ConfigError, match="other than qwen3_moe"):
        config_from_dict(dict(BASE, model_type="llama", num_local_experts=8))
    qwen2 = {k: v for k, v in BASE.items() if not k.startswith("num_experts")}
    with pytest.raises(ConfigError, match="qwen2_moe.*only qwen3_moe"):
        config_from_dict(dict(qwen2, model_type="qwen2_moe"))


# ---------------------------------------------------------------------------------------------
# weight names: the decoder builder's, stacked or as a Hugging Face file's parts
# ---------------------------------------------------------------------------------------------

def test_expert_param_names():
    cfg = config_from_dict(dict(BASE, mlp_only_layers=[1]))
    kinds = {n: (s, k) for n, s, k in block_params(cfg)}
    assert kinds["model.layers.0.mlp.gate.weight"] == ((6, 32), "matrix")
    assert kinds["model.layers.0.mlp.experts.gate_proj.weight"] == ((6, 16, 32), "experts")
    assert kinds["model.layers.0.mlp.experts.down_proj.weight"] == ((6, 32, 16), "experts")
    assert kinds["model.layers.1.mlp.gate_proj.weight"] == ((48, 32), "matrix")  # the dense layer
    parts = expert_parts(cfg)
    assert parts["model.layers.3.mlp.experts.up_proj.weight"] == [f"model.layers.3.mlp.experts.{e}.up_proj.weight"
                                                                  for e in range(6)]
    exp = expected_weights(cfg)
    assert exp["model.layers.2.mlp.experts.5.down_proj.weight"] == (32, 16)
    assert "model.layers.2.mlp.experts.down_proj.weight" not in exp  # a file holds parts


def _weights(cfg, rng):
    return {n: (rng.standard_normal(s) * 0.2).astype(np.float32) for n, s in expected_weights(cfg).items()}


def test_parts_are_kept_in_place_and_stacked_equals_parts(device):
    """The parts of a Hugging Face file go to the core as they are (a list, no copy); the same
    experts stacked into one array (a GGUF file's layout) give the same logits."""
    cfg = config_from_dict(dict(BASE, mlp_only_layers=[1]))
    w = _weights(cfg, np.random.default_rng(0))
    checked = check_weights(cfg, w)
    parts = checked["model.layers.0.mlp.experts.gate_proj.weight"]
    assert isinstance(parts, list) and parts[3] is w["model.layers.0.mlp.experts.3.gate_proj.weight"]
    stacked = dict(w)
    for name, names in expert_parts(cfg).items():
        stacked[name] = np.stack([stacked.pop(p) for p in names])
    ids = [3, 14, 15, 92, 65, 35]
    a = rlx.Generator(cfg, w, device=device, kv_dtype="f32").prefill_get_last_logits(ids)
    b = rlx.Generator(cfg, stacked, device=device, kv_dtype="f32").prefill_get_last_logits(ids)
    np.testing.assert_array_equal(a, b)


@pytest.mark.skipif("vulkan" not in rlx.backends(), reason="no usable Vulkan device in this build / machine")
def test_vulkan_runs_sparse_layers_as_cpu():
    """Vulkan runs the mixture (TOPK / MATMUL_ID / MOE_COMBINE): a model of dense and sparse layers
    gives cpu's logits for a prefill and two cached decode steps, and so does a pipeline block of a
    sparse layer alone (the hidden states it returns)."""
    cfg = config_from_dict(dict(BASE, mlp_only_layers=[0]))
    w = _weights(cfg, np.random.default_rng(3))
    ids = [3, 14, 15, 92, 65]
    got = {}
    for device in ("cpu", "vulkan"):
        gen = rlx.Generator(cfg, w, device=device, kv_dtype="f32")
        got[device] = [gen.prefill_get_last_logits(ids), gen.decode_get_logits(35), gen.decode_get_logits(8)]
        stage = rlx.PipelineStage(cfg, device, 1, 4, w)  # rank 1 of 4: layer 2 alone, sparse
        assert list(stage.layers()) == [2] and cfg.layer_sparse(2)
        got[device].append(stage.forward(hidden=(np.random.default_rng(5).standard_normal((4, cfg.hidden_size)) * 0.5)
                                         .astype(np.float32)))
    for a, b in zip(got["vulkan"], got["cpu"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())))


@pytest.mark.skipif("vulkan" not in rlx.backends(), reason="no usable Vulkan device in this build / machine")
def test_a_device_lacking_an_op_refuses_the_model_at_load():
    """A model needing a kernel the device lacks (here Vulkan's attention past its largest head dim)
    is refused when it is made, naming the op, not at the first token."""
    cfg = config_from_dict(dict(BASE, head_dim=520))
    w = _weights(cfg, np.random.default_rng(3))
    with pytest.raises(rlx.Error, match=r"device 'vulkan' cannot run this model: it has no kernel for op attention$"):
        rlx.Generator(cfg, w, device="vulkan")


def test_cpu_reads_parts_in_place():
    """On cpu the experts are not copied: the device's wrapped bytes count every part, its
    allocations none of them."""
    cfg = config_from_dict(dict(BASE))
    w = _weights(cfg, np.random.default_rng(1))
    gen = rlx.Generator(cfg, w, device="cpu")
    stats = gen.device_stats()
    total = sum(a.nbytes for a in w.values()) + cfg.head_dim // 2 * 4  # and rope.inv_freq
    assert stats["wrapped_bytes"] == total and stats["allocated_bytes"] < total / 4, stats


def test_only_the_chosen_experts_are_read(monkeypatch):
    """Experts no token chooses are never read: with them NaN (8 experts, 2 a token, 2 tokens: at
    least half of each layer's experts), a one-token prefill and one cached decode step give the
    logits of the intact model exactly, on cpu, ref and vulkan. A product over all experts masked by the
    routing weights would give NaN (NaN * 0 is NaN). The choices come from the NumPy reference
    decoder (rlx.reference.ops.topk, recorded)."""
    from rlx.reference import model as ref_model
    from rlx.reference import ops as ref_ops

    cfg = config_from_dict(dict(BASE, num_experts=8, mlp_only_layers=[1]))
    w = _weights(cfg, np.random.default_rng(6))
    ids = [11, 42]
    chosen: list[np.ndarray] = []
    topk = ref_ops.topk
    monkeypatch.setattr(ref_ops, "topk", lambda x, k: chosen.append(topk(x, k)) or chosen[-1])
    ref_model.forward(cfg, w, ids)
    sparse = [i for i in range(cfg.num_hidden_layers) if cfg.layer_sparse(i)]
    assert len(chosen) == len(sparse)
    nan = dict(w)
    for layer, picked in zip(sparse, chosen):
        used = set(picked.ravel().tolist())
        assert len(used) <= 4
        for e in set(range(8)) - used:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                nan[name] = np.full_like(w[name], np.nan)
    for device in ("cpu", "ref") + (("vulkan",) if "vulkan" in rlx.backends() else ()):
        logits = []
        for weights in (w, nan):
            gen = rlx.Generator(cfg, weights, device=device, kv_dtype="f32")
            logits.append([gen.prefill_get_last_logits(ids[:1]), gen.decode_get_logits(ids[1])])
        for intact, sparse_read in zip(*logits):
            assert np.all(np.isfinite(sparse_read))
            np.testing.assert_array_equal(sparse_read, intact)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_experts(dtype):
    """dtype= converts every part (one copy each, in the part's place) and the core reads them as
    such: cpu (and vulkan) equal the ref device, and with f16 both equal the NumPy reference decoder on the same
    rounded weights (bf16 weights multiply activations rounded to bf16 too, which the reference
    decoder, computing in f32, does not: rlx.reference.ops.matmul)."""
    from rlx.reference.model import forward

    cfg = config_from_dict(dict(BASE, mlp_only_layers=[2]))
    w = _weights(cfg, np.random.default_rng(4))
    checked = check_weights(cfg, w, dtype=dtype)
    parts = checked["model.layers.0.mlp.experts.down_proj.weight"]
    assert all(rlx_dtypes.of_array(p).name == dtype for p in parts)
    rounded = {n: (np.asarray(v, np.float32) if not isinstance(v, list) else [np.asarray(p, np.float32) for p in v])
               for n, v in checked.items()}
    ids = [5, 17, 2, 96, 40]
    got = {}
    for device in ("cpu", "ref") + (("vulkan",) if "vulkan" in rlx.backends() else ()):
        gen = rlx.Generator(cfg, w, device=device, dtype=dtype, kv_dtype="f32")
        assert gen.weight_dtypes == {dtype: len([k for _, _, k in block_params(cfg) if k in ("matrix", "experts")])}
        got[device] = gen.prefill_get_last_logits(ids)
    for device in got.keys() - {"ref"}:
        np.testing.assert_allclose(got[device], got["ref"], rtol=0, atol=1e-4)
    if dtype == "f16":
        np.testing.assert_allclose(got["ref"], forward(cfg, rounded, ids)[-1], rtol=0, atol=1e-4)


def test_missing_and_mixed_parts_are_reported():
    cfg = config_from_dict(dict(BASE))
    w = _weights(cfg, np.random.default_rng(2))
    del w["model.layers.1.mlp.experts.4.up_proj.weight"]
    with pytest.raises(WeightsError, match=r"model\.layers\.1\.mlp\.experts\.up_proj\.weight.*6 parts.*"
                                           r"experts\.4\.up_proj"):
        check_weights(cfg, w)
    w = _weights(cfg, np.random.default_rng(2))
    w["model.layers.0.mlp.experts.2.down_proj.weight"] = w["model.layers.0.mlp.experts.2.down_proj.weight"].astype(
        np.float16)
    with pytest.raises(WeightsError, match="mix dtypes"):
        check_weights(cfg, w)
    w = _weights(cfg, np.random.default_rng(2))
    w["model.layers.0.mlp.experts.1.gate_proj.weight"] = np.zeros((16, 31), np.float32)
    with pytest.raises(WeightsError, match=r"experts\.1\.gate_proj\.weight' has shape \(16, 31\)"):
        check_weights(cfg, w)


# ---------------------------------------------------------------------------------------------
# GGUF (llama.cpp's "qwen3moe"): the expert keys
# ---------------------------------------------------------------------------------------------

def _moe_gguf(path, drop: str = "", ffn: bool = True):
    """A metadata-only qwen3moe GGUF file (a vocabulary and the hyperparameters, no tensors)."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    keys = [("block_count", 4), ("context_length", 64), ("embedding_length", 32), ("feed_forward_length", 48),
            ("attention.head_count", 4), ("attention.head_count_kv", 2), ("attention.key_length", 8),
            ("attention.value_length", 8), ("expert_count", 6), ("expert_used_count", 2),
            ("expert_feed_forward_length", 16)]
    for key, value in keys:
        if key != drop and (ffn or key != "feed_forward_length"):
            w.add_uint32(f"qwen3moe.{key}", value)
    w.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("qwen3moe.rope.freq_base", 1e6)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(97)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_expert_keys(tmp_path):
    """llama.cpp's qwen3moe keys; every layer sparse and renormalised, as its graph runs them (no key
    says otherwise); feed_forward_length optional (no layer is dense)."""
    cfg = load_config(_moe_gguf(tmp_path / "a.gguf"))
    assert isinstance(cfg, Qwen3MoeConfig) and cfg.model_type == "qwen3_moe"
    got = (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.intermediate_size)
    assert got == (6, 2, 16, 48)
    assert cfg.norm_topk_prob and all(cfg.layer_sparse(i) for i in range(4)) and not cfg.rope_interleaved
    assert load_config(_moe_gguf(tmp_path / "b.gguf", ffn=False)).intermediate_size == 16
    with pytest.raises(ConfigError, match="qwen3moe.expert_used_count"):
        load_config(_moe_gguf(tmp_path / "c.gguf", drop="expert_used_count"))


def test_pipeline_blocks_take_stacked_or_parts():
    """A pipeline block's weights, a GGUF file's stacked experts or a Hugging Face file's parts:
    block_weight_filter keeps exactly its layers' (both namings), and two blocks chained give the
    whole model's logits."""
    from rlx.distributed import BlockSpec, Role, block_role, block_weight_filter

    cfg = config_from_dict(dict(BASE, mlp_only_layers=[1]))
    w = _weights(cfg, np.random.default_rng(7))
    stacked = dict(w)
    for name, names in expert_parts(cfg).items():
        stacked[name] = np.stack([stacked.pop(p) for p in names])
    spec = BlockSpec.for_rank(cfg, 1, 2)
    layers = spec.layers
    assert spec.embed and block_role(1, 2) == Role.FIRST
    for weights in (w, stacked):
        kept = {n for n in weights if block_weight_filter(n, cfg, spec)}
        want = {n for n in weights if n.startswith(tuple(f"model.layers.{i}." for i in layers))}
        assert kept == want | {"model.embed_tokens.weight"}
    ids = [3, 14, 15, 92]
    want = rlx.Generator(cfg, w, device="cpu", kv_dtype="f32").prefill_get_last_logits(ids)
    for weights in (w, stacked):
        first = rlx.PipelineStage(cfg, "cpu", 1, 2, {n: v for n, v in weights.items() if block_weight_filter(
            n, cfg, spec)}, kv_dtype="f32")
        last_spec = BlockSpec.for_rank(cfg, 0, 2)
        last = rlx.PipelineStage(cfg, "cpu", 0, 2, {n: v for n, v in weights.items() if block_weight_filter(
            n, cfg, last_spec)}, kv_dtype="f32")
        np.testing.assert_allclose(last.forward(hidden=first.forward(tokens=ids)), want, rtol=0, atol=1e-5)
