"""The mixture-of-experts ops (topk, matmul_id, moe_combine) on every backend, against outside
oracles: NumPy (rlx.reference.ops) for the arithmetic, torch.topk for which indices a row with
ties selects, gguf-py's dequantisation for block-type experts. Sizes are odd (3, 5, 17, 130) so that
vector tails and grouping edges are hit; symbolic rows are bound to several values through one plan.
"""

import numpy as np
import pytest

import rlx
from rlx.reference import ops as ref

torch = pytest.importorskip("torch")


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def run(g, device, inputs, params=None):
    plan = rlx.compile(g, device=device)
    for name, arr in (params or {}).items():
        plan.set_param(name, arr)
    return plan.run(inputs)


def topk_graph(shape, k):
    g = rlx.Graph()
    g.output(g.topk(g.input("x", shape), k), "i")
    return g


# ---------------------------------------------------------------------------------------------
# topk
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,n,k", [(1, 1, 1), (3, 5, 2), (4, 17, 17), (2, 130, 8), (5, 128, 1), (3, 300, 4)])
def test_topk_distinct_values_match_numpy(device, rows, n, k):
    x = randn(rng(n * 10 + k), rows, n)
    (got,) = run(topk_graph((rows, n), k), device, {"x": x})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ref.topk(x, k))


def test_topk_symbolic_rows_one_plan(device):
    plan = rlx.compile(topk_graph(("SEQ", 60), 8), device=device)
    r = rng(3)
    for seq in (1, 7, 2, 33):
        x = randn(r, seq, 60)
        (got,) = plan.run({"x": x})
        np.testing.assert_array_equal(got, ref.topk(x, 8))


# n and k over both of torch's paths (partial_sort when k * 64 <= n, nth_element + sort otherwise),
# the insertion-sort threshold (16), the introselect loop's 3-element tail, and the depth limit.
TIE_CASES = [(2, 1), (3, 2), (4, 2), (8, 8), (16, 3), (17, 9), (33, 20), (60, 8), (64, 1), (128, 2), (128, 8),
             (129, 2), (200, 3), (512, 8), (1000, 40), (4096, 64)]


@pytest.mark.parametrize("n,k", TIE_CASES)
def test_topk_ties_choose_as_torch(device, n, k):
    """Rows of a few distinct values (so nearly every k-th place is a tie): the indices, in order,
    are torch.topk's, which no simple rule (lowest or highest index first) reproduces."""
    r = rng(n + 1000 * k)
    rows = 24
    x = r.integers(0, 4, size=(rows, n)).astype(np.float32)
    x[::5] = 0.25  # all-equal rows
    x[1::7] = np.sort(x[1::7], axis=1)  # ascending runs
    x[2::7] = -np.sort(-x[2::7], axis=1)  # descending runs
    (got,) = run(topk_graph((rows, n), k), device, {"x": x})
    want = torch.topk(torch.from_numpy(x), k, dim=-1).indices.numpy()
    np.testing.assert_array_equal(got, want)


def test_topk_ties_of_softmax_probabilities(device):
    """A router's real input: softmax of logits that are equal in places."""
    r = rng(5)
    logits = r.integers(-2, 3, size=(40, 128)).astype(np.float32) * 0.5
    probs = torch.softmax(torch.from_numpy(logits), dim=-1)
    (got,) = run(topk_graph((40, 128), 8), device, {"x": probs.numpy()})
    np.testing.assert_array_equal(got, torch.topk(probs, 8, dim=-1).indices.numpy())


def test_topk_nan_counts_as_largest(device):
    x = np.array([[1.0, np.nan, 3.0, 2.0, np.nan, -1.0]], np.float32)
    (got,) = run(topk_graph(x.shape, 3), device, {"x": x})
    np.testing.assert_array_equal(got, torch.topk(torch.from_numpy(x), 3).indices.numpy())


def test_topk_refuses_bad_k():
    g = rlx.Graph()
    x = g.input("x", (2, 5))
    for k in (0, 6):
        with pytest.raises(ValueError, match="k must be in"):
            g.topk(x, k)


# ---------------------------------------------------------------------------------------------
# matmul_id
# ---------------------------------------------------------------------------------------------

def matmul_id_graph(S, A, n, E, N, K, wdtype="f32"):
    g = rlx.Graph()
    a = g.input("a", (S, A, K))
    ids = g.input("ids", (S, n), "i32")
    g.output(g.matmul_id(a, ids, g.param("w", (E, N, K), wdtype)), "y")
    return g


def cast(a, dtype):
    return a if dtype == "f32" else ref.convert(a, dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("S,A,n,E,N,K", [(1, 1, 1, 1, 1, 1), (1, 1, 2, 5, 17, 33), (1, 3, 3, 4, 130, 17),
                                        (7, 1, 2, 3, 33, 130), (5, 2, 2, 9, 16, 64), (17, 1, 8, 17, 5, 3)])
def test_matmul_id(device, dtype, S, A, n, E, N, K):
    r = rng(S * 31 + n * 7 + E + N + K)
    a = randn(r, S, A, K)
    ids = np.stack([r.permutation(E)[:n] if n <= E else r.integers(0, E, n) for _ in range(S)]).astype(np.int32)
    w = cast(randn(r, E, N, K), dtype)
    (got,) = run(matmul_id_graph(S, A, n, E, N, K, dtype), device, {"a": a, "ids": ids}, {"w": w})
    tol = 1e-5 if dtype == "f32" else 2e-5
    np.testing.assert_allclose(got, ref.matmul_id(a, ids, w), rtol=tol, atol=tol * np.sqrt(K))


def test_matmul_id_repeated_experts_and_unused_ones(device):
    """Every row on one expert (the grouping's largest group), the same expert twice in a row, and
    experts that no row names."""
    r = rng(9)
    S, n, E, N, K = 13, 3, 6, 19, 40
    a, w = randn(r, S, 1, K), randn(r, E, N, K)
    ids = np.full((S, n), 4, np.int32)
    ids[::3, 1] = 2
    (got,) = run(matmul_id_graph(S, 1, n, E, N, K), device, {"a": a, "ids": ids}, {"w": w})
    np.testing.assert_allclose(got, ref.matmul_id(a, ids, w), rtol=1e-5, atol=1e-5)


def test_matmul_id_symbolic_tokens_one_plan(device):
    r = rng(12)
    E, N, K, n = 7, 24, 48, 2
    w = randn(r, E, N, K)
    plan = rlx.compile(matmul_id_graph("SEQ", 1, n, E, N, K), device=device)
    plan.set_param("w", w)
    for S in (1, 9, 3, 40):
        a = randn(r, S, 1, K)
        ids = r.integers(0, E, size=(S, n)).astype(np.int32)
        (got,) = plan.run({"a": a, "ids": ids})
        np.testing.assert_allclose(got, ref.matmul_id(a, ids, w), rtol=1e-5, atol=1e-5)


def test_matmul_id_out_of_range_id_raises_then_plan_usable(device):
    r = rng(4)
    a, w = randn(r, 2, 1, 8), randn(r, 3, 5, 8)
    plan = rlx.compile(matmul_id_graph(2, 1, 2, 3, 5, 8), device=device)
    plan.set_param("w", w)
    for bad in (3, -1):
        with pytest.raises(ValueError, match=r"expert id .* outside \[0, 3\)"):
            plan.run({"a": a, "ids": np.array([[0, 1], [bad, 2]], np.int32)})
    ids = np.array([[0, 1], [2, 2]], np.int32)
    (got,) = plan.run({"a": a, "ids": ids})
    np.testing.assert_allclose(got, ref.matmul_id(a, ids, w), rtol=1e-5, atol=1e-5)


def test_matmul_id_shape_rules():
    g = rlx.Graph()
    w = g.param("w", (4, 6, 8))
    ids = g.input("ids", (3, 2), "i32")
    with pytest.raises(ValueError, match="A = 1 or n"):
        g.matmul_id(g.input("a", (3, 3, 8)), ids, w)
    with pytest.raises(ValueError, match="takes f32 a, i32 ids"):
        g.matmul_id(g.input("b", (3, 1, 8)), g.input("f", (3, 2)), w)
    with pytest.raises(ValueError, match="whole number of blocks"):
        g.matmul_id(g.input("c", (3, 1, 40)), ids, g.param("q", (4, 6, 40), "q8_0"))


BLOCK_CASES = [("q8_0", 64), ("q4_0", 96), ("q4_k", 256), ("q6_k", 512)]


@pytest.mark.parametrize("name,K", BLOCK_CASES)
def test_matmul_id_block_experts_on_ref_match_gguf_py(name, K):
    """Block-type experts, as a GGUF file stacks them: the product with gguf-py's dequantised values."""
    gguf = pytest.importorskip("gguf")
    r = rng(K)
    E, N, S, n = 5, 9, 4, 2
    values = randn(r, E, N, K, scale=0.1)
    raw = rlx._C.quantize(values.reshape(E * N, K), name).reshape(E, N, -1)
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name.upper()]).reshape(E, N, K)
    a = randn(r, S, 1, K)
    ids = np.array([[4, 0], [0, 4], [2, 3], [1, 1]], np.int32)
    (got,) = run(matmul_id_graph(S, 1, n, E, N, K, name), "ref", {"a": a, "ids": ids}, {"w": (raw, name, (E, N, K))})
    np.testing.assert_allclose(got, ref.matmul_id(a, ids, deq.astype(np.float32)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,K", BLOCK_CASES)
@pytest.mark.parametrize("S", [4, 16])  # decode-sized groups, and a prefill whose experts get several rows
def test_matmul_id_block_experts_on_cpu_within_the_activation_rounding(name, K, S):
    """Block-type experts on cpu: its kernels quantise each row of activations per block (scale
    A / 127, A the block's largest |a|), so every product differs from gguf-py's dequantised values
    times the exact activations by at most (A_row / 254) * sum |w| over the row (A_row >= every
    block's A), plus f32 summation."""
    gguf = pytest.importorskip("gguf")
    r = rng(K + S)
    E, N, n = 5, 9, 2
    values = randn(r, E, N, K, scale=0.1)
    raw = rlx._C.quantize(values.reshape(E * N, K), name).reshape(E, N, -1)
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name.upper()]).reshape(E, N, K).astype(np.float32)
    a = randn(r, S, 1, K)
    ids = np.stack([r.permutation(E)[:n] for _ in range(S)]).astype(np.int32)
    (got,) = run(matmul_id_graph(S, 1, n, E, N, K, name), "cpu", {"a": a, "ids": ids}, {"w": (raw, name, (E, N, K))})
    want = ref.matmul_id(a, ids, deq)
    amax = np.abs(a).max(axis=-1)                                   # (S, 1)
    wsum = np.abs(deq).sum(axis=-1)                                 # (E, N)
    bound = (amax[:, :, None] / 254.0) * wsum[ids] + 1e-5 * np.abs(want).max()  # (S, n, N)
    assert np.all(np.abs(got - want) <= bound), float((np.abs(got - want) / bound).max())


# ---------------------------------------------------------------------------------------------
# moe_combine, and the whole sparse block
# ---------------------------------------------------------------------------------------------

def combine_graph(S, n, H, E, norm):
    g = rlx.Graph()
    y = g.input("y", (S, n, H))
    p = g.input("p", (S, E))
    ids = g.input("ids", (S, n), "i32")
    g.output(g.moe_combine(y, p, ids, norm=norm), "o")
    return g


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("S,n,H,E", [(1, 1, 1, 1), (1, 8, 130, 128), (6, 2, 17, 5), (33, 3, 64, 9)])
def test_moe_combine(device, norm, S, n, H, E):
    r = rng(S + n + H + E)
    y = randn(r, S, n, H)
    p = np.asarray(torch.softmax(torch.from_numpy(randn(r, S, E)), -1))
    ids = np.stack([r.permutation(E)[:n] for _ in range(S)]).astype(np.int32) if n <= E else \
        r.integers(0, E, (S, n)).astype(np.int32)
    (got,) = run(combine_graph(S, n, H, E, norm), device, {"y": y, "p": p, "ids": ids})
    np.testing.assert_allclose(got, ref.moe_combine(y, p, ids, norm), rtol=1e-5, atol=1e-6)


def test_moe_combine_out_of_range_id_raises(device):
    y, p = np.ones((1, 2, 3), np.float32), np.full((1, 4), 0.25, np.float32)
    with pytest.raises(ValueError, match="expert id 4"):
        run(combine_graph(1, 2, 3, 4, False), device, {"y": y, "p": p, "ids": np.array([[0, 4]], np.int32)})


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("S,k", [(1, 1), (1, 2), (5, 2), (11, 4)])
def test_sparse_block_graph(device, norm, S, k):
    """router matmul -> softmax -> topk -> matmul_id (gate, up) -> silu * up -> matmul_id (down) ->
    moe_combine, as the decoder builds it, against NumPy's whole block."""
    r = rng(S * 10 + k)
    E, H, F = 6, 24, 20
    x, router = randn(r, S, H), randn(r, E, H)
    gate, up, down = randn(r, E, F, H, scale=0.3), randn(r, E, F, H, scale=0.3), randn(r, E, H, F, scale=0.3)
    g = rlx.Graph()
    xi = g.input("x", (S, H))
    probs = g.softmax(g.matmul(xi, g.param("router", (E, H)), transpose_b=True))
    ids = g.topk(probs, k)
    x3 = g.reshape(xi, (S, 1, H))
    gu = g.mul(g.silu(g.matmul_id(x3, ids, g.param("gate", (E, F, H)))), g.matmul_id(x3, ids, g.param("up", (E, F, H))))
    g.output(g.moe_combine(g.matmul_id(gu, ids, g.param("down", (E, H, F))), probs, ids, norm=norm), "y")
    (got,) = run(g, device, {"x": x}, {"router": router, "gate": gate, "up": up, "down": down})
    np.testing.assert_allclose(got, ref.moe_ffn(x, router, gate, up, down, k, norm), rtol=1e-4, atol=1e-5)
