"""Weights: loading Hugging Face safetensors directories and checking tensors against a config.

`load_weights(path)` returns {HF tensor name: np.ndarray}, read-only:
- float32 tensors are zero-copy views of a read-only memory map of the file (no copy of the
  weights is made; the map stays open as long as an array refers to it). The one exception: a
  float32 tensor whose data is not 4-byte aligned in the file (possible only after an odd-sized
  f16/bf16 tensor; never in files transformers writes) is copied, because C reads aligned floats;
- float16 and bfloat16 tensors stay in their stored dtype, zero-copy too: np.float16 and
  ml_dtypes.bfloat16 views of the map (the kernels read bf16 / f16 weights directly).
Other stored dtypes are refused with WeightsError.

The `safetensors` package validates each file (safe_open); rlx then parses the header itself
(8-byte little-endian length, then JSON {name: {dtype, shape, data_offsets}}) to locate each
tensor in the map, because safetensors' NumPy path copies. Any truncated or malformed file
raises WeightsError naming the file.

`expected_weights(cfg)` lists every tensor the decoder needs with its HF shape (from the C
decoder builder, the one place the names live), and `check_weights(cfg, weights)` verifies a dict
(loaded or built in memory) against it, keeping each tensor's own dtype.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct

import numpy as np

from rlx import _C
from rlx import dtypes as _dtypes
from rlx.errors import WeightsError

__all__ = ["load_weights", "expected_weights", "check_weights", "block_params", "dtype_summary", "Packed"]

# safetensors dtype names rlx reads -> rlx dtypes (sizes and NumPy dtypes come from rlx.dtypes)
_SAFETENSORS = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
_MAX_MESSAGE = 2000


def _parse_header(path: str, size: int) -> tuple[int, dict]:
    """(data start offset, header dict) of a safetensors file; WeightsError when malformed."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise WeightsError(f"{path}: truncated safetensors file (header of {n} bytes, file of {size})")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{path}: malformed safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: malformed safetensors header (not a JSON object)")
    return 8 + n, header


def _load_file(path: str, out: dict[str, np.ndarray]) -> None:
    """Adds every tensor of one safetensors file to out."""
    from safetensors import safe_open  # imported here so `import rlx` stays light

    try:
        with safe_open(path, framework="numpy") as f:
            names = list(f.keys())
    except Exception as e:  # SafetensorError and OSError both mean: not a usable file
        raise WeightsError(f"{path}: not a valid safetensors file ({e})") from None
    size = os.path.getsize(path)
    start, header = _parse_header(path, size)
    data = np.memmap(path, dtype=np.uint8, mode="r") if size > start else np.zeros(0, np.uint8)
    for name in names:
        info = header.get(name)
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError) as e:
            raise WeightsError(f"{path}: malformed header entry for tensor '{name}' ({e})") from None
        if dtype not in _SAFETENSORS:
            raise WeightsError(f"{path}: tensor '{name}' has dtype {dtype}; rlx reads F32, F16 and BF16")
        numel = int(np.prod(shape, dtype=np.int64))
        rdt = _dtypes.DTYPES[_SAFETENSORS[dtype]]
        if end - begin != numel * rdt.type_size or start + end > size:
            raise WeightsError(f"{path}: tensor '{name}' data_offsets {begin}..{end} do not fit shape {shape} "
                               f"{dtype} in a file of {size} bytes")
        raw = data[start + begin: start + end]
        arr = raw.view(rdt.numpy).reshape(shape)  # zero-copy, read-only memmap view
        if not arr.flags.aligned:  # only after odd-sized 16-bit tensors; C reads aligned values
            arr = arr.copy()
        arr.flags.writeable = False
        out[name] = arr


def load_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Loads a Hugging Face directory (model.safetensors, or shards listed by
    model.safetensors.index.json), a single .safetensors file, or a GGUF file (block-quantized
    tensors as Packed, executed packed) into {name: read-only array}."""
    path = os.fspath(path)
    from rlx import gguf  # imported here: rlx.gguf imports rlx.config, which is light

    if gguf.is_gguf(path):
        return gguf.model_weights(path)
    weight_map: dict | None = None
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.isfile(index):
            try:
                with open(index, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
                shards = sorted(set(weight_map.values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise WeightsError(f"{index}: malformed index ({e!r})") from None
            files = [os.path.join(path, s) for s in shards]
            for fpath in files:
                if not os.path.isfile(fpath):
                    raise WeightsError(f"{index}: shard {os.path.basename(fpath)} does not exist")
        elif os.path.isfile(single):
            files = [single]
        else:
            raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")
    else:
        raise FileNotFoundError(f"no such file or directory: {path}")

    out: dict[str, np.ndarray] = {}
    for fpath in files:
        _load_file(fpath, out)
    if weight_map is not None:
        missing = [n for n in weight_map if n not in out]
        if missing:
            raise WeightsError(f"{path}: tensors listed in the index but absent from the shards: {missing[:10]}")
    return out


@dataclasses.dataclass(frozen=True)
class Packed:
    """A weight of a block dtype (q8_0, ...) kept packed: its raw blocks (a C-contiguous uint8
    array whose rows are the tensor's rows), the dtype's name, and the logical shape in elements
    (Hugging Face order, e.g. (out_features, in_features))."""

    data: np.ndarray
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        d = _dtypes.parse(self.dtype)
        if not isinstance(self.data, np.ndarray) or self.data.dtype != np.uint8:
            raise WeightsError(f"packed {d.name} weight: data must be a uint8 array")
        if self.data.nbytes != _dtypes.nbytes(d, self.shape):
            raise WeightsError(f"packed {d.name} weight of shape {self.shape}: {self.data.nbytes} bytes, "
                               f"expected {_dtypes.nbytes(d, self.shape)}")

    def raw(self) -> tuple:
        """The (raw blocks, dtype, shape) tuple rlx._C.Model takes."""
        return (np.ascontiguousarray(self.data), _dtypes.parse(self.dtype).name, tuple(self.shape))


def _c_config(cfg) -> dict:
    """The fields the C core reads, with each layer's sliding window resolved."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "qk_norm": cfg.qk_norm,
        "rope_interleaved": cfg.rope_interleaved,
        "layer_windows": [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)],
    }


_KINDS = {0: "matrix", 1: "vector", 2: "derived"}


def block_params(cfg, block=None) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every tensor a block of the decoder reads, in the order the C builder
    makes them (the names live in the C decoder builder and nowhere else). kind: "matrix" (a
    projection, the embedding or the LM head: any real-valued dtype), "vector" (norms and biases:
    float32) or "derived" (rope.inv_freq, computed from the config). block: an
    rlx.distributed.BlockSpec, or None for the whole model."""
    begin, end, embed, head = (0, cfg.num_hidden_layers, True, True) if block is None else (
        block.layer_begin, block.layer_end, block.embed, block.head)
    rows = _C.decoder_params(_c_config(cfg), begin, end, embed, head)
    return [(name, tuple(shape), _KINDS[kind]) for name, shape, kind in rows]


def expected_weights(cfg, block=None) -> dict[str, tuple[int, ...]]:
    """Every tensor the decoder (or a block of it) reads from a file, with its Hugging Face shape, in
    layer order. Projections are stored (out_features, in_features). attention_bias adds biases to
    q, k, v AND o; mlp_bias to gate, up and down; qk_norm (Qwen3) adds per-head q_norm / k_norm of
    (head_dim,). lm_head.weight is listed only when embeddings are not tied."""
    return {name: shape for name, shape, kind in block_params(cfg, block) if kind != "derived"}


def _shape_of(arr) -> tuple[int, ...]:
    return tuple(arr.shape) if isinstance(arr, (np.ndarray, Packed)) else tuple(np.shape(arr))


def check_weights(cfg, weights: dict, block=None, dtype: str | None = None) -> dict:
    """Checks weights against `expected_weights(cfg, block)` and returns {name: value} holding
    exactly the expected names, ready for the C model: each matrix in its own dtype (float32,
    float16, bfloat16 arrays, or Packed block weights), or converted to `dtype` when given: "f32",
    "bf16", "f16", or a block type / quantisation recipe ("q8_0", "q4_k_m": each matrix quantised
    as rlx.quantize would write it, see rlx/quantize.py); norms and biases as float32. block narrows the expected names to a pipeline
    stage's block: names outside it are neither required nor reported as extra. Missing, extra or
    mis-shaped tensors raise one WeightsError listing every problem (tensor name, expected and
    actual shapes; the message is capped in length). A tied model may carry an lm_head.weight of
    shape (V, H): it is ignored. Arrays already in the wanted dtype and layout are returned as they
    are (zero-copy); others are converted once (rounding to nearest even when narrowing)."""
    if dtype is not None and dtype not in ("f32", "bf16", "f16"):
        from rlx.quantize import quantize_weights  # ValueError naming the known types

        weights, dtype = quantize_weights(cfg, weights, dtype), None
    params = {name: (shape, kind) for name, shape, kind in block_params(cfg, block) if kind != "derived"}
    whole = None if block is None else set(expected_weights(cfg))
    problems: list[str] = []
    out: dict = {}
    f32 = _dtypes.DTYPES["f32"].numpy
    for name, (shape, kind) in params.items():
        if name not in weights:
            problems.append(f"missing tensor '{name}' (expected shape {shape})")
            continue
        arr = weights[name]
        if not isinstance(arr, (np.ndarray, Packed)):
            arr = np.asarray(arr)
        if _shape_of(arr) != shape:
            problems.append(f"tensor '{name}' has shape {_shape_of(arr)}, expected {shape}")
            continue
        if isinstance(arr, Packed):
            if kind != "matrix" or (dtype is not None and dtype != _dtypes.parse(arr.dtype).name):
                problems.append(f"tensor '{name}' is packed {arr.dtype}; " + (
                    "only matrices may be packed" if kind != "matrix" else f"it cannot be converted to {dtype}"))
                continue
            out[name] = arr.raw()
            continue
        have = _dtypes.of_array(arr)
        if arr.dtype.kind != "f" and not (have is not None and have.is_float):
            problems.append(f"tensor '{name}' has dtype {arr.dtype}, expected a float dtype (incl. bfloat16)")
            continue
        kept = arr.dtype if have is not None else f32  # float64 and other floats: float32, once
        want = (_dtypes.DTYPES[dtype].numpy if dtype else kept) if kind == "matrix" else f32
        if arr.dtype != want or not arr.flags.c_contiguous or not arr.flags.aligned:
            arr = np.ascontiguousarray(arr.astype(want, copy=False))
        out[name] = arr
    for name in weights:
        if name in params or (whole is not None and name in whole):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            shape = _shape_of(weights[name])
            if shape != (cfg.vocab_size, cfg.hidden_size):
                problems.append(f"tensor '{name}' has shape {shape}, expected {(cfg.vocab_size, cfg.hidden_size)} "
                                "(tied embeddings: it would be ignored)")
            continue
        problems.append(f"unexpected tensor '{name}' (shape {_shape_of(weights[name])})")
    if problems:
        msg = f"{len(problems)} weight problem(s): " + "; ".join(problems)
        if len(msg) > _MAX_MESSAGE:
            msg = msg[:_MAX_MESSAGE] + " ..."
        raise WeightsError(msg)
    return out


def dtype_summary(cfg, weights: dict, block=None) -> dict[str, int]:
    """{dtype name: number of matrices} of checked weights (arrays and packed tuples): the dtypes
    the projections, embedding and LM head are computed from (norms and biases are float32)."""
    counts: dict[str, int] = {}
    for name, _, kind in block_params(cfg, block):
        if kind == "matrix" and name in weights:
            v = weights[name]
            dt = v[1] if isinstance(v, tuple) else _dtypes.of_array(v).name
            counts[dt] = counts.get(dt, 0) + 1
    return counts
