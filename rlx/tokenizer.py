"""Tokenizers for model directories: a Hugging Face ``tokenizer.json`` through the `tokenizers`
package, or a SentencePiece model (``tokenizer.model`` or a single ``*.model`` file) through the
`sentencepiece` package; and for GGUF files, the vocabulary in the file's metadata
(``Tokenizer.from_gguf``, rlx/gguf_tokenizer.py). All behave the same way: ``encode(text)`` adds the BOS id when the
model has one, ``decode(ids)`` returns text, and ``decode_continuation(prefix, new)`` returns the
text that ``new`` adds after ``prefix`` (so leading spaces and multi-byte characters come out
right when text is streamed token by token).

``Tokenizer.from_dir`` raises FileNotFoundError for a path that does not exist and rlx.ConfigError
for everything else that is wrong with the directory or its tokenizer files.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Callable, Sequence

from rlx.errors import ConfigError


def check_text(text) -> str:
    """text, or TypeError: a list of strings is not a text (encode one string per call)."""
    if not isinstance(text, str):
        raise TypeError(f"encode takes one str, got {type(text).__name__}"
                        + (" (encode each string separately)" if isinstance(text, (list, tuple)) else ""))
    return text


class Tokenizer:
    """Common interface; build one with ``Tokenizer.from_dir(path)``."""

    bos_id: int | None = None

    @staticmethod
    def from_dir(path: str | os.PathLike) -> "Tokenizer":
        """The tokenizer of a model directory: tokenizer.json (with tokenizer_config.json when
        present) through `tokenizers`, else tokenizer.model, else the one regular *.model file,
        through `sentencepiece`. FileNotFoundError when path does not exist; rlx.ConfigError (a
        ValueError) when it is not a directory, holds no tokenizer or several *.model files, or
        the tokenizer files cannot be loaded (the message names them and the library's reason)."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            if os.path.lexists(path):
                raise ConfigError(f"{path}: not a directory (pass the model directory, which holds tokenizer.json "
                                  "or a SentencePiece *.model file)")
            raise FileNotFoundError(f"no such directory: {path}")
        hf = os.path.join(path, "tokenizer.json")
        if os.path.lexists(hf):
            if not os.path.isfile(hf):  # a directory, a FIFO (opening one blocks), a dangling link
                raise ConfigError(f"{hf}: not a regular file")
            return _load_or_explain(HFTokenizer, path, f"{hf} (with tokenizer_config.json beside it)")
        sp = os.path.join(path, "tokenizer.model")
        if os.path.lexists(sp):
            if not os.path.isfile(sp):
                raise ConfigError(f"{sp}: not a regular file")
            models = [sp]
        else:  # glob.escape: a directory named like "llama[1]" is a path, not a pattern
            models = sorted(m for m in glob.glob(os.path.join(glob.escape(path), "*.model")) if os.path.isfile(m))
        if len(models) > 1:
            raise ConfigError(f"{path}: several SentencePiece models ({', '.join(map(os.path.basename, models))}); "
                              "keep one, or name it tokenizer.model")
        if not models:
            raise ConfigError(f"{path}: no tokenizer found (expected tokenizer.json or a SentencePiece *.model file)")
        return _load_or_explain(SentencePieceTokenizer, models[0], models[0])

    @staticmethod
    def from_pretrained(path: str | os.PathLike) -> "Tokenizer":
        """The tokenizer of a model: a GGUF file's (from its metadata) or a directory's."""
        from rlx.gguf import is_gguf

        return Tokenizer.from_gguf(path) if is_gguf(path) else Tokenizer.from_dir(path)

    @staticmethod
    def from_gguf(source) -> "Tokenizer":
        """The tokenizer stored in a GGUF file (a path or an rlx.gguf.GGUFFile); see
        rlx/gguf_tokenizer.py."""
        from rlx.gguf_tokenizer import GGUFTokenizer

        return GGUFTokenizer(source)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def decode_continuation(self, prefix: Sequence[int], new: Sequence[int]) -> str:
        """Text that `new` adds after `prefix`. Holds back a trailing incomplete UTF-8 character
        (decoded as U+FFFD) so that streamed deltas never split one."""
        full = self.decode(list(prefix) + list(new))
        head = self.decode(list(prefix))
        text = full[len(head):] if full.startswith(head) else full
        while text.endswith("\ufffd"):
            text = text[:-1]
        return text


def _load_or_explain(cls: Callable[[str], Tokenizer], arg: str, files: str) -> Tokenizer:
    """cls(arg), with any failure of the tokenizer libraries (they raise plain Exception, OSError,
    RuntimeError, ValueError, ...) or of reading tokenizer_config.json turned into a ConfigError.
    A library that is not installed (ImportError) and MemoryError are not the files' fault: they
    pass through."""
    try:
        return cls(arg)
    except (ImportError, MemoryError):
        raise
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        raise ConfigError(f"{files}: not a usable tokenizer ({reason[:300]})") from None


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, model_file: str):
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
        bos = self._sp.bos_id()
        self.bos_id = bos if bos >= 0 else None

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(self._sp.encode(check_text(text)))
        return ([self.bos_id] if add_bos and self.bos_id is not None else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


class HFTokenizer(Tokenizer):
    def __init__(self, path: str):
        import tokenizers

        self._tok = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self.bos_id = None
        cfg_file = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_file):
            with open(cfg_file, encoding="utf-8") as f:
                cfg = json.load(f)
            bos = cfg.get("bos_token")
            if isinstance(bos, dict):
                bos = bos.get("content")
            # Llama 3 adds <|begin_of_text|> through its post-processor; add it here only when
            # the tokenizer would not (add_bos_token true without a post-processor doing it).
            if isinstance(bos, str) and cfg.get("add_bos_token", False):
                self.bos_id = self._tok.token_to_id(bos)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self._tok.encode(check_text(text), add_special_tokens=add_bos).ids
        if add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)
