"""Every op on Vulkan against the CPU backend (the ref backend for block-type weights, which the
cpu backend refuses, and the exact dequantised values), on odd sizes that hit every tail: matvec
(M <= 8) and tiled GEMM paths of matmul for every weight dtype, embedding bit for bit, norms,
RoPE in both layouts, softmax, the elementwise and fused ops, convert bit for bit, the copy ops on
several dtypes, attention (causal prefill, decode over a past, GQA, windows, masks, 16-bit K/V,
a head-dim bisect, positions spanning several chunks), and the same through the staging path and
with bindings limited to 4 KiB (so big weights, rows and tables are split). Tolerances: 1e-5
relative to the magnitudes involved for f32 paths; the worst difference of each check is
recorded (vkutil.PARITY) and printed at the end.
"""

from __future__ import annotations

import numpy as np
import pytest
from vkutil import BLOCK_TYPES, FLOAT_TYPES, block_weight, randn, record, run

import rlx
from rlx.reference import ops as ref

VK = "vulkan"
# matmul shapes (M, K, N): matvec for M <= 8, GEMM above; every dim odd or past a tile edge
SHAPES = [(1, 37, 75), (3, 100, 37), (8, 64, 129), (9, 75, 37), (37, 100, 75), (70, 130, 65)]


def cast(a: np.ndarray, dtype: str) -> np.ndarray:
    """f32 values as an array of dtype (bf16 as rlx.dtypes gives it)."""
    return a.astype(rlx.dtypes.DTYPES[dtype].numpy) if dtype != "bf16" else ref.convert(a, "bf16")


def matmul_graph(m, k, n, wdtype="f32", trans=True):
    g = rlx.Graph()
    x = g.input("a", (m, k))
    w = g.param("w", (n, k) if trans else (k, n), wdtype)
    g.output(g.matmul(x, w, transpose_b=trans), "y")
    return g


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matmul_float_weights(dtype, m, k, n):
    r = np.random.default_rng(m * 7 + k + n)
    a, w = randn(r, m, k), cast(randn(r, n, k), dtype)
    (got,) = run(matmul_graph(m, k, n, dtype), VK, {"a": a}, {"w": w})
    (want,) = run(matmul_graph(m, k, n, dtype), "cpu", {"a": a}, {"w": w})
    path = "matvec" if m <= 8 else "gemm"
    assert record(f"matmul {dtype} weights ({path})", got, want) <= 1e-5 * np.abs(want).max() + 1e-6


@pytest.mark.parametrize("m,k,n", SHAPES[::2])
def test_matmul_f32_stored_k_by_n(m, k, n):
    r = np.random.default_rng(m + k + n)
    a, w = randn(r, m, k), randn(r, k, n)
    (got,) = run(matmul_graph(m, k, n, trans=False), VK, {"a": a}, {"w": w})
    (want,) = run(matmul_graph(m, k, n, trans=False), "cpu", {"a": a}, {"w": w})
    assert record("matmul f32 (K, N) weights", got, want) <= 1e-5 * np.abs(want).max() + 1e-6


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("m", [1, 5, 19])
def test_matmul_block_weights(name, m):
    """Dequantised in the shader: equal to the exact a times the exact dequantised W (ref: double)."""
    r = np.random.default_rng(BLOCK_TYPES.index(name) * 10 + m)
    k = 512 if name.endswith("_k") else 96
    n = 37
    packed, values = block_weight(name, n, k, r)
    a = randn(r, m, k)
    (got,) = run(matmul_graph(m, k, n, name), VK, {"a": a}, {"w": packed})
    (want,) = run(matmul_graph(m, k, n, name), "ref", {"a": a}, {"w": packed})
    np.testing.assert_allclose(want, a.astype(np.float64) @ values.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    path = "matvec" if m <= 8 else "gemm"
    assert record(f"matmul {name} weights ({path}) vs ref, relative", got, want, relative=True) <= 1e-5


def embedding_graph(v, d, n, dtype):
    g = rlx.Graph()
    ids = g.input("ids", (n,), "i32")
    g.output(g.embedding(g.param("t", (v, d), dtype), ids), "e")
    return g


@pytest.mark.parametrize("dtype", FLOAT_TYPES + BLOCK_TYPES)
def test_embedding_is_exact(dtype):
    r = np.random.default_rng(3)
    v, n = 41, 13
    d = 256 if dtype.endswith("_k") else 64 if dtype in BLOCK_TYPES else 37
    if dtype in BLOCK_TYPES:
        table, values = block_weight(dtype, v, d, r)
    else:
        table = cast(randn(r, v, d), dtype)
        values = table.astype(np.float32)
    ids = r.integers(0, v, n).astype(np.int32)
    (got,) = run(embedding_graph(v, d, n, dtype), VK, {"ids": ids}, {"t": table})
    assert record(f"embedding {dtype} (exact)", got, values[ids]) == 0.0


def test_embedding_id_out_of_range_then_usable():
    r = np.random.default_rng(4)
    table = randn(r, 11, 8)
    plan = rlx.compile(embedding_graph(11, 8, 3, "f32"), device=VK)
    plan.set_param("t", table)
    with pytest.raises(ValueError, match=r"node \d+ \(embedding\): token id 11 at position 2 is outside \[0, 11\)"):
        plan.run({"ids": np.array([1, 2, 11], np.int32)})
    with pytest.raises(ValueError, match="token id -1 at position 0"):
        plan.run({"ids": np.array([-1, 2, 3], np.int32)})
    (e,) = plan.run({"ids": np.array([4, 0, 10], np.int32)})
    assert np.array_equal(e, table[[4, 0, 10]])


def on_both(build, inputs, params=None, fuse=True):
    (got, *more_got) = run(build(), VK, inputs, params, fuse)
    (want, *more_want) = run(build(), "cpu", inputs, params, fuse)
    return [got, *more_got], [want, *more_want]


@pytest.mark.parametrize("shape", [(1, 37), (5, 130), (3, 4, 1000)])
def test_rmsnorm(shape):
    r = np.random.default_rng(5)
    x, w = randn(r, *shape), randn(r, shape[-1])

    def build():
        g = rlx.Graph()
        g.output(g.rmsnorm(g.input("x", shape), g.param("w", (shape[-1],)), eps=1e-5), "y")
        return g

    got, want = on_both(build, {"x": x}, {"w": w})
    assert record("rmsnorm", got[0], want[0]) <= 2e-6 * np.abs(want[0]).max()


def test_add_rmsnorm_fused_writes_both_outputs():
    r = np.random.default_rng(6)
    a, b, w = randn(r, 7, 75), randn(r, 7, 75), randn(r, 75)

    def build():
        g = rlx.Graph()
        s = g.add(g.input("a", (7, 75)), g.input("b", (7, 75)))
        g.output(g.rmsnorm(s, g.param("w", (75,))), "norm")
        g.output(g.matmul(s, g.param("w2", (75, 3))), "use_of_sum")   # the sum is read afterwards too
        return g

    w2 = randn(r, 75, 3)
    plan = rlx.compile(build(), device=VK)
    assert "add_rmsnorm" in plan.graph_dump()
    got, want = on_both(build, {"a": a, "b": b}, {"w": w, "w2": w2})
    assert record("add_rmsnorm (fused)", got[0], want[0]) <= 2e-6 * np.abs(want[0]).max()
    assert record("add_rmsnorm's sum, read by a matmul", got[1], want[1]) <= 1e-5 * np.abs(want[1]).max()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("s,h,d", [(1, 3, 8), (7, 5, 64), (13, 2, 80)])
def test_rope(interleaved, s, h, d):
    r = np.random.default_rng(s + h + d)
    x = randn(r, s, h, d)
    pos = r.integers(0, 5000, s).astype(np.int32)   # large angles: the shader's own sin / cos
    inv = (1.0 / (10000.0 ** (np.arange(0, d, 2) / d))).astype(np.float32)

    def build():
        g = rlx.Graph()
        y = g.rope(g.input("x", (s, h, d)), g.input("pos", (s,), "i32"), g.param("f", (d // 2,)), interleaved)
        g.output(y, "y")
        return g

    got, want = on_both(build, {"x": x, "pos": pos}, {"f": inv})
    assert record("rope (positions < 5000)", got[0], want[0]) <= 2e-6 * np.abs(x).max()


@pytest.mark.parametrize("shape", [(1, 1), (3, 37), (2, 2000)])
def test_softmax(shape):
    r = np.random.default_rng(7)
    x = randn(r, *shape, scale=8.0)

    def build():
        g = rlx.Graph()
        g.output(g.softmax(g.input("x", shape)), "y")
        return g

    got, want = on_both(build, {"x": x})
    assert record("softmax", got[0], want[0]) <= 1e-6


@pytest.mark.parametrize("op", ["silu", "silu_mul", "add", "mul"])
def test_elementwise(op):
    r = np.random.default_rng(8)
    a = randn(r, 3, 5, 37, scale=4.0)
    b = randn(r, 3, 5, 37) if op == "silu_mul" else randn(r, 5, 37)  # add / mul broadcast a suffix

    def build():
        g = rlx.Graph()
        x = g.input("a", a.shape)
        y = g.input("b", b.shape)
        if op == "silu":
            out = g.silu(x)
        elif op == "silu_mul":
            out = g.mul(g.silu(x), y)   # fused into silu_mul
        else:
            out = getattr(g, op)(x, y)
        g.output(out, "y")
        return g

    if op == "silu_mul":
        assert "silu_mul" in rlx.compile(build(), device=VK).graph_dump()
    got, want = on_both(build, {"a": a, "b": b})
    assert record(op, got[0], want[0]) <= 2e-6 * np.abs(want[0]).max()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_convert_bit_exact(dtype):
    r = np.random.default_rng(9)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-8, 6e-8, 3e-5, 1.0 + 2 ** -11,
                        1.0 + 3 * 2 ** -11, 3.4e38, -1e-40, 2 ** -24, 1.5 * 2 ** -24], np.float32)
    x = np.concatenate([special, randn(r, 333, scale=100.0), randn(r, 50, scale=1e-6)])

    def build():
        g = rlx.Graph()
        g.output(g.convert(g.input("x", x.shape), dtype), "y")
        return g

    got, want = on_both(build, {"x": x})
    assert got[0].tobytes() == want[0].tobytes()


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32", "u8"])
def test_copy_ops(dtype):
    r = np.random.default_rng(10)
    np_dt = rlx.dtypes.DTYPES[dtype].numpy
    a = (r.standard_normal((5, 3, 7)) * 50).astype(np_dt)
    b = (r.standard_normal((5, 2, 7)) * 50).astype(np_dt)

    def build():
        g = rlx.Graph()
        x, y = g.input("a", a.shape, dtype), g.input("b", b.shape, dtype)
        g.output(g.gather_last(x), "last")
        g.output(g.concat(x, y, axis=1), "cat")
        g.output(g.slice(x, axis=2, start=-5, length=3), "sl")
        g.output(g.slice(x, axis=0, start=1, length=3), "rows")
        return g

    got, want = on_both(build, {"a": a, "b": b})
    for gv, wv in zip(got, want):
        assert gv.tobytes() == wv.tobytes()


# ---- attention ------------------------------------------------------------------------------

def attention_case(S, P, Hq, Hkv, D, causal=True, window=0, mask=None, kv="f32", seed=11, scale=None):
    r = np.random.default_rng(seed)
    T = P + S
    q = randn(r, S, Hq, D)
    k, v = ref.convert(randn(r, T, Hkv, D), kv), ref.convert(randn(r, T, Hkv, D), kv)
    inputs = {"q": q, "k": k, "v": v}
    if mask is not None:
        inputs["mask"] = mask

    def build():
        g = rlx.Graph()
        qv, kv_, vv = g.input("q", (S, Hq, D)), g.input("k", (T, Hkv, D), kv), g.input("v", (T, Hkv, D), kv)
        mv = None if mask is None else g.input("mask", mask.shape, "f32" if mask.dtype == np.float32 else "u8")
        g.output(g.attention(qv, kv_, vv, mv, scale=scale, causal=causal, window=window), "o")
        return g

    got, want = on_both(build, inputs)
    return got[0], want[0]


@pytest.mark.parametrize("S,P", [(13, 0), (1, 36), (4, 9), (1, 300), (3, 260)])
def test_attention_prefill_and_decode(S, P):
    got, want = attention_case(S, P, 4, 2, 32)
    assert record("attention f32 (prefill / decode / long past)", got, want) <= 2e-6


@pytest.mark.parametrize("group", [1, 2, 4])
def test_attention_gqa(group):
    got, want = attention_case(5, 3, 2 * group, 2, 16)
    assert record("attention GQA", got, want) <= 2e-6


@pytest.mark.parametrize("D", [64, 80, 96, 128, 17, 256])
def test_attention_head_dim_bisect(D):
    got, want = attention_case(3, 20, 4, 2, D, seed=D)
    assert record(f"attention head_dim {D}", got, want) <= 2e-6


@pytest.mark.parametrize("window", [1, 4, 7])
def test_attention_window(window):
    got, want = attention_case(6, 9, 4, 2, 8, window=window)
    assert record("attention sliding window", got, want) <= 2e-6


@pytest.mark.parametrize("kv", ["f16", "bf16"])
def test_attention_16_bit_kv(kv):
    got, want = attention_case(9, 31, 4, 2, 64, kv=kv, window=5)
    assert record(f"attention {kv} K/V", got, want) <= 2e-6


def test_attention_masks_and_a_fully_masked_row():
    S, P = 4, 6
    T = S + P
    r = np.random.default_rng(12)
    fmask = np.where(r.random((S, T)) < 0.3, -np.inf, r.standard_normal((S, T))).astype(np.float32)
    fmask[2] = -np.inf                                   # a row that sees nothing: zeros
    got, want = attention_case(S, P, 4, 2, 8, causal=False, mask=fmask)
    assert np.all(got[2] == 0.0)
    assert record("attention f32 additive mask", got, want) <= 2e-6
    umask = (r.random((S, T)) < 0.6).astype(np.uint8)
    got, want = attention_case(S, P, 4, 4, 8, causal=True, mask=umask)
    assert record("attention u8 mask", got, want) <= 2e-6


def test_attention_head_dim_above_512_refused_at_compile():
    g = rlx.Graph()
    q, k = g.input("q", (1, 1, 520)), g.input("k", (4, 1, 520))
    g.output(g.attention(q, k, k), "o")
    with pytest.raises(rlx.Error, match=r"device 'vulkan' does not support node \d+ \(attention"):
        rlx.compile(g, device=VK)


# ---- staging, and bindings split to fit ------------------------------------------------------

@pytest.mark.parametrize("device", ["vulkan:staging", "vulkan:range=4096", "vulkan:staging,range=4096"])
def test_weights_rows_and_tables_split_or_staged(device):
    """Matmul W (75 rows x 400 B), a (37 rows), out and an embedding table all exceed 4 KiB: each is
    bound in pieces; with staging every byte crosses through the staging buffer."""
    r = np.random.default_rng(13)
    cases = [((37, 100, 75), "f32"), ((3, 100, 75), "bf16"), ((1, 512, 75), "q4_k"), ((19, 96, 75), "q8_0")]
    for (m, k, n), wdt in cases:
        a = randn(r, m, k)
        if wdt in BLOCK_TYPES:
            w, _ = block_weight(wdt, n, k, r)
            oracle = "ref"
        else:
            w, oracle = cast(randn(r, n, k), wdt), "cpu"
        (got,) = run(matmul_graph(m, k, n, wdt), device, {"a": a}, {"w": w})
        (want,) = run(matmul_graph(m, k, n, wdt), oracle, {"a": a}, {"w": w})
        assert record(f"matmul {wdt}, {device}, relative", got, want, relative=True) <= 1e-5
    table = randn(r, 300, 37)
    ids = r.integers(0, 300, 60).astype(np.int32)
    (e,) = run(embedding_graph(300, 37, 60, "f32"), device, {"ids": ids}, {"t": table})
    assert np.array_equal(e, table[ids])
    plan = rlx.compile(embedding_graph(300, 37, 2, "f32"), device=device)
    plan.set_param("t", table)
    with pytest.raises(ValueError, match="token id 300 at position 1"):   # reported by the first piece only
        plan.run({"ids": np.array([5, 300], np.int32)})


def test_an_operand_too_big_for_one_binding_is_refused_by_name():
    g = rlx.Graph()
    g.output(g.rmsnorm(g.input("x", (40, 64)), g.param("w", (64,))), "y")
    plan = rlx.compile(g, device="vulkan:range=4096")
    plan.set_param("w", np.ones(64, np.float32))
    with pytest.raises(rlx.Error, match=r"node \d+ \(rmsnorm\): an operand of 10240 bytes exceeds the 4096 bytes one "
                                        r"binding may span on this device \(maxStorageBufferRange\)"):
        plan.run({"x": np.ones((40, 64), np.float32)})
