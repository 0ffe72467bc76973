"""rlx: an LLM inference compiler and runtime with a C core. Start here:

    import rlx
    model = rlx.load("path/to/model")          # a Hugging Face directory or a .gguf file
    model.generate("Once upon a time", max_new_tokens=64)              # -> str (transformers' names)
    model.create_completion("Once upon a time", max_tokens=32, stop=["."])   # OpenAI-shaped dict
    model.create_chat_completion([{"role": "user", "content": "Hi"}])      # the model's chat template
    for chunk in model.create_chat_completion(messages, stream=True): ...   # chunks as they come
    # python -m rlx serve --model PATH          an OpenAI-compatible HTTP server
    rlx.quantize("path/to/hf-model", "model.gguf", type="q4_k_m")   # a GGUF file llama.cpp reads

Underneath (see each name's help): rlx.Generator / rlx.Sequence (token ids in and out, KV caches,
fork / extend / truncate / save_state), rlx.SampleOpts, rlx.load_config / rlx.load_weights,
rlx.Tokenizer, rlx.ChatTemplate, and the compiler: rlx.Graph -> rlx.compile(g, device="cpu") ->
plan.run({...}); rlx.CompileCache; rlx.quantize. The C core is the extension rlx._C (typed in rlx/_C.pyi).

Errors: bad arguments, shapes, dtypes and names raise ValueError (TypeError for a wrong type);
allocation failures raise MemoryError; anything else from the core raises ``rlx.Error`` (a
RuntimeError). Logging goes to the standard logging module under "rlx", quiet by default
(rlx.logs).
"""

import os

from rlx import _C, dtypes, logs  # noqa: F401 (rlx.logs: the logging set-up, imported for its effect)
from rlx._C import Device, Error, build_info, get_num_threads, set_num_threads
from rlx.api import Model, load
from rlx.chat_template import ChatTemplate
from rlx.compile_cache import CompileCache
from rlx.config import LlamaConfig, Qwen3Config, Qwen3MoeConfig, load_config
from rlx.errors import ConfigError, WeightsError
from rlx.generator import Generator, SampleOpts, Sequence
from rlx.graph import Graph, Plan, Value, compile
from rlx.quantize import quantize
from rlx.stages import PipelineDecodeStage, PipelineStage
from rlx.tokenizer import Tokenizer
from rlx.weights import Packed, load_weights

__version__ = "0.1.0"

_CPU_ISA_CAPS = ("scalar", "avx2", "avx512", "avx512bf16")


def _check_environment() -> None:
    """RLX_CPU_ISA caps the vector ISA the C core's CPU kernels dispatch to (it can only lower what
    cpuid offers; rlx.build_info()["isa"] says what they use). The core reads it when its kernels
    first run and would ignore a value it does not know, so such a value is refused at import."""
    cap = os.environ.get("RLX_CPU_ISA")
    if cap not in (None, "") and cap not in _CPU_ISA_CAPS:
        raise ValueError(f"RLX_CPU_ISA={cap!r} is not one of {', '.join(_CPU_ISA_CAPS)} (unset it for the best "
                         "this CPU has)")


_check_environment()

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
    "ChatTemplate",
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
    "Qwen3MoeConfig",
    "load_config",
    "load_weights",
    "quantize",
    "ConfigError",
    "WeightsError",
    "__version__",
]
