"""Model configs for the decoder families rlx runs: Llama (3.x), Qwen3 and Qwen3-MoE.

`load_config(path)` reads a Hugging Face config.json (and generation_config.json beside it, when
present, for bos/eos) and returns a `LlamaConfig`, `Qwen3Config` or `Qwen3MoeConfig`. Both are frozen dataclasses
that validate themselves on construction, in `__post_init__`, before anything is sized by them:
anything rlx cannot run raises `rlx.ConfigError` naming the field and its value, never a later
crash, a loop over a billion layers or a silent float32 overflow. A missing path raises
FileNotFoundError; every other problem with the files (not UTF-8, not JSON, nested too deeply,
numbers too long, a weights file passed instead of the directory) is a ConfigError too.

Hugging Face formats accepted (transformers 4.x and 5.x):
- RoPE: either the legacy top-level `rope_theta` + `rope_scaling` ({"rope_type" or "type": ...}),
  or the v5 `rope_parameters` dict ({"rope_type", "rope_theta", "factor", ...}). As in
  transformers, a non-empty `rope_scaling` wins over `rope_parameters`, and a `rope_theta` inside
  the dict wins over the top-level one. Supported rope types: "default" (no scaling) and "llama3".
- Qwen3 sliding window: as transformers' Qwen3Config: `sliding_window` only counts when
  `use_sliding_window` is true; `layer_types` (when given) decides which layers slide, otherwise
  layer i slides iff i >= max_window_layers. See `Qwen3Config.layer_window`.
- eos_token_id may be an int or a list; it is always exposed as the tuple `eos_token_ids`.
- Qwen3-MoE (model_type "qwen3_moe"): num_experts (or transformers 5's `num_local_experts`),
  num_experts_per_tok, moe_intermediate_size, norm_topk_prob, decoder_sparse_step and
  mlp_only_layers, which decide as transformers does which layers are sparse (`layer_sparse`).
  router_aux_loss_coef and output_router_logits are training fields and are ignored; a shared
  expert (shared_expert_intermediate_size, Qwen2-MoE's) and sliding windows are refused. Other
  mixture-of-experts families (mixtral, qwen2_moe, deepseek: num_local_experts / n_routed_experts
  on another model_type) are refused.

Accepted ranges (the limits come from the C core and from float32, the precision rlx computes in):
- num_hidden_layers: 1..MAX_LAYERS (256, the C core's RLX_MAX_LAYERS: its per-layer tables).
- every other size (vocab_size, hidden_size, intermediate_size, heads, head_dim,
  max_position_embeddings, sliding_window, max_window_layers, original_max_position_embeddings):
  an int up to MAX_DIM = 2**31 - 1, because token ids, positions and graph dims are int32 in C;
  num_attention_heads * head_dim (the q projection's rows) too.
- the parameter count the sizes imply: at most MAX_PARAMETERS = 2**40 (2 TiB at 2 bytes a
  parameter, 2.7x the largest dense open model). A stated cap, not this machine's RAM: a config
  is also read to inspect a model, and a pipeline spreads one model over several machines; what
  one machine must hold is checked where memory is taken (the generator's KV reservation and its
  soft memory budget).
- bos_token_id and every eos id: in [0, vocab_size).
- num_experts: 0..MAX_EXPERTS (2**16; 0 makes every layer dense, as in transformers);
  num_experts_per_tok: 1..num_experts; moe_intermediate_size: 1..MAX_DIM; decoder_sparse_step:
  1..MAX_DIM; mlp_only_layers: distinct layer indices in [0, num_hidden_layers).
- rms_norm_eps: in [2**-126, 1]: a normal float32 (a smaller value rounds to a subnormal or to 0
  in float32, a larger one is no epsilon but swamps the mean square it is added to; 1e300 would
  become inf and silently zero every activation).
- rope_theta: in (1, FLOAT32_MAX]: above float32's range it becomes inf; at or below 1 the RoPE
  frequencies no longer decrease. Llama 3 scaling: factor in [1, FLOAT32_MAX] (transformers warns
  below 1), low_freq_factor and high_freq_factor normal float32 values with high > low after
  rounding to float32 (equal ones divide by zero).
- config.json and generation_config.json: regular files of at most MAX_CONFIG_BYTES (16 MiB).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rlx.errors import ConfigError

__all__ = ["ModelConfig", "LlamaConfig", "Qwen3Config", "Qwen3MoeConfig", "load_config", "config_from_dict",
           "MAX_LAYERS", "MAX_DIM", "MAX_EXPERTS", "MAX_PARAMETERS", "MAX_CONFIG_BYTES"]

# ---------------------------------------------------------------------------------- limits ----

MAX_LAYERS = 256                  # RLX_MAX_LAYERS in csrc/include/rlx/model.h (a unit test keeps them equal)
MAX_DIM = 2**31 - 1               # int32: token ids, positions and graph dims in the C core
MAX_PARAMETERS = 2**40            # weights a config may describe (see the module note)
MAX_CONFIG_BYTES = 16 << 20       # config.json / generation_config.json: a few KB in practice
MAX_EXPERTS = 2**16               # experts of a mixture (128 in Qwen3-30B-A3B; 512 in the largest open ones)
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # 2**-126, the smallest normal float32

# Keys that mark a mixture-of-experts model: rlx runs qwen3_moe's, no other family's.
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _show(value: Any) -> str:
    """A short repr for error messages: huge ints by size (their repr can fail), long reprs cut."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}an int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # a repr that fails (recursion, a hostile __repr__) must not hide the error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 100 else text[:97] + "..."


def _error(name: str, message: str) -> ConfigError:
    """A ConfigError about one field; `.field` lets config_from_dict say where the value came from."""
    err = ConfigError(f"config field '{name}' {message}")
    err.field = name
    return err


def _check_int(name: str, value: Any, *, optional: bool = False, minimum: int = 1, maximum: int = MAX_DIM,
               why: str = "") -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise _error(name, f"must be an int, got {type(value).__name__} {_show(value)}")
    if not minimum <= value <= maximum:
        raise _error(name, f"must be in [{minimum}, {maximum}]{why}, got {_show(value)}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _error(name, f"must be a bool, got {type(value).__name__} {_show(value)}")


def _check_float(name: str, value: Any, low: float, high: float, *, low_open: bool = False, why: str = "") -> float:
    """value as a float in [low, high] ((low, high] with low_open); ints are accepted."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _error(name, f"must be a number, got {type(value).__name__} {_show(value)}")
    try:
        x = float(value)
    except OverflowError:  # an int beyond float64
        x = math.inf if value > 0 else -math.inf
    if not (low < x if low_open else low <= x) or not x <= high:  # NaN fails both
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise _error(name, f"must be in {interval}{why}, got {_show(value)}")
    return x


def _normalize_rope_scaling(scaling: Any, max_position_embeddings: int) -> dict | None:
    """None for plain RoPE, else {"rope_type": "llama3", factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings} with checked types and ranges."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise _error("rope_scaling", f"must be a dict or null, got {type(scaling).__name__} {_show(scaling)}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise _error("rope_scaling.rope_type",
                     f"= {_show(rope_type)} is not supported (supported: 'default', 'llama3')")
    out: dict[str, Any] = {"rope_type": "llama3"}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if key not in scaling:
            raise _error(f"rope_scaling.{key}", "is required for rope_type 'llama3'")
    out["factor"] = _check_float("rope_scaling.factor", scaling["factor"], 1.0, FLOAT32_MAX,
                                 why=" (transformers: factor >= 1; float32)")
    for key in ("low_freq_factor", "high_freq_factor"):
        out[key] = _check_float(f"rope_scaling.{key}", scaling[key], FLOAT32_TINY, FLOAT32_MAX,
                                why=" (a normal float32)")
    if not np.float32(out["high_freq_factor"]) > np.float32(out["low_freq_factor"]):
        raise _error("rope_scaling.high_freq_factor", f"= {out['high_freq_factor']!r} must exceed low_freq_factor = "
                     f"{out['low_freq_factor']!r} (in float32: the smoothing divides by their difference)")
    orig = scaling.get("original_max_position_embeddings", max_position_embeddings)
    _check_int("rope_scaling.original_max_position_embeddings", orig)
    out["original_max_position_embeddings"] = orig
    return out


def _parameter_count(c: "ModelConfig", sparse_layers: int = 0, experts: int = 0, expert_ffn: int = 0) -> int:
    """Parameters the sizes imply, computed in closed form (Python ints: no loop, no overflow);
    sparse_layers of the layers hold a router (experts, H) and experts SwiGLU MLPs of expert_ffn
    instead of the dense MLP."""
    H, D, I, V, L = c.hidden_size, c.head_dim, c.intermediate_size, c.vocab_size, c.num_hidden_layers
    q, kv = c.num_attention_heads * D, c.num_key_value_heads * D
    layer = 2 * H + 2 * q * H + 2 * kv * H
    layer += (q + 2 * kv + H) if c.attention_bias else 0
    layer += 2 * D if c.qk_norm else 0
    dense = 3 * I * H + ((2 * I + H) if c.mlp_bias else 0)
    sparse = experts * H + 3 * experts * expert_ffn * H
    return V * H * (1 if c.tie_word_embeddings else 2) + H + L * layer + (L - sparse_layers) * dense + \
        sparse_layers * sparse


# ----------------------------------------------------------------------------------- configs ----

_set = object.__setattr__  # __post_init__ normalises fields of a frozen dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Fields shared by both families (Hugging Face names). Construct a subclass; the instance is
    validated in __post_init__ (ranges: the module note) and normalised: num_key_value_heads and
    head_dim are never None, rope_scaling is None or a llama3 dict, eos_token_ids is a tuple of
    ints. Frozen, so that what was validated is what the generator and the loaders are sized by
    (`dataclasses.replace(cfg, ...)` builds a changed copy, validated again)."""

    model_type: ClassVar[str] = ""
    qk_norm: ClassVar[bool] = False  # per-head RMSNorm of q and k before RoPE

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None    # None: = num_attention_heads
    head_dim: int | None = None               # None: = hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    attention_bias: bool = False              # bias on q, k, v AND o projections
    mlp_bias: bool = False                    # bias on gate, up, down projections (Llama only)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Not a Hugging Face field: q_proj / k_proj rows are in llama.cpp's permuted order (Llama GGUF
    # files), so RoPE turns adjacent pairs instead of halves (the same model, read without a copy).
    rope_interleaved: bool = False

    def __post_init__(self) -> None:
        # Types and ranges of every size first: nothing below may be sized by an unchecked one.
        for name in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            _check_bool(name, getattr(self, name))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                     "max_position_embeddings"):
            _check_int(name, getattr(self, name))
        _check_int("num_hidden_layers", self.num_hidden_layers, maximum=MAX_LAYERS)
        if self.num_key_value_heads is None:
            _set(self, "num_key_value_heads", self.num_attention_heads)
        _check_int("num_key_value_heads", self.num_key_value_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise _error("num_key_value_heads", f"= {self.num_key_value_heads} must divide "
                         f"num_attention_heads = {self.num_attention_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise _error("num_attention_heads", f"= {self.num_attention_heads} must divide "
                             f"hidden_size = {self.hidden_size} when head_dim is not given")
            _set(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _check_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise _error("head_dim", f"= {self.head_dim} must be even (rotate-half RoPE)")
        if self.num_attention_heads * self.head_dim > MAX_DIM:
            raise _error("head_dim", f"= {self.head_dim} times num_attention_heads = {self.num_attention_heads} "
                         f"(the q projection's rows) must be at most {MAX_DIM}")
        n = _parameter_count(self, *self._sparse_sizes())
        if n > MAX_PARAMETERS:
            raise ConfigError(f"config sizes describe {n:,} parameters ({2 * n / 2**40:,.1f} TiB at 2 bytes each), "
                              f"more than rlx's limit of MAX_PARAMETERS = 2**40: vocab_size={self.vocab_size}, "
                              f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                              f"num_hidden_layers={self.num_hidden_layers}, num_attention_heads="
                              f"{self.num_attention_heads}, head_dim={self.head_dim}")
        _set(self, "rms_norm_eps", _check_float("rms_norm_eps", self.rms_norm_eps, FLOAT32_TINY, 1.0,
                                                why=" (a normal float32 up to 1)"))
        _set(self, "rope_theta", _check_float("rope_theta", self.rope_theta, 1.0, FLOAT32_MAX, low_open=True,
                                              why=" (above 1, within float32)"))
        _set(self, "rope_scaling", _normalize_rope_scaling(self.rope_scaling, self.max_position_embeddings))
        if self.hidden_act != "silu":
            raise _error("hidden_act", f"= {_show(self.hidden_act)} is not supported (only 'silu')")
        in_vocab = f" (a token id below vocab_size = {self.vocab_size})"
        _check_int("bos_token_id", self.bos_token_id, optional=True, minimum=0, maximum=self.vocab_size - 1,
                   why=in_vocab)
        _check_bool("rope_interleaved", self.rope_interleaved)
        eos = self.eos_token_ids
        if eos is None:
            eos = ()
        elif isinstance(eos, int) and not isinstance(eos, bool):
            eos = (eos,)
        elif not isinstance(eos, (list, tuple)):
            raise _error("eos_token_id", f"must be an int or a list of ints, got {type(eos).__name__} {_show(eos)}")
        for e in eos:
            _check_int("eos_token_id", e, minimum=0, maximum=self.vocab_size - 1, why=in_vocab)
        _set(self, "eos_token_ids", tuple(eos))

    def _sparse_sizes(self) -> tuple[int, int, int]:
        """(sparse layers, experts, expert MLP size) for the parameter count: none here."""
        return 0, 0, 0

    def layer_window(self, i: int) -> int:
        """Sliding-window size of layer i; 0 means full causal attention. With window w > 0, key
        position j is visible to query position i iff j <= i and i - j < w."""
        if not 0 <= i < self.num_hidden_layers:
            raise IndexError(f"layer {i} out of range 0..{self.num_hidden_layers - 1}")
        return 0

    def layer_sparse(self, i: int) -> bool:
        """Whether layer i's MLP is a mixture of experts (never, outside Qwen3MoeConfig)."""
        if not 0 <= i < self.num_hidden_layers:
            raise IndexError(f"layer {i} out of range 0..{self.num_hidden_layers - 1}")
        return False

    def rope_inv_freq(self) -> np.ndarray:
        """Inverse RoPE frequencies, float32 (head_dim // 2,), computed step by step in float32
        as transformers does (default and llama3 rope types; attention scaling is 1 for both).
        theta ** (2i / d) is rounded correctly from float64; torch's float32 pow is off by one ulp
        in rare elements, so results agree with transformers to within 1 ulp (usually exactly)."""
        d = self.head_dim
        exponent = np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d)
        inv = np.float32(1.0) / (np.float64(self.rope_theta) ** exponent.astype(np.float64)).astype(np.float32)
        s = self.rope_scaling
        if s is None:
            return inv.astype(np.float32)
        factor = np.float32(s["factor"])
        low, high = np.float32(s["low_freq_factor"]), np.float32(s["high_freq_factor"])
        old_len = np.float32(s["original_max_position_embeddings"])
        low_wavelen = old_len / low
        high_wavelen = old_len / high
        wavelen = np.float32(2 * math.pi) / inv
        inv_llama = np.where(wavelen > low_wavelen, inv / factor, inv)
        # in [0, 1] on the medium band in exact arithmetic; f32 rounding at its edges can land
        # just outside, and 1 - smooth < 0 then made a tiny frequency negative (hypothesis found
        # theta 2.2e38, low 1.2e-38: -6e-39)
        smooth = np.clip((old_len / wavelen - low) / (high - low), np.float32(0), np.float32(1))
        smoothed = (np.float32(1) - smooth) * inv_llama / factor + smooth * inv_llama
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(is_medium, smoothed, inv_llama).astype(np.float32)

    def to_dict(self) -> dict:
        """All fields plus model_type and qk_norm, JSON-friendly (tuples become lists).
        `config_from_dict(cfg.to_dict())` rebuilds an equal config."""
        out = {"model_type": self.model_type, "qk_norm": self.qk_norm}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else (dict(v) if isinstance(v, dict) else v)
        return out


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """Llama 1/2/3.x decoders: optional head_dim, llama3 RoPE scaling, optional q/k/v/o bias
    (attention_bias) and gate/up/down bias (mlp_bias)."""

    model_type: ClassVar[str] = "llama"
    qk_norm: ClassVar[bool] = False


@dataclass(frozen=True)
class Qwen3Config(ModelConfig):
    """Qwen3 dense decoders: per-head q/k RMSNorm, optional q/k/v/o bias, optional sliding
    window on some layers. Defaults follow transformers' Qwen3Config (head_dim 128)."""

    model_type: ClassVar[str] = "qwen3"
    qk_norm: ClassVar[bool] = True

    head_dim: int | None = 128
    max_position_embeddings: int = 32768
    sliding_window: int | None = 4096
    use_sliding_window: bool = False
    max_window_layers: int = 28
    layer_types: tuple[str, ...] | None = None   # None: derived from max_window_layers

    def __post_init__(self) -> None:
        super().__post_init__()  # num_hidden_layers is checked (<= MAX_LAYERS) before the loop below
        if self.mlp_bias:
            raise _error("mlp_bias", "= True is not supported for qwen3 (its MLP has no bias)")
        _check_bool("use_sliding_window", self.use_sliding_window)
        _check_int("max_window_layers", self.max_window_layers, minimum=0)
        # transformers: the window only exists when use_sliding_window is set.
        if not self.use_sliding_window:
            _set(self, "sliding_window", None)
        _check_int("sliding_window", self.sliding_window, optional=True)
        if self.layer_types is None:
            _set(self, "layer_types", tuple(
                "sliding_attention" if self.sliding_window is not None and i >= self.max_window_layers
                else "full_attention" for i in range(self.num_hidden_layers)))
        if not isinstance(self.layer_types, (list, tuple)) or len(self.layer_types) != self.num_hidden_layers:
            raise _error("layer_types", f"must be a list of {self.num_hidden_layers} strings, got "
                         f"{type(self.layer_types).__name__} {_show(self.layer_types)}")
        for t in self.layer_types:
            if t not in ("full_attention", "sliding_attention"):
                raise _error("layer_types", f"has unsupported entry {_show(t)} "
                             "(supported: 'full_attention', 'sliding_attention')")
            if t == "sliding_attention" and self.sliding_window is None:
                raise _error("layer_types", "asks for 'sliding_attention' but sliding_window is not set "
                             f"(sliding_window={_show(self.sliding_window)}, "
                             f"use_sliding_window={self.use_sliding_window!r})")
        _set(self, "layer_types", tuple(self.layer_types))

    def layer_window(self, i: int) -> int:
        super().layer_window(i)
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else 0


@dataclass(frozen=True)
class Qwen3MoeConfig(ModelConfig):
    """Qwen3-MoE decoders (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k RMSNorm,
    optional q/k/v/o bias) and, on the sparse layers, a router over num_experts SwiGLU experts of
    moe_intermediate_size, num_experts_per_tok of them per token, their outputs weighted by the
    router's softmax probabilities (renormalised to sum 1 when norm_topk_prob). Layer i is sparse
    iff num_experts > 0, (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers (as
    transformers decides); the others keep a dense MLP of intermediate_size. Defaults follow
    transformers' Qwen3MoeConfig (head_dim: hidden_size / heads unless given)."""

    model_type: ClassVar[str] = "qwen3_moe"
    qk_norm: ClassVar[bool] = True

    max_position_embeddings: int = 32768
    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # The expert fields before the base class counts parameters with them.
        _check_int("num_experts", self.num_experts, minimum=0, maximum=MAX_EXPERTS)
        _check_int("moe_intermediate_size", self.moe_intermediate_size)
        _check_int("decoder_sparse_step", self.decoder_sparse_step)
        _check_bool("norm_topk_prob", self.norm_topk_prob)
        if self.num_experts:
            _check_int("num_experts_per_tok", self.num_experts_per_tok, maximum=self.num_experts,
                       why=" (1..num_experts)")
        _check_int("num_hidden_layers", self.num_hidden_layers, maximum=MAX_LAYERS)
        only = self.mlp_only_layers
        if only is None:
            only = ()
        if not isinstance(only, (list, tuple)):
            raise _error("mlp_only_layers", f"must be a list of layer indices, got {type(only).__name__} {_show(only)}")
        for i in only:
            _check_int("mlp_only_layers", i, minimum=0, maximum=self.num_hidden_layers - 1,
                       why=f" (a layer index below num_hidden_layers = {self.num_hidden_layers})")
        if len(set(only)) != len(only):
            raise _error("mlp_only_layers", f"names a layer twice: {_show(only)}")
        _set(self, "mlp_only_layers", tuple(sorted(only)))
        super().__post_init__()
        if self.mlp_bias:
            raise _error("mlp_bias", "= True is not supported for qwen3_moe (its MLPs have no bias)")

    def _sparse_sizes(self) -> tuple[int, int, int]:
        n = sum(self.layer_sparse(i) for i in range(self.num_hidden_layers))
        return n, self.num_experts, self.moe_intermediate_size

    def layer_sparse(self, i: int) -> bool:
        super().layer_sparse(i)
        return self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0 and i not in self.mlp_only_layers


_FAMILIES: dict[str, type[ModelConfig]] = {"llama": LlamaConfig, "qwen3": Qwen3Config, "qwen3_moe": Qwen3MoeConfig}
_TOKEN_FIELDS = ("bos_token_id", "eos_token_id")


def config_from_dict(d: dict, generation: dict | None = None) -> ModelConfig:
    """Builds the family's config from a Hugging Face config dict (keys it does not use are
    ignored) and, optionally, a generation_config dict whose non-null bos/eos ids take precedence.
    Also accepts the output of `ModelConfig.to_dict()`."""
    if not isinstance(d, dict):
        raise ConfigError(f"config must be a JSON object, got {type(d).__name__}")
    if generation is not None and not isinstance(generation, dict):
        raise ConfigError(f"generation config must be a JSON object, got {type(generation).__name__}")
    model_type = d.get("model_type")
    for key in _MOE_KEYS:
        n = d.get(key)
        if model_type != "qwen3_moe" and n is not None and not (isinstance(n, int) and not isinstance(n, bool)
                                                                and n == 0):
            raise ConfigError(f"config field '{key}' = {_show(n)}: mixture-of-experts models other than qwen3_moe "
                              "are not supported")
    if not isinstance(model_type, str) or model_type not in _FAMILIES:
        hint = " (of mixture-of-experts models, only qwen3_moe is)" if "moe" in _show(model_type) else ""
        raise ConfigError(f"config field 'model_type' = {_show(model_type)} is not supported "
                          f"(supported: {', '.join(sorted(_FAMILIES))}){hint}")
    cls = _FAMILIES[model_type]
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: d[k] for k in names if k in d and k not in ("rope_theta", "rope_scaling", "eos_token_ids")}
    if cls is Qwen3MoeConfig:
        _moe_fields(d, kwargs)
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if k not in d:
            raise ConfigError(f"config field '{k}' is required but missing")

    # RoPE: legacy rope_scaling wins over rope_parameters; theta inside the dict wins.
    rope_key = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    params = d.get(rope_key) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config field '{rope_key}' must be a dict, got {type(params).__name__} {_show(params)}")
    if any(isinstance(v, dict) for v in params.values()):
        raise ConfigError(f"config field '{rope_key}' nested per layer type is not supported: {_show(params)}")
    prf = params.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    if prf is not None and not (isinstance(prf, (int, float)) and not isinstance(prf, bool) and prf == 1.0):
        raise ConfigError(f"config field 'partial_rotary_factor' = {_show(prf)} is not supported (only 1.0)")
    theta = params.get("rope_theta")
    if theta is None:
        theta = d.get("rope_theta")
    kwargs["rope_theta"] = 10000.0 if theta is None else theta
    kwargs["rope_scaling"] = params or None

    eos = d.get("eos_token_ids", d.get("eos_token_id"))
    bos = d.get("bos_token_id")
    from_generation = set()
    if generation:
        if generation.get("eos_token_id") is not None:
            eos = generation["eos_token_id"]
            from_generation.add("eos_token_id")
        if generation.get("bos_token_id") is not None:
            bos = generation["bos_token_id"]
            from_generation.add("bos_token_id")
    kwargs["eos_token_ids"] = eos
    kwargs["bos_token_id"] = bos
    if cls in (Qwen3Config, Qwen3MoeConfig):
        kwargs.pop("mlp_bias", None)  # transformers' Qwen3 ignores it: its MLP never has a bias
    if kwargs.get("num_key_value_heads", 0) is None:
        del kwargs["num_key_value_heads"]
    if cls in (LlamaConfig, Qwen3MoeConfig) and kwargs.get("head_dim", 0) is None:
        del kwargs["head_dim"]
    if "layer_types" in kwargs and kwargs["layer_types"] is None:
        del kwargs["layer_types"]
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if getattr(e, "field", None) in from_generation:
            raise ConfigError(f"{e} (the value comes from generation_config.json)") from None
        raise


def _moe_fields(d: dict, kwargs: dict) -> None:
    """qwen3_moe's fields of a Hugging Face config dict into kwargs: num_experts under either name
    (transformers 5 writes num_local_experts), and refusals of what rlx does not run."""
    local = d.get("num_local_experts")
    if local is not None:
        if "num_experts" in d and d["num_experts"] != local:
            raise ConfigError(f"config fields 'num_experts' = {_show(d['num_experts'])} and 'num_local_experts' = "
                              f"{_show(local)} disagree")
        kwargs["num_experts"] = local
    if d.get("n_routed_experts") is not None:
        raise ConfigError(f"config field 'n_routed_experts' = {_show(d['n_routed_experts'])} is not a qwen3_moe field "
                          "(DeepSeek's routing is not supported)")
    shared = d.get("shared_expert_intermediate_size")
    if shared is not None and shared != 0:
        raise ConfigError(f"config field 'shared_expert_intermediate_size' = {_show(shared)}: a shared expert "
                          "(Qwen2-MoE's) is not supported")
    if d.get("use_sliding_window"):
        raise ConfigError("config field 'use_sliding_window' = True is not supported for qwen3_moe (transformers "
                          "versions disagree on which of its layers slide)")
    if kwargs.get("mlp_only_layers", 0) is None:
        del kwargs["mlp_only_layers"]


def _regular_file(path: str, what: str) -> bool:
    """True for a regular file (after symlinks), False when nothing is there; ConfigError for
    anything else (a directory, a FIFO, a device), which open() could block on or misread."""
    if os.path.isfile(path):
        return True
    if os.path.lexists(path):
        raise ConfigError(f"{path}: the {what} is not a regular file")
    return False


def _read_json(path: str) -> Any:
    """The JSON value in a config file; ConfigError for a file too big, not UTF-8 (a leading
    byte-order mark is allowed), not JSON, nested too deeply or with numbers too long to read."""
    hint = "" if os.path.basename(path).endswith(".json") else \
        " (pass the model directory or its config.json, not another file of the model)"
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than MAX_CONFIG_BYTES = {MAX_CONFIG_BYTES} bytes; not a config file{hint}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}){hint}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply{hint}") from None
    except ValueError as e:  # JSONDecodeError, and ints longer than Python's digit limit
        raise ConfigError(f"{path}: not valid JSON ({e}){hint}") from None


def load_config(path: str | os.PathLike) -> ModelConfig:
    """Reads a Hugging Face model directory (or its config.json), or a GGUF file, into a
    LlamaConfig or Qwen3Config. A generation_config.json beside config.json supplies bos/eos ids
    when present. FileNotFoundError when path or its config.json does not exist; ConfigError for
    the rest."""
    path = os.fspath(path)
    from rlx import gguf  # imported here: rlx.gguf imports this module

    if gguf.is_gguf(path):
        return gguf.model_config(path)
    if os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
        if not _regular_file(config_path, "config"):
            raise FileNotFoundError(f"no config.json in {path}")
    elif os.path.isfile(path):
        config_path = path
    elif os.path.lexists(path):
        raise ConfigError(f"{path}: not a model directory or a config file")
    else:
        raise FileNotFoundError(f"no such file or directory: {path}")
    d = _read_json(config_path)
    gen_path = os.path.join(os.path.dirname(os.path.abspath(config_path)), "generation_config.json")
    generation = _read_json(gen_path) if _regular_file(gen_path, "generation config") else None
    if generation is not None and not isinstance(generation, dict):
        raise ConfigError(f"{gen_path}: must hold a JSON object, got {type(generation).__name__}")
    try:
        return config_from_dict(d, generation)
    except ConfigError as e:
        raise ConfigError(f"{config_path}: {e}") from None
