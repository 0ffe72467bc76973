"""Helpers of the Vulkan suite: running a graph on a device, random block-type weights, and the
parity figures (the largest |vulkan - oracle| seen per check, printed at the end of the run and
written to build/vulkan_parity.json)."""

from __future__ import annotations

import numpy as np

import rlx
from rlx import _C

BLOCK_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
FLOAT_TYPES = ["f32", "f16", "bf16"]

# offsets of each block type's f16 scales (d, and dmin / m where the type has one) in its block
_SCALES = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q2_k": (80, 82),
           "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}

PARITY: dict[str, float] = {}


def record(what: str, got, want, relative: bool = False) -> float:
    """Records max |got - want| under `what` (the worst over the run; relative: divided by max |want|,
    for outputs whose size is arbitrary, as products of random block-type weights) and returns it."""
    want = np.asarray(want, np.float64)
    diff = float(np.max(np.abs(np.asarray(got, np.float64) - want))) if np.size(want) else 0.0
    if relative and diff:
        diff /= float(np.abs(want).max())
    PARITY[what] = max(PARITY.get(what, 0.0), diff)
    return diff


def randn(rng, *shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def run(g, device: str, inputs: dict, params: dict | None = None, fuse: bool = True) -> list:
    plan = rlx.compile(g, device=device, fuse=fuse)
    for name, arr in (params or {}).items():
        plan.set_param(name, arr)
    return plan.run(inputs)


def block_weight(name: str, rows: int, cols: int, rng) -> tuple[tuple, np.ndarray]:
    """A (rows, cols) weight of a block type: random bytes (every bit pattern of the values and
    packed scales) with finite f16 scales of a plausible size. Returns (the tuple set_param takes,
    its exact f32 values from the core's dequantisation)."""
    d = rlx.dtypes.DTYPES[name]
    blocks = cols // d.block_size
    raw = rng.integers(0, 256, size=(rows, blocks, d.type_size), dtype=np.uint8)
    for off in _SCALES[name]:
        scale = rng.uniform(0.002, 0.02, size=(rows, blocks)).astype(np.float16)
        raw[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, blocks, 2)
    raw = np.ascontiguousarray(raw.reshape(rows, blocks * d.type_size))
    return (raw, name, (rows, cols)), _C.to_f32(raw.reshape(-1), name).reshape(rows, cols)
