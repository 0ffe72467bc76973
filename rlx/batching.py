"""Many sequences at once: one plan step advances a batch of sequences of one model, each over its
own KV cache, reading every weight once for all of them (decode is bound by reading the weights,
so B sequences cost little more than one).

    gen = rlx.Generator.from_pretrained(path)
    gen.generate_batch([ids_a, ids_b, ids_c], 32)          # -> one list of new ids per prompt
    seqs = [gen.new_sequence() for _ in range(3)]           # or step them yourself:
    for s, ids in zip(seqs, prompts): s.prefill(ids)
    gen.step_batch(seqs, opts)                              # -> one new token per sequence

The core (rlx_seq_batch_logits, csrc/gen/seq.c) runs the positions each sequence has not cached
yet: a decode step is one position per sequence, a new prompt many; ``chunk`` bounds the positions
one sequence runs per step, so a long prompt enters in pieces between the others' decode steps
instead of stalling them. Up to 16 sequences per step (RLX_MAX_BATCH).

Two ways in:
- ``generate_batch`` (one thread): continuous batching over a list of prompts: up to
  ``max_batch`` sequences step together, a finished one (its token budget or a stop id) leaves at
  once and the next prompt takes its place.
- ``Batcher`` (many threads): each thread asks for its own sequence's logits; the calls that meet
  while a batch runs go together in the next one. rlx.load's Model steps every generation through
  one, so the server's concurrent requests (each on a worker thread) are batched without knowing
  of each other. A generation is counted as a member while it runs (``Batcher.join`` / ``leave``): a step
  waits up to GATHER_S for every active one to ask, so threads that are between two steps
  (sampling, decoding text) are not left to alternate in batches of one.

Parity: every row of a batch is computed on its own (attention over its own cache; a product's
rows do not mix), but which kernel multiplies depends on the number of rows. On cpu the decode
kernels (the matvec and the blocked passes: csrc/backends/cpu/matmul.c, quant.c) compute each row
as alone, whatever the rows beside it, up to a number of rows per dtype and machine (f32 4; f16
16; bf16 3 with AVX512_BF16, 6 with AMX, 16 otherwise; block types 6 with AVX-512 VNNI (Q8_0 4),
16 with AMX-INT8 (the K types 4), 12 with AVX2, 4 on the scalar path): a decode step of that many
sequences gives each exactly the logits it gets alone. Larger steps take the batched kernels
(sgemm, the bf16 GEMM and its lanes path, the AMX tiles, the quant lanes kernel: 1.2-2x the
aggregate speed at 8 and 16 sequences, benchmarks/README.md), which sum the same products in
another order: each sequence's logits then agree with its own to rounding (0.3-0.4 % of the
logits' scale with bf16 weights; with block types, where such a difference carries an
activation across a step of its 8-bit grid, a few percent: tests/unit/test_batching.py), so its
greedy tokens may part from its own where two logits nearly tie. Generator.with_batch_invariant()
runs every product of a decode step as groups of rows the decode kernels keep row by row: each
sequence gets exactly its own logits and tokens at every batch size, at the price of reading the
weights once per group (generate_batch, and a Batcher made with batch_invariant=True, as rlx.load's
is when asked, then run each prompt by itself). Prefill chunks that make a product of more than
16 rows take the prefill kernels (sgemm, the bf16 and integer GEMMs) and a prompt's positions the
prefill attention, so a sequence entering beside others agrees with itself alone to rounding, not
bitwise (Qwen3-0.6B, a 5-token prompt prefilled beside a 30-token one: 0.45 % of the logits' scale
with bf16 weights, 1.5 % with q8_0; f32 within 1e-5).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from typing import Callable, Iterable
from typing import Sequence as Seq

import numpy as np

from rlx import _C

__all__ = ["MAX_BATCH", "Batcher", "logits_batch", "step_batch", "generate_batch"]

MAX_BATCH = 16  # RLX_MAX_BATCH in csrc/include/rlx/model.h
GATHER_S = 0.002  # the longest a Batcher step waits for an active member that has not asked yet


def _c_seqs(seqs) -> list:
    out = []
    for s in seqs:
        c = getattr(s, "_c", None)
        if not isinstance(c, _C.Sequence):
            raise TypeError(f"expected rlx sequences, got {type(s).__name__}")
        out.append(c)
    return out


def _chunk(chunk: int) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise ValueError(f"chunk must be an int >= 0 (0: no limit), got {chunk!r}")
    return chunk


def logits_batch(seqs: Seq, chunk: int = 0) -> list[np.ndarray | None]:
    """Runs the uncached positions of up to 16 sequences of one model in one plan (at most chunk
    of them per sequence when chunk > 0); each sequence's (vocab,) next-token logits, or None for
    one whose chunk left positions uncached."""
    return _C.Sequence.batch_logits(_c_seqs(seqs), _chunk(chunk))


def step_batch(seqs: Seq, opts=None, chunk: int = 0) -> list[int | None]:
    """logits_batch, then each sequence whose logits are ready samples its next token (opts: one
    SampleOpts for all or one per sequence; the draw index is the token's position, as in
    step_cached) and appends it. None for a sequence still entering in chunks."""
    return _C.Sequence.batch_step(_c_seqs(seqs), opts, _chunk(chunk))


def generate_batch(generator, prompts: Seq[Seq[int]], max_tokens: int, opts=None, *,
                   stop_ids: Iterable[int] | None = None, max_batch: int = MAX_BATCH, chunk: int = 256,
                   on_token: Callable[[int, int], object] | None = None) -> list[list[int]]:
    """Up to max_tokens new ids for each prompt (a list of token ids), generated by continuous
    batching: at most max_batch sequences step together; one that has made max_tokens or a token
    in stop_ids (kept in its output, as generate_cached keeps it) leaves, and the next prompt
    joins, entering in pieces of `chunk` positions (0: whole) while the others decode.
    on_token(prompt_index, token) is called after each token. opts: one SampleOpts for all, or one
    per prompt. Returns the new ids of each prompt, in prompt order."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= MAX_BATCH:
        raise ValueError(f"max_batch must be an int in [1, {MAX_BATCH}], got {max_batch!r}")
    chunk = _chunk(chunk)
    prompts = [list(p) for p in prompts]
    per_prompt = isinstance(opts, (list, tuple))
    if per_prompt and len(opts) != len(prompts):
        raise ValueError(f"opts: {len(opts)} options for {len(prompts)} prompts")
    stops = frozenset(int(i) for i in (stop_ids or ()))
    outs: list[list[int]] = [[] for _ in prompts]
    waiting = deque(i for i in range(len(prompts)) if max_tokens > 0)
    active: list[tuple[int, object]] = []  # (prompt index, sequence)
    for i, p in enumerate(prompts):  # every prompt checked before anything runs
        if not p:
            raise ValueError(f"prompt {i} is empty")
    alone_first = getattr(generator, "batch_invariant", False)  # Generator.with_batch_invariant

    def took(i: int, tok: int) -> bool:
        """Records prompt i's new token; whether it goes on."""
        outs[i].append(tok)
        if on_token is not None:
            on_token(i, tok)
        return len(outs[i]) < max_tokens and tok not in stops

    while waiting or active:
        while waiting and len(active) < max_batch:
            i = waiting.popleft()
            seq = generator.new_sequence()
            seq.prefill(prompts[i])
            if alone_first and not took(i, seq.step_cached(opts[i] if per_prompt else opts)):
                continue  # its first step, alone, was its last
            active.append((i, seq))
        if not active:
            break
        toks = step_batch([s for _, s in active], [opts[i] for i, _ in active] if per_prompt else opts, chunk)
        still = []
        for (i, seq), tok in zip(active, toks):
            if tok is None or took(i, tok):  # None: still entering its prompt
                still.append((i, seq))
        active = still
    return outs


class Batcher:
    """Batches the logits requests of threads: ``logits(seq)`` returns seq's next-token logits
    (as seq's own cached step would); calls from several threads that meet while a batch runs go
    together in the next one (up to max_batch sequences; a prompt enters in pieces of `chunk`
    positions, so a long one does not stall the others). A lone call runs on the sequence's own
    plans (its prefill in one pass). Sequences must belong to one model.

    batch_invariant: the sequences' model has batch-invariant plans (Generator.with_batch_invariant);
    a call with a prompt to enter then runs alone, one at a time, so each call gets the logits its
    sequence gets stepped alone.

    A caller that will ask step after step (a generation) joins (``join`` / ``leave``, or ``with
    batcher.member():``); a step then waits, up to GATHER_S, until every member has asked (or
    max_batch have), so the
    members' steps go together even when their threads reach the batcher at different moments (a
    member that is slow between steps, e.g. a client reading its stream, costs the others at
    most GATHER_S a step)."""

    def __init__(self, max_batch: int = MAX_BATCH, chunk: int = 256, batch_invariant: bool = False):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be an int in [1, {MAX_BATCH}], got {max_batch!r}")
        if not isinstance(batch_invariant, bool):
            raise TypeError(f"batch_invariant must be a bool, got {type(batch_invariant).__name__}")
        self.max_batch = max_batch
        self.chunk = _chunk(chunk)
        # the sequences' model has batch-invariant plans (Generator.with_batch_invariant): a sequence
        # with a prompt to enter runs it by itself, as a lone call would, not in chunks beside others
        self.batch_invariant = batch_invariant
        self._cv = threading.Condition()
        self._pending: list[_Request] = []
        self._running = False
        self._members = 0       # joined callers: each will ask again soon
        self.batches = 0        # batch steps run (with more than one sequence)
        self.batched_rows = 0   # sequences those steps advanced, in all

    def join(self) -> None:
        """Counts one more member: steps wait (up to GATHER_S) for its call. Pair with leave()."""
        with self._cv:
            self._members += 1

    def leave(self) -> None:
        with self._cv:
            self._members -= 1
            self._cv.notify_all()

    @contextlib.contextmanager
    def member(self):
        """join() on entry, leave() on exit."""
        self.join()
        try:
            yield self
        finally:
            self.leave()

    def logits(self, seq) -> np.ndarray:
        """seq's (vocab,) next-token logits after its history (its cache brought up to it)."""
        req = _Request(seq)
        with self._cv:
            self._pending.append(req)
            self._cv.notify_all()  # a step gathering its members may be waiting for this call
            while not req.done:
                if not self._running:
                    self._lead(req)
                else:
                    self._cv.wait()
        if req.error is not None:
            raise req.error
        return req.result

    def _lead(self, mine: "_Request") -> None:
        """With the condition held: runs one batch of the pending requests (releasing the
        condition while it runs), then wakes the waiters. A batch that fails is run again one
        sequence at a time (a failed batch changes no sequence), so each error reaches the call
        it belongs to; Ctrl-C reaches the leading call only, the others are run again later."""
        self._running = True
        deadline = time.monotonic() + GATHER_S
        try:
            while len(self._pending) < min(self._members, self.max_batch):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
        except BaseException:  # Ctrl-C while gathering: nothing ran; another call may lead
            self._pending.remove(mine)
            self._running = False
            self._cv.notify_all()
            raise
        # batch-invariant plans: a prompt to enter runs alone (one at a time, the others next step)
        entering = [r for r in self._pending if _entering(r.seq)] if self.batch_invariant else []
        batch = entering[:1] or self._pending[:self.max_batch]
        for r in batch:
            self._pending.remove(r)
        self._cv.release()
        outcome: list = []  # per request: ("ok", logits or None) or ("error", exception)
        interrupted: BaseException | None = None
        try:
            try:
                if len(batch) == 1:
                    outcome = [("ok", batch[0].seq._c.logits(cached=True))]
                else:
                    outcome = [("ok", r) for r in logits_batch([r.seq for r in batch], self.chunk)]
                    self.batches += 1
                    self.batched_rows += len(batch)
            except Exception as e:
                if len(batch) == 1:
                    outcome = [("error", e)]
                else:
                    outcome = [self._alone(r) for r in batch]
        except BaseException as e:  # KeyboardInterrupt: before the batch finished
            interrupted = e
        finally:
            self._cv.acquire()
        self._running = False
        requeue = []
        if interrupted is not None and mine not in batch:
            self._pending.remove(mine)
            mine.error, mine.done = interrupted, True
        for i, r in enumerate(batch):
            if interrupted is not None:
                if r is mine:
                    r.error, r.done = interrupted, True
                else:
                    requeue.append(r)
                continue
            kind, value = outcome[i]
            if kind == "error":
                r.error, r.done = value, True
            elif value is None:  # a chunk of its prompt ran; more to go
                requeue.append(r)
            else:
                r.result, r.done = value, True
        self._pending[:0] = requeue
        self._cv.notify_all()

    @staticmethod
    def _alone(r: "_Request") -> tuple:
        try:
            return ("ok", r.seq._c.logits(cached=True))
        except Exception as e:
            return ("error", e)


def _entering(seq) -> bool:
    """Whether seq's next logits run a prompt (positions from the first, or more than its newest one)
    rather than one decode position."""
    return seq._c.kv_len == 0 or seq._c.n_tokens - seq._c.kv_len > 1


class _Request:
    __slots__ = ("seq", "done", "result", "error")

    def __init__(self, seq):
        self.seq = seq
        self.done = False
        self.result = None
        self.error = None
