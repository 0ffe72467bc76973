"""Pipeline stages: one rank's block of a model, built by the same decoder builder as the whole
model (a block of all layers IS the monolithic model).

    st = rlx.PipelineStage(cfg, "cpu", rank, world, weights)         # recomputes the block each step
    st = rlx.PipelineDecodeStage(cfg, "cpu", rank, world, weights)   # KV-cached, one position per step

``forward(tokens=...)`` feeds the embedding block, ``forward(hidden=...)`` the others. It returns the
block's output: logits (vocab,) of the last position for the block with the head, hidden rows
(n, hidden_size) for the others. Each stage holds only its block's weights.

A stage runs several sequences over its one model (weights and plans shared): ``slot=j`` picks
sequence j (made on first use; slot 0 is the default), so a micro-batched pipeline
(PipelineCoordinator.generate_many) keeps one sequence per request in flight on every rank.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlx import _C
from rlx.config import ModelConfig
from rlx.distributed.partition import BlockSpec, block_role
from rlx.generator import _kv_dtype, soft_memory_budget
from rlx.weights import _c_config, check_weights, dtype_summary, watch_sources


class PipelineStage:
    """Recomputes its block over the whole sequence at every step (no cache)."""

    cached = False

    def __init__(self, config: ModelConfig, device: str, rank: int, world: int, weights: dict,
                 dtype: str | None = None, kv_dtype: str | None = None):
        self.config, self.device, self.rank, self.world = config, device, rank, world
        self.role = block_role(rank, world)
        self.spec = BlockSpec.for_rank(config, rank, world)
        arrays = check_weights(config, weights, block=self.spec, dtype=dtype)
        self.weight_dtypes = dtype_summary(config, arrays, self.spec)
        self._weight_count = len(arrays)
        arrays["rope.inv_freq"] = config.rope_inv_freq()
        self._model = _C.Model(_c_config(config), arrays, device, layer_begin=self.spec.layer_begin,
                               layer_end=self.spec.layer_end, embed=self.spec.embed, head=self.spec.head)
        watch_sources(self._model, arrays)
        budget, hint = soft_memory_budget()
        self._model.set_memory_budget(budget, hint)
        self._kv_dtype = _kv_dtype(kv_dtype)
        self._slots: dict[int, list] = {}  # slot -> [_C.Sequence, started]
        self._c = self._slot(0)[0]

    def _slot(self, slot: int) -> list:
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"slot must be an int >= 0, got {slot!r}")
        if slot not in self._slots:
            self._slots[slot] = [_C.Sequence(self._model, self._kv_dtype), False]
        return self._slots[slot]

    def layers(self) -> range:
        """The global indices of this block's layers."""
        return self.spec.layers

    def weight_count(self) -> int:
        """Number of weight tensors this stage holds."""
        return self._weight_count

    def sample(self, logits: np.ndarray, opts=None, sample_index: int = 0, history: Sequence[int] = ()) -> int:
        """A token from a logits row with rlx's sampler (see rlx.SampleOpts): draw `sample_index`
        of the seed's stream, `history` as the repetition-penalty context."""
        return self._c.sample(logits, opts, sample_index, list(history))

    def reset(self, slot: int = 0) -> None:
        """Starts a new sequence in slot (empties the cache of a decode stage)."""
        st = self._slot(slot)
        st[0].reset()
        st[1] = False

    def forward(self, tokens: Sequence[int] | None = None, hidden: np.ndarray | None = None,
                slot: int = 0) -> np.ndarray:
        """tokens: the whole sequence (embedding block); hidden: (n, hidden_size) rows from the
        previous block. Returns logits (vocab,) or hidden (n, hidden_size)."""
        c = self._slot(slot)[0]
        if self.spec.embed:
            if tokens is None or hidden is not None:
                raise ValueError("the embedding block takes tokens, not hidden states")
            c.prefill(tokens)
            return c.forward(None, cached=False)
        if hidden is None or tokens is not None:
            raise ValueError("this block takes hidden states from the previous rank, not tokens")
        return c.forward(hidden, cached=False)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank={self.rank}/{self.world}, role={self.role.value}, "
                f"layers={self.spec.layer_begin}..{self.spec.layer_end - 1}, weights={self._weight_count})")


class PipelineDecodeStage(PipelineStage):
    """KV-cached: the first call after reset() seeds the block's cache with the prompt; each later
    call runs only the new positions (one token per step)."""

    cached = True

    def with_decode_cache(self, max_past: int) -> "PipelineDecodeStage":
        """Bucketed decode plans (see Generator.with_decode_cache)."""
        if not isinstance(max_past, int) or isinstance(max_past, bool) or max_past < 1:
            raise ValueError(f"max_past must be a positive int, got {max_past!r}")
        self._model.set_policy("oneshot", 1, "bucketed", max_past)
        return self

    def forward(self, tokens: Sequence[int] | None = None, hidden: np.ndarray | None = None,
                slot: int = 0) -> np.ndarray:
        """tokens: the prompt on the first call, then the new token(s); hidden: the rows for the
        same positions from the previous block."""
        st = self._slot(slot)
        c, started = st
        if self.spec.embed:
            if tokens is None or hidden is not None:
                raise ValueError("the embedding block takes tokens, not hidden states")
            if not started:
                c.prefill(tokens)
            else:
                c.append(list(tokens))
            out = c.forward(None, cached=True)
        else:
            if hidden is None or tokens is not None:
                raise ValueError("this block takes hidden states from the previous rank, not tokens")
            out = c.forward(hidden, cached=True)
        st[1] = True
        return out
