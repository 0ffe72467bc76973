"""The Generator: a model's weights and config bound to the C generator, with the history, the KV
cache and compiled plans it keeps.

    gen = rlx.Generator(cfg, weights, device="cpu")       # or Generator.from_pretrained(path)
    gen.prefill(ids)                                       # sets the history, clears the cache
    gen.generate_cached(16, rlx.SampleOpts.greedy())       # -> the 16 new ids

Two ways to step, which must agree token for token: ``step`` / ``generate`` recompute the whole
history each token (naive); ``step_cached`` / ``generate_cached`` run only the new position over
the KV cache. Sampling happens in C; the draw for the token at position i uses the counter-based
stream (seed, i), so the same seed gives the same tokens however generation is chunked.

Errors: a step before ``prefill`` raises rlx.Error; an empty context, a token id outside
[0, vocab) or a history longer than max_position_embeddings raises ValueError. After any error the
generator is unchanged and usable.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable, Sequence

import numpy as np

from rlx import _C
from rlx.config import ModelConfig, load_config
from rlx.weights import check_weights, load_weights, weight_dtype_of


@dataclasses.dataclass(frozen=True)
class SampleOpts:
    """How the next token is chosen. temperature 0 is greedy (argmax). Processing order (in C):
    repetition_penalty over the distinct ids of the history, temperature, top_k, softmax, top_p,
    min_p, renormalise, draw with the (seed, position) stream."""

    temperature: float = 0.0
    top_k: int = 0                  # 0 = off
    top_p: float = 1.0              # 1 = off
    min_p: float = 0.0              # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    seed: int = 0

    @classmethod
    def greedy(cls) -> "SampleOpts":
        return cls()


def _c_config(cfg: ModelConfig, weight_dtype: str = "f32") -> dict:
    """The fields the C generator reads, with each layer's sliding window resolved."""
    return {
        "weight_dtype": weight_dtype,
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
        "layer_windows": [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)],
    }


class Generator:
    """Generates tokens from a Llama 3.2 or Qwen3 model on one device ("cpu" or "ref").

    weights: {Hugging Face tensor name: array}. dtype is the dtype the 2-D weights (projections,
    embedding, LM head) are computed from: "f32", "bf16" or "f16"; by default the one they are
    stored in (bf16 stays bf16: no f32 copy is made). Arrays already in that dtype and C-contiguous
    are used in place (zero-copy: keep them unchanged while the generator lives); others are
    converted once; norms and biases are used as float32. Missing, extra or mis-shaped tensors
    raise rlx.WeightsError.
    """

    def __init__(self, config: ModelConfig, weights: dict, device: str = "cpu", dtype: str | None = None):
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be an rlx LlamaConfig or Qwen3Config, got {type(config).__name__}")
        self.dtype = dtype or weight_dtype_of(config, weights)
        arrays = check_weights(config, weights, dtype=self.dtype)
        arrays["rope.inv_freq"] = config.rope_inv_freq()
        self._config = config
        self._device = device
        self._c = _C.Generator(_c_config(config, self.dtype), arrays, device)
        self._prefill_policy = ("oneshot", 1)
        self._decode_policy = ("oneshot", 1)
        budget, hint = soft_memory_budget()
        self._c.set_memory_budget(budget, hint)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str = "cpu", dtype: str | None = None) -> "Generator":
        """A Hugging Face model directory (config.json + safetensors)."""
        return cls(load_config(path), load_weights(path), device=device, dtype=dtype)

    # -- state ---------------------------------------------------------------------------------

    @property
    def config(self) -> ModelConfig:
        return self._config

    @property
    def device(self) -> str:
        return self._device

    @property
    def tokens(self) -> list[int]:
        """The history: the prompt and every token generated or appended since."""
        return self._c.tokens

    @property
    def kv_len(self) -> int:
        """Positions held by the KV cache."""
        return self._c.kv_len

    def kv_cache(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Read-only views (kv_len, kv_heads, head_dim) of layer's cached K and V."""
        k, v = self._c.kv_cache(layer)
        k.flags.writeable = False
        v.flags.writeable = False
        return k, v

    def prefill(self, ids: Sequence[int]) -> None:
        """Sets the history to ids (at least one token) and clears the KV cache."""
        self._c.prefill(ids)

    # -- naive: recompute the whole history for every token --------------------------------------

    def step(self, opts: SampleOpts | None = None) -> int:
        return self._c.step(opts, cached=False)

    def generate(self, n: int, opts: SampleOpts | None = None) -> list[int]:
        return self._c.generate(n, opts, cached=False)

    # -- KV-cached ----------------------------------------------------------------------------

    def step_cached(self, opts: SampleOpts | None = None) -> int:
        """One token through the KV cache (the first call fills it from the history). Afterwards
        the cache holds every position but the new token: kv_len == len(tokens) - 1."""
        return self._c.step(opts, cached=True)

    def step_cached_adjust(self, opts: SampleOpts | None, sample_index: int,
                           adjust: Callable[[np.ndarray], object]) -> int:
        """step_cached with adjust(logits) editing the (vocab,) float32 row in place before
        sampling, and an explicit draw index for the sampler's stream."""
        return self._c.step(opts, cached=True, sample_index=sample_index, adjust=adjust)

    def generate_cached(self, n: int, opts: SampleOpts | None = None,
                        on_token: Callable[[int], object] | None = None,
                        stop_ids: Iterable[int] | None = None) -> list[int]:
        """Up to n tokens through the KV cache; on_token(id) is called after each; generation stops
        after a token in stop_ids."""
        return self._c.generate(n, opts, cached=True, on_token=on_token, stop_ids=stop_ids)

    def prefill_get_last_logits(self, ctx: Sequence[int]) -> np.ndarray:
        """prefill(ctx) and the (vocab,) logits of the next token; the cache then holds all of ctx."""
        self._c.prefill(ctx)
        return self._c.logits(cached=True)

    def decode_get_logits(self, token: int) -> np.ndarray:
        """Appends token and returns the next logits; afterwards kv_len == len(tokens). If the
        step fails, the token is taken back: history and cache are as before the call."""
        n = self._c.n_tokens
        self._c.append(token)
        try:
            return self._c.logits(cached=True)
        except BaseException:
            self._c.truncate(n)
            raise

    def truncate(self, n: int) -> None:
        """Keeps the first n tokens of the history (and of the KV cache): rewinds generation."""
        self._c.truncate(n)

    # -- compiled plans -------------------------------------------------------------------------

    def with_prefill_cache(self, capacity: int) -> "Generator":
        """Keeps the `capacity` most recently used prefill plans, each specialised to its length."""
        return self._set_policy(prefill=("lru", _positive("capacity", capacity)))

    def with_decode_cache(self, max_past: int) -> "Generator":
        """Bucketed decode: one plan per power-of-two past length up to max_past, compiled at the
        bucket's upper bound; the padded past rows are hidden by a mask (O(log n) compiles). An
        utterance whose past outgrows max_past raises instead of switching policy."""
        return self._set_policy(decode=("bucketed", _positive("max_past", max_past)))

    def with_dynamic_prefill_cache(self, capacity: int = 8) -> "Generator":
        """Prefill plans compiled once with a symbolic SEQ and bound per length."""
        return self._set_policy(prefill=("dynamic", _positive("capacity", capacity)))

    def with_dynamic_decode_cache(self, capacity: int = 8) -> "Generator":
        """Decode plans compiled once with symbolic SEQ / PAST and bound per step."""
        return self._set_policy(decode=("dynamic", _positive("capacity", capacity)))

    def with_compile_seq_cap(self, cap: int) -> "Generator":
        """Bounds the symbolic SEQ / PAST of dynamic plans at cap (below max_position_embeddings):
        their memory is planned once for cap, and a longer context raises."""
        self._c.set_seq_cap(_positive("cap", cap))
        return self

    def _set_policy(self, prefill: tuple[str, int] | None = None,
                    decode: tuple[str, int] | None = None) -> "Generator":
        """Policies change only between utterances (the C side refuses while the cache is filled)."""
        new_prefill = prefill or self._prefill_policy
        new_decode = decode or self._decode_policy
        max_past = new_decode[1] if new_decode[0] == "bucketed" else self._config.max_position_embeddings
        self._c.set_policy(new_prefill[0], new_prefill[1], new_decode[0], max_past)
        self._prefill_policy, self._decode_policy = new_prefill, new_decode
        return self

    def profile(self, on: bool = True) -> "Generator":
        """Times every op of every forward pass from now on (or stops, with on=False)."""
        self._c.set_profiling(on)
        return self

    def last_profile(self) -> dict[str, float]:
        """Seconds per op (matmul, attention, ...) of the last forward pass, largest first."""
        prof = self._c.last_profile()
        return dict(sorted(prof.items(), key=lambda kv: -kv[1]))

    def compile_stats(self) -> dict:
        """prefill_compiles, decode_compiles, plan_hits, compile_seconds, plans_cached and
        planned_bytes (the intermediates' arenas of the plans held now)."""
        return self._c.stats()

    def release_decode_graphs(self) -> None:
        """Frees the compiled decode plans (e.g. between utterances)."""
        self._c.release_plans(True)

    def release_compile_graphs(self) -> None:
        """Frees every compiled plan; they are recompiled on demand."""
        self._c.release_plans(False)

    def __repr__(self) -> str:
        return (f"Generator({type(self._config).__name__}, layers={self._config.num_hidden_layers}, "
                f"device={self._device!r}, tokens={len(self.tokens)})")


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def soft_memory_budget() -> tuple[int, str]:
    """The soft memory budget for one plan's intermediates: RLX_SOFT_MEMORY_FRACTION (default 0.8)
    of physical RAM, and the hint a refusal carries."""
    raw = os.environ.get("RLX_SOFT_MEMORY_FRACTION", "0.8")
    try:
        fraction = float(raw)
    except ValueError:
        raise ValueError(f"RLX_SOFT_MEMORY_FRACTION must be a number in (0, 1], got {raw!r}") from None
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"RLX_SOFT_MEMORY_FRACTION must be in (0, 1], got {fraction}")
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    hint = (f"the budget is RLX_SOFT_MEMORY_FRACTION={raw} of {ram / 2**30:.1f} GiB RAM: raise it, or bound "
            "shapes with with_compile_seq_cap() / a shorter context")
    return max(1, int(ram * fraction)), hint  # 0 would mean "no budget"
