"""OpenAI-shaped text and chat completions (llama-cpp-python's ``Llama.create_completion`` /
``create_chat_completion`` names), built on rlx.engine.Generation. Model's methods of the same
names call these; the server (rlx/server.py) returns their dicts as JSON.

    completion(model, "Once upon a time", max_tokens=32, stop=["."])
      -> {"id", "object": "text_completion", "created", "model",
          "choices": [{"text", "index": 0, "logprobs", "finish_reason": "stop" | "length"}],
          "usage": {"prompt_tokens", "completion_tokens", "total_tokens",
                    "prompt_tokens_details": {"cached_tokens"}}}
    chat_completion(model, [{"role": "user", "content": "Hi"}])
      -> {..., "object": "chat.completion",
          "choices": [{"index": 0, "message": {"role": "assistant", "content"}, "logprobs", "finish_reason"}]}

With stream=True both return a rlx.engine.Stream of chunks ("text_completion" chunks with a text
delta; "chat.completion.chunk" with a delta: the role first, then content); the last chunk has the
finish_reason, and with stream_options={"include_usage": True} one more, with no choices, carries
the usage. Logprobs: completions take ``logprobs=n`` (OpenAI's legacy shape: tokens,
token_logprobs, top_logprobs as {text: logprob}, text_offset); chat takes ``logprobs=True,
top_logprobs=n`` (content: [{token, logprob, bytes, top_logprobs: [...]}]).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterator, Sequence

from rlx.engine import Generation, GenerationOptions, Piece, Stream, TokenLogprob

__all__ = ["BatchCall", "Call", "completion", "chat_completion", "is_prompt_batch", "prepare_completion",
           "prepare_chat_completion", "prompt_ids", "run_concurrently"]

# The keyword arguments both kinds take, mapped onto GenerationOptions.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "stop", "presence_penalty",
             "frequency_penalty", "logit_bias", "logits_processor", "stopping_criteria")


def prompt_ids(model, prompt: Any) -> list[int]:
    """A prompt's ids: a str is encoded (with the model's BOS), a list of ints taken as ids."""
    if isinstance(prompt, str):
        return model.tokenizer.encode(prompt)
    if isinstance(prompt, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        return list(prompt)
    raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")


def _check_stream_options(stream: bool, stream_options: dict | None) -> bool:
    if not isinstance(stream, bool):
        raise TypeError(f"stream must be a bool, got {type(stream).__name__}")
    if stream_options is None:
        return False
    if not stream:
        raise ValueError("stream_options is only allowed with stream=True")
    if not isinstance(stream_options, dict):
        raise TypeError(f"stream_options must be a dict, got {type(stream_options).__name__}")
    include = stream_options.get("include_usage", False)
    if not isinstance(include, bool):
        raise TypeError("stream_options['include_usage'] must be a bool")
    return include


def _legacy_logprobs(tokens: Sequence[TokenLogprob], shift: int = 0) -> dict:
    return {"tokens": [t.text for t in tokens],
            "text_offset": [t.offset + shift for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [({t.text: t.logprob, **{txt: lp for txt, _, lp in t.top}} if t.logprob is not None
                              else None) for t in tokens]}


def _chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict:
    def entry(text: str, lp: float) -> dict:
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**entry(t.text, t.logprob),
                         "top_logprobs": [entry(txt, lp) for txt, _, lp in t.top]} for t in tokens],
            "refusal": None}


def _head(kind: str, model) -> dict:
    prefix = "cmpl" if kind == "text_completion" else "chatcmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model.name}


# -- text completions ---------------------------------------------------------------------------

class Call:
    """A checked completion not run yet: ``generation``; ``result()`` runs it to the response
    dict, ``stream()`` returns a Stream of chunks. (The server cancels ``generation`` when its
    client goes away.)"""

    def __init__(self, generation: Generation, result: Callable[[], dict], chunks: Callable[[], Iterator[dict]]):
        self.generation = generation
        self._result, self._chunks = result, chunks

    def result(self) -> dict:
        return self._result()

    def stream(self) -> Stream:
        return Stream(self._chunks(), self.generation)


def _check_sampling(sampling: dict) -> None:
    unknown = set(sampling) - set(_SAMPLING)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")


def is_prompt_batch(prompt: Any) -> bool:
    """Several prompts (OpenAI's list of strings or of token-id lists), not one."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(
        isinstance(p, str) or (isinstance(p, (list, tuple)) and not isinstance(p, str)) for p in prompt)


def run_concurrently(fns: Sequence[Callable[[], Any]], generations: Sequence[Generation] = ()) -> list:
    """Each fn on a thread of its own, the results in order (the first exception is raised after
    all ended). Generations running at once share batched plan steps (rlx.batching.Batcher);
    ``generations`` (those the fns run) are enlisted before any thread starts, so each step waits
    for all of them from the first."""
    import concurrent.futures

    for g in generations:
        g.enlist()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(fns), thread_name_prefix="rlx-batch") as pool:
            futures = [pool.submit(f) for f in fns]
            concurrent.futures.wait(futures)
    finally:
        for g in generations:
            g.leave()
    return [f.result() for f in futures]


class _Generations:
    """The generations of a BatchCall as one (what the server reads): cancel() cancels all;
    finish_reason is None when any was cancelled."""

    def __init__(self, gens: list[Generation]):
        self.gens = gens

    def cancel(self) -> None:
        for g in self.gens:
            g.cancel()

    @property
    def finish_reason(self) -> str | None:
        reasons = [g.finish_reason for g in self.gens]
        return None if None in reasons else reasons[0]


class BatchCall:
    """Checked completions of several prompts, run together: ``result()`` is one response whose
    choices are the prompts' in order (``index`` i) and whose usage is their sum."""

    def __init__(self, calls: list[Call]):
        self.calls = calls
        self.generation = _Generations([c.generation for c in calls])

    def result(self) -> dict:
        results = run_concurrently([c.result for c in self.calls], [c.generation for c in self.calls])
        out = dict(results[0])
        out["choices"] = [dict(r["choices"][0], index=i) for i, r in enumerate(results)]
        usage = {k: sum(r["usage"][k] for r in results) for k in ("prompt_tokens", "completion_tokens",
                                                                  "total_tokens")}
        usage["prompt_tokens_details"] = {
            "cached_tokens": sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results)}
        out["usage"] = usage
        return out


def completion(model, prompt: str | list[int] | list[str] | list[list[int]], max_tokens: int | None = 16, *,
               stream: bool = False, **kwargs: Any) -> dict | Stream:
    """See the module docstring and prepare_completion."""
    call = prepare_completion(model, prompt, max_tokens, stream=stream, **kwargs)
    return call.stream() if stream else call.result()


def prepare_completion(model, prompt: str | list[int] | list[str] | list[list[int]], max_tokens: int | None = 16,
                       *, stream: bool = False, echo: bool = False, logprobs: int | None = None,
                       stream_options: dict | None = None, **sampling: Any) -> Call | BatchCall:
    """A checked text completion; sampling keywords: temperature, top_p, top_k, min_p,
    repeat_penalty, seed, stop, presence_penalty, frequency_penalty, logit_bias,
    logits_processor, stopping_criteria. Several prompts (a list of strings or of id lists): a
    BatchCall, every prompt checked before any runs; not with stream=True."""
    if is_prompt_batch(prompt):
        if stream:
            raise ValueError("stream=True takes one prompt; several prompts are answered in one response")
        return BatchCall([prepare_completion(model, p if isinstance(p, str) else list(p), max_tokens, echo=echo,
                                             logprobs=logprobs, stream_options=stream_options, **sampling)
                          for p in prompt])
    _check_sampling(sampling)
    include_usage = _check_stream_options(stream, stream_options)
    if not isinstance(echo, bool):
        raise TypeError(f"echo must be a bool, got {type(echo).__name__}")
    ids = prompt_ids(model, prompt)
    gen = Generation(model, ids, GenerationOptions(max_tokens=max_tokens, logprobs=logprobs, echo_logprobs=echo,
                                                   **sampling))
    echo_text = (prompt if isinstance(prompt, str) else model.tokenizer.decode(ids)) if echo else ""
    head = _head("text_completion", model)
    lp_on = logprobs is not None

    def choice(text: str, tokens: list[TokenLogprob], finish: str | None, shift: int) -> dict:
        return {"text": text, "index": 0, "logprobs": _legacy_logprobs(tokens, shift) if lp_on else None,
                "finish_reason": finish}

    def result() -> dict:
        pieces = list(gen)
        tokens = gen.prompt_logprobs + [_shifted(t, len(echo_text)) for p in pieces for t in p.tokens]
        text = echo_text + "".join(p.text for p in pieces)
        return {**head, "choices": [choice(text, tokens, gen.finish_reason, 0)], "usage": gen.usage}

    def chunks() -> Iterator[dict]:
        it = iter(gen)
        try:
            if echo:
                yield {**head, "choices": [choice(echo_text, gen.prompt_logprobs if lp_on else [], None, 0)]}
            for piece in it:
                yield {**head, "choices": [choice(piece.text, piece.tokens, None, len(echo_text))]}
            yield {**head, "choices": [choice("", [], gen.finish_reason, 0)]}
            if include_usage:
                yield {**head, "choices": [], "usage": gen.usage}
        finally:
            it.close()

    return Call(gen, result, chunks)


def _shifted(t: TokenLogprob, shift: int) -> TokenLogprob:
    return TokenLogprob(t.id, t.text, t.logprob, t.top, t.offset + shift)


# -- chat completions ---------------------------------------------------------------------------

def chat_completion(model, messages: list, max_tokens: int | None = None, *, stream: bool = False,
                    **kwargs: Any) -> dict | Stream:
    """See the module docstring and prepare_chat_completion."""
    call = prepare_chat_completion(model, messages, max_tokens, stream=stream, **kwargs)
    return call.stream() if stream else call.result()


def prepare_chat_completion(model, messages: list, max_tokens: int | None = None, *, stream: bool = False,
                            logprobs: bool = False, top_logprobs: int | None = None, tools: list | None = None,
                            chat_template_kwargs: dict | None = None, stream_options: dict | None = None,
                            **sampling: Any) -> Call:
    """The model's chat template over messages (with the generation prompt), then a completion of
    it, checked. chat_template_kwargs are extra template variables (enable_thinking=False for
    Qwen3, ...)."""
    _check_sampling(sampling)
    include_usage = _check_stream_options(stream, stream_options)
    if not isinstance(logprobs, bool):
        raise TypeError(f"logprobs must be a bool for chat completions (top_logprobs=n for alternatives), "
                        f"got {type(logprobs).__name__}")
    if top_logprobs is not None and not logprobs:
        raise ValueError("top_logprobs needs logprobs=True")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise TypeError(f"chat_template_kwargs must be a dict, got {type(chat_template_kwargs).__name__}")
    ids = model.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, tools=tools,
                                    **(chat_template_kwargs or {}))
    n_top = (top_logprobs or 0) if logprobs else None
    gen = Generation(model, ids, GenerationOptions(max_tokens=max_tokens, logprobs=n_top, **sampling))
    head = _head("chat.completion", model)
    chunk_head = {**head, "object": "chat.completion.chunk"}

    def result() -> dict:
        pieces = list(gen)
        tokens = [t for p in pieces for t in p.tokens]
        message = {"role": "assistant", "content": "".join(p.text for p in pieces)}
        return {**head, "choices": [{"index": 0, "message": message,
                                     "logprobs": _chat_logprobs(tokens) if logprobs else None,
                                     "finish_reason": gen.finish_reason}], "usage": gen.usage}

    def chunk(delta: dict, piece: Piece | None = None, finish: str | None = None) -> dict:
        lp = _chat_logprobs(piece.tokens) if (logprobs and piece is not None) else None
        return {**chunk_head, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

    def chunks() -> Iterator[dict]:
        it = iter(gen)
        try:
            yield chunk({"role": "assistant", "content": ""})
            for piece in it:
                yield chunk({"content": piece.text}, piece)
            yield chunk({}, finish=gen.finish_reason)
            if include_usage:
                yield {**chunk_head, "choices": [], "usage": gen.usage}
        finally:
            it.close()

    return Call(gen, result, chunks)
