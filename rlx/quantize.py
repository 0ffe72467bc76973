"""Quantising models: a Hugging Face directory or a GGUF file to a GGUF file that llama.cpp reads,
and the matrices of a model in memory at load.

    rlx.quantize("path/to/hf-model", "model-q4_k_m.gguf", type="q4_k_m", progress=True)
    rlx.load("path/to/hf-model", dtype="q8_0")             # the same recipe, kept in memory
    python -m rlx quantize SRC DST --type q4_k_m

Types: llama-quantize's file types for the block types rlx has (RECIPES): "f32", "f16", "bf16",
"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m",
"q5_k_s", "q5_k_m", "q6_k"; and "q3_k", "q4_k", "q5_k": every matrix of that type (llama-quantize
--pure). Each tensor's type is chosen as llama.cpp's llama_tensor_get_type (src/llama-quant.cpp)
chooses it (`tensor_type`), checked against llama.cpp's own choices in the tests:

    type      most matrices  attn_v                  ffn_down                   attn_output  output*
    f32/f16/bf16  that type  =                       =                          =            =
    q8_0      q8_0           =                       =                          =            q8_0
    q4_0 ... q5_1  that type =                       =                          =            q6_k
    q2_k      q2_k           q3_k (q4_k if GQA >= 4) q3_k                       q3_k         q6_k
    q3_k_s    q3_k           =                       =                          =            q6_k
    q3_k_m    q3_k           q5_k layers 0-1, q4_k   q5_k first 1/16, else q4_k q4_k         q6_k
    q3_k_l    q3_k           q5_k                    q5_k                       q5_k         q6_k
    q4_k_s    q4_k           q5_k layers 0-3         q5_k first 1/8             =            q6_k
    q4_k_m    q4_k           q6_k on "more bits"     q6_k on "more bits"        =            q6_k
    q5_k_s    q5_k           =                       =                          =            q6_k
    q5_k_m    q5_k           q6_k on "more bits"     q6_k on "more bits"        =            q6_k
    q6_k      q6_k           =                       =                          =            q6_k
    q3_k/q4_k/q5_k  that type, every matrix (output and embedding too)

  (= : the type of most matrices.) *output: output.weight, or token_embd.weight when the
  embeddings are tied (one tensor is both); an untied token_embd keeps the type of most
  matrices. "More bits" layers: i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2 (n layers; for 16
  layers: 0, 1, 4, 7, 10, 13, 14, 15). A Llama of 80 layers with GQA (llama.cpp's "70B") gets q5_k
  for an attn_v of q3_k / q4_k. Norms, biases and rope_freqs (1-D) are never quantised (F32).
  A mixture of experts (Qwen3-MoE): the stacked experts ffn_gate_exps / ffn_up_exps / ffn_down_exps
  (E, out, in) take the rules of ffn_gate / ffn_up / ffn_down by their layer (so q4_k_m gives the
  "more bits" layers' ffn_down_exps q6_k); the router ffn_gate_inp is never quantised (F32, as
  llama.cpp's converter writes it and llama-quantize keeps it). A model of exactly 8 experts gets
  llama.cpp's Mixtral rules: attn_v and attn_k q8_0 in every recipe with rules, attn_output q5_k for
  q2_k / q3_k_s / q3_k_m / q4_k_s / q4_k_m (other recipes keep the type of most matrices there).
  Shape fallbacks (a row of in_features values must be whole blocks): an output whose rows are not
  whole blocks of the recipe's type is q8_0; then q2_k, q3_k -> q4_0, q4_k -> q5_0, q5_k -> q5_1,
  q6_k -> q8_0, and a 32-block type that still does not fit -> f16 (stories260K, hidden 64 and
  ffn 172: its K matrices fall back to 32-block types and ffn_down to f16, as llama.cpp does).

Quantisation is the C core's (`rlx._C.quantize`, csrc/core/quantize.c): bit for bit gguf-py's
quantize for bf16 / f16 / Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1, and llama.cpp's reference quantisers
for the K types (no importance matrix). Rows are quantised in chunks on `threads` threads (the
core releases the GIL).

The file: general.architecture "llama", "qwen3" or "qwen3moe", every hyperparameter key rlx's reader
and llama.cpp read (a mixture adds expert_count, expert_used_count and expert_feed_forward_length),
general.file_type and general.quantization_version; Llama q / k rows permuted as llama.cpp's
converter does (rlx.gguf.permute_qk); Llama 3 RoPE scaling as the rope_freqs tensor; no
output.weight when the embeddings are tied; a mixture's experts stacked per projection and layer,
blk.N.ffn_{gate,up,down}_exps.weight of GGUF dims [in, out, E] (a Hugging Face file's E parts are
read in place and stacked as the rows are quantised). Tokenizer: from a GGUF source every key is copied
(tokenizer.* included); from a Hugging Face directory, a SentencePiece model (tokenizer.model or a
single *.model) is written as tokenizer.ggml.model "llama" (pieces, scores, token types), a
byte-level BPE tokenizer.json as "gpt2" with pre "llama-bpe" (Llama 3) or "qwen2" (Qwen2 / Qwen3),
told apart by the pre-tokenizer's regex; special ids, add_bos / add_eos and the chat template
through gguf-py's SpecialVocab (what llama.cpp's converter uses); the vocabulary padded with
[PADi] tokens to vocab_size. A directory without a tokenizer gives a file without a vocabulary,
tokenizer.ggml.model "no_vocab" (llama.cpp then loads it and runs token ids; without the key it
refused the file), the bos / eos ids of config.json still written.

Memory: tensor by tensor, in chunks of rows; never an f32 copy of the whole model (the largest
single tensor's output is held while it is written). The file is written as dst + ".part" and
renamed when complete; a failure removes it.

Errors: an unknown type (ValueError naming the known ones), an unsupported architecture, or a
config GGUF cannot hold (rlx.ConfigError: a sliding window, RoPE scaling other than Llama 3's, a
mixture with dense layers or without norm_topk_prob), an unreadable source, NaN / inf in a tensor, values
too large for a type's f16 scales, or a quantised source without allow_requantize
(rlx.WeightsError naming the file and tensor).

`rlx.quantize` is the function `quantize`; take the module's other names with
`from rlx.quantize import RECIPES, tensor_type` (`import rlx.quantize as m` gives the function).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import os
import re
import sys
from collections.abc import Callable

import numpy as np

from rlx import _C
from rlx import dtypes as _dtypes
from rlx.errors import ConfigError, WeightsError

__all__ = ["RECIPES", "Recipe", "quantize", "quantize_weights", "tensor_type"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A file type: the dtype of most matrices, llama.cpp's llama_ftype (general.file_type), and
    whether llama.cpp's per-tensor rules apply (False: every matrix `default`, llama-quantize --pure)."""

    name: str
    default: str
    file_type: int
    rules: bool


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("f32", "f32", 0, False), Recipe("f16", "f16", 1, False), Recipe("bf16", "bf16", 32, False),
    Recipe("q8_0", "q8_0", 7, True), Recipe("q4_0", "q4_0", 2, True), Recipe("q4_1", "q4_1", 3, True),
    Recipe("q5_0", "q5_0", 8, True), Recipe("q5_1", "q5_1", 9, True),
    Recipe("q2_k", "q2_k", 10, True), Recipe("q3_k_s", "q3_k", 11, True), Recipe("q3_k_m", "q3_k", 12, True),
    Recipe("q3_k_l", "q3_k", 13, True), Recipe("q4_k_s", "q4_k", 14, True), Recipe("q4_k_m", "q4_k", 15, True),
    Recipe("q5_k_s", "q5_k", 16, True), Recipe("q5_k_m", "q5_k", 17, True), Recipe("q6_k", "q6_k", 18, True),
    Recipe("q3_k", "q3_k", 11, False), Recipe("q4_k", "q4_k", 14, False), Recipe("q5_k", "q5_k", 16, False),
)}

_PLAIN = ("f32", "f16", "bf16")
# llama.cpp's tensor_type_fallback: a 256-block type whose rows do not fit -> a 32-block type.
_FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
_CHUNK = 1 << 20  # values per quantisation task (4 MB of f32)


def recipe(type: str) -> Recipe:
    """The Recipe named `type` (case-insensitive); ValueError naming the known ones."""
    r = RECIPES.get(type.lower()) if isinstance(type, str) else None
    if r is None:
        raise ValueError(f"unknown quantisation type {type!r} (known: {', '.join(RECIPES)})")
    return r


# ---------------------------------------------------------------------------------------------
# Per-tensor types (llama.cpp's llama_tensor_get_type)
# ---------------------------------------------------------------------------------------------

def _category(name: str) -> str:
    """llama.cpp's tensor category of a GGUF name (tensor_get_category)."""
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for part in ("attn_v", "attn_k", "attn_q", "attn_output"):
        if f"{part}.weight" in name:
            return part
    for part in ("ffn_up", "ffn_gate", "ffn_down"):
        if part in name:
            return part
    return "other"


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fit(dtype: str, cols: int) -> str:
    """dtype, or its fallback when rows of `cols` values are not whole blocks of it."""
    if cols % _dtypes.DTYPES[dtype].block_size == 0:
        return dtype
    dtype = _FALLBACK.get(dtype, dtype)
    return dtype if cols % _dtypes.DTYPES[dtype].block_size == 0 else "f16"


def tensor_type(type: str | Recipe, name: str, shape: tuple[int, ...], cfg, tied: bool | None = None) -> str | None:
    """The rlx dtype that `type` gives GGUF tensor `name` of (Hugging Face) shape `shape` in a model
    of config `cfg` (tied: whether token_embd is also the output; default cfg.tie_word_embeddings),
    or None for a tensor that is not quantised (1-D: norms, biases, rope_freqs; a mixture's router
    ffn_gate_inp). Stacked experts (E, out, in) are typed as the matrix of their projection."""
    r = type if isinstance(type, Recipe) else recipe(type)
    if len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name or "ffn_gate_inp" in name:
        return None
    new = r.default
    if new in _PLAIN:
        return new
    cols = shape[-1]
    tied = cfg.tie_word_embeddings if tied is None else tied
    cat = _category(name)
    m = re.match(r"blk\.(\d+)\.", name)
    i, n = (int(m.group(1)) if m else 0), cfg.num_hidden_layers
    gqa = cfg.num_attention_heads // cfg.num_key_value_heads
    experts8 = getattr(cfg, "num_experts", 0) == 8  # llama.cpp's rules for an 8-expert model (Mixtral)
    ft = r.name
    if r.rules and (cat == "output" or (tied and cat == "token_embd")):
        if cols % _dtypes.DTYPES[new].block_size:
            new = "q8_0"
        elif new != "q8_0":
            new = "q6_k"
    elif r.rules and cat == "attn_v":
        if ft == "q2_k":
            new = "q4_k" if gqa >= 4 else "q3_k"
        elif ft == "q3_k_m":
            new = "q5_k" if i < 2 else "q4_k"
        elif ft == "q3_k_l":
            new = "q5_k"
        elif ft in ("q4_k_m", "q5_k_m") and _more_bits(i, n):
            new = "q6_k"
        elif ft == "q4_k_s" and i < 4:
            new = "q5_k"
        if cfg.model_type == "llama" and n == 80 and gqa > 1 and new in ("q3_k", "q4_k"):
            new = "q5_k"  # llama.cpp's LLM_TYPE_70B: a small attn_v shared by 8 heads
        if experts8:
            new = "q8_0"
    elif r.rules and cat == "attn_k" and experts8:
        new = "q8_0"
    elif r.rules and cat == "ffn_down":
        if ft == "q2_k":
            new = "q3_k"
        elif ft == "q3_k_m":
            new = "q5_k" if i < n // 16 else "q4_k"
        elif ft == "q3_k_l":
            new = "q5_k"
        elif ft in ("q4_k_m", "q5_k_m") and _more_bits(i, n):
            new = "q6_k"
        elif ft == "q4_k_s" and i < n // 8:
            new = "q5_k"
    elif r.rules and cat == "attn_output" and experts8:
        new = "q5_k" if ft in ("q2_k", "q3_k_s", "q3_k_m", "q4_k_s", "q4_k_m") else new
    elif r.rules and cat == "attn_output":
        new = {"q2_k": "q3_k", "q3_k_m": "q4_k", "q3_k_l": "q5_k"}.get(ft, new)
    return _fit(new, cols)


# ---------------------------------------------------------------------------------------------
# Converting one tensor
# ---------------------------------------------------------------------------------------------

def _threads(threads: int | None) -> int:
    if threads is None:
        return max(1, _C.get_num_threads())
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    return threads


def _convert(rows_of: Callable[[int, int], np.ndarray], rows: int, cols: int, dtype: str,
             threads: int) -> np.ndarray:
    """(rows, bytes per row) uint8: rows_of(r0, r1) -> (r1 - r0, cols) float32 quantised to dtype,
    in chunks of rows on `threads` threads (rlx._C.quantize releases the GIL)."""
    out = np.empty((rows, _dtypes.nbytes(dtype, (cols,))), np.uint8)
    step = max(1, _CHUNK // max(cols, 1))

    def work(r0: int) -> None:
        r1 = min(rows, r0 + step)
        out[r0:r1] = _C.quantize(rows_of(r0, r1), dtype)

    starts = range(0, rows, step)
    if threads > 1 and len(starts) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(threads, len(starts))) as ex:
            list(ex.map(work, starts))
    else:
        for r0 in starts:
            work(r0)
    return out


def _typed_rows(arr: np.ndarray, perm: np.ndarray | None) -> Callable[[int, int], np.ndarray]:
    """rows_of for a typed array viewed as (rows, cols), rows taken through perm when given."""
    flat = arr.reshape(-1, arr.shape[-1]) if arr.ndim else arr.reshape(1, 1)

    def rows_of(r0: int, r1: int) -> np.ndarray:
        part = flat[perm[r0:r1]] if perm is not None else flat[r0:r1]
        return np.ascontiguousarray(part, dtype=np.float32)

    return rows_of


def _parts_rows(parts: list, rows_per_part: int) -> Callable[[int, int], np.ndarray]:
    """rows_of for E typed parts (rows_per_part, cols) stacked (E * rows_per_part, cols) (a mixture's
    experts from a Hugging Face file: each part in place, a chunk copied only as float32)."""
    def rows_of(r0: int, r1: int) -> np.ndarray:
        pieces = []
        while r0 < r1:
            e, r = divmod(r0, rows_per_part)
            take = min(r1 - r0, rows_per_part - r)
            pieces.append(np.asarray(parts[e][r:r + take], dtype=np.float32))
            r0 += take
        return np.ascontiguousarray(np.concatenate(pieces) if len(pieces) > 1 else pieces[0])

    return rows_of


def _packed_rows(raw: np.ndarray, dtype: str, cols: int) -> Callable[[int, int], np.ndarray]:
    """rows_of for packed block rows (rows, bytes per row): dequantised by the core."""
    def rows_of(r0: int, r1: int) -> np.ndarray:
        return _C.to_f32(np.ascontiguousarray(raw[r0:r1]).reshape(-1), dtype).reshape(r1 - r0, cols)

    return rows_of


# ---------------------------------------------------------------------------------------------
# Quantising in memory (Generator(..., dtype="q4_k_m"))
# ---------------------------------------------------------------------------------------------

def quantize_weights(cfg, weights: dict, type: str, threads: int | None = None) -> dict:
    """A copy of `weights` ({Hugging Face name: array or rlx.Packed}) whose matrices are converted as
    `type` converts them in a file (tensor_type): block types as rlx.Packed, f32 / f16 / bf16 as
    arrays. q / k rows stay in the order they have (quantisation is row by row). A mixture's experts
    are converted where they are: a stacked (E, out, in) tensor (a GGUF file's) as one, a Hugging
    Face file's parts (model.layers.N.mlp.experts.E.gate_proj.weight ...) each on its own, with the
    type of their stacked tensor; its router (mlp.gate.weight) becomes f32, as a file holds it. A
    Packed matrix already of its type is kept; one of another type raises WeightsError (rlx does
    not requantise in memory). Names the decoder does not expect, and mis-shaped tensors, are
    passed through for rlx.weights.check_weights to report."""
    from rlx import gguf
    from rlx.weights import block_params, expert_parts

    r = recipe(type)
    n_threads = _threads(threads)
    arch = gguf.gguf_arch(cfg.model_type)
    parts = expert_parts(cfg)
    out = dict(weights)
    for name, shape, kind in block_params(cfg):
        if kind not in ("matrix", "experts"):
            continue
        dtype = tensor_type(r, gguf.gguf_name(name, arch), shape, cfg)
        if name in weights:
            out[name] = _in_memory(name, weights[name], shape, dtype, r, n_threads)
        elif kind == "experts":
            for part in parts[name]:
                if part in weights:
                    out[part] = _in_memory(part, weights[part], shape[1:], dtype, r, n_threads)
    return out


def _in_memory(name: str, value, shape: tuple[int, ...], dtype: str | None, r: Recipe, threads: int):
    """One matrix of quantize_weights converted to dtype (None: f32, a router), or passed through
    when mis-shaped."""
    from rlx.weights import Packed

    if (tuple(value.shape) if isinstance(value, Packed) else tuple(np.shape(value))) != shape:
        return value
    if isinstance(value, Packed):
        if dtype is not None and _dtypes.parse(value.dtype).name != dtype:
            raise WeightsError(f"tensor '{name}' is packed {value.dtype}; dtype={r.name!r} asks for {dtype} and "
                               "rlx does not requantise in memory (quantise the f32 / f16 / bf16 model, or use "
                               "rlx.quantize(..., allow_requantize=True))")
        return value
    arr = np.asarray(value)
    if dtype is None:
        return arr.astype(np.float32, copy=False)
    try:
        raw = _convert(_typed_rows(arr, None), int(np.prod(shape[:-1])), shape[-1], dtype, threads)
    except ValueError as e:
        raise WeightsError(f"tensor '{name}': {e}") from None
    d = _dtypes.DTYPES[dtype]
    return Packed(raw, dtype, shape) if d.is_block else raw.view(d.numpy).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Sources: what a GGUF file is written from
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Tensor:
    name: str                     # GGUF name
    hf: str                       # Hugging Face name ("" for rope_freqs)
    shape: tuple[int, ...]        # Hugging Face order: (rows, in_features), stacked experts (E, out, in)
    stored: str                   # rlx dtype of the source data
    raw: np.ndarray | list        # the source data as stored (typed array or packed uint8 rows), or a
                                  # Hugging Face file's expert parts (E typed arrays (out, in))
    perm: np.ndarray | None = None  # GGUF row r = source row perm[r] (Llama q / k from Hugging Face)

    def rows_of(self) -> Callable[[int, int], np.ndarray]:
        if isinstance(self.raw, list):
            return _parts_rows(self.raw, self.shape[1])
        if _dtypes.DTYPES[self.stored].is_block:
            return _packed_rows(self.raw, self.stored, self.shape[-1])
        return _typed_rows(self.raw, self.perm)

    def stored_bytes(self) -> np.ndarray:
        """The source data, unchanged, as uint8 (..., bytes per row); parts are stacked (a copy)."""
        raw = np.stack(self.raw) if isinstance(self.raw, list) else self.raw
        return np.ascontiguousarray(raw).view(np.uint8).reshape(*self.shape[:-1], -1)


_VALUE_TYPES = None  # numpy dtype -> gguf value type (filled on first use)


def _array_value_type(arr: np.ndarray):
    import gguf as gguf_py

    global _VALUE_TYPES
    if _VALUE_TYPES is None:
        V = gguf_py.GGUFValueType
        _VALUE_TYPES = {np.dtype(k): v for k, v in (
            ("<u1", V.UINT8), ("<i1", V.INT8), ("<u2", V.UINT16), ("<i2", V.INT16), ("<u4", V.UINT32),
            ("<i4", V.INT32), ("<u8", V.UINT64), ("<i8", V.INT64), ("<f4", V.FLOAT32), ("<f8", V.FLOAT64),
            ("?", V.BOOL))}
    return _VALUE_TYPES[arr.dtype]


class _GGUFSource:
    """A GGUF file: its config, its tensors as stored, and all of its metadata copied."""

    # keys the writer sets itself (or that would be wrong in the new file)
    _SKIP = ("general.architecture", "general.alignment", "general.file_type", "general.quantization_version")

    def __init__(self, path: str):
        from rlx import gguf

        self.path = path
        self.gf = gguf.GGUFFile(path)
        self.cfg = gguf.config_from_gguf(self.gf)
        self.arch = self.gf.architecture
        self.tied = "lm_head.weight" not in self.gf.tensors
        self.tensors: list[_Tensor] = []
        if self.gf.rope_freqs is not None:
            f = self.gf.rope_freqs
            self.tensors.append(_Tensor("rope_freqs.weight", "", tuple(f.shape), "f32", f))
        for hf, t in self.gf.tensors.items():
            if t.type_name.lower() not in _dtypes.DTYPES:
                raise WeightsError(f"{path}: tensor '{t.gguf_name}' is of type {t.type_name}, which rlx does not read")
            self.tensors.append(_Tensor(t.gguf_name, hf, tuple(t.shape), t.type_name.lower(), t.data))

    def write_metadata(self, w) -> None:
        import gguf as gguf_py

        V = gguf_py.GGUFValueType
        for key, value in self.gf.metadata.items():
            if key in self._SKIP or key.startswith("split."):
                continue
            vt = self.gf.value_type(key)
            if vt != V.ARRAY:
                w.add_key_value(key, value, vt)
            elif isinstance(value, np.ndarray):
                if len(value):
                    w.add_key_value(key, value.tolist(), V.ARRAY, _array_value_type(value))
            elif all(isinstance(v, str) for v in value):
                if value:
                    w.add_key_value(key, list(value), V.ARRAY, V.STRING)
            else:
                raise WeightsError(f"{self.path}: metadata key '{key}' is an array of arrays, which rlx does not "
                                   "copy")


def _check_mixture(path: str, cfg) -> None:
    """A mixture of experts GGUF can hold: llama.cpp's qwen3moe graph makes every layer sparse and
    renormalises the chosen experts' weights, and has no key that says otherwise."""
    sparse = [cfg.layer_sparse(i) for i in range(cfg.num_hidden_layers)]
    if any(sparse) and not all(sparse):
        dense = [i for i, s in enumerate(sparse) if not s]
        raise ConfigError(f"{path}: layers {dense} are dense (mlp_only_layers / decoder_sparse_step); a GGUF "
                          "qwen3moe file has no key for dense layers (llama.cpp makes every layer sparse)")
    if any(sparse) and not cfg.norm_topk_prob:
        raise ConfigError(f"{path}: norm_topk_prob = False has no GGUF key (llama.cpp's qwen3moe always "
                          "renormalises the chosen experts' weights): the file would be another model")


class _HFSource:
    """A Hugging Face directory: config.json, safetensors, and a tokenizer when there is one."""

    def __init__(self, path: str):
        from rlx import gguf
        from rlx.config import load_config
        from rlx.weights import block_params, check_weights, load_weights

        self.path = path
        self.cfg = cfg = load_config(path)
        self.tied = cfg.tie_word_embeddings
        try:
            self.arch = gguf.gguf_arch(cfg.model_type)
        except KeyError:
            raise ConfigError(f"{path}: architecture '{cfg.model_type}' has no GGUF mapping in rlx") from None
        _check_mixture(path, cfg)
        if any(cfg.layer_window(i) for i in range(cfg.num_hidden_layers)):
            raise ConfigError(f"{path}: a Qwen3 sliding window (use_sliding_window) has no GGUF key and llama.cpp's "
                              "qwen3 has none: the file would be another model")
        if cfg.rope_scaling and self.arch != "llama":
            raise ConfigError(f"{path}: RoPE scaling {cfg.rope_scaling['rope_type']} for {self.arch} has no GGUF form "
                              "(llama.cpp reads Llama 3 scaling as rope_freqs for llama only)")
        weights = check_weights(cfg, load_weights(path))
        self.tensors = []
        if cfg.rope_scaling:
            s = cfg.rope_scaling
            f = gguf.llama3_rope_factors(cfg.rope_theta, cfg.head_dim, s["factor"], s["low_freq_factor"],
                                         s["high_freq_factor"], s["original_max_position_embeddings"])
            self.tensors.append(_Tensor("rope_freqs.weight", "", tuple(f.shape), "f32", f))
        for name, shape, kind in block_params(cfg):
            if kind == "derived":
                continue
            arr = weights[name]  # experts: a list of their parts (check_weights), or one stacked array
            perm = None
            if self.arch == "llama" and re.search(r"\.self_attn\.[qk]_proj\.(weight|bias)\Z", name):
                heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
                perm = gguf.permute_qk(np.arange(shape[0]), heads)
            stored = _dtypes.of_array(arr[0] if isinstance(arr, list) else arr).name
            self.tensors.append(_Tensor(gguf.gguf_name(name, self.arch), name, shape, stored, arr, perm))

    def write_metadata(self, w) -> None:
        cfg = self.cfg
        w.add_type("model")
        w.add_name(os.path.basename(os.path.normpath(self.path)))
        write_hparams(w, cfg)
        if self.arch == "qwen3moe":  # as llama.cpp's convert_hf_to_gguf.py (Qwen2MoeModel) writes them
            w.add_expert_count(cfg.num_experts)
            w.add_expert_used_count(cfg.num_experts_per_tok)
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if cfg.rope_scaling and cfg.rope_scaling["original_max_position_embeddings"] != 8192:
            # a hint for rlx's reader (llama.cpp assumes 8192 when it sees none, and uses the key for YaRN only)
            w.add_rope_scaling_orig_ctx_len(cfg.rope_scaling["original_max_position_embeddings"])
        _write_hf_tokenizer(w, self.path, cfg)


def write_hparams(w, cfg, rope_dims: bool = True, vocab_size: bool = True) -> None:
    """The decoder hyperparameters of cfg (HF config names, as attributes) on the GGUF writer w, in
    the order llama.cpp's converter writes them; the rope dimension count and the vocabulary size
    only when asked (the benchmarks' MoE source file, as that converter's, has neither)."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    if rope_dims:
        w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if vocab_size:
        w.add_vocab_size(cfg.vocab_size)


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizers -> tokenizer.ggml.*
# ---------------------------------------------------------------------------------------------

# Hugging Face's byte-level pre-tokenizer regexes -> llama.cpp's tokenizer.ggml.pre.
_HF_PRE = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":  # noqa: E501
        "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
}
# llama.cpp's token types
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _sentencepiece_file(path: str) -> str | None:
    named = os.path.join(path, "tokenizer.model")
    if os.path.isfile(named):
        return named
    models = sorted(glob.glob(os.path.join(path, "*.model")))
    if len(models) > 1:
        raise ConfigError(f"{path}: several SentencePiece models ({', '.join(map(os.path.basename, models))}); "
                          "keep one, or name it tokenizer.model")
    return models[0] if models else None


def _padded(tokens: list, scores: list, types: list, n_vocab: int, source: str) -> None:
    if len(tokens) > n_vocab:
        raise ConfigError(f"{source}: the tokenizer has {len(tokens)} tokens but vocab_size is {n_vocab}")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(_UNUSED)


def _write_hf_tokenizer(w, path: str, cfg) -> None:
    """tokenizer.ggml.* from the directory's SentencePiece model or byte-level BPE tokenizer.json (or
    none); then the special ids, add_bos / add_eos and the chat template through gguf-py's
    SpecialVocab (tokenizer files, config.json), any id still missing from the tokenizer itself or
    the config (bos_token_id, the first eos_token_id)."""
    import gguf as gguf_py

    n_vocab = cfg.vocab_size
    spm = _sentencepiece_file(path)
    tj_path = os.path.join(path, "tokenizer.json")
    bpe = spm is None and os.path.isfile(tj_path)
    special = gguf_py.SpecialVocab(path, load_merges=bpe, n_vocab=n_vocab)
    if spm is not None:
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=spm)
        tokens, scores, types = [], [], []
        for i in range(sp.get_piece_size()):
            tokens.append(sp.id_to_piece(i))
            scores.append(sp.get_score(i))
            types.append(_UNKNOWN if sp.is_unknown(i) else _CONTROL if sp.is_control(i) else
                         _UNUSED if sp.is_unused(i) else _BYTE if sp.is_byte(i) else _NORMAL)
        _padded(tokens, scores, types, n_vocab, spm)
        pieces = sp.encode("a", out_type=str)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_add_space_prefix(bool(pieces) and pieces[0].startswith("\u2581"))
        for kind, tid in (("bos", sp.bos_id()), ("eos", sp.eos_id()), ("unk", sp.unk_id()), ("pad", sp.pad_id())):
            if tid >= 0:
                special.special_token_ids.setdefault(kind, tid)
    elif bpe:
        _write_bpe(w, tj_path, n_vocab)
    else:
        w.add_tokenizer_model("no_vocab")
    for kind, tid in (("bos", cfg.bos_token_id), ("eos", cfg.eos_token_ids[0] if cfg.eos_token_ids else None)):
        if tid is not None and 0 <= tid < n_vocab:
            special.special_token_ids.setdefault(kind, tid)
    special.add_to_gguf(w, quiet=True)


def _write_bpe(w, tj_path: str, n_vocab: int) -> None:
    try:
        with open(tj_path, encoding="utf-8") as f:
            tj = json.load(f)
        model, decoder = tj["model"], tj.get("decoder") or {}
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{tj_path}: not a readable tokenizer.json ({e!r})") from None
    if model.get("type") != "BPE" or model.get("byte_fallback") or decoder.get("type") != "ByteLevel":
        raise ConfigError(f"{tj_path}: only byte-level BPE tokenizers (Llama 3, Qwen2 / Qwen3) and SentencePiece "
                          "models can be written as GGUF metadata")
    pt = tj.get("pre_tokenizer") or {}
    parts = (pt.get("pretokenizers") or []) if pt.get("type") == "Sequence" else [pt]
    regexes = [(p.get("pattern") or {}).get("Regex") for p in parts if isinstance(p, dict) and p.get("type") == "Split"]
    if len(regexes) != 1 or regexes[0] not in _HF_PRE:
        raise ConfigError(f"{tj_path}: pre-tokenizer {regexes!r} is not one llama.cpp names (supported: Llama 3's "
                          "'llama-bpe' and Qwen2's 'qwen2' regexes)")
    reverse = {int(i): t for t, i in model["vocab"].items()}
    added = {}
    for a in tj.get("added_tokens") or []:
        reverse[int(a["id"])] = a["content"]
        added[int(a["id"])] = bool(a.get("special", False))
    if reverse and max(reverse) >= n_vocab:
        raise ConfigError(f"{tj_path}: token id {max(reverse)} is past vocab_size {n_vocab}")
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(_UNUSED)
        else:
            tokens.append(reverse[i])
            types.append((_CONTROL if added[i] else _USER_DEFINED) if i in added else _NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(_HF_PRE[regexes[0]])
    w.add_token_list(tokens)
    w.add_token_types(types)


# ---------------------------------------------------------------------------------------------
# rlx.quantize
# ---------------------------------------------------------------------------------------------

def _progress_fn(progress) -> Callable[[int, int, str, str], None] | None:
    if progress is None or progress is False:
        return None
    if progress is True:
        def line(done: int, total: int, name: str, info: str) -> None:
            print(f"[{done:>{len(str(total))}}/{total}] {name:<28} {info}", file=sys.stderr, flush=True)
        return line
    if callable(progress):
        return progress
    raise ValueError(f"progress must be None, a bool or a callable, got {progress!r}")


def quantize(src: str | os.PathLike, dst: str | os.PathLike, type: str = "q4_k_m", progress=None,
             threads: int | None = None, allow_requantize: bool = False) -> dict[str, str]:
    """Writes the model at `src` (a Hugging Face directory or a GGUF file) to the GGUF file `dst`
    with the recipe `type` (see the module docstring); returns {GGUF tensor name: its type}.

    progress: True prints a line per tensor to stderr; a callable is called after each tensor as
    progress(done, total, name, info) (info: "shape source -> type"). threads: quantisation
    threads (default rlx.get_num_threads()). allow_requantize: a GGUF source whose tensors are
    already quantised is refused unless True (as llama-quantize --allow-requantize): its values are
    dequantised and quantised again, losing more; a tensor whose type does not change is copied."""
    import gguf as gguf_py

    from rlx import gguf as rlx_gguf

    r = recipe(type)
    report = _progress_fn(progress)
    n_threads = _threads(threads)
    src, dst = os.fspath(src), os.fspath(dst)
    if not os.path.exists(src):
        raise FileNotFoundError(f"no such file or directory: {src}")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise ValueError(f"dst {dst} is the source file")
    source = _GGUFSource(src) if rlx_gguf.is_gguf(src) else _HFSource(src)

    plan: list[tuple[_Tensor, str, bool]] = []  # (tensor, output dtype, copied unchanged)
    for t in source.tensors:
        dtype = tensor_type(r, t.name, t.shape, source.cfg, source.tied)
        if dtype is None:
            dtype = t.stored if isinstance(source, _GGUFSource) else "f32"
        copy = dtype == t.stored and t.perm is None
        if not copy and _dtypes.DTYPES[t.stored].is_block and not allow_requantize:
            raise WeightsError(f"{src}: tensor '{t.name}' is already {t.stored}; quantising it to {dtype} would "
                               "quantise twice (pass allow_requantize=True, or quantise the f32 / f16 / bf16 model)")
        plan.append((t, dtype, copy))

    tmp = dst + ".part"
    w = gguf_py.GGUFWriter(tmp, source.arch)
    done: dict[str, str] = {}
    try:
        source.write_metadata(w)
        w.add_file_type(r.file_type)
        w.add_quantization_version(gguf_py.GGML_QUANT_VERSION)
        for t, dtype, _ in plan:  # shapes in bytes: (..., bytes per row) of uint8
            w.add_tensor_info(t.name, (*t.shape[:-1], _dtypes.nbytes(dtype, t.shape[-1:])), np.dtype(np.uint8),
                              _dtypes.nbytes(dtype, t.shape), raw_dtype=gguf_py.GGMLQuantizationType[dtype.upper()])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for k, (t, dtype, copy) in enumerate(plan):
            rows = int(np.prod(t.shape[:-1], dtype=np.int64))
            if copy:
                data = t.stored_bytes()
            else:
                try:
                    data = _convert(t.rows_of(), rows, t.shape[-1], dtype, n_threads)
                except ValueError as e:
                    raise WeightsError(f"{src}: tensor '{t.hf or t.name}': {e}") from None
                data = data.reshape(*t.shape[:-1], -1)
            w.write_tensor_data(data)
            done[t.name] = dtype
            if report:
                report(k + 1, len(plan), t.name, f"{t.shape} {t.stored} -> {dtype}")
        w.close()
        os.replace(tmp, dst)
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return done
