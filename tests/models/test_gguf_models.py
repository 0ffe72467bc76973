"""Whole models from GGUF files against transformers.

Each random-initialised transformers model of hf_cases.py is written as a GGUF file the way
llama.cpp's converter writes it (its tensor names, typed out here from llama.cpp's naming, not from
rlx.gguf; Llama's q / k rows permuted for interleaved RoPE; Llama 3 scaling as the rope_freqs
tensor; the metadata keys), with gguf-py's GGUFWriter. rlx then loads the file (rlx.load_config,
rlx.load_weights, Generator.from_pretrained), reading Llama's permuted q / k in place (RoPE on
adjacent pairs), and must give transformers' logits:
- F32 tensors: within 1e-4 (with an f32 KV cache), greedy tokens identical, on every backend;
- stories260K (a trained model, with its SentencePiece vocabulary as tokenizer metadata): llama2.c's
  exact 64 greedy tokens and text through rlx.load("stories260K.gguf");
- Q8_0 matrices (executed packed): the same model with the Q8_0 values dequantised by gguf-py and
  given to rlx as float32 arrays (the dequantised reference) gives the same logits on the ref
  backend (which multiplies the exact activations by the dequantised weights) within 1e-4.
Qwen3-MoE is written as llama.cpp's "qwen3moe": the router as ffn_gate_inp, each projection's
experts stacked into one 3-D tensor (ffn_gate_exps / ffn_up_exps / ffn_down_exps, Q8_0 row by row
like the matrices), the expert keys; the case has every layer sparse and renormalised, the only
form llama.cpp's qwen3moe graph runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from hf_cases import case_ids, hf_logits

import rlx
from rlx.weights import block_params, expected_weights

TOL = 1e-4
# (qwen3_sliding is left out: GGUF has no key for Qwen3's sliding window, and llama.cpp's qwen3
# graph has none)
CASES = ["llama_gqa2_tied", "llama_rope_llama3", "llama_bias", "qwen3_tied", "qwen3_bias_gqa4", "qwen3moe_e6_k3_norm"]
ARCH = {"qwen3_moe": "qwen3moe"}  # llama.cpp's architecture name, where it is not the model_type

# Hugging Face suffix -> llama.cpp's tensor name suffix (llama.cpp's naming, typed out here)
SUFFIX = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.bias": "ffn_up.bias", "mlp.down_proj.bias": "ffn_down.bias",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.gate_proj.weight": "ffn_gate_exps.weight",
    "mlp.experts.up_proj.weight": "ffn_up_exps.weight", "mlp.experts.down_proj.weight": "ffn_down_exps.weight",
}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def gguf_name(hf: str) -> str:
    if hf in TOP:
        return TOP[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{SUFFIX[rest]}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: per head, rows (half, pair) -> (pair, half) (interleaved RoPE)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, matrix_type=T.F32) -> dict[str, np.ndarray]:
    """model (transformers) as a GGUF file; returns {HF name: the f32 values rlx should read} (the
    dequantised values for a quantized type, in Hugging Face row order)."""
    cfg = rlx.config.config_from_dict(model.config.to_dict())
    arch = ARCH.get(cfg.model_type, cfg.model_type)
    w = gguf.GGUFWriter(str(path), arch)
    for key, kind, value in [
        ("block_count", "uint32", cfg.num_hidden_layers), ("context_length", "uint32", cfg.max_position_embeddings),
        ("embedding_length", "uint32", cfg.hidden_size), ("feed_forward_length", "uint32", cfg.intermediate_size),
        ("attention.head_count", "uint32", cfg.num_attention_heads),
        ("attention.head_count_kv", "uint32", cfg.num_key_value_heads),
        ("attention.key_length", "uint32", cfg.head_dim), ("attention.value_length", "uint32", cfg.head_dim),
        ("rope.dimension_count", "uint32", cfg.head_dim), ("rope.freq_base", "float32", cfg.rope_theta),
        ("attention.layer_norm_rms_epsilon", "float32", cfg.rms_norm_eps)]:
        getattr(w, f"add_{kind}")(f"{arch}.{key}", value)
    if arch == "qwen3moe":
        for key, value in [("expert_count", cfg.num_experts), ("expert_used_count", cfg.num_experts_per_tok),
                           ("expert_feed_forward_length", cfg.moe_intermediate_size)]:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    state = _stacked_experts(cfg, {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()})
    expected = {}
    for name in (n for n, _, kind in block_params(cfg) if kind != "derived"):
        x = state[name]
        stored = x
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            stored = permute(x, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        if x.ndim >= 2 and matrix_type != T.F32:
            q = gguf.quants.quantize(stored, matrix_type)
            w.add_tensor(gguf_name(name), q, raw_dtype=matrix_type)
            expected[name] = gguf.quants.dequantize(gguf.quants.quantize(x, matrix_type), matrix_type)
        else:
            w.add_tensor(gguf_name(name), stored)
            expected[name] = x
    if arch == "llama" and cfg.rope_scaling:
        base = rlx.config.config_from_dict({**cfg.to_dict(), "rope_scaling": None}).rope_inv_freq()
        w.add_tensor("rope_freqs.weight", (base / cfg.rope_inv_freq()).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def _stacked_experts(cfg, state: dict) -> dict:
    """state plus each sparse layer's experts stacked (E, out, in), as llama.cpp stores them, from
    transformers' per-expert parameters (4.x) or its fused gate_up_proj (E, 2F, H: gate rows first)
    and down_proj (E, H, F) (5.x)."""
    out = dict(state)
    F = getattr(cfg, "moe_intermediate_size", 0)
    for name, shape, kind in block_params(cfg):
        if kind != "experts":
            continue
        base, proj = name.rsplit(".experts.", 1)
        fused = state.get(f"{base}.experts.gate_up_proj" if proj != "down_proj.weight" else f"{base}.experts.down_proj")
        if fused is None:
            out[name] = np.stack([state[f"{base}.experts.{e}.{proj}"] for e in range(shape[0])])
        else:
            parts = {"gate_proj.weight": fused[:, :F], "up_proj.weight": fused[:, F:]}
            out[name] = parts.get(proj, fused)
        assert out[name].shape == shape, (name, out[name].shape, shape)
    return out


@pytest.mark.parametrize("hf_model", CASES, indirect=True)
def test_f32_gguf_matches_transformers(hf_model, device, tmp_path):
    _, model = hf_model
    path = tmp_path / "model.gguf"
    write_gguf(path, model)
    cfg = rlx.load_config(path)
    assert cfg.rope_interleaved == (cfg.model_type == "llama")  # Llama's q / k read as permuted
    gen = rlx.Generator.from_pretrained(path, device=device, kv_dtype="f32")
    prompt = [int(t) for t in case_ids(model, 11)]
    got = [gen.prefill_get_last_logits(prompt)]
    seq = list(prompt)
    for _ in range(5):
        seq.append(int(np.argmax(got[-1])))
        got.append(gen.decode_get_logits(seq[-1]))
    want = hf_logits(model, seq)[len(prompt) - 1:]
    assert np.abs(np.stack(got) - want).max() <= TOL


@pytest.mark.parametrize("hf_model", ["llama_rope_llama3", "qwen3_bias_gqa4", "qwen3moe_e6_k3_norm"], indirect=True)
def test_q8_0_gguf_executed_packed_matches_its_dequantised_values(hf_model, tmp_path):
    _, model = hf_model
    path = tmp_path / "model.gguf"
    dequantised = write_gguf(path, model, T.Q8_0)
    weights = rlx.load_weights(path)
    packed = [n for n, v in weights.items() if isinstance(v, rlx.Packed)]
    assert packed and all(weights[n].dtype == "q8_0" for n in packed)
    cfg = rlx.load_config(path)
    gen = rlx.Generator(cfg, weights, device="ref", kv_dtype="f32")
    assert gen.weight_dtypes == {"q8_0": len(packed)}
    # the same values as float32, in Hugging Face row order, through the plain HF path
    hf_cfg = rlx.config.config_from_dict(model.config.to_dict())
    ref = rlx.Generator(hf_cfg, dequantised, device="ref", kv_dtype="f32")
    prompt = [int(t) for t in case_ids(model, 9)]
    a, b = gen.prefill_get_last_logits(prompt), ref.prefill_get_last_logits(prompt)
    assert np.abs(a - b).max() <= TOL
    for t in (3, 5, 7):
        assert np.abs(gen.decode_get_logits(t) - ref.decode_get_logits(t)).max() <= TOL


STORIES = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "stories260K"


@pytest.mark.skipif(not (STORIES / "hf" / "model.safetensors").is_file(), reason=f"no stories260K under {STORIES}")
def test_stories260k_as_gguf_gives_llama2c_text(tmp_path):
    """The trained model written as llama.cpp's converter would (its SentencePiece vocabulary as
    tokenizer.ggml.* with scores and token types): rlx.load(file.gguf) builds the tokenizer from the
    metadata and produces llama2.c's exact 64-token greedy text."""
    spm = pytest.importorskip("sentencepiece")
    expected = json.loads((STORIES / "expected" / "greedy_once_upon_a_time.json").read_text())
    hf = STORIES / "hf"
    cfg = rlx.load_config(hf)
    state = rlx.load_weights(hf)
    sp = spm.SentencePieceProcessor(model_file=str(hf / "tok512.model"))
    path = tmp_path / "stories260K.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, kind, value in [
        ("block_count", "uint32", cfg.num_hidden_layers), ("context_length", "uint32", cfg.max_position_embeddings),
        ("embedding_length", "uint32", cfg.hidden_size), ("feed_forward_length", "uint32", cfg.intermediate_size),
        ("attention.head_count", "uint32", cfg.num_attention_heads),
        ("attention.head_count_kv", "uint32", cfg.num_key_value_heads),
        ("rope.dimension_count", "uint32", cfg.head_dim), ("rope.freq_base", "float32", cfg.rope_theta),
        ("attention.layer_norm_rms_epsilon", "float32", cfg.rms_norm_eps)]:
        getattr(w, f"add_{kind}")(f"llama.{key}", value)
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
             for i in range(sp.get_piece_size())]
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    w.add_token_scores([sp.get_score(i) for i in range(sp.get_piece_size())])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    for name in expected_weights(cfg):
        x = np.asarray(state[name], np.float32)
        if ".q_proj." in name or ".k_proj." in name:
            x = permute(x, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    model = rlx.load(path)
    assert model.config.rope_interleaved and model.config.tie_word_embeddings
    assert model.tokenizer.encode(expected["prompt"]) == expected["prompt_tokens"]
    stream = model.generate(expected["prompt"], max_new_tokens=64, stream=True)
    text = "".join(stream)
    assert stream.new_ids == expected["new_tokens"]
    assert expected["prompt"] + text == expected["text"]
