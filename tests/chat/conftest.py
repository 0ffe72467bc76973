"""Fixtures for the chat / completions / server tests.

`qwen3_dir`: a Hugging Face directory with a random-weight Qwen3 (2 tiny layers, the real 151,936
vocabulary) and the real Qwen3 tokenizer and chat template: the tokenizer is built by transformers
from ../shared/tokenizers/qwen2 (vocab.json, merges.txt, Qwen3's tokenizer_config.json) and saved
with save_pretrained (tokenizer.json, tokenizer_config.json, chat_template.jinja), as a downloaded
Qwen3 would have them; generation_config.json is Qwen3-0.6B's (eos ids, sampling defaults).
Its text is meaningless; what the tests check is the plumbing, against transformers and the openai
client. `stories`: the path of stories260K (a real SentencePiece Llama without a chat template).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from chat_paths import QWEN2_TOK, STORIES, TEMPLATES, needs_qwen_tokenizer, needs_stories  # noqa: F401

import rlx
from rlx.weights import expected_weights

QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
    "torch_dtype": "float32",
}
# Qwen3-0.6B's generation_config.json
QWEN3_GENERATION = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
                    "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


def write_random_weights(path: Path, seed: int = 0) -> None:
    from safetensors.numpy import save_file

    cfg = rlx.load_config(path)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_weights(cfg).items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        weights[name] = a.astype(np.float32)
    save_file(weights, str(path / "model.safetensors"))


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    if not (QWEN2_TOK / "vocab.json").is_file():
        pytest.skip(f"no Qwen2 tokenizer files at {QWEN2_TOK}")
    transformers = pytest.importorskip("transformers")
    src = tmp_path_factory.mktemp("qwen3_tokenizer_src")
    for name in ("vocab.json", "merges.txt"):
        (src / name).write_bytes((QWEN2_TOK / name).read_bytes())
    (src / "tokenizer_config.json").write_bytes((QWEN2_TOK / "qwen3_tokenizer_config.json").read_bytes())
    path = tmp_path_factory.mktemp("qwen3_random")
    transformers.AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(path))
    (path / "config.json").write_text(json.dumps(QWEN3_CONFIG))
    (path / "generation_config.json").write_text(json.dumps(QWEN3_GENERATION))
    write_random_weights(path)
    return path


@pytest.fixture(scope="session")
def qwen3_hf_tokenizer(qwen3_dir):
    """transformers' tokenizer of qwen3_dir: the oracle for templates and ids."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen3_dir))
