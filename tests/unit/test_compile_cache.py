"""rlx.CompileCache: the generator's plan policies (oneshot, lru, bucketed, dynamic) for user graphs.

The oracle is a plan freshly compiled for the exact shape with rlx.compile: every policy must give
the same outputs. The family is row-independent (each output row depends only on its input row:
matmul by a weight, residual add + RMSNorm, SiLU * gate), so zero-padding rows for a bucketed plan
cannot change the rows that matter; the test compares the first SEQ rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import rlx

D_IN, D_OUT = 16, 24


def build(dims: dict) -> rlx.Graph:
    """y = silu(rmsnorm(x @ W^T + b, g)) * (x @ U^T): x (SEQ, D_IN) -> y (SEQ, D_OUT)."""
    seq = dims["SEQ"]
    g = rlx.Graph()
    x = g.input("x", (seq, D_IN))
    w = g.param("w", (D_OUT, D_IN))
    u = g.param("u", (D_OUT, D_IN))
    b = g.param("b", (D_OUT,))
    gamma = g.param("gamma", (D_OUT,))
    h = g.add(g.matmul(x, w, transpose_b=True), b)
    n = g.rmsnorm(h, gamma, eps=1e-5)
    g.output(g.mul(g.silu(n), g.matmul(x, u, transpose_b=True)), "y")
    return g


@pytest.fixture(scope="module")
def params():
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((D_OUT, D_IN)).astype(np.float32) * 0.3,
        "u": rng.standard_normal((D_OUT, D_IN)).astype(np.float32) * 0.3,
        "b": rng.standard_normal(D_OUT).astype(np.float32) * 0.1,
        "gamma": (1.0 + 0.25 * rng.standard_normal(D_OUT)).astype(np.float32),
    }


def x_of(seq: int) -> np.ndarray:
    return np.random.default_rng(100 + seq).standard_normal((seq, D_IN)).astype(np.float32)


def exact(params, seq: int, device: str = "cpu") -> np.ndarray:
    """The oracle: a fresh plan compiled for exactly this SEQ."""
    plan = rlx.compile(build({"SEQ": seq}), device=device)
    for name, arr in params.items():
        plan.set_param(name, arr)
    (y,) = plan.run({"x": x_of(seq)})
    return y


def via_cache(cache: rlx.CompileCache, seq: int) -> np.ndarray:
    """Runs seq rows through the cache's plan, padding x to the bucket under the bucketed policy."""
    rows = cache.bucket(SEQ=seq)["SEQ"]
    x = np.zeros((rows, D_IN), np.float32)
    x[:seq] = x_of(seq)
    (y,) = cache.plan(SEQ=seq).run({"x": x})
    assert y.shape == (rows, D_OUT)
    return y[:seq]


SEQS = [1, 2, 3, 5, 8, 9, 17, 31, 32, 33, 64, 100, 3, 17, 1]


def make(params, policy: str, **kw) -> rlx.CompileCache:
    return rlx.CompileCache(build, policy=policy, params=params, **kw)


@pytest.mark.parametrize("policy,kw", [
    ("oneshot", {}),
    ("lru", {"capacity": 3}),
    ("bucketed", {"max_value": 128}),
    ("dynamic", {}),
    ("dynamic", {"caps": {"SEQ": 128}}),
])
def test_every_policy_equals_exact_plan(params, policy, kw):
    cache = make(params, policy, **kw)
    assert cache.policy == policy
    for seq in SEQS:
        got, want = via_cache(cache, seq), exact(params, seq)
        # the same kernels on the same rows: agreement to float rounding (BLAS may block a
        # padded matrix differently, so not asserted bit-exact)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{policy} SEQ={seq}")


def test_ref_device_dynamic_and_bucketed(params):
    for policy, kw in (("dynamic", {}), ("bucketed", {"max_value": 64})):
        cache = rlx.CompileCache(build, device="ref", policy=policy, params=params, **kw)
        for seq in (1, 3, 9, 33):
            np.testing.assert_allclose(via_cache(cache, seq), exact(params, seq, "ref"), rtol=1e-6, atol=1e-6)


# ---- compile counts -------------------------------------------------------------------------

def test_oneshot_recompiles_on_every_change(params):
    cache = make(params, "oneshot")
    for seq in (4, 4, 4):
        via_cache(cache, seq)
    assert (cache.compiles, cache.hits) == (1, 2)
    for seq in (5, 4, 5):
        via_cache(cache, seq)
    assert cache.compiles == 4  # each change of SEQ recompiles: one plan kept
    assert cache.stats()["plans_cached"] == 1


def test_lru_hits_within_capacity_and_evicts_beyond(params):
    cache = make(params, "lru", capacity=2)
    for seq in (4, 7, 4, 7, 4, 7):
        via_cache(cache, seq)
    assert (cache.compiles, cache.hits) == (2, 4)
    # three lengths cycling through capacity 2: the least recently used is always the one asked next
    cache = make(params, "lru", capacity=2)
    for seq in (3, 5, 9, 3, 5, 9):
        via_cache(cache, seq)
    assert (cache.compiles, cache.hits) == (6, 0)
    assert cache.stats()["plans_cached"] == 2
    # recency, not insertion order: touching 3 keeps it; 5 is evicted by 9
    cache = make(params, "lru", capacity=2)
    for seq in (3, 5, 3, 9, 3):
        via_cache(cache, seq)
    assert (cache.compiles, cache.hits) == (3, 2)
    via_cache(cache, 5)
    assert cache.compiles == 4


def test_bucketed_compiles_log_n(params):
    cache = make(params, "bucketed", max_value=256)
    n = 200
    for seq in range(1, n + 1):
        if seq % 7 == 0 or seq in (1, 2, 3, 4, 5, 100, 129, 200):  # spot-check values on the way
            np.testing.assert_allclose(via_cache(cache, seq), exact(params, seq), rtol=1e-6, atol=1e-6)
        else:
            cache.plan(SEQ=seq)
    # buckets 1, 2, 4, ..., 256: ceil(log2(200)) + 1 plans, all kept
    assert cache.compiles == math.ceil(math.log2(n)) + 1 == 9
    assert cache.stats()["plans_cached"] == cache.compiles
    assert cache.hits == n - cache.compiles


def test_bucketed_buckets_and_cap(params):
    cache = make(params, "bucketed", max_value=40)
    assert [cache.bucket(SEQ=v)["SEQ"] for v in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 40)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 32, 32, 40, 40]
    np.testing.assert_allclose(via_cache(cache, 40), exact(params, 40), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(via_cache(cache, 35), exact(params, 35), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"SEQ=41 exceeds max_value 40"):
        cache.plan(SEQ=41)
    with pytest.raises(ValueError, match="max_value"):
        cache.bucket(SEQ=1000)
    # still usable after the refusal
    np.testing.assert_allclose(via_cache(cache, 7), exact(params, 7), rtol=1e-6, atol=1e-6)
    # several dims are bucketed independently
    assert make(params, "bucketed").bucket(SEQ=5, BATCH=3) == {"SEQ": 8, "BATCH": 4}


def test_dynamic_compiles_once(params):
    cache = make(params, "dynamic", caps={"SEQ": 256})
    plan = cache.plan(SEQ=1)
    for seq in (1, 2, 77, 200, 256, 3):
        assert cache.plan(SEQ=seq) is plan
        np.testing.assert_allclose(via_cache(cache, seq), exact(params, seq), rtol=1e-6, atol=1e-6)
    assert cache.compiles == 1
    assert cache.stats()["plans_cached"] == 1
    # the build function saw the symbol, not a number
    seen = []
    rlx.CompileCache(lambda d: (seen.append(dict(d)), build(d))[1], policy="dynamic", params=params).plan(SEQ=5)
    assert seen == [{"SEQ": "SEQ"}]


def test_dynamic_cap_bounds_runs_and_memory(params):
    small = make(params, "dynamic", caps={"SEQ": 16})
    big = make(params, "dynamic", caps={"SEQ": 1024})
    via_cache(small, 16)
    with pytest.raises(ValueError, match=r"exceeds its compile cap 16"):
        via_cache(small, 17)
    np.testing.assert_allclose(via_cache(small, 5), exact(params, 5), rtol=1e-6, atol=1e-6)  # usable after
    assert 0 < small.plan(SEQ=1).planned_bytes < big.plan(SEQ=1).planned_bytes


def test_clear_and_stats(params):
    cache = make(params, "lru", capacity=4)
    for seq in (2, 3, 2):
        via_cache(cache, seq)
    st = cache.stats()
    assert st["policy"] == "lru" and st["compiles"] == 2 and st["hits"] == 1 and st["plans_cached"] == 2
    assert st["compile_seconds"] > 0
    cache.clear()
    assert cache.stats()["plans_cached"] == 0
    via_cache(cache, 2)
    assert cache.compiles == 3


# ---- argument checks -----------------------------------------------------------------------

@pytest.mark.parametrize("kw,match", [
    ({"policy": "bucket"}, "unknown policy"),
    ({"policy": "LRU"}, "unknown policy"),
    ({"policy": "lru", "capacity": 0}, "capacity"),
    ({"policy": "lru", "capacity": -3}, "capacity"),
    ({"policy": "lru", "capacity": 2.5}, "capacity"),
    ({"policy": "bucketed", "max_value": 0}, "max_value"),
    ({"policy": "bucketed", "max_value": "64"}, "max_value"),
])
def test_invalid_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        rlx.CompileCache(build, **kw)


@pytest.mark.parametrize("policy", ["oneshot", "lru", "bucketed", "dynamic"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, "8"])
def test_invalid_dim_values(params, policy, bad):
    with pytest.raises(ValueError, match="SEQ"):
        make(params, policy).plan(SEQ=bad)
