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
tensor in the map, because safetensors' NumPy path copies, and checks every entry again rather
than trusting that validation. Any truncated or malformed file raises WeightsError naming the
file; a path that does not exist raises FileNotFoundError.

A directory is a unit that must not reach outside itself. Its files (model.safetensors, or the
shards named by model.safetensors.index.json) must be plain relative names whose real path
(symlinks resolved) lies inside the directory's real path; absolute names, `..` and symlinks that
escape are refused with WeightsError. The one widening: a Hugging Face cache snapshot
(<cache>/models--org--name/snapshots/<rev>/, or a subfolder of it) links its files to the
repository's blobs/, so there the repository folder (models--org--name/) is the bound. A file
passed by its own path is the caller's choice and is read wherever it is. Each tensor must come
from exactly one file, and from the shard the index names for it: a tensor in two files, in a
shard the index does not name for it, or in the index but in no shard raises WeightsError naming
the tensor and the files.

`expected_weights(cfg)` lists every tensor the decoder needs with its HF shape (from the C
decoder builder, the one place the names live), and `check_weights(cfg, weights)` verifies a dict
(loaded or built in memory) against it, keeping each tensor's own dtype.

Mixture-of-experts layers (Qwen3-MoE) read each projection's experts as one stacked param (E, out,
in), "model.layers.N.mlp.experts.gate_proj.weight" (block_params kind "experts"). A GGUF file holds
them so (one 3-D tensor, used in place); a Hugging Face file holds one 2-D tensor per expert,
"model.layers.N.mlp.experts.E.gate_proj.weight" (`expert_parts` names them). check_weights hands
such parts on as a list, and the core uses each part in place where the device reads host memory
(a table of pointers, no copy; devices with memory of their own get one buffer, each part uploaded
at its place): stacking them in NumPy would copy every expert, nearly the whole model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct

import numpy as np

from rlx import _C
from rlx import dtypes as _dtypes
from rlx.errors import WeightsError
from rlx.mapping import map_file

__all__ = ["load_weights", "expected_weights", "check_weights", "block_params", "expert_parts", "dtype_summary",
           "Packed"]

# safetensors dtype names rlx reads -> rlx dtypes (sizes and NumPy dtypes come from rlx.dtypes)
_SAFETENSORS = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
_MAX_MESSAGE = 2000
_MAX_HEADER_BYTES = 100_000_000   # safetensors' own bound on the JSON header
_MAX_INDEX_BYTES = 64 << 20       # model.safetensors.index.json: some 100 KB for the largest models
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def _reject_duplicate_keys(pairs: list) -> dict:
    """json object_pairs_hook: a JSON object naming one key twice is malformed (json would keep the last)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r:.200} appears twice")
        out[key] = value
    return out


def _loads(raw: bytes, what: str):
    """The JSON value in raw; WeightsError (naming `what`) when it is not UTF-8 JSON without
    duplicate keys, or nests too deeply, or holds a number too long to read."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys)
    except RecursionError:
        raise WeightsError(f"{what}: JSON nested too deeply") from None
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, duplicate keys, Python's int digit limit
        raise WeightsError(f"{what} ({e})") from None


def _parse_header(path: str, size: int) -> tuple[int, dict]:
    """(data start offset, header dict) of a safetensors file; WeightsError when malformed."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise WeightsError(f"{path}: truncated safetensors file (header of {n} bytes, file of {size})")
        if n > _MAX_HEADER_BYTES:
            raise WeightsError(f"{path}: safetensors header of {n} bytes exceeds the format's {_MAX_HEADER_BYTES}")
        raw = f.read(n)
    header = _loads(raw, f"{path}: malformed safetensors header")
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: malformed safetensors header (not a JSON object)")
    return 8 + n, header


def _is_uint(value) -> bool:
    """An int in [0, 2**63): safetensors' sizes and offsets."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _tensor_view(path: str, name: str, info, data: np.ndarray, start: int, size: int) -> np.ndarray:
    """The read-only array of one header entry, a view of data (the file's map) where possible."""
    if not isinstance(info, dict):
        raise WeightsError(f"{path}: malformed header entry for tensor '{name}' (not a JSON object)")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise WeightsError(f"{path}: malformed header entry for tensor '{name}' (dtype {dtype!r:.100})")
    if dtype not in _SAFETENSORS:
        raise WeightsError(f"{path}: tensor '{name}' has dtype {dtype:.40}; rlx reads F32, F16 and BF16")
    if not isinstance(shape, list) or len(shape) > 32 or not all(_is_uint(s) for s in shape):
        raise WeightsError(f"{path}: malformed header entry for tensor '{name}' (shape {shape!r:.100})")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise WeightsError(f"{path}: malformed header entry for tensor '{name}' (data_offsets {offsets!r:.100})")
    begin, end = offsets
    shape = tuple(shape)
    numel = math.prod(shape)  # a Python int: no overflow
    rdt = _dtypes.DTYPES[_SAFETENSORS[dtype]]
    if end - begin != numel * rdt.type_size or start + end > size:
        raise WeightsError(f"{path}: tensor '{name}' data_offsets {begin}..{end} do not fit shape {shape} "
                           f"{dtype} in a file of {size} bytes")
    raw = data[start + begin: start + end]
    try:  # zero-copy views of the read-only map
        arr = raw.view(rdt.numpy).reshape(shape)
    except ValueError as e:  # a dim numpy cannot represent, even with no elements
        raise WeightsError(f"{path}: tensor '{name}' has shape {shape}, which NumPy cannot hold ({e})") from None
    if not arr.flags.aligned:  # f32 after odd-sized f16/bf16 tensors only; C needs aligned data
        arr = arr.copy()
    arr.flags.writeable = False
    return arr


def _load_file(path: str) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file."""
    from safetensors import safe_open  # imported here so `import rlx` stays light

    hint = " (a JSON file: pass the model directory, or a .safetensors file)" if path.endswith(".json") else ""
    try:
        with safe_open(path, framework="numpy") as f:
            names = list(f.keys())
    except Exception as e:  # SafetensorError and OSError both mean: not a usable file
        raise WeightsError(f"{path}: not a valid safetensors file ({e}){hint}") from None
    size = os.path.getsize(path)
    start, header = _parse_header(path, size)
    if set(names) != set(header) - {"__metadata__"}:
        raise WeightsError(f"{path}: the safetensors header lists other tensors than the safetensors package reads")
    data = map_file(path) if size > start else np.zeros(0, np.uint8)
    return {name: _tensor_view(path, name, header[name], data, start, size) for name in names}


def _confinement_root(model_dir: str) -> str:
    """The real path a directory's weight files must lie in: the directory itself, or for a
    Hugging Face cache snapshot (<repo>/snapshots/<rev>[/subfolder], files linked to
    <repo>/blobs/) the repo."""
    real = os.path.realpath(model_dir)
    d = real
    while os.path.dirname(d) != d:
        parent = os.path.dirname(d)
        repo = os.path.dirname(parent)
        if (os.path.basename(parent) == "snapshots" and os.path.basename(repo).startswith("models--")
                and os.path.isdir(os.path.join(repo, "blobs"))):
            return repo
        d = parent
    return real


def _model_file(model_dir: str, root: str, name: str, source: str) -> str:
    """The path of file `name` (a relative name from `source`) of model_dir, confined to root."""
    parts = name.replace("\\", "/").split("/")
    if not name or "\0" in name or os.path.isabs(name) or ".." in parts:
        raise WeightsError(f"{source}: shard name {name!r:.200} is not a plain relative name inside {model_dir}")
    full = os.path.join(model_dir, name)
    real = os.path.realpath(full)
    if os.path.commonpath([real, root]) != root:
        raise WeightsError(f"{source}: {name!r:.200} resolves to {real}, outside {root}; weights are read only "
                           "from inside the model directory (link the whole directory, or pass the file's own path)")
    if not os.path.isfile(real):
        if os.path.lexists(full):
            raise WeightsError(f"{source}: {name!r:.200} is not a regular file")
        raise WeightsError(f"{source}: shard {name!r:.200} does not exist")
    return full


def _read_index(index: str) -> dict[str, str]:
    """{tensor: shard name (normalised)} from model.safetensors.index.json; WeightsError when malformed."""
    if not os.path.isfile(index):
        raise WeightsError(f"{index}: not a regular file")
    with open(index, "rb") as f:
        raw = f.read(_MAX_INDEX_BYTES + 1)
    if len(raw) > _MAX_INDEX_BYTES:
        raise WeightsError(f"{index}: larger than {_MAX_INDEX_BYTES} bytes; not a shard index")
    doc = _loads(raw, f"{index}: malformed index")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise WeightsError(f"{index}: malformed index (no 'weight_map' object)")
    out = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise WeightsError(f"{index}: malformed index (tensor '{tensor:.200}' maps to {shard!r:.100}, "
                               "not a file name)")
        out[tensor] = os.path.normpath(shard) if shard else shard
    return out


def watch_sources(model, weights: dict) -> None:
    """Tells the _C.Model that reads these weights which files (map_file) some of them are views
    of, as they were when mapped: every run then raises rlx.Error once one is modified in place
    or truncated, instead of computing with changed bytes (or dying of SIGBUS)."""
    found: dict[str, os.stat_result] = {}
    for arr in weights.values():
        a = arr.raw if isinstance(arr, Packed) else arr
        while a is not None:
            src = getattr(a, "rlx_source", None)
            if src is not None:
                found.setdefault(src[0], src[1])
                break
            a = getattr(a, "base", None)
    for path, st in found.items():
        model.add_source(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def load_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Loads a Hugging Face directory (model.safetensors, or shards listed by
    model.safetensors.index.json), a single .safetensors file, or a GGUF file (block-quantized
    tensors as Packed, executed packed) into {name: read-only array}. FileNotFoundError when path,
    or the directory's weights, do not exist; WeightsError for everything else (module note:
    malformed files, shards outside the directory, duplicates)."""
    path = os.fspath(path)
    from rlx import gguf  # imported here: rlx.gguf imports rlx.config, which is light

    if gguf.is_gguf(path):
        return gguf.model_weights(path)
    weight_map: dict[str, str] | None = None
    if os.path.isfile(path):
        files = {path: path}
    elif os.path.isdir(path):
        root = _confinement_root(path)
        index = os.path.join(path, INDEX_NAME)
        if os.path.lexists(index):
            weight_map = _read_index(index)
            files = {s: _model_file(path, root, s, index) for s in sorted(set(weight_map.values()))}
        elif os.path.lexists(os.path.join(path, SINGLE_NAME)):
            files = {SINGLE_NAME: _model_file(path, root, SINGLE_NAME, path)}
        else:
            raise FileNotFoundError(f"no {SINGLE_NAME} or {INDEX_NAME} in {path}")
    elif os.path.lexists(path):
        raise WeightsError(f"{path}: not a safetensors file or a model directory")
    else:
        raise FileNotFoundError(f"no such file or directory: {path}")

    out: dict[str, np.ndarray] = {}
    source: dict[str, str] = {}  # tensor -> the file it came from
    for name, fpath in files.items():
        for tensor, arr in _load_file(fpath).items():
            if tensor in source:
                raise WeightsError(f"{path}: tensor '{tensor}' is in two files: {source[tensor]} and {fpath}")
            if weight_map is not None and weight_map.get(tensor) != name:
                listed = weight_map.get(tensor)
                where = "is not listed in the index" if listed is None else f"is listed in the index under {listed}"
                raise WeightsError(f"{path}: tensor '{tensor}' is in shard {name} but {where}")
            source[tensor] = fpath
            out[tensor] = arr
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
    """The fields the C core reads, with each layer's sliding window (and, for a mixture, whether it
    is sparse) resolved."""
    out = {
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
    sparse = [cfg.layer_sparse(i) for i in range(cfg.num_hidden_layers)]
    if any(sparse):
        out.update(layer_sparse=sparse, num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                   moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob)
    return out


_KINDS = {0: "matrix", 1: "vector", 2: "derived", 3: "experts"}


def _decoder_rows(cfg, block) -> list:
    begin, end, embed, head = (0, cfg.num_hidden_layers, True, True) if block is None else (
        block.layer_begin, block.layer_end, block.embed, block.head)
    return _C.decoder_params(_c_config(cfg), begin, end, embed, head)


def block_params(cfg, block=None) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every tensor a block of the decoder reads, in the order the C builder
    makes them (the names live in the C decoder builder and nowhere else). kind: "matrix" (a
    projection, the embedding or the LM head: any real-valued dtype), "experts" (a mixture's
    experts of one projection stacked (E, out_features, in_features): any real-valued dtype),
    "vector" (norms and biases: float32) or "derived" (rope.inv_freq, computed from the config).
    block: an rlx.distributed.BlockSpec, or None for the whole model."""
    return [(name, tuple(shape), _KINDS[kind]) for name, shape, kind, _ in _decoder_rows(cfg, block)]


def expert_parts(cfg, block=None) -> dict[str, list[str]]:
    """{stacked experts name: the names of its E parts in a Hugging Face file, in expert order}."""
    return {name: [fmt % e for e in range(shape[0])] for name, shape, _, fmt in _decoder_rows(cfg, block) if fmt}


def expected_weights(cfg, block=None) -> dict[str, tuple[int, ...]]:
    """Every tensor the decoder (or a block of it) reads from a Hugging Face file, with its shape, in
    layer order. Projections are stored (out_features, in_features). attention_bias adds biases to
    q, k, v AND o; mlp_bias to gate, up and down; qk_norm (Qwen3) adds per-head q_norm / k_norm of
    (head_dim,). lm_head.weight is listed only when embeddings are not tied. A sparse layer lists
    its router (model.layers.N.mlp.gate.weight, (E, H)) and every expert's projections (parts of
    the stacked params, see expert_parts)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape, kind, fmt in _decoder_rows(cfg, block):
        if fmt:
            out.update((fmt % e, tuple(shape[1:])) for e in range(shape[0]))
        elif kind != 2:
            out[name] = tuple(shape)
    return out


def _shape_of(arr) -> tuple[int, ...]:
    return tuple(arr.shape) if isinstance(arr, (np.ndarray, Packed)) else tuple(np.shape(arr))


def check_weights(cfg, weights: dict, block=None, dtype: str | None = None) -> dict:
    """Checks weights against `expected_weights(cfg, block)` and returns {name: value} holding
    exactly the block's params, ready for the C model: each matrix in its own dtype (float32,
    float16, bfloat16 arrays, or Packed block weights), or converted to `dtype` when given: "f32",
    "bf16", "f16", or a block type / quantisation recipe ("q8_0", "q4_k_m": each matrix quantised
    as rlx.quantize would write it, see rlx/quantize.py); norms and biases as float32. Stacked
    experts come either as the stacked tensor (a GGUF file's; any matrix dtype) or as their E parts
    (a Hugging Face file's, `expert_parts`), which are returned as a list in expert order, each part
    as a matrix is (one dtype for all of them). block narrows the expected names to a pipeline
    stage's block: names outside it are neither required nor reported as extra. Missing, extra or
    mis-shaped tensors raise one WeightsError listing every problem (tensor name, expected and
    actual shapes; the message is capped in length). A tied model may carry an lm_head.weight of
    shape (V, H): it is ignored. Arrays already in the wanted dtype and layout are returned as they
    are (zero-copy); others are converted once (rounding to nearest even when narrowing)."""
    if dtype is not None and dtype not in ("f32", "bf16", "f16"):
        from rlx.quantize import quantize_weights  # ValueError naming the known types

        weights, dtype = quantize_weights(cfg, weights, dtype), None
    rows = [r for r in _decoder_rows(cfg, block) if r[2] != 2]
    known = {r[0] for r in rows} | {fmt % e for _, shape, _, fmt in rows if fmt for e in range(shape[0])}
    if block is not None:
        whole = _decoder_rows(cfg, None)
        known |= {r[0] for r in whole} | {fmt % e for _, shape, _, fmt in whole if fmt for e in range(shape[0])}
    problems: list[str] = []
    out: dict = {}
    for name, shape, kind, fmt in rows:
        shape = tuple(shape)
        if fmt and name not in weights:
            parts = [fmt % e for e in range(shape[0])]
            missing = [p for p in parts if p not in weights]
            if missing:
                problems.append(f"missing tensor '{name}' (expected shape {shape}) or its {shape[0]} parts: "
                                f"{len(missing)} missing, the first '{missing[0]}' (expected shape {shape[1:]})")
                continue
            values = [_matrix(p, weights[p], shape[1:], True, dtype, problems) for p in parts]
            if any(v is None for v in values):
                continue
            kinds = {v[1] if isinstance(v, tuple) else v.dtype for v in values}
            if len(kinds) > 1:
                problems.append(f"the parts of '{name}' mix dtypes {sorted(map(str, kinds))}; one projection's "
                                "experts share a dtype")
                continue
            out[name] = values
            continue
        if name not in weights:
            problems.append(f"missing tensor '{name}' (expected shape {shape})")
            continue
        value = _matrix(name, weights[name], shape, kind != 1, dtype, problems)
        if value is not None:
            out[name] = value
    for name in weights:
        if name in known:
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


def _matrix(name: str, arr, shape: tuple, matrix: bool, dtype: str | None, problems: list):
    """One checked tensor for the C model (a matrix: its dtype kept, or converted to dtype; else
    float32), or None after appending the problem."""
    if not isinstance(arr, (np.ndarray, Packed)):
        arr = np.asarray(arr)
    if _shape_of(arr) != shape:
        problems.append(f"tensor '{name}' has shape {_shape_of(arr)}, expected {shape}")
        return None
    if isinstance(arr, Packed):
        if not matrix or (dtype is not None and dtype != _dtypes.parse(arr.dtype).name):
            problems.append(f"tensor '{name}' is packed {arr.dtype}; " + (
                "only matrices may be packed" if not matrix else f"it cannot be converted to {dtype}"))
            return None
        return arr.raw()
    have = _dtypes.of_array(arr)
    if arr.dtype.kind != "f" and not (have is not None and have.is_float):
        problems.append(f"tensor '{name}' has dtype {arr.dtype}, expected a float dtype (incl. bfloat16)")
        return None
    f32 = _dtypes.DTYPES["f32"].numpy
    kept = arr.dtype if have is not None else f32  # float64 and other floats: float32, once
    want = (_dtypes.DTYPES[dtype].numpy if dtype else kept) if matrix else f32
    if arr.dtype != want or not arr.flags.c_contiguous or not arr.flags.aligned:
        arr = np.ascontiguousarray(arr.astype(want, copy=False))
    return arr


def dtype_summary(cfg, weights: dict, block=None) -> dict[str, int]:
    """{dtype name: number of matrices} of checked weights (arrays and packed tuples): the dtypes
    the projections, embedding and LM head are computed from (norms and biases are float32)."""
    counts: dict[str, int] = {}
    for name, _, kind in block_params(cfg, block):
        if kind in ("matrix", "experts") and name in weights:
            v = weights[name]
            v = v[0] if isinstance(v, list) else v  # experts as parts: one dtype
            dt = v[1] if isinstance(v, tuple) else _dtypes.of_array(v).name
            counts[dt] = counts.get(dt, 0) + 1
    return counts
