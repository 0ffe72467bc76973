"""The tokenizer rebuilt from a GGUF file's metadata (rlx.gguf_tokenizer) against llama.cpp's own
tokenizer test vectors (../shared/tokenizers/vectors, from llama.cpp's models/ directory):
Llama 2 SentencePiece (llama-spm), Llama 3 byte-level BPE (llama-bpe), Qwen2 byte-level BPE.

The vectors are read exactly as llama.cpp's tests/test-tokenizer-0.cpp reads them: the .inp
file is split on "\\n__ggml_vocab_test__\\n" (nothing is stripped from the strings; the split
stops at the end of the file, so the trailing separator adds no empty string), the .out file
holds one line of space-separated ids per string (surrounding whitespace stripped). The test
tokenizes with add_special = false (no BOS) and parse_special = false (control tokens in the
text are plain text); every string must give exactly the expected ids. decode(encode(s))
must give s back: llama.cpp's test does not check this, but these tokenizers are lossless on
all of the strings (byte-level BPE always; SPM strips only the space it prepended).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from rlx.gguf import GGUFFile
from rlx.gguf_tokenizer import GGUFTokenizer
from rlx.tokenizer import Tokenizer

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "tokenizers" / "vectors"
VOCABS = ("llama-spm", "llama-bpe", "qwen2")
SEP = "\n__ggml_vocab_test__\n"

pytestmark = pytest.mark.skipif(
    not all((VECTORS / f"ggml-vocab-{v}.gguf.out").is_file() for v in VOCABS),
    reason=f"llama.cpp's tokenizer vectors not found under {VECTORS} (the shared directory beside the repo)")


@functools.cache
def read_vectors(vocab: str) -> list[tuple[str, list[int]]]:
    raw = (VECTORS / f"ggml-vocab-{vocab}.gguf.inp").read_bytes().decode("utf-8")
    inputs, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    lines = (VECTORS / f"ggml-vocab-{vocab}.gguf.out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # std::getline yields no line after the final newline
    assert len(inputs) == len(lines), f"{vocab}: {len(inputs)} strings but {len(lines)} id lines"
    return [(s, [int(x) for x in line.strip().split(" ") if x]) for s, line in zip(inputs, lines, strict=True)]


N_VECTORS = 46  # per vocabulary, as llama.cpp's reader counts them


@pytest.fixture(scope="module")
def tokenizers():
    return {v: Tokenizer.from_gguf(VECTORS / f"ggml-vocab-{v}.gguf") for v in VOCABS}


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("i", range(N_VECTORS))
def test_vector_exact(tokenizers, vocab, i):
    vectors = read_vectors(vocab)
    assert len(vectors) == N_VECTORS
    text, want = vectors[i]
    tok = tokenizers[vocab]
    got = tok.encode(text, add_bos=False, parse_special=False)
    assert got == want, f"{vocab} #{i} {text!r}"
    assert tok.encode(text, add_bos=False) == want  # no control-token text in the vectors
    assert tok.decode(got) == text


def test_vocab_facts(tokenizers):
    spm, bpe, qwen = (tokenizers[v] for v in VOCABS)
    assert isinstance(spm, GGUFTokenizer) and isinstance(spm, Tokenizer)
    assert (spm.model, spm.bos_id, spm.eos_token_id, spm.vocab_size) == ("llama", 1, 2, 32000)
    # llama.cpp adds BOS for pre "llama-bpe" even without add_bos_token; never for qwen2 here
    assert (bpe.model, bpe.pre, bpe.bos_id, bpe.eos_token_id, bpe.vocab_size) == \
        ("gpt2", "llama-bpe", 128000, 128001, 128256)
    assert (qwen.model, qwen.pre, qwen.bos_id, qwen.eos_token_id) == ("gpt2", "qwen2", None, 151643)
    assert spm.encode("Hello world") == [1, 15043, 3186]
    assert bpe.encode("Hello world") == [128000, 9906, 1917]
    assert qwen.encode("Hello world") == [9707, 1879]


def test_special_tokens(tokenizers):
    spm, bpe, qwen = (tokenizers[v] for v in VOCABS)
    # control tokens are matched only when parse_special; llama.cpp prefixes a space after them (SPM)
    assert spm.encode("<s>Hi</s> yo", add_bos=False) == spm.encode("<s>", add_bos=False) + \
        spm.encode("Hi", add_bos=False) + [2] + spm.encode(" yo", add_bos=False)
    assert spm.encode("<s>", add_bos=False) == [1]
    assert spm.encode("<s>", add_bos=False, parse_special=False) != [1]
    ids = bpe.encode("<|start_header_id|>user<|end_header_id|>", add_bos=False)
    assert ids == [128006, 882, 128007]
    assert bpe.decode(ids) == "<|start_header_id|>user<|end_header_id|>"
    ids = qwen.encode("<|im_start|>user\nHi<|im_end|>", add_bos=False)
    assert ids[0] == 151644 and ids[-1] == 151645 and 151644 not in qwen.encode("<|im_start|>", parse_special=False)
    # user-defined tokens are matched even without parse_special (llama.cpp's rule)
    assert qwen.encode("[PAD151935]", parse_special=False) == [151935]


def test_decode_continuation_streams_utf8(tokenizers):
    # as rlx.api streams: prefix = the prompt, new = every token generated so far; multi-byte
    # characters split over byte tokens (🦙 is 3-4 tokens in all three) are held back whole
    for vocab in VOCABS:
        tok = tokenizers[vocab]
        prompt = tok.encode("Say:")
        new = tok.encode(" Grüße 🦙 aus Köln 😁", add_bos=False)
        emitted = ""
        for n in range(1, len(new) + 1):
            text = tok.decode_continuation(prompt, new[:n])
            assert text.startswith(emitted) and "\ufffd" not in text
            emitted = text
        assert emitted == tok.decode(prompt + new)[len(tok.decode(prompt)):]
        assert emitted.endswith(" Grüße 🦙 aus Köln 😁")  # SPM: plus the space prefix of the encode


def test_from_gguf_accepts_open_file_and_chat_template():
    f = GGUFFile(VECTORS / "ggml-vocab-qwen2.gguf")
    assert f.chat_template is not None and f.chat_template.startswith("{% for message in messages %}")
    assert Tokenizer.from_gguf(f).encode("Hello world") == [9707, 1879]
    assert GGUFFile(VECTORS / "ggml-vocab-llama-spm.gguf").chat_template is None
