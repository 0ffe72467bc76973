"""Quantisation (rlx/quantize.py, csrc/core/quantize.c) against things rlx did not write.

- BF16, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: bytes identical to gguf-py's quantize on random data and
  edge cases (zero and constant blocks, huge and tiny magnitudes, exact halves, blocks so small that
  the inverse of their scale overflows).
- Q2_K .. Q6_K (gguf-py cannot quantise them): decoded here from the bytes (the decoding checked
  against gguf-py's dequantize), (a) every element's code is the level of its group nearest to it
  given the stored scale and minimum (llama.cpp's final rounding pass gives that; so does rlx's,
  which is the same pass), and (b) on N(0, 1) data the error relative to the data's RMS is below
      bound = 1.25 * step / sqrt(12),   step = E[spread of a group] / (levels - 1)
  (a uniform quantiser's RMS error, the group's expected range for the affine types Q2_K / Q4_K /
  Q5_K, twice its expected largest magnitude for the symmetric Q3_K / Q6_K): Q2_K 0.42 (16 values,
  range 3.53, 4 levels), Q3_K 0.18 (max 1.77, 8 levels over 2 max), Q4_K 0.098 (32 values, range
  4.07, 16 levels), Q5_K 0.047 (32 levels), Q6_K 0.022 (64 levels). Measured: 0.297, 0.150,
  0.0714, 0.0362, 0.0177 (the scale searches beat the plain grid), so Q6_K < Q5_K < Q4_K < Q3_K <
  Q2_K. With llama-cpp-python installed, the bytes of every block type equal those of llama.cpp's
  own reference quantisers (ggml's quantize_row_*_ref, through ctypes).
- The recipes: per-tensor types as documented (llama.cpp's llama_tensor_get_type), and with
  llama-cpp-python, the files rlx writes equal llama-quantize's, tensor for tensor, type and bytes.
- rlx.quantize(HF dir) -> a file gguf-py's GGUFReader reads, with the hyperparameters, the permuted
  q / k, rope_freqs and the recipe's types; stories260K (trained; hidden 64, so K types fall back
  as in llama.cpp) keeps llama2.c's 64 greedy tokens at q8_0 and q4_k_m (measured: q2_k, which is
  q4_0 there, diverges at token 23), and its tokenizer from the file encodes as SentencePiece does;
  a Qwen2 tokenizer.json written by transformers passes llama.cpp's qwen2 vectors from the file.
- Random-weight Llama (8 layers, GQA 4, Llama 3 RoPE) and Qwen3 (4 layers, tied) of hidden 256,
  from the file vs f32, teacher-forced over 32 positions on the ref backend (measured: mean KL in
  nats / top-1 agreement; random models' logits are nearly flat, so top-1 is a weak measure):
      Llama q8_0 3.9e-4 / 0.94, q6_k 3.3e-3 / 0.81, q4_k_m 5.5e-2 / 0.53, q4_0 8.3e-2 / 0.41
      Qwen3 q8_0 1.8e-4 / 0.94, q6_k 2.0e-3 / 0.88, q4_k_m 2.4e-2 / 0.56, q4_0 3.7e-2 / 0.56
  stories260K, teacher-forced over llama2.c's 69 tokens (68 positions; not asserted here): q8_0
  2.2e-4 / 1.00, q4_k_m 6.4e-3 / 1.00, q3_k_m 2.3e-2 / 0.91, q4_0 4.1e-2 / 0.88.
- dtype="q8_0" / "q4_k_m" at load gives the same logits, bit for bit, as the file rlx writes.
- Bad input: clear errors, and no partial file.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

import rlx
from rlx import _C
from rlx.gguf import GGUFFile, llama3_rope_factors, permute_qk
from rlx.quantize import RECIPES, tensor_type
from rlx.weights import Packed, expected_weights

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K"
VECTORS = SHARED / "tokenizers" / "vectors"
BLOCK32 = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
K_TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


def ggml(name: str) -> T:
    return T[name.upper()]


# ---------------------------------------------------------------------------------------------
# Test models: random-weight Hugging Face directories
# ---------------------------------------------------------------------------------------------

LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "bos_token_id": 1,
         "eos_token_id": 2, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
QWEN3 = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True,
         "eos_token_id": 3}


def make_hf(path: Path, config: dict, seed: int = 0, dtype=np.float32) -> Path:
    """A Hugging Face directory: config.json and random weights (norms near 1, matrices of
    standard deviation 1 / sqrt(in_features)) in model.safetensors."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    cfg = rlx.load_config(path)
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in expected_weights(cfg).items():
        a = 1.0 + 0.2 * rng.standard_normal(shape) if name.endswith("norm.weight") else \
            rng.standard_normal(shape) / np.sqrt(shape[-1])
        w[name] = a.astype(dtype)
    save_file(w, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantize_models")
    return {"llama": make_hf(root / "llama", LLAMA), "qwen3": make_hf(root / "qwen3", QWEN3, seed=1)}


# ---------------------------------------------------------------------------------------------
# The 32-element types, bf16 and f16: bytes identical to gguf-py
# ---------------------------------------------------------------------------------------------

HUGE = {"bf16": 3e38, "f16": 6e4, "q8_0": 1e6, "q4_0": 1e5, "q4_1": 3e4, "q5_0": 1e5, "q5_1": 3e4}


def edge_rows(cols: int, huge: float, seed: int = 0) -> np.ndarray:
    """(22, cols) float32: Gaussian rows of scales from 1e-6 to huge / 10, and the edge cases."""
    rng = np.random.default_rng(seed)

    def g():
        return rng.standard_normal(cols)

    rows = [g() * s for s in np.logspace(-6, np.log10(huge) - 1, 8)]
    rows += [np.zeros(cols), np.full(cols, 0.3), np.full(cols, -7.25),
             np.where(np.arange(cols) // 32 % 2, g(), 0.0),           # zero blocks between others
             np.repeat(rng.standard_normal(cols // 32), 32),           # constant blocks
             g() * huge / 5, np.clip(g(), -5, 5) * huge / 5,           # up to `huge`
             g() * 1e-30, g() * 1e-39,                                 # tiny; subnormal (1/d overflows)
             np.tile(np.r_[127.0, np.arange(-15.5, 15.5)], cols // 32),   # exact halves at d = 1
             np.tile(np.r_[-8.0, np.arange(-7.5, 8.0, 0.5)], cols // 32),
             np.abs(g()), -np.abs(g()),
             np.where(np.arange(cols) % 32 == 5, 1e3, 1e-3 * g())]     # one outlier per block
    return np.asarray(rows, np.float32)


@pytest.mark.parametrize("name", ["bf16", "f16"] + BLOCK32)
def test_bytes_identical_to_gguf_py(name):
    x = edge_rows(256, HUGE[name])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gguf-py casts the subnormal rows' NaN to integers
        want = np.ascontiguousarray(gq.quantize(x, ggml(name))).view(np.uint8).reshape(len(x), -1)
    got = _C.quantize(x, name)
    assert got.shape == want.shape and got.dtype == np.uint8
    bad = [r for r in range(len(x)) if not np.array_equal(got[r], want[r])]
    assert not bad, f"{name}: rows {bad} differ from gguf-py"


def test_quantize_takes_any_float_array_and_leading_dims():
    x = np.random.default_rng(1).standard_normal((2, 3, 64))
    got = _C.quantize(x, "q8_0")  # float64, 3-D: converted, rows = 6
    assert got.shape == (6, 68)
    assert np.array_equal(got, _C.quantize(x.astype(np.float32).reshape(6, 64), "q8_0"))
    assert _C.quantize(np.zeros(32, np.float32), "q4_0").shape == (1, 18)


@pytest.mark.parametrize("name, value, match", [
    ("q8_0", np.nan, "row 1, column 37 holds NaN"), ("q4_k", np.inf, "row 1, column 37 holds an infinity"),
    ("f32", -np.inf, "holds an infinity"),
    ("q8_0", 1e7, "row 1, block 1 .* f16 scale overflows"), ("q4_1", -1e5, "block 1"), ("q6_k", 1e9, "block 0"),
    ("q2_k", 1e9, "block 0"), ("f16", 7e4, "row 1, column 37"), ("bf16", 3.4e38, "past the largest finite bf16"),
])
def test_bad_values_are_named(name, value, match):
    x = np.zeros((2, 256), np.float32)
    x[1, 37] = value
    with pytest.raises(ValueError, match=match):
        _C.quantize(x, name)


def test_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match="whole number of blocks"):
        _C.quantize(np.zeros((2, 100), np.float32), "q4_k")
    with pytest.raises(ValueError, match="holds no real numbers"):
        _C.quantize(np.zeros((1, 4), np.float32), "i32")
    with pytest.raises(ValueError, match="unknown dtype"):
        _C.quantize(np.zeros((1, 32), np.float32), "q9_0")
    with pytest.raises(ValueError, match="at least one dimension"):
        _C.quantize(np.float32(1), "f32")


# ---------------------------------------------------------------------------------------------
# K types: nearest levels and error bounds, decoded here and checked against gguf-py
# ---------------------------------------------------------------------------------------------

CODES = {"q2_k": (0, 3), "q3_k": (-4, 3), "q4_k": (0, 15), "q5_k": (0, 31), "q6_k": (-32, 31)}
RMSE_BOUND = {"q2_k": 0.42, "q3_k": 0.18, "q4_k": 0.098, "q5_k": 0.047, "q6_k": 0.022}


def _half(raw: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(raw[:, at:at + 2]).view(np.float16).astype(np.float32)  # (blocks, 1)


def _k4_scales(s: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """6-bit scale and minimum of groups g (of 8) from the 12 packed bytes s (blocks, 12)."""
    s = s.astype(np.int32)
    lo = g < 4
    j = np.where(lo, g, g - 4)
    sc = np.where(lo, s[:, np.minimum(g, 3)] & 63, (s[:, np.minimum(g + 4, 11)] & 15) | (s[:, j] >> 6) << 4)
    m = np.where(lo, s[:, np.minimum(g + 4, 11)] & 63, (s[:, np.minimum(g + 4, 11)] >> 4) | (s[:, g] >> 6) << 4)
    return sc, m


def decode_k(name: str, raw: np.ndarray):
    """(codes, step, offset), each (blocks, 256), with value = step * code - offset, read from ggml's
    layouts of the K types (raw: (blocks, type_size) uint8)."""
    e = np.arange(256)
    h, k, l = e // 128, e % 128 // 32, e % 32
    raw = raw.astype(np.uint8)
    if name == "q2_k":
        sc, qs = raw[:, :16].astype(np.int32), raw[:, 16:80].astype(np.int32)
        q = (qs[:, 32 * h + l] >> (2 * k)) & 3
        return q, _half(raw, 80) * (sc[:, e // 16] & 15), _half(raw, 82) * (sc[:, e // 16] >> 4)
    if name == "q3_k":
        hm, qs, sp = (raw[:, a:b].astype(np.int32) for a, b in ((0, 32), (32, 96), (96, 108)))
        g = e // 16
        lo = np.where(g < 8, sp[:, g % 8] & 15, sp[:, g % 8] >> 4)
        sc = (lo | ((sp[:, 8 + g % 4] >> (2 * (g // 4))) & 3) << 4) - 32
        q = ((qs[:, 32 * h + l] >> (2 * k)) & 3) - np.where((hm[:, l] >> (4 * h + k)) & 1, 0, 4)
        return q, _half(raw, 108) * sc, np.zeros(q.shape, np.float32)
    if name in ("q4_k", "q5_k"):
        g = e // 32
        sc, m = _k4_scales(raw[:, 4:16], g)
        qs = raw[:, 16:144] if name == "q4_k" else raw[:, 48:176]
        q = (qs[:, 32 * (e // 64) + l].astype(np.int32) >> (4 * (g % 2))) & 15
        if name == "q5_k":
            q = q | ((raw[:, 16 + l].astype(np.int32) >> g) & 1) << 4
        return q, _half(raw, 0) * sc, _half(raw, 2) * m
    ql, qh = raw[:, :128].astype(np.int32), raw[:, 128:192].astype(np.int32)
    sc = np.ascontiguousarray(raw[:, 192:208]).view(np.int8).astype(np.float32)
    lo = (ql[:, 64 * h + 32 * (k % 2) + l] >> (4 * (k // 2))) & 15
    q = (lo | ((qh[:, 32 * h + l] >> (2 * k)) & 3) << 4) - 32
    return q, _half(raw, 208) * sc[:, e // 16], np.zeros(q.shape, np.float32)


def k_data(seed: int = 3) -> np.ndarray:
    """(40, 1024) float32: Gaussian rows at several scales, plus the edge rows."""
    rng = np.random.default_rng(seed)
    gauss = rng.standard_normal((32, 1024)) * np.logspace(-3, 3, 32)[:, None]
    return np.concatenate([gauss, edge_rows(1024, 1e4)[8:16]]).astype(np.float32)


@pytest.mark.parametrize("name", K_TYPES)
def test_k_codes_are_the_nearest_levels(name):
    x = k_data()
    raw = _C.quantize(x, name).reshape(-1, gguf.GGML_QUANT_SIZES[ggml(name)][1])
    q, step, off = decode_k(name, raw)
    xb = x.reshape(-1, 256)
    value = step * q.astype(np.float32) - off
    # the decoding is gguf-py's reading of the bytes
    assert np.allclose(value, gq.dequantize(raw, ggml(name)).reshape(value.shape), rtol=1e-6, atol=0)
    lo, hi = CODES[name]
    assert q.min() >= lo and q.max() <= hi
    levels = step[..., None] * np.arange(lo, hi + 1, dtype=np.float32) - off[..., None]
    best = np.abs(xb[..., None] - levels).min(-1)
    mine = np.abs(xb - value)
    slack = 1e-5 * np.abs(step) + 1e-30
    worse = mine > best + slack
    assert not worse.any(), (f"{name}: {worse.sum()} codes are not their group's nearest level, e.g. x = "
                             f"{xb[worse][:3]}, got {value[worse][:3]}, nearest error {best[worse][:3]}")
    assert np.all(value[np.all(xb == 0, axis=1)] == 0)  # a block of zeros stays zeros


def rel_rmse(name: str, x: np.ndarray) -> float:
    y = gq.dequantize(_C.quantize(x, name), ggml(name)).reshape(x.shape)
    return float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2)))


def test_k_error_bounds_and_order():
    x = np.random.default_rng(5).standard_normal((64, 1024)).astype(np.float32)
    err = {name: rel_rmse(name, x) for name in K_TYPES}
    for name in K_TYPES:
        assert err[name] < RMSE_BOUND[name], f"{name}: relative RMSE {err[name]:.4f} >= {RMSE_BOUND[name]}"
    assert err["q6_k"] < err["q5_k"] < err["q4_k"] < err["q3_k"] < err["q2_k"], err


def _ggml_lib():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (make bench installs it) is not here")
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(lib_dir.glob("libggml-base.so*"))
    if not libs:
        pytest.skip(f"no libggml-base.so under {lib_dir}")
    return ctypes.CDLL(str(libs[0]))


@pytest.mark.parametrize("name", BLOCK32 + K_TYPES)
def test_bytes_identical_to_llama_cpp_reference(name):
    """ggml's own reference quantisers (quantize_row_<type>_ref: what llama-quantize runs without an
    importance matrix), through ctypes."""
    lib = _ggml_lib()
    x = k_data(seed=11)
    fn = getattr(lib, f"quantize_row_{name[:2]}_{'K' if name.endswith('_k') else name[-1]}_ref")
    bs, ts = gguf.GGML_QUANT_SIZES[ggml(name)]
    want = np.zeros((x.shape[0], x.shape[1] // bs * ts), np.uint8)
    fn(x.ctypes.data_as(ctypes.c_void_p), want.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
    got = _C.quantize(x, name)
    bad = [r for r in range(len(x)) if not np.array_equal(got[r], want[r])]
    assert not bad, f"{name}: rows {bad} differ from llama.cpp's reference quantiser"


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------

def _cfg(layers=16, heads=32, kv=8, model_type="llama", tied=False):
    cls = rlx.LlamaConfig if model_type == "llama" else rlx.Qwen3Config
    return cls(vocab_size=1024, hidden_size=4096, intermediate_size=4096, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=128, tie_word_embeddings=tied)


def types_by_layer(recipe: str, part: str, cfg) -> list[str]:
    return [tensor_type(recipe, f"blk.{i}.{part}.weight", (4096, 4096), cfg) for i in range(cfg.num_hidden_layers)]


def test_recipe_table():
    cfg = _cfg()
    more_bits = [0, 1, 4, 7, 10, 13, 14, 15]  # of 16 layers
    for r in ("q4_k_m", "q5_k_m"):
        base = RECIPES[r].default
        want = ["q6_k" if i in more_bits else base for i in range(16)]
        assert types_by_layer(r, "attn_v", cfg) == want and types_by_layer(r, "ffn_down", cfg) == want
        for part in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert set(types_by_layer(r, part, cfg)) == {base}
    assert types_by_layer("q4_k_s", "attn_v", cfg) == ["q5_k"] * 4 + ["q4_k"] * 12
    assert types_by_layer("q4_k_s", "ffn_down", cfg) == ["q5_k"] * 2 + ["q4_k"] * 14
    assert types_by_layer("q3_k_m", "attn_v", cfg) == ["q5_k"] * 2 + ["q4_k"] * 14
    assert types_by_layer("q3_k_m", "ffn_down", cfg) == ["q5_k"] + ["q4_k"] * 15
    assert set(types_by_layer("q3_k_m", "attn_output", cfg)) == {"q4_k"}
    assert set(types_by_layer("q3_k_l", "attn_v", cfg)) == {"q5_k"}
    assert set(types_by_layer("q3_k_s", "attn_v", cfg)) == {"q3_k"}
    # q2_k: attn_v by GQA (32 / 8 = 4 here), ffn_down and attn_output q3_k
    assert set(types_by_layer("q2_k", "attn_v", cfg)) == {"q4_k"}
    assert set(types_by_layer("q2_k", "attn_v", _cfg(kv=32))) == {"q3_k"}
    assert set(types_by_layer("q2_k", "ffn_down", cfg)) == set(types_by_layer("q2_k", "attn_output", cfg)) == {"q3_k"}
    assert set(types_by_layer("q2_k", "ffn_up", cfg)) == {"q2_k"}
    # the output, and token_embd: output-like only when tied
    for r in RECIPES.values():
        out = tensor_type(r, "output.weight", (1024, 4096), cfg)
        assert out == (r.default if r.default in ("f32", "f16", "bf16", "q8_0") or not r.rules else "q6_k")
        assert tensor_type(r, "token_embd.weight", (1024, 4096), cfg) == r.default
        assert tensor_type(r, "token_embd.weight", (1024, 4096), _cfg(tied=True)) == out
        assert tensor_type(r, "blk.0.attn_norm.weight", (4096,), cfg) is None
        assert tensor_type(r, "blk.0.attn_q.bias", (4096,), cfg) is None
        assert tensor_type(r, "rope_freqs.weight", (64,), cfg) is None
    # pure types: every matrix
    assert {tensor_type("q4_k", n, (1024, 4096), cfg) for n in ("output.weight", "blk.3.attn_v.weight")} == {"q4_k"}
    # llama.cpp's "70B": 80 Llama layers with GQA get q5_k for an attn_v of q3_k / q4_k
    big = _cfg(layers=80, heads=64, kv=8)
    by_layer = types_by_layer("q4_k_m", "attn_v", big)
    assert by_layer[11] == "q5_k" and by_layer[0] == "q6_k"
    assert types_by_layer("q4_k_m", "attn_v", _cfg(layers=80, heads=64, kv=64))[11] == "q4_k"
    assert types_by_layer("q4_k_m", "attn_v", _cfg(layers=80, heads=64, kv=8, model_type="qwen3"))[11] == "q4_k"


def test_recipe_shape_fallbacks():
    cfg = _cfg()

    def fit(r, name, cols):
        return tensor_type(r, name, (64, cols), cfg)

    assert [fit(r, "blk.0.attn_q.weight", 64) for r in ("q2_k", "q3_k_s", "q4_k_s", "q5_k_s", "q6_k")] == \
        ["q4_0", "q4_0", "q5_0", "q5_1", "q8_0"]
    assert {fit(r, "blk.0.ffn_down.weight", 172) for r in RECIPES if r not in ("f32", "bf16")} == {"f16"}
    assert fit("q4_k_m", "output.weight", 64) == "q8_0" and fit("q4_0", "output.weight", 64) == "q8_0"
    assert fit("q4_0", "output.weight", 256) == "q6_k"


def test_unknown_type():
    with pytest.raises(ValueError, match="unknown quantisation type 'q4_k_x'.*q4_k_m"):
        tensor_type("q4_k_x", "output.weight", (64, 64), _cfg())


def llama_quantize(src: Path, dst: Path, file_type: int) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = file_type
    p.nthread = 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), p) == 0


def tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("arch, recipes", [("llama", ["q4_0", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m", "q6_k"]),
                                           ("qwen3", ["q8_0", "q3_k_l", "q5_k_m"])])
def test_files_equal_llama_quantize(models, tmp_path, arch, recipes):
    """The f32 file rlx writes, quantised by llama.cpp's llama_model_quantize and by rlx.quantize:
    every tensor of the same type with the same bytes."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (make bench installs it) is not here")
    f32 = tmp_path / "f32.gguf"
    rlx.quantize(models[arch], f32, type="f32")
    for r in recipes:
        llama_quantize(f32, tmp_path / "llama.gguf", RECIPES[r].file_type)
        rlx.quantize(f32, tmp_path / "rlx.gguf", type=r)
        a, b = tensors(tmp_path / "llama.gguf"), tensors(tmp_path / "rlx.gguf")
        assert set(a) == set(b)
        types = {n: (a[n].tensor_type.name, b[n].tensor_type.name) for n in a if a[n].tensor_type != b[n].tensor_type}
        assert not types, f"{r}: types differ (llama.cpp, rlx): {types}"
        data = [n for n in a if not np.array_equal(np.asarray(a[n].data), np.asarray(b[n].data))]
        assert not data, f"{r}: bytes differ: {data}"


@pytest.mark.skipif(not (STORIES / "hf" / "model.safetensors").is_file(), reason=f"no stories260K under {STORIES}")
def test_stories_fallbacks_equal_llama_quantize(tmp_path):
    """Hidden 64, ffn 172: the K types fall back to 32-element blocks, ffn_down to f16."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (make bench installs it) is not here")
    f32 = tmp_path / "f32.gguf"
    rlx.quantize(STORIES / "hf", f32, type="f32")
    for r in ("q8_0", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m", "q6_k"):
        llama_quantize(f32, tmp_path / "llama.gguf", RECIPES[r].file_type)
        got = rlx.quantize(STORIES / "hf", tmp_path / "rlx.gguf", type=r)
        a, b = tensors(tmp_path / "llama.gguf"), tensors(tmp_path / "rlx.gguf")
        assert {n: t.tensor_type.name.lower() for n, t in a.items()} == got
        assert all(np.array_equal(np.asarray(a[n].data), np.asarray(b[n].data)) for n in a), r


# ---------------------------------------------------------------------------------------------
# Files from Hugging Face directories
# ---------------------------------------------------------------------------------------------

def test_llama_file_contents(models, tmp_path):
    src = models["llama"]
    cfg = rlx.load_config(src)
    hf = rlx.load_weights(src)
    dst = tmp_path / "llama.gguf"
    seen = []
    types = rlx.quantize(src, dst, type="q4_k_m", progress=lambda *a: seen.append(a))
    assert [s[:3] for s in seen] == [(i + 1, len(types), n) for i, n in enumerate(types)]
    r = gguf.GGUFReader(str(dst))
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    a = "llama."
    assert kv["general.architecture"] == "llama" and kv["general.file_type"] == 15
    assert kv["general.quantization_version"] == 2
    assert (kv[a + "block_count"], kv[a + "embedding_length"], kv[a + "feed_forward_length"],
            kv[a + "attention.head_count"], kv[a + "attention.head_count_kv"], kv[a + "context_length"],
            kv[a + "attention.key_length"], kv[a + "rope.dimension_count"]) == (8, 256, 512, 8, 2, 128, 32, 32)
    assert kv[a + "rope.freq_base"] == 500000.0 and np.isclose(kv[a + "attention.layer_norm_rms_epsilon"], 1e-5)
    assert kv[a + "rope.scaling.original_context_length"] == 64 and a + "rope.scaling.factor" not in kv
    t = {x.name: x for x in r.tensors}
    assert {n: x.tensor_type.name.lower() for n, x in t.items()} == types
    for n, x in t.items():
        want = tensor_type("q4_k_m", n, tuple(int(d) for d in reversed(x.shape)), cfg)
        assert types[n] == (want or "f32")
    assert "output.weight" in t and types["output.weight"] == "q6_k" and types["token_embd.weight"] == "q4_k"
    s = cfg.rope_scaling
    assert np.array_equal(np.asarray(t["rope_freqs.weight"].data), llama3_rope_factors(
        cfg.rope_theta, cfg.head_dim, s["factor"], s["low_freq_factor"], s["high_freq_factor"], 64))
    # q / k rows permuted as llama.cpp's converter does: the quantised rows of the permuted matrix
    q = np.asarray(t["blk.3.attn_q.weight"].data)
    assert np.array_equal(q, _C.quantize(permute_qk(np.asarray(hf["model.layers.3.self_attn.q_proj.weight"]), 8),
                                         types["blk.3.attn_q.weight"]))
    # read back: the same config (RoPE on adjacent pairs for the permuted rows)
    back = rlx.load_config(dst)
    assert back.rope_interleaved and {**back.to_dict(), "rope_interleaved": False} == cfg.to_dict()


def test_directory_without_a_tokenizer_gives_a_file_llama_cpp_runs(models, tmp_path, monkeypatch):
    """No tokenizer in the directory: the file says it has no vocabulary ("no_vocab"), which llama.cpp
    loads and runs on token ids (without the key it refused the file: "key not found in model:
    tokenizer.ggml.model"); rlx runs its ids, and rlx.load, which needs text, names the reason."""
    rlx.quantize(models["qwen3"], tmp_path / "q.gguf", type="q8_0")
    assert GGUFFile(tmp_path / "q.gguf").metadata["tokenizer.ggml.model"] == "no_vocab"
    with pytest.raises(rlx.ConfigError, match="no vocabulary"):
        rlx.load(tmp_path / "q.gguf")
    ours = rlx.Generator.from_pretrained(tmp_path / "q.gguf").prefill_get_last_logits([1, 2, 3])
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (make bench installs it) is not here")
    # llama.cpp's extra weight buffers off (its plain CPU buffers, as bench_fair's --llama-extra-bufts
    # off): with its AMX buffers it segfaults in the first eval of a quantized file on a CPU with AMX
    # (llama.cpp issue 20824; it took the whole pytest process down on the Intel Xeon)
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def plain_buffers():
        p = defaults()
        p.use_extra_bufts = False
        return p

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", plain_buffers)
    llm = llama_cpp.Llama(model_path=str(tmp_path / "q.gguf"), n_ctx=64, logits_all=True, verbose=False)
    assert not llm.model_params.use_extra_bufts
    llm.eval([1, 2, 3])
    theirs = np.asarray(llm.scores[2], dtype=np.float32)
    assert theirs.shape == ours.shape
    # the same next token, unless llama.cpp's top two are closer than the engines differ (a near tie)
    top2 = np.sort(theirs)[-2:]
    assert int(np.argmax(theirs)) == int(np.argmax(ours)) or top2[1] - top2[0] < 2 * np.abs(theirs - ours).max()


def test_tied_qwen3_file_has_no_output(models, tmp_path):
    types = rlx.quantize(models["qwen3"], tmp_path / "q.gguf", type="q6_k")
    assert "output.weight" not in types and types["token_embd.weight"] == "q6_k"
    assert types["blk.0.attn_q_norm.weight"] == "f32"
    cfg = rlx.load_config(tmp_path / "q.gguf")
    assert cfg.tie_word_embeddings and not cfg.rope_interleaved and cfg.head_dim == 64


def teacher_forced(gen, ids) -> np.ndarray:
    out = [gen.prefill_get_last_logits(ids[:1])]
    out += [gen.decode_get_logits(int(t)) for t in ids[1:]]
    return np.stack(out).astype(np.float64)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


# (mean KL bound in nats, top-1 agreement floor): about twice / below the measured values
LOGIT_BOUNDS = {"q8_0": (1e-3, 0.85), "q6_k": (1e-2, 0.7), "q4_k_m": (0.12, 0.4), "q4_0": (0.2, 0.3)}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_logits_from_quantised_files(models, tmp_path, device, arch):
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 256, 32)]
    p = log_softmax(teacher_forced(rlx.Generator.from_pretrained(models[arch], device=device, kv_dtype="f32"), ids))
    kl = {}
    for r, (kl_max, top1_min) in LOGIT_BOUNDS.items():
        rlx.quantize(models[arch], tmp_path / f"{r}.gguf", type=r)
        gen = rlx.Generator.from_pretrained(tmp_path / f"{r}.gguf", device=device, kv_dtype="f32")
        q = log_softmax(teacher_forced(gen, ids))
        kl[r] = float((np.exp(p) * (p - q)).sum(-1).mean())
        top1 = float((p.argmax(-1) == q.argmax(-1)).mean())
        assert kl[r] < kl_max and top1 >= top1_min, f"{arch} {r}: KL {kl[r]:.2e}, top-1 {top1:.3f}"
    assert kl["q8_0"] < kl["q6_k"] < kl["q4_k_m"] < kl["q4_0"], kl


@pytest.mark.parametrize("arch, recipe", [("llama", "q8_0"), ("llama", "q4_k_m"), ("qwen3", "q4_k_m")])
def test_dtype_at_load_equals_the_file(models, tmp_path, device, arch, recipe):
    """Generator(cfg, weights, dtype=recipe) reads the weights rlx.quantize writes, byte for byte (a
    Llama file's q / k rows in llama.cpp's order), and gives the file's logits: bit for bit on ref
    (which sums in double) and wherever the order is the same. A Llama file's RoPE on adjacent
    pairs sums a head's dot products in another order than on halves: within float32 summation
    order on devices with exact activations (vulkan: 1e-5 of the logits' scale); on cpu, whose
    products quantise their activations per block, that last-bit difference can send an element to
    the neighbouring integer of its block's grid, which moves the logits by a few percent (the
    activation rounding test_quant_models bounds by 5 % of the logits' scale, and measures up to
    2.9 %): within 5 % there, with the same greedy token where the margin exceeds the difference."""
    from rlx.quantize import quantize_weights

    src = models[arch]
    cfg = rlx.load_config(src)
    mem = rlx.Generator(cfg, rlx.load_weights(src), device=device, dtype=recipe, kv_dtype="f32")
    rlx.quantize(src, tmp_path / "m.gguf", type=recipe)
    gf = GGUFFile(tmp_path / "m.gguf")
    assert sum(mem.weight_dtypes.values()) == sum(1 for t in gf.tensors.values() if len(t.shape) == 2)
    f = rlx.Generator.from_pretrained(tmp_path / "m.gguf", device=device, kv_dtype="f32")
    assert mem.weight_dtypes == f.weight_dtypes
    in_memory = quantize_weights(cfg, rlx.load_weights(src), recipe)  # what dtype= gives the Generator
    for name, t in gf.tensors.items():
        got = in_memory[name]
        stored = t.data
        if gf.qk_permuted and (".q_proj." in name or ".k_proj." in name):
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            stored = rlx.gguf.unpermute_qk(stored, heads)
        if isinstance(got, Packed):
            assert got.dtype == t.type_name.lower() and np.array_equal(got.data, stored), name
        else:
            assert np.array_equal(np.asarray(got, dtype=stored.dtype), stored), name
    ids = [3, 77, 12, 250, 9, 41]
    for a, b in ((mem.prefill_get_last_logits(ids), f.prefill_get_last_logits(ids)),
                 (mem.decode_get_logits(5), f.decode_get_logits(5))):
        diff, scale = np.abs(a - b).max(), np.abs(b).max()
        if device == "ref" or not gf.qk_permuted:
            assert np.array_equal(a, b)
        elif device == "cpu":
            assert diff <= 0.05 * scale, (diff, scale)
            top2 = np.sort(b)[-2:]
            assert np.argmax(a) == np.argmax(b) or top2[1] - top2[0] <= 2 * diff
        else:
            assert diff <= 1e-5 * scale, (diff, scale)


def test_in_memory_packed_weights(models):
    from rlx.quantize import quantize_weights

    cfg = rlx.load_config(models["qwen3"])
    w = quantize_weights(cfg, rlx.load_weights(models["qwen3"]), "q8_0")
    name = "model.layers.0.mlp.up_proj.weight"
    assert isinstance(w[name], Packed) and w[name].dtype == "q8_0"
    assert quantize_weights(cfg, w, "q8_0")[name] is w[name]  # already that type: kept
    with pytest.raises(rlx.WeightsError, match="embed_tokens.weight' is packed q8_0; dtype='q4_0' asks for q6_k"):
        quantize_weights(cfg, w, "q4_0")
    with pytest.raises(ValueError, match="unknown quantisation type 'q7'"):
        rlx.Generator(cfg, rlx.load_weights(models["qwen3"]), device="ref", dtype="q7")
    f16 = quantize_weights(cfg, rlx.load_weights(models["qwen3"]), "f16")
    assert f16[name].dtype == np.float16 and f16["model.norm.weight"].dtype == np.float32


# ---------------------------------------------------------------------------------------------
# stories260K (a trained Llama with a SentencePiece tokenizer) and tokenizers
# ---------------------------------------------------------------------------------------------

needs_stories = pytest.mark.skipif(not (STORIES / "hf" / "model.safetensors").is_file(),
                                   reason=f"no stories260K under {STORIES}")
TEXTS = ["Once upon a time, there was a little girl named Lily.", "  two  spaces\nand a newline", "Tom said: \"No!\"",
         "1234 + 5678 = 6912", "ünïcödé and emoji 🙂", ""]


@needs_stories
@pytest.mark.parametrize("recipe", ["q8_0", "q4_k_m"])
def test_stories_keeps_llama2c_tokens(tmp_path, recipe):
    expected = json.loads((STORIES / "expected" / "greedy_once_upon_a_time.json").read_text())
    types = rlx.quantize(STORIES / "hf", tmp_path / "s.gguf", type=recipe)
    assert types["blk.0.ffn_down.weight"] == "f16" and types["token_embd.weight"] == "q8_0"
    model = rlx.load(tmp_path / "s.gguf", device="ref")
    stream = model.generate(expected["prompt"], max_new_tokens=64, stream=True)
    text = "".join(stream)
    assert stream.new_ids == expected["new_tokens"]
    assert expected["prompt"] + text == expected["text"]


@needs_stories
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("progress", [None, True])
def test_float_files_load(tmp_path, dtype, progress):
    """rlx.load of a file of 16- or 32-bit matrices (a bf16 file once raised "cannot include dtype
    'E' in a buffer" while its pages were read), the progress bar on or off: the logits of
    Generator.from_pretrained on the same file."""
    rlx.quantize(STORIES / "hf", tmp_path / "s.gguf", type=dtype)
    model = rlx.load(tmp_path / "s.gguf", progress=progress)
    ids = model.tokenizer.encode("Once upon a time")
    want = rlx.Generator.from_pretrained(tmp_path / "s.gguf").prefill_get_last_logits(ids)
    np.testing.assert_array_equal(model.generator.prefill_get_last_logits(ids), want)
    assert model.generate("Once upon a time", max_new_tokens=4)


@needs_stories
def test_stories_tokenizer_from_the_file(tmp_path):
    """As SentencePiece on text without runs of spaces (this model's SentencePiece normaliser
    collapses and strips spaces, which llama.cpp does not do); as llama.cpp on all text."""
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(STORIES / "hf" / "tok512.model"))
    rlx.quantize(STORIES / "hf", tmp_path / "s.gguf", type="q8_0")
    tok = rlx.Tokenizer.from_pretrained(tmp_path / "s.gguf")
    for text in TEXTS:
        if "  " not in text and text == text.strip():
            assert tok.encode(text) == [sp.bos_id()] + sp.encode(text), text
            assert tok.decode(tok.encode(text, add_bos=False)) == sp.decode(sp.encode(text))
    try:
        import llama_cpp
    except ImportError:
        return
    llm = llama_cpp.Llama(model_path=str(tmp_path / "s.gguf"), vocab_only=True, verbose=False)
    for text in TEXTS:
        assert tok.encode(text) == llm.tokenize(text.encode(), add_bos=True), text
    kv = GGUFFile(tmp_path / "s.gguf").metadata
    assert kv["tokenizer.ggml.model"] == "llama" and kv["tokenizer.ggml.bos_token_id"] == 1
    assert kv["tokenizer.ggml.eos_token_id"] == 2 and kv["tokenizer.ggml.add_space_prefix"] is True


@needs_stories
def test_dtype_at_load_from_a_directory(device):
    a = rlx.load(STORIES / "hf", device=device, dtype="q8_0")
    assert a.generator.weight_dtypes == {"q8_0": 31, "f16": 5}  # ffn_down (172 columns) falls back
    assert a.generate("Once upon a time", max_new_tokens=16) == \
        rlx.load(STORIES / "hf", device=device).generate("Once upon a time", max_new_tokens=16)
    g = rlx.Generator.from_pretrained(STORIES / "hf", device=device, dtype="q4_k_m")
    # q5_0 (q4_k's fallback); q8_0 for the embedding and the "more bits" attn_v (q6_k's fallback)
    assert g.weight_dtypes == {"q5_0": 28, "q8_0": 3, "f16": 5}


@needs_stories
def test_gguf_source_copies_metadata(tmp_path):
    rlx.quantize(STORIES / "hf", tmp_path / "f32.gguf", type="f32")
    rlx.quantize(STORIES / "hf", tmp_path / "direct.gguf", type="q8_0")
    rlx.quantize(tmp_path / "f32.gguf", tmp_path / "via.gguf", type="q8_0")
    src, via = GGUFFile(tmp_path / "f32.gguf"), GGUFFile(tmp_path / "via.gguf")
    changed = {"general.file_type"}
    for k, v in src.metadata.items():
        if k not in changed:
            assert k in via.metadata and via.value_type(k) == src.value_type(k), k
            assert np.array_equal(np.asarray(via.metadata[k]), np.asarray(v)), k
    assert via.metadata["general.file_type"] == 7
    direct = GGUFFile(tmp_path / "direct.gguf")
    assert list(direct.tensors) == list(via.tensors)
    assert all(np.array_equal(direct.tensors[n].data, t.data) for n, t in via.tensors.items())
    # a quantised source is requantised only when asked
    with pytest.raises(rlx.WeightsError, match="already q8_0; quantising it to q4_0 would quantise twice"):
        rlx.quantize(tmp_path / "via.gguf", tmp_path / "again.gguf", type="q4_0")
    assert not list(tmp_path.glob("again.gguf*"))
    types = rlx.quantize(tmp_path / "via.gguf", tmp_path / "again.gguf", type="q4_0", allow_requantize=True)
    assert types["blk.0.attn_q.weight"] == "q4_0" and types["blk.0.ffn_down.weight"] == "f16"
    assert np.array_equal(GGUFFile(tmp_path / "again.gguf").tensors["model.layers.0.mlp.down_proj.weight"].data,
                          via.tensors["model.layers.0.mlp.down_proj.weight"].data)  # f16 both: copied


@pytest.mark.skipif(not (SHARED / "tokenizers" / "qwen2" / "vocab.json").is_file()
                    or not (VECTORS / "ggml-vocab-qwen2.gguf.out").is_file(), reason="no shared Qwen2 tokenizer files")
def test_qwen2_bpe_tokenizer_from_a_directory(tmp_path):
    """transformers builds the Qwen2 tokenizer.json from vocab.json + merges.txt; the file rlx writes
    from it encodes llama.cpp's qwen2 test vectors exactly, and like transformers on text."""
    transformers = pytest.importorskip("transformers")
    from test_gguf_tokenizer import read_vectors

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / "qwen2"))
    src = make_hf(tmp_path / "qwen", {**QWEN3, "vocab_size": 151936, "hidden_size": 32, "intermediate_size": 32,
                                       "num_hidden_layers": 1, "head_dim": 16, "num_attention_heads": 2,
                                       "num_key_value_heads": 1})
    hf_tok.save_pretrained(str(src))
    rlx.quantize(src, tmp_path / "q.gguf", type="q8_0")
    tok = rlx.Tokenizer.from_pretrained(tmp_path / "q.gguf")
    assert tok.pre == "qwen2" and tok.model == "gpt2"
    for text, ids in read_vectors("qwen2"):
        assert tok.encode(text, add_bos=False, parse_special=False) == ids, text
    for text in TEXTS + ["<|im_start|>user\nhi<|im_end|>"]:
        assert tok.encode(text) == hf_tok.encode(text), text
    kv = GGUFFile(tmp_path / "q.gguf").metadata
    assert kv["tokenizer.ggml.token_type"][151644] == 3 and kv["tokenizer.ggml.tokens"][151935] == "[PAD151935]"
    # a pre-tokenizer llama.cpp has no name for is refused
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\w+"
    (src / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(rlx.ConfigError, match="pre-tokenizer .* is not one llama.cpp names"):
        rlx.quantize(src, tmp_path / "r.gguf", type="q8_0")


# ---------------------------------------------------------------------------------------------
# Command line and errors
# ---------------------------------------------------------------------------------------------

def test_command_line(models, tmp_path, capsys):
    from rlx.__main__ import main

    assert main(["quantize", str(models["qwen3"]), str(tmp_path / "c.gguf"), "--type", "q5_k_m", "--threads", "2"]) == 0
    err = capsys.readouterr().err
    assert "blk.0.attn_v.weight" in err and "-> q6_k" in err and "c.gguf: 46 tensors (17 f32, 24 q5_k, 5 q6_k)" in err
    assert GGUFFile(tmp_path / "c.gguf").metadata["general.file_type"] == 17
    assert main(["quantize", str(models["qwen3"]), str(tmp_path / "d.gguf"), "--type", "q9"]) == 2
    assert "unknown quantisation type 'q9'" in capsys.readouterr().err


def test_bad_inputs(models, tmp_path):
    src = models["qwen3"]
    with pytest.raises(ValueError, match="unknown quantisation type"):
        rlx.quantize(src, tmp_path / "x.gguf", type="q4_k_xl")
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        rlx.quantize(tmp_path / "nothing", tmp_path / "x.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        rlx.quantize(tmp_path / "empty", tmp_path / "x.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 9)
    with pytest.raises(rlx.WeightsError, match="truncated GGUF file"):
        rlx.quantize(tmp_path / "bad.gguf", tmp_path / "x.gguf")
    mistral = tmp_path / "mistral"
    shutil.copytree(src, mistral)
    (mistral / "config.json").write_text(json.dumps({**QWEN3, "model_type": "mistral"}))
    with pytest.raises(rlx.ConfigError, match="'mistral' is not supported"):
        rlx.quantize(mistral, tmp_path / "x.gguf")
    sliding = tmp_path / "sliding"
    shutil.copytree(src, sliding)
    (sliding / "config.json").write_text(json.dumps({**QWEN3, "use_sliding_window": True, "sliding_window": 8,
                                                     "max_window_layers": 1}))
    with pytest.raises(rlx.ConfigError, match="sliding window"):
        rlx.quantize(sliding, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="is the source file"):
        rlx.quantize(tmp_path / "bad.gguf", tmp_path / "bad.gguf")
    with pytest.raises(ValueError, match="threads must be a positive int"):
        rlx.quantize(src, tmp_path / "x.gguf", threads=0)
    with pytest.raises(ValueError, match="progress must be"):
        rlx.quantize(src, tmp_path / "x.gguf", progress="yes")
    assert not (tmp_path / "x.gguf").exists()


def test_nan_weights_leave_no_file(tmp_path):
    from safetensors.numpy import load_file, save_file

    src = make_hf(tmp_path / "m", {**QWEN3, "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64,
                                    "head_dim": 16})
    w = load_file(str(src / "model.safetensors"))
    w["model.layers.0.mlp.gate_proj.weight"][3, 5] = np.nan
    save_file(w, str(src / "model.safetensors"))
    with pytest.raises(rlx.WeightsError, match="'model.layers.0.mlp.gate_proj.weight': quantize to q8_0: row 3, "
                                               "column 5 holds NaN"):
        rlx.quantize(src, tmp_path / "n.gguf", type="q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no file, no partial file
