"""The mixture-of-experts ops on Vulkan (tests/unit/test_moe_ops.py runs them on every device against
NumPy and torch.topk; this adds what only Vulkan has): matmul_id with experts of every block type
against the ref backend (the exact dequantised values) and of every float type against cpu, topk over
more rows than one workgroup, and all three with staging and with bindings limited to 4 KiB (stacked
experts bound in pieces of whole experts, topk's rows sorted in several dispatches through one
scratch buffer), then the refusals by name when one expert or one row's pairs exceed a binding.
The worst difference of each check is recorded (vkutil.PARITY)."""

from __future__ import annotations

import numpy as np
import pytest
from vkutil import BLOCK_TYPES, FLOAT_TYPES, block_weight, randn, record, run

import rlx
from rlx.reference import ops as ref

torch = pytest.importorskip("torch")
VK = "vulkan"


def matmul_id_graph(S, A, n, E, N, K, wdtype="f32"):
    g = rlx.Graph()
    a = g.input("a", (S, A, K))
    ids = g.input("ids", (S, n), "i32")
    g.output(g.matmul_id(a, ids, g.param("w", (E, N, K), wdtype)), "y")
    return g


def topk_graph(rows, n, k):
    g = rlx.Graph()
    g.output(g.topk(g.input("x", (rows, n)), k), "i")
    return g


def combine_graph(S, n, H, E, norm):
    g = rlx.Graph()
    g.output(g.moe_combine(g.input("y", (S, n, H)), g.input("p", (S, E)), g.input("ids", (S, n), "i32"), norm=norm),
             "o")
    return g


def routed(r, S, n, E):
    return np.stack([r.permutation(E)[:n] for _ in range(S)]).astype(np.int32)


def cast(a, dtype):
    return a.astype(rlx.dtypes.DTYPES[dtype].numpy) if dtype != "bf16" else ref.convert(a, "bf16")


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("S,A", [(1, 1), (6, 2)])
def test_matmul_id_block_experts(name, S, A):
    """Dequantised in the shader: the ref backend's products (the exact a times the exact values)."""
    r = np.random.default_rng(BLOCK_TYPES.index(name) * 10 + S)
    E, N, n = 5, 11, 2
    K = 256 if name.endswith("_k") else 96
    packed, values = block_weight(name, E * N, K, r)
    w = (packed[0].reshape(E, N, -1), name, (E, N, K))
    a, ids = randn(r, S, A, K), routed(r, S, n, E)
    (got,) = run(matmul_id_graph(S, A, n, E, N, K, name), VK, {"a": a, "ids": ids}, {"w": w})
    (want,) = run(matmul_id_graph(S, A, n, E, N, K, name), "ref", {"a": a, "ids": ids}, {"w": w})
    np.testing.assert_allclose(want, ref.matmul_id(a, ids, values.reshape(E, N, K)), rtol=1e-5, atol=1e-5)
    assert record(f"matmul_id {name} experts vs ref, relative", got, want, relative=True) <= 1e-5


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("S,A,n,E,N,K", [(1, 1, 8, 16, 37, 100), (9, 3, 3, 4, 75, 37)])
def test_matmul_id_float_experts(dtype, S, A, n, E, N, K):
    r = np.random.default_rng(S + n + E + N)
    a, ids, w = randn(r, S, A, K), routed(r, S, n, E), cast(randn(r, E, N, K), dtype)
    (got,) = run(matmul_id_graph(S, A, n, E, N, K, dtype), VK, {"a": a, "ids": ids}, {"w": w})
    (want,) = run(matmul_id_graph(S, A, n, E, N, K, dtype), "cpu", {"a": a, "ids": ids}, {"w": w})
    assert record(f"matmul_id {dtype} experts", got, want) <= 1e-5 * np.abs(want).max() + 1e-6


def test_topk_rows_past_one_workgroup():
    """150 rows (three workgroups of 64, the last partial), ties everywhere: torch.topk's indices."""
    x = np.random.default_rng(1).integers(0, 3, size=(150, 40)).astype(np.float32)
    for k in (1, 6, 40):
        (got,) = run(topk_graph(150, 40, k), VK, {"x": x})
        np.testing.assert_array_equal(got, torch.topk(torch.from_numpy(x), k, dim=-1).indices.numpy())


def test_moe_combine_matches_cpu():
    r = np.random.default_rng(2)
    S, n, H, E = 9, 4, 70, 12
    y, p, ids = randn(r, S, n, H), np.asarray(torch.softmax(torch.from_numpy(randn(r, S, E)), -1)), routed(r, S, n, E)
    for norm in (False, True):
        (got,) = run(combine_graph(S, n, H, E, norm), VK, {"y": y, "p": p, "ids": ids})
        (want,) = run(combine_graph(S, n, H, E, norm), "cpu", {"y": y, "p": p, "ids": ids})
        assert record(f"moe_combine (norm={norm})", got, want) <= 1e-6


@pytest.mark.parametrize("device", ["vulkan:staging", "vulkan:range=4096", "vulkan:staging,range=4096"])
def test_moe_ops_split_or_staged(device):
    """With 4 KiB bindings the f32 experts (9 x 64 x 4 = 2304 B each) are bound one a dispatch and
    the q8_0 ones (9 x 136 B) three a dispatch, and topk's pairs (40 rows x 100 x 8 B) take eight
    dispatches of 5 rows; an id out of range is still reported once, by the piece of expert 0."""
    r = np.random.default_rng(3)
    S, n, E, N, K = 5, 2, 7, 9, 64
    ids = routed(r, S, n, E)
    for wdt, K in (("f32", 64), ("q8_0", 128)):
        a = randn(r, S, 1, K)
        if wdt == "f32":
            w, oracle = randn(r, E, N, K), "cpu"
        else:
            packed, _ = block_weight(wdt, E * N, K, r)
            w, oracle = (packed[0].reshape(E, N, -1), wdt, (E, N, K)), "ref"
        (got,) = run(matmul_id_graph(S, 1, n, E, N, K, wdt), device, {"a": a, "ids": ids}, {"w": w})
        (want,) = run(matmul_id_graph(S, 1, n, E, N, K, wdt), oracle, {"a": a, "ids": ids}, {"w": w})
        assert record(f"matmul_id {wdt}, {device}, relative", got, want, relative=True) <= 1e-5
    plan = rlx.compile(matmul_id_graph(S, 1, n, E, N, K, wdt), device=device)
    plan.set_param("w", w)
    bad = ids.copy()
    bad[3, 1] = 7
    with pytest.raises(ValueError, match=r"expert id 7 \(row 3, slot 1\) is outside \[0, 7\)"):
        plan.run({"a": a, "ids": bad})
    x = r.integers(0, 4, size=(40, 100)).astype(np.float32)
    (got,) = run(topk_graph(40, 100, 8), device, {"x": x})
    np.testing.assert_array_equal(got, torch.topk(torch.from_numpy(x), 8, dim=-1).indices.numpy())
    y, p = randn(r, S, n, 30), np.asarray(torch.softmax(torch.from_numpy(randn(r, S, E)), -1))
    (got,) = run(combine_graph(S, n, 30, E, True), device, {"y": y, "p": p, "ids": ids})
    np.testing.assert_allclose(got, ref.moe_combine(y, p, ids, True), rtol=1e-5, atol=1e-6)


def test_an_expert_or_a_row_too_big_for_one_binding_is_refused_by_name():
    plan = rlx.compile(matmul_id_graph(2, 1, 1, 3, 20, 64), device="vulkan:range=4096")
    plan.set_param("w", np.ones((3, 20, 64), np.float32))
    with pytest.raises(rlx.Error, match=r"node \d+ \(matmul_id\): one expert's weight of 5120 bytes exceeds the \d+ "
                                        r"bytes one binding may span on this device \(maxStorageBufferRange\)"):
        plan.run({"a": np.ones((2, 1, 64), np.float32), "ids": np.zeros((2, 1), np.int32)})
    plan = rlx.compile(topk_graph(2, 600, 2), device="vulkan:range=4096")
    with pytest.raises(rlx.Error, match=r"node \d+ \(topk\): the 4800 bytes of one row's \(value, index\) pairs "
                                        r"exceed the \d+ bytes one binding may span"):
        plan.run({"x": np.ones((2, 600), np.float32)})
