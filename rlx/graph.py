"""The graph builder: ``rlx.Graph`` (one method per op), ``rlx.Value`` and ``rlx.compile``.

A thin layer over ``rlx._C.Graph``; the C core does all checking (shape inference runs as each
node is added, so a bad shape raises ``ValueError`` from the call that adds the node, naming the
node, its op and the shapes).

Shapes are tuples whose entries are ints or dim strings. A dim string is an affine expression
over named symbols (``SEQ``, ``PAST``, ``BATCH`` are predefined; any other name creates a
symbol)::

    dim  := term ('+' term)*
    term := INT | NAME | INT '*' NAME          e.g. "SEQ", "PAST+SEQ", "2*SEQ+1", "64"

Whitespace is ignored; a NAME starts with a letter or '_'. Symbols are bound at run time from
the shapes of the inputs, so one compiled plan serves every sequence length.

    g = rlx.Graph()
    x = g.input("x", ("SEQ", 64))
    w = g.param("w", (64, 32))
    g.output(g.matmul(x, w), "y")
    plan = rlx.compile(g)             # device="cpu"
    plan.set_param("w", w_array)
    (y,) = plan.run({"x": x_array})
    plan.run({"x": x_array}, out={"y": y})   # y written in place (no copy, no arena space)

This module must stay free of numerics: it only describes graphs.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence, Union

from . import _C

Dim = Union[int, str]

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*\Z")
_INT = re.compile(r"-?[0-9]+\Z")


def parse_dim(dim: Dim):
    """Encodes one dim for ``_C.Graph``: an int stays an int; a string becomes
    ``(c, [(symbol, coef), ...])`` (or an int when it has no symbol)."""
    if isinstance(dim, bool):
        raise TypeError(f"a dim must be an int or a str, got {dim!r}")
    if isinstance(dim, int):
        return dim
    if not isinstance(dim, str):
        raise TypeError(f"a dim must be an int or a str, got {dim!r}")
    text = "".join(dim.split())
    if not text:
        raise ValueError("empty dim string")
    const = 0
    coefs: dict[str, int] = {}
    for term in text.split("+"):
        if _INT.match(term):
            const += int(term)
            continue
        coef_text, star, name = term.rpartition("*")
        if not star:
            coef_text, name = "1", term
        if not _INT.match(coef_text) or not _NAME.match(name):
            raise ValueError(f"bad dim {dim!r}: term {term!r} is not INT, NAME or INT*NAME")
        coefs[name] = coefs.get(name, 0) + int(coef_text)
    terms = [(name, c) for name, c in coefs.items() if c != 0]
    return (const, terms) if terms else const


def parse_shape(shape: Iterable[Dim]) -> list:
    """Encodes a shape (a sequence of int | str) for ``_C.Graph``."""
    if isinstance(shape, (int, str)):
        raise TypeError(f"a shape must be a sequence of dims, got {shape!r}")
    return [parse_dim(d) for d in shape]


def _decode_dim(text: str) -> Dim:
    return int(text) if _INT.match(text) else text


class Value:
    """One node of a Graph: its id, and its inferred dtype and shape (ints and dim strings)."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: "Graph", id: int):
        self.graph = graph
        self.id = id

    def _info(self):
        return self.graph._g.info(self.id)

    @property
    def op(self) -> str:
        return self._info()[0]

    @property
    def dtype(self) -> str:
        return self._info()[1]

    @property
    def shape(self) -> tuple:
        return tuple(_decode_dim(d) for d in self._info()[2])

    @property
    def name(self) -> str:
        return self._info()[3]

    def __repr__(self) -> str:
        op, dtype, dims, name = self._info()
        label = f" {name!r}" if name else ""
        return f"Value(%{self.id} {op}{label}: {dtype}[{', '.join(dims)}])"


class Graph:
    """A graph under construction. Each op method takes Values and returns a new Value."""

    def __init__(self):
        self._g = _C.Graph()

    # -- leaves and outputs ----------------------------------------------------------------
    def input(self, name: str, shape: Sequence[Dim], dtype: str = "f32") -> Value:
        return Value(self, self._g.input(name, dtype, parse_shape(shape)))

    def param(self, name: str, shape: Sequence[Dim], dtype: str = "f32") -> Value:
        return Value(self, self._g.param(name, dtype, parse_shape(shape)))

    def output(self, value: Value, name: str) -> Value:
        self._g.output(self._id(value), name)
        return value

    # -- ops ---------------------------------------------------------------------------------
    def matmul(self, a: Value, b: Value, transpose_b: bool = False) -> Value:
        """a (..., K) @ b (K, N), or b (N, K) read transposed -> (..., N)."""
        return self._op("matmul", [a, b], {"trans_b": bool(transpose_b)})

    def embedding(self, table: Value, ids: Value) -> Value:
        """table (V, D), ids i32 (...) -> (..., D); an id outside [0, V) raises at run."""
        return self._op("embedding", [table, ids])

    def rmsnorm(self, x: Value, w: Value, eps: float = 1e-6) -> Value:
        return self._op("rmsnorm", [x, w], {"eps": float(eps)})

    def rope(self, x: Value, pos: Value, inv_freq: Value, interleaved: bool = False) -> Value:
        """x (S, H, D), pos i32 (S), inv_freq (D/2): RoPE turning element i with i + D/2 (rotate-half),
        or 2i with 2i + 1 when interleaved."""
        return self._op("rope", [x, pos, inv_freq], {"interleaved": bool(interleaved)})

    def softmax(self, x: Value) -> Value:
        return self._op("softmax", [x])

    def silu(self, x: Value) -> Value:
        return self._op("silu", [x])

    def add(self, a: Value, b: Value) -> Value:
        """a + b, b's shape a suffix of a's (broadcast over the leading dims)."""
        return self._op("add", [a, b])

    def mul(self, a: Value, b: Value) -> Value:
        return self._op("mul", [a, b])

    def attention(self, q: Value, k: Value, v: Value, mask: Value | None = None,
                  scale: float | None = None, causal: bool = True, window: int = 0) -> Value:
        """q (S, Hq, D) f32, k/v (T, Hkv, D) f32, f16 or bf16 [, mask (S, T)] -> (S, Hq, D).

        The keys are positions 0..T-1 and the queries the last S of them (T >= S): with causal,
        query i sees keys j <= T - S + i; window > 0 also needs j > T - S + i - window. scale
        defaults to 1/sqrt(D) (D must then be a constant); mask is f32 additive or u8 (nonzero =
        may attend)."""
        if scale is None:
            head_dim = q.shape[-1]
            if not isinstance(head_dim, int) or head_dim <= 0:
                raise ValueError(f"attention: scale=None needs a constant head dim, got {head_dim!r}")
            scale = 1.0 / math.sqrt(head_dim)
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        attrs = {"scale": float(scale), "causal": bool(causal), "window": int(window)}
        return self._op("attention", inputs, attrs)

    def convert(self, x: Value, dtype: str) -> Value:
        """x f32 -> dtype ("f32", "f16" or "bf16"), each value rounded to nearest even."""
        return self._op("convert", [x], {"dtype": dtype})

    def gather_last(self, x: Value) -> Value:
        """x (S, ...) -> (1, ...): the last row along axis 0."""
        return self._op("gather_last", [x])

    def concat(self, a: Value, b: Value, axis: int = 0) -> Value:
        return self._op("concat", [a, b], {"axis": int(axis)})

    def slice(self, x: Value, axis: int, start: int, length: int) -> Value:
        """x[start : start+length] along axis; a negative start counts from the end."""
        return self._op("slice", [x], {"axis": int(axis), "start": int(start), "len": int(length)})

    def reshape(self, x: Value, shape: Sequence[Dim]) -> Value:
        return self._op("reshape", [x], {"shape": parse_shape(shape)})

    def topk(self, x: Value, k: int) -> Value:
        """x f32 (..., N) -> i32 (..., k): the indices of the k largest values of each row, largest
        first, exactly those torch.topk returns on the CPU (ties included; NaN counts as largest)."""
        return self._op("topk", [x], {"k": int(k)})

    def matmul_id(self, a: Value, ids: Value, w: Value) -> Value:
        """a (S, A, K) with A = 1 or n, ids i32 (S, n), w (E, N, K) stacked experts -> (S, n, N): row
        j of token s is a[s, 0 if A == 1 else j] @ w[ids[s, j]]^T. Only the named experts are read;
        an id outside [0, E) raises at run."""
        return self._op("matmul_id", [a, ids, w])

    def moe_combine(self, y: Value, probs: Value, ids: Value, norm: bool = False) -> Value:
        """y (S, n, H), probs (S, E), ids i32 (S, n) -> (S, H): sum over j of w[s, j] * y[s, j], w[s, j] =
        probs[s, ids[s, j]], divided by the row's sum of them when norm."""
        return self._op("moe_combine", [y, probs, ids], {"norm": bool(norm)})

    # -- inspection --------------------------------------------------------------------------
    def symbol(self, name: str) -> int:
        return self._g.symbol(name)

    @property
    def node_count(self) -> int:
        return self._g.node_count

    def dump(self) -> str:
        return self._g.dump()

    def __repr__(self) -> str:
        return f"<rlx.Graph with {self._g.node_count} nodes>"

    # -- helpers -----------------------------------------------------------------------------
    def _id(self, v: Value) -> int:
        if not isinstance(v, Value):
            raise TypeError(f"expected an rlx.Value, got {type(v).__name__}")
        if v.graph is not self:
            raise ValueError(f"{v!r} belongs to another graph")
        return v.id

    def _op(self, op: str, inputs: list, attrs: dict | None = None) -> Value:
        return Value(self, self._g.op(op, [self._id(v) for v in inputs], attrs))


Plan = _C.Plan


def compile(graph: Graph | _C.Graph, device: str = "cpu", fuse: bool = True,
            caps: dict[str, int] | None = None) -> Plan:
    """Compiles graph for a backend ("cpu" or "ref"); the graph is not modified.

    fuse runs the fusion pass (silu*mul, residual add + rmsnorm); caps bounds symbols
    ({"SEQ": 512}) for capacity planning. The GIL is released while compiling."""
    g = graph._g if isinstance(graph, Graph) else graph
    return _C.compile(g, device, fuse, caps)
