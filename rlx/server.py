"""An OpenAI-compatible HTTP server over one loaded model: a thin ASGI layer (Starlette, served by
uvicorn) over Model.create_completion / create_chat_completion.

    python -m rlx serve --model PATH [--host 127.0.0.1 --port 8000]

    GET  /v1/models             the one model ({"object": "list", "data": [{"id": name, ...}]})
    POST /v1/completions        OpenAI's text completions (prompt: a string or token ids)
    POST /v1/chat/completions   chat completions over the model's chat template
    GET  /health                {"status": "ok", "active", "cancelled", and Model.stats}

stream=true answers with Server-Sent Events ("data: {chunk}" lines, then "data: [DONE]").
Beyond OpenAI's fields a request may carry top_k, min_p, repeat_penalty and chat_template_kwargs
(e.g. {"enable_thinking": false}). Every request runs on its own sequence in a worker thread (the
model's weights and plans are shared; kept sequences give prefix reuse to a chat's next turn);
when a client goes away, its generation stops before the next token. A bad request gets a 400 with
OpenAI's error body ({"error": {"message", "type": "invalid_request_error", ...}}); an unexpected
failure a 500 with its message; neither stops the server.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlx import completions

__all__ = ["create_app", "serve"]

log = logging.getLogger("rlx.server")

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "stop", "seed",
           "stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "n", "user"}
_COMPLETION = _COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix"}
_CHAT = _COMMON | {"messages", "logprobs", "top_logprobs", "tools", "tool_choice", "max_completion_tokens",
                   "chat_template_kwargs", "response_format", "parallel_tool_calls"}
# fields taken as they are by the library's keyword arguments
_PASSED = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "stop", "seed", "stream", "stream_options",
           "presence_penalty", "frequency_penalty", "logit_bias")


class BadRequest(ValueError):
    pass


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def _check_fields(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unrecognized request argument(s): {', '.join(unknown)}")
    if body.get("n", 1) != 1 or body.get("best_of", 1) not in (1, None):
        raise BadRequest("only n=1 (and best_of=1) is supported")
    if body.get("suffix") is not None:
        raise BadRequest("suffix is not supported")


def _completion_kwargs(body: dict) -> dict:
    _check_fields(body, _COMPLETION)
    if "prompt" not in body:
        raise BadRequest("'prompt' is required")
    prompt = body["prompt"]  # one prompt, or several (answered in one response, their steps batched)
    kw = {k: body[k] for k in _PASSED if k in body}
    return dict(kw, prompt=prompt, max_tokens=body.get("max_tokens", 16), echo=body.get("echo", False),
                logprobs=body.get("logprobs"))


def _chat_kwargs(body: dict) -> dict:
    _check_fields(body, _CHAT)
    if "messages" not in body:
        raise BadRequest("'messages' is required")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise BadRequest("response_format: only {'type': 'text'} is supported")
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise BadRequest("tool_choice: only 'auto' and 'none' are supported")
    kw = {k: body[k] for k in _PASSED if k in body}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return dict(kw, messages=body["messages"], max_tokens=max_tokens, logprobs=body.get("logprobs") or False,
                top_logprobs=body.get("top_logprobs"), tools=None if choice == "none" else tools,
                chat_template_kwargs=body.get("chat_template_kwargs"))


class _Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.active = 0
        self.cancelled = 0

    def add(self, field: str, n: int) -> None:
        with self.lock:
            setattr(self, field, getattr(self, field) + n)


def create_app(model) -> Starlette:
    """The ASGI application serving `model` (an rlx.Model)."""
    counters = _Counters()
    created = int(time.time())

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model.name, "object": "model", "created": created, "owned_by": "rlx"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model.name, "active": counters.active,
                             "cancelled": counters.cancelled, **model.stats})

    async def body_of(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    async def run(request: Request, prepare, kwargs_of) -> Response:
        try:
            kwargs = kwargs_of(await body_of(request))
            # tokenizing and checking run in a thread too: a long prompt must not block the loop
            call = await anyio.to_thread.run_sync(lambda: prepare(model, **kwargs))
        except (BadRequest, ValueError, TypeError) as e:
            return _error(400, str(e))
        if kwargs.get("stream"):
            return StreamingResponse(_events(call), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _result(request, call)

    async def _result(request: Request, call) -> Response:
        counters.add("active", 1)
        try:
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    while (await request.receive())["type"] != "http.disconnect":
                        pass
                    call.generation.cancel()

                tg.start_soon(watch)
                result = await anyio.to_thread.run_sync(call.result)
                tg.cancel_scope.cancel()
        except Exception as e:  # noqa: BLE001 - a failure answers this request, never stops the server
            log.exception("request failed")
            return _error(500, f"{type(e).__name__}: {e}", kind="server_error")
        finally:
            counters.add("active", -1)
        if call.generation.finish_reason is None:
            counters.add("cancelled", 1)
        return JSONResponse(result)

    async def _events(call):
        stream = call.stream()
        counters.add("active", 1)
        done = False
        try:
            while True:
                chunk = await anyio.to_thread.run_sync(next, stream, None)
                if chunk is None:
                    break
                yield f"data: {json.dumps(chunk)}\n\n"
            done = True
            yield "data: [DONE]\n\n"
        except Exception as e:  # noqa: BLE001 - reported in the stream; the server goes on
            log.exception("streamed request failed")
            yield f"data: {json.dumps({'error': {'message': f'{type(e).__name__}: {e}', 'type': 'server_error'}})}\n\n"
        finally:
            # reached on the end, an error, or the client going away (the task is cancelled after
            # the worker thread's current step): stop generating and hand the sequence back
            stream.cancel()
            stream.close()
            counters.add("active", -1)
            if not done:
                counters.add("cancelled", 1)

    async def post_completions(request: Request) -> Response:
        return await run(request, completions.prepare_completion, _completion_kwargs)

    async def post_chat(request: Request) -> Response:
        return await run(request, completions.prepare_chat_completion, _chat_kwargs)

    return Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", post_completions, methods=["POST"]),
        Route("/v1/chat/completions", post_chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ])


def serve(model, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Serves model until interrupted. port 0 picks a free port; the address is printed to stderr
    ("[rlx] serving NAME on http://HOST:PORT/v1") once the socket listens."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    config = uvicorn.Config(create_app(model), log_level=log_level, lifespan="off")
    print(f"[rlx] serving {model.name} on http://{shown}:{bound}/v1", file=sys.stderr, flush=True)
    uvicorn.Server(config).run(sockets=[sock])

