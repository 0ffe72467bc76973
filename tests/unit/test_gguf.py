"""rlx.gguf: reading GGUF files written by gguf-py's GGUFWriter (the writer llama.cpp's
converter uses), mapping names and configs back to Hugging Face, zero-copy views, the q/k
permutation, Llama 3 rope_freqs, and every error for a broken file.

Each model file is made here the way llama.cpp's convert_hf_to_gguf.py would make it from a
Hugging Face config and random weights: HF names -> GGUF names, q/k rows permuted for llama,
Llama 3 RoPE scaling stored only as the rope_freqs tensor of frequency factors (computed here
from rlx's own HF-checked `rope_inv_freq`, not from rlx.gguf), tensors quantized by gguf-py.
The reader must give back the HF config, the HF names, shapes and types, views into the file
equal to what was written (gguf-py's dequantize for block types), and HF row order after
`unpermute_qk`.
"""

from __future__ import annotations

import mmap
import struct
import tracemalloc
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from rlx.config import config_from_dict
from rlx.errors import ConfigError, WeightsError
from rlx.gguf import GGUFFile, GGUFStrings, config_from_gguf, llama3_rope_factors, permute_qk, unpermute_qk
from rlx.weights import expected_weights

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "tokenizers" / "vectors"

LLAMA = {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
QWEN3 = {"model_type": "qwen3", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
         "tie_word_embeddings": True, "attention_bias": True, "bos_token_id": 5, "eos_token_id": 6}

# HF suffix -> GGUF suffix (written independently of rlx.gguf's table, from llama.cpp's names)
GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.bias": "ffn_up.bias", "mlp.down_proj.bias": "ffn_down.bias",
}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest]}"


def write_model(path, hf: dict, types=(T.F32,), seed=0, vocab=True, rope_freqs=True,
                extra_kv=None, drop_kv=(), extra_tensors=None):
    """Writes hf (a Hugging Face config dict) + random weights as llama.cpp's converter would.
    Matrices cycle through `types`; norms stay F32. Returns {hf name: (ggml type, HF-order f32)}."""
    cfg = config_from_dict(hf)
    arch = cfg.model_type
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    kv = {
        f"{arch}.block_count": ("uint32", cfg.num_hidden_layers),
        f"{arch}.context_length": ("uint32", cfg.max_position_embeddings),
        f"{arch}.embedding_length": ("uint32", cfg.hidden_size),
        f"{arch}.feed_forward_length": ("uint32", cfg.intermediate_size),
        f"{arch}.attention.head_count": ("uint32", cfg.num_attention_heads),
        f"{arch}.attention.head_count_kv": ("uint32", cfg.num_key_value_heads),
        f"{arch}.attention.key_length": ("uint32", cfg.head_dim),
        f"{arch}.attention.value_length": ("uint32", cfg.head_dim),
        f"{arch}.rope.dimension_count": ("uint32", cfg.head_dim),
        f"{arch}.rope.freq_base": ("float32", cfg.rope_theta),
        f"{arch}.attention.layer_norm_rms_epsilon": ("float32", cfg.rms_norm_eps),
        "tokenizer.ggml.bos_token_id": ("uint32", cfg.bos_token_id),
        "tokenizer.ggml.eos_token_id": ("uint32", cfg.eos_token_ids[0]),
    }
    kv.update(extra_kv or {})
    for key, (kind, value) in kv.items():
        if key not in drop_kv:
            getattr(w, f"add_{kind}")(key, value)
    if vocab:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
        w.add_chat_template("{{ messages }}")
    written = {}
    matrices = 0
    for name, shape in expected_weights(cfg).items():
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 1:
            ty = T.F32
        else:
            ty = types[matrices % len(types)]
            matrices += 1
        stored = x
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            stored = permute_qk(x, heads)
        if ty == T.F32:
            w.add_tensor(gguf_name(name), stored)
        elif ty == T.F16:
            w.add_tensor(gguf_name(name), stored.astype(np.float16))
            x = x.astype(np.float16).astype(np.float32)
        elif ty == T.Q4_K:  # gguf-py cannot quantize K-quants: random blocks with finite scales
            q = rng.integers(0, 256, (shape[0], shape[1] // 256 * 144), dtype=np.uint8)
            q.reshape(shape[0], -1, 144)[:, :, :4] = np.full((1, 1, 2), 0.01, np.float16).view(np.uint8)
            w.add_tensor(gguf_name(name), q, raw_dtype=ty)
            x = None
        else:
            q = gguf.quants.quantize(stored, ty)
            w.add_tensor(gguf_name(name), q, raw_dtype=ty)
            x = gguf.quants.dequantize(gguf.quants.quantize(x, ty), ty)
        written[name] = (ty, x)
    if arch == "llama" and cfg.rope_scaling and rope_freqs:
        base = config_from_dict({**hf, "rope_scaling": None}).rope_inv_freq()
        w.add_tensor("rope_freqs.weight", (base / cfg.rope_inv_freq()).astype(np.float32))
    for name, arr in (extra_tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def mmap_base(a: np.ndarray):
    """The object at the end of a's base chain (an mmap.mmap for a view of the file)."""
    b = a
    while isinstance(b, np.ndarray):
        b = b._mmap if isinstance(b, np.memmap) and b._mmap is not None else b.base
    return b


# ---------------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------------

CASES = {
    "llama_untied_gqa": LLAMA,
    "llama_tied_mha": {**LLAMA, "tie_word_embeddings": True, "num_key_value_heads": 4},
    "llama3_scaling": {**LLAMA, "rope_scaling": LLAMA3_SCALING, "max_position_embeddings": 131072},
    "llama3_scaling_factor8_tied": {**LLAMA, "tie_word_embeddings": True, "max_position_embeddings": 8192,
                                    "rope_scaling": {**LLAMA3_SCALING, "factor": 8.0}},
    "llama_head_dim_bias": {**LLAMA, "head_dim": 32, "attention_bias": True, "mlp_bias": True},
    "qwen3_qk_norm": QWEN3,
    "qwen3_untied_nobias": {**QWEN3, "tie_word_embeddings": False, "attention_bias": False,
                            "num_key_value_heads": 2, "head_dim": 16},
}


@pytest.mark.parametrize("case", CASES)
def test_config_round_trip(tmp_path, case):
    hf = CASES[case]
    write_model(tmp_path / "m.gguf", hf)
    got = config_from_gguf(tmp_path / "m.gguf")
    want = config_from_dict(hf)
    assert got == want
    assert type(got) is type(want)
    np.testing.assert_allclose(got.rope_inv_freq(), want.rope_inv_freq(), rtol=1e-6)


def test_llama3_factors_formula_matches_hf_inv_freq():
    # llama.cpp divides each base frequency by its factor; HF's llama3 inv_freq must be exactly that.
    for scaling in (LLAMA3_SCALING, {**LLAMA3_SCALING, "factor": 8.0}, {**LLAMA3_SCALING, "low_freq_factor": 2.0}):
        for head_dim in (64, 128):
            cfg = config_from_dict({**LLAMA, "head_dim": head_dim, "rope_scaling": scaling})
            base = config_from_dict({**LLAMA, "head_dim": head_dim}).rope_inv_freq()
            f = llama3_rope_factors(cfg.rope_theta, head_dim, scaling["factor"], scaling["low_freq_factor"],
                                    scaling["high_freq_factor"], scaling["original_max_position_embeddings"])
            np.testing.assert_allclose(base / f, cfg.rope_inv_freq(), rtol=1e-6)
            assert f.min() == 1.0 and f.max() == scaling["factor"]


def test_llama3_non_default_low_high_recovered(tmp_path):
    hf = {**LLAMA, "head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
          "rope_scaling": {**LLAMA3_SCALING, "factor": 16.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0}}
    write_model(tmp_path / "m.gguf", hf)
    assert config_from_gguf(tmp_path / "m.gguf") == config_from_dict(hf)


def test_rope_freqs_not_llama3_is_refused(tmp_path):
    hf = {**LLAMA, "rope_scaling": LLAMA3_SCALING, "max_position_embeddings": 131072}
    write_model(tmp_path / "m.gguf", hf, rope_freqs=False,
                extra_tensors={"rope_freqs.weight": np.linspace(1.0, 3.0, 8, dtype=np.float32)})
    with pytest.raises(ConfigError, match="rope_freqs.*llama3"):
        config_from_gguf(tmp_path / "m.gguf")
    # all-ones factors mean plain RoPE
    write_model(tmp_path / "ones.gguf", LLAMA, extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    assert config_from_gguf(tmp_path / "ones.gguf").rope_scaling is None


def test_rope_scaling_type_linear_is_refused(tmp_path):
    write_model(tmp_path / "m.gguf", LLAMA, extra_kv={"llama.rope.scaling.type": ("string", "linear")})
    with pytest.raises(ConfigError, match="llama.rope.scaling.type.*linear"):
        config_from_gguf(tmp_path / "m.gguf")


def test_vocab_from_tokens_eot_and_defaults(tmp_path):
    # no key_length / head_count_kv / freq_base: llama.cpp's defaults; eot joins eos
    write_model(tmp_path / "m.gguf", LLAMA, drop_kv=("llama.attention.key_length", "llama.attention.value_length",
                                                     "llama.rope.freq_base", "llama.rope.dimension_count"),
                extra_kv={"tokenizer.ggml.eot_token_id": ("uint32", 9)})
    cfg = config_from_gguf(GGUFFile(tmp_path / "m.gguf"))
    assert cfg.head_dim == 16 and cfg.rope_theta == 10000.0 and cfg.eos_token_ids == (2, 9)


def test_real_vocab_files_configs():
    """The vocab-only GGUF files of llama.cpp's tests carry full Llama 3 8B / Llama 2 7B hparams."""
    if not (VECTORS / "ggml-vocab-llama-bpe.gguf").is_file():
        pytest.skip(f"llama.cpp's vocab files not found under {VECTORS} (the shared directory beside the repo)")
    c = config_from_gguf(VECTORS / "ggml-vocab-llama-bpe.gguf")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.max_position_embeddings, c.rope_theta) == \
        (128256, 4096, 14336, 32, 32, 8, 128, 8192, 500000.0)
    assert c.bos_token_id == 128000 and c.eos_token_ids == (128001,) and not c.tie_word_embeddings
    c = config_from_gguf(VECTORS / "ggml-vocab-llama-spm.gguf")
    assert (c.vocab_size, c.hidden_size, c.rope_theta, c.bos_token_id, c.eos_token_ids) == \
        (32000, 4096, 10000.0, 1, (2,))
    with pytest.raises(ConfigError, match="architecture 'qwen2'.*not supported"):
        config_from_gguf(VECTORS / "ggml-vocab-qwen2.gguf")


# ---------------------------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,types", [
    ("llama_untied_gqa", (T.F32, T.F16, T.BF16, T.Q8_0)),
    ("llama3_scaling", (T.Q8_0, T.BF16)),
    ("qwen3_qk_norm", (T.BF16, T.Q8_0, T.F16, T.F32)),
    ("qwen3_untied_nobias", (T.F16,)),
])
def test_tensors_names_shapes_types_zero_copy(tmp_path, case, types):
    hf = CASES[case]
    written = write_model(tmp_path / "m.gguf", hf, types=types)
    f = GGUFFile(tmp_path / "m.gguf")
    cfg = config_from_gguf(f)
    assert list(f.tensors) == list(expected_weights(cfg))
    assert f.qk_permuted == (cfg.model_type == "llama")
    assert (f.rope_freqs is not None) == (cfg.rope_scaling is not None)
    assert f.chat_template == "{{ messages }}"
    for name, (ty, x) in written.items():
        t = f[name]
        assert t.name == name and t.gguf_name == gguf_name(name) and t.type_name == ty.name
        assert t.shape == expected_weights(cfg)[name]
        assert np.shares_memory(t.data, f.buffer) and isinstance(mmap_base(t.data), mmap.mmap)
        assert not t.data.flags.writeable
        assert t.offset % f.alignment == 0
        if ty in (T.F32, T.F16, T.BF16):
            assert t.data.shape == t.shape and not t.quantized
            assert t.data.dtype == {T.F32: np.float32, T.F16: np.float16, T.BF16: ml_dtypes.bfloat16}[ty]
            stored = np.asarray(t.data, dtype=np.float32)
            if ty == T.BF16:
                x = gguf.quants.dequantize(gguf.quants.quantize(x, T.BF16), T.BF16)
        else:
            block, size = gguf.GGML_QUANT_SIZES[ty]
            assert t.quantized and t.data.dtype == np.uint8
            assert t.data.shape == (t.shape[0], t.shape[1] // block * size)
            stored = gguf.quants.dequantize(t.data, ty)
        assert stored.shape == t.shape
        hf_order = f.hf_array(name)  # HF row order: a copy for permuted q/k, else the view itself
        if f.qk_permuted and (".q_proj." in name or ".k_proj." in name):
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            stored = unpermute_qk(stored, heads)
            assert not np.shares_memory(hf_order, f.buffer)
        else:
            assert hf_order is t.data
        np.testing.assert_array_equal(stored, x)
        if t.quantized:
            np.testing.assert_array_equal(gguf.quants.dequantize(hf_order, ty), x)  # packed rows moved whole
        else:
            np.testing.assert_array_equal(np.asarray(hf_order, np.float32), x)
    assert set(f.weights()) == set(written)


def test_q4_k_blocks_kept_packed(tmp_path):
    hf = {**LLAMA, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1}
    write_model(tmp_path / "m.gguf", hf, types=(T.Q4_K,))
    f = GGUFFile(tmp_path / "m.gguf")
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    for rt in r.tensors:
        t = next(t for t in f.tensors.values() if t.gguf_name == rt.name)
        assert t.type_name == rt.tensor_type.name and t.offset == rt.data_offset
        np.testing.assert_array_equal(t.data.reshape(-1), np.asarray(rt.data).reshape(-1).view(t.data.dtype))
        if t.type_name == "Q4_K":
            assert t.data.shape == (t.shape[0], t.shape[1] // 256 * 144)
            np.testing.assert_array_equal(gguf.quants.dequantize(t.data, T.Q4_K),
                                          gguf.quants.dequantize(np.asarray(rt.data), T.Q4_K))


def test_metadata_matches_gguf_reader(tmp_path):
    write_model(tmp_path / "m.gguf", QWEN3, types=(T.Q8_0,),
                extra_kv={"test.i8s": ("array", [-1, 2, -3]), "test.strs": ("array", ["a", "", "é"]),
                          "test.flag": ("bool", True), "test.f64": ("float64", 0.1), "test.i64": ("int64", -(2 ** 40))})
    f = GGUFFile(tmp_path / "m.gguf")
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        want, got = field.contents(), f.metadata[key]
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, np.array(want))
        elif isinstance(got, float):
            assert np.float32(got) == np.float32(want) if field.types[0] == gguf.GGUFValueType.FLOAT32 else got == want
        elif isinstance(got, GGUFStrings):
            assert got == want and list(got) == want and isinstance(want, list), key
        else:
            assert got == want and type(got) is type(want), key
    assert f.metadata["test.strs"] == ["a", "", "é"] and f.metadata["test.flag"] is True
    assert f.version == 3 and f.architecture == "qwen3" and len(f.tensors) == len(r.tensors)


def test_string_arrays_read_in_place(tmp_path):
    """A string array is kept as offsets into the map (8 bytes a string), decoded when read; it
    behaves as a read-only sequence equal to the list of its strings."""
    words = [f"w{i}é" for i in range(40000)] + ["", "a b"]
    write_model(tmp_path / "m.gguf", QWEN3, types=(T.Q8_0,), extra_kv={"test.strs": ("array", words)})
    tracemalloc.start()
    f = GGUFFile(tmp_path / "m.gguf")
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    v = f.metadata["test.strs"]
    assert isinstance(v, GGUFStrings) and len(v) == len(words)
    assert held < 24 * len(words), held  # the vocabulary's tokens too; as Python strs ~60 bytes each
    assert v == words and v == tuple(words) and v != words[:-1] and v != words[:-1] + ["x"] and v != "w0é"
    assert v[0] == "w0é" and v[-1] == "a b" and v[-2] == "" and v[5:8] == words[5:8] and list(v) == words
    assert "w7é" in v and v.index("w7é") == 7 and list(reversed(v))[0] == "a b"
    with pytest.raises(IndexError):
        v[len(words)]
    with pytest.raises(TypeError):
        hash(v)
    assert f.get("test.strs", list) == words and type(f.get("test.strs", list)) is list
    assert repr(v).startswith("GGUFStrings(['w0é', 'w1é', 'w2é', ...], 40002 strings)")


def test_permutation_helpers():
    rng = np.random.default_rng(1)
    for heads, hd, cols in ((4, 8, 5), (1, 16, 3), (3, 2, 1)):
        w = rng.standard_normal((heads * hd, cols)).astype(np.float32)
        p = permute_qk(w, heads)
        # row h*d + 2j + t of the GGUF layout is HF row h*d + t*(d/2) + j
        for h in range(heads):
            for j in range(hd // 2):
                for t in range(2):
                    np.testing.assert_array_equal(p[h * hd + 2 * j + t], w[h * hd + t * (hd // 2) + j])
        np.testing.assert_array_equal(unpermute_qk(p, heads), w)
        np.testing.assert_array_equal(unpermute_qk(permute_qk(w[:, 0], heads), heads), w[:, 0])  # biases
    q = rng.integers(0, 256, (8, 34), dtype=np.uint8)  # packed rows move whole
    np.testing.assert_array_equal(unpermute_qk(permute_qk(q, 2), 2), q)
    with pytest.raises(ValueError, match="heads"):
        unpermute_qk(np.zeros((6, 2)), 2)


# ---------------------------------------------------------------------------------------------
# broken files
# ---------------------------------------------------------------------------------------------

def test_truncated_files(tmp_path):
    good = tmp_path / "good.gguf"
    write_model(good, LLAMA, types=(T.Q8_0,))
    raw = good.read_bytes()
    f = GGUFFile(good)
    last = max(f.tensors.values(), key=lambda t: t.offset)
    header_end = min(t.offset for t in f.tensors.values())
    for cut in (0, 3, 10, 30, 200, header_end - 40, last.offset + 5, len(raw) - 1):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(raw[:cut])
        with pytest.raises(WeightsError, match=rf"cut{cut}\.gguf: .*(truncated|not a GGUF)"):
            GGUFFile(bad)


def patch_tensor_type(path, name: str, new_type: int):
    raw = bytearray(path.read_bytes())
    at = raw.index(name.encode()) + len(name)
    n_dims = struct.unpack_from("<I", raw, at)[0]
    struct.pack_into("<I", raw, at + 4 + 8 * n_dims, new_type)
    path.write_bytes(bytes(raw))


def test_unknown_tensor_type(tmp_path):
    p = tmp_path / "m.gguf"
    write_model(p, LLAMA)
    patch_tensor_type(p, "blk.0.attn_v.weight", 99)
    with pytest.raises(WeightsError, match=r"m\.gguf: tensor 'blk\.0\.attn_v\.weight' has unknown GGML type 99"):
        GGUFFile(p)


@pytest.mark.parametrize("gtype", ["IQ4_NL", "TQ1_0", "MXFP4"])
def test_tensor_type_gguf_knows_and_rlx_does_not_run(tmp_path, gtype):
    """Found by the gguf_file fuzz target: an MXFP4 tensor passed the reader and failed at load with
    a bare ValueError from rlx.dtypes. Refused at open, naming the file, tensor and type."""
    from gguf import GGMLQuantizationType

    if not hasattr(GGMLQuantizationType, gtype):
        pytest.skip(f"this gguf package has no {gtype}")
    p = tmp_path / "m.gguf"
    write_model(p, LLAMA)
    patch_tensor_type(p, "blk.0.attn_v.weight", int(GGMLQuantizationType[gtype]))
    with pytest.raises(WeightsError, match=rf"m\.gguf: tensor 'blk\.0\.attn_v\.weight' has GGML type {gtype}, "
                                           r"which rlx does not run \(block types it runs: Q8_0, "):
        GGUFFile(p)


def test_unknown_tensor_and_arch(tmp_path):
    p = tmp_path / "m.gguf"
    write_model(p, LLAMA, extra_tensors={"blk.0.attn_qkv.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(WeightsError, match=r"m\.gguf: unknown tensor 'blk\.0\.attn_qkv\.weight'.*'llama'"):
        GGUFFile(p)
    # a Qwen3-only tensor in a Llama file
    write_model(p, LLAMA, extra_tensors={"blk.0.attn_q_norm.weight": np.zeros(16, np.float32)})
    with pytest.raises(WeightsError, match="unknown tensor 'blk.0.attn_q_norm.weight'"):
        GGUFFile(p)
    w = gguf.GGUFWriter(str(p), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WeightsError, match=r"m\.gguf: architecture 'gpt2'.*not supported"):
        GGUFFile(p)


@pytest.mark.parametrize("key", ["llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                                 "llama.attention.head_count", "llama.context_length",
                                 "llama.attention.layer_norm_rms_epsilon"])
def test_missing_required_key(tmp_path, key):
    write_model(tmp_path / "m.gguf", LLAMA, drop_kv=(key,))
    f = GGUFFile(tmp_path / "m.gguf")  # the file itself reads fine
    with pytest.raises(ConfigError, match=rf"m\.gguf: missing required metadata key '{key}'"):
        config_from_gguf(f)


def test_wrong_key_type(tmp_path):
    write_model(tmp_path / "m.gguf", LLAMA, extra_kv={"llama.block_count": ("string", "2")})
    with pytest.raises(ConfigError, match=r"m\.gguf: metadata key 'llama.block_count' must be int, got str 2"):
        config_from_gguf(tmp_path / "m.gguf")


def test_bad_header_values(tmp_path):
    p = tmp_path / "m.gguf"
    write_model(p, LLAMA)
    raw = bytearray(p.read_bytes())
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGML" + raw[4:])
    with pytest.raises(WeightsError, match="magic.gguf: not a GGUF file"):
        GGUFFile(bad)
    struct.pack_into("<I", raw, 4, 2)  # v2 has v3's layout (v3 added big-endian files)
    bad.write_bytes(bytes(raw))
    assert GGUFFile(bad).version == 2 and config_from_gguf(bad) == config_from_dict(LLAMA)
    for version, msg in ((1, "version 1 is not supported"), (3 << 24, "big-endian")):
        struct.pack_into("<I", raw, 4, version)
        bad.write_bytes(bytes(raw))
        with pytest.raises(WeightsError, match=msg):
            GGUFFile(bad)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(WeightsError, match="empty.gguf: not a GGUF file"):
        GGUFFile(tmp_path / "empty.gguf")


def test_partial_biases_refused(tmp_path):
    write_model(tmp_path / "m.gguf", LLAMA, extra_tensors={"blk.0.attn_q.bias": np.zeros(64, np.float32)})
    with pytest.raises(ConfigError, match="attention biases on q_proj only"):
        config_from_gguf(tmp_path / "m.gguf")


def test_vocab_mismatch_refused(tmp_path):
    write_model(tmp_path / "m.gguf", LLAMA, vocab=False, extra_kv={"tokenizer.ggml.tokens": ("array", ["a", "b"])})
    with pytest.raises(ConfigError, match="token_embd.weight has 96 rows but tokenizer.ggml.tokens holds 2"):
        config_from_gguf(tmp_path / "m.gguf")
