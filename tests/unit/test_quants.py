"""The GGUF block types of the dtype table against gguf-py (the `gguf` package, llama.cpp's own
Python reader): bytes per block, and the conversion of blocks to f32 bit for bit, on blocks
quantised by gguf-py from random data (where it can quantise the type) and on random bytes (every
bit pattern a file may hold, NaN and inf scales included).
"""

from __future__ import annotations

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
