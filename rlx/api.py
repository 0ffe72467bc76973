"""The high-level API: a model directory in, text out.

    model = rlx.load("path/to/model")                 # a HF directory or a .gguf file
    model.generate("Once upon a time", max_new_tokens=64)               # -> the continuation
    for delta in model.generate("Once upon a time", stream=True): ...   # UTF-8-safe pieces

Generation stops at max_new_tokens, at an end-of-sequence id (config.json / generation_config.json)
or at the end of the context, whichever comes first. Every call runs on a sequence of its own over
the one loaded model (weights and compiled plans shared), so streams may be interleaved and calls
made from several threads at once: each gives the text it would give alone.
"""

from __future__ import annotations

import os
from typing import Iterator

from rlx.config import ModelConfig, load_config
from rlx.generator import Generator, SampleOpts, Sequence
from rlx.tokenizer import Tokenizer
from rlx.weights import load_weights


class TextStream:
    """The text deltas of one generate(stream=True) call; also the token ids: `prompt_ids` and
    `new_ids` (filled as the stream is consumed)."""

    def __init__(self, deltas: Iterator[str], prompt_ids: list[int], new_ids: list[int]):
        self._deltas = deltas
        self.prompt_ids = prompt_ids
        self.new_ids = new_ids

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        return next(self._deltas)


class Model:
    """A loaded model: ``config``, ``tokenizer``, ``generator``."""

    def __init__(self, config: ModelConfig, generator: Generator, tokenizer: Tokenizer):
        self.config = config
        self.generator = generator
        self.tokenizer = tokenizer

    def generate(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int = 0,
                 stream: bool = False) -> str | Iterator[str]:
        """The text generated after prompt (greedy by default). With stream=True, an iterator of
        text deltas whose concatenation is that text."""
        opts = SampleOpts(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repetition_penalty=repetition_penalty, seed=seed)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        prompt_ids = self.tokenizer.encode(prompt)
        seq = self.generator.new_sequence()
        seq.prefill(prompt_ids)  # validates before any generation starts
        new: list[int] = []
        deltas = TextStream(self._stream(seq, prompt_ids, max_new_tokens, opts, new), prompt_ids, new)
        return deltas if stream else "".join(deltas)

    def _stream(self, seq: Sequence, prompt_ids: list[int], max_new_tokens: int, opts: SampleOpts,
                new: list[int]) -> Iterator[str]:
        eos = set(self.config.eos_token_ids)
        emitted = ""
        room = self.config.max_position_embeddings - len(prompt_ids)
        for _ in range(min(max_new_tokens, room)):
            tok = seq.step_cached(opts)
            if tok in eos:
                break
            new.append(tok)
            text = self.tokenizer.decode_continuation(prompt_ids, new)
            if len(text) > len(emitted):
                yield text[len(emitted):]
                emitted = text
        full = self.tokenizer.decode(prompt_ids + new)[len(self.tokenizer.decode(prompt_ids)):]
        if len(full) > len(emitted):  # an incomplete character held back at the very end
            yield full[len(emitted):]

    def __repr__(self) -> str:
        return f"Model({self.generator!r})"


def load(path: str | os.PathLike, device: str = "cpu", kv_dtype: str | None = None, dtype: str | None = None) -> Model:
    """Loads a Hugging Face model directory (config.json + generation_config.json, safetensors
    weights, a tokenizer) or a GGUF file (its metadata, tensors as stored, quantized ones executed
    packed, and the tokenizer its metadata describes). dtype: the matrices converted once at load
    ("f32", "bf16", "f16") or quantised in memory as rlx.quantize would write them ("q8_0",
    "q4_k_m", ...: rlx/quantize.py). Decoding plans are compiled once with symbolic shapes."""
    from rlx import gguf

    if gguf.is_gguf(path):
        gf = gguf.GGUFFile(path)
        config, weights, tokenizer = gguf.model_config(gf), gguf.model_weights(gf), Tokenizer.from_gguf(gf)
    else:
        config, weights, tokenizer = load_config(path), load_weights(path), Tokenizer.from_pretrained(path)
    gen = Generator(config, weights, device=device, dtype=dtype, kv_dtype=kv_dtype)
    gen.with_dynamic_prefill_cache().with_dynamic_decode_cache()
    return Model(config, gen, tokenizer)
