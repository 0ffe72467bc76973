"""The Generator and its sequences: a model's weights and config on a device, and token histories
with KV caches of their own over it.

    gen = rlx.Generator(cfg, weights, device="cpu")       # or Generator.from_pretrained(path)
    gen.prefill(ids)                                       # sets the history, clears the cache
    gen.generate_cached(16, rlx.SampleOpts.greedy())       # -> the 16 new ids
    other = gen.new_sequence()                             # another history over the same weights
    other.prefill(ids2); other.extend(more_ids)            # a next turn costs only its new tokens

A Generator IS a Sequence (its current one) plus the model: weights are placed on the device once
and compiled plans are shared by every sequence of the model. Sequences of one model may be used
from different threads at the same time (their steps take turns on the model); one sequence used
from two threads serialises.

Two ways to step, which must agree token for token: ``step`` / ``generate`` recompute the whole
history each token (naive); ``step_cached`` / ``generate_cached`` run only the new positions over
the KV cache. Sampling happens in C; the draw for the token at position i uses the counter-based
stream (seed, i), so the same seed gives the same tokens however generation is chunked.

KV cache dtype (``kv_dtype``): "f16" by default, as llama.cpp: half the memory and half the bytes
read per step at long context, and no accuracy that tests here can tell apart (see
tests/unit/test_sequences.py for the bound); "f32" and "bf16" on request. The recomputing path
rounds K and V the same way, so naive == cached holds for every kv_dtype.

Errors: a step before ``prefill`` raises rlx.Error; an empty context, a token id outside
[0, vocab) or a history longer than max_position_embeddings raises ValueError. After any error the
sequence is unchanged and usable.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable
from typing import Sequence as Seq

import numpy as np

from rlx import _C
from rlx import batching as _batching
from rlx import dtypes as _dtypes
from rlx.config import ModelConfig, load_config
from rlx.weights import _c_config, check_weights, dtype_summary, load_weights, watch_sources

__all__ = ["SampleOpts", "Sequence", "Generator", "soft_memory_budget", "DEFAULT_KV_DTYPE"]

DEFAULT_KV_DTYPE = "f16"


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


def _kv_dtype(kv_dtype: str | None) -> str:
    kv = DEFAULT_KV_DTYPE if kv_dtype is None else kv_dtype
    if kv not in _dtypes.KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(_dtypes.KV_DTYPES)}, got {kv_dtype!r}")
    return kv


class Sequence:
    """A token history and a KV cache of its own over a model (the weights and compiled plans are
    the model's). Made by Generator.new_sequence() or Sequence.fork()."""

    def __init__(self, c_seq: "_C.Sequence", config: ModelConfig):
        self._c = c_seq
        self._config = config

    # -- state ---------------------------------------------------------------------------------

    @property
    def config(self) -> ModelConfig:
        return self._config

    @property
    def tokens(self) -> list[int]:
        """The history: the prompt and every token generated or appended since."""
        return self._c.tokens

    @property
    def kv_len(self) -> int:
        """Positions held by the KV cache."""
        return self._c.kv_len

    @property
    def kv_dtype(self) -> str:
        """The KV cache's dtype: "f32", "f16" or "bf16"."""
        return self._c.kv_dtype

    @property
    def kv_bytes(self) -> int:
        """Bytes of device memory the KV cache holds now (it grows with the history)."""
        return self._c.kv_bytes

    def kv_cache(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies (kv_len, kv_heads, head_dim) of layer's cached K and V, in the cache dtype."""
        k, v = self._c.kv_cache(layer)
        if self.kv_dtype == "bf16":
            k, v = k.view(_dtypes.DTYPES["bf16"].numpy), v.view(_dtypes.DTYPES["bf16"].numpy)
        return k, v

    def prefill(self, ids: Seq[int]) -> None:
        """Sets the history to ids (at least one token) and clears the KV cache."""
        self._c.prefill(ids)

    def append(self, ids: int | Seq[int]) -> None:
        """Appends a token (or several, all or none) to the history; the next cached step runs
        only the positions not cached yet."""
        self._c.append(ids)

    def extend(self, ids: Seq[int]) -> np.ndarray:
        """Appends ids and runs them through the KV cache (a chat's next turn: the earlier
        positions are not recomputed; in pieces of with_prefill_chunk positions); returns the
        (vocab,) logits after them. The same logits as one prefill of the whole history. If the
        pass fails, the ids are taken back."""
        n = self._c.n_tokens
        self._c.append(ids)
        try:
            return self._c.logits(cached=True)
        except BaseException:
            self._c.truncate(n)
            raise

    def truncate(self, n: int) -> None:
        """Keeps the first n tokens of the history (and of the KV cache): rewinds generation."""
        self._c.truncate(n)

    def reset(self) -> None:
        """Forgets the history and empties the cache."""
        self._c.reset()

    def fork(self) -> "Sequence":
        """A new sequence with this history and a copy of this cache (on the device)."""
        return Sequence(self._c.fork(), self._config)

    def save_state(self, path: str | os.PathLike | None = None) -> bytes | None:
        """The history and the cached rows: returned as bytes, or written to path. A header names
        the model's shape and the KV dtype; load_state checks them."""
        data = self._c.save_state()
        if path is None:
            return data
        with open(path, "wb") as f:
            f.write(data)
        return None

    def load_state(self, state: bytes | bytearray | memoryview | str | os.PathLike) -> None:
        """Restores what save_state gave (bytes, or the path it was written to), in this process
        or another. A state of another model shape or KV dtype raises ValueError; the sequence is
        then unchanged."""
        if isinstance(state, (str, os.PathLike)):
            with open(state, "rb") as f:
                state = f.read()
        self._c.load_state(state)

    def last_profile(self) -> dict[str, float]:
        """Seconds per op (matmul, attention, ...) of this sequence's last forward pass, largest
        first (the generator must profile: Generator.profile())."""
        prof = self._c.last_profile()
        return dict(sorted(prof.items(), key=lambda kv: -kv[1]))

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
        after a token in stop_ids. Ctrl-C stops it within a kernel (KeyboardInterrupt): the
        tokens made so far stay in the history, the interrupted step leaves no trace."""
        return self._c.generate(n, opts, cached=True, on_token=on_token, stop_ids=stop_ids)

    def prefill_get_last_logits(self, ctx: Seq[int]) -> np.ndarray:
        """prefill(ctx) and the (vocab,) logits of the next token; the cache then holds all of ctx."""
        self._c.prefill(ctx)
        return self._c.logits(cached=True)

    def decode_get_logits(self, token: int) -> np.ndarray:
        """Appends token and returns the next logits; afterwards kv_len == len(tokens). If the
        step fails, the token is taken back: history and cache are as before the call."""
        return self.extend([token])

    def __repr__(self) -> str:
        return f"Sequence(tokens={self._c.n_tokens}, kv_len={self.kv_len}, kv_dtype={self.kv_dtype!r})"


class Generator(Sequence):
    """Generates tokens from a Llama 3.2 or Qwen3 model on one device ("cpu" or "ref"): the model
    (config, weights, compiled plans) and a current sequence (this object's own history and KV
    cache; more with new_sequence()).

    weights: {Hugging Face tensor name: array}. Each matrix (projections, embedding, LM head) keeps
    the dtype it is stored in (float32, float16, bfloat16, or packed block weights:
    rlx.weights.Packed), so a file that mixes dtypes runs as it is; dtype="f32" / "bf16" / "f16"
    converts every matrix once instead, and a block type or recipe ("q8_0", "q4_k_m") quantises the
    matrices in memory as rlx.quantize would write them (rlx/quantize.py). Arrays used in place
    (zero-copy on the cpu device) must stay unchanged while the generator lives; norms and biases
    are used as float32. Missing, extra or mis-shaped tensors raise rlx.WeightsError. kv_dtype: the
    KV cache dtype of its sequences ("f16" by default; "f32", "bf16").
    """

    def __init__(self, config: ModelConfig, weights: dict, device: str = "cpu", dtype: str | None = None,
                 kv_dtype: str | None = None):
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be an rlx LlamaConfig or Qwen3Config, got {type(config).__name__}")
        self.kv_dtype_default = _kv_dtype(kv_dtype)
        arrays = check_weights(config, weights, dtype=dtype)
        self.weight_dtypes = dtype_summary(config, arrays)
        arrays["rope.inv_freq"] = config.rope_inv_freq()
        self._device = device
        self._model = _C.Model(_c_config(config), arrays, device)
        watch_sources(self._model, arrays)
        self._prefill_policy = ("oneshot", 1)
        self._decode_policy = ("oneshot", 1)
        self.batch_invariant = False  # with_batch_invariant()
        budget, hint = soft_memory_budget()
        self._model.set_memory_budget(budget, hint)
        super().__init__(_C.Sequence(self._model, self.kv_dtype_default), config)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str = "cpu", dtype: str | None = None,
                        kv_dtype: str | None = None) -> "Generator":
        """A Hugging Face model directory (config.json + safetensors) or a GGUF file."""
        from rlx import gguf
        from rlx.api import model_path

        path, _ = model_path(path)  # a clear error for a file where the directory is expected
        if gguf.is_gguf(path):
            gf = gguf.GGUFFile(path)
            return cls(gguf.model_config(gf), gguf.model_weights(gf), device=device, dtype=dtype, kv_dtype=kv_dtype)
        return cls(load_config(path), load_weights(path), device=device, dtype=dtype, kv_dtype=kv_dtype)

    @property
    def device(self) -> str:
        return self._device

    @property
    def dtype(self) -> str | None:
        """The dtype of the matrices when they all share one ("bf16"), else None (mixed)."""
        return next(iter(self.weight_dtypes)) if len(self.weight_dtypes) == 1 else None

    def device_stats(self) -> dict:
        """Bytes moved between host and device since the device was opened, and held now."""
        return self._model.device.stats()

    @property
    def sequence(self) -> Sequence:
        """The current sequence (this generator's own history and cache) as a plain Sequence."""
        return Sequence(self._c, self._config)

    def new_sequence(self, kv_dtype: str | None = None) -> Sequence:
        """A fresh sequence over this model's weights and plans (kv_dtype: the generator's default
        unless given)."""
        kv = self.kv_dtype_default if kv_dtype is None else _kv_dtype(kv_dtype)
        return Sequence(_C.Sequence(self._model, kv), self._config)

    # -- many sequences at once (rlx/batching.py) -------------------------------------------------

    def logits_batch(self, seqs: Seq[Sequence], chunk: int = 0) -> list[np.ndarray | None]:
        """The next-token logits of up to 16 sequences of this model, their uncached positions run
        in one plan; see rlx.batching.logits_batch."""
        return _batching.logits_batch(seqs, chunk)

    def step_batch(self, seqs: Seq[Sequence], opts: SampleOpts | Seq[SampleOpts] | None = None,
                   chunk: int = 0) -> list[int | None]:
        """One token for each of up to 16 sequences of this model, in one plan; see
        rlx.batching.step_batch."""
        return _batching.step_batch(seqs, opts, chunk)

    def generate_batch(self, prompts: Seq[Seq[int]], max_tokens: int,
                       opts: SampleOpts | Seq[SampleOpts] | None = None, **kwargs) -> list[list[int]]:
        """New ids for each prompt by continuous batching (stop_ids, max_batch, chunk, on_token);
        see rlx.batching.generate_batch."""
        return _batching.generate_batch(self, prompts, max_tokens, opts, **kwargs)

    # -- compiled plans -------------------------------------------------------------------------

    def with_prefill_cache(self, capacity: int) -> "Generator":
        """Keeps the `capacity` most recently used prefill plans, each specialised to its length."""
        return self._set_policy(prefill=("lru", _positive("capacity", capacity)))

    def with_decode_cache(self, max_past: int) -> "Generator":
        """Bucketed decode: one plan per power-of-two number of cache positions up to max_past,
        compiled at the bucket's size; the positions past the sequence are hidden by a mask
        (O(log n) compiles). A sequence that would hold more than max_past positions raises
        instead of switching policy."""
        return self._set_policy(decode=("bucketed", _positive("max_past", max_past)))

    def with_dynamic_prefill_cache(self) -> "Generator":
        """Prefill plans compiled once with a symbolic SEQ and bound per length."""
        return self._set_policy(prefill=("dynamic", 1))

    def with_dynamic_decode_cache(self) -> "Generator":
        """Decode plans compiled once with symbolic SEQ / PAST and bound per step."""
        return self._set_policy(decode=("dynamic", 1))

    def with_prefill_chunk(self, n: int) -> "Generator":
        """A prompt (or a next turn) goes through the model n positions per plan run (512 by
        default, llama.cpp's n_ubatch), each piece over the cache the earlier ones wrote: the
        plans' intermediates stay the size of n positions however long the prompt (Qwen3-0.6B, an
        8192-token prompt: 320 MiB of them at once, 40 in pieces of 512, the same TTFT). 0: the
        whole run at once. The logits are those of one run up to f32 summation order (and, in an
        f16 / bf16 cache, a neighbouring rounding of a K/V element: tests/unit/test_sequences.py).
        A block without the LM head (a pipeline stage) runs its rows in one piece. If a piece
        fails (Ctrl-C included), the cache is left as the call found it."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"prefill chunk must be an int >= 0 (0: whole), got {n!r}")
        self._model.set_prefill_chunk(n)
        return self

    def with_batch_invariant(self, on: bool = True) -> "Generator":
        """Batch-invariant plans from now on (off by default): a sequence decoded in a batch of
        any size (step_batch, logits_batch, generate_batch) gets exactly the logits, and so the
        greedy tokens, it gets decoded alone, whatever the weights' dtype and the batch. The
        fast batched kernels sum a row's products in another order than the one-row kernels (so
        by default a batched sequence's logits agree with its own to rounding, not bitwise); here
        every product of a decode step (up to 16 rows) runs as groups of rows the decode kernels
        compute row by row, which reads the weights once per group: slower batches
        (benchmarks/README.md). Prompts keep the prefill kernels and the prefill attention, so
        generate_batch (and a Batcher told so) then runs each joining prompt's first step by
        itself, as generate_cached would, instead of in chunks beside the others. Every device
        (vulkan: a decode step's rows through its matrix-vector shader, 8 a dispatch). Drops the
        compiled plans."""
        if not isinstance(on, bool):
            raise TypeError(f"on must be a bool, got {type(on).__name__}")
        self._model.set_batch_invariant(on)
        self.batch_invariant = on
        return self

    def with_compile_seq_cap(self, cap: int) -> "Generator":
        """Bounds the symbolic SEQ / PAST of dynamic plans at cap (below max_position_embeddings):
        their memory is planned once for cap, and a longer context raises."""
        self._model.set_seq_cap(_positive("cap", cap))
        return self

    def _set_policy(self, prefill: tuple[str, int] | None = None,
                    decode: tuple[str, int] | None = None) -> "Generator":
        new_prefill = prefill or self._prefill_policy
        new_decode = decode or self._decode_policy
        max_past = new_decode[1] if new_decode[0] == "bucketed" else self._config.max_position_embeddings
        self._model.set_policy(new_prefill[0], new_prefill[1], new_decode[0], max_past)
        self._prefill_policy, self._decode_policy = new_prefill, new_decode
        return self

    def profile(self, on: bool = True) -> "Generator":
        """Times every op of every forward pass from now on (or stops, with on=False); each
        sequence's last_profile() reads its last pass (a batched step's, step_batch, is the pass of
        every sequence in the batch; the generator's own last_profile() is its own sequence's)."""
        self._model.set_profiling(on)
        return self

    def compile_stats(self) -> dict:
        """prefill_compiles, decode_compiles, plan_hits, compile_seconds, plans_cached and
        planned_bytes (the bytes of intermediates held now: the cached plans run one at a time
        and share one arena, of the largest run's size)."""
        return self._model.stats()

    def release_decode_graphs(self) -> None:
        """Frees the compiled decode plans (e.g. between utterances)."""
        self._model.release_plans(True)

    def release_compile_graphs(self) -> None:
        """Frees every compiled plan; they are recompiled on demand."""
        self._model.release_plans(False)

    def __repr__(self) -> str:
        return (f"Generator({type(self._config).__name__}, layers={self._config.num_hidden_layers}, "
                f"device={self._device!r}, tokens={self._c.n_tokens}, kv_dtype={self.kv_dtype!r})")


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
