"""Shared helpers of the benchmark scripts: the two model shapes, their random-weight files (one
Hugging Face directory and one GGUF file per model and dtype, written once to benchmarks/.cache/),
the machine's read bandwidth, the decode ceiling, and small formatting helpers.

Model files (see `ensure_model`):

    $CACHE/models/<model>-<dtype>/config.json + model-0000N-of-0000M.safetensors
                                 + model.safetensors.index.json
    $CACHE/models/<model>-<dtype>.gguf

CACHE is $RLX_BENCH_CACHE when set (e.g. /tmp/rlx-bench: the files are 2-10 GB each and belong
outside the repository), else benchmarks/.cache (git-ignored).

Every 2-D weight is N(0, 0.02) and every norm 1 + N(0, 0.02), drawn from a NumPy generator
seeded with (SEED, tensor index), so the files are the same on every machine. The bf16 files
hold the f32 numbers rounded to nearest even. The GGUF files are written with the `gguf`
package from the very arrays of the safetensors files (read back memory-mapped), in llama.cpp's
layout for arch "qwen3" / "llama":

- Llama's q and k rows are permuted as llama.cpp's convert_hf_to_gguf.py does (llama.cpp
  applies RoPE to interleaved pairs, Hugging Face to the two halves of each head); Qwen3 runs
  NEOX (rotate-half) RoPE in llama.cpp and is stored unpermuted.
- llama3 RoPE scaling is stored as the `rope_freqs.weight` tensor of per-frequency divisors,
  computed as convert_hf_to_gguf.py does.
- The tokenizer is a dummy SentencePiece-style vocabulary ("llama" model: <unk>, <s>, </s>,
  the 256 byte tokens, then "t<N>"): the benchmark feeds token ids, never text.

A finished file set is marked by a `.done` file holding FORMAT_VERSION; change the version
when the layout changes and the cache is rewritten.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CACHE = os.environ.get("RLX_BENCH_CACHE") or os.path.join(HERE, ".cache")
MODEL_DIR = os.path.join(CACHE, "models")
RESULTS = os.path.join(HERE, "results")

SEED = 20240611
FORMAT_VERSION = "1"
SHARD_BYTES = 1 << 30  # safetensors shard size (bounded memory while writing)

# Hugging Face config.json of each model (real shapes; random weights).
MODELS: dict[str, dict] = {
    "Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 28,
        "initializer_range": 0.02,
        "use_cache": True,
    },
    "Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "use_cache": True,
    },
}

DTYPES = ("f32", "bf16")
GGUF_ARCH = {"qwen3": "qwen3", "llama": "llama"}


# ------------------------------------------------------------------------------- shapes ----

def expected_shapes(model: str) -> dict[str, tuple[int, ...]]:
    """{HF tensor name: shape} in layer order (the same list rlx.weights.expected_weights gives,
    computed here so that writing the files needs no rlx build)."""
    c = MODELS[model]
    H, D, I, V = c["hidden_size"], c["head_dim"], c["intermediate_size"], c["vocab_size"]
    q_out, kv_out = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, H)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, H)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, q_out)
        if c["model_type"] == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (D,)
            shapes[p + "self_attn.k_norm.weight"] = (D,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
    shapes["model.norm.weight"] = (H,)
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def itemsize(dtype: str) -> int:
    return {"f32": 4, "bf16": 2, "f16": 2}[dtype]


def weight_bytes(model: str, dtype: str) -> int:
    """Bytes of every weight as stored (2-D in dtype, norms in the same dtype in the HF file)."""
    return sum(math.prod(s) * itemsize(dtype) for s in expected_shapes(model).values())


def decode_bytes_per_token(model: str, dtype: str) -> int:
    """Bytes of weights one decode step must read: every 2-D projection of every layer and the
    LM head once (the tied embedding is the LM head; the embedding lookup reads one row, not
    counted), at the dtype's width. Norms and the KV cache are left out."""
    total = 0
    c = MODELS[model]
    for name, s in expected_shapes(model).items():
        if len(s) != 2:
            continue
        if name == "model.embed_tokens.weight" and not c["tie_word_embeddings"]:
            continue  # untied: lm_head.weight is counted instead
        total += math.prod(s) * itemsize(dtype)
    return total


def kv_bytes(model: str, positions: int, elem_bytes: int = 4) -> int:
    c = MODELS[model]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * positions * elem_bytes


# ------------------------------------------------------------------------------ writing ----

def _tensor(model_index: int, index: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([SEED, model_index, index])
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(0.02)
    if len(shape) == 1:  # RMSNorm weights (incl. q_norm / k_norm): around 1
        x += np.float32(1.0)
    return x


def model_paths(model: str, dtype: str) -> dict[str, str]:
    base = os.path.join(MODEL_DIR, f"{model}-{dtype}")
    return {"hf": base, "gguf": base + ".gguf"}


def _done(path: str) -> bool:
    try:
        with open(path + ".done") as f:
            return f.read().strip() == FORMAT_VERSION
    except OSError:
        return False


def _mark_done(path: str) -> None:
    with open(path + ".done", "w") as f:
        f.write(FORMAT_VERSION + "\n")


def _write_hf(model: str, dtype: str, log) -> None:
    """One HF directory: config.json, shards of <= SHARD_BYTES and the index. bf16 is read from
    the f32 directory (written first) and rounded, so both hold the same numbers."""
    import ml_dtypes
    from safetensors.numpy import save_file

    out = model_paths(model, dtype)["hf"]
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cfg = dict(MODELS[model])
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)

    shapes = expected_shapes(model)
    src = None
    if dtype != "f32":
        src = _open_hf_arrays(model_paths(model, "f32")["hf"])
    mi = list(MODELS).index(model)
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nb = math.prod(shape) * itemsize(dtype)
        if groups[-1] and size + nb > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nb
    names = list(shapes)
    weight_map, total = {}, 0
    t0 = time.perf_counter()
    for gi, group in enumerate(groups):
        fname = f"model-{gi + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for name in group:
            if src is None:
                arr = _tensor(mi, names.index(name), name, shapes[name])
            else:
                arr = np.asarray(src[name]).astype(ml_dtypes.bfloat16)
            tensors[name] = arr
            weight_map[name] = fname
            total += arr.nbytes
        save_file(tensors, os.path.join(tmp, fname), metadata={"format": "pt"})
        del tensors
        log(f"  {model} {dtype}: shard {gi + 1}/{len(groups)} ({time.perf_counter() - t0:.0f} s)")
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    _mark_done(out)


def _open_hf_arrays(path: str) -> dict[str, np.ndarray]:
    """{name: read-only memory-mapped array} of an HF directory (rlx.load_weights when rlx is
    importable; otherwise safetensors' NumPy loader)."""
    try:
        import rlx  # noqa: F401
        return rlx.load_weights(path)
    except Exception:
        from safetensors.numpy import load_file
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        out: dict[str, np.ndarray] = {}
        for fn in files:
            out.update(load_file(os.path.join(path, fn)))
        return out


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: rotate-half rows -> interleaved."""
    return np.ascontiguousarray(
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py computes it for rope_type llama3."""
    s = cfg["rope_scaling"]
    dim = cfg["head_dim"]
    base = cfg["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    out = []
    for freq in freqs:
        wl = 2 * math.pi / freq
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", hf)
    assert m, hf
    part = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
            "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
            "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down"}[m.group(2)]
    return f"blk.{m.group(1)}.{part}.weight"


def add_header(w, name: str, file_type, cfg, rope_dims: bool = True, vocab_size: bool = True) -> None:
    """The GGUF writer w's name, file type and quantization version, then cfg's decoder
    hyperparameters as rlx.quantize writes them (cfg: HF config names, as attributes)."""
    import gguf

    from rlx.quantize import write_hparams

    w.add_name(name)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_hparams(w, cfg, rope_dims=rope_dims, vocab_size=vocab_size)


def add_dummy_vocab(w, V: int) -> None:
    """A dummy SentencePiece-style vocabulary of V ids on the GGUF writer w ("llama": <unk>, <s>,
    </s>, the 256 byte tokens, then t<i>): the benchmarks feed ids, so only the ids matter."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(len(tokens), V)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (V - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)


def _write_gguf(model: str, dtype: str, log) -> None:
    import gguf

    cfg = MODELS[model]
    arch = GGUF_ARCH[cfg["model_type"]]
    paths = model_paths(model, dtype)
    src = _open_hf_arrays(paths["hf"])
    tmp = paths["gguf"] + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    add_header(w, f"{model} (random weights, rlx benchmark)",
               gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_BF16,
               SimpleNamespace(**cfg))
    add_dummy_vocab(w, cfg["vocab_size"])

    if cfg["model_type"] == "llama" and cfg.get("rope_scaling"):
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    for name, shape in expected_shapes(model).items():
        arr = np.asarray(src[name])
        if arr.ndim == 1:
            arr = arr.astype(np.float32)  # llama.cpp keeps norms in f32
        elif cfg["model_type"] == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in name else cfg["num_key_value_heads"]
            arr = permute_qk(arr, heads)
        if arr.dtype == np.float32:
            w.add_tensor(_gguf_name(name), arr)
        else:  # bfloat16: raw 16-bit words
            w.add_tensor(_gguf_name(name), arr.view(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)
    t0 = time.perf_counter()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, paths["gguf"])
    _mark_done(paths["gguf"])
    log(f"  {model} {dtype}: GGUF written ({time.perf_counter() - t0:.0f} s)")


def ensure_model(model: str, dtype: str, need_gguf: bool = True, log=print) -> dict[str, str]:
    """Writes the model's files once (f32 first: bf16 is derived from it); returns their paths."""
    if dtype != "f32":
        ensure_model(model, "f32", need_gguf=False, log=log)
    paths = model_paths(model, dtype)
    os.makedirs(MODEL_DIR, exist_ok=True)
    if not _done(paths["hf"]):
        log(f"== writing {model} {dtype} safetensors to {os.path.relpath(paths['hf'], ROOT)}")
        _write_hf(model, dtype, log)
    if need_gguf and not _done(paths["gguf"]):
        log(f"== writing {model} {dtype} GGUF to {os.path.relpath(paths['gguf'], ROOT)}")
        _write_gguf(model, dtype, log)
    return paths


# ---------------------------------------------------------------------------- machine ----

def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform_processor()


def platform_processor() -> str:
    import platform
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))
    except OSError:
        pass
    return []


_READ_C = r"""
#include <pthread.h>
#include <stddef.h>
#include <immintrin.h>
typedef struct { const float *p; size_t n; float out; } job_t;
static void *run(void *arg) {
    job_t *j = (job_t *)arg;
    const float *p = j->p;
    size_t n = j->n, i = 0;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#elif defined(__AVX__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    }
    float t[8]; _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
#else
    float s = 0.0f;
#endif
    for (; i < n; i++) s += p[i];
    j->out = s;
    return NULL;
}
float read_sum(const float *p, size_t n, int threads) {
    pthread_t th[64]; job_t jobs[64];
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    size_t chunk = (n / threads) & ~(size_t)63;
    for (int t = 0; t < threads; t++) {
        jobs[t].p = p + t * chunk;
        jobs[t].n = t == threads - 1 ? n - t * chunk : chunk;
        if (t) pthread_create(&th[t], NULL, run, &jobs[t]);
    }
    run(&jobs[0]);
    float s = jobs[0].out;
    for (int t = 1; t < threads; t++) { pthread_join(th[t], NULL); s += jobs[t].out; }
    return s;
}
"""


def _read_lib():
    """Compiles the streaming-read kernel above once (cc -O2 -march=native -pthread)."""
    os.makedirs(CACHE, exist_ok=True)
    src = os.path.join(CACHE, "readbw.c")
    lib = os.path.join(CACHE, "readbw.so")
    if not os.path.exists(lib) or not os.path.exists(src) or open(src).read() != _READ_C:
        with open(src, "w") as f:
            f.write(_READ_C)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O2", "-march=native", "-shared", "-fPIC", "-pthread", src, "-o", lib + ".tmp"],
                       check=True, capture_output=True)
        os.replace(lib + ".tmp", lib)
    so = ctypes.CDLL(lib)
    so.read_sum.restype = ctypes.c_float
    so.read_sum.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return so


class BandwidthProbe:
    """read_bandwidth, repeated cheaply: keeps the 1 GiB array and the kernel between calls.
    `sample(t)` times a few passes; `result(t)` is the best pass over every sample so far (on a
    shared machine other load only lowers a pass, so sampling between cells finds the
    machine's real rate) with the median of the samples' bests beside it."""

    def __init__(self, nbytes: int = 1 << 30):
        self.nbytes = nbytes
        self.a = None
        self.samples: dict[int, list[float]] = {}
        self.method = ""

    def sample(self, threads: int, reps: int = 5) -> float:
        if self.a is None:
            self.a = np.ones(self.nbytes // 4, dtype=np.float32)
        r = read_bandwidth(threads, reps=reps, array=self.a)
        self.method = r["method"]
        self.samples.setdefault(threads, []).append(r["gbps"])
        return r["gbps"]

    def result(self, threads: int) -> dict:
        xs = self.samples.get(threads, [])
        return {"threads": threads, "gbps": max(xs) if xs else None, "gbps_median": median(xs),
                "samples": len(xs), "bytes": self.nbytes, "method": self.method}

    def close(self) -> None:
        self.a = None


def read_bandwidth(threads: int, nbytes: int = 1 << 30, reps: int = 20, array=None) -> dict:
    """Read bandwidth (GB/s, 1e9 bytes) of `threads` threads summing one 1 GiB float32 array,
    each its own contiguous slice, with 4 independent vector accumulators (a C kernel compiled
    at first use; NumPy's np.add.reduce over slices in Python threads when no C compiler is
    found). The array is written first (pages resident) and one untimed pass warms up; "gbps"
    is the best of `reps` timed passes (as STREAM reports: other load only lowers it), the
    median is kept beside it."""
    a = array if array is not None else np.ones(nbytes // 4, dtype=np.float32)
    method = "C (cc -O2 -march=native), pthreads, 4 SIMD accumulators"
    try:
        so = _read_lib()

        def one() -> None:
            so.read_sum(a.ctypes.data, a.size, threads)
    except (OSError, subprocess.CalledProcessError):
        method = "NumPy np.add.reduce over float32 slices in Python threads"
        parts = np.array_split(a, threads)

        def one() -> None:
            ths = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts[1:]]
            for t in ths:
                t.start()
            np.add.reduce(parts[0])
            for t in ths:
                t.join()
    one()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"threads": threads, "gbps": a.nbytes / times[0] / 1e9,
            "gbps_median": a.nbytes / times[len(times) // 2] / 1e9, "bytes": a.nbytes, "method": method}


# ---------------------------------------------------------------------------- helpers ----

def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def fmt(x, digits: int = 1) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return "—"
    return f"{x:.{digits}f}"


def peak_rss_mib() -> float:
    """This process's own peak RSS: VmHWM, the high-water mark of its address space (ru_maxrss is
    inherited from the parent across fork and exec, so a child reports at least the parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def current_rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def replace_readme_section(path: str, title: str, body: str) -> None:
    """Replaces the `## title` section of a Markdown file (up to the next `## ` heading) with
    body, or appends it; other sections are left as they are."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    head = f"## {title}"
    start = next((i for i, l in enumerate(lines) if l.rstrip() == head), None)
    section = head + "\n\n" + body.rstrip() + "\n"
    if start is None:
        new = text.rstrip() + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        rest = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + rest if rest else "")
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":  # python benchmarks/common.py [model ...]: write the model files
    for m in sys.argv[1:] or list(MODELS):
        for d in DTYPES:
            ensure_model(m, d)
