"""Tokenizer.from_dir: which tokenizer a model directory holds (tokenizer.json, tokenizer.model,
one *.model) and what it raises when the directory is wrong: FileNotFoundError for a path that
does not exist, rlx.ConfigError for everything else (a file instead of the directory, no or
several tokenizers, unusable tokenizer files, a FIFO or a directory where a file belongs).
tests/fuzz/tokenizer_dir.py fuzzes the same entry point coverage-guided."""

from __future__ import annotations

import io
import os
import signal
import sys

import pytest

from rlx.errors import ConfigError
from rlx.tokenizer import HFTokenizer, SentencePieceTokenizer, Tokenizer

tokenizers = pytest.importorskip("tokenizers")
spm = pytest.importorskip("sentencepiece")


def tokenizer_json() -> str:
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "<s>": 3},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return tok.to_str()


def sentencepiece_model() -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["hello world", "the cat sat on the mat"] * 20),
                                   model_writer=buf, vocab_size=20, model_type="char", minloglevel=2,
                                   normalization_rule_name="identity", character_coverage=1.0)
    return buf.getvalue()


@pytest.fixture(autouse=True)
def no_hang():
    """A test that blocks (opening a FIFO) fails after 20 s instead of hanging the suite."""
    def boom(*_):
        raise TimeoutError("Tokenizer.from_dir blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_detection(tmp_path):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>", "add_bos_token": true}')
    tok = Tokenizer.from_dir(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.bos_id == 3 and tok.encode("hello world") == [3, 1, 2]
    sp = tmp_path / "sp"
    sp.mkdir()
    (sp / "tok512.model").write_bytes(sentencepiece_model())
    assert isinstance(Tokenizer.from_dir(sp), SentencePieceTokenizer)
    (sp / "other.model").write_bytes(b"x")
    with pytest.raises(ConfigError, match="several SentencePiece models"):
        Tokenizer.from_dir(sp)
    os.rename(sp / "tok512.model", sp / "tokenizer.model")  # tokenizer.model wins over other *.model
    assert isinstance(Tokenizer.from_dir(sp), SentencePieceTokenizer)


def test_directory_names_are_not_glob_patterns(tmp_path):
    d = tmp_path / "llama[1]"
    d.mkdir()
    (d / "tok512.model").write_bytes(sentencepiece_model())
    assert isinstance(Tokenizer.from_dir(d), SentencePieceTokenizer)


def test_a_directory_named_like_a_model_is_not_one(tmp_path):
    (tmp_path / "checkpoints.model").mkdir()
    (tmp_path / "tok512.model").write_bytes(sentencepiece_model())
    assert isinstance(Tokenizer.from_dir(tmp_path), SentencePieceTokenizer)


def test_paths_of_the_wrong_kind(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_dir(tmp_path / "nowhere")
    (tmp_path / "tokenizer.json").write_text(tokenizer_json())
    with pytest.raises(ConfigError, match="not a directory"):
        Tokenizer.from_dir(tmp_path / "tokenizer.json")  # the file instead of its directory
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no tokenizer found"):
        Tokenizer.from_dir(empty)


@pytest.mark.parametrize("kind", ["directory", "fifo", "dangling link"])
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer.model"])
def test_not_a_regular_file(tmp_path, name, kind):
    p = tmp_path / name
    if kind == "directory":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=f"{name}: not a regular file"):
        Tokenizer.from_dir(tmp_path)


@pytest.mark.parametrize("files", [
    {"tokenizer.json": b"{not json"},
    {"tokenizer.json": b'{"model": {"type": "Unigram", "vocab": [["a", "x"]]}}'},
    {"tokenizer.json": b"\xff\xfe\x00garbage"},
    {"tokenizer.json": b"[" * 100_000},
    {"tokenizer.json": None, "tokenizer_config.json": b"[1, 2]"},
    {"tokenizer.json": None, "tokenizer_config.json": b"{broken"},
    {"tokenizer.json": None, "tokenizer_config.json": b"\xff"},
    {"tokenizer.json": None, "tokenizer_config.json": b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"},
    {"tokenizer.model": b"not a protobuf"},
    {"tokenizer.model": b""},
    {"tok.model": b"\x0a\x05hello\x12\x00"},
])
def test_unusable_tokenizer_files(tmp_path, files):
    for name, content in files.items():
        (tmp_path / name).write_bytes(tokenizer_json().encode() if content is None else content)
    with pytest.raises(ConfigError, match="not a usable tokenizer") as e:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(e.value) and len(str(e.value)) < 1000


def test_error_is_a_value_error(tmp_path):
    """from_dir raised ValueError before; ConfigError is one, so callers catching it still do."""
    with pytest.raises(ValueError):
        Tokenizer.from_dir(tmp_path)


def test_a_missing_library_is_not_the_files_fault(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json())
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(ImportError):
        Tokenizer.from_dir(tmp_path)
