"""Every op of the rlx core, on every backend, against the NumPy references in rlx.reference.ops.

Each test builds the smallest graph that exercises one op (inputs for the data, params where a
weight is natural), compiles it for the device, runs it and compares with the reference. Sizes
are deliberately odd (1, 3, 17, 130) so that vector tails and blocking edges are hit; symbolic
dims are bound to several values through ONE compiled plan.
"""

import numpy as np
import pytest

import rlx
from rlx.reference import ops as ref


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


def run(g, device, inputs, params=None, fuse=True):
    plan = rlx.compile(g, device=device, fuse=fuse)
    for name, arr in (params or {}).items():
        plan.set_param(name, arr)
    return plan.run(inputs)


def close(out, expected, rtol=1e-4, atol=1e-5):
    assert out.shape == expected.shape, (out.shape, expected.shape)
    assert out.dtype == expected.dtype, (out.dtype, expected.dtype)
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------

MATMUL_SIZES = [(1, 1, 1), (1, 3, 17), (3, 17, 130), (17, 130, 3), (130, 17, 1), (1, 130, 130), (5, 64, 33)]


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m,k,n", MATMUL_SIZES)
def test_matmul(device, trans_b, m, k, n):
    r = rng(m * 1000 + k * 10 + n)
    a = randn(r, m, k)
    b = randn(r, n, k) if trans_b else randn(r, k, n)
    g = rlx.Graph()
    x = g.input("a", (m, k))
    w = g.param("b", b.shape)
    g.output(g.matmul(x, w, transpose_b=trans_b), "y")
    (y,) = run(g, device, {"a": a}, {"b": b})
    close(y, ref.matmul(a, b, trans_b=trans_b), rtol=1e-4, atol=1e-4)


def test_matmul_leading_dims(device):
    r = rng(1)
    a, b = randn(r, 2, 5, 16), randn(r, 16, 8)
    g = rlx.Graph()
    g.output(g.matmul(g.input("a", a.shape), g.input("b", b.shape)), "y")
    (y,) = run(g, device, {"a": a, "b": b})
    close(y, ref.matmul(a, b))


def test_matmul_symbolic_rows_one_plan(device):
    r = rng(2)
    w = randn(r, 48, 64)
    g = rlx.Graph()
    x = g.input("x", ("SEQ", 64))
    g.output(g.matmul(x, g.param("w", (48, 64)), transpose_b=True), "y")
    plan = rlx.compile(g, device=device)
    plan.set_param("w", w)
    for seq in (1, 5, 33, 5):
        a = randn(r, seq, 64)
        (y,) = plan.run({"x": a})
        close(y, ref.matmul(a, w, trans_b=True), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# embedding
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ids_shape", [(7,), (2, 3), (1,)])
def test_embedding(device, ids_shape):
    r = rng(3)
    table = randn(r, 50, 17)
    ids = r.integers(0, 50, size=ids_shape).astype(np.int32)
    g = rlx.Graph()
    g.output(g.embedding(g.param("table", (50, 17)), g.input("ids", ids_shape, "i32")), "e")
    (e,) = run(g, device, {"ids": ids}, {"table": table})
    close(e, ref.embedding(table, ids), rtol=0, atol=0)


@pytest.mark.parametrize("bad_id", [50, -1, 1 << 30])
def test_embedding_out_of_range_then_usable(device, bad_id):
    r = rng(4)
    table = randn(r, 50, 8)
    g = rlx.Graph()
    g.output(g.embedding(g.param("table", (50, 8)), g.input("ids", ("SEQ",), "i32")), "e")
    plan = rlx.compile(g, device=device)
    plan.set_param("table", table)
    with pytest.raises(ValueError):
        plan.run({"ids": np.array([1, bad_id, 2], np.int32)})
    ids = np.array([0, 49, 7], np.int32)
    (e,) = plan.run({"ids": ids})
    close(e, ref.embedding(table, ids), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# norms and elementwise
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 8), (5, 17), (2, 3, 64), (3, 130)])
def test_rmsnorm(device, shape):
    r = rng(5)
    x, w = randn(r, *shape), randn(r, shape[-1])
    g = rlx.Graph()
    g.output(g.rmsnorm(g.input("x", shape), g.param("w", (shape[-1],)), eps=1e-5), "y")
    (y,) = run(g, device, {"x": x}, {"w": w})
    close(y, ref.rmsnorm(x, w, 1e-5))


@pytest.mark.parametrize("s,h,d", [(1, 1, 2), (5, 4, 16), (7, 2, 64), (3, 3, 130)])
def test_rope(device, s, h, d):
    r = rng(6)
    x = randn(r, s, h, d)
    pos = (np.arange(s) + 11).astype(np.int32)
    inv_freq = (1.0 / (10000.0 ** (np.arange(0, d, 2) / d))).astype(np.float32)
    g = rlx.Graph()
    y = g.rope(g.input("x", (s, h, d)), g.input("pos", (s,), "i32"), g.param("inv_freq", (d // 2,)))
    g.output(y, "y")
    (out,) = run(g, device, {"x": x, "pos": pos}, {"inv_freq": inv_freq})
    close(out, ref.rope(x, pos, inv_freq), atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 4, 130), (1, 1000)])
def test_softmax(device, shape):
    r = rng(7)
    x = randn(r, *shape) * 4
    g = rlx.Graph()
    g.output(g.softmax(g.input("x", shape)), "y")
    (y,) = run(g, device, {"x": x})
    close(y, ref.softmax(x), atol=1e-6)


def test_softmax_large_values_stable(device):
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1e30]], np.float32)
    g = rlx.Graph()
    g.output(g.softmax(g.input("x", x.shape)), "y")
    (y,) = run(g, device, {"x": x})
    assert np.all(np.isfinite(y))
    close(y, ref.softmax(x), atol=1e-6)


@pytest.mark.parametrize("shape", [(7,), (3, 130), (2, 3, 17)])
def test_silu(device, shape):
    r = rng(8)
    x = randn(r, *shape) * 3
    g = rlx.Graph()
    g.output(g.silu(g.input("x", shape)), "y")
    (y,) = run(g, device, {"x": x})
    close(y, ref.silu(x))


@pytest.mark.parametrize("shape", [(7,), (3, 130), (2, 3, 17), (1, 3072)])
def test_silu_mul_fused(device, shape):
    """mul(silu(a), b) fuses into silu_mul; whole vectors and tails of every length give NumPy's values."""
    r = rng(18)
    a, b = randn(r, *shape) * 3, randn(r, *shape)
    g = rlx.Graph()
    g.output(g.mul(g.silu(g.input("a", shape)), g.input("b", shape)), "y")
    (y,) = run(g, device, {"a": a, "b": b})
    close(y, ref.silu_mul(a, b))


BROADCASTS = [((5, 8), (5, 8)), ((5, 8), (8,)), ((2, 3, 4), (3, 4)), ((2, 3, 4), (4,)), ((130,), (130,)),
              ((1, 17), (17,))]


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("a_shape,b_shape", BROADCASTS)
def test_add_mul_suffix_broadcast(device, op, a_shape, b_shape):
    r = rng(9)
    a, b = randn(r, *a_shape), randn(r, *b_shape)
    g = rlx.Graph()
    y = getattr(g, op)(g.input("a", a_shape), g.input("b", b_shape))
    g.output(y, "y")
    (out,) = run(g, device, {"a": a, "b": b})
    close(out, getattr(ref, op)(a, b), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------

def attention_case(device, S, P, Hq, Hkv, D, causal=True, window=0, mask=None, seed=10, scale=None, kv="f32"):
    """S queries (the last S of T = P + S positions) over T keys / values stored in kv dtype."""
    r = rng(seed)
    T = P + S
    q = randn(r, S, Hq, D)
    k, v = ref.convert(randn(r, T, Hkv, D), kv), ref.convert(randn(r, T, Hkv, D), kv)
    g = rlx.Graph()
    qv, kv_, vv = g.input("q", (S, Hq, D)), g.input("k", (T, Hkv, D), kv), g.input("v", (T, Hkv, D), kv)
    inputs = {"q": q, "k": k, "v": v}
    mv = None
    if mask is not None:
        mv = g.input("mask", mask.shape, "u8" if mask.dtype != np.float32 else "f32")
        inputs["mask"] = mask
    g.output(g.attention(qv, kv_, vv, mv, scale=scale, causal=causal, window=window), "o")
    (o,) = run(g, device, inputs)
    expected = ref.attention(q, k, v, mask, scale=scale, causal=causal, window=window)
    close(o, expected, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_attention_gqa(device, causal, group):
    attention_case(device, S=5, P=0, Hq=2 * group, Hkv=2, D=16, causal=causal)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_attention_window(device, window):
    attention_case(device, S=6, P=2, Hq=4, Hkv=2, D=8, window=window)


@pytest.mark.parametrize("S,P", [(1, 3), (4, 3), (1, 17), (3, 1)])
def test_attention_past(device, S, P):
    attention_case(device, S=S, P=P, Hq=4, Hkv=2, D=16)


@pytest.mark.parametrize("kv", ["f16", "bf16"])
@pytest.mark.parametrize("S,P", [(1, 40), (4, 3), (9, 20)])
def test_attention_16bit_kv(device, kv, S, P):
    """K and V stored as f16 / bf16 (a KV cache's dtypes): widened exactly, the same math as f32."""
    attention_case(device, S=S, P=P, Hq=4, Hkv=2, D=16, window=5 if S == 9 else 0, kv=kv)


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("S,P,Hq,Hkv,D,window", [
    (1, 1500, 6, 2, 32, 0),     # decode over a long cache: chunks of keys split over threads
    (1, 2999, 12, 3, 16, 0),    # odd group size, a tail of < 4 keys
    (1, 700, 8, 8, 48, 300),    # no grouping, a window
    (9, 700, 8, 2, 32, 0),      # a short extension over a long cache (flash, one query block)
    (70, 130, 8, 2, 16, 0),     # query blocks and key blocks both cut in the middle
    (130, 0, 6, 3, 16, 50),     # prefill, odd group, window
])
def test_attention_long_context(device, kv, S, P, Hq, Hkv, D, window):
    """The cpu table's vector paths (head sizes multiples of 16: tiled flash prefill, decode
    split over key chunks) at long contexts, f32 / f16 / bf16 K and V, against NumPy."""
    attention_case(device, S=S, P=P, Hq=Hq, Hkv=Hkv, D=D, window=window, kv=kv)


def test_attention_past_not_causal(device):
    attention_case(device, S=3, P=4, Hq=2, Hkv=1, D=8, causal=False)


def test_attention_explicit_scale_odd_head_dim(device):
    attention_case(device, S=3, P=2, Hq=3, Hkv=1, D=17, scale=0.37)


@pytest.mark.parametrize("P", [0, 3])
def test_attention_f32_additive_mask(device, P):
    S = 4
    r = rng(11)
    mask = (r.standard_normal((S, P + S)) * 2).astype(np.float32)
    mask[1, 0] = -np.inf
    attention_case(device, S=S, P=P, Hq=4, Hkv=2, D=8, causal=False, mask=mask)


@pytest.mark.parametrize("P", [0, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_u8_bool_mask(device, P, causal):
    S = 4
    r = rng(12)
    mask = (r.random((S, P + S)) < 0.6).astype(np.uint8)
    mask[:, 0] = 1
    attention_case(device, S=S, P=P, Hq=4, Hkv=4, D=8, causal=causal, mask=mask)


def test_attention_fully_masked_row_is_zero(device):
    S = 3
    mask = np.ones((S, S), np.uint8)
    mask[1, :] = 0
    attention_case(device, S=S, P=0, Hq=2, Hkv=1, D=4, causal=False, mask=mask)


def test_attention_symbolic_seq_past_one_plan(device):
    Hq, Hkv, D = 4, 2, 16
    g = rlx.Graph()
    q = g.input("q", ("SEQ", Hq, D))
    k, v = g.input("k", ("PAST+SEQ", Hkv, D)), g.input("v", ("PAST+SEQ", Hkv, D))
    g.output(g.attention(q, k, v), "o")
    plan = rlx.compile(g, device=device)
    r = rng(13)
    for S, P in [(1, 0), (1, 7), (5, 3), (8, 0), (2, 30)]:
        a = {"q": randn(r, S, Hq, D), "k": randn(r, P + S, Hkv, D), "v": randn(r, P + S, Hkv, D)}
        (o,) = plan.run(a)
        close(o, ref.attention(a["q"], a["k"], a["v"]), atol=1e-5)


def test_attention_fewer_keys_than_queries(device):
    g = rlx.Graph()
    q, k = g.input("q", (4, 2, 8)), g.input("k", (3, 2, 8))
    with pytest.raises(ValueError, match="fewer keys than queries"):
        g.attention(q, k, k)
    g = rlx.Graph()
    q = g.input("q2", ("SEQ", 2, 8))
    k = g.input("k2", ("PAST", 2, 8))
    g.output(g.attention(q, k, k), "o")
    plan = rlx.compile(g, device=device)
    r = rng(14)
    with pytest.raises(ValueError, match="T >= S"):
        plan.run({"q2": randn(r, 4, 2, 8), "k2": randn(r, 2, 2, 8)})
    (o,) = plan.run({"q2": randn(r, 2, 2, 8), "k2": randn(r, 2, 2, 8)})  # still usable
    assert o.shape == (2, 2, 8)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_convert(device, dtype):
    """f32 -> f16 / bf16, rounded to nearest even: the same bits as NumPy's / ml_dtypes' casts,
    ties, subnormals, overflow to inf and NaN included."""
    r = rng(15)
    x = np.concatenate([
        (r.standard_normal(1000) * 10.0 ** r.integers(-9, 6, 1000)).astype(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519, 65520, 70000, 5.96e-8, 2.98e-8, 1e-40, 3.4e38,
                  1 + 2**-11, 1 + 2**-8, 1 + 3 * 2**-9], np.float32)])
    g = rlx.Graph()
    g.output(g.convert(g.input("x", (x.size,)), dtype), "y")
    (y,) = run(g, device, {"x": x})
    want = ref.convert(x, dtype)
    assert y.dtype.itemsize == want.dtype.itemsize
    assert np.array_equal(y.view(np.uint8), want.view(np.uint8))
    nan = np.full(1, np.nan, np.float32)
    (yn,) = run(g, device, {"x": np.concatenate([nan, x[1:]])})
    assert np.isnan(yn.view(want.dtype)[0].astype(np.float32))


# ---------------------------------------------------------------------------------------------
# shape ops
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 8), (1, 3, 4), (17,)])
def test_gather_last(device, shape):
    x = randn(rng(14), *shape)
    g = rlx.Graph()
    g.output(g.gather_last(g.input("x", shape)), "y")
    (y,) = run(g, device, {"x": x})
    close(y, ref.gather_last(x), rtol=0, atol=0)


@pytest.mark.parametrize("axis,a_shape,b_shape", [(0, (2, 5), (3, 5)), (1, (4, 2), (4, 3)), (1, (2, 1, 3), (2, 4, 3)),
                                                  (-1, (2, 3), (2, 1))])
def test_concat(device, axis, a_shape, b_shape):
    r = rng(15)
    a, b = randn(r, *a_shape), randn(r, *b_shape)
    g = rlx.Graph()
    g.output(g.concat(g.input("a", a_shape), g.input("b", b_shape), axis=axis), "y")
    (y,) = run(g, device, {"a": a, "b": b})
    close(y, ref.concat(a, b, axis), rtol=0, atol=0)


def test_concat_i32_symbolic(device):
    g = rlx.Graph()
    y = g.concat(g.input("a", ("PAST",), "i32"), g.input("b", ("SEQ",), "i32"), axis=0)
    g.output(y, "y")
    plan = rlx.compile(g, device=device)
    for p, s in [(0, 3), (4, 1), (2, 2)]:
        a, b = np.arange(p, dtype=np.int32), np.arange(s, dtype=np.int32) + 100
        (out,) = plan.run({"a": a, "b": b})
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, ref.concat(a, b, 0))


@pytest.mark.parametrize("axis,start,length", [(0, 1, 3), (0, -2, 2), (1, 0, 4), (1, -3, 2), (1, 7, 1), (0, 0, 6)])
def test_slice(device, axis, start, length):
    x = randn(rng(16), 6, 8)
    g = rlx.Graph()
    g.output(g.slice(g.input("x", (6, 8)), axis, start, length), "y")
    (y,) = run(g, device, {"x": x})
    close(y, ref.slice(x, axis, start, length), rtol=0, atol=0)


@pytest.mark.parametrize("src,dst", [((4, 6), (2, 12)), ((2, 3, 4), (6, 4)), ((24,), (2, 3, 4)), ((3, 5), (15,))])
def test_reshape(device, src, dst):
    x = randn(rng(17), *src)
    g = rlx.Graph()
    g.output(g.reshape(g.input("x", src), dst), "y")
    (y,) = run(g, device, {"x": x})
    close(y, ref.reshape(x, dst), rtol=0, atol=0)


def test_reshape_symbolic_heads(device):
    g = rlx.Graph()
    x = g.input("x", ("SEQ", 8))
    y = g.reshape(x, ("SEQ", 2, 4))
    assert y.shape == ("SEQ", 2, 4)
    g.output(y, "y")
    plan = rlx.compile(g, device=device)
    for seq in (1, 3, 9):
        a = randn(rng(seq), seq, 8)
        (out,) = plan.run({"x": a})
        close(out, ref.reshape(a, (seq, 2, 4)), rtol=0, atol=0)
