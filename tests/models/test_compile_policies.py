"""Compile policies of rlx.Generator: one-shot, prefill LRU, bucketed decode, dynamic prefill /
decode, the compile seq cap, release_*, and the soft memory budget.

The oracle is the one-shot path (proven against transformers in test_generator_vs_hf.py): every
policy must reproduce its greedy tokens exactly and its logits within 1e-5, on small
random-initialised Llama and Qwen3 models (including Qwen3 with a sliding window, whose bucketed
masks carry the window) and on the trained stories260K, whose 64 expected ids (from llama2.c) must
come out under every policy. Compile counts are asserted; timings never are.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hf_cases import HF_CASES, case_ids

import rlx

TOL = 1e-5
GREEDY = rlx.SampleOpts.greedy()

LLAMA = "llama_gqa2_tied"
QWEN3 = "qwen3_tied"
QWEN3_SW = "qwen3_sliding"  # sliding window 4 on the layers past max_window_layers
assert all(c in HF_CASES for c in (LLAMA, QWEN3, QWEN3_SW))
assert HF_CASES[LLAMA][1]["max_position_embeddings"] >= 256


def _gen(path: str, device: str = "cpu", prefill: tuple | None = None, decode: tuple | None = None,
         seq_cap: int | None = None) -> rlx.Generator:
    """A generator with the given policies: prefill ("lru", cap) | ("dynamic",); decode
    ("bucketed", max_past) | ("dynamic",)."""
    gen = rlx.Generator.from_pretrained(path, device=device)
    if prefill is not None:
        gen = gen.with_prefill_cache(prefill[1]) if prefill[0] == "lru" else gen.with_dynamic_prefill_cache()
    if decode is not None:
        gen = gen.with_decode_cache(decode[1]) if decode[0] == "bucketed" else gen.with_dynamic_decode_cache()
    if seq_cap is not None:
        gen = gen.with_compile_seq_cap(seq_cap)
    return gen


def _prompt(model, n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in case_ids(model, n, seed)]


def _trace(gen: rlx.Generator, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy decode by hand: the prefill's last logits, then decode_get_logits row by row."""
    rows = [gen.prefill_get_last_logits(prompt)]
    toks = []
    for _ in range(steps):
        toks.append(int(np.argmax(rows[-1])))
        rows.append(gen.decode_get_logits(toks[-1]))
    return toks, np.stack(rows)


def _assert_same(got, want, what: str):
    (gt, gr), (wt, wr) = got, want
    assert gt == wt, f"{what}: greedy tokens differ"
    diff = np.abs(gr - wr).max(axis=1)
    bad = np.nonzero(diff > TOL)[0]
    assert bad.size == 0, f"{what}: logits row {bad[:5].tolist()} differ by up to {diff.max():.3g}"


_REF_CACHE: dict = {}


def _oneshot(path: str, prompt: list[int], steps: int, device: str = "cpu"):
    """The one-shot trace (memoised per model, prompt, steps and device)."""
    key = (path, tuple(prompt), steps, device)
    if key not in _REF_CACHE:
        _REF_CACHE[key] = _trace(_gen(path, device), prompt, steps)
    return _REF_CACHE[key]


# ---- bucketed decode ------------------------------------------------------------------------

@pytest.mark.parametrize("hf_model,device", [(LLAMA, "cpu"), (QWEN3, "cpu"), (QWEN3_SW, "cpu"), (LLAMA, "ref")],
                         indirect=["hf_model"])
def test_bucketed_decode_matches_oneshot(hf_model, device):
    path, model = hf_model
    # cache positions read (past + the new one) 2..46: buckets 2, 4, 8, 16, 32, 64
    prompt, steps = _prompt(model, 1), 45
    gen = _gen(path, device, decode=("bucketed", 64))
    got = _trace(gen, prompt, steps)
    _assert_same(got, _oneshot(path, prompt, steps, device), f"bucketed/{device}")
    st = gen.compile_stats()
    assert st["decode_compiles"] == 6
    assert st["prefill_compiles"] == 1
    # the same through step_cached / generate_cached
    gen.prefill(prompt)
    assert gen.generate_cached(steps + 1, GREEDY) == got[0] + [int(np.argmax(got[1][-1]))]
    assert gen.compile_stats()["decode_compiles"] == 6  # the buckets stay compiled across utterances


@pytest.mark.parametrize("hf_model", [QWEN3_SW], indirect=True)
def test_bucketed_last_bucket_capped_at_max_past(hf_model):
    """max_past 40 (not a power of two): steps reading 33..40 cache positions share a plan of 40
    rows; the last step reads exactly 40 (a past of 39 and its own row)."""
    path, model = hf_model
    prompt = _prompt(model, 5, seed=1)
    steps = 40 - 5
    gen = _gen(path, decode=("bucketed", 40))
    _assert_same(_trace(gen, prompt, steps), _oneshot(path, prompt, steps), "bucketed max_past=40")
    assert gen.kv_len == 40
    assert gen.compile_stats()["decode_compiles"] == 4  # buckets 8, 16, 32 and 40 (not 64)


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_bucketed_past_beyond_max_past_raises(hf_model):
    path, model = hf_model
    prompt = _prompt(model, 3, seed=2)
    gen = _gen(path, decode=("bucketed", 10))
    gen.prefill(prompt)
    toks = gen.generate_cached(8, GREEDY)  # the last step read exactly 10 positions (a past of 9)
    assert gen.kv_len == 10 and len(gen.tokens) == 11
    history = gen.tokens
    with pytest.raises(ValueError, match=r"11 cached positions after this step exceed max_past 10 of the bucketed"):
        gen.step_cached(GREEDY)
    assert gen.tokens == history and gen.kv_len == 10  # unchanged by the refusal
    with pytest.raises(ValueError, match="max_past 10"):
        gen.generate_cached(5, GREEDY)
    assert gen.tokens == history
    # a new utterance is fine, and matches one-shot
    gen.prefill(prompt)
    assert gen.generate_cached(8, GREEDY) == toks
    ref = _gen(path)
    ref.prefill(prompt)
    assert ref.generate_cached(8, GREEDY) == toks


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_decode_get_logits_refusal_leaves_history_unchanged(hf_model):
    """decode_get_logits appends before its cached step; a refused step must take the token back."""
    path, model = hf_model
    prompt = _prompt(model, 3, seed=2)
    gen = _gen(path, decode=("bucketed", 10))
    gen.prefill(prompt)
    toks = gen.generate_cached(8, GREEDY)
    history, kv = gen.tokens, gen.kv_len
    with pytest.raises(ValueError, match="max_past 10"):
        gen.decode_get_logits(history[-1])
    assert gen.tokens == history and gen.kv_len == kv
    gen.prefill(prompt)
    assert gen.generate_cached(8, GREEDY) == toks


@pytest.mark.parametrize("hf_model", [QWEN3_SW, LLAMA], indirect=True)
def test_bucketed_multi_token_extend(hf_model):
    """Naive steps grow the history past the cache; the next cached call extends by several
    positions at once (SEQ > 1 over a padded past; the masks carry causality and the window)."""
    path, model = hf_model
    prompt = _prompt(model, 6, seed=3)

    def run(gen):
        rows, toks = [gen.prefill_get_last_logits(prompt)], []
        for _ in range(4):
            toks.append(int(np.argmax(rows[-1])))
            rows.append(gen.decode_get_logits(toks[-1]))
        toks += gen.generate(3, GREEDY)            # naive: the cache stays at 10 positions
        rows.append(gen.decode_get_logits(toks[-1]))  # extends by 4 over a past of 10 (bucket 16)
        toks.append(gen.step_cached(GREEDY))
        k, v = gen.kv_cache(1)
        return toks, np.stack(rows), k.copy(), v.copy()

    got, want = run(_gen(path, decode=("bucketed", 64))), run(_gen(path))
    _assert_same(got[:2], want[:2], "bucketed multi-token extend")
    np.testing.assert_allclose(got[2], want[2], atol=TOL)
    np.testing.assert_allclose(got[3], want[3], atol=TOL)


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_bucketed_padding_never_reads_stale_rows(hf_model):
    """A long utterance leaves K/V rows beyond a later, shorter one; the padded bucket rows that
    cover them must stay hidden."""
    path, model = hf_model
    short, long = _prompt(model, 2, seed=4), _prompt(model, 90, seed=5)
    gen = _gen(path, decode=("bucketed", 256))
    gen.prefill(long)
    gen.generate_cached(40, GREEDY)
    _assert_same(_trace(gen, short, 30), _oneshot(path, short, 30), "bucketed after a longer utterance")


# ---- dynamic prefill / decode ---------------------------------------------------------------

@pytest.mark.parametrize("hf_model", [LLAMA, QWEN3_SW], indirect=True)
def test_dynamic_decode_matches_oneshot(hf_model):
    path, model = hf_model
    prompt, steps = _prompt(model, 3), 45
    gen = _gen(path, decode=("dynamic",))
    _assert_same(_trace(gen, prompt, steps), _oneshot(path, prompt, steps), "dynamic decode")
    st = gen.compile_stats()
    assert st["decode_compiles"] == 1 and st["prefill_compiles"] == 1
    assert st["plan_hits"] == steps - 1


@pytest.mark.parametrize("hf_model", [LLAMA, QWEN3_SW], indirect=True)
def test_dynamic_prefill_matches_oneshot(hf_model):
    path, model = hf_model
    gen, ref = _gen(path, prefill=("dynamic",)), _gen(path)
    lengths = [1, 2, 7, 33, 100, 200, 7]
    for n in lengths:
        prompt = _prompt(model, n, seed=n)
        got, want = gen.prefill_get_last_logits(prompt), ref.prefill_get_last_logits(prompt)
        assert int(np.argmax(got)) == int(np.argmax(want))
        assert np.abs(got - want).max() <= TOL, f"prefill of {n} tokens"
    assert gen.compile_stats()["prefill_compiles"] == 1
    assert ref.compile_stats()["prefill_compiles"] == len(lengths)  # one-shot: every change of length


@pytest.mark.parametrize("hf_model", [LLAMA, QWEN3, QWEN3_SW], indirect=True)
def test_dynamic_prefill_and_decode_match_oneshot(hf_model):
    path, model = hf_model
    for n in (1, 11):
        prompt = _prompt(model, n, seed=n)
        gen = _gen(path, prefill=("dynamic",), decode=("dynamic",))
        _assert_same(_trace(gen, prompt, 40), _oneshot(path, prompt, 40), f"dynamic both, prompt {n}")
        st = gen.compile_stats()
        assert (st["prefill_compiles"], st["decode_compiles"], st["plans_cached"]) == (1, 1, 2)


# ---- prefill LRU ----------------------------------------------------------------------------

@pytest.mark.parametrize("hf_model", [LLAMA, QWEN3_SW], indirect=True)
def test_prefill_lru_never_changes_output(hf_model):
    path, model = hf_model
    gen, ref = _gen(path, prefill=("lru", 2)), _gen(path)
    lengths = [5, 9, 5, 9, 13, 5, 1, 64]
    for i, n in enumerate(lengths):
        prompt = _prompt(model, n, seed=10 + i)  # a different prompt each time, lengths repeat
        got, want = gen.prefill_get_last_logits(prompt), ref.prefill_get_last_logits(prompt)
        assert np.abs(got - want).max() <= TOL, f"prefill {i} of {n} tokens"
        assert int(np.argmax(got)) == int(np.argmax(want))
    # 5, 9 compile; 5, 9 hit; 13 evicts 5; 5 evicts 9; 1 evicts 13; 64 evicts 5
    st = gen.compile_stats()
    assert st["prefill_compiles"] == 6 and st["plan_hits"] == 2 and st["plans_cached"] == 2
    # and a whole generation after an LRU prefill
    prompt = _prompt(model, 9, seed=99)
    _assert_same(_trace(gen, prompt, 20), _oneshot(path, prompt, 20), "lru prefill + decode")


@pytest.mark.parametrize("hf_model", [QWEN3], indirect=True)
def test_prefill_lru_hit_on_same_length(hf_model):
    path, model = hf_model
    gen = _gen(path, prefill=("lru", 4))
    gen.prefill_get_last_logits(_prompt(model, 12, seed=1))
    before = gen.compile_stats()
    got = gen.prefill_get_last_logits(_prompt(model, 12, seed=2))  # another prompt, same length
    after = gen.compile_stats()
    assert after["prefill_compiles"] == before["prefill_compiles"] == 1
    assert after["plan_hits"] == before["plan_hits"] + 1
    want = _gen(path).prefill_get_last_logits(_prompt(model, 12, seed=2))
    assert np.abs(got - want).max() <= TOL


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_prefill_lru_evicts_beyond_capacity(hf_model):
    path, model = hf_model

    def compiles(capacity, lengths):
        gen = _gen(path, prefill=("lru", capacity))
        for n in lengths:
            gen.prefill_get_last_logits(_prompt(model, n))
        st = gen.compile_stats()
        assert st["plans_cached"] == min(capacity, len(set(lengths)))
        return st["prefill_compiles"], st["plan_hits"]

    assert compiles(2, [3, 5, 3, 5, 3, 5]) == (2, 4)      # within capacity: all hits after the first two
    assert compiles(2, [3, 5, 9, 3, 5, 9]) == (6, 0)      # three lengths through two slots: always the LRU
    assert compiles(3, [3, 5, 9, 3, 5, 9]) == (3, 3)
    assert compiles(2, [3, 5, 3, 9, 3, 5]) == (4, 2)      # recency: 3 stays, 5 is evicted by 9
    # one-shot keeps one prefill plan: every change of length recompiles
    gen = _gen(path)
    for n in [3, 5, 3, 5]:
        gen.prefill_get_last_logits(_prompt(model, n))
    assert gen.compile_stats()["prefill_compiles"] == 4


# ---- compile counts over a long generation ----------------------------------------------------

@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_compile_counts_200_steps(hf_model):
    path, model = hf_model
    prompt, n = _prompt(model, 3, seed=6), 200
    assert len(prompt) + n <= model.config.max_position_embeddings

    def run(**policy):
        gen = _gen(path, **policy)
        gen.prefill(prompt)
        toks = gen.generate_cached(n, GREEDY)
        return toks, gen.compile_stats()

    oneshot, st_one = run()
    bucketed, st_buck = run(decode=("bucketed", 256))
    dynamic, st_dyn = run(decode=("dynamic",))
    assert bucketed == oneshot and dynamic == oneshot
    # 200 cached steps = 1 prefill + 199 decode steps over pasts 3..201
    assert st_one["prefill_compiles"] == st_buck["prefill_compiles"] == st_dyn["prefill_compiles"] == 1
    assert st_one["decode_compiles"] == n - 1                      # one per step
    assert st_buck["decode_compiles"] <= math.ceil(math.log2(n)) + 2
    assert st_buck["decode_compiles"] == 7                         # buckets 4, 8, ..., 256
    assert st_dyn["decode_compiles"] == 1
    assert st_one["plans_cached"] == 2                             # one prefill + one decode kept
    assert st_buck["plans_cached"] == 1 + 7
    for st in (st_one, st_buck, st_dyn):
        assert st["compile_seconds"] > 0 and st["planned_bytes"] > 0


# ---- policy changes, release_* ----------------------------------------------------------------

SWITCHES = {
    "with_decode_cache": lambda g: g.with_decode_cache(64),
    "with_dynamic_decode_cache": lambda g: g.with_dynamic_decode_cache(),
    "with_prefill_cache": lambda g: g.with_prefill_cache(3),
    "with_dynamic_prefill_cache": lambda g: g.with_dynamic_prefill_cache(),
}


@pytest.mark.parametrize("start", ["oneshot", "bucketed"])
@pytest.mark.parametrize("hf_model", [QWEN3_SW], indirect=True)
def test_policy_change_mid_utterance_keeps_output(hf_model, start):
    """Policies belong to the model and every plan reads the one KV cache layout, so a policy may
    change between any two steps (its plans are dropped and rebuilt): the utterance goes on with
    the one-shot path's tokens and logits."""
    path, model = hf_model
    prompt, steps = _prompt(model, 3, seed=7), 30
    want = _oneshot(path, prompt, steps)
    gen = _gen(path, decode=("bucketed", 64) if start == "bucketed" else None)
    rows = [gen.prefill_get_last_logits(prompt)]
    toks = []
    names = list(SWITCHES)
    for i in range(steps):
        toks.append(int(np.argmax(rows[-1])))
        rows.append(gen.decode_get_logits(toks[-1]))
        if i in (0, 6, 20):  # after cached steps, across bucket edges
            before = gen.compile_stats()["plans_cached"]
            SWITCHES[names[(i // 6) % len(names)]](gen)
            assert before >= 1 and gen.compile_stats()["plans_cached"] == 0  # a policy change drops the plans
    _assert_same((toks, np.stack(rows)), want, f"{start} with switches mid-utterance")


@pytest.mark.parametrize("hf_model", [QWEN3_SW], indirect=True)
def test_policy_change_allowed_before_any_cached_step(hf_model):
    path, model = hf_model
    prompt = _prompt(model, 4, seed=8)
    gen = _gen(path)
    gen.prefill(prompt)
    gen.generate(3, GREEDY)       # naive steps leave the KV cache empty
    assert gen.kv_len == 0
    gen.with_decode_cache(64)     # allowed
    toks = gen.generate_cached(10, GREEDY)
    ref = _gen(path)
    ref.prefill(prompt)
    assert ref.generate(3, GREEDY) + ref.generate_cached(10, GREEDY) == gen.tokens[len(prompt):]
    assert toks == gen.tokens[len(prompt) + 3:]


@pytest.mark.parametrize("hf_model", [LLAMA, QWEN3_SW], indirect=True)
def test_mixing_policies_across_utterances(hf_model):
    path, model = hf_model
    pa, pb, pc = _prompt(model, 5, seed=20), _prompt(model, 2, seed=21), _prompt(model, 17, seed=22)
    steps = 30
    gen = _gen(path)
    _assert_same(_trace(gen, pa, steps), _oneshot(path, pa, steps), "utterance 1: oneshot")

    gen.release_decode_graphs()
    st = gen.compile_stats()
    assert st["plans_cached"] == 1  # the prefill plan stays
    gen.prefill(pb)
    gen.with_decode_cache(64)
    _assert_same(_trace(gen, pb, steps), _oneshot(path, pb, steps), "utterance 2: bucketed")

    gen.release_compile_graphs()
    assert gen.compile_stats()["plans_cached"] == 0
    gen.prefill(pc)
    gen.with_dynamic_prefill_cache().with_dynamic_decode_cache()
    _assert_same(_trace(gen, pc, steps), _oneshot(path, pc, steps), "utterance 3: dynamic both")

    gen.prefill(pa)
    gen.with_prefill_cache(2).with_decode_cache(128)  # lru prefill + bucketed decode
    _assert_same(_trace(gen, pa, steps), _oneshot(path, pa, steps), "utterance 4: lru + bucketed")
    gen.release_decode_graphs()
    _assert_same(_trace(gen, pb, steps), _oneshot(path, pb, steps), "utterance 5: after release_decode_graphs")


@pytest.mark.parametrize("hf_model", [QWEN3_SW], indirect=True)
@pytest.mark.parametrize("decode", [None, ("bucketed", 64), ("dynamic",)])
def test_release_mid_utterance_is_safe(hf_model, decode):
    """Releasing plans is not a policy change: allowed mid-utterance; plans come back on demand."""
    path, model = hf_model
    prompt, steps = _prompt(model, 3, seed=9), 30
    gen = _gen(path, decode=decode)
    rows = [gen.prefill_get_last_logits(prompt)]
    toks = []
    for i in range(steps):
        toks.append(int(np.argmax(rows[-1])))
        rows.append(gen.decode_get_logits(toks[-1]))
        if i == 10:
            gen.release_decode_graphs()
        if i == 20:
            gen.release_compile_graphs()
            assert gen.compile_stats()["plans_cached"] == 0
    _assert_same((toks, np.stack(rows)), _oneshot(path, prompt, steps), f"release mid-utterance {decode}")
    if decode == ("dynamic",):
        assert gen.compile_stats()["decode_compiles"] == 3  # compiled again after each release


# ---- compile seq cap ------------------------------------------------------------------------

@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_seq_cap_bounds_dynamic_plans(hf_model):
    path, model = hf_model
    cap = 32
    gen = _gen(path, prefill=("dynamic",), decode=("dynamic",), seq_cap=cap)
    ref = _gen(path)
    for n in (1, 16, cap):
        prompt = _prompt(model, n, seed=n)
        assert np.abs(gen.prefill_get_last_logits(prompt) - ref.prefill_get_last_logits(prompt)).max() <= TOL
    with pytest.raises(ValueError, match=rf"SEQ = {cap + 1} exceeds its compile cap {cap}"):
        gen.prefill_get_last_logits(_prompt(model, cap + 1))
    assert gen.kv_len == 0 and len(gen.tokens) == cap + 1  # prefill set the history; the cache stayed empty
    # decode up to a past of cap, then the PAST symbol hits the cap
    prompt = _prompt(model, 4, seed=30)
    steps = cap - 4 + 1  # the last step runs over a past of exactly cap
    _assert_same(_trace(gen, prompt, steps), _oneshot(path, prompt, steps), "dynamic under a seq cap")
    assert gen.kv_len == cap + 1
    gen.step_cached(GREEDY)  # samples from the logits already held: no plan runs
    history = gen.tokens
    with pytest.raises(ValueError, match=rf"PAST = {cap + 1} exceeds its compile cap {cap}"):
        gen.step_cached(GREEDY)
    assert gen.tokens == history and gen.kv_len == cap + 1  # unchanged by the refusal
    # usable after a new prefill; still one plan per kind
    gen.prefill(prompt)
    assert gen.generate_cached(5, GREEDY) == _oneshot(path, prompt, steps)[0][:5]
    st = gen.compile_stats()
    assert (st["prefill_compiles"], st["decode_compiles"]) == (1, 1)


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_seq_cap_shrinks_planned_bytes(hf_model):
    path, model = hf_model
    prompt = _prompt(model, 8, seed=31)

    def planned(cap):
        gen = _gen(path, prefill=("dynamic",), decode=("dynamic",), seq_cap=cap)
        gen.prefill(prompt)
        toks = gen.generate_cached(6, GREEDY)
        return gen.compile_stats()["planned_bytes"], toks

    small, big = planned(16), planned(256)
    assert small[1] == big[1]
    assert 0 < small[0] < big[0]


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_seq_cap_argument_checks(hf_model):
    path, model = hf_model
    gen = _gen(path)
    for bad in (0, -4, 1.5, True):
        with pytest.raises(ValueError, match="cap"):
            gen.with_compile_seq_cap(bad)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        gen.with_compile_seq_cap(model.config.max_position_embeddings + 1)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_past"):
            gen.with_decode_cache(bad)
        with pytest.raises(ValueError, match="capacity"):
            gen.with_prefill_cache(bad)
    # a refused argument changes nothing
    gen.prefill([1, 2, 3])
    gen.generate_cached(3, GREEDY)
    assert gen.compile_stats()["decode_compiles"] == 2


# ---- soft memory budget ---------------------------------------------------------------------

def _ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_memory_budget_refuses_with_the_stated_message(hf_model, monkeypatch):
    path, model = hf_model
    prompt = _prompt(model, 6, seed=40)
    monkeypatch.setenv("RLX_SOFT_MEMORY_FRACTION", "1e-9")  # a few dozen bytes
    gen = _gen(path)
    budget = int(_ram() * 1e-9)
    assert budget > 0
    gen.prefill(prompt)
    with pytest.raises(MemoryError) as ei:
        gen.step_cached(GREEDY)
    msg = str(ei.value)
    assert "estimated" in msg and f"budget of {budget} bytes" in msg, msg
    assert "RLX_SOFT_MEMORY_FRACTION=1e-9" in msg, msg
    estimate = int(msg.split("estimated ")[1].split(" bytes")[0])
    assert estimate > budget
    assert gen.tokens == prompt and gen.kv_len == 0  # unchanged
    with pytest.raises(MemoryError, match="RLX_SOFT_MEMORY_FRACTION"):
        gen.generate(2, GREEDY)  # the naive path is budgeted too
    assert gen.tokens == prompt


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_memory_budget_refuses_big_plans_only(hf_model, monkeypatch):
    """A budget between a short and a long prefill's arena: the long one is refused, the generator
    keeps working for short ones, with one-shot's outputs."""
    path, model = hf_model
    short, long = _prompt(model, 4, seed=41), _prompt(model, 200, seed=42)
    probe = _gen(path)
    probe.prefill_get_last_logits(long)
    big = probe.compile_stats()["planned_bytes"]
    probe.release_compile_graphs()
    _trace(probe, short, 10)
    small = probe.compile_stats()["planned_bytes"]  # the short prefill plan + a decode plan
    assert small < big
    fraction = (small + big) / 2 / _ram()
    monkeypatch.setenv("RLX_SOFT_MEMORY_FRACTION", repr(fraction))
    gen = _gen(path)
    _assert_same(_trace(gen, short, 10), _oneshot(path, short, 10), "under a budget")
    gen.prefill(long)
    with pytest.raises(MemoryError, match=r"above the memory budget.*RLX_SOFT_MEMORY_FRACTION"):
        gen.step_cached(GREEDY)
    assert gen.tokens == long and gen.kv_len == 0
    _assert_same(_trace(gen, short, 10), _oneshot(path, short, 10), "usable after a refusal")


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_memory_fraction_rounding_to_zero_still_refuses(hf_model, monkeypatch):
    """A valid fraction whose budget is under one byte must refuse every plan, not turn the
    budget off (0 bytes means "no budget" to the C side)."""
    monkeypatch.setenv("RLX_SOFT_MEMORY_FRACTION", "1e-12")  # in (0, 1]: valid, and < 1 byte of RAM
    assert int(_ram() * 1e-12) == 0
    gen = _gen(hf_model[0])
    gen.prefill([1, 2, 3])
    with pytest.raises(MemoryError, match="RLX_SOFT_MEMORY_FRACTION"):
        gen.step_cached(GREEDY)


@pytest.mark.parametrize("bad", ["abc", "0", "2", "-0.5", "nan", ""])
@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_memory_fraction_invalid(hf_model, monkeypatch, bad):
    monkeypatch.setenv("RLX_SOFT_MEMORY_FRACTION", bad)
    with pytest.raises(ValueError, match="RLX_SOFT_MEMORY_FRACTION"):
        _gen(hf_model[0])


@pytest.mark.parametrize("hf_model", [LLAMA], indirect=True)
def test_memory_fraction_one_is_valid(hf_model, monkeypatch):
    monkeypatch.setenv("RLX_SOFT_MEMORY_FRACTION", "1")
    gen = _gen(hf_model[0])
    gen.prefill([1, 2])
    assert len(gen.generate_cached(2, GREEDY)) == 2


# ---- stories260K: the trained model's expected ids under every policy ---------------------------

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K"
STORIES_HF = STORIES / "hf"
STORIES_EXPECTED = STORIES / "expected" / "greedy_once_upon_a_time.json"

STORIES_POLICIES = {
    "oneshot": {},
    "lru": dict(prefill=("lru", 4)),
    "bucketed": dict(decode=("bucketed", 128)),
    "lru+bucketed": dict(prefill=("lru", 4), decode=("bucketed", 128)),
    "dynamic": dict(prefill=("dynamic",), decode=("dynamic",)),
    "dynamic+seq_cap": dict(prefill=("dynamic",), decode=("dynamic",), seq_cap=128),
    "dynamic_prefill+bucketed": dict(prefill=("dynamic",), decode=("bucketed", 128)),
}


@pytest.mark.skipif(not (STORIES_HF / "model.safetensors").is_file() or not STORIES_EXPECTED.is_file(),
                    reason=f"stories260K not found under {STORIES}")
@pytest.mark.parametrize("policy", list(STORIES_POLICIES))
def test_stories260k_expected_ids(policy):
    exp = json.loads(STORIES_EXPECTED.read_text(encoding="utf-8"))
    prompt, want = exp["prompt_tokens"], exp["new_tokens"]
    assert len(want) == 64
    gen = _gen(str(STORIES_HF), **STORIES_POLICIES[policy])
    gen.prefill(prompt)
    assert gen.generate_cached(64, GREEDY) == want
    st = gen.compile_stats()
    decode = STORIES_POLICIES[policy].get("decode")
    expect_decode = {None: 63, ("dynamic",): 1, ("bucketed", 128): 5}[decode]  # pasts 5..67: 8, 16, 32, 64, 128
    assert st["decode_compiles"] == expect_decode
    # a second utterance reuses what the policy keeps, and still gives the ids
    gen.prefill(prompt)
    assert gen.generate_cached(64, GREEDY) == want
    # the naive path goes through prefill-kind plans under the same policy
    gen.prefill(prompt)
    assert gen.generate(64, GREEDY) == want
