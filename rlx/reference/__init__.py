"""NumPy references: `ops` (one function per rlx op, the oracle for the C kernels) and `model`
(a complete decoder forward pass written from the math, the second oracle after transformers).
Pure NumPy; never imports the C extension."""

from rlx.reference import ops
from rlx.reference.model import forward

__all__ = ["ops", "forward"]
