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

`expected_weights(cfg)` lists every tensor the decoder needs with its HF shape, and
`check_weights(cfg, weights)` verifies a dict (loaded or built in memory) against it.
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

from rlx.errors import WeightsError

__all__ = ["load_weights", "expected_weights", "check_weights", "weight_dtype_of", "WEIGHT_DTYPES"]

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
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
        if dtype not in _ITEMSIZE:
            raise WeightsError(f"{path}: tensor '{name}' has dtype {dtype}; rlx reads F32, F16 and BF16")
        numel = int(np.prod(shape, dtype=np.int64))
        if end - begin != numel * _ITEMSIZE[dtype] or start + end > size:
            raise WeightsError(f"{path}: tensor '{name}' data_offsets {begin}..{end} do not fit shape {shape} "
                               f"{dtype} in a file of {size} bytes")
        raw = data[start + begin: start + end]
        if dtype == "F32":
            arr = raw.view(np.float32).reshape(shape)  # zero-copy, read-only memmap view
            if not arr.flags.aligned:  # only after odd-sized f16/bf16 tensors; C needs 4-byte alignment
                arr = arr.copy()
        else:  # F16 / BF16: zero-copy 16-bit views (2-byte alignment always holds in safetensors)
            arr = raw.view(np.float16 if dtype == "F16" else ml_dtypes.bfloat16).reshape(shape)
            if not arr.flags.aligned:
                arr = arr.copy()
        arr.flags.writeable = False
        out[name] = arr


def load_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Loads a Hugging Face directory (model.safetensors, or shards listed by
    model.safetensors.index.json) or a single .safetensors file into {name: read-only array}."""
    path = os.fspath(path)
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


def expected_weights(cfg) -> dict[str, tuple[int, ...]]:
    """Every tensor the decoder reads, with its Hugging Face shape, in layer order. Projections
    are stored (out_features, in_features). attention_bias adds biases to q, k, v AND o;
    mlp_bias to gate, up and down; qk_norm (Qwen3) adds per-head q_norm / k_norm of (head_dim,).
    lm_head.weight is listed only when embeddings are not tied."""
    H, D, I, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    q_out, kv_out = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        proj = {"q_proj": (q_out, H), "k_proj": (kv_out, H), "v_proj": (kv_out, H), "o_proj": (H, q_out)}
        for name, shape in proj.items():
            shapes[p + f"self_attn.{name}.weight"] = shape
            if cfg.attention_bias:
                shapes[p + f"self_attn.{name}.bias"] = (shape[0],)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (D,)
            shapes[p + "self_attn.k_norm.weight"] = (D,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        for name, shape in {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}.items():
            shapes[p + f"mlp.{name}.weight"] = shape
            if cfg.mlp_bias:
                shapes[p + f"mlp.{name}.bias"] = (shape[0],)
    shapes["model.norm.weight"] = (H,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


WEIGHT_DTYPES = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16), "f16": np.dtype(np.float16)}


def weight_dtype_of(cfg, weights: dict) -> str:
    """The dtype the 2-D weights (projections, embedding, lm_head) are stored in: "bf16" or "f16"
    when every one of them is, else "f32"."""
    names = [n for n, s in expected_weights(cfg).items() if len(s) == 2 and n in weights]
    for name, dt in WEIGHT_DTYPES.items():
        if names and all(np.asarray(weights[n]).dtype == dt for n in names):
            return name
    return "f32"


def check_weights(cfg, weights: dict, keep=None, dtype: str = "f32") -> dict[str, np.ndarray]:
    """Checks weights against `expected_weights(cfg)` and returns {name: C-contiguous array}
    holding exactly the expected names: the 2-D weights in `dtype` ("f32", "bf16" or "f16"), the
    1-D ones (norms, biases) in float32. keep(name) -> bool, when given, narrows the expected names
    to a block of the model (a pipeline stage): names it rejects are neither required nor reported
    as extra. Missing, extra or mis-shaped tensors raise one WeightsError listing every problem
    (tensor name, expected and actual shapes; the message is capped in length). A tied model may
    carry an lm_head.weight of shape (V, H): it is ignored. Arrays already in the wanted dtype and
    layout are returned as they are (zero-copy); others are converted once (rounding to nearest
    even when narrowing); non-float arrays are an error."""
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {dtype!r}")
    expected = {k: v for k, v in expected_weights(cfg).items() if keep is None or keep(k)}
    problems: list[str] = []
    out: dict[str, np.ndarray] = {}
    for name, shape in expected.items():
        if name not in weights:
            problems.append(f"missing tensor '{name}' (expected shape {shape})")
            continue
        arr = weights[name]
        if not isinstance(arr, np.ndarray):
            arr = np.asarray(arr)
        if arr.shape != shape:
            problems.append(f"tensor '{name}' has shape {arr.shape}, expected {shape}")
            continue
        if arr.dtype.kind != "f" and arr.dtype not in WEIGHT_DTYPES.values():
            problems.append(f"tensor '{name}' has dtype {arr.dtype}, expected a float dtype (incl. bfloat16)")
            continue
        want = WEIGHT_DTYPES[dtype] if len(shape) == 2 else WEIGHT_DTYPES["f32"]
        if arr.dtype != want or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr.astype(want, copy=False))
        out[name] = arr
    for name in weights:
        if name in expected or (keep is not None and not keep(name)):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            shape = tuple(np.shape(weights[name]))
            if shape != (cfg.vocab_size, cfg.hidden_size):
                problems.append(f"tensor '{name}' has shape {shape}, expected {(cfg.vocab_size, cfg.hidden_size)} "
                                "(tied embeddings: it would be ignored)")
            continue
        problems.append(f"unexpected tensor '{name}' (shape {tuple(np.shape(weights[name]))})")
    if problems:
        msg = f"{len(problems)} weight problem(s): " + "; ".join(problems)
        if len(msg) > _MAX_MESSAGE:
            msg = msg[:_MAX_MESSAGE] + " ..."
        raise WeightsError(msg)
    return out
