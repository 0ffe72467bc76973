"""Small random-initialised Hugging Face models (transformers, PyTorch CPU, float32): the outside
oracle for rlx's models.

`HF_CASES` maps a case name to (family, config kwargs); `build(family, kwargs)` makes the model,
`hf_logits(model, ids)` gives its (S, V) logits, `case_ids(model, n)` a prompt. The `hf_model`
fixture (conftest.py beside this file) saves each case once per session with save_pretrained.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_LLAMA = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2)
_QWEN3 = dict(vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
              rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
              bos_token_id=None, eos_token_id=[3, 5])

_QWEN3_MOE = dict(vocab_size=131, hidden_size=64, intermediate_size=96, moe_intermediate_size=40,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                  num_experts=4, num_experts_per_tok=1, norm_topk_prob=False, bos_token_id=None, eos_token_id=[3])

# name -> (family, kwargs of the transformers config class)
HF_CASES: dict[str, tuple[str, dict]] = {
    "llama_gqa1_untied": ("llama", dict(_LLAMA)),
    "llama_gqa2_tied": ("llama", dict(_LLAMA, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama_gqa4": ("llama", dict(_LLAMA, num_attention_heads=8, num_key_value_heads=2, vocab_size=256)),
    "llama_rope_llama3": ("llama", dict(_LLAMA, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 64})),
    "llama_head_dim": ("llama", dict(_LLAMA, hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                                     head_dim=16)),
    "llama_bias": ("llama", dict(_LLAMA, num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    "qwen3_tied": ("qwen3", dict(_QWEN3)),
    "qwen3_bias_gqa4": ("qwen3", dict(_QWEN3, num_key_value_heads=1, attention_bias=True,
                                      tie_word_embeddings=False, num_hidden_layers=3)),
    "qwen3_sliding": ("qwen3", dict(_QWEN3, num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                                    max_window_layers=1)),
    # Qwen3-MoE: expert counts 4 / 8 / 16, top-k 1 / 2 / 8, norm_topk_prob both ways, dense layers mixed in
    # (mlp_only_layers, decoder_sparse_step), tied embeddings
    "qwen3moe_e4_k1": ("qwen3_moe", dict(_QWEN3_MOE)),
    "qwen3moe_e8_k2_norm_dense": ("qwen3_moe", dict(_QWEN3_MOE, num_hidden_layers=3, num_experts=8,
                                                    num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1])),
    "qwen3moe_e16_k8_step2": ("qwen3_moe", dict(_QWEN3_MOE, num_hidden_layers=3, num_experts=16,
                                                num_experts_per_tok=8, decoder_sparse_step=2, tie_word_embeddings=True,
                                                moe_intermediate_size=24)),
    # every layer sparse and renormalised, tied: the form llama.cpp's qwen3moe (GGUF) has
    "qwen3moe_e6_k3_norm": ("qwen3_moe", dict(_QWEN3_MOE, num_experts=6, num_experts_per_tok=3, norm_topk_prob=True,
                                              moe_intermediate_size=32, tie_word_embeddings=True)),
}


_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
            "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM")}


def build(family: str, kwargs: dict):
    cls_cfg, cls_model = (getattr(transformers, n) for n in _CLASSES[family])
    config = cls_cfg(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(1234)
    model = cls_model(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.25 * torch.randn_like(p))  # norms too, so q/k norms are not all ones
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 0.25)
            else:
                p.normal_(0.0, 0.15)
    return model


def hf_logits(model, ids) -> np.ndarray:
    """Logits (S, V) float32 of transformers' model for token ids (S,), positions 0..S-1."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


def case_ids(model, n: int = 13, seed: int = 0) -> np.ndarray:
    """n deterministic token ids valid for the model's vocabulary."""
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, n)
