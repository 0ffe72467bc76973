"""`python -m rlx serve` against the official openai client (the protocol's oracle): a live server
on 127.0.0.1 (a free port it picks itself) in a subprocess, for stories260K and for a random Qwen3
with the real chat template. Completions and chat completions, streamed and not, equal what the
library gives in-process; two concurrent requests each get their own text; a chat's next turn is
served from the cache; a client that disconnects mid-stream cancels its generation; bad requests
get a 400 with a message, and the server stays up."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from chat_paths import STORIES

import rlx

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]


class Server:
    """python -m rlx serve --port 0 in a subprocess; .url once it listens."""

    def __init__(self, model: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "rlx", "serve", "--model", str(model), "--port", "0"],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()  # a full pipe would block the server
        deadline = time.monotonic() + 120
        self.url = None
        while self.url is None:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise RuntimeError("the server did not start in 120 s") from None
            if "[rlx] serving" in line:
                self.url = line.rsplit(" on ", 1)[1].strip()
            elif self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {line}")
        self.client = openai.OpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=60)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def raw(self, path: str, data: bytes | None = None) -> tuple[int, dict]:
        """(status, JSON body) of a plain HTTP request (what a client other than openai's sends)."""
        root = self.url.rsplit("/v1", 1)[0]
        req = urllib.request.Request(root + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def health(self) -> dict:
        return self.raw("/health")[1]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def stories_server():
    if not (STORIES / "config.json").is_file():
        pytest.skip(f"no stories260K at {STORIES}")
    s = Server(STORIES)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def qwen3_server(qwen3_dir):
    s = Server(qwen3_dir)
    yield s
    s.stop()


def test_models_and_completions_equal_the_library(stories_server):
    c = stories_server.client
    assert [m.id for m in c.models.list().data] == ["hf"]
    lib = rlx.load(STORIES)
    want = lib.create_completion("Once upon a time", max_tokens=24, temperature=0)
    got = c.completions.create(model="hf", prompt="Once upon a time", max_tokens=24, temperature=0)
    assert got.choices[0].text == want["choices"][0]["text"] and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 24 and got.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    chunks = list(c.completions.create(model="hf", prompt="Once upon a time", max_tokens=24, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want["choices"][0]["text"]
    assert chunks[-1].usage.completion_tokens == 24
    lp = c.completions.create(model="hf", prompt="Once upon a time", max_tokens=4, temperature=0, logprobs=2)
    assert len(lp.choices[0].logprobs.token_logprobs) == 4 and len(lp.choices[0].logprobs.top_logprobs[0]) == 2
    stopped = c.completions.create(model="hf", prompt="Once upon a time", max_tokens=24, temperature=0, stop=["girl"])
    assert stopped.choices[0].finish_reason == "stop" and "girl" not in stopped.choices[0].text


def test_two_concurrent_streams_each_get_their_own_text(stories_server):
    c = stories_server.client
    prompts = ["Once upon a time", "The dog ran to"]
    lib = rlx.load(STORIES)
    alone = [lib.generate(p, max_new_tokens=60, temperature=0) for p in prompts]
    got: dict[int, str] = {}
    started = threading.Barrier(2)

    def run(i):
        started.wait()
        stream = c.completions.create(model="hf", prompt=prompts[i], max_tokens=60, temperature=0, stream=True)
        got[i] = "".join(ch.choices[0].text for ch in stream)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [got.get(0), got.get(1)] == alone


def test_concurrent_requests_and_a_list_of_prompts_are_batched(stories_server):
    """Four concurrent requests and one request of three prompts: each answer is the library's
    for its prompt alone, and the server's model advanced several sequences per plan step."""
    c = stories_server.client
    prompts = ["Once upon a time", "The dog ran to", "Lily had a", "One day"]
    lib = rlx.load(STORIES)
    alone = [lib.generate(p, max_new_tokens=40, temperature=0) for p in prompts]
    before = stories_server.health()
    got: dict[int, str] = {}
    started = threading.Barrier(4)

    def run(i):
        started.wait()
        r = c.completions.create(model="hf", prompt=prompts[i], max_tokens=40, temperature=0)
        got[i] = r.choices[0].text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [got.get(i) for i in range(4)] == alone
    many = c.completions.create(model="hf", prompt=prompts[:3], max_tokens=40, temperature=0)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    assert [ch.text for ch in many.choices] == alone[:3]
    assert many.usage.completion_tokens == 120
    after = stories_server.health()
    assert after["batched_steps"] > before["batched_steps"], (before, after)
    assert after["batched_rows"] - before["batched_rows"] >= 2 * (after["batched_steps"] - before["batched_steps"])


def test_chat_equals_the_library_streamed_and_reuses_the_prefix(qwen3_server, qwen3_dir):
    c = qwen3_server.client
    lib = rlx.load(qwen3_dir)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    want = lib.create_chat_completion(msgs, max_tokens=10, temperature=0)
    got = c.chat.completions.create(model="qwen3", messages=msgs, max_tokens=10, temperature=0)
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    chunks = list(c.chat.completions.create(model="qwen3", messages=msgs, max_tokens=10, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == got.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == got.choices[0].finish_reason
    nxt = msgs + [{"role": "assistant", "content": got.choices[0].message.content},
                  {"role": "user", "content": "And again?"}]
    second = c.chat.completions.create(model="qwen3", messages=nxt, max_tokens=5, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    lp = c.chat.completions.create(model="qwen3", messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                   top_logprobs=2, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert len(lp.choices[0].logprobs.content) == 3
    assert all(len(e.top_logprobs) == 2 for e in lp.choices[0].logprobs.content)


def test_a_disconnect_mid_stream_cancels_the_generation(qwen3_server):
    c = qwen3_server.client
    before = qwen3_server.health()
    no_eos = {"151643": -100, "151645": -100}
    with c.completions.create(model="qwen3", prompt="Tell me everything", max_tokens=3000, temperature=0,
                              logit_bias=no_eos, stream=True) as stream:
        for i, _ in enumerate(stream):
            if i == 3:
                break
    # leaving the block closed the connection; the server stops that generation
    deadline = time.monotonic() + 30
    while True:
        h = qwen3_server.health()
        if h["active"] == 0 and h["cancelled"] > before["cancelled"]:
            break
        assert time.monotonic() < deadline, h
        time.sleep(0.05)
    assert h["cancelled"] == before["cancelled"] + 1
    assert h["completion_tokens"] - before["completion_tokens"] < 3000


def test_bad_requests_get_400_with_a_message_and_the_server_stays_up(qwen3_server):
    c = qwen3_server.client
    cases = [
        (lambda: c.completions.create(model="qwen3", prompt="x", temperature=-1), "temperature"),
        (lambda: c.completions.create(model="qwen3", prompt="x", n=2), "n=1"),
        (lambda: c.completions.create(model="qwen3", prompt=["a", "b"], stream=True), "one prompt"),
        (lambda: c.completions.create(model="qwen3", prompt=["a", [10**9]]), "vocabulary"),
        (lambda: c.chat.completions.create(model="qwen3", messages=[{"content": "no role"}]), "role"),
        (lambda: c.chat.completions.create(model="qwen3", messages="hi"), "list of dicts"),
        (lambda: c.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "x"}],
                                           extra_body={"bogus": 1}), "bogus"),
        (lambda: c.completions.create(model="qwen3", prompt=[10**9]), "vocabulary"),
    ]
    for call, words in cases:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.status_code == 400 and words in str(e.value), str(e.value)
    status, body = qwen3_server.raw("/v1/completions", data=b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = qwen3_server.raw("/v1/chat/completions", data=b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]["message"]
    ok = c.completions.create(model="qwen3", prompt="Hi", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2 and qwen3_server.health()["status"] == "ok"
