"""Partitioning a model into a pipeline (rlx.distributed.partition) and what a stage holds:
pipeline_layer_range (contiguous, balanced, every layer exactly once, the highest rank holds layer
0; with the LM head's cost, no other count of layers in the last block makes the costliest block
cheaper), head_layers on the real Qwen3-0.6B / Llama-3.2-1B / Qwen3-MoE shapes, block_role (First =
highest rank, Last = rank 0, Middle, Single for world 1), BlockSpec (for_rank: what a stage holds)
and block_weight_filter (tied and untied embeddings), and a stage's weight_count() / layers() on
tiny random models. Pure CPU, no transport.
"""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.config import config_from_dict
from rlx.distributed import BlockSpec, Role, block_role, block_weight_filter, head_layers, pipeline_layer_range
from rlx.weights import expected_weights


def tiny_config(model_type: str = "llama", tied: bool = False, layers: int = 4, **extra):
    d = {"model_type": model_type, "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2}
    if model_type == "qwen3":
        d["head_dim"] = 8
    d.update(extra)
    return config_from_dict(d)


def random_weights(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) * 0.2).astype(np.float32) for k, s in expected_weights(cfg).items()}


def spec_of(n_layers: int, rank: int, world: int) -> BlockSpec:
    return BlockSpec.for_role(block_role(rank, world), pipeline_layer_range(n_layers, rank, world))


# ------------------------------------------------------------------------------------------------
# pipeline_layer_range
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("n_layers", [1, 2, 3, 4, 5, 7, 8, 16, 24, 28, 31, 32, 36, 80, 81])
def test_layer_ranges_cover_every_layer_once_contiguous_balanced(n_layers, world):
    if n_layers < world:
        with pytest.raises(ValueError, match="cannot be split"):
            pipeline_layer_range(n_layers, 0, world)
        return
    ranges = [pipeline_layer_range(n_layers, r, world) for r in range(world)]
    assert all(isinstance(r, range) and r.step == 1 and len(r) >= 1 for r in ranges)
    # The highest rank starts at layer 0; each lower rank continues where the next higher ended.
    ordered = ranges[::-1]
    assert ordered[0].start == 0 and ordered[-1].stop == n_layers
    for a, b in zip(ordered, ordered[1:]):
        assert a.stop == b.start, ranges
    covered = [i for r in ordered for i in r]
    assert covered == list(range(n_layers))          # every layer exactly once, in order
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1, sizes        # balanced
    assert sum(sizes) == n_layers


def test_layer_range_examples():
    assert pipeline_layer_range(28, 0, 1) == range(0, 28)
    want = [range(21, 28), range(14, 21), range(7, 14), range(0, 7)]
    assert [pipeline_layer_range(28, r, 4) for r in range(4)] == want
    # 5 layers over 2 ranks: the extra layer goes to the first (embedding) block.
    assert [pipeline_layer_range(5, r, 2) for r in range(2)] == [range(3, 5), range(0, 3)]
    assert [pipeline_layer_range(5, r, 3) for r in range(3)] == [range(4, 5), range(2, 4), range(0, 2)]


@pytest.mark.parametrize("h", [0.17, 1.5, 4.32, 9.89, 40.0])
@pytest.mark.parametrize("world", range(2, 9))
@pytest.mark.parametrize("n_layers", [2, 3, 5, 8, 16, 28, 36, 81])
def test_head_cost_balances_the_last_block(n_layers, world, h):
    """With the head's cost: every layer once, contiguous, at least one per block; the blocks other
    than the last differ by at most one; and no other count of layers in the last block (the rest
    split evenly) makes the costliest block cheaper."""
    if n_layers < world:
        return
    ranges = [pipeline_layer_range(n_layers, r, world, head_layers=h) for r in range(world)]
    ordered = ranges[::-1]
    assert [i for r in ordered for i in r] == list(range(n_layers))
    assert all(len(r) >= 1 for r in ranges)
    others = [len(r) for r in ranges[1:]]
    assert max(others) - min(others) <= 1, ranges

    def slowest(last):
        return max(last + h, -(-(n_layers - last) // (world - 1)))

    chosen = slowest(len(ranges[0]))
    assert all(chosen <= slowest(last) for last in range(1, n_layers - world + 2)), (ranges, h)


def shape_config(**d):
    base = {"max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "bos_token_id": 1,
            "eos_token_id": 2}
    return config_from_dict({**base, **d})


QWEN3_06B = dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=True)
LLAMA_32_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                   num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True)


def test_head_layers_of_real_shapes_and_their_splits():
    """The head in layers of what decode reads: Qwen3-0.6B 151936 x 1024 against (2 * 2048 + 2 * 1024)
    x 1024 attention + 3 x 3072 x 1024 MLP; Llama-3.2-1B 128256 x 2048 against 10485760 + 50331648.
    Two ranks then give rank 0 9 (Qwen) / 6 (Llama) layers and the head; four ranks give Qwen's
    rank 0 one layer (its head is 9.9 layers, more than a quarter of 37.9)."""
    qwen, llama = shape_config(**QWEN3_06B), shape_config(**LLAMA_32_1B)
    assert head_layers(qwen) == pytest.approx(151936 * 1024 / (6291456 + 9437184))
    assert head_layers(llama) == pytest.approx(128256 * 2048 / (10485760 + 50331648))
    assert [BlockSpec.for_rank(qwen, r, 2).layers for r in range(2)] == [range(19, 28), range(0, 19)]
    assert [BlockSpec.for_rank(qwen, r, 4).layers for r in range(4)] == \
        [range(27, 28), range(18, 27), range(9, 18), range(0, 9)]
    assert [BlockSpec.for_rank(llama, r, 2).layers for r in range(2)] == [range(10, 16), range(0, 10)]
    assert BlockSpec.for_rank(qwen, 0, 1) == BlockSpec(0, 28, embed=True, head=True)
    # a mixture of experts counts the experts a token uses: Qwen3-30B-A3B's shape, every layer sparse
    moe = shape_config(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                       num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                       tie_word_embeddings=False)
    per_layer = (2 * 32 * 128 + 2 * 4 * 128) * 2048 + 128 * 2048 + 8 * 3 * 768 * 2048
    assert head_layers(moe) == pytest.approx(151936 * 2048 / per_layer)


@pytest.mark.parametrize("h", [-1.0, float("nan"), float("inf"), "1", True, None])
def test_bad_head_layers_is_a_value_error(h):
    with pytest.raises(ValueError, match="head_layers"):
        pipeline_layer_range(8, 0, 2, head_layers=h)


@pytest.mark.parametrize("rank, world", [(-1, 2), (2, 2), (5, 3), (0, 0), (0, -1), (1.0, 2), (0, 2.0), ("0", 2),
                                         (None, 2)])
def test_bad_rank_or_world_is_a_value_error(rank, world):
    with pytest.raises(ValueError):
        pipeline_layer_range(8, rank, world)
    with pytest.raises(ValueError):
        block_role(rank, world)


def test_more_ranks_than_layers_is_a_value_error():
    with pytest.raises(ValueError, match="2 layers cannot be split over 3 ranks"):
        pipeline_layer_range(2, 1, 3)


# ------------------------------------------------------------------------------------------------
# block_role, BlockSpec
# ------------------------------------------------------------------------------------------------

def test_roles():
    assert block_role(0, 1) is Role.SINGLE
    assert [block_role(r, 2) for r in range(2)] == [Role.LAST, Role.FIRST]
    assert [block_role(r, 4) for r in range(4)] == [Role.LAST, Role.MIDDLE, Role.MIDDLE, Role.FIRST]


def test_block_spec_for_each_role():
    assert BlockSpec.for_role(Role.SINGLE, range(0, 4)) == BlockSpec(0, 4, embed=True, head=True)
    assert BlockSpec.for_role(Role.FIRST, range(0, 2)) == BlockSpec(0, 2, embed=True, head=False)
    assert BlockSpec.for_role(Role.MIDDLE, range(2, 3)) == BlockSpec(2, 3, embed=False, head=False)
    assert BlockSpec.for_role(Role.LAST, range(3, 4)) == BlockSpec(3, 4, embed=False, head=True)
    assert BlockSpec(3, 7, False, False).layers == range(3, 7)


# ------------------------------------------------------------------------------------------------
# block_weight_filter
# ------------------------------------------------------------------------------------------------

def names_for(cfg, spec) -> set[str]:
    names = list(expected_weights(cfg))
    if cfg.tie_word_embeddings:
        names.append("lm_head.weight")  # a tied checkpoint may still carry it
    return {n for n in names if block_weight_filter(n, cfg, spec)}


def layer_names(cfg, layers) -> set[str]:
    return {n for n in expected_weights(cfg) if n.startswith("model.layers.")
            and int(n.split(".")[2]) in layers}


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
def test_weight_filter_first_middle_last(model_type, tied):
    cfg = tiny_config(model_type, tied=tied, layers=4, attention_bias=True)
    first, middle, last = spec_of(4, 2, 3), spec_of(4, 1, 3), spec_of(4, 0, 3)
    assert (first.layers, middle.layers, last.layers) == (range(0, 2), range(2, 3), range(3, 4))

    f = names_for(cfg, first)
    assert f == layer_names(cfg, first.layers) | {"model.embed_tokens.weight"}
    m = names_for(cfg, middle)
    assert m == layer_names(cfg, middle.layers)
    lst = names_for(cfg, last)
    # the tied embedding is the LM head: pulled into the last block, which then reads no lm_head
    head = {"model.norm.weight", "model.embed_tokens.weight" if tied else "lm_head.weight"}
    assert lst == layer_names(cfg, last.layers) | head
    # Layers never overlap between blocks; non-layer tensors are where they belong.
    assert not (f & m) and not (m & lst)
    assert ("model.embed_tokens.weight" in (f & lst)) == tied
    assert not any(block_weight_filter(n, cfg, middle) for n in ("model.embed_tokens.weight", "model.norm.weight",
                                                                    "lm_head.weight"))
    # Unknown names belong to no block.
    for spec in (first, middle, last):
        assert not block_weight_filter("model.rotary_emb.inv_freq", cfg, spec)
        assert not block_weight_filter("something.else", cfg, spec)


@pytest.mark.parametrize("tied", [False, True])
def test_weight_filter_single_block_takes_everything(tied):
    cfg = tiny_config("qwen3", tied=tied, layers=3)
    single = spec_of(3, 0, 1)
    assert single == BlockSpec(0, 3, embed=True, head=True)
    assert names_for(cfg, single) == set(expected_weights(cfg))  # a tied model reads no lm_head


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 6])
def test_weight_filter_union_covers_the_model(tied, world):
    cfg = tiny_config("llama", tied=tied, layers=6)
    specs = [spec_of(6, r, world) for r in range(world)]
    per_rank = [names_for(cfg, s) for s in specs]
    assert set().union(*per_rank) >= set(expected_weights(cfg))
    # Every layer tensor is held by exactly one rank.
    for name in expected_weights(cfg):
        holders = [r for r, names in enumerate(per_rank) if name in names]
        if name.startswith("model.layers."):
            assert len(holders) == 1, (name, holders)
        elif name == "model.embed_tokens.weight":
            want = {world - 1} | ({0} if tied else set())
            assert set(holders) == want, (name, holders)
        else:  # final norm, untied lm_head
            assert holders == [0], (name, holders)


# ------------------------------------------------------------------------------------------------
# Stages hold only their block
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage_cls", [rlx.PipelineStage, rlx.PipelineDecodeStage])
@pytest.mark.parametrize("model_type, tied", [("llama", False), ("llama", True), ("qwen3", False), ("qwen3", True)])
def test_stage_weight_count_and_layers(stage_cls, model_type, tied):
    cfg = tiny_config(model_type, tied=tied, layers=4)
    weights = random_weights(cfg)
    per_layer = sum(1 for n in expected_weights(cfg) if n.startswith("model.layers.0."))
    total = len(expected_weights(cfg))
    for world in (1, 2, 3, 4):
        counts = []
        for rank in range(world):
            st = stage_cls(cfg, "cpu", rank, world, weights)
            layers = BlockSpec.for_rank(cfg, rank, world).layers
            assert st.layers() == layers
            assert st.role is block_role(rank, world)
            extra = 0
            if st.role in (Role.FIRST, Role.SINGLE):
                extra += 1                                  # embedding
            if st.role in (Role.LAST, Role.SINGLE):
                extra += 1 + (0 if tied else 1)             # final norm (+ lm_head)
                if tied and st.role is Role.LAST:
                    extra += 1                              # tied embedding for the head
            assert st.weight_count() == per_layer * len(layers) + extra, (world, rank, st)
            assert f"rank={rank}/{world}" in repr(st) and st.role.value in repr(st)
            counts.append(st.weight_count())
        if world == 1:
            assert counts == [total]
        else:
            assert sum(counts) == total + (1 if tied else 0)  # only the tied embedding is held twice


def test_stage_needs_only_its_block_of_weights():
    """A rank given only its block's tensors builds (nothing else is required), and a missing
    tensor of its own block is reported."""
    cfg = tiny_config("qwen3", tied=True, layers=4)
    weights = random_weights(cfg)
    for rank in range(3):
        spec = BlockSpec.for_rank(cfg, rank, 3)
        mine = {k: v for k, v in weights.items() if block_weight_filter(k, cfg, spec)}
        st = rlx.PipelineDecodeStage(cfg, "cpu", rank, 3, mine)
        assert st.weight_count() == len(mine)
    spec = BlockSpec.for_rank(cfg, 1, 3)
    assert spec.layers == range(2, 3)
    mine = {k: v for k, v in weights.items() if block_weight_filter(k, cfg, spec)}
    mine.pop("model.layers.2.mlp.up_proj.weight")
    with pytest.raises(rlx.WeightsError, match="model.layers.2.mlp.up_proj.weight"):
        rlx.PipelineStage(cfg, "cpu", 1, 3, mine)


def test_stage_inputs_match_its_role():
    cfg = tiny_config("llama", layers=2)
    weights = random_weights(cfg)
    first, last = (rlx.PipelineStage(cfg, "cpu", r, 2, weights) for r in (1, 0))
    h = first.forward(tokens=[1, 2, 3])
    assert h.shape == (3, cfg.hidden_size) and h.dtype == np.float32
    with pytest.raises(ValueError, match="takes tokens"):
        first.forward(hidden=h)
    with pytest.raises(ValueError, match="takes hidden states"):
        last.forward(tokens=[1, 2, 3])
    logits = last.forward(hidden=h)
    assert logits.shape == (cfg.vocab_size,)
    with pytest.raises(ValueError):
        rlx.PipelineStage(cfg, "cpu", 2, 2, weights)
    with pytest.raises(ValueError, match="cannot be split"):
        rlx.PipelineStage(cfg, "cpu", 0, 3, weights)
