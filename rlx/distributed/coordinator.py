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

    def barrier(self) -> None:
        self.group.barrier()
