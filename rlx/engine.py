"""One call's generation loop, shared by Model.generate, create_completion and
create_chat_completion (and so by the server).

A ``Generation`` is made from validated options (``GenerationOptions``) and a prompt's ids; it
checks everything it can before it runs (types, ranges, the prompt against the context), then,
when iterated, takes a sequence from the model (``Model._checkout``: the idle sequence sharing the
longest prefix with the prompt, truncated there and extended, or a fresh one), steps it and yields
``Piece``s: text safe to show and the tokens whose text it completes. When the iteration ends,
``finish_reason`` says why: "stop" (an end-of-sequence id, a stop string, or stopping_criteria) or
"length" (max_tokens, or the end of the context); the sequence goes back to the model for the next
call to reuse. ``cancel()`` (from another thread) ends it before the next token.

Per step, in this order: the forward pass (through the model's Batcher, rlx/batching.py: calls
running at the same time on other threads, e.g. the server's requests, share one batched plan
step); if asked, the raw logits' log-softmax (float64) for
logprobs; logit_bias; presence / frequency penalties (OpenAI's: minus count x frequency and,
once seen, minus presence, over the tokens generated in this call); the caller's
logits_processor(input_ids, scores); then the C sampler (repetition_penalty over the whole
history, temperature, top_k, top_p, min_p; the draw from the (seed, position) stream); then
stopping_criteria(input_ids, scores) with the new token in input_ids. Logprobs are those of the model's raw distribution
(before any processor or temperature), as llama-cpp-python reports them.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from typing import Callable, Iterator, Sequence

import numpy as np

from rlx.generator import SampleOpts
from rlx.streaming import IncrementalDecoder, StopStrings

__all__ = ["GenerationOptions", "Generation", "Piece", "Stream", "TokenLogprob", "log_softmax"]

LogitsProcessor = Callable[[np.ndarray, np.ndarray], "np.ndarray | None"]
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log(softmax(logits)) in float64 (the max subtracted first)."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x[np.isfinite(x)]) if np.isfinite(x).any() else 0.0
    return x - (m + np.log(np.sum(np.exp(x - m))))


@dataclasses.dataclass
class TokenLogprob:
    """One generated (or echoed) token: its text, its logprob, the top alternatives
    [(text, id, logprob)] best first, and where its text starts in the returned text."""

    id: int
    text: str
    logprob: float | None
    top: list[tuple[str, int, float]]
    offset: int


@dataclasses.dataclass
class Piece:
    """A text delta and the tokens whose text starts in it (filled when logprobs are on)."""

    text: str
    tokens: list[TokenLogprob]


def _callables(name: str, value) -> list:
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for f in items:
        if not callable(f):
            raise TypeError(f"{name} must be a callable or a list of callables, got {type(f).__name__}")
    return items


def _number(name: str, value, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not np.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        bounds = f"{'(' if lo_open else '['}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{name} must be in {bounds}, got {value!r}")
    return v


def _int(name: str, value, lo: int = 0, hi: int | None = None, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
    return int(value)


@dataclasses.dataclass
class GenerationOptions:
    """What one call asks for. Sampling values left None take the model's generation_config
    defaults (greedy when it has none); `seed` None draws a fresh seed per call."""

    max_tokens: int | None = 16          # None: up to the end of the context
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    do_sample: bool | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    logprobs: int | None = None          # None: off; n: the chosen token and n alternatives
    echo_logprobs: bool = False          # also the prompt's tokens (costs one step per prompt token)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None
    logits_processor: LogitsProcessor | Sequence[LogitsProcessor] | None = None
    stopping_criteria: StoppingCriteria | Sequence[StoppingCriteria] | None = None

    def check(self, vocab_size: int) -> None:
        """Raises TypeError / ValueError for anything out of shape (nothing has run yet)."""
        self.max_tokens = _int("max_tokens", self.max_tokens, optional=True)
        for name, lo, hi, lo_open in (("temperature", 0.0, None, False), ("top_p", 0.0, 1.0, True),
                                      ("min_p", 0.0, 1.0, False), ("repeat_penalty", 0.0, None, True)):
            if getattr(self, name) is not None:
                setattr(self, name, _number(name, getattr(self, name), lo, hi, lo_open=lo_open))
        self.top_k = _int("top_k", self.top_k, optional=True)
        if self.do_sample is not None and not isinstance(self.do_sample, bool):
            raise TypeError(f"do_sample must be a bool or None, got {type(self.do_sample).__name__}")
        self.seed = _int("seed", self.seed, lo=-(2**63), hi=2**64 - 1, optional=True)
        if self.seed is not None and self.seed < 0:
            self.seed += 2**64  # OpenAI clients send signed 64-bit seeds
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop is None:
            stop = []
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise TypeError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = [s for s in stop if s]
        self.logprobs = _int("logprobs", self.logprobs, hi=vocab_size, optional=True)
        self.presence_penalty = _number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        self.frequency_penalty = _number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise TypeError(f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}")
            bias = {}
            for k, v in self.logit_bias.items():
                try:
                    tid = int(k)  # JSON keys are strings
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias keys must be token ids, got {k!r}") from None
                if not 0 <= tid < vocab_size:
                    raise ValueError(f"logit_bias: token id {tid} is outside the vocabulary [0, {vocab_size})")
                bias[tid] = _number(f"logit_bias[{k}]", v, -100.0, 100.0)
            self.logit_bias = bias
        self.logits_processor = _callables("logits_processor", self.logits_processor)
        self.stopping_criteria = _callables("stopping_criteria", self.stopping_criteria)

    def sample_opts(self, defaults: dict) -> SampleOpts:
        """SampleOpts from these values, the model's generation_config defaults for the ones left
        None, and a fresh random seed when none is given."""
        do_sample = self.do_sample
        if do_sample is None:
            do_sample = bool(defaults.get("do_sample")) if self.temperature is None else self.temperature > 0
        temperature = 0.0
        if do_sample:
            temperature = self.temperature if self.temperature is not None else defaults.get("temperature", 1.0)
        pick = lambda name, off: getattr(self, name) if getattr(self, name) is not None else defaults.get(name, off)  # noqa: E731
        return SampleOpts(temperature=float(temperature), top_k=int(pick("top_k", 0)), top_p=float(pick("top_p", 1.0)),
                          min_p=float(pick("min_p", 0.0)),
                          repetition_penalty=float(self.repeat_penalty if self.repeat_penalty is not None
                                                   else defaults.get("repetition_penalty", 1.0)),
                          seed=self.seed if self.seed is not None else secrets.randbits(63))


class Generation:
    """Iterate it for Pieces (once). After the iteration: finish_reason, new_ids, usage."""

    def __init__(self, model, prompt_ids: Sequence[int], options: GenerationOptions):
        cfg = model.config
        self.model = model
        self.options = options
        options.check(cfg.vocab_size)
        self.prompt_ids = [int(i) for i in prompt_ids]
        if not self.prompt_ids:
            raise ValueError("the prompt is empty (no tokens): give some text, or a model that adds a BOS token")
        bad = [i for i in self.prompt_ids if not 0 <= i < cfg.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {cfg.vocab_size})")
        if len(self.prompt_ids) > cfg.max_position_embeddings:
            raise ValueError(f"the prompt is {len(self.prompt_ids)} tokens; the context holds "
                             f"{cfg.max_position_embeddings} (max_position_embeddings)")
        self.opts = options.sample_opts(model.generation_defaults)
        self.new_ids: list[int] = []
        self.finish_reason: str | None = None
        self.cached_tokens = 0
        self.prompt_logprobs: list[TokenLogprob] = []
        self._cancel = threading.Event()
        self._started = False
        self._enlisted = False  # counted among model.batcher's members

    # -- results ---------------------------------------------------------------------------------

    @property
    def usage(self) -> dict:
        """OpenAI's usage: prompt, completion and total tokens, and the prompt tokens served from
        a cached sequence (prefix reuse) as prompt_tokens_details.cached_tokens."""
        p, c = len(self.prompt_ids), len(self.new_ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def cancel(self) -> None:
        """Stops before the next token (thread-safe); finish_reason is then None."""
        self._cancel.set()

    # -- the loop --------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Piece]:
        if self._started:
            raise RuntimeError("a Generation can be iterated once")
        self._started = True
        return self._run()

    def enlist(self) -> None:
        """Counts this generation among the batcher's members now, before it runs (several
        generations started together on threads: the first one's steps wait for the others'
        instead of running alone while their threads start). Idempotent; ends when it has run,
        or at leave()."""
        if not self._enlisted:
            self.model.batcher.join()
            self._enlisted = True

    def leave(self) -> None:
        """Ends what enlist() began (a no-op after the run, which leaves by itself)."""
        if self._enlisted:
            self._enlisted = False
            self.model.batcher.leave()

    def _run(self) -> Iterator[Piece]:
        self.enlist()  # the other generations' steps wait for this one's
        try:
            yield from self._steps()
        finally:
            self.leave()

    def _steps(self) -> Iterator[Piece]:
        model, o, ids = self.model, self.options, self.prompt_ids
        cfg = model.config
        seq = None
        try:
            if o.echo_logprobs and o.logprobs is not None:
                seq = model._fresh_sequence()
                self.prompt_logprobs = self._score_prompt(seq)
            else:
                seq, self.cached_tokens = model._checkout(ids)
            room = cfg.max_position_embeddings - len(ids)
            limit = room if o.max_tokens is None else min(o.max_tokens, room)
            decoder = IncrementalDecoder(model.tokenizer, ids)
            stops = StopStrings(o.stop)
            hooks = bool(o.logprobs is not None or o.logit_bias or o.presence_penalty or o.frequency_penalty
                         or o.logits_processor or o.stopping_criteria)
            history = np.zeros(len(ids) + max(limit, 0), dtype=np.intc)
            history[:len(ids)] = ids
            counts = np.zeros(cfg.vocab_size, dtype=np.float32) if (o.presence_penalty or o.frequency_penalty) else None
            bias = None
            if o.logit_bias:
                bias = np.zeros(cfg.vocab_size, dtype=np.float32)
                bias[list(o.logit_bias)] = list(o.logit_bias.values())
            pending: list[TokenLogprob] = []   # tokens whose text has not started being emitted
            produced = emitted = 0             # chars decoded / emitted so far
            self.finish_reason = "length"
            while len(self.new_ids) < limit:
                if self._cancel.is_set():
                    self.finish_reason = None
                    return
                pos = len(ids) + len(self.new_ids)
                logits = model.batcher.logits(seq)  # batched with the other calls' steps, if any
                scores = lp = None
                if hooks:
                    captured: dict = {}
                    self._adjust(history[:pos], counts, bias, captured)(logits)
                    scores, lp = captured["scores"], captured.get("logprobs")
                tok = seq._c.sample(logits, self.opts, pos)
                seq.append(tok)
                if tok in model.eos_token_ids:
                    self.finish_reason = "stop"
                    break
                self.new_ids.append(tok)
                history[pos] = tok
                if counts is not None:
                    counts[tok] += 1
                if lp is not None:
                    pending.append(self._token_logprob(decoder, tok, lp, produced))
                delta = decoder.push(tok)
                produced += len(delta)
                text = stops.push(delta)
                if stops.stopped:
                    self.finish_reason = "stop"
                    emitted += len(text)
                    yield Piece(text, [t for t in pending if t.offset < emitted])
                    return
                emitted += len(text)
                if text or pending:
                    done = [t for t in pending if t.offset < emitted]
                    pending = pending[len(done):]
                    if text or done:
                        yield Piece(text, done)
                if any(bool(f(history[:pos + 1], scores)) for f in o.stopping_criteria):
                    self.finish_reason = "stop"
                    break
            tail = stops.push(decoder.flush())
            if stops.stopped:
                self.finish_reason = "stop"
            else:
                tail += stops.flush()
            emitted += len(tail)
            if tail or pending:
                yield Piece(tail, [t for t in pending if t.offset < emitted or not stops.stopped])
        finally:
            if seq is not None:
                model._checkin(seq, self)

    def _adjust(self, input_ids: np.ndarray, counts, bias, captured: dict):
        o = self.options

        def adjust(scores: np.ndarray) -> None:
            if o.logprobs is not None:
                captured["logprobs"] = log_softmax(scores)
            if bias is not None:
                scores += bias
            if counts is not None:
                scores -= counts * np.float32(o.frequency_penalty) + (counts > 0) * np.float32(o.presence_penalty)
            for f in o.logits_processor:
                out = f(input_ids, scores)
                if out is not None and out is not scores:
                    scores[:] = out
            captured["scores"] = scores

        return adjust

    def _top(self, lp: np.ndarray, text_of: Callable[[int], str]) -> list[tuple[str, int, float]]:
        n = self.options.logprobs
        if not n:
            return []
        idx = np.argpartition(-lp, n - 1)[:n] if n < lp.size else np.arange(lp.size)
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        return [(text_of(int(i)), int(i), float(lp[i])) for i in idx]

    def _token_logprob(self, decoder: IncrementalDecoder, tok: int, lp: np.ndarray, offset: int) -> TokenLogprob:
        return TokenLogprob(tok, decoder.peek(tok), float(lp[tok]), self._top(lp, decoder.peek), offset)

    def _score_prompt(self, seq) -> list[TokenLogprob]:
        """Logprobs of every prompt token after the ones before it (the first has none): one cached
        step per token. Offsets are into the prompt's text."""
        ids, tok = self.prompt_ids, self.model.tokenizer
        decoder = IncrementalDecoder(tok, ids[:1])
        first = tok.decode(ids[:1])
        out = [TokenLogprob(ids[0], first, None, [], 0)]
        offset = len(first)
        logits = seq.prefill_get_last_logits(ids[:1])
        for t in ids[1:]:
            lp = log_softmax(logits)
            out.append(TokenLogprob(t, decoder.peek(t), float(lp[t]), self._top(lp, decoder.peek), offset))
            offset += len(decoder.push(t))
            logits = seq.extend([t])
        return out


class Stream:
    """The streamed output of one call: iterate it for items (text deltas or OpenAI chunks);
    ``generation`` holds finish_reason, new_ids and usage once it is exhausted. close() (or leaving
    a ``with`` block) stops it and hands its sequence back to the model; cancel() may be called
    from another thread and ends it before the next token."""

    def __init__(self, items: Iterator, generation: Generation):
        self._items = items
        self.generation = generation

    def __iter__(self) -> "Stream":
        return self

    def __next__(self):
        return next(self._items)

    def close(self) -> None:
        self._items.close()

    def cancel(self) -> None:
        self.generation.cancel()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
