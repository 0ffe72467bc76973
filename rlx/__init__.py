"""rlx: an ML compiler and runtime for LLM inference.

The C core (graph builder, passes, kernels, backends) lives in the extension ``rlx._C``; this
package adds the Python-side builder (``rlx.Graph``), configs, weight loading and the NumPy
references (``rlx.reference``).

    g = rlx.Graph(); x = g.input("x", ("SEQ", 64)); ...
    plan = rlx.compile(g, device="cpu"); plan.set_param(...); outs = plan.run({"x": x_array})

Errors: bad arguments, shapes, dtypes and names raise ValueError; allocation failures raise
MemoryError; anything else from the core raises ``rlx.Error`` (a RuntimeError).
"""

from rlx import _C
from rlx._C import Device, Error, build_info, get_num_threads, set_num_threads
from rlx.config import LlamaConfig, Qwen3Config, load_config
from rlx.errors import ConfigError, WeightsError
from rlx.generator import Generator, SampleOpts, Sequence
from rlx.stages import PipelineDecodeStage, PipelineStage
from rlx.api import Model, load
from rlx.tokenizer import Tokenizer
from rlx.compile_cache import CompileCache
from rlx.graph import Graph, Plan, Value, compile
from rlx.weights import Packed, load_weights
from rlx import dtypes

__version__ = "0.1.0"

backends = _C.backends


def devices() -> list[dict]:
    """The devices that can be opened, each a dict: name (for ``device=``), backend, and for a GPU
    its device name, driver, type, subgroup size, memory and limits (numbers as int)."""
    return [{k: int(v) if v.isdigit() else v for k, v in d.items()} for d in _C.devices()]

__all__ = [
    "Generator",
    "Sequence",
    "Device",
    "Packed",
    "dtypes",
    "PipelineStage",
    "PipelineDecodeStage",
    "Model",
    "load",
    "Tokenizer",
    "SampleOpts",
    "Graph",
    "Value",
    "Plan",
    "compile",
    "CompileCache",
    "Error",
    "build_info",
    "set_num_threads",
    "get_num_threads",
    "backends",
    "devices",
    "LlamaConfig",
    "Qwen3Config",
    "load_config",
    "load_weights",
    "ConfigError",
    "WeightsError",
    "__version__",
]
