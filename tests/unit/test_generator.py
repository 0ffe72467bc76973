"""The seed runtime's generator suite on tiny random Llama and Qwen3 models built in memory.

Oracles: rlx.reference (the NumPy decoder and ops) for logits and the KV cache, the naive path
for the cached one, a second generator for determinism, a NumPy rendering of the documented
sampling pipeline (checked against transformers' logits warpers when transformers is installed)
for the top-k / top-p / min-p sets, and transformers' RepetitionPenaltyLogitsProcessor for the
repetition penalty.
"""

from __future__ import annotations

import functools
import gc
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import rlx
from rlx.reference import forward as ref_forward
from rlx.reference import ops
from rlx.weights import expected_weights

FAMILIES = ["llama", "qwen3"]
KV = rlx.generator.DEFAULT_KV_DTYPE  # the generators here use the default KV cache dtype

CONFIGS = {
    "llama": rlx.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             rms_norm_eps=1e-5, bos_token_id=1, eos_token_ids=2),
    "qwen3": rlx.Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                             rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, attention_bias=True),
}
PROMPT = [1, 17, 5, 42, 8, 33]


def random_weights(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    """A fresh dict of float32 C-contiguous arrays for every tensor cfg needs."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_weights(cfg).items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith("embed_tokens.weight"):
            a = 0.5 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = a.astype(np.float32)
    return out


@functools.lru_cache(maxsize=None)
def _cached_weights(family: str) -> dict[str, np.ndarray]:
    w = random_weights(CONFIGS[family])
    for a in w.values():
        a.flags.writeable = False  # shared between tests: nobody may edit them
    return w


def make(family: str = "llama", device: str = "cpu", weights: dict | None = None) -> rlx.Generator:
    cfg = CONFIGS[family]
    return rlx.Generator(cfg, _cached_weights(family) if weights is None else weights, device=device)


def greedy_fresh(family: str, history: list[int], device: str = "cpu") -> int:
    """The greedy next token after history from a brand-new generator."""
    gen = make(family, device)
    gen.prefill(history)
    return gen.step_cached(rlx.SampleOpts.greedy())


# ---- construction, one step, zero-copy ----------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_from_dict_one_step_matches_reference(family, device):
    cfg, w = CONFIGS[family], _cached_weights(family)
    gen = make(family, device)
    assert gen.config is cfg and gen.device == device and gen.tokens == []
    gen.prefill(PROMPT)
    assert gen.tokens == PROMPT and gen.kv_len == 0
    tok = gen.step()
    want = ref_forward(cfg, w, PROMPT, KV)[-1]
    assert tok == int(np.argmax(want))
    assert gen.tokens == PROMPT + [tok]
    logits = gen.prefill_get_last_logits(PROMPT)
    assert logits.shape == (cfg.vocab_size,) and logits.dtype == np.float32
    assert np.abs(logits - want).max() < 1e-4
    assert "layers=2" in repr(gen)


LONG = rlx.Qwen3Config(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                      rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False)


@pytest.mark.parametrize("kv_dtype", ["f16", "bf16"])
def test_long_prompt_matches_reference(kv_dtype):
    """A 600-token prompt against the NumPy reference, to the short prompt's bound: its flash
    attention (S x T = 360000) takes, where the CPU has AMX-BF16, the bf16 tiles with every operand
    split into hi + lo (csrc/backends/cpu/attention_amx.c; head_dim 64 and an f16 / bf16 cache),
    elsewhere the f32 items."""
    w = random_weights(LONG, seed=5)
    ids = [int(t) for t in np.random.default_rng(6).integers(0, LONG.vocab_size, 600)]
    gen = rlx.Generator(LONG, w, device="cpu", kv_dtype=kv_dtype)
    got = gen.prefill_get_last_logits(ids)
    want = ref_forward(LONG, w, ids, kv_dtype)[-1]
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()


def test_f32_weights_are_used_in_place():
    """Zero-copy: the C generator reads the caller's float32 arrays, so an in-place edit after
    construction changes the logits (on both the prefill and the decode plans)."""
    cfg = CONFIGS["llama"]
    w = random_weights(cfg, seed=3)
    gen = rlx.Generator(cfg, w, device="cpu")
    before = gen.prefill_get_last_logits(PROMPT)
    gen.prefill(PROMPT)
    naive_before = gen._c.logits(cached=False)

    w["model.norm.weight"] *= 2.0  # in place: the final norm scales the logits by exactly 2
    after = gen.prefill_get_last_logits(PROMPT)
    np.testing.assert_allclose(after, 2.0 * before, rtol=1e-6, atol=1e-6)
    gen.prefill(PROMPT)
    np.testing.assert_allclose(gen._c.logits(cached=False), 2.0 * naive_before, rtol=1e-6, atol=1e-6)

    w["model.embed_tokens.weight"][PROMPT[-1]] += 0.5  # the last token's embedding row
    after2 = gen.prefill_get_last_logits(PROMPT)
    want = ref_forward(cfg, w, PROMPT, KV)[-1]
    assert np.abs(after2 - after).max() > 1e-2
    assert np.abs(after2 - want).max() < 1e-4
    tok = int(np.argmax(after2))
    w["lm_head.weight"][tok] = 0.0  # a decode step sees the edit too
    dec = gen.decode_get_logits(tok)
    assert np.abs(dec - ref_forward(cfg, w, PROMPT + [tok], KV)[-1]).max() < 1e-4


def test_generator_keeps_its_weights_alive():
    cfg = CONFIGS["llama"]
    w = random_weights(cfg, seed=4)
    want = ref_forward(cfg, w, PROMPT, KV)[-1]
    gen = rlx.Generator(cfg, w)
    del w
    gc.collect()
    junk = [np.full(1000, 7.0, np.float32) for _ in range(200)]  # reuse any freed memory
    assert np.abs(gen.prefill_get_last_logits(PROMPT) - want).max() < 1e-4
    del junk


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sanitized() -> bool:
    return os.environ.get("RLX_ASAN") == "1" or "-fsanitize" in str(rlx.build_info().get("cflags", ""))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
@pytest.mark.skipif(_sanitized(), reason="RSS is meaningless under ASan (shadow memory, quarantine)")
def test_no_second_copy_of_weights():
    """Constructing from ~45 MB of float32 arrays and running naive and cached steps grows the
    resident set by far less than the weights (a copy would add their whole size)."""
    cfg = rlx.LlamaConfig(vocab_size=16384, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal(s, dtype=np.float32) * np.float32(0.05) for n, s in expected_weights(cfg).items()}
    nbytes = sum(a.nbytes for a in w.values())
    assert nbytes > 40e6
    r0 = _rss()
    gen = rlx.Generator(cfg, w, device="cpu")
    gen.prefill([1, 2, 3])
    gen.step()
    gen.generate_cached(3)
    gen.decode_get_logits(7)
    grown = _rss() - r0
    assert grown < 0.1 * nbytes, f"RSS grew by {grown / 1e6:.1f} MB for {nbytes / 1e6:.1f} MB of weights"


def test_prefill_kv_rows_take_no_arena_space():
    """A cached prefill's K/V rows are written by the plan straight into the cache (its state):
    the plan's arena of intermediates stays far below their size (when they were outputs copied
    afterwards, every layer's rows were alive at the end of the run, all in the arena). The cache
    still equals the NumPy reference."""
    cfg = rlx.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=16,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    w = random_weights(cfg)
    gen = rlx.Generator(cfg, w, device="cpu")
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 64, 100)]
    gen.prefill_get_last_logits(ids)
    kv_bytes = cfg.num_hidden_layers * 2 * len(ids) * cfg.num_key_value_heads * cfg.head_dim * 4
    planned = gen.compile_stats()["planned_bytes"]
    assert 0 < planned < kv_bytes / 4, (planned, kv_bytes)
    k_ref, v_ref = _layer0_kv(cfg, w, ids)
    _close_kv(gen.kv_cache(0)[0], k_ref)
    _close_kv(gen.kv_cache(0)[1], v_ref)


# ---- generate, errors before prefill, cached == naive, invariants --------------------------------

def test_generate_appends_n(device):
    gen = make("llama", device)
    gen.prefill(PROMPT)
    out = gen.generate(5)
    assert len(out) == 5 and gen.tokens == PROMPT + out
    more = gen.generate_cached(3, rlx.SampleOpts.greedy())
    assert len(more) == 3 and gen.tokens == PROMPT + out + more
    assert gen.generate(0) == [] and gen.generate_cached(0) == []
    assert gen.tokens == PROMPT + out + more
    seen = []
    last = gen.generate_cached(4, on_token=seen.append)
    assert seen == last and gen.tokens[-4:] == last


def test_step_before_prefill_errors(device):
    gen = make("llama", device)
    calls = [gen.step, gen.step_cached, lambda: gen.generate(1), lambda: gen.generate_cached(1),
             lambda: gen.step_cached_adjust(None, 0, lambda row: None), lambda: gen.decode_get_logits(3)]
    for call in calls:
        with pytest.raises(rlx.Error, match="prefill"):
            call()
        assert gen.tokens == [] and gen.kv_len == 0
    assert issubclass(rlx.Error, RuntimeError)
    gen.prefill(PROMPT)  # and then it works
    assert gen.step_cached() == greedy_fresh("llama", PROMPT, device)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_equals_naive_greedy(family, device):
    gen = make(family, device)
    gen.prefill(PROMPT)
    naive = gen.generate(20, rlx.SampleOpts.greedy())
    gen.prefill(PROMPT)
    cached = gen.generate_cached(20, rlx.SampleOpts.greedy())
    gen.prefill(PROMPT)
    stepped = [gen.step_cached() for _ in range(20)]
    assert naive == cached == stepped
    # and the cached logits equal the naive ones at every step
    gen.prefill(PROMPT)
    for tok in naive[:6]:
        cached_row = gen._c.logits(cached=True)
        naive_row = gen._c.logits(cached=False)
        assert np.abs(cached_row - naive_row).max() < 1e-4
        gen._c.append(tok)


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_invariants(family):
    gen = make(family)
    gen.prefill(PROMPT)
    assert gen.kv_len == 0
    for _ in range(4):
        gen.step_cached()
        assert gen.kv_len == len(gen.tokens) - 1
    gen.generate_cached(3)
    assert gen.kv_len == len(gen.tokens) - 1
    gen.decode_get_logits(9)
    assert gen.kv_len == len(gen.tokens)
    gen.step_cached()
    assert gen.kv_len == len(gen.tokens) - 1
    gen.prefill_get_last_logits(PROMPT[:3])
    assert gen.tokens == PROMPT[:3] and gen.kv_len == 3
    gen.decode_get_logits(4)
    assert gen.tokens == PROMPT[:3] + [4] and gen.kv_len == 4
    gen.prefill(PROMPT)  # clears the cache
    assert gen.kv_len == 0 and gen.kv_cache(0)[0].shape[0] == 0


def _layer0_kv(cfg, w, ids, kv=KV):
    """K (after q/k norm and RoPE) and V of layer 0 for ids, by rlx.reference.ops, rounded to the
    KV cache's dtype as the cache stores them."""
    S, D, Hkv = len(ids), cfg.head_dim, cfg.num_key_value_heads
    p = "model.layers.0."
    x = ops.embedding(w["model.embed_tokens.weight"], np.asarray(ids))
    h = ops.rmsnorm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)

    def lin(name):
        y = ops.matmul(h, w[p + name + ".weight"], trans_b=True)
        return (y if p + name + ".bias" not in w else ops.add(y, w[p + name + ".bias"])).reshape(S, Hkv, D)

    k, v = lin("self_attn.k_proj"), lin("self_attn.v_proj")
    if cfg.qk_norm:
        k = ops.rmsnorm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
    return ops.convert(ops.rope(k, np.arange(S, dtype=np.int32), cfg.rope_inv_freq()), kv), ops.convert(v, kv)


def _close_kv(got, want):
    """Cached rows equal the reference's rounded rows, up to the one rounding step where the two
    f32 values before rounding straddle a rounding boundary (one unit in the last place)."""
    g, w_ = got.astype(np.float32), want.astype(np.float32)
    step = 2.0 ** -10 if want.dtype == np.float16 else 2.0 ** -7 if want.dtype.itemsize == 2 else 2.0 ** -23
    ulp = np.abs(w_) * step
    assert np.all(np.abs(g - w_) <= ulp + 1e-5), np.abs(g - w_).max()


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cache_copies(family, device):
    cfg, w = CONFIGS[family], _cached_weights(family)
    gen = make(family, device)
    gen.prefill(PROMPT)
    gen.generate_cached(10)
    hist = gen.tokens
    n = gen.kv_len
    assert n == len(hist) - 1
    copies = [gen.kv_cache(layer) for layer in range(cfg.num_hidden_layers)]
    want_dtype = rlx.dtypes.DTYPES[KV].numpy
    for k, v in copies:
        for a in (k, v):
            assert a.shape == (n, cfg.num_key_value_heads, cfg.head_dim) and a.dtype == want_dtype
    with pytest.raises(IndexError):
        gen.kv_cache(cfg.num_hidden_layers)

    # layer 0 against the NumPy reference
    k_ref, v_ref = _layer0_kv(cfg, w, hist[:-1])
    _close_kv(copies[0][0], k_ref)
    _close_kv(copies[0][1], v_ref)

    # every layer: the cache filled step by step equals a fresh one-shot prefill of the same tokens
    fresh = make(family, device)
    fresh.prefill_get_last_logits(hist[:-1])
    assert fresh.kv_len == n
    for layer, (k, v) in enumerate(copies):
        fk, fv = fresh.kv_cache(layer)
        _close_kv(k, fk)
        _close_kv(v, fv)

    # copies are snapshots: later steps or a new prefill never change them
    snapshot = [(k.copy(), v.copy()) for k, v in copies]
    gen.generate_cached(5)
    assert gen.kv_len == n + 5
    np.testing.assert_array_equal(gen.kv_cache(0)[0][:n], snapshot[0][0])
    gen.prefill([3, 4])
    gen.step_cached()
    for (k, v), (k0, v0) in zip(copies, snapshot):
        np.testing.assert_array_equal(k, k0)
        np.testing.assert_array_equal(v, v0)


# ---- determinism, the logits hook, seeded sampling -----------------------------------------------

def test_greedy_deterministic_across_generators(device):
    a = make("qwen3", device, weights=random_weights(CONFIGS["qwen3"], seed=5))
    b = make("qwen3", device, weights=random_weights(CONFIGS["qwen3"], seed=5))
    la, lb = a.prefill_get_last_logits(PROMPT), b.prefill_get_last_logits(PROMPT)
    np.testing.assert_array_equal(la, lb)
    a.prefill(PROMPT)
    b.prefill(PROMPT)
    assert a.generate_cached(16) == b.generate_cached(16)
    a.prefill(PROMPT)
    b.prefill(PROMPT)
    assert a.generate(8) == b.generate(8)


def test_adjust_hook_is_applied(device):
    gen = make("llama", device)
    want_row = make("llama", device).prefill_get_last_logits(PROMPT)
    gen.prefill(PROMPT)
    natural = int(np.argmax(want_row))
    forced = (natural + 7) % CONFIGS["llama"].vocab_size
    seen = []

    def only_forced(row):
        seen.append(row.copy())
        assert row.shape == want_row.shape and row.dtype == np.float32 and row.flags.writeable
        row[:] = -np.inf
        row[forced] = 0.0

    tok = gen.step_cached_adjust(rlx.SampleOpts.greedy(), len(gen.tokens), only_forced)
    assert tok == forced and gen.tokens == PROMPT + [forced]
    assert len(seen) == 1 and np.abs(seen[0] - want_row).max() < 1e-4
    assert gen.kv_len == len(gen.tokens) - 1
    # with sampling too
    tok = gen.step_cached_adjust(rlx.SampleOpts(temperature=1.0, seed=3), len(gen.tokens), only_forced)
    assert tok == forced
    # a no-op hook leaves the greedy choice; the result continues the cached history correctly
    tok = gen.step_cached_adjust(None, len(gen.tokens), lambda row: None)
    assert tok == greedy_fresh("llama", PROMPT + [forced, forced], device)
    # a hook that raises propagates and the generator stays usable
    hist = gen.tokens

    def boom(row):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        gen.step_cached_adjust(None, 0, boom)
    assert gen.tokens == hist
    assert gen.step_cached() == greedy_fresh("llama", hist, device)


def test_adjust_sample_index_is_the_draw_index():
    opts = rlx.SampleOpts(temperature=1.5, seed=11)
    a, b = make("llama"), make("llama")
    a.prefill(PROMPT)
    b.prefill(PROMPT)
    want = a.generate_cached(6, opts)
    got = [b.step_cached_adjust(opts, len(b.tokens), lambda row: None) for _ in range(6)]
    assert got == want


SAMPLED = rlx.SampleOpts(temperature=1.5, top_k=40, top_p=0.95, seed=1234)


@pytest.mark.parametrize("family", FAMILIES)
def test_seeded_sampling_reproducible_and_chunking_invariant(family, device):
    def run(chunks, opts=SAMPLED, cached=True):
        gen = make(family, device)
        gen.prefill(PROMPT)
        out = []
        for c in chunks:
            out += gen.generate_cached(c, opts) if cached else gen.generate(c, opts)
        assert gen.tokens == PROMPT + out
        return out

    ref = run([10])
    assert run([10]) == ref                       # same seed, same tokens
    assert run([2] * 5) == ref                    # however chunked
    assert run([3, 1, 6]) == ref
    assert run([10], cached=False) == ref         # naive draws from the same stream
    gen = make(family, device)
    gen.prefill(PROMPT)
    assert [gen.step_cached(SAMPLED) for _ in range(10)] == ref  # step by step
    others = [run([10], rlx.SampleOpts(temperature=1.5, top_k=40, top_p=0.95, seed=s)) for s in (1, 2, 3)]
    assert all(o != ref for o in others)
    assert len({tuple(o) for o in others}) == 3   # different seeds differ
    assert ref != run([10], rlx.SampleOpts.greedy()) and len(set(ref)) > 1  # and it really sampled


# ---- top-k / top-p / min-p keep exactly the allowed set ----------------------------------------

V_S = CONFIGS["llama"].vocab_size
N_DRAWS = 2000
# chi-square critical values at p = 1e-3 by degrees of freedom (loose: the stream is fixed anyway)
CHI2_CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88,
             10: 29.59, 11: 31.26, 12: 32.91}


def _test_row() -> np.ndarray:
    """Logits over V_S ids, permuted, with known probabilities: six heads (0.30 0.20 0.15 0.10
    0.08 0.05) and a tail of 90 ids sharing 0.12."""
    head = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.05])
    p = np.concatenate([head, np.full(V_S - head.size, 0.12 / (V_S - head.size))])
    perm = np.random.default_rng(42).permutation(V_S)
    row = np.empty(V_S, np.float64)
    row[perm] = np.log(p) + 3.0
    return row.astype(np.float32)


def _allowed_probs(logits: np.ndarray, o: rlx.SampleOpts) -> np.ndarray:
    """The documented pipeline in NumPy: temperature, top_k, softmax, top_p (smallest most-likely
    set with mass >= top_p), min_p (p >= min_p * p_max), renormalise. Returns probabilities with
    zeros outside the allowed set; asserts no probability sits on a threshold."""
    x = logits.astype(np.float64) / o.temperature
    if o.top_k:
        kth = np.sort(x)[::-1][o.top_k - 1]
        assert np.sum(x == kth) == 1
        x = np.where(x >= kth, x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    if o.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        n_keep = int(np.searchsorted(cum, o.top_p) + 1)
        assert abs(cum[n_keep - 1] - o.top_p) > 1e-3 and (n_keep == 1 or abs(cum[n_keep - 2] - o.top_p) > 1e-3)
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:n_keep]] = True
        p = np.where(keep, p, 0.0)
    if o.min_p > 0.0:
        thr = o.min_p * p.max()
        assert np.all(np.abs(p[p > 0] - thr) > 1e-3 * thr)
        p = np.where(p >= thr, p, 0.0)
    return p / p.sum()


FILTERS = {
    "top_k3": rlx.SampleOpts(temperature=1.0, top_k=3, seed=7),
    "top_p0.7": rlx.SampleOpts(temperature=1.0, top_p=0.7, seed=7),
    "min_p0.2": rlx.SampleOpts(temperature=1.0, min_p=0.2, seed=7),
    "temp0.5_top_p0.9": rlx.SampleOpts(temperature=0.5, top_p=0.9, seed=8),
    "top_k5_top_p0.8": rlx.SampleOpts(temperature=1.0, top_k=5, top_p=0.8, seed=9),
    "temp2_top_k6_min_p0.5": rlx.SampleOpts(temperature=2.0, top_k=6, min_p=0.5, seed=10),
    "top_p0.85_min_p0.4": rlx.SampleOpts(temperature=1.0, top_p=0.85, min_p=0.4, seed=11),
}


def _draw(gen, row, opts, n=N_DRAWS) -> np.ndarray:
    return np.array([gen._c.sample(row, opts, i) for i in range(n)])


@pytest.mark.parametrize("name", list(FILTERS))
def test_filters_keep_exactly_the_allowed_set(name, device):
    opts = FILTERS[name]
    gen = make("llama", device)
    row = _test_row()
    want = _allowed_probs(row, opts)
    allowed = set(np.flatnonzero(want).tolist())
    assert 1 < len(allowed) < 10
    draws = _draw(gen, row, opts)
    assert set(draws.tolist()) == allowed
    ids = sorted(allowed)
    counts = np.array([np.sum(draws == i) for i in ids], dtype=np.float64)
    expect = N_DRAWS * want[ids]
    chi2 = float(np.sum((counts - expect) ** 2 / expect))
    assert chi2 < CHI2_CRIT[len(ids) - 1], f"{name}: chi2 {chi2:.2f}, counts {counts}, expected {expect.round(1)}"


def test_unfiltered_sampling_follows_softmax(device):
    """temperature 1 and 0.5 without filters: the six head ids and the tail (grouped) at their
    softmax frequencies; every draw is a valid id."""
    gen = make("llama", device)
    row = _test_row()
    for temp, seed in ((1.0, 21), (0.5, 22)):
        opts = rlx.SampleOpts(temperature=temp, seed=seed)
        p = _allowed_probs(row, opts)
        draws = _draw(gen, row, opts)
        assert draws.min() >= 0 and draws.max() < V_S
        head = np.argsort(-p, kind="stable")[:6]
        counts = [np.sum(draws == i) for i in head] + [np.sum(~np.isin(draws, head))]
        expect = N_DRAWS * np.append(p[head], 1.0 - p[head].sum())
        chi2 = float(np.sum((np.array(counts) - expect) ** 2 / expect))
        assert chi2 < CHI2_CRIT[6], f"T={temp}: chi2 {chi2:.2f}, counts {counts}, expected {expect.round(1)}"
        if temp == 1.0:
            assert counts[-1] > 150  # the tail is drawn when nothing filters it


def test_allowed_sets_agree_with_transformers_warpers():
    """The NumPy rendering of the pipeline used above keeps the same ids as transformers'
    Temperature -> TopK -> TopP -> MinP warpers (their default order)."""
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    row = _test_row()
    for name, o in FILTERS.items():
        warpers = [lp.TemperatureLogitsWarper(o.temperature)]
        if o.top_k:
            warpers.append(lp.TopKLogitsWarper(o.top_k))
        if o.top_p < 1.0:
            warpers.append(lp.TopPLogitsWarper(o.top_p))
        if o.min_p > 0.0:
            warpers.append(lp.MinPLogitsWarper(o.min_p))
        scores = torch.tensor(row[None, :])
        ids = torch.zeros((1, 1), dtype=torch.long)
        for wp in warpers:
            scores = wp(ids, scores)
        hf_allowed = set(torch.nonzero(torch.isfinite(scores[0])).flatten().tolist())
        assert hf_allowed == set(np.flatnonzero(_allowed_probs(row, o)).tolist()), name


def test_greedy_ties_pick_the_lowest_id():
    gen = make("llama")
    row = np.zeros(V_S, np.float32)
    row[[40, 7, 63]] = 5.0
    assert gen._c.sample(row, rlx.SampleOpts.greedy(), 0) == 7


# ---- repetition penalty against transformers ---------------------------------------------------

R_PENALTY = 1.6


def _hf_repetition(history, row, penalty):
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    proc = lp.RepetitionPenaltyLogitsProcessor(penalty)
    out = proc(torch.tensor([list(history)], dtype=torch.long), torch.tensor(row[None, :].copy()))
    return out[0].numpy()


def test_repetition_penalty_on_rows_matches_transformers():
    """Random rows (positive and negative logits) with a history that repeats ids: the greedy
    choice after the penalty is transformers' argmax, and the penalty changes it often."""
    gen = make("llama")
    rng = np.random.default_rng(0)
    changed = 0
    for trial in range(40):
        row = rng.standard_normal(V_S).astype(np.float32) * 2.0
        if trial % 2:
            row -= 4.0  # mostly negative logits: the penalty multiplies them
        top = np.argsort(-row)[:3].tolist()
        history = [int(x) for x in rng.integers(0, V_S, 5)] + top[: 1 + trial % 3] + top[:1]
        gen.prefill(history)
        want = int(np.argmax(_hf_repetition(history, row, R_PENALTY)))
        got = gen._c.sample(row, rlx.SampleOpts(repetition_penalty=R_PENALTY), 0)
        assert got == want, f"trial {trial}"
        changed += want != int(np.argmax(row))
    assert changed >= 20


def test_repetition_penalty_changes_greedy_like_transformers(device):
    gen = make("llama", device)
    gen.prefill(PROMPT)
    gen.generate_cached(12)
    history = gen.tokens
    row = make("llama", device).prefill_get_last_logits(history)
    want = int(np.argmax(_hf_repetition(history, row, R_PENALTY)))
    assert want != int(np.argmax(row)), "the penalty should matter for this history"
    opts = rlx.SampleOpts(repetition_penalty=R_PENALTY)
    gen.prefill(history)
    assert gen.step_cached(opts) == want
    gen.prefill(history)
    assert gen.step(opts) == want


# ---- bad input: clear exceptions, the generator stays usable -----------------------------------

def _assert_usable(gen, family="llama"):
    """After an error: a fresh prefill + step works and matches a brand-new generator."""
    gen.prefill(PROMPT)
    assert gen.step_cached() == greedy_fresh(family, PROMPT, gen.device)
    hist = gen.tokens
    assert gen.step() == greedy_fresh(family, hist, gen.device)


def test_bad_token_ids(device):
    gen = make("llama", device)
    V = CONFIGS["llama"].vocab_size
    gen.prefill(PROMPT)
    gen.step_cached()
    hist, kv = gen.tokens, gen.kv_len
    for bad in ([V], [-1], [1, 2, V + 5], [3, -7, 4]):
        with pytest.raises(ValueError, match="token id"):
            gen.prefill(bad)
        with pytest.raises(ValueError, match="token id"):
            gen.prefill_get_last_logits(bad)
        assert gen.tokens == hist and gen.kv_len == kv  # unchanged
    for bad in (V, -1):
        with pytest.raises(ValueError, match="token id"):
            gen.decode_get_logits(bad)
        assert gen.tokens == hist
    with pytest.raises(ValueError, match="empty"):
        gen.prefill([])
    with pytest.raises(ValueError, match="empty"):
        gen.prefill_get_last_logits([])
    assert gen.tokens == hist
    # the history is intact: the next cached step continues it like a fresh generator would
    assert gen.step_cached() == greedy_fresh("llama", hist, device)
    _assert_usable(gen)


def test_float_token_ids_are_refused():
    gen = make("llama")
    with pytest.raises((ValueError, TypeError)):
        gen.prefill([1.5, 2.0])


def test_growing_past_max_position_embeddings(device):
    cfg = CONFIGS["llama"]
    M = cfg.max_position_embeddings
    gen = make("llama", device)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        gen.prefill([3] * (M + 1))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        gen.prefill_get_last_logits([3] * (M + 1))
    _assert_usable(gen)

    ctx = [int(t) for t in np.random.default_rng(1).integers(0, cfg.vocab_size, M - 3)]
    gen.prefill(ctx)
    got = []
    with pytest.raises(ValueError, match="max_position_embeddings"):
        gen.generate_cached(10, on_token=got.append)
    assert len(got) == 3 and gen.tokens == ctx + got and len(gen.tokens) == M
    for call in (gen.step, gen.step_cached, lambda: gen.generate(1), lambda: gen.decode_get_logits(1)):
        with pytest.raises(ValueError, match="max_position_embeddings"):
            call()
        assert gen.tokens == ctx + got
    # the tokens generated up to the limit are the same as naive ones
    gen.prefill(ctx)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        gen.generate(10)
    assert gen.tokens == ctx + got
    # exactly M tokens of context is fine for logits
    row = gen.prefill_get_last_logits(ctx + got)
    assert row.shape == (cfg.vocab_size,) and gen.kv_len == M
    _assert_usable(gen)


def test_bad_sample_opts(device):
    gen = make("llama", device)
    gen.prefill(PROMPT)
    bad = [dict(top_p=1.5), dict(top_p=0.0), dict(temperature=-1.0), dict(temperature=float("nan")),
           dict(top_k=-1), dict(min_p=2.0), dict(min_p=-0.1), dict(repetition_penalty=0.0),
           dict(repetition_penalty=-1.0)]
    for kw in bad:
        for call in (gen.step, gen.step_cached, lambda o: gen.generate(2, o), lambda o: gen.generate_cached(2, o)):
            with pytest.raises(ValueError):
                call(rlx.SampleOpts(**kw))
            assert gen.tokens == PROMPT, kw
    with pytest.raises(ValueError):
        gen._c.sample(np.zeros(V_S, np.float32), rlx.SampleOpts(top_p=1.5), 0)
    with pytest.raises(ValueError):
        gen._c.sample(np.zeros(V_S - 1, np.float32), rlx.SampleOpts.greedy(), 0)
    with pytest.raises(ValueError):  # nothing finite to sample from
        gen.step_cached_adjust(None, 0, lambda row: row.fill(np.nan))
    with pytest.raises(ValueError, match="n must be"):
        gen.generate(-1)
    assert gen.tokens == PROMPT
    assert gen.step_cached() == greedy_fresh("llama", PROMPT, device)
    _assert_usable(gen)


def test_bad_weights_name_the_tensor():
    cfg = CONFIGS["qwen3"]
    w = dict(_cached_weights("qwen3"))
    missing = dict(w)
    del missing["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(rlx.WeightsError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
        rlx.Generator(cfg, missing)
    extra = dict(w, **{"model.layers.0.mlp.gate_proj.bias": np.zeros(48, np.float32)})
    with pytest.raises(rlx.WeightsError, match=r"model\.layers\.0\.mlp\.gate_proj\.bias"):
        rlx.Generator(cfg, extra)
    shaped = dict(w, **{"model.norm.weight": np.ones(31, np.float32)})
    with pytest.raises(rlx.WeightsError, match=r"model\.norm\.weight.*\(31,\).*\(32,\)"):
        rlx.Generator(cfg, shaped)
    with pytest.raises(ValueError, match="device"):
        rlx.Generator(cfg, w, device="no-such-device")
    with pytest.raises(TypeError):
        rlx.Generator(cfg.to_dict(), w)
    # other float dtypes are converted once, and give the same logits
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    a = rlx.Generator(cfg, w64).prefill_get_last_logits(PROMPT)
    b = rlx.Generator(cfg, w).prefill_get_last_logits(PROMPT)
    np.testing.assert_array_equal(a, b)


def _save_dir(path, family="llama"):
    cfg = CONFIGS[family]
    d = cfg.to_dict()
    d["eos_token_id"] = list(d.pop("eos_token_ids"))
    (path / "config.json").write_text(json.dumps(d))
    save_file(dict(_cached_weights(family)), str(path / "model.safetensors"))
    return d


def test_from_pretrained_round_trip(tmp_path, device):
    _save_dir(tmp_path)
    gen = rlx.Generator.from_pretrained(tmp_path, device=device)
    assert gen.config == CONFIGS["llama"]
    gen.prefill(PROMPT)
    other = make("llama", device)
    other.prefill(PROMPT)
    assert gen.generate_cached(8) == other.generate_cached(8)
    np.testing.assert_array_equal(gen.prefill_get_last_logits(PROMPT), other.prefill_get_last_logits(PROMPT))


def test_truncated_safetensors(tmp_path):
    _save_dir(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    for cut in (len(data) - 100, len(data) // 2, 200, 5):
        f.write_bytes(data[:cut])
        with pytest.raises(rlx.WeightsError, match="model.safetensors"):
            rlx.Generator.from_pretrained(tmp_path)
    f.write_bytes(b"")
    with pytest.raises(rlx.WeightsError):
        rlx.Generator.from_pretrained(tmp_path)


@pytest.mark.parametrize("change,field", [
    ({"hidden_size": "32"}, "hidden_size"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers"),
    ({"rms_norm_eps": "1e-5"}, "rms_norm_eps"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"vocab_size": None}, "vocab_size"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_config_with_wrong_type(tmp_path, change, field):
    d = _save_dir(tmp_path)
    d.update(change)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(rlx.ConfigError, match=field):
        rlx.Generator.from_pretrained(tmp_path)


# ---- profiling -------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "ref"])
def test_profile_times_the_ops_of_the_last_pass(device):
    """last_profile: seconds per op of the sequence's last forward pass, every op of the decoder
    there, none negative, their sum within the wall time around the call; a batched step's profile
    is every sequence's of the batch; off (or never run since on) it raises and names why."""
    import time

    gen = make("qwen3", device)
    with pytest.raises(rlx.Error, match="profiling is off"):
        gen.last_profile()
    gen.profile(True)
    with pytest.raises(rlx.Error, match="no forward pass since profiling was turned on"):
        gen.last_profile()
    gen.prefill(PROMPT)
    t0 = time.perf_counter()
    gen.step_cached(rlx.SampleOpts.greedy())
    wall = time.perf_counter() - t0
    prof = gen.last_profile()
    assert {"matmul", "attention", "rmsnorm", "rope", "embedding"} <= set(prof), prof
    assert all(v >= 0.0 for v in prof.values()) and 0.0 < sum(prof.values()) <= wall
    assert list(prof.values()) == sorted(prof.values(), reverse=True)  # largest first

    seqs = [gen.new_sequence() for _ in range(3)]
    for i, s in enumerate(seqs):
        s.prefill(PROMPT[: 3 + i])
    gen.step_batch(seqs, rlx.SampleOpts.greedy())
    batch = [s.last_profile() for s in seqs]
    assert batch[0] == batch[1] == batch[2] and "attention" in batch[0]
    assert gen.last_profile() == prof  # the generator's own sequence did not run in the batch

    gen.profile(False)
    gen.step_cached(rlx.SampleOpts.greedy())
    with pytest.raises(rlx.Error, match="profiling is off"):
        gen.last_profile()
