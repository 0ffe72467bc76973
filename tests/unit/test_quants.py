"""The GGUF block types of the dtype table against gguf-py (the `gguf` package, llama.cpp's own
Python reader): bytes per block, and the conversion of blocks to f32 bit for bit, on blocks
quantised by gguf-py from random data (where it can quantise the type) and on random bytes (every
bit pattern a file may hold, NaN and inf scales included).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import rlx
from rlx import _C

gguf = pytest.importorskip("gguf")
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf import quants as gq  # noqa: E402

BLOCK_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
QUANTIZABLE = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"}  # what gguf-py can quantise


def ggml_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name.upper()]


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_block_sizes_match_ggml(name):
    d = rlx.dtypes.DTYPES[name]
    assert (d.block_size, d.type_size) == GGML_QUANT_SIZES[ggml_type(name)]
    assert d.is_float and d.is_block and d.numpy is None


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bit for bit, any NaN equal to any NaN (gguf-py and C may quiet NaN payloads differently)."""
    both_nan = np.isnan(got) & np.isnan(want)
    return bool(np.all(both_nan | (got.view(np.uint32) == want.view(np.uint32))))


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_dequantize_random_bytes_bit_exact(name):
    rng = np.random.default_rng(7)
    bs, ts = GGML_QUANT_SIZES[ggml_type(name)]
    raw = rng.integers(0, 256, size=(97, ts), dtype=np.uint8)
    with np.errstate(all="ignore"):  # random scales hold NaN and inf
        want = gq.dequantize(raw, ggml_type(name)).reshape(-1).astype(np.float32)
    got = _C.to_f32(raw.reshape(-1), name)
    assert got.shape == (97 * bs,)
    assert same_bits(got, want)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_blocks_with_non_finite_scales_are_found_and_refused(name):
    # Oracle: gguf-py's dequantisation of a block holds a NaN or inf exactly when one of its f16
    # scales is (finite f16 scales times small integers stay finite in float32).
    rng = np.random.default_rng(9)
    bs, ts = GGML_QUANT_SIZES[ggml_type(name)]
    raw = rng.integers(0, 256, size=(400, ts), dtype=np.uint8)
    with np.errstate(all="ignore"):
        bad = ~np.isfinite(gq.dequantize(raw, ggml_type(name)).reshape(400, bs)).all(axis=1)
    assert 0 < bad.sum() < 400  # random bytes give both kinds
    first = int(np.argmax(bad))
    assert _C.blocks_nonfinite(raw, name) == first
    assert _C.blocks_nonfinite(raw[~bad], name) == -1
    # a weight with one is refused when set, naming the block
    cfg = rlx.LlamaConfig(vocab_size=64, hidden_size=bs, intermediate_size=2 * bs, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=bs // 2,
                          max_position_embeddings=32, rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False)
    w = {n: (rng.standard_normal(sh) * 0.1).astype(np.float32) for n, sh in rlx.weights.expected_weights(cfg).items()}
    up = "model.layers.0.mlp.up_proj.weight"
    good = _C.quantize(w[up], name).reshape(-1, ts)  # (2 bs, bs) -> one block per row
    assert _C.blocks_nonfinite(good, name) == -1
    corrupt = good.copy()
    corrupt[5] = raw[first]
    w[up] = rlx.Packed(corrupt.reshape(2 * bs, -1), name, (2 * bs, bs))
    with pytest.raises(ValueError, match=re.escape(f"'{up}' ({name}): block 5 has a NaN or infinite scale")):
        rlx.Generator(cfg, w, device="ref")
    w[up] = rlx.Packed(good.reshape(2 * bs, -1), name, (2 * bs, bs))
    rlx.Generator(cfg, w, device="ref")
    w[up] = rlx.Packed(good, name, (2 * bs, bs))
    rlx.Generator(cfg, w, device="ref")


@pytest.mark.parametrize("name", sorted(QUANTIZABLE))
def test_dequantize_quantized_data_bit_exact(name):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((16, 256)) * rng.uniform(0.01, 3, (16, 1))).astype(np.float32)
    raw = gq.quantize(x, ggml_type(name))
    want = gq.dequantize(raw, ggml_type(name)).astype(np.float32)
    got = _C.to_f32(np.ascontiguousarray(raw).reshape(-1), name).reshape(want.shape)
    assert same_bits(got, want)
    assert np.abs(got - x).max() < 0.2 * np.abs(x).max()  # and it is the data, roughly


def test_partial_blocks_refused():
    with pytest.raises(ValueError, match="whole"):
        _C.to_f32(np.zeros(35, np.uint8), "q8_0")
    with pytest.raises(ValueError, match="unknown dtype"):
        _C.to_f32(np.zeros(34, np.uint8), "q9_0")
