"""GGUF files (llama.cpp's one-file model format, versions 2 and 3), read in place.

`GGUFFile(path)` memory-maps the file read-only (`buffer`: the whole file, np.memmap uint8) and
exposes
- `metadata`: {key: value} as plain Python values: ints, floats, bools and str for scalars,
  `GGUFStrings` for string arrays (a read-only sequence of str, each decoded from the map when
  read: a vocabulary held as Python strings took 13 MiB for Qwen3's 151k tokens and merges; all
  are checked to be valid UTF-8 when the file is opened), read-only NumPy views (into the map)
  for numeric arrays, lists for arrays of arrays;
- `architecture` (general.architecture), `chat_template` (tokenizer.chat_template or None);
- `tensors`: {Hugging Face name: GGUFTensor}, in file order. Each tensor keeps its GGML type
  ("F32", "BF16", "Q8_0", "Q4_K", ...), its logical shape in Hugging Face order and its data as a
  zero-copy view of the map: F32 / F16 / BF16 (and the plain integer / F64 types) as a typed
  array of that shape (bf16 through ml_dtypes.bfloat16); block-quantized types as np.uint8
  (rows, bytes_per_row), rows = product of all dims but the last, each row the packed blocks
  of one row of the matrix (a row of in_features values is in_features / block_size blocks);
- `rope_freqs`: the Llama 3 RoPE frequency factors (head_dim // 2,) float32 when the file has
  them, else None (not a weight: `config_from_gguf` turns it back into rope_scaling);
- `qk_permuted`: whether q_proj / k_proj rows (and their biases) are in llama.cpp's
  interleaved-RoPE order (see `permute_qk`). True for architecture "llama", False for "qwen3";
- `get(key, kind, default)`: a metadata value checked for its type; `weights()`: {HF name:
  data view}; `hf_array(name)`: a tensor in Hugging Face row order (q/k un-permuted: a copy).

`config_from_gguf(f)` builds the LlamaConfig / Qwen3Config / Qwen3MoeConfig that the file describes, through
`rlx.config.config_from_dict` with Hugging Face keys.

This module never copies tensor data, never writes to the file and never converts a dtype:
turning q/k rows back into Hugging Face order (`unpermute_qk`) is an explicit copy the caller
asks for. Unknown tensors, architectures, tensor types and missing keys raise WeightsError
(reading the file) or ConfigError (building the config), naming the file and the key / tensor.

Why not gguf-py's GGUFReader: it builds two NumPy views per metadata string, so opening a
Llama 3 vocabulary (128k tokens + 280k merges) takes ~9 s. The header is parsed here with
`struct` over the map (~0.4 s for the same file); gguf-py still provides the format's
constants (value types, GGML types and their block sizes) and is the reference the tests
compare this reader with, and the writer and (de)quantizer the tests use.

File layout (little-endian; big-endian files are refused):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value type | value)        string = u64 length + UTF-8 bytes
    n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset)
    padding to general.alignment (default 32) | tensor data (offsets relative to its start)
Dims are stored fastest-varying first (ne[0] = in_features of a matrix): the reverse of the
NumPy / Hugging Face shape.
"""

from __future__ import annotations

import array
import dataclasses
import math
import os
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from rlx import dtypes as _dtypes
from rlx.config import ModelConfig, config_from_dict
from rlx.errors import ConfigError, WeightsError
from rlx.mapping import map_file

__all__ = ["ARCHITECTURES", "TENSOR_NAMES", "GGUFFile", "GGUFStrings", "GGUFTensor", "config_from_gguf", "gguf_arch",
           "gguf_name", "llama3_rope_factors", "permute_qk", "unpermute_qk"]

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS

# GGUF scalar value types -> (struct format, NumPy dtype) of one little-endian element.
_SCALARS: dict[int, tuple[str, str]] = {
    GGUFValueType.UINT8: ("<B", "<u1"), GGUFValueType.INT8: ("<b", "<i1"),
    GGUFValueType.UINT16: ("<H", "<u2"), GGUFValueType.INT16: ("<h", "<i2"),
    GGUFValueType.UINT32: ("<I", "<u4"), GGUFValueType.INT32: ("<i", "<i4"),
    GGUFValueType.UINT64: ("<Q", "<u8"), GGUFValueType.INT64: ("<q", "<i8"),
    GGUFValueType.FLOAT32: ("<f", "<f4"), GGUFValueType.FLOAT64: ("<d", "<f8"),
    GGUFValueType.BOOL: ("<?", "?"),
}

# GGML types whose data is exposed as a typed array of the logical shape; every other type is
# block-quantized and exposed as packed uint8 rows.
_TYPED = {
    GGMLQuantizationType.F32: np.dtype("<f4"), GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.BF16: np.dtype(ml_dtypes.bfloat16), GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("<i1"), GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"), GGMLQuantizationType.I64: np.dtype("<i8"),
}
_TYPED_NAMES = frozenset(t.name for t in _TYPED)

# ---------------------------------------------------------------------------------------------
# Tensor names: GGUF -> Hugging Face, per architecture (the one table)
# ---------------------------------------------------------------------------------------------

# Architectures rlx maps. qk_permuted: llama.cpp's converter permuted q/k rows (and biases)
# for its interleaved ("normal") RoPE; Qwen3 uses NeoX RoPE and keeps Hugging Face order.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {"qk_permuted": True},
    "qwen3": {"qk_permuted": False},
    "qwen3moe": {"qk_permuted": False},
}

# general.architecture -> Hugging Face model_type, where the two differ
MODEL_TYPES = {"qwen3moe": "qwen3_moe"}


def gguf_arch(model_type: str) -> str:
    """The GGUF general.architecture of a Hugging Face model_type ("qwen3_moe" -> "qwen3moe"; the
    inverse of MODEL_TYPES); KeyError for a model_type no architecture of ARCHITECTURES runs."""
    arch = {t: a for a, t in MODEL_TYPES.items()}.get(model_type, model_type)
    if arch not in ARCHITECTURES:
        raise KeyError(model_type)
    return arch

_ALL = frozenset({"llama", "qwen3", "qwen3moe"})
_QWEN3 = frozenset({"qwen3", "qwen3moe"})

# GGUF name ("blk.{i}." stands for layer i) -> (Hugging Face name, architectures that have it).
# A None HF name marks a tensor that is not a weight (rope_freqs: read into the config).
TENSOR_NAMES: dict[str, tuple[str | None, frozenset[str]]] = {
    "token_embd.weight": ("model.embed_tokens.weight", _ALL),
    "output_norm.weight": ("model.norm.weight", _ALL),
    "output.weight": ("lm_head.weight", _ALL),
    "rope_freqs.weight": (None, frozenset({"llama"})),
    "blk.{i}.attn_norm.weight": ("model.layers.{i}.input_layernorm.weight", _ALL),
    "blk.{i}.attn_q.weight": ("model.layers.{i}.self_attn.q_proj.weight", _ALL),
    "blk.{i}.attn_k.weight": ("model.layers.{i}.self_attn.k_proj.weight", _ALL),
    "blk.{i}.attn_v.weight": ("model.layers.{i}.self_attn.v_proj.weight", _ALL),
    "blk.{i}.attn_output.weight": ("model.layers.{i}.self_attn.o_proj.weight", _ALL),
    "blk.{i}.attn_q.bias": ("model.layers.{i}.self_attn.q_proj.bias", _ALL),
    "blk.{i}.attn_k.bias": ("model.layers.{i}.self_attn.k_proj.bias", _ALL),
    "blk.{i}.attn_v.bias": ("model.layers.{i}.self_attn.v_proj.bias", _ALL),
    "blk.{i}.attn_output.bias": ("model.layers.{i}.self_attn.o_proj.bias", _ALL),
    "blk.{i}.attn_q_norm.weight": ("model.layers.{i}.self_attn.q_norm.weight", _QWEN3),
    "blk.{i}.attn_k_norm.weight": ("model.layers.{i}.self_attn.k_norm.weight", _QWEN3),
    "blk.{i}.ffn_norm.weight": ("model.layers.{i}.post_attention_layernorm.weight", _ALL),
    "blk.{i}.ffn_gate.weight": ("model.layers.{i}.mlp.gate_proj.weight", _ALL),
    "blk.{i}.ffn_up.weight": ("model.layers.{i}.mlp.up_proj.weight", _ALL),
    "blk.{i}.ffn_down.weight": ("model.layers.{i}.mlp.down_proj.weight", _ALL),
    # a mixture's router (E, H) and its experts, stacked 3-D (E, out, in) as llama.cpp stores them
    "blk.{i}.ffn_gate_inp.weight": ("model.layers.{i}.mlp.gate.weight", frozenset({"qwen3moe"})),
    "blk.{i}.ffn_gate_exps.weight": ("model.layers.{i}.mlp.experts.gate_proj.weight", frozenset({"qwen3moe"})),
    "blk.{i}.ffn_up_exps.weight": ("model.layers.{i}.mlp.experts.up_proj.weight", frozenset({"qwen3moe"})),
    "blk.{i}.ffn_down_exps.weight": ("model.layers.{i}.mlp.experts.down_proj.weight", frozenset({"qwen3moe"})),
    "blk.{i}.ffn_gate.bias": ("model.layers.{i}.mlp.gate_proj.bias", frozenset({"llama"})),
    "blk.{i}.ffn_up.bias": ("model.layers.{i}.mlp.up_proj.bias", frozenset({"llama"})),
    "blk.{i}.ffn_down.bias": ("model.layers.{i}.mlp.down_proj.bias", frozenset({"llama"})),
}

_LAYER_RE = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)\Z")


def _hf_name(gguf_name: str, arch: str) -> str | None:
    """The HF name of a GGUF tensor name for `arch`; KeyError when the table has none."""
    m = _LAYER_RE.match(gguf_name)
    key, layer = (f"blk.{{i}}.{m.group(2)}", m.group(1)) if m else (gguf_name, None)
    hf, archs = TENSOR_NAMES[key]
    if arch not in archs:
        raise KeyError(gguf_name)
    return hf if hf is None or layer is None else hf.format(i=layer)


def gguf_name(hf_name: str, arch: str) -> str:
    """The GGUF name of a Hugging Face tensor name for `arch` (the inverse of the TENSOR_NAMES
    table); KeyError when the table has none."""
    m = re.match(r"model\.layers\.(0|[1-9][0-9]*)\.(.+)\Z", hf_name)
    key, layer = ("model.layers.{i}." + m.group(2), m.group(1)) if m else (hf_name, None)
    for g, (hf, archs) in TENSOR_NAMES.items():
        if hf == key and arch in archs:
            return g if layer is None else g.format(i=layer)
    raise KeyError(hf_name)


# ---------------------------------------------------------------------------------------------
# q/k row permutation (llama.cpp's interleaved RoPE layout)
# ---------------------------------------------------------------------------------------------

def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Hugging Face -> GGUF row order of a Llama q_proj / k_proj weight or bias (a copy).

    w: (n_heads * head_dim, ...) — q_proj with n_heads = num_attention_heads, k_proj with
    n_heads = num_key_value_heads. Hugging Face's rotate-half RoPE pairs rows j and j + d/2 of
    each head (d = head_dim); llama.cpp's "normal" RoPE pairs adjacent rows 2j and 2j + 1, so
    its converter moves, within every head h,
        HF row  h*d + t*(d/2) + j   ->   GGUF row  h*d + 2*j + t      (t in {0, 1}, j < d/2)
    i.e. reshape (n_heads, 2, d/2, ...) -> swap axes 1 and 2 -> reshape back. Only the first
    axis moves, so this works for any row layout: float rows, or packed quantized rows (each
    row's blocks stay intact)."""
    return _swap_halves(w, n_heads, 2)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """GGUF -> Hugging Face row order (the inverse of `permute_qk`; a copy). w as there."""
    return _swap_halves(w, n_heads, None)


def _swap_halves(w: np.ndarray, n_heads: int, to_gguf: int | None) -> np.ndarray:
    if not isinstance(n_heads, int) or n_heads <= 0 or w.ndim == 0 or w.shape[0] % (2 * n_heads):
        raise ValueError(f"q/k permutation: {w.shape[0] if w.ndim else 'a scalar'} rows cannot be split "
                         f"into {n_heads} heads of an even head_dim")
    half = w.shape[0] // n_heads // 2
    split = (n_heads, 2, half) if to_gguf else (n_heads, half, 2)
    return np.ascontiguousarray(w.reshape(*split, *w.shape[1:]).swapaxes(1, 2)).reshape(w.shape)


# ---------------------------------------------------------------------------------------------
# Tensors and the file
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file. `data` is a read-only view of the file's memory map:
    typed (F32 / F16 / BF16 ...) with shape `shape`, or for block-quantized types
    np.uint8 (rows, bytes_per_row) with rows = prod(shape[:-1]) and
    bytes_per_row = shape[-1] // block_size * type_size."""

    name: str                  # Hugging Face name ("model.layers.0.self_attn.q_proj.weight")
    gguf_name: str             # name in the file ("blk.0.attn_q.weight")
    type_name: str             # GGML type: "F32", "F16", "BF16", "Q8_0", "Q4_K", ...
    shape: tuple[int, ...]     # logical shape, Hugging Face order: (out_features, in_features)
    data: np.ndarray           # zero-copy view, see above
    offset: int                # absolute byte offset of the data in the file
    block_size: int            # elements per block (1 for F32 / F16 / BF16)
    type_size: int             # bytes per block

    @property
    def quantized(self) -> bool:
        """True for block-quantized types (data is packed uint8 rows)."""
        return self.type_name not in _TYPED_NAMES

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class _Cursor:
    """Reads little-endian GGUF header values from a buffer; struct.error / IndexError past the
    end are turned into 'truncated' by the caller."""

    def __init__(self, buf: memoryview):
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.scalar("<Q")
        end = self.pos + n
        if end > len(self.buf):
            raise struct.error("string runs past the end of the file")
        raw = bytes(self.buf[self.pos:end])
        self.pos = end
        return raw.decode("utf-8")


class GGUFStrings(Sequence):
    """A GGUF array of strings, read in place: the map and the offset of each string (8 bytes per
    string, against ~45 for a Python str); item i is decoded when it is read. Compares equal to a
    list or tuple of the same strings. Made by GGUFFile, which has checked every string."""

    def __init__(self, buf: memoryview, starts: array.array):
        self._buf = buf
        self._starts = starts  # (n,) 'Q': the byte offset of each string's u64 length

    def __len__(self) -> int:
        return len(self._starts)

    def _at(self, pos: int) -> str:
        (n,) = struct.unpack_from("<Q", self._buf, pos)
        return str(self._buf[pos + 8:pos + 8 + n], "utf-8")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._at(p) for p in self._starts[i]]
        return self._at(self._starts[i])

    def __iter__(self) -> Iterator[str]:
        return map(self._at, self._starts)

    def __eq__(self, other) -> bool:
        if not isinstance(other, (list, tuple, GGUFStrings)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # a sequence that compares equal to lists

    def __repr__(self) -> str:
        head = ", ".join(repr(t) for t in self[:3])
        return f"GGUFStrings([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"


class GGUFFile:
    """A GGUF file, memory-mapped read-only. See the module docstring for the fields."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            self.buffer = map_file(self.path)
        except ValueError as e:  # an empty file cannot be mapped
            raise WeightsError(f"{self.path}: not a GGUF file ({e})") from None
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensor] = {}
        self.rope_freqs: np.ndarray | None = None
        cur = _Cursor(memoryview(self.buffer))
        try:
            infos = self._read_header(cur)
        except (struct.error, IndexError):
            raise WeightsError(f"{self.path}: truncated GGUF file (header ends past byte "
                               f"{len(self.buffer)})") from None
        except UnicodeDecodeError as e:
            raise WeightsError(f"{self.path}: a GGUF string is not valid UTF-8 ({e})") from None
        self._map_tensors(infos, cur.pos)

    # -- header --------------------------------------------------------------------------------

    def _read_header(self, cur: _Cursor) -> list[tuple[str, tuple[int, ...], int, int]]:
        if bytes(cur.buf[:4]) != _MAGIC:
            raise WeightsError(f"{self.path}: not a GGUF file (magic {bytes(cur.buf[:4])!r}, expected {_MAGIC!r})")
        cur.pos = 4
        self.version = cur.scalar("<I")
        if self.version not in _VERSIONS:
            if self.version & 0xFFFF == 0:
                raise WeightsError(f"{self.path}: big-endian GGUF files are not supported")
            raise WeightsError(f"{self.path}: GGUF version {self.version} is not supported (supported: 2, 3)")
        n_tensors = cur.scalar("<Q")
        n_kv = cur.scalar("<Q")
        self._types: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.scalar("<I")
            if key in self.metadata:
                raise WeightsError(f"{self.path}: metadata key '{key}' appears twice")
            try:
                self.metadata[key] = self._read_value(cur, vtype, key)
            except UnicodeDecodeError as e:
                raise WeightsError(f"{self.path}: metadata key '{key}' holds a string that is not valid "
                                   f"UTF-8 ({e})") from None
            self._types[key] = vtype
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > _MAX_DIMS:
                raise WeightsError(f"{self.path}: tensor '{name}' has {n_dims} dims (at most {_MAX_DIMS})")
            dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
            cur.pos += 8 * n_dims
            ggml_type = cur.scalar("<I")
            offset = cur.scalar("<Q")
            infos.append((name, dims, ggml_type, offset))
        return infos

    def _read_value(self, cur: _Cursor, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            v = cur.scalar(_SCALARS[vtype][0])
            return float(v) if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else v
        if vtype == GGUFValueType.STRING:
            return cur.string()
        if vtype == GGUFValueType.ARRAY:
            etype = cur.scalar("<I")
            n = cur.scalar("<Q")
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype][1])
                if cur.pos + n * dt.itemsize > len(cur.buf):
                    raise struct.error("array runs past the end of the file")
                arr = np.ndarray((n,), dtype=dt, buffer=self.buffer, offset=cur.pos)
                cur.pos += n * dt.itemsize
                return arr
            if etype == GGUFValueType.STRING:
                starts = array.array("Q")
                for _ in range(n):  # each string checked (bounds, UTF-8) now, kept as its offset
                    starts.append(cur.pos)
                    cur.string()
                return GGUFStrings(cur.buf, starts)
            if etype == GGUFValueType.ARRAY:
                return [self._read_value(cur, etype, key) for _ in range(n)]
            raise WeightsError(f"{self.path}: metadata key '{key}' is an array of unknown value type {etype}")
        raise WeightsError(f"{self.path}: metadata key '{key}' has unknown value type {vtype}")

    # -- tensors -------------------------------------------------------------------------------

    def _map_tensors(self, infos: list[tuple[str, tuple[int, ...], int, int]], header_end: int) -> None:
        alignment = self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if "general.alignment" in self._types and (self._types["general.alignment"] != GGUFValueType.UINT32
                                                   or alignment <= 0 or alignment & (alignment - 1)):
            raise WeightsError(f"{self.path}: metadata key 'general.alignment' = {alignment!r} must be a "
                               "uint32 power of two")
        self.alignment = alignment
        data_start = -(-header_end // alignment) * alignment
        arch = self.metadata.get("general.architecture")
        if infos and not isinstance(arch, str):
            raise WeightsError(f"{self.path}: missing required metadata key 'general.architecture'")
        if infos and arch not in ARCHITECTURES:
            raise WeightsError(f"{self.path}: architecture '{arch}' (general.architecture) is not supported "
                               f"(supported: {', '.join(sorted(ARCHITECTURES))})")
        size = len(self.buffer)
        seen: set[str] = set()
        for name, dims, raw_type, rel in infos:
            if name in seen:
                raise WeightsError(f"{self.path}: tensor '{name}' appears twice")
            seen.add(name)
            try:
                gtype = GGMLQuantizationType(raw_type)
                block_size, type_size = GGML_QUANT_SIZES[gtype]
            except (ValueError, KeyError):
                raise WeightsError(f"{self.path}: tensor '{name}' has unknown GGML type {raw_type}") from None
            if gtype not in _TYPED and gtype.name.lower() not in _dtypes.DTYPES:
                runs = ", ".join(n.upper() for n, d in _dtypes.DTYPES.items() if d.block_size > 1)
                raise WeightsError(f"{self.path}: tensor '{name}' has GGML type {gtype.name}, which rlx does not "
                                   f"run (block types it runs: {runs})")
            try:
                hf = _hf_name(name, arch)
            except KeyError:
                raise WeightsError(f"{self.path}: unknown tensor '{name}' for architecture '{arch}'") from None
            shape = tuple(int(d) for d in reversed(dims))  # HF / NumPy order
            if not shape or any(d <= 0 for d in shape):
                raise WeightsError(f"{self.path}: tensor '{name}' has an empty shape {shape}")
            if shape[-1] % block_size:
                raise WeightsError(f"{self.path}: tensor '{name}' ({gtype.name}): row of {shape[-1]} elements is not "
                                   f"a multiple of the block size {block_size}")
            if rel % alignment:
                raise WeightsError(f"{self.path}: tensor '{name}' data offset {rel} is not a multiple of the "
                                   f"alignment {alignment}")
            start = data_start + rel
            rows = math.prod(shape[:-1])
            row_bytes = shape[-1] // block_size * type_size
            if start + rows * row_bytes > size:
                raise WeightsError(f"{self.path}: truncated GGUF file: tensor '{name}' needs bytes "
                                   f"[{start}, {start + rows * row_bytes}) of a {size}-byte file")
            if gtype in _TYPED:
                data = np.ndarray(shape, dtype=_TYPED[gtype], buffer=self.buffer, offset=start)
            else:
                data = np.ndarray((rows, row_bytes), dtype=np.uint8, buffer=self.buffer, offset=start)
            t = GGUFTensor(hf if hf is not None else name, name, gtype.name, shape, data, start,
                           block_size, type_size)
            if hf is None:  # rope_freqs: (head_dim // 2,) float factors, consumed by the config
                if gtype != GGMLQuantizationType.F32 or len(shape) != 1:
                    raise WeightsError(f"{self.path}: tensor '{name}' must be 1-D F32, got {gtype.name} {shape}")
                self.rope_freqs = data
            else:
                self.tensors[hf] = t

    # -- accessors -----------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise WeightsError(f"{self.path}: missing required metadata key 'general.architecture'")
        return arch

    @property
    def chat_template(self) -> str | None:
        t = self.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) else None

    @property
    def qk_permuted(self) -> bool:
        """True when q_proj / k_proj rows and biases are in llama.cpp's interleaved order
        (architecture llama); undo with `unpermute_qk` or `hf_array`."""
        return bool(ARCHITECTURES.get(self.metadata.get("general.architecture"), {}).get("qk_permuted", False))

    def __getitem__(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightsError(f"{self.path}: no tensor '{name}'") from None

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def weights(self) -> dict[str, np.ndarray]:
        """{Hugging Face name: data view}: typed arrays or packed uint8 rows, as stored."""
        return {name: t.data for name, t in self.tensors.items()}

    def hf_array(self, name: str) -> np.ndarray:
        """The tensor in Hugging Face layout: the view itself, except q_proj / k_proj weights
        and biases of a permuted (llama) file, which come back un-permuted (a copy)."""
        t = self[name]
        if self.qk_permuted and re.search(r"\.self_attn\.[qk]_proj\.(weight|bias)\Z", name):
            arch = self.architecture
            heads = self.get(f"{arch}.attention.head_count", int)
            if ".k_proj." in name:
                heads = self.get(f"{arch}.attention.head_count_kv", int, heads)
            return unpermute_qk(t.data, heads)
        return t.data

    def value_type(self, key: str) -> GGUFValueType:
        """The stored GGUF value type of metadata key `key` (KeyError when absent)."""
        return GGUFValueType(self._types[key])

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        """Metadata value `key` checked to be a `kind` (int, float, bool, str, list): `default`
        when absent (ConfigError naming the key when no default is given). An int is not a bool;
        a float accepts ints, and float32 values come back as the shortest decimal that rounds
        to the same float32 (1e-05, not 9.999999747378752e-06); a string array comes back as a
        list of str (a copy: the metadata keeps it as GGUFStrings)."""
        if key not in self.metadata:
            if default is ...:
                raise ConfigError(f"{self.path}: missing required metadata key '{key}'")
            return default
        v = self.metadata[key]
        if kind is list and isinstance(v, GGUFStrings):
            return list(v)
        if not isinstance(v, (int, float) if kind is float else kind) or (kind is not bool and isinstance(v, bool)):
            raise ConfigError(f"{self.path}: metadata key '{key}' must be {kind.__name__}, got "
                              f"{type(v).__name__} {str(v)[:100]}")
        if kind is float:
            if self._types.get(key) == GGUFValueType.FLOAT32:
                return float(np.format_float_positional(np.float32(v), unique=True, trim="0"))
            return float(v)
        return v

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, v{self.version}, arch={self.metadata.get('general.architecture')!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

def llama3_rope_factors(rope_theta: float, head_dim: int, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: int) -> np.ndarray:
    """The (head_dim // 2,) float32 frequency factors that llama.cpp's converter stores as
    rope_freqs for Llama 3 RoPE scaling; llama.cpp divides each base frequency by its factor:
        wavelen_i = 2 pi / theta^(-2i/d)
        factor_i  = 1                          if wavelen_i < old / high_freq_factor
                  = factor                     if wavelen_i > old / low_freq_factor
                  = 1 / ((1 - s) / factor + s) otherwise, s = (old / wavelen_i - low) / (high - low)
    (Hugging Face's llama3 inv_freq is exactly base inv_freq / factor_i.) Float32 throughout."""
    f32 = np.float32
    inv = f32(1.0) / (np.float64(rope_theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / f32(head_dim))
                      ).astype(np.float32)
    wavelen = f32(2 * math.pi) / inv
    old, fac = f32(original_max_position_embeddings), f32(factor)
    low, high = f32(low_freq_factor), f32(high_freq_factor)
    smooth = (old / wavelen - low) / (high - low)
    mid = f32(1.0) / ((f32(1.0) - smooth) / fac + smooth)
    out = np.where(wavelen < old / high, f32(1.0), np.where(wavelen > old / low, fac, mid))
    return out.astype(np.float32)


def _rope_scaling(gf: GGUFFile, arch: str, theta: float, head_dim: int) -> dict | None:
    """Hugging Face rope_scaling for the file: None, or the llama3 dict whose factors reproduce
    the file's rope_freqs tensor. llama.cpp's converter writes llama3 scaling only as that tensor
    (computed with original_max_position_embeddings = 8192 unless the HF config has it at top
    level); {arch}.rope.scaling.* keys, when present, are honoured as hints."""
    stype = gf.metadata.get(f"{arch}.rope.scaling.type", "none")
    if stype != "none":
        raise ConfigError(f"{gf.path}: metadata key '{arch}.rope.scaling.type' = {stype!r} is not supported "
                          "(rlx runs plain RoPE, and llama3 scaling given as a rope_freqs tensor)")
    factors = gf.rope_freqs
    if factors is None:
        return None
    f = np.asarray(factors, dtype=np.float64)
    if f.shape != (head_dim // 2,):
        raise ConfigError(f"{gf.path}: rope_freqs has shape {factors.shape}, expected ({head_dim // 2},) "
                          f"for head_dim {head_dim}")
    if not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise ConfigError(f"{gf.path}: rope_freqs holds non-positive or non-finite factors")
    if np.all(f == 1.0):
        return None
    factor = float(gf.metadata.get(f"{arch}.rope.scaling.factor", float(np.float32(f.max()))))
    olds = [gf.metadata[f"{arch}.rope.scaling.original_context_length"]] \
        if f"{arch}.rope.scaling.original_context_length" in gf.metadata else []
    olds += [8192]
    inv = 1.0 / (np.float64(theta) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    candidates: list[tuple[float, float, int]] = []
    for old in olds:
        candidates.append((1.0, 4.0, old))  # Llama 3.1 / 3.2
        # s = (old / wavelen - low) / (high - low) is linear in 1 / wavelen: fit it on the
        # smoothed entries (strictly between 1 and factor).
        mid = (f > 1.0 + 1e-6) & (f < factor * (1 - 1e-6))
        if mid.sum() >= 2 and factor != 1.0:
            s = (1.0 / f[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)
            x = old * inv[mid] / (2 * math.pi)
            a, b = np.polyfit(x, s, 1)  # s = a x + b, a = 1 / (high - low), b = -low / (high - low)
            if a > 0:
                low = round(-b / a, 4)
                candidates.append((low, round(low + 1.0 / a, 4), old))
    for low, high, old in candidates:
        if high <= low:
            continue
        want = llama3_rope_factors(theta, head_dim, factor, low, high, int(old))
        if np.allclose(want, f, rtol=1e-5, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": int(old)}
    raise ConfigError(f"{gf.path}: rope_freqs factors {np.round(f, 4).tolist()} do not follow the llama3 "
                      f"formula for any original context in {olds} (factor {factor}): unsupported RoPE scaling")


def config_from_gguf(gguf_file: GGUFFile | str | os.PathLike) -> ModelConfig:
    """The LlamaConfig / Qwen3Config / Qwen3MoeConfig a GGUF file describes (Hugging Face keys through
    `config_from_dict`). Metadata keys, {arch} = general.architecture:
        vocab_size              token_embd rows, else len(tokenizer.ggml.tokens), else {arch}.vocab_size
        hidden_size             {arch}.embedding_length
        intermediate_size       {arch}.feed_forward_length
        num_hidden_layers       {arch}.block_count
        num_attention_heads     {arch}.attention.head_count
        num_key_value_heads     {arch}.attention.head_count_kv (default: head_count)
        head_dim                {arch}.attention.key_length (default: hidden / heads)
        max_position_embeddings {arch}.context_length
        rms_norm_eps            {arch}.attention.layer_norm_rms_epsilon
        rope_theta              {arch}.rope.freq_base (default 10000, as llama.cpp)
        rope_scaling            the rope_freqs tensor (see `_rope_scaling`)
        tie_word_embeddings     no output.weight tensor
        attention_bias          q/k/v/o bias tensors (all four or none)
        mlp_bias                gate/up/down bias tensors (all three or none)
        bos_token_id            tokenizer.ggml.bos_token_id
        eos_token_id            tokenizer.ggml.eos_token_id, then eot / eom ids when present
    and for a mixture of experts (architecture "qwen3moe", model_type "qwen3_moe"):
        num_experts             {arch}.expert_count
        num_experts_per_tok     {arch}.expert_used_count
        moe_intermediate_size   {arch}.expert_feed_forward_length
        intermediate_size       {arch}.feed_forward_length (default: the expert's: no layer is dense)
        norm_topk_prob          True, and every layer sparse: llama.cpp's qwen3moe graph has no key
                                for either (it always renormalises, as Qwen3-MoE's released configs do)
    A file without tensors (a vocabulary-only file) gets tie_word_embeddings = False and no
    biases: those facts live in the tensors."""
    gf = gguf_file if isinstance(gguf_file, GGUFFile) else GGUFFile(gguf_file)
    arch = gf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"{gf.path}: missing required metadata key 'general.architecture'")
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{gf.path}: architecture '{arch}' (general.architecture) is not supported "
                          f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    k = f"{arch}."
    hidden = gf.get(k + "embedding_length", int)
    heads = gf.get(k + "attention.head_count", int)
    kv_heads = gf.get(k + "attention.head_count_kv", int, heads)
    if heads <= 0:
        raise ConfigError(f"{gf.path}: metadata key '{k}attention.head_count' must be positive, got {heads}")
    head_dim = gf.get(k + "attention.key_length", int, hidden // heads)
    v_len = gf.get(k + "attention.value_length", int, head_dim)
    if v_len != head_dim:
        raise ConfigError(f"{gf.path}: '{k}attention.value_length' = {v_len} differs from key_length {head_dim} "
                          "(not supported)")
    rope_dims = gf.get(k + "rope.dimension_count", int, head_dim)
    if rope_dims != head_dim:
        raise ConfigError(f"{gf.path}: '{k}rope.dimension_count' = {rope_dims} is not head_dim {head_dim} "
                          "(partial rotary embeddings are not supported)")
    theta = gf.get(k + "rope.freq_base", float, 10000.0)

    tokens = gf.metadata.get("tokenizer.ggml.tokens")
    embd = gf.tensors.get("model.embed_tokens.weight")
    if embd is not None:
        vocab = embd.shape[0]
        if isinstance(tokens, GGUFStrings) and len(tokens) != vocab:
            raise ConfigError(f"{gf.path}: token_embd.weight has {vocab} rows but tokenizer.ggml.tokens holds "
                              f"{len(tokens)} tokens")
    elif isinstance(tokens, GGUFStrings):
        vocab = len(tokens)
    else:
        vocab = gf.get(k + "vocab_size", int)

    names = set(gf.tensors)
    layers = gf.get(k + "block_count", int)

    def present(parts: tuple[str, ...], what: str) -> bool:
        have = [p for p in parts if any(n.endswith(f".{p}.bias") for n in names)]
        if have and len(have) != len(parts):
            raise ConfigError(f"{gf.path}: {what} biases on {', '.join(have)} only; rlx supports all of "
                              f"{', '.join(parts)} or none")
        return bool(have)

    # a mixture's dense MLP size is optional: no layer of llama.cpp's qwen3moe is dense
    dense_default = (gf.get(k + "expert_feed_forward_length", int),) if arch == "qwen3moe" else ()
    d: dict[str, Any] = {
        "model_type": MODEL_TYPES.get(arch, arch),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": gf.get(k + "feed_forward_length", int, *dense_default),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": gf.get(k + "context_length", int),
        "rms_norm_eps": gf.get(k + "attention.layer_norm_rms_epsilon", float),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(gf, arch, theta, head_dim),
        "hidden_act": "silu",
        "tie_word_embeddings": bool(names) and "lm_head.weight" not in names,
        "attention_bias": present(("q_proj", "k_proj", "v_proj", "o_proj"), "attention"),
    }
    if arch == "llama":
        d["mlp_bias"] = present(("gate_proj", "up_proj", "down_proj"), "MLP")
    if arch == "qwen3moe":
        d.update(num_experts=gf.get(k + "expert_count", int), num_experts_per_tok=gf.get(k + "expert_used_count", int),
                 moe_intermediate_size=gf.get(k + "expert_feed_forward_length", int), norm_topk_prob=True)
    bos = gf.get("tokenizer.ggml.bos_token_id", int, None)
    if bos is not None:
        d["bos_token_id"] = bos
    eos = [gf.get(key, int, None) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                              "tokenizer.ggml.eom_token_id")]
    eos = list(dict.fromkeys(e for e in eos if e is not None))
    if eos:
        d["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    try:
        return config_from_dict(d)
    except ConfigError as e:
        raise ConfigError(f"{gf.path}: {e}") from None


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether path is a regular file that starts with the GGUF magic (never opens anything else:
    a FIFO would block)."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, ValueError):  # ValueError: an embedded NUL in the path
        return False


def model_config(gguf_file: GGUFFile | str | os.PathLike) -> ModelConfig:
    """config_from_gguf, plus how the file stores q / k: a Llama file keeps llama.cpp's permuted
    rows, which rlx reads as they are (rope_interleaved: RoPE turns adjacent pairs; no copy)."""
    gf = gguf_file if isinstance(gguf_file, GGUFFile) else GGUFFile(gguf_file)
    cfg = config_from_gguf(gf)
    return dataclasses.replace(cfg, rope_interleaved=gf.qk_permuted) if gf.qk_permuted else cfg


def model_weights(gguf_file: GGUFFile | str | os.PathLike) -> dict:
    """{Hugging Face name: weight} for rlx.Generator: F32 / F16 / BF16 tensors as zero-copy typed
    views, block-quantized ones as rlx.weights.Packed views of their blocks (executed packed). q / k
    stay as stored (see model_config)."""
    from rlx.weights import Packed

    gf = gguf_file if isinstance(gguf_file, GGUFFile) else GGUFFile(gguf_file)
    out: dict = {}
    for name, t in gf.tensors.items():
        out[name] = Packed(t.data, t.type_name.lower(), t.shape) if t.quantized else t.data
    return out
