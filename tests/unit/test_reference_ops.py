"""The NumPy op references (rlx.reference.ops) against PyTorch and transformers: the oracle is
itself checked against code this project did not write."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.reference import ops

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(42)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def sdpa(q, k, v, allowed, scale=None):
    """torch's scaled_dot_product_attention on (S, H, D) arrays with GQA expanded by
    repeat_interleave and an explicit boolean (S, P+S) mask (True = attend)."""
    group = q.shape[1] // k.shape[1]
    qq = t(q).transpose(0, 1)[None]
    kk = t(k).repeat_interleave(group, dim=1).transpose(0, 1)[None]
    vv = t(v).repeat_interleave(group, dim=1).transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=t(allowed), scale=scale)
    return out[0].transpose(0, 1).numpy()


@pytest.mark.parametrize("Hq, Hkv", [(4, 4), (4, 2), (8, 2)])
@pytest.mark.parametrize("S, P", [(1, 0), (6, 0), (1, 5), (3, 4)])
@pytest.mark.parametrize("window", [0, 3])
def test_attention_vs_sdpa(Hq, Hkv, S, P, window):
    D = 8
    q, kf, vf = randn(S, Hq, D), randn(P + S, Hkv, D), randn(P + S, Hkv, D)  # keys: a past of P, then S new
    i, j = np.arange(S)[:, None], np.arange(P + S)[None, :]
    allowed = (j <= P + i) & ((j > P + i - window) if window else True)
    got = ops.attention(q, kf, vf, window=window)
    np.testing.assert_allclose(got, sdpa(q, kf, vf, allowed), atol=2e-6, rtol=1e-5)


def test_attention_masks_vs_sdpa():
    S, P, Hq, Hkv, D = 4, 3, 4, 2, 8
    q, kf, vf = randn(S, Hq, D), randn(P + S, Hkv, D), randn(P + S, Hkv, D)
    allowed = RNG.random((S, P + S)) < 0.6
    allowed[:, 0] = True
    # boolean / uint8 mask without causality
    np.testing.assert_allclose(ops.attention(q, kf, vf, mask=allowed.astype(np.uint8), causal=False),
                               sdpa(q, kf, vf, allowed), atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(ops.attention(q, kf, vf, mask=allowed, causal=False, scale=0.3),
                               sdpa(q, kf, vf, allowed, scale=0.3), atol=2e-6, rtol=1e-5)
    # additive float mask on top of causality
    add = randn(S, P + S)
    causal = np.arange(P + S)[None, :] <= P + np.arange(S)[:, None]
    qq = t(q).transpose(0, 1)[None]
    kk = t(kf).repeat_interleave(2, dim=1).transpose(0, 1)[None]
    vv = t(vf).repeat_interleave(2, dim=1).transpose(0, 1)[None]
    float_mask = torch.where(t(causal), t(add), torch.tensor(float("-inf")))
    want = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=float_mask)[0].transpose(0, 1).numpy()
    np.testing.assert_allclose(ops.attention(q, kf, vf, mask=add), want, atol=2e-6, rtol=1e-5)


def test_attention_fully_masked_row_is_zero():
    S, Hq, D = 3, 2, 4
    q, k, v = randn(S, Hq, D), randn(S, 1, D), randn(S, 1, D)
    mask = np.ones((S, S), np.uint8)
    mask[1] = 0
    out = ops.attention(q, k, v, mask=mask)
    assert np.all(out[1] == 0) and np.all(np.isfinite(out))
    fmask = np.zeros((S, S), np.float32)
    fmask[2] = -np.inf
    out = ops.attention(q, k, v, mask=fmask, causal=False)
    assert np.all(out[2] == 0) and np.all(np.isfinite(out))


def test_rope_vs_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    S, H, D = 6, 3, 16
    cfg = transformers.LlamaConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    rotary = LlamaRotaryEmbedding(cfg)
    pos = np.array([0, 1, 5, 17, 300, 4095], np.int32)
    x = randn(S, H, D)
    cos, sin = rotary(t(x), torch.from_numpy(pos.astype(np.int64))[None])
    xt = t(x).transpose(0, 1)[None]  # (1, H, S, D)
    want, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
    got = ops.rope(x, pos, rotary.inv_freq.numpy())
    np.testing.assert_allclose(got, want[0].transpose(0, 1).numpy(), atol=3e-6, rtol=1e-5)


def test_rmsnorm_vs_transformers():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, w = randn(5, 3, 24) * 3, randn(24)
    norm = LlamaRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(t(w))
        want = norm(t(x)).numpy()
    np.testing.assert_allclose(ops.rmsnorm(x, w, 1e-5), want, atol=1e-6, rtol=1e-5)
    b = randn(5, 3, 24)
    s, out = ops.add_rmsnorm(x, b, w, 1e-5)
    np.testing.assert_array_equal(s, x + b)
    with torch.no_grad():
        np.testing.assert_allclose(out, norm(t(x + b)).numpy(), atol=1e-6, rtol=1e-5)


def test_elementwise_and_matmul_vs_torch():
    x = randn(4, 7) * 4
    np.testing.assert_allclose(ops.softmax(x), torch.softmax(t(x), -1).numpy(), atol=1e-7, rtol=1e-5)
    np.testing.assert_allclose(ops.silu(x), F.silu(t(x)).numpy(), atol=1e-6, rtol=1e-5)
    y = randn(4, 7)
    np.testing.assert_allclose(ops.silu_mul(x, y), (F.silu(t(x)) * t(y)).numpy(), atol=1e-6, rtol=1e-5)
    a, b, bt = randn(2, 3, 5), randn(5, 6), randn(6, 5)
    np.testing.assert_allclose(ops.matmul(a, b), (t(a) @ t(b)).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ops.matmul(a, bt, trans_b=True), F.linear(t(a), t(bt)).numpy(), atol=1e-5, rtol=1e-5)
    table, ids = randn(9, 4), np.array([[0, 8], [3, 3]])
    np.testing.assert_array_equal(ops.embedding(table, ids), F.embedding(t(ids), t(table)).numpy())
    with pytest.raises(IndexError):
        ops.embedding(table, np.array([9]))
    with pytest.raises(IndexError):
        ops.embedding(table, np.array([-1]))
    c = randn(3, 5)
    np.testing.assert_array_equal(ops.add(a, c), (t(a) + t(c)).numpy())
    np.testing.assert_array_equal(ops.mul(a, c[0]), (t(a) * t(c[0])).numpy())
    with pytest.raises(ValueError):
        ops.add(a, randn(2, 5))


def test_shape_ops():
    x = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    np.testing.assert_array_equal(ops.gather_last(x), x[3:4])
    np.testing.assert_array_equal(ops.slice(x, 0, -2, 2), x[2:4])
    np.testing.assert_array_equal(ops.slice(x, 1, 1, 2), x[:, 1:3])
    np.testing.assert_array_equal(ops.slice(x, -1, 0, 1), x[..., :1])
    with pytest.raises(ValueError):
        ops.slice(x, 0, 3, 2)
    np.testing.assert_array_equal(ops.concat(x, x[:1], 0), np.concatenate([x, x[:1]]))
    ids = np.arange(3, dtype=np.int32)
    assert ops.concat(ids, ids, 0).dtype == np.int32
    np.testing.assert_array_equal(ops.reshape(x, (6, 4)), x.reshape(6, 4))
    with pytest.raises(ValueError):
        ops.reshape(x, (5, 5))
