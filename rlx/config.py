"""Model configs for the two decoder families rlx runs: Llama (3.x) and Qwen3.

`load_config(path)` reads a Hugging Face config.json (and generation_config.json beside it, when
present, for bos/eos) and returns a `LlamaConfig` or `Qwen3Config`. Both are plain dataclasses
that validate themselves on construction: anything rlx cannot run raises `rlx.ConfigError`
naming the field and its value, never a later crash.

Hugging Face formats accepted (transformers 4.x and 5.x):
- RoPE: either the legacy top-level `rope_theta` + `rope_scaling` ({"rope_type" or "type": ...}),
  or the v5 `rope_parameters` dict ({"rope_type", "rope_theta", "factor", ...}). As in
  transformers, a non-empty `rope_scaling` wins over `rope_parameters`, and a `rope_theta` inside
  the dict wins over the top-level one. Supported rope types: "default" (no scaling) and "llama3".
- Qwen3 sliding window: as transformers' Qwen3Config: `sliding_window` only counts when
  `use_sliding_window` is true; `layer_types` (when given) decides which layers slide, otherwise
  layer i slides iff i >= max_window_layers. See `Qwen3Config.layer_window`.
- eos_token_id may be an int or a list; it is always exposed as the tuple `eos_token_ids`.
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

__all__ = ["ModelConfig", "LlamaConfig", "Qwen3Config", "load_config", "config_from_dict"]

# Keys that mark a mixture-of-experts model, which rlx does not run yet.
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _check_int(name: str, value: Any, *, optional: bool = False, minimum: int | None = 1) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"config field '{name}' must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"config field '{name}' must be >= {minimum}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"config field '{name}' must be a bool, got {type(value).__name__} {value!r}")


def _to_float(name: str, value: Any, *, positive: bool = True) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"config field '{name}' must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or (positive and value <= 0):
        raise ConfigError(f"config field '{name}' must be a positive number, got {value!r}")
    return value


def _normalize_rope_scaling(scaling: Any, max_position_embeddings: int) -> dict | None:
    """None for plain RoPE, else {"rope_type": "llama3", factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings} with checked types."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ConfigError(f"config field 'rope_scaling' must be a dict or null, got {type(scaling).__name__} {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ConfigError(f"config field 'rope_scaling.rope_type' = {rope_type!r} is not supported "
                          "(supported: 'default', 'llama3')")
    out: dict[str, Any] = {"rope_type": "llama3"}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if key not in scaling:
            raise ConfigError(f"config field 'rope_scaling.{key}' is required for rope_type 'llama3'")
        out[key] = _to_float(f"rope_scaling.{key}", scaling[key])
    if out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ConfigError(f"config field 'rope_scaling.high_freq_factor' = {out['high_freq_factor']} "
                          f"must exceed low_freq_factor = {out['low_freq_factor']}")
    orig = scaling.get("original_max_position_embeddings", max_position_embeddings)
    _check_int("rope_scaling.original_max_position_embeddings", orig)
    out["original_max_position_embeddings"] = orig
    return out


@dataclass
class ModelConfig:
    """Fields shared by both families (Hugging Face names). Construct a subclass; the instance is
    validated in __post_init__ and normalised: num_key_value_heads and head_dim are never None,
    rope_scaling is None or a llama3 dict, eos_token_ids is a tuple of ints."""

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
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"):
            _check_int(name, getattr(self, name))
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        _check_int("num_key_value_heads", self.num_key_value_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"config field 'num_key_value_heads' = {self.num_key_value_heads} must divide "
                              f"num_attention_heads = {self.num_attention_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"config field 'num_attention_heads' = {self.num_attention_heads} must divide "
                                  f"hidden_size = {self.hidden_size} when head_dim is not given")
            self.head_dim = self.hidden_size // self.num_attention_heads
        _check_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ConfigError(f"config field 'head_dim' = {self.head_dim} must be even (rotate-half RoPE)")
        self.rms_norm_eps = _to_float("rms_norm_eps", self.rms_norm_eps)
        self.rope_theta = _to_float("rope_theta", self.rope_theta)
        self.rope_scaling = _normalize_rope_scaling(self.rope_scaling, self.max_position_embeddings)
        if self.hidden_act != "silu":
            raise ConfigError(f"config field 'hidden_act' = {self.hidden_act!r} is not supported (only 'silu')")
        _check_bool("tie_word_embeddings", self.tie_word_embeddings)
        _check_bool("attention_bias", self.attention_bias)
        _check_bool("mlp_bias", self.mlp_bias)
        _check_bool("rope_interleaved", self.rope_interleaved)
        _check_int("bos_token_id", self.bos_token_id, optional=True, minimum=0)
        eos = self.eos_token_ids
        if eos is None:
            eos = ()
        elif isinstance(eos, int) and not isinstance(eos, bool):
            eos = (eos,)
        elif not isinstance(eos, (list, tuple)):
            raise ConfigError(f"config field 'eos_token_id' must be an int or a list of ints, "
                              f"got {type(eos).__name__} {eos!r}")
        for e in eos:
            _check_int("eos_token_id", e, minimum=0)
        self.eos_token_ids = tuple(eos)

    def layer_window(self, i: int) -> int:
        """Sliding-window size of layer i; 0 means full causal attention. With window w > 0, key
        position j is visible to query position i iff j <= i and i - j < w."""
        if not 0 <= i < self.num_hidden_layers:
            raise IndexError(f"layer {i} out of range 0..{self.num_hidden_layers - 1}")
        return 0

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
        smooth = (old_len / wavelen - low) / (high - low)
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


@dataclass
class LlamaConfig(ModelConfig):
    """Llama 1/2/3.x decoders: optional head_dim, llama3 RoPE scaling, optional q/k/v/o bias
    (attention_bias) and gate/up/down bias (mlp_bias)."""

    model_type: ClassVar[str] = "llama"
    qk_norm: ClassVar[bool] = False


@dataclass
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
        super().__post_init__()
        if self.mlp_bias:
            raise ConfigError("config field 'mlp_bias' = True is not supported for qwen3 (its MLP has no bias)")
        _check_bool("use_sliding_window", self.use_sliding_window)
        _check_int("max_window_layers", self.max_window_layers, minimum=0)
        # transformers: the window only exists when use_sliding_window is set.
        if not self.use_sliding_window:
            self.sliding_window = None
        _check_int("sliding_window", self.sliding_window, optional=True)
        if self.layer_types is None:
            self.layer_types = tuple(
                "sliding_attention" if self.sliding_window is not None and i >= self.max_window_layers
                else "full_attention" for i in range(self.num_hidden_layers))
        if not isinstance(self.layer_types, (list, tuple)) or len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(f"config field 'layer_types' must be a list of {self.num_hidden_layers} strings, "
                              f"got {self.layer_types!r}")
        for t in self.layer_types:
            if t not in ("full_attention", "sliding_attention"):
                raise ConfigError(f"config field 'layer_types' has unsupported entry {t!r} "
                                  "(supported: 'full_attention', 'sliding_attention')")
            if t == "sliding_attention" and self.sliding_window is None:
                raise ConfigError("config field 'layer_types' asks for 'sliding_attention' but sliding_window is "
                                  f"not set (sliding_window={self.sliding_window!r}, "
                                  f"use_sliding_window={self.use_sliding_window!r})")
        self.layer_types = tuple(self.layer_types)

    def layer_window(self, i: int) -> int:
        super().layer_window(i)
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else 0


_FAMILIES: dict[str, type[ModelConfig]] = {"llama": LlamaConfig, "qwen3": Qwen3Config}


def config_from_dict(d: dict, generation: dict | None = None) -> ModelConfig:
    """Builds the family's config from a Hugging Face config dict (keys it does not use are
    ignored) and, optionally, a generation_config dict whose non-null bos/eos ids take precedence.
    Also accepts the output of `ModelConfig.to_dict()`."""
    if not isinstance(d, dict):
        raise ConfigError(f"config must be a JSON object, got {type(d).__name__}")
    model_type = d.get("model_type")
    for key in _MOE_KEYS:
        n = d.get(key)
        if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n == 0):
            raise ConfigError(f"config field '{key}' = {n!r}: mixture-of-experts models are not supported yet")
    if model_type not in _FAMILIES:
        hint = " (mixture-of-experts models are not supported yet)" if "moe" in str(model_type) else ""
        raise ConfigError(f"config field 'model_type' = {model_type!r} is not supported "
                          f"(supported: {', '.join(sorted(_FAMILIES))}){hint}")
    cls = _FAMILIES[model_type]
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: d[k] for k in names if k in d and k not in ("rope_theta", "rope_scaling", "eos_token_ids")}
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if k not in d:
            raise ConfigError(f"config field '{k}' is required but missing")

    # RoPE: legacy rope_scaling wins over rope_parameters; theta inside the dict wins.
    rope_key = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    params = d.get(rope_key) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config field '{rope_key}' must be a dict, got {type(params).__name__} {params!r}")
    if any(isinstance(v, dict) for v in params.values()):
        raise ConfigError(f"config field '{rope_key}' nested per layer type is not supported: {params!r}")
    prf = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if prf != 1.0:
        raise ConfigError(f"config field 'partial_rotary_factor' = {prf!r} is not supported (only 1.0)")
    theta = params.get("rope_theta")
    if theta is None:
        theta = d.get("rope_theta")
    kwargs["rope_theta"] = 10000.0 if theta is None else theta
    kwargs["rope_scaling"] = params or None

    eos = d.get("eos_token_ids", d.get("eos_token_id"))
    bos = d.get("bos_token_id")
    if generation:
        if generation.get("eos_token_id") is not None:
            eos = generation["eos_token_id"]
        if generation.get("bos_token_id") is not None:
            bos = generation["bos_token_id"]
    kwargs["eos_token_ids"] = eos
    kwargs["bos_token_id"] = bos
    if cls is Qwen3Config:
        kwargs.pop("mlp_bias", None)  # transformers' Qwen3 ignores it: its MLP never has a bias
    if kwargs.get("num_key_value_heads", 0) is None:
        del kwargs["num_key_value_heads"]
    if cls is LlamaConfig and kwargs.get("head_dim", 0) is None:
        del kwargs["head_dim"]
    if "layer_types" in kwargs and kwargs["layer_types"] is None:
        del kwargs["layer_types"]
    return cls(**kwargs)


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None


def load_config(path: str | os.PathLike) -> ModelConfig:
    """Reads a Hugging Face model directory (or its config.json), or a GGUF file, into a
    LlamaConfig or Qwen3Config. A generation_config.json beside config.json supplies bos/eos ids
    when present."""
    path = os.fspath(path)
    from rlx import gguf  # imported here: rlx.gguf imports this module

    if gguf.is_gguf(path):
        return gguf.model_config(path)
    if os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
    else:
        config_path = path
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"no config.json at {path}")
    d = _read_json(config_path)
    gen_path = os.path.join(os.path.dirname(os.path.abspath(config_path)), "generation_config.json")
    generation = _read_json(gen_path) if os.path.isfile(gen_path) else None
    try:
        return config_from_dict(d, generation)
    except ConfigError as e:
        raise ConfigError(f"{config_path}: {e}") from None
