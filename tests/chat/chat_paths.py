"""Paths and skip marks shared by the chat tests (a module of its own: `from conftest import ...`
picks whichever conftest.py pytest imported first when several test directories run together)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K" / "hf"
QWEN2_TOK = SHARED / "tokenizers" / "qwen2"
TEMPLATES = SHARED / "tokenizers" / "chat_templates"

needs_stories = pytest.mark.skipif(not (STORIES / "config.json").is_file(), reason=f"no stories260K at {STORIES}")
needs_qwen_tokenizer = pytest.mark.skipif(not (QWEN2_TOK / "vocab.json").is_file(),
                                          reason=f"no Qwen2 tokenizer files at {QWEN2_TOK}")
