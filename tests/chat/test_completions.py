"""create_completion / create_chat_completion / generate: OpenAI-shaped results, finish reasons,
end-of-sequence ids from config and generation_config, generation_config's sampling defaults,
seeds, logprobs (against torch's log_softmax of logits computed another way), echo, the hooks
(logit_bias, logits_processor, stopping_criteria), prefix reuse across chat turns (measured, and
giving what a fresh prefill gives), save_state / load_state, close, and errors that leave the
model usable."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from chat_paths import STORIES, needs_stories

import rlx
from rlx.engine import Generation, GenerationOptions

PROMPT = "Once upon a time"


@pytest.fixture
def stories():
    if not (STORIES / "config.json").is_file():
        pytest.skip(f"no stories260K at {STORIES}")
    return rlx.load(STORIES)


@pytest.fixture(scope="module")
def qwen3(qwen3_dir):
    return rlx.load(qwen3_dir)


def test_completion_shape_and_text(stories):
    r = stories.create_completion(PROMPT, max_tokens=12)
    assert set(r) == {"id", "object", "created", "model", "choices", "usage"} and r["object"] == "text_completion"
    (c,) = r["choices"]
    assert c["text"] == stories.generate(PROMPT, max_new_tokens=12) and c["finish_reason"] == "length"
    assert c["logprobs"] is None and c["index"] == 0 and r["model"] == "hf"
    n_prompt = len(stories.tokenizer.encode(PROMPT))
    assert r["usage"]["prompt_tokens"] == n_prompt and r["usage"]["completion_tokens"] == 12
    assert r["usage"]["total_tokens"] == n_prompt + 12
    assert stories(PROMPT, max_tokens=12)["choices"][0]["text"] == c["text"]
    echoed = stories.create_completion(PROMPT, max_tokens=12, echo=True)["choices"][0]["text"]
    assert echoed == PROMPT + c["text"]
    ids = stories.tokenizer.encode(PROMPT)
    assert stories.create_completion(ids, max_tokens=12)["choices"][0]["text"] == c["text"]  # token ids in


def test_finish_reasons_eos_and_context_end(stories, qwen3):
    eos = stories.create_completion(PROMPT, max_tokens=20, logit_bias={2: 100})  # config.json's eos id
    assert eos["choices"][0]["finish_reason"] == "stop" and eos["usage"]["completion_tokens"] == 0
    # generation_config.json's second eos id (151643) stops too; config.json names only 151645
    assert {151643, 151645} <= qwen3.eos_token_ids
    r = qwen3.create_completion("Hi", max_tokens=20, logit_bias={151643: 100})
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 0
    long = list(range(3, 3 + 508))  # 508 of the context's 512 positions
    r = stories.create_completion(long, max_tokens=10)
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 4
    r = stories.create_completion(long, max_tokens=None, logit_bias={2: -100})
    assert r["usage"]["completion_tokens"] == 4  # None: up to the end of the context
    with pytest.raises(ValueError, match="context holds 512"):
        stories.create_completion([5] * 513)


def test_generation_config_defaults_and_seeds(stories, qwen3):
    ids = qwen3.tokenizer.encode("Hi")
    opts = Generation(qwen3, ids, GenerationOptions()).opts  # Qwen3's do_sample, temperature, top_k, top_p
    assert (opts.temperature, opts.top_k, opts.top_p) == (pytest.approx(0.6), 20, pytest.approx(0.95))
    assert Generation(qwen3, ids, GenerationOptions(temperature=0)).opts.temperature == 0.0
    assert Generation(qwen3, ids, GenerationOptions(do_sample=False)).opts.temperature == 0.0
    assert Generation(stories, [1], GenerationOptions()).opts.temperature == 0.0  # do_sample false
    # seed None: a fresh draw per call; an int reproduces
    free = {stories.generate(PROMPT, max_new_tokens=16, temperature=1.0) for _ in range(4)}
    assert len(free) > 1
    seeded = {stories.generate(PROMPT, max_new_tokens=16, temperature=1.0, seed=11) for _ in range(3)}
    assert len(seeded) == 1
    a = stories.create_completion(PROMPT, max_tokens=16, temperature=1.0, seed=11)["choices"][0]["text"]
    assert {a} == seeded


def test_logprobs_match_torch_log_softmax_of_separately_computed_logits(stories):
    torch = pytest.importorskip("torch")
    r = stories.create_completion(PROMPT, max_tokens=6, logprobs=3)
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in lp["tokens"][:-1]]))
    seq = stories.generator.new_sequence()
    ids = stories.tokenizer.encode(PROMPT)
    logits = seq.prefill_get_last_logits(ids)
    for i in range(6):
        want = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), dim=0).numpy()
        tok = int(np.argmax(logits))
        assert lp["token_logprobs"][i] == pytest.approx(want[tok], abs=1e-4)
        top = sorted(lp["top_logprobs"][i].values(), reverse=True)
        assert top[0] == pytest.approx(lp["token_logprobs"][i]) and len(top) == 3  # greedy: the best is chosen
        assert top == pytest.approx(sorted(want, reverse=True)[:3], abs=1e-4)
        logits = seq.decode_get_logits(tok)
    echo = stories.create_completion(PROMPT, max_tokens=3, logprobs=1, echo=True)["choices"][0]["logprobs"]
    assert echo["token_logprobs"][0] is None and len(echo["tokens"]) == len(ids) + 3
    assert echo["token_logprobs"][len(ids):] == pytest.approx(lp["token_logprobs"][:3], abs=1e-4)


def test_hooks_logits_processor_and_stopping_criteria(stories):
    base = stories.generate(PROMPT, max_new_tokens=8, stream=True)
    "".join(base)
    banned = base.new_ids[1]
    seen_lengths = []

    def ban(input_ids, scores):
        seen_lengths.append(len(input_ids))
        assert input_ids.dtype == np.intc and scores.dtype == np.float32
        scores[banned] = -np.inf
        return scores

    s = stories.generate(PROMPT, max_new_tokens=8, logits_processor=ban, stream=True)
    "".join(s)
    assert banned not in s.new_ids and s.new_ids[0] == base.new_ids[0]
    n_prompt = len(s.prompt_ids)
    assert seen_lengths == list(range(n_prompt, n_prompt + 8))
    r = stories.create_completion(PROMPT, max_tokens=20, stopping_criteria=lambda ids, scores: len(ids) >= n_prompt + 3)
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "stop"
    # presence / frequency penalties change what repeats
    plain = stories.create_completion(PROMPT, max_tokens=60)["choices"][0]["text"]
    pen = stories.create_completion(PROMPT, max_tokens=60, frequency_penalty=2.0)["choices"][0]["text"]
    assert plain != pen


def test_chat_completion_shapes_streaming_and_logprobs(qwen3):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    r = qwen3.create_chat_completion(msgs, max_tokens=8, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    (c,) = r["choices"]
    assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
    assert c["finish_reason"] in ("stop", "length")
    prompt = qwen3.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    assert r["usage"]["prompt_tokens"] == len(prompt)
    chunks = list(qwen3.create_chat_completion(msgs, max_tokens=8, temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
    assert text == c["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == c["finish_reason"] and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"]
    lp = qwen3.create_chat_completion(msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = lp["choices"][0]["logprobs"]["content"]
    assert len(content) == lp["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 2 and e["bytes"] == list(e["token"].encode()) for e in content)
    assert all(e["logprob"] == pytest.approx(e["top_logprobs"][0]["logprob"]) for e in content)  # greedy


def test_prefix_reuse_across_chat_turns(qwen3_dir):
    """A 4-turn chat: each turn reuses the previous turn's sequence; the replies are those of a
    model that re-prefills everything (cached_sequences=0)."""
    kept, fresh = rlx.load(qwen3_dir), rlx.load(qwen3_dir, cached_sequences=0)
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    saved = []
    for turn in ["Hello, who are you?", "Tell me about the sea.", "And the mountains?", "Thanks, bye."]:
        msgs.append({"role": "user", "content": turn})
        kw = dict(max_tokens=6, temperature=0, chat_template_kwargs={"enable_thinking": False})
        a = kept.create_chat_completion(msgs, **kw)
        b = fresh.create_chat_completion(msgs, **kw)
        assert a["choices"][0]["message"] == b["choices"][0]["message"]
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        saved.append(a["usage"]["prompt_tokens_details"]["cached_tokens"])
        msgs.append(a["choices"][0]["message"])
    assert saved[0] == 0 and all(s > 0 for s in saved[1:])
    st = kept.stats
    assert st["cached_tokens"] == sum(saved) and st["prefill_tokens"] == st["prompt_tokens"] - sum(saved)
    assert st["cached_tokens"] > st["prefill_tokens"]  # most of a long chat's prompt is not recomputed
    print(f"prefix reuse: {st['cached_tokens']} of {st['prompt_tokens']} prompt tokens served from the cache")


def test_save_state_load_state_close_and_with(qwen3_dir, tmp_path):
    msgs = [{"role": "user", "content": "Hello there"}]
    with rlx.load(qwen3_dir) as m:
        first = m.create_chat_completion(msgs, max_tokens=5, temperature=0)
        m.save_state(tmp_path / "chat.state")
        blob = m.save_state()
    with pytest.raises(ValueError, match="closed"):
        m.create_completion("x")
    msgs2 = msgs + [first["choices"][0]["message"], {"role": "user", "content": "More"}]
    other = rlx.load(qwen3_dir)
    with pytest.raises(ValueError, match="no state to save"):
        other.save_state()
    other.load_state(tmp_path / "chat.state")
    r = other.create_chat_completion(msgs2, max_tokens=5, temperature=0)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    third = rlx.load(qwen3_dir)
    third.load_state(blob)
    assert third.create_chat_completion(msgs2, max_tokens=5, temperature=0)["choices"] == r["choices"]


def test_errors_are_clear_and_leave_the_model_usable(stories, tmp_path):
    for kwargs, exc in [(dict(temperature=-1), ValueError), (dict(top_p=0), ValueError),
                        (dict(max_tokens=-1), ValueError),
                        (dict(stop=[1]), TypeError), (dict(logprobs=-2), ValueError), (dict(seed="x"), TypeError),
                        (dict(logit_bias={"x": 1}), ValueError), (dict(logit_bias={99999: 1}), ValueError),
                        (dict(logits_processor=3), TypeError),
                        (dict(stream_options={"include_usage": True}), ValueError),
                        (dict(bogus=1), TypeError)]:
        with pytest.raises(exc):
            stories.create_completion(PROMPT, **kwargs)
    with pytest.raises(ValueError, match="no chat template"):
        stories.create_chat_completion([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        stories.create_completion([1, 100000])
    assert stories.create_completion(PROMPT, max_tokens=3)["usage"]["completion_tokens"] == 3


@needs_stories
def test_paths_of_the_wrong_kind_say_what_was_expected(tmp_path):
    with pytest.raises(NotADirectoryError, match="is a file, not a model: pass its directory"):
        rlx.load(STORIES / "model.safetensors")
    with pytest.raises(NotADirectoryError, match="is a file"):
        rlx.load(STORIES / "config.json")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(IsADirectoryError, match="m.gguf: pass the file itself"):
        rlx.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        rlx.load(tmp_path / "missing")
    with pytest.raises(NotADirectoryError, match="is a file"):
        rlx.Generator.from_pretrained(STORIES / "model.safetensors")


@needs_stories
def test_progress_bar_when_asked_and_not_otherwise(capsys):
    rlx.load(STORIES, progress=True)
    assert "loading" in capsys.readouterr().err
    rlx.load(STORIES)  # None: small model, not a terminal
    rlx.load(STORIES, progress=False)
    assert capsys.readouterr().err == ""


@needs_stories
@pytest.mark.parametrize("text,field", [
    ('{"temperature": NaN}', "temperature"), ('{"temperature": Infinity}', "temperature"),
    ('{"temperature": -0.5}', "temperature"), ('{"temperature": "hot"}', "temperature"),
    ('{"top_p": 1.5}', "top_p"), ('{"top_p": 0}', "top_p"), ('{"top_k": -1}', "top_k"), ('{"top_k": 2.5}', "top_k"),
    ('{"top_k": 1e30}', "top_k"), ('{"min_p": 2}', "min_p"), ('{"repetition_penalty": 0}', "repetition_penalty"),
    ('{"do_sample": 1}', "do_sample"), ("[1, 2]", "JSON object"), ("[" * 100000, "nested too deeply"),
])
def test_bad_generation_config_is_refused_at_load_naming_the_field(tmp_path, text, field):
    """generation_config.json's sampling defaults are checked when the model loads, against the
    ranges sampling accepts, and read as config.json is (limits on size and nesting)."""
    for f in STORIES.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(rlx.ConfigError, match=field):
        rlx.load(tmp_path)


@needs_stories
def test_generation_config_fifo_is_refused_not_opened(tmp_path):
    for f in STORIES.iterdir():
        if f.name != "generation_config.json":
            shutil.copy(f, tmp_path / f.name)
    os.mkfifo(tmp_path / "generation_config.json")
    with pytest.raises(rlx.ConfigError, match="not a regular file"):
        rlx.load(tmp_path)
