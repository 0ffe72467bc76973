"""The pipeline coordinator: moves hidden states rank to rank and the sampled token back to every
rank. Rank world-1 embeds, each rank runs its block and sends its hidden rows to rank-1, rank 0
turns its logits into a token with sample_fn (and decides stop with stop_fn), and broadcasts it so
every rank returns the same sequence. Hidden states cross the wire once per token per hop.

    co = PipelineCoordinator(ProcessGroup(transport))
    new_ids = co.generate(stage, prompt, 16, sample_fn=lambda logits: int(logits.argmax()))
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

TAG_HIDDEN = 1


class ProcessGroup:
    """The ranks of one pipeline over a transport (TcpTransport or MpiTransport)."""

    def __init__(self, transport):
        self.transport = transport

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def world(self) -> int:
        return self.transport.world

    def send_array(self, dst: int, arr: np.ndarray) -> None:
        self.transport.send_array(dst, TAG_HIDDEN, np.ascontiguousarray(arr, dtype=np.float32))

    def recv_array(self, src: int, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, dtype=np.float32)
        self.transport.recv_array(src, TAG_HIDDEN, out)
        return out

    def broadcast_ints(self, values: Sequence[int], root: int = 0) -> list[int]:
        buf = np.array(values, dtype=np.int64)
        self.transport.broadcast(root, buf)
        return [int(v) for v in buf]

    def barrier(self) -> None:
        self.transport.barrier()


class PipelineCoordinator:
    def __init__(self, group: ProcessGroup):
        self.group = group
        self.timings = {"compute": 0.0, "send": 0.0, "wait": 0.0, "steps": 0}

    def _step(self, stage, tokens: Sequence[int], sample_fn: Callable, stop_fn: Callable | None) -> tuple[int, bool]:
        g, t = self.group, self.timings
        rank, world, hidden_size = g.rank, g.world, stage.config.hidden_size
        t0 = time.perf_counter()
        if rank == world - 1:
            out = stage.forward(tokens=list(tokens))
        else:
            h = g.recv_array(rank + 1, (len(tokens), hidden_size))
            t1 = time.perf_counter()
            t["wait"] += t1 - t0
            t0 = t1
            out = stage.forward(hidden=h)
        t1 = time.perf_counter()
        t["compute"] += t1 - t0
        msg = [0, 0]
        if rank > 0:
            g.send_array(rank - 1, out)
            t["send"] += time.perf_counter() - t1
        else:
            token = int(sample_fn(out))
            msg = [token, int(bool(stop_fn(token))) if stop_fn else 0]
        if world > 1:
            t0 = time.perf_counter()
            msg = g.broadcast_ints(msg, root=0)
            t["wait"] += time.perf_counter() - t0
        t["steps"] += 1
        return msg[0], bool(msg[1])

    def forward_step(self, stage, tokens: Sequence[int], sample_fn: Callable[[np.ndarray], int]) -> int:
        """One step: tokens are the whole sequence for a PipelineStage, the new positions for a
        PipelineDecodeStage. sample_fn(logits) runs on rank 0; every rank returns its token."""
        return self._step(stage, tokens, sample_fn, None)[0]

    def generate(self, stage, tokens: Sequence[int], n: int, sample_fn: Callable[[np.ndarray], int],
                 stop_fn: Callable[[int], bool] | None = None) -> list[int]:
        """Up to n new tokens after `tokens` (the prompt, on every rank). stop_fn(token) is decided on
        rank 0 and broadcast; every rank returns the same list."""
        if not tokens:
            raise ValueError("the prompt is empty")
        stage.reset()
        history, new = list(tokens), []
        for i in range(n):
            feed = history if (not stage.cached or i == 0) else history[-1:]
            token, stop = self._step(stage, feed, sample_fn, stop_fn)
            new.append(token)
            history.append(token)
            if stop:
                break
        return new

    def generate_many(self, stage, prompts: Sequence[Sequence[int]], n: int,
                      sample_fn: Callable[[np.ndarray, int], int],
                      stop_fn: Callable[[int, int], bool] | None = None) -> list[list[int]]:
        """Up to n new tokens after each prompt (the same prompts on every rank), the requests
        micro-batched through the pipeline: request j runs in the stage's slot j, and while rank r
        computes one request's step, rank r + 1 computes the next one's, so with at least `world`
        requests every rank is busy. sample_fn(logits, j) and stop_fn(token, j) run on rank 0; every
        rank returns the same lists, each request's tokens those generate() gives it alone.

        The schedule is a sequence of ticks that every rank derives from the same facts (the
        prompts and the broadcast tokens): at tick t the last rank starts micro-step t (the next
        request, round robin, whose previous token is known: it was broadcast at tick t - 1 or
        before; none: a bubble), rank r works on micro-step t - (world - 1 - r), and rank 0's token
        for micro-step t - (world - 1) is broadcast to all at the end of tick t."""
        g, tm = self.group, self.timings
        rank, world, hidden_size = g.rank, g.world, stage.config.hidden_size
        if any(not p for p in prompts):
            raise ValueError("a prompt is empty")
        W = len(prompts)
        histories = [list(p) for p in prompts]
        new: list[list[int]] = [[] for _ in prompts]
        live = [n > 0] * W          # still generating
        ready = [True] * W          # its next micro-step's input is known
        started = [False] * W
        for j in range(W):
            stage.reset(slot=j)
        steps: list[tuple[int, list[int]] | None] = []  # micro-step -> (request, fed ids) or a bubble
        nxt, t = 0, 0
        while True:
            # the last rank's micro-step for this tick (every rank computes the same choice)
            pick = None
            for k in range(W):
                j = (nxt + k) % W
                if live[j] and ready[j]:
                    pick = j
                    break
            if pick is None:
                steps.append(None)
            else:
                nxt = (pick + 1) % W
                feed = histories[pick] if (not stage.cached or not started[pick]) else histories[pick][-1:]
                steps.append((pick, feed))
                started[pick], ready[pick] = True, False
            in_flight = any(steps[m] is not None for m in range(max(0, t - world + 1), t + 1))
            if pick is None and not in_flight and not any(live[j] and ready[j] for j in range(W)):
                break
            m = t - (world - 1 - rank)
            if m >= 0 and steps[m] is not None:
                j, feed = steps[m]
                t0 = time.perf_counter()
                if rank == world - 1:
                    out = stage.forward(tokens=list(feed), slot=j)
                else:
                    h = g.recv_array(rank + 1, (len(feed), hidden_size))
                    t1 = time.perf_counter()
                    tm["wait"] += t1 - t0
                    t0 = t1
                    out = stage.forward(hidden=h, slot=j)
                t1 = time.perf_counter()
                tm["compute"] += t1 - t0
                if rank > 0:
                    g.send_array(rank - 1, out)
                    tm["send"] += time.perf_counter() - t1
                else:
                    token = int(sample_fn(out, j))
                    msg = [token, int(bool(stop_fn(token, j))) if stop_fn else 0]
                tm["steps"] += 1
            m0 = t - (world - 1)  # the micro-step rank 0 finished at this tick
            if m0 >= 0 and steps[m0] is not None:
                j = steps[m0][0]
                if world > 1:
                    t0 = time.perf_counter()
                    msg = g.broadcast_ints(msg if rank == 0 else [0, 0], root=0)
                    tm["wait"] += time.perf_counter() - t0
                new[j].append(msg[0])
                histories[j].append(msg[0])
                live[j] = len(new[j]) < n and not msg[1]
                ready[j] = True
            t += 1
        return new

    def barrier(self) -> None:
        self.group.barrier()
