"""A complete NumPy decoder (Llama, Qwen3, Qwen3-MoE) built from rlx.reference.ops, written from the
math rather than from any runtime: the second oracle for rlx's graphs, after transformers.

Per layer, with x the residual stream (S, H):
    h = rmsnorm(x, input_layernorm)
    q, k, v = h @ Wq^T (+bq), h @ Wk^T (+bk), h @ Wv^T (+bv)        reshaped to (S, heads, D)
    Qwen3 only: q = rmsnorm(q, q_norm), k = rmsnorm(k, k_norm)      per head, over D
    q, k = rope(q, pos), rope(k, pos)                               pos = 0..S-1, cfg.rope_inv_freq()
    a = causal GQA attention(q, k, v, window = cfg.layer_window(layer)), scale 1/sqrt(D)
    x = x + a @ Wo^T (+bo)
    h = rmsnorm(x, post_attention_layernorm)
    x = x + (silu(h @ Wg^T (+bg)) * (h @ Wu^T (+bu))) @ Wd^T (+bd)
    (a sparse layer: x = x + ops.moe_ffn(h, router, experts, k, norm_topk_prob): softmax of h @ router^T,
    its top k experts, their SwiGLU outputs weighted by the (renormalised) probabilities)
then logits = rmsnorm(x, model.norm) @ lm_head^T (lm_head = embed_tokens when tied).
"""

from __future__ import annotations

import numpy as np

from rlx.reference import ops
from rlx.weights import check_weights

__all__ = ["forward"]


def _linear(w: dict, name: str, x: np.ndarray) -> np.ndarray:
    y = ops.matmul(x, w[name + ".weight"], trans_b=True)
    bias = w.get(name + ".bias")
    return y if bias is None else ops.add(y, bias)


def _stacked(experts) -> np.ndarray:
    """A projection's experts (E, out, in): the stacked tensor, or its parts (check_weights' list)."""
    return np.stack(experts) if isinstance(experts, list) else experts


def forward(cfg, weights: dict, ids, kv_dtype: str = "f32", kv_rows=None, kv_out: list | None = None) -> np.ndarray:
    """Logits (S, V) float32 for token ids (S,) at positions 0..S-1, with K and V rounded to
    kv_dtype ("f32", "f16", "bf16") before attention, as rlx's KV cache stores them. weights are
    checked with rlx.weights.check_weights first (WeightsError on missing / extra / mis-shaped
    tensors) and used as float64 (f32 math).

    kv_rows: per layer, (K, V) of (S, kv heads, D) to attend over instead of the rows computed here
    (e.g. an engine's cache rows: two correct computations of a row may round it to 16 bits one
    unit apart, and this pins that choice). kv_out: a list that gets each layer's (K, V) as used."""
    w = check_weights(cfg, weights, dtype="f32")
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    S, D = ids.shape[0], cfg.head_dim
    Hq, Hkv, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps
    inv_freq = cfg.rope_inv_freq()
    pos = np.arange(S, dtype=np.int32)

    x = ops.embedding(w["model.embed_tokens.weight"], ids)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = ops.rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = _linear(w, p + "self_attn.q_proj", h).reshape(S, Hq, D)
        k = _linear(w, p + "self_attn.k_proj", h).reshape(S, Hkv, D)
        v = _linear(w, p + "self_attn.v_proj", h).reshape(S, Hkv, D)
        if cfg.qk_norm:
            q = ops.rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = ops.rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = ops.rope(q, pos, inv_freq, cfg.rope_interleaved)
        k = ops.convert(ops.rope(k, pos, inv_freq, cfg.rope_interleaved), kv_dtype)
        v = ops.convert(v, kv_dtype)
        if kv_rows is not None:
            k, v = (np.asarray(r).astype(k.dtype) for r in kv_rows[layer])
            if k.shape != (S, Hkv, D) or v.shape != (S, Hkv, D):
                raise ValueError(f"kv_rows[{layer}]: shapes {k.shape} / {v.shape}, want {(S, Hkv, D)}")
        if kv_out is not None:
            kv_out.append((k, v))
        a = ops.attention(q, k, v, causal=True, window=cfg.layer_window(layer))
        x = ops.add(x, _linear(w, p + "self_attn.o_proj", a.reshape(S, Hq * D)))

        h = ops.rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        if cfg.layer_sparse(layer):
            experts = [np.asarray(_stacked(w[p + f"mlp.experts.{proj}.weight"])) for proj in ("gate_proj", "up_proj",
                                                                                             "down_proj")]
            x = ops.add(x, ops.moe_ffn(h, w[p + "mlp.gate.weight"], *experts, cfg.num_experts_per_tok,
                                       cfg.norm_topk_prob))
            continue
        gate = _linear(w, p + "mlp.gate_proj", h)
        up = _linear(w, p + "mlp.up_proj", h)
        x = ops.add(x, _linear(w, p + "mlp.down_proj", ops.silu_mul(gate, up)))

    x = ops.rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return ops.matmul(x, head, trans_b=True)
