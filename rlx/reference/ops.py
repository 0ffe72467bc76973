"""NumPy reference implementations of rlx's ops: the oracle for the C kernels.

Each function takes NumPy arrays, computes in float64 where rounding matters, and returns
float32 (shape ops keep their input dtype). The semantics are exactly those of the op comments
in csrc/include/rlx/rlx.h and csrc/backends/kernels.h; any difference is a bug on one side.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["matmul", "embedding", "rmsnorm", "add_rmsnorm", "rope", "softmax", "silu", "silu_mul",
           "add", "mul", "attention", "convert", "gather_last", "concat", "slice", "reshape", "topk", "matmul_id",
           "moe_combine", "moe_ffn"]


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def matmul(a, b, trans_b: bool = False) -> np.ndarray:
    """a (..., K) @ b -> (..., N); b is (N, K) read transposed when trans_b, else (K, N)."""
    b = _f64(b)
    if trans_b:
        b = b.T
    if np.shape(a)[-1] != b.shape[0]:
        raise ValueError(f"matmul: a {np.shape(a)} and b {b.shape} (trans_b={trans_b}) do not fit")
    return (_f64(a) @ b).astype(np.float32)


def matmul_lowp(a, b) -> np.ndarray:
    """a (..., K) f32 @ b^T with b (N, K) stored as bfloat16 or float16 (rlx's low-precision
    weights): bf16 weights multiply a ROUNDED to bf16 (nearest even, as ml_dtypes rounds), f16
    weights the exact f32 a; products are exact and summed in float64 here."""
    b = np.asarray(b)
    a = np.asarray(a, dtype=np.float32)
    if b.dtype == np.dtype(ml_dtypes.bfloat16):
        a = a.astype(ml_dtypes.bfloat16)
    elif b.dtype != np.float16:
        raise ValueError(f"matmul_lowp: b must be bfloat16 or float16, got {b.dtype}")
    return (_f64(a.astype(np.float32)) @ _f64(b.astype(np.float32)).T).astype(np.float32)


def embedding(table, ids) -> np.ndarray:
    """table (V, D), integer ids (...) -> (..., D). An id outside [0, V) raises IndexError."""
    table = np.asarray(table)
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise IndexError(f"embedding: id out of range [0, {table.shape[0]})")
    return table[ids].astype(np.float32)


def rmsnorm(x, w, eps: float) -> np.ndarray:
    """x (..., D), w (D) -> x / sqrt(mean(x^2) + eps) * w over the last axis."""
    x = _f64(x)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * r * _f64(w)).astype(np.float32)


def add_rmsnorm(a, b, w, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(sum, out): sum = a + b rounded to float32; out = rmsnorm(sum, w, eps)."""
    s = (np.asarray(a, np.float32) + np.asarray(b, np.float32)).astype(np.float32)
    return s, rmsnorm(s, w, eps)


def rope(x, pos, inv_freq, interleaved: bool = False) -> np.ndarray:
    """RoPE of x (S, H, D) at integer positions pos (S) with inv_freq (D/2). For i < D/2,
    t = pos * inv_freq[i] rounded to float32 (as transformers and the C kernel do), and the pair
    (a, b) = (i, i + D/2) (rotate-half), or (2i, 2i + 1) when interleaved:
    out[a] = x[a] cos t - x[b] sin t,  out[b] = x[b] cos t + x[a] sin t."""
    if interleaved:  # the same rotation on pairs brought next to each other
        x = np.asarray(x)
        d = x.shape[-1]
        order = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
        out = np.empty(x.shape, np.float32)
        out[..., order] = rope(x[..., order], pos, inv_freq)
        return out
    x = _f64(x)
    half = x.shape[-1] // 2
    inv_freq = np.asarray(inv_freq, np.float32)
    if x.ndim != 3 or inv_freq.shape != (half,) or 2 * half != x.shape[-1]:
        raise ValueError(f"rope: x {x.shape} (S, H, D even) and inv_freq {inv_freq.shape} (D/2) do not fit")
    t = (np.asarray(pos).astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)  # (S, D/2)
    cos, sin = np.cos(t)[:, None, :], np.sin(t)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def softmax(x) -> np.ndarray:
    """Softmax over the last axis."""
    x = _f64(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def silu(x) -> np.ndarray:
    """x * sigmoid(x)."""
    x = _f64(x)
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


def silu_mul(a, b) -> np.ndarray:
    """silu(a) * b (same shapes)."""
    a = _f64(a)
    return (a / (1.0 + np.exp(-a)) * _f64(b)).astype(np.float32)


def _check_suffix(name: str, a: np.ndarray, b: np.ndarray) -> None:
    if b.ndim > a.ndim or a.shape[a.ndim - b.ndim:] != b.shape:
        raise ValueError(f"{name}: b {b.shape} is not a suffix of a's shape {a.shape}")


def add(a, b) -> np.ndarray:
    """a (...) + b, b's shape a suffix of a's (broadcast over the leading dims)."""
    a, b = np.asarray(a), np.asarray(b)
    _check_suffix("add", a, b)
    return (_f64(a) + _f64(b)).astype(np.float32)


def mul(a, b) -> np.ndarray:
    """a (...) * b, broadcast as add."""
    a, b = np.asarray(a), np.asarray(b)
    _check_suffix("mul", a, b)
    return (_f64(a) * _f64(b)).astype(np.float32)


def attention(q, k, v, mask=None, scale: float | None = None, causal: bool = True, window: int = 0) -> np.ndarray:
    """Grouped-query attention -> (S, Hq, D).

    q (S, Hq, D); k, v (T, Hkv, D), T >= S: the keys of positions 0..T-1, the queries at positions
    P + i with P = T - S (a cache: the past, then the new rows). Query head h uses kv head
    h // (Hq // Hkv). scores = scale * q.k (scale defaults to 1/sqrt(D)). Key j is visible to
    query i when: causal -> j <= P + i; window > 0 -> also j > P + i - window (i.e. the query's
    position minus the key's position is < window); a bool/uint8 mask (S, T) -> mask[i, j]
    nonzero; a float mask (S, T) is added to the scores. A query row with no visible key (or
    all scores -inf) produces zeros."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    S, Hq, D = q.shape
    T, Hkv = k.shape[0], k.shape[1]
    if k.shape != (T, Hkv, D) or v.shape != k.shape or Hq % Hkv or T < S:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    P = T - S
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    group = Hq // Hkv
    kk = np.repeat(k, group, axis=1)  # (P+S, Hq, D): head h -> kv head h // group
    vv = np.repeat(v, group, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, kk) * scale  # (Hq, S, P+S)

    i = np.arange(S)[:, None]
    j = np.arange(P + S)[None, :]
    visible = np.ones((S, P + S), dtype=bool)
    if causal:
        visible &= j <= P + i
    if window > 0:
        visible &= j > P + i - window
    if mask is not None:
        mask = np.asarray(mask)
        if mask.shape != (S, P + S):
            raise ValueError(f"attention: mask {mask.shape}, expected {(S, P + S)}")
        if mask.dtype.kind == "f":
            scores = scores + mask.astype(np.float64)[None]
        else:
            visible &= mask != 0
    scores = np.where(visible[None], scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(row_max)  # no visible key: the row's output is zeros
    e = np.where(empty, 0.0, np.exp(scores - np.where(empty, 0.0, row_max)))
    denom = e.sum(axis=-1, keepdims=True)
    p = e / np.where(denom == 0, 1.0, denom)
    out = np.einsum("hij,jhd->ihd", p, vv)
    return out.astype(np.float32)


def convert(x, dtype: str) -> np.ndarray:
    """x f32 -> "f32", "f16" or "bf16" (float32, float16, ml_dtypes.bfloat16 arrays), each value
    rounded to nearest even (NumPy's and ml_dtypes' casts)."""
    target = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    with np.errstate(over="ignore"):  # values past the largest finite one become inf, by definition
        return np.asarray(x, dtype=np.float32).astype(target)


def gather_last(x) -> np.ndarray:
    """x (S, ...) -> (1, ...): the last row along axis 0 (dtype kept)."""
    x = np.asarray(x)
    return x[-1:].copy()


def concat(a, b, axis: int) -> np.ndarray:
    """a, b concatenated along axis (same dtype, kept)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        raise ValueError(f"concat: dtypes {a.dtype} and {b.dtype} differ")
    return np.concatenate([a, b], axis=axis)


def slice(x, axis: int, start: int, length: int) -> np.ndarray:  # noqa: A001 - the op's name
    """x[start : start+length] along axis; a negative start counts from the end. The range must
    lie inside the axis (dtype kept)."""
    x = np.asarray(x)
    n = x.shape[axis]
    if start < 0:
        start += n
    if start < 0 or length < 0 or start + length > n:
        raise ValueError(f"slice: [{start}, {start + length}) outside axis {axis} of size {n}")
    index = [np.s_[:]] * x.ndim
    index[axis] = np.s_[start:start + length]
    return x[tuple(index)].copy()


def reshape(x, shape) -> np.ndarray:
    """Same data in a new shape (element counts must agree; dtype kept)."""
    x = np.asarray(x)
    shape = tuple(shape)
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ValueError(f"reshape: {x.shape} has {x.size} elements, {shape} needs {int(np.prod(shape))}")
    return x.reshape(shape).copy()


def topk(x, k: int) -> np.ndarray:
    """x (..., N) -> int32 (..., k): indices of the k largest values of each row, largest first. Ties
    here go to the lower index (a stable sort); rlx promises torch.topk's choice among equal values,
    which only torch itself can check (tests compare with it on inputs with ties)."""
    x = np.asarray(x, dtype=np.float32)
    if not 1 <= k <= x.shape[-1]:
        raise ValueError(f"topk: k={k} outside [1, {x.shape[-1]}]")
    order = np.argsort(-x.astype(np.float64), axis=-1, kind="stable")
    return order[..., :k].astype(np.int32)


def matmul_id(a, ids, w) -> np.ndarray:
    """a (S, A, K) with A = 1 or n, ids (S, n), w (E, N, K) -> (S, n, N): row j of token s is
    a[s, 0 if A == 1 else j] @ w[ids[s, j]]^T (float64 sums). w may be float32 or, as matmul_lowp
    reads them, bfloat16 / float16 (bf16 experts multiply a rounded to bf16)."""
    a, ids, w = np.asarray(a, dtype=np.float32), np.asarray(ids), np.asarray(w)
    S, A, K = a.shape
    n = ids.shape[1]
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        raise IndexError(f"matmul_id: expert id out of range [0, {w.shape[0]})")
    out = np.empty((S, n, w.shape[1]), np.float32)
    for s in range(S):
        for j in range(n):
            row = a[s, 0 if A == 1 else j][None, :]
            e = w[ids[s, j]]
            out[s, j] = (matmul(row, e, trans_b=True) if e.dtype == np.float32 else matmul_lowp(row, e))[0]
    return out


def moe_combine(y, probs, ids, norm: bool = False) -> np.ndarray:
    """y (S, n, H), probs (S, E), ids (S, n) -> (S, H): sum over j of w[s, j] * y[s, j] with
    w[s, j] = probs[s, ids[s, j]], divided by their sum over j when norm (float64)."""
    y, probs, ids = _f64(y), _f64(probs), np.asarray(ids)
    w = np.take_along_axis(probs, ids.astype(np.int64), axis=1)
    if norm:
        w = w / w.sum(axis=1, keepdims=True)
    return np.einsum("sn,snh->sh", w, y).astype(np.float32)


def moe_ffn(x, router, gate, up, down, k: int, norm: bool) -> np.ndarray:
    """A Qwen3-MoE sparse block on x (S, H): router (E, H), gate / up (E, F, H), down (E, H, F): softmax
    of the router logits, the top k experts (ties: the lower index), each expert's SwiGLU
    down(silu(gate x) * up x), summed with the (renormalised when norm) probabilities."""
    x = np.asarray(x, dtype=np.float32)
    probs = softmax(matmul(x, router, trans_b=True))
    ids = topk(probs, k)
    g = matmul_id(x[:, None, :], ids, gate)
    u = matmul_id(x[:, None, :], ids, up)
    return moe_combine(matmul_id(silu_mul(g, u), ids, down), probs, ids, norm)
