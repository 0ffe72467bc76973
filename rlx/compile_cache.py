"""CompileCache: the generator's plan policies for your own graphs.

A family of graphs differs only in some dims (sequence length, batch, ...). ``build(dims)``
returns the graph for a dict of dims; the cache decides which plans to compile and keep:

    oneshot   one plan, specialised to the exact dims, recompiled when they change
    lru       the `capacity` most recently used exact-dim plans
    bucketed  each dim rounded up to a power of two (at most `max_value`); the caller pads its
              inputs to ``cache.bucket(**dims)`` and masks what the padding would change
    dynamic   one plan built with symbolic dims: build receives each dim's symbol name (a str)
              instead of an int; ``caps`` bounds the symbols for memory planning

    cache = rlx.CompileCache(build, policy="dynamic", caps={"SEQ": 512})
    plan = cache.plan(SEQ=37)      # the same plan for every SEQ
"""

from __future__ import annotations

import collections
import time
from typing import Callable

from rlx.graph import Graph, Plan, compile

POLICIES = ("oneshot", "lru", "bucketed", "dynamic")


def _pow2_ceil(v: int) -> int:
    r = 1
    while r < v:
        r *= 2
    return r


class CompileCache:
    def __init__(self, build: Callable[[dict], Graph], device: str = "cpu", policy: str = "oneshot",
                 capacity: int = 4, max_value: int | None = None, caps: dict[str, int] | None = None,
                 fuse: bool = True, params: dict | None = None):
        """params: {name: array} set on every plan compiled (zero-copy where the device allows)."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if max_value is not None and (not isinstance(max_value, int) or isinstance(max_value, bool) or max_value < 1):
            raise ValueError(f"max_value must be a positive int, got {max_value!r}")
        self._build, self._device, self._policy = build, device, policy
        self._capacity = capacity if policy == "lru" else 1
        self._max_value, self._caps, self._fuse = max_value, caps, fuse
        self._params = dict(params or {})
        self._plans: collections.OrderedDict[tuple, Plan] = collections.OrderedDict()
        self.compiles = 0
        self.hits = 0
        self.compile_seconds = 0.0

    @property
    def policy(self) -> str:
        return self._policy

    def bucket(self, **dims: int) -> dict[str, int]:
        """The dims a plan is compiled for under this policy (the identity except for bucketed)."""
        out = {}
        for name, v in dims.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"dim {name} must be a positive int, got {v!r}")
            if self._policy == "bucketed":
                b = _pow2_ceil(v)
                if self._max_value is not None:
                    if v > self._max_value:
                        raise ValueError(f"dim {name}={v} exceeds max_value {self._max_value} of the bucketed cache")
                    b = min(b, self._max_value)
                v = b
            out[name] = v
        return out

    def plan(self, **dims: int) -> Plan:
        """The plan for these dims, compiled on a miss."""
        concrete = self.bucket(**dims)
        key = ("dynamic", *sorted(dims)) if self._policy == "dynamic" else tuple(sorted(concrete.items()))
        if key in self._plans:
            self._plans.move_to_end(key)
            self.hits += 1
            return self._plans[key]
        graph_dims = {name: name for name in dims} if self._policy == "dynamic" else concrete
        t0 = time.perf_counter()
        plan = compile(self._build(graph_dims), device=self._device, fuse=self._fuse,
                       caps=self._caps if self._policy == "dynamic" else None)
        for name, arr in self._params.items():
            plan.set_param(name, arr)
        self.compile_seconds += time.perf_counter() - t0
        self.compiles += 1
        while len(self._plans) >= self._capacity and self._policy != "bucketed":
            self._plans.popitem(last=False)
        self._plans[key] = plan
        return plan

    def stats(self) -> dict:
        return {"policy": self._policy, "compiles": self.compiles, "hits": self.hits,
                "plans_cached": len(self._plans), "compile_seconds": self.compile_seconds}

    def clear(self) -> None:
        """Drops every plan."""
        self._plans.clear()
