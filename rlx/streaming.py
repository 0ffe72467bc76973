"""Text out of a token stream: incremental decoding and stop strings.

``IncrementalDecoder`` turns ids appended one at a time into text deltas whose concatenation is
the text of all of them, decoding only a short window each time (the ids of the last delta and the
ones not emitted yet), so the cost per token does not grow with the length of the text. The window
starts one delta back because tokenizers decode a piece differently at the start of a text (a
SentencePiece "▁word" loses its space there): the delta is decode(window + new) minus
decode(window). A trailing incomplete UTF-8 character (decoded as U+FFFD) is held back until the
token that completes it, for at most ``MAX_HELD`` tokens (a byte sequence that never completes is
then emitted as it decodes).

``StopStrings`` finds stop strings in the generated text. Text that might be the start of a stop
string is held back (never emitted) until the following text rules the match in or out, so a stop
string split across tokens or deltas is never shown; when one matches, the text before it is the
last that is emitted.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["IncrementalDecoder", "StopStrings", "MAX_HELD"]

# A UTF-8 character has at most 4 bytes and every token carries at least one, so a character still
# incomplete after 4 held tokens never completes.
MAX_HELD = 4
# Ids of the context before the first new token that the first window starts with.
_CONTEXT = 4


class IncrementalDecoder:
    """Text deltas of the ids pushed after ``context`` (the prompt's ids: only its last few are
    read). ``decoded_ids`` counts the ids handed to tokenizer.decode so far (the work done)."""

    def __init__(self, tokenizer, context: Sequence[int] = ()):
        self._decode = tokenizer.decode
        self._ids = [int(i) for i in list(context)[-_CONTEXT:]]
        self._start = 0                 # the window: self._ids[self._start:]
        self._read = len(self._ids)     # ids before this index are emitted
        self.decoded_ids = 0

    def _text(self, ids: list[int]) -> str:
        self.decoded_ids += len(ids)
        return self._decode(ids)

    def _delta(self, force: bool) -> str:
        head = self._text(self._ids[self._start:self._read])
        full = self._text(self._ids[self._start:])
        if not force and full.endswith("\ufffd") and len(self._ids) - self._read < MAX_HELD:
            return ""
        delta = full[len(head):] if full.startswith(head) else full
        del self._ids[:self._read]     # the next window starts at the ids of this delta
        self._start, self._read = 0, len(self._ids)
        return delta

    def push(self, token: int) -> str:
        """Appends one id; returns the text it completes ("" while a character is incomplete)."""
        self._ids.append(int(token))
        return self._delta(force=False)

    def flush(self) -> str:
        """The text of ids still held (an incomplete character at the very end, as it decodes)."""
        return self._delta(force=True) if len(self._ids) > self._read else ""

    def peek(self, token: int) -> str:
        """The text `token` would add now, without adding it (for logprobs' token strings)."""
        window = self._ids[self._start:]
        head, full = self._text(window), self._text(window + [int(token)])
        return full[len(head):] if full.startswith(head) else full


class StopStrings:
    """Feed text deltas in with ``push``; it returns the text safe to emit. ``stopped`` turns True
    when a stop string appears, after which nothing more is emitted; ``flush`` gives the text held
    back at the end of a generation that did not stop on a string."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def push(self, delta: str) -> str:
        if self.stopped:
            return ""
        text = self._held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return text[:cut]
        keep = self._partial(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def _partial(self, text: str) -> int:
        """The length of the longest end of `text` that begins some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if s.startswith(text[len(text) - n:]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        out, self._held = ("" if self.stopped else self._held), ""
        return out
