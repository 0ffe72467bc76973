"""The high-level API: a model directory (or GGUF file) in, text and OpenAI-shaped dicts out.

    model = rlx.load("path/to/model")                  # a HF directory or a .gguf file
    model.generate("Once upon a time", max_new_tokens=64)                # -> the continuation (str)
    model.create_completion("Once upon a time", max_tokens=32, stop=["."])   # -> OpenAI-shaped dict
    model.create_chat_completion([{"role": "user", "content": "Hi"}])      # the model's chat template
    model("Once upon a time")                          # create_completion's shortcut

Every call runs on a sequence of its own over the one loaded model (weights and compiled plans
shared), so streams may be interleaved and calls made from several threads at once. When a call
ends, its sequence (history + KV cache) is kept (up to ``cached_sequences`` of them, the least
recently used dropped first); the next call whose prompt starts with the same tokens takes it,
truncates it where the two differ and runs only the rest: a chat's next turn costs its new tokens,
not the whole conversation. ``usage["prompt_tokens_details"]["cached_tokens"]`` and
``model.stats`` count the prompt tokens so served. ``save_state()`` / ``load_state()`` save and
restore the most recent one; ``close()`` (or a ``with`` block) frees them and the compiled plans.

Sampling values left None come from the model's generation_config.json (do_sample, temperature,
top_k, top_p, min_p, repetition_penalty), greedy when it has none; ``seed=None`` draws a fresh
seed per call, an int reproduces. Generation stops at max tokens, an end-of-sequence id
(config.json, generation_config.json, the tokenizer's eos_token), a stop string, or the end of the
context; ``finish_reason`` says which ("stop" or "length").
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any, Callable, Sequence

import numpy as np

from rlx import completions
from rlx.batching import Batcher
from rlx.chat_template import ChatTemplate
from rlx.config import ModelConfig, load_config
from rlx.engine import Generation, GenerationOptions, Stream
from rlx.errors import ConfigError
from rlx.generator import Generator
from rlx.generator import Sequence as RlxSequence
from rlx.tokenizer import Tokenizer
from rlx.weights import load_weights

__all__ = ["Model", "TextStream", "load", "generation_defaults"]

log = logging.getLogger("rlx.api")

# generation_config.json keys used as sampling defaults, and their types
_GENERATION_KEYS = {"do_sample": bool, "temperature": float, "top_k": int, "top_p": float, "min_p": float,
                    "repetition_penalty": float}
# (lower test, upper test, words): the ranges sampling accepts (csrc/gen/sample.c)
_GENERATION_RANGES = {
    "temperature": (lambda v: v >= 0, lambda v: True, "finite and >= 0"),
    "top_k": (lambda v: v >= 0, lambda v: v < 2**31, "an integer in [0, 2^31)"),
    "top_p": (lambda v: v > 0, lambda v: v <= 1, "in (0, 1]"),
    "min_p": (lambda v: v >= 0, lambda v: v <= 1, "in [0, 1]"),
    "repetition_penalty": (lambda v: v > 0, lambda v: True, "finite and > 0"),
}


class TextStream(Stream):
    """The text deltas of one generate(stream=True) call, and its token ids: `prompt_ids` and
    `new_ids` (filled as the stream is consumed), `finish_reason` once it is exhausted."""

    @property
    def prompt_ids(self) -> list[int]:
        return self.generation.prompt_ids

    @property
    def new_ids(self) -> list[int]:
        return self.generation.new_ids

    @property
    def finish_reason(self) -> str | None:
        return self.generation.finish_reason


def _text_deltas(gen: Generation):
    it = iter(gen)
    try:
        for piece in it:
            if piece.text:
                yield piece.text
    finally:
        it.close()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


class Model:
    """A loaded model: ``config``, ``tokenizer``, ``generator``, ``chat_template`` (or None),
    ``generation_defaults``, ``name``; see the module docstring."""

    def __init__(self, config: ModelConfig, generator: Generator, tokenizer: Tokenizer, *,
                 chat_template: ChatTemplate | None = None, generation_defaults: dict | None = None,
                 name: str = "rlx", cached_sequences: int = 1):
        if isinstance(cached_sequences, bool) or not isinstance(cached_sequences, int) or cached_sequences < 0:
            raise ValueError(f"cached_sequences must be an int >= 0, got {cached_sequences!r}")
        self.config = config
        self.generator = generator
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.generation_defaults = dict(generation_defaults or {})
        self.name = name
        self.cached_sequences = cached_sequences
        eos = set(config.eos_token_ids)
        if chat_template is not None and chat_template.special_tokens.get("eos_token"):
            ids = tokenizer.encode(chat_template.special_tokens["eos_token"], add_bos=False)
            if len(ids) == 1:
                eos.add(ids[0])
        self.eos_token_ids = frozenset(eos)
        # every generation's steps: concurrent calls are batched
        self.batcher = Batcher(batch_invariant=getattr(generator, "batch_invariant", False))
        self._lock = threading.Lock()
        self._idle: list[RlxSequence] = []   # least recently used first
        self._stats = dict(requests=0, prompt_tokens=0, cached_tokens=0, completion_tokens=0)
        self._closed = False

    # -- text in, text out -----------------------------------------------------------------------

    def generate(self, prompt: str | list[int] | list[str] | list[list[int]], max_new_tokens: int = 64,
                 temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repetition_penalty: float | None = None, seed: int | None = None, stream: bool = False, *,
                 do_sample: bool | None = None, stop_strings: str | Sequence[str] | None = None,
                 logits_processor: Callable | Sequence[Callable] | None = None,
                 stopping_criteria: Callable | Sequence[Callable] | None = None) -> str | list[str] | TextStream:
        """The text generated after prompt (transformers' names). With stream=True, a TextStream of
        text deltas whose concatenation is that text. Several prompts (a list of strings or of id
        lists): the list of their texts, generated together (continuous batching through the
        model's Batcher). Arguments are checked before anything runs."""
        if not isinstance(stream, bool):
            raise TypeError(f"stream must be a bool, got {type(stream).__name__}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if completions.is_prompt_batch(prompt):  # several prompts: run together, their steps batched
            if stream:
                raise ValueError("stream=True takes one prompt")
            kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                      repetition_penalty=repetition_penalty, seed=seed, do_sample=do_sample,
                      stop_strings=stop_strings, logits_processor=logits_processor,
                      stopping_criteria=stopping_criteria)
            streams = [self.generate(p if isinstance(p, str) else list(p), max_new_tokens, stream=True, **kw)
                       for p in prompt]  # every prompt checked before any runs
            return completions.run_concurrently([lambda s=s: "".join(s) for s in streams],
                                                [s.generation for s in streams])
        gen = Generation(self, completions.prompt_ids(self, prompt), GenerationOptions(
            max_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repeat_penalty=repetition_penalty, do_sample=do_sample, seed=seed, stop=stop_strings or (),
            logits_processor=logits_processor, stopping_criteria=stopping_criteria))
        deltas = TextStream(_text_deltas(gen), gen)
        return deltas if stream else "".join(deltas)

    def create_completion(self, prompt: str | list[int] | list[str] | list[list[int]],
                          max_tokens: int | None = 16, *,
                          temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                          min_p: float | None = None, repeat_penalty: float | None = None,
                          stop: str | Sequence[str] | None = None, seed: int | None = None, stream: bool = False,
                          echo: bool = False, logprobs: int | None = None, presence_penalty: float = 0.0,
                          frequency_penalty: float = 0.0, logit_bias: dict | None = None,
                          logits_processor: Callable | Sequence[Callable] | None = None,
                          stopping_criteria: Callable | Sequence[Callable] | None = None,
                          stream_options: dict | None = None) -> dict | Stream:
        """An OpenAI text completion (llama-cpp-python's names): a dict, or with stream=True a
        Stream of chunks. max_tokens None: up to the end of the context. logprobs=n: each token's
        logprob and its n best alternatives; with echo, the prompt's too (one step per prompt
        token). Several prompts (a list of strings or of id lists): one response with a choice per
        prompt (``index`` i), generated together (not with stream=True). See rlx.completions."""
        self._check_open()
        return completions.completion(
            self, prompt, max_tokens, stream=stream, echo=echo, logprobs=logprobs, stream_options=stream_options,
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty,
            stop=stop, seed=seed, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            logit_bias=logit_bias, logits_processor=logits_processor, stopping_criteria=stopping_criteria)

    __call__ = create_completion

    def create_chat_completion(self, messages: list, max_tokens: int | None = None, *,
                               temperature: float | None = None, top_p: float | None = None,
                               top_k: int | None = None, min_p: float | None = None,
                               repeat_penalty: float | None = None, stop: str | Sequence[str] | None = None,
                               seed: int | None = None, stream: bool = False, logprobs: bool = False,
                               top_logprobs: int | None = None, tools: list | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               logit_bias: dict | None = None,
                               logits_processor: Callable | Sequence[Callable] | None = None,
                               stopping_criteria: Callable | Sequence[Callable] | None = None,
                               chat_template_kwargs: dict | None = None,
                               stream_options: dict | None = None) -> dict | Stream:
        """An OpenAI chat completion over messages rendered by the model's chat template: a dict,
        or with stream=True a Stream of chunks. A next turn (the same messages and more) reuses the
        cached sequence of the previous one. See rlx.completions."""
        self._check_open()
        return completions.chat_completion(
            self, messages, max_tokens, stream=stream, logprobs=logprobs, top_logprobs=top_logprobs, tools=tools,
            chat_template_kwargs=chat_template_kwargs, stream_options=stream_options, temperature=temperature,
            top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty, stop=stop, seed=seed,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, logit_bias=logit_bias,
            logits_processor=logits_processor, stopping_criteria=stopping_criteria)

    def apply_chat_template(self, messages: list, add_generation_prompt: bool = False, tokenize: bool = False,
                            tools: list | None = None, documents: list | None = None,
                            continue_final_message: bool = False, **kwargs: Any) -> str | list[int]:
        """The chat template over messages, as transformers' tokenizer.apply_chat_template renders
        it: the text (tokenize=False, the default here) or its ids (encoded as transformers does,
        without adding a BOS: the template writes it). kwargs are template variables."""
        if self.chat_template is None:
            raise ValueError(f"{self.name} has no chat template (tokenizer_config.json's chat_template, "
                             "chat_template.jinja or the GGUF's tokenizer.chat_template): pass "
                             "rlx.load(..., chat_template=...) or use create_completion")
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                         documents=documents, continue_final_message=continue_final_message,
                                         **kwargs)
        return self.tokenizer.encode(text, add_bos=False) if tokenize else text

    # -- sequences: prefix reuse, state ------------------------------------------------------------

    @property
    def stats(self) -> dict:
        """Totals over the calls that finished: requests, prompt_tokens, cached_tokens (prompt
        tokens served from a kept sequence), prefill_tokens (prompt tokens run), completion_tokens;
        and batched_steps / batched_rows: the plan steps that advanced several calls' sequences at
        once, and the sequences they advanced in all."""
        with self._lock:
            s = dict(self._stats)
        s["prefill_tokens"] = s["prompt_tokens"] - s["cached_tokens"]
        s["batched_steps"], s["batched_rows"] = self.batcher.batches, self.batcher.batched_rows
        return s

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this model is closed")

    def _fresh_sequence(self) -> RlxSequence:
        self._check_open()
        return self.generator.new_sequence()

    def _checkout(self, ids: list[int]) -> tuple[RlxSequence, int]:
        """A sequence whose history is ids, and how many of them its cache already holds: the kept
        sequence sharing the longest prefix with ids (truncated there, the rest appended), or a
        fresh one."""
        self._check_open()
        with self._lock:
            best, best_n = None, 0
            for seq in self._idle:
                n = _common_prefix(seq.tokens, ids)
                if n > best_n:
                    best, best_n = seq, n
            if best is not None:
                self._idle.remove(best)
        if best is None:
            seq = self.generator.new_sequence()
            seq.prefill(ids)
            return seq, 0
        best.truncate(best_n)
        if best_n < len(ids):
            best.append(ids[best_n:])
        cached = min(best.kv_len, len(ids) - 1)
        log.debug("prefix reuse: %d of %d prompt tokens cached", cached, len(ids))
        return best, cached

    def _checkin(self, seq: RlxSequence, gen: Generation) -> None:
        with self._lock:
            s = self._stats
            s["requests"] += 1
            s["prompt_tokens"] += len(gen.prompt_ids)
            s["cached_tokens"] += gen.cached_tokens
            s["completion_tokens"] += len(gen.new_ids)
            if self._closed or self.cached_sequences == 0:
                return
            self._idle.append(seq)
            del self._idle[:-self.cached_sequences]

    def save_state(self, path: str | os.PathLike | None = None) -> bytes | None:
        """The most recently used kept sequence (history + KV cache) as bytes, or written to path;
        see Sequence.save_state."""
        self._check_open()
        with self._lock:
            seq = self._idle[-1] if self._idle else None
        if seq is None:
            raise ValueError("no state to save: no call has finished on this model yet "
                             "(or cached_sequences is 0)")
        return seq.save_state(path)

    def load_state(self, state: bytes | bytearray | memoryview | str | os.PathLike) -> None:
        """Restores what save_state gave (bytes or a path) as the most recently used kept
        sequence: the next call whose prompt extends its history reuses it."""
        seq = self._fresh_sequence()
        seq.load_state(state)
        with self._lock:
            self._idle.append(seq)
            del self._idle[:-max(self.cached_sequences, 1)]

    def reset(self) -> None:
        """Forgets the kept sequences."""
        with self._lock:
            self._idle.clear()

    def close(self) -> None:
        """Frees the kept sequences and the compiled plans; later calls raise ValueError. Calls in
        progress finish (their sequences are then dropped)."""
        with self._lock:
            self._closed = True
            self._idle.clear()
        self.generator.release_compile_graphs()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.generator!r}{', closed' if self._closed else ''})"


# -- loading --------------------------------------------------------------------------------------

def generation_defaults(path: str | os.PathLike) -> dict:
    """The sampling defaults of a model directory's generation_config.json ({} when absent), read
    as config.py reads it (size, encoding and nesting limits, regular files only) and checked
    against the ranges sampling accepts, so a bad value is a ConfigError at load naming the file
    and the field, not a ValueError from every later call."""
    from rlx.config import _read_json, _regular_file

    file = os.path.join(os.fspath(path), "generation_config.json")
    if not _regular_file(file, "generation config"):
        return {}
    d = _read_json(file)
    if not isinstance(d, dict):
        raise ConfigError(f"{file}: must hold a JSON object, got {type(d).__name__}")
    out = {}
    for key, kind in _GENERATION_KEYS.items():
        v = d.get(key)
        if v is None:
            continue
        ok = isinstance(v, bool) if kind is bool else (isinstance(v, (int, float)) and not isinstance(v, bool))
        if not ok or (kind is int and not float(v).is_integer()):
            raise ConfigError(f"{file}: field '{key}' must be a {kind.__name__}, got {v!r}")
        v = kind(v)
        lo, hi, what = _GENERATION_RANGES.get(key, (None, None, ""))
        if kind is not bool and not (math.isfinite(v) and lo(v) and hi(v)):
            raise ConfigError(f"{file}: field '{key}' must be {what}, got {v!r}")
        out[key] = v
    return out


def model_path(path: str | os.PathLike) -> tuple[str, bool]:
    """(path, is_gguf) for a model directory (with config.json) or a GGUF file, or an error that
    says what was expected where (NotADirectoryError for another file, IsADirectoryError for a
    directory without config.json, naming the .gguf files it holds)."""
    from rlx import gguf

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory (expected a model directory or a .gguf file)")
    if os.path.isfile(path):
        if gguf.is_gguf(path):
            return path, True
        raise NotADirectoryError(f"{path} is a file, not a model: pass its directory ({os.path.dirname(path) or '.'}, "
                                 "with config.json, the safetensors and the tokenizer) or a .gguf file")
    if not os.path.isfile(os.path.join(path, "config.json")):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        hint = f"; it holds {', '.join(ggufs)}: pass the file itself" if ggufs else ""
        raise IsADirectoryError(f"{path} is a directory without config.json{hint}")
    return path, False


def _read_with_progress(weights: dict, progress: bool | None) -> None:
    """Reads every weight's pages once (they are mmap'd) under a tqdm bar of bytes: shown when
    progress is True, or when None and stderr is a terminal and the model is large."""
    # an array as it is (ndarray.data of a bf16 array raises: a buffer cannot hold ml_dtypes'
    # dtype), a packed weight's bytes
    arrays = [w if isinstance(w, np.ndarray) else getattr(w, "data", None) for w in weights.values()]
    arrays = [a for a in arrays if isinstance(a, np.ndarray)]
    total = sum(a.nbytes for a in arrays)
    if progress is False or (progress is None and total < (256 << 20)):
        return
    from tqdm import tqdm

    chunk = 64 << 20
    with tqdm(total=total, unit="B", unit_scale=True, desc="loading", disable=None if progress is None else False,
              leave=False) as bar:
        for a in arrays:
            flat = a.reshape(-1).view(np.uint8) if a.flags.c_contiguous else None
            for start in range(0, a.nbytes, chunk):
                if flat is not None:
                    int(flat[start:start + chunk:4096].sum())  # one byte per page faults it in
                bar.update(min(chunk, a.nbytes - start))


def load(path: str | os.PathLike, device: str = "cpu", kv_dtype: str | None = None, dtype: str | None = None, *,
         chat_template: str | None = None, cached_sequences: int = 1, progress: bool | None = None,
         name: str | None = None, batch_invariant: bool = False) -> Model:
    """Loads a Hugging Face model directory (config.json + generation_config.json, safetensors
    weights, a tokenizer, its chat template) or a GGUF file (its metadata, tensors as stored,
    quantized ones executed packed, the tokenizer and chat template its metadata holds).

    dtype: the matrices converted once at load ("f32", "bf16", "f16") or quantised in memory as
    rlx.quantize would write them ("q8_0", "q4_k_m", ...: rlx/quantize.py). chat_template: a Jinja
    template (text) to use instead of the model's. cached_sequences: how many finished calls'
    sequences to keep for prefix reuse (0: none). progress: a tqdm bar while the weights are read
    (None: on a terminal, for models of 256 MiB and more). name: the model name in responses
    (default: the directory or file name). batch_invariant: plans that give a generation the same
    logits whatever other requests share its steps (Generator.with_batch_invariant; with
    cached_sequences=0, as prefix reuse starts a prompt from another request's cache); slower
    batches. Decoding plans are compiled once with symbolic shapes."""
    from rlx import gguf

    path, is_gguf = model_path(path)
    if is_gguf:
        gf = gguf.GGUFFile(path)
        config, weights, tokenizer = gguf.model_config(gf), gguf.model_weights(gf), Tokenizer.from_gguf(gf)
        template, defaults = ChatTemplate.from_gguf(gf, tokenizer), {}
    else:
        config, weights, tokenizer = load_config(path), load_weights(path), Tokenizer.from_pretrained(path)
        template, defaults = ChatTemplate.from_dir(path), generation_defaults(path)
    if chat_template is not None:
        special = template.special_tokens if template is not None else {}
        template = ChatTemplate(chat_template, **special)
    _read_with_progress(weights, progress)
    gen = Generator(config, weights, device=device, dtype=dtype, kv_dtype=kv_dtype)
    gen.with_dynamic_prefill_cache().with_dynamic_decode_cache().with_batch_invariant(batch_invariant)
    log.info("loaded %s: %s, %d layers, device %s", path, type(config).__name__, config.num_hidden_layers, device)
    return Model(config, gen, tokenizer, chat_template=template, generation_defaults=defaults,
                 name=name or os.path.basename(os.path.normpath(path)), cached_sequences=cached_sequences)
