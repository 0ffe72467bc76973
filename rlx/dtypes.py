"""The dtypes rlx knows, from the C core's traits table (``rlx._C.dtypes()``): one row per dtype
with its block size (elements per block: 1 for plain types, 32 for Q8_0, ...), its bytes per block,
whether it holds real numbers, and the NumPy dtype that holds its elements (None for block types,
which travel as raw uint8 blocks with their logical shape). Nothing here is typed out twice: a
dtype added to the C table appears here, and only the NumPy side (which array dtype carries it) is
named below.

    rlx.dtypes.DTYPES["q8_0"].block_size   # 32
    rlx.dtypes.parse("bfloat16").name      # "bf16"
    rlx.dtypes.of_array(np.zeros(3, np.float16)).name   # "f16"
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from rlx import _C

__all__ = ["DType", "DTYPES", "parse", "of_array", "nbytes", "FLOAT_DTYPES", "KV_DTYPES"]

# The NumPy dtype of each element type the core has (block types have none).
_NUMPY = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i32": np.dtype(np.int32),
    "u8": np.dtype(np.uint8),
}
_ALIASES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int32": "i32", "uint8": "u8", "bool": "u8"}


@dataclasses.dataclass(frozen=True)
class DType:
    name: str                   # "f32", "q8_0"
    id: int                     # enum rlx_dtype
    block_size: int             # elements per block
    type_size: int              # bytes per block
    is_float: bool              # holds real numbers (a weight may be of it)
    numpy: np.dtype | None      # the array dtype of its elements; None for block types

    @property
    def is_block(self) -> bool:
        return self.block_size > 1


DTYPES: dict[str, DType] = {
    row["name"]: DType(row["name"], row["id"], row["block_size"], row["type_size"], row["is_float"],
                       _NUMPY.get(row["name"]))
    for row in _C.dtypes()
}
# Real-valued dtypes a weight may have, and the dtypes a KV cache may have.
FLOAT_DTYPES = tuple(n for n, d in DTYPES.items() if d.is_float)
KV_DTYPES = ("f32", "f16", "bf16")


def parse(name: str) -> DType:
    """The dtype named `name` or an alias ("float32", "bfloat16"); ValueError naming the known ones."""
    if isinstance(name, DType):
        return name
    key = _ALIASES.get(name, name) if isinstance(name, str) else None
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})")
    return DTYPES[key]


def of_array(arr) -> DType | None:
    """The rlx dtype whose elements an array holds (float32 -> f32, ml_dtypes.bfloat16 -> bf16, ...),
    or None."""
    dt = np.asarray(arr).dtype if not isinstance(arr, np.ndarray) else arr.dtype
    for d in DTYPES.values():
        if d.numpy is not None and d.numpy == dt:
            return d
    return None


def nbytes(dtype: str | DType, shape) -> int:
    """Bytes of a tensor of this dtype and shape; ValueError when its rows are not whole blocks."""
    d = parse(dtype)
    shape = tuple(int(s) for s in shape)
    if shape and shape[-1] % d.block_size:
        raise ValueError(f"{d.name} holds blocks of {d.block_size} elements: rows of {shape[-1]} are not whole blocks")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return n // d.block_size * d.type_size
