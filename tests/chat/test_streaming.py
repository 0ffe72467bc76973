"""Streaming text: incremental decoding does bounded work per token (ids handed to the tokenizer's
decode are counted, not timed) and its deltas add up to the tokenizer's own decoding of the whole
(SentencePiece and byte-level BPE, multi-byte characters split across tokens); stop strings that
span tokens are held back and never emitted; a list where a text is expected is a TypeError."""

from __future__ import annotations

import pytest
from chat_paths import STORIES, needs_stories

import rlx
from rlx.streaming import MAX_HELD, IncrementalDecoder, StopStrings

TEXT = ("Once upon a time, a café served crème brûlée — 日本語のテキスト, emoji 🦊🌲 and tabs\tand\nnewlines. "
        "Lily said: \"I like it!\" ") * 8


def tokenizers_under_test(qwen3_dir):
    out = [("qwen3-bpe", rlx.Tokenizer.from_dir(qwen3_dir))]
    if (STORIES / "config.json").is_file():
        out.append(("stories-spm", rlx.Tokenizer.from_dir(STORIES)))
    return out


def test_deltas_add_up_and_work_per_token_is_bounded(qwen3_dir):
    for name, tok in tokenizers_under_test(qwen3_dir):
        ids = tok.encode(TEXT)
        prompt, new = ids[:5], ids[5:]
        assert len(new) > 250, name
        dec = IncrementalDecoder(tok, prompt)
        work = []
        text = ""
        for t in new:
            before = dec.decoded_ids
            text += dec.push(t)
            work.append(dec.decoded_ids - before)
        text += dec.flush()
        want = tok.decode(prompt + new)[len(tok.decode(prompt)):]
        assert text == want, name
        # each push decodes two windows of at most (the last delta's ids + held ids + 1) ids
        assert max(work) <= 2 * (2 * MAX_HELD + 6), (name, max(work))
        assert sum(work[-100:]) <= sum(work[:100]) * 1.5, name  # no growth with the length


def test_stop_strings_are_held_back_across_deltas():
    s = StopStrings(["o w", "xyz"])
    out = [s.push(d) for d in ["Hel", "lo", " ", "wo", "rld"]]
    assert out == ["Hel", "l", "", "", ""] and s.stopped  # "lo " was held: it might have begun "o w"
    s = StopStrings(["o w"])
    out = [s.push(d) for d in ["Hel", "lo", " ", "there"]]
    assert "".join(out) + s.flush() == "Hello there" and not s.stopped
    assert out[1] == "l"  # "o" held until " t" ruled "o w" out


@needs_stories
def test_a_stop_string_spanning_tokens_is_never_streamed():
    m = rlx.load(STORIES)
    full = m.generate("Once upon a time", max_new_tokens=40)
    stop = " little gi"  # spans " little", " g" and "ir"
    assert stop in full
    stream = m.create_completion("Once upon a time", max_tokens=40, stop=[stop], stream=True)
    chunks = [c["choices"][0]["text"] for c in stream]
    text = "".join(chunks)
    assert text == full[:full.index(stop)]
    assert stream.generation.finish_reason == "stop"
    assert not any(stop[:3] in c for c in chunks[-3:])
    # a stop string's beginning that does not go on is released
    held = m.create_completion("Once upon a time", max_tokens=40, stop=[" little boy"])
    assert held["choices"][0]["text"] == full and held["choices"][0]["finish_reason"] == "length"


@needs_stories
def test_model_stream_decodes_a_bounded_number_of_ids_per_token(monkeypatch):
    m = rlx.load(STORIES)
    counted = []
    decode = m.tokenizer.decode
    monkeypatch.setattr(m.tokenizer, "decode", lambda ids: counted.append(len(ids)) or decode(ids))
    stream = m.generate("Once upon a time", max_new_tokens=400, stream=True)
    text = "".join(stream)
    n = len(stream.new_ids)
    assert n == 400 and text
    assert sum(counted) <= 30 * n  # re-decoding the whole text each token would be ~n^2 / 2 = 80,000


def test_lists_where_a_text_is_expected_raise_type_error(qwen3_dir):
    for name, tok in tokenizers_under_test(qwen3_dir):
        with pytest.raises(TypeError, match="one str"):
            tok.encode(["a", "b"])
        with pytest.raises(TypeError):
            tok.encode(None)
    m = rlx.load(qwen3_dir)
    with pytest.raises(TypeError, match="a str or a list of token ids"):
        m.create_completion([1.5, 2])
    with pytest.raises(ValueError, match="takes one prompt"):
        m.create_completion(["a", "b"], stream=True)
    with pytest.raises(TypeError):
        m.generate(b"bytes")
    with pytest.raises(TypeError, match="list of dicts"):
        m.create_chat_completion("hi")
