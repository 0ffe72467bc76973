"""How a model is split into a pipeline: contiguous blocks of layers, one per rank, balanced by
what a decode step reads.

The first block (it embeds the tokens) runs on the highest rank, the last block (final norm and LM
head, so the logits and the sampling) on rank 0; middle blocks pass hidden states along. With one
rank the single block is the whole model.

Decode reads every weight of a block once per token, and the LM head is a matrix as large as
several layers (Qwen3-0.6B: 9.9 layers' worth, Llama-3.2-1B: 4.3), so blocks of equal layer counts
left rank 0 the slowest stage: with two requests in flight through two ranks (Qwen3-0.6B, f32, one
thread each on the Intel Xeon) rank 0 computed 112 ms a step and rank 1 68 ms, and the pipeline
ran at the slower one's pace (0.73 of twice one rank's tok/s). BlockSpec.for_rank gives rank 0 the
layers that leave its cost, its layers plus the head's share (head_layers), at the mean.
"""

from __future__ import annotations

import dataclasses
import enum
import math

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


def pipeline_layer_range(n_layers: int, rank: int, world: int, head_layers: float = 0.0) -> range:
    """The layers of rank's block. Blocks are contiguous, each holds at least one layer, together
    they cover every layer exactly once, and the highest rank holds layer 0. head_layers is the
    LM head's cost in layers (head_layers(config)). The last block (rank 0) takes x = (n_layers +
    head_layers) / world - head_layers layers, rounded down or up, whichever leaves the costliest
    block (layers, plus the head on rank 0) cheaper, down on a tie (at least one layer, at most what
    leaves one to every other block); the other blocks split the rest, their sizes differing by at
    most one (the extra layers to the first blocks). With head_layers 0 every size differs by at
    most one."""
    _check_rank(rank, world)
    if n_layers < world:
        raise ValueError(f"{n_layers} layers cannot be split over {world} ranks (at least one layer per rank)")
    if isinstance(head_layers, bool) or not isinstance(head_layers, (int, float)) or not \
            (math.isfinite(head_layers) and head_layers >= 0):
        raise ValueError(f"head_layers must be a finite number >= 0, got {head_layers!r}")
    if world == 1:
        return range(n_layers)

    def slowest(last: int) -> float:  # the costliest block with `last` layers in the last one
        return max(last + head_layers, -(-(n_layers - last) // (world - 1)))

    most = n_layers - (world - 1)
    down = min(max(math.floor((n_layers + head_layers) / world - head_layers), 1), most)
    up = min(down + 1, most)
    last = up if slowest(up) < slowest(down) else down
    if rank == 0:
        return range(n_layers - last, n_layers)
    block, others = world - 1 - rank, world - 1
    base, extra = divmod(n_layers - last, others)
    start = block * base + min(block, extra)
    return range(start, start + base + (1 if block < extra else 0))


def head_layers(cfg: ModelConfig) -> float:
    """The LM head's weights (vocab_size x hidden_size) in units of what a decode step reads of a
    layer, the mean over the layers: attention (q, k, v, o) and the MLP, a sparse layer's being its
    router and the num_experts_per_tok experts a token uses. Parameters, not bytes: a head stored
    in another dtype than the layers (Q4_K_M's Q6_K) is counted as if in theirs."""
    H, D = cfg.hidden_size, cfg.head_dim
    attention = 2 * cfg.num_attention_heads * D * H + 2 * cfg.num_key_value_heads * D * H
    mlp = 0
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_sparse(i):
            mlp += cfg.num_experts * H + cfg.num_experts_per_tok * 3 * cfg.moe_intermediate_size * H
        else:
            mlp += 3 * cfg.intermediate_size * H
    return cfg.vocab_size * H / (attention + mlp / cfg.num_hidden_layers)


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

    @classmethod
    def for_rank(cls, cfg: ModelConfig, rank: int, world: int) -> "BlockSpec":
        """rank's block of the model, as its pipeline stage holds it (the layers balanced with the
        head's cost: pipeline_layer_range with head_layers(cfg))."""
        return cls.for_role(block_role(rank, world),
                            pipeline_layer_range(cfg.num_hidden_layers, rank, world, head_layers(cfg)))

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
