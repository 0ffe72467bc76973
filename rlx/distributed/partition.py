"""How a model is split into a pipeline: contiguous, balanced blocks of layers, one per rank.

The first block (it embeds the tokens) runs on the highest rank, the last block (final norm and LM
head, so the logits and the sampling) on rank 0; middle blocks pass hidden states along. With one
rank the single block is the whole model.
"""

from __future__ import annotations

import dataclasses
import enum

from rlx.config import ModelConfig


class Role(enum.Enum):
    FIRST = "first"     # embeds tokens; highest rank
    MIDDLE = "middle"   # hidden in, hidden out
    LAST = "last"       # final norm + LM head; rank 0
    SINGLE = "single"   # world 1: the whole model


def _check_rank(rank: int, world: int) -> None:
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive int, got {world!r}")
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank!r}")


def pipeline_layer_range(n_layers: int, rank: int, world: int) -> range:
    """The layers of rank's block. Blocks are contiguous, their sizes differ by at most one, and
    together they cover every layer exactly once; the highest rank holds layer 0."""
    _check_rank(rank, world)
    if n_layers < world:
        raise ValueError(f"{n_layers} layers cannot be split over {world} ranks (at least one layer per rank)")
    block = world - 1 - rank
    base, extra = divmod(n_layers, world)
    start = block * base + min(block, extra)
    return range(start, start + base + (1 if block < extra else 0))


def block_role(rank: int, world: int) -> Role:
    _check_rank(rank, world)
    if world == 1:
        return Role.SINGLE
    if rank == world - 1:
        return Role.FIRST
    return Role.LAST if rank == 0 else Role.MIDDLE


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """A block of layers [layer_begin, layer_end) and whether it embeds tokens / ends in the head."""

    layer_begin: int
    layer_end: int
    embed: bool
    head: bool

    @classmethod
    def for_role(cls, role: Role, layers: range) -> "BlockSpec":
        return cls(layers.start, layers.stop, embed=role in (Role.FIRST, Role.SINGLE),
                   head=role in (Role.LAST, Role.SINGLE))

    @property
    def layers(self) -> range:
        return range(self.layer_begin, self.layer_end)


def block_weight_filter(name: str, cfg: ModelConfig, spec: BlockSpec) -> bool:
    """Whether the tensor `name` belongs to the block: its layers; the embedding for the embedding
    block and, when embeddings are tied, for the block with the head; the final norm and lm_head for
    the block with the head only; a sparse layer's experts as a Hugging Face file names them (per
    expert) or as one stacked tensor (a GGUF file's). The names come from the C decoder builder."""
    from rlx.weights import expected_weights, expert_parts  # rlx.weights imports rlx._C; keep this module light

    return name in expected_weights(cfg, spec) or name in expert_parts(cfg, spec)
