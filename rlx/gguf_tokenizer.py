"""The tokenizer stored in a GGUF file's metadata, rebuilt as a `tokenizers.Tokenizer`.

llama.cpp keeps the whole vocabulary in the file: tokenizer.ggml.model ("llama": SentencePiece
BPE with byte fallback; "gpt2": byte-level BPE), tokens, scores, token_type, merges,
tokenizer.ggml.pre (which pre-tokenizer regexes a byte-level BPE uses: llama.cpp compiles them
in and names them), bos / eos ids and add_bos_token / add_eos_token / add_space_prefix. This
module turns those pieces into the equivalent `tokenizers` pipeline, so that encoding agrees
id for id with llama.cpp (checked on llama.cpp's own test vectors, tests/unit/test_gguf_tokenizer.py):

- "llama" (SPM): normalizer Prepend("▁") (when add_space_prefix, default true) + Replace(" ",
  "▁"); no pre-tokenizer (the whole text is one piece); BPE model whose merges are every split
  left + right = token of the vocabulary with both halves in it, ranked by the merged token's
  score (highest first), with byte fallback to <0xXX> tokens — the merge order of llama.cpp's
  llm_tokenizer_spm (one difference: among candidate pairs of equal score llama.cpp merges the
  leftmost, a BPE rank list cannot tie, so they go by token id, then split point; the results
  differ only if two equal-score merges compete for one symbol); decoder ▁ -> " ", byte
  fallback, fuse, strip one leading space.
- "gpt2" (byte-level BPE): Split by the pre-tokenizer's regexes (llama.cpp's, by
  tokenizer.ggml.pre: llama-bpe / llama3 / llama-v3, qwen2, default), GPT-2 byte-to-unicode
  mapping, BPE with the file's merges in order (ignore_merges for llama-bpe, as llama.cpp:
  a piece that is itself a token is not split); decoder byte-level.
- CONTROL and UNKNOWN tokens become special added tokens, USER_DEFINED ones plain added tokens:
  as in llama.cpp, user-defined tokens are always matched in the text, control tokens only when
  `parse_special` (the default here, as for Hugging Face tokenizers; llama.cpp's vocab test
  tokenizes with parse_special = false, which reads them as plain text: pass
  parse_special=False for that).
- No Unicode normalization: llama.cpp applies none (Hugging Face's Qwen2 tokenizer applies NFC;
  the two agree on NFC text, which is all of the test vectors).

It never downloads anything and never reads anything but the GGUF metadata.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

from rlx.errors import ConfigError
from rlx.gguf import GGUFFile
from rlx.tokenizer import Tokenizer, check_text

__all__ = ["PRE_TOKENIZER_REGEXES", "GGUFTokenizer", "build_hf_tokenizer"]

# llama.cpp's token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

# tokenizer.ggml.pre -> (regexes applied one after the other, each splitting every piece the
# previous ones left, matches kept as pieces; ignore_merges; add_bos default). As llama.cpp's
# llm_tokenizer_bpe / llama_vocab::load.
PRE_TOKENIZER_REGEXES: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False),
    "llama-bpe": ((_LLAMA3,), True, True),
    "llama3": ((_LLAMA3,), True, True),
    "llama-v3": ((_LLAMA3,), True, True),
    "qwen2": ((_QWEN2,), False, False),
    "gpt-2": ((_GPT2,), False, False),
}


def _token_arrays(gf: GGUFFile) -> tuple[list[str], list[int], list[float] | None]:
    tokens = gf.get("tokenizer.ggml.tokens", list)
    n = len(tokens)
    types = gf.metadata.get("tokenizer.ggml.token_type")
    types = [NORMAL] * n if types is None else np.asarray(types).astype(int).tolist()
    scores = gf.metadata.get("tokenizer.ggml.scores")
    scores = None if scores is None else np.asarray(scores, dtype=np.float32).tolist()
    for key, arr in (("tokenizer.ggml.token_type", types), ("tokenizer.ggml.scores", scores)):
        if arr is not None and len(arr) != n:
            raise ConfigError(f"{gf.path}: metadata key '{key}' has {len(arr)} entries for {n} tokens")
    return tokens, types, scores


def _spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) with left, right and left + right all tokens, ranked as llama.cpp's
    SPM tokenizer picks bigrams: higher score of the merged token first (ties: lower token id,
    then shorter left part; see the module docstring)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, piece in enumerate(tokens):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab and vocab.get(piece) == i:
                merges.append((-scores[i], i, cut, left, right))
    merges.sort()
    return [(m[3], m[4]) for m in merges]


def _bpe(gf: GGUFFile, models, *args, **kwargs):
    """tokenizers.models.BPE(*args, **kwargs); the library's own error (a merge naming a token the
    vocabulary lacks, ...) as ConfigError naming the file."""
    try:
        return models.BPE(*args, **kwargs)
    except Exception as e:  # the Rust library raises plain Exception
        raise ConfigError(f"{gf.path}: the tokenizer metadata is inconsistent ({e})") from None


def build_hf_tokenizer(gf: GGUFFile):
    """(tokenizers.Tokenizer, facts dict) for the file's vocabulary; see the module docstring.
    facts: model, pre, bos_id, eos_id, add_bos, add_eos, add_space_prefix."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTok

    model = gf.get("tokenizer.ggml.model", str)
    if model in ("no_vocab", "none"):
        raise ConfigError(f"{gf.path}: the file has no vocabulary (tokenizer.ggml.model = {model!r}): text needs "
                          "one; Generator.from_pretrained runs its token ids")
    tokens, types, scores = _token_arrays(gf)
    vocab = {t: i for i, t in enumerate(tokens)}
    facts = {"model": model, "pre": None}
    if model == "llama":
        if scores is None:
            raise ConfigError(f"{gf.path}: missing required metadata key 'tokenizer.ggml.scores' (SPM tokenizer)")
        if not all(f"<0x{b:02X}>" in vocab for b in range(256)):
            raise ConfigError(f"{gf.path}: SPM vocabulary lacks some of the 256 <0xXX> byte tokens")
        unk = gf.get("tokenizer.ggml.unknown_token_id", int, 0)
        bpe = _bpe(gf, models, vocab, _spm_merges(tokens, scores),
                   unk_token=tokens[unk] if 0 <= unk < len(tokens) else None, fuse_unk=True, byte_fallback=True)
        tok = HFTok(bpe)
        add_space_prefix = gf.get("tokenizer.ggml.add_space_prefix", bool, True)
        norm = [normalizers.Replace(" ", "\u2581")]
        if add_space_prefix:
            norm.insert(0, normalizers.Prepend("\u2581"))
        tok.normalizer = normalizers.Sequence(norm)
        dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_space_prefix:
            dec.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(dec)
        facts.update(add_space_prefix=add_space_prefix, bos_id=1, eos_id=2, add_bos=True)
    elif model == "gpt2":
        pre = gf.get("tokenizer.ggml.pre", str, "default")
        if pre not in PRE_TOKENIZER_REGEXES:
            raise ConfigError(f"{gf.path}: metadata key 'tokenizer.ggml.pre' = {pre!r} is not supported "
                              f"(supported: {', '.join(sorted(PRE_TOKENIZER_REGEXES))})")
        regexes, ignore_merges, add_bos = PRE_TOKENIZER_REGEXES[pre]
        merges = []
        for m in gf.get("tokenizer.ggml.merges", list):
            cut = m.find(" ", 1)
            if cut < 0:
                raise ConfigError(f"{gf.path}: tokenizer.ggml.merges entry {m!r} is not 'left right'")
            merges.append((m[:cut], m[cut + 1:]))
        tok = HFTok(_bpe(gf, models, vocab, merges, ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        facts.update(pre=pre, add_space_prefix=False, bos_id=11, eos_id=11, add_bos=add_bos)
    else:
        raise ConfigError(f"{gf.path}: metadata key 'tokenizer.ggml.model' = {model!r} is not supported "
                          "(supported: 'llama' (SentencePiece BPE), 'gpt2' (byte-level BPE))")

    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types, strict=True) if ty in (CONTROL, UNKNOWN)]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True) if ty == USER_DEFINED]
    tok.add_special_tokens(special)
    tok.add_tokens(user)

    n = len(tokens)
    for name in ("bos", "eos"):
        v = gf.get(f"tokenizer.ggml.{name}_token_id", int, facts[f"{name}_id"])
        facts[f"{name}_id"] = v if 0 <= v < n else None
    facts["add_bos"] = gf.get("tokenizer.ggml.add_bos_token", bool, facts["add_bos"])
    facts["add_eos"] = gf.get("tokenizer.ggml.add_eos_token", bool, False)
    for flag, name in (("add_bos", "bos"), ("add_eos", "eos")):
        if facts[flag] and facts[f"{name}_id"] is None:
            raise ConfigError(f"{gf.path}: tokenizer.ggml.{flag}_token is true but there is no valid "
                              f"tokenizer.ggml.{name}_token_id")
    return tok, facts


class GGUFTokenizer(Tokenizer):
    """rlx's Tokenizer interface over a GGUF file's vocabulary.

    encode(text, add_bos=True, parse_special=True): add_bos adds what the model's tokenizer adds
    (BOS when add_bos_token, EOS when add_eos_token: llama.cpp's add_special); parse_special
    matches control tokens written in the text (<|im_start|>, ...) as those tokens."""

    def __init__(self, source: GGUFFile | str | os.PathLike):
        gf = source if isinstance(source, GGUFFile) else GGUFFile(source)
        self.path = gf.path
        self._tok, facts = build_hf_tokenizer(gf)
        self._lock = threading.Lock()  # encode_special_tokens is a setting of the shared object
        self.model: str = facts["model"]
        self.pre: str | None = facts["pre"]
        self.bos_token_id: int | None = facts["bos_id"]
        self.eos_token_id: int | None = facts["eos_id"]
        self.add_bos_token: bool = facts["add_bos"]
        self.add_eos_token: bool = facts["add_eos"]
        self.bos_id = self.bos_token_id if self.add_bos_token else None
        self.vocab_size: int = len(gf.metadata["tokenizer.ggml.tokens"])

    @property
    def hf_tokenizer(self):
        """The underlying tokenizers.Tokenizer (shared; do not change its settings)."""
        return self._tok

    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        check_text(text)
        with self._lock:
            self._tok.encode_special_tokens = not parse_special
            ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self.add_bos_token:
            ids = [self.bos_token_id] + ids
        if add_bos and self.add_eos_token:
            ids = ids + [self.eos_token_id]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)
