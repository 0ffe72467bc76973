#!/usr/bin/env python3
"""fair_worker: one engine in a long-lived process of its own, driven by bench_fair.py.

    python benchmarks/fair_worker.py        (started by bench_fair.py; not a command for people)

The coordinator writes one JSON command per line on this process's stdin and reads one JSON
answer per line from the file descriptor that was stdout at start (fd 1 is then pointed at
stderr, so whatever the C libraries print can never corrupt the protocol). Every timing is taken
here, around the engine call alone (time.perf_counter), never around the pipe.

Commands ({"cmd": ..., args}; the answer always has "ok", and "error" when it is false):

    load      engine ("rlx" | "llama.cpp"), gguf (path), threads, kv ("f16" | "f32" | "bf16"),
              n_ctx, fa (llama.cpp: false | true), dtype (rlx only, optional: "f32" dequantises every
              packed matrix with gguf.quants at load and converts the rest: the gate's oracle) -> settings READ BACK
    logits    prompt (ids), feed (ids), out (.npy path)     -> the (1 + len(feed), vocab) logits
    first     ids: a fresh prompt to its first greedy token -> seconds, the token
    context   ids: sets the context to ids (fresh)          -> seconds, the last logits' path (out)
    extend    ids, at: cuts the context back to its first `at` positions (what a decode or a
              profile since added goes), then appends ids in one pass -> seconds, logits' path (out)
    decode    n (context length kept), tok, steps: the context is cut back to n positions, tok is
              fed, `steps` greedy tokens are generated      -> seconds for the steps, the tokens
    mem       -> rss_mib, peak_rss_mib (this process's VmHWM), kv_bytes (in use now)
    profile   n, tok (rlx only): per-op seconds of one decode step at context n
    profile_prefill  ids (rlx only): per-op seconds of a fresh prefill of ids (the context is lost)
    batch_open    b, n_ctx_seq[, slot]: b sequences decoding together (bench_batch.py) -> settings READ BACK
                  (llama.cpp: a fresh context of its own for them, below). slot names the set ("main"
                  by default; the batch_* commands take it too): a second slot keeps other sequences
                  beside it (bench_batch's "ref": one sequence, the B = 1 block timed in the same
                  round as each batch's)
    batch_logits  prompts (b lists of ids), feed (b lists of f ids), out (.npy path): every prompt run
                  in one batched pass, then f batched steps each feeding one token per sequence
                                                            -> the (b, 1 + f, vocab) logits
    batch_decode  n (b lengths kept), tok (b ids), steps: each sequence cut back to its n positions
                  and fed its tok, then `steps` batched greedy steps (b tokens each)
                                                            -> seconds for the steps, the (b, steps) tokens
    quit

The engines:
- rlx: rlx.gguf reads the GGUF file in place (the same file llama.cpp reads); rlx.Generator with
  kv_dtype and the plan policies rlx.load uses (dynamic prefill and decode plans); greedy
  tokens from generate_cached (the argmax in C). rlx.build_info() for the record is asked in a
  child process (rlx_build_info): describing the Vulkan backend loads the Vulkan driver, 47 MiB
  resident with lavapipe, that a CPU run never loads; until 12-05 it counted in rlx's peak RSS.
- llama.cpp: llama_cpp.Llama(model_path=gguf, n_ctx, n_batch=2048, n_ubatch=512 (llama-bench's
  defaults), n_threads = n_threads_batch = threads, flash_attn, type_k = type_v = kv; with
  extra_bufts false, llama_model_params.use_extra_bufts = false, llama-cli's --no-repack: no AMX or
  CPU_REPACK weight buffers, which the Llama class offers no argument for). Its log is
  captured (llama_log_set) and the flash-attention setting, the KV cache types and bytes, the
  context size and the thread counts are read back from it and from the context; greedy tokens
  are the argmax of llama_get_logits_ith(-1) (NumPy, zero-copy view).

Batched decode (batch_*; bench_batch.py):
- rlx: b sequences of the one Generator (new_sequence(), the Generator's KV type), advanced together by
  Generator.step_batch (one plan step, one token per sequence, the argmax in C) and read by
  Generator.logits_batch; the sequence's first batched step runs its whole prompt.
- llama.cpp: the model the Llama object loaded, and for b sequences a context of their own
  (llama_init_from_model: n_seq_max = b, n_ctx = b * n_ctx_seq, the llama.cpp default of a KV
  cache per sequence (kv_unified false, as llama-batched-bench runs unless -kvu), n_batch 2048,
  n_ubatch 512, the same threads, flash attention and KV types as the Llama object), read back
  from its log like load's. One llama_batch per step, one token per sequence (seq_id = its
  index, its own position, logits on); greedy tokens are the argmax of llama_get_logits_ith(i)
  per row. The Llama object's own context (n_ctx of load) is kept idle beside it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback

import numpy as np

GGML_TYPE = {"f32": 0, "f16": 1, "bf16": 30}  # ggml_type ids of the KV cache types


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """This process's own peak RSS: VmHWM, not ru_maxrss, which a child inherits from its parent across
    fork and exec (a worker spawned while the coordinator held the 1 GiB bandwidth probe reported
    >= 1124 MiB whatever it loaded)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def rlx_build_info(threads: int) -> dict:
    """rlx.build_info() after rlx.set_num_threads(threads), from a child process: it describes every
    backend, and describing the Vulkan one loads the Vulkan loader and its driver (lavapipe on these
    machines: +47 MiB resident, measured), which a CPU run never touches; asked here it counted in
    this worker's peak RSS (rlx's, never llama.cpp's)."""
    code = f"import json, rlx; rlx.set_num_threads({int(threads)}); print(json.dumps(rlx.build_info()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"rlx.build_info() in a child process failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


def dequantised(weights: dict, rows: int = 4096) -> dict:
    """Every packed matrix as float32, dequantised by the gguf package (gguf.quants.dequantize,
    llama.cpp's formats in NumPy: not rlx's code), a block of rows at a time; the rows stay in the
    file's order, which is the order rlx runs them in (Llama's q/k rows included)."""
    import gguf

    from rlx.weights import Packed
    out = {}
    for name, v in weights.items():
        if isinstance(v, Packed):
            qt = gguf.GGMLQuantizationType[v.dtype.upper()]
            f = np.empty(v.shape, dtype=np.float32)
            for a in range(0, v.shape[0], rows):
                f[a:a + rows] = gguf.quants.dequantize(v.data[a:a + rows], qt).reshape(f[a:a + rows].shape)
            out[name] = f
        else:
            out[name] = v
    return out


class RlxEngine:
    name = "rlx"

    def __init__(self):
        self.slots = {}  # batch slot -> its sequences (batch_open)

    def load(self, gguf, threads, kv, n_ctx, fa=None, dtype=None):
        import rlx
        from rlx import gguf as rg
        self.rlx = rlx
        rlx.set_num_threads(threads)
        gf = rg.GGUFFile(gguf)
        cfg = rg.model_config(gf)
        weights = rg.model_weights(gf)
        if dtype == "f32":
            weights = dequantised(weights)
        self.gen = (rlx.Generator(cfg, weights, device="cpu", dtype=dtype, kv_dtype=kv)
                    .with_dynamic_prefill_cache().with_dynamic_decode_cache())
        bi = rlx_build_info(threads)
        return {"kv_type": self.gen.kv_dtype, "weight_dtypes": {k: str(v) for k, v in self.gen.weight_dtypes.items()}
                if isinstance(self.gen.weight_dtypes, dict) else str(self.gen.weight_dtypes),
                "threads": rlx.get_num_threads(), "blas_threads": bi.get("blas_threads"), "isa": bi.get("isa"),
                "build_info": bi, "policy": "dynamic prefill + dynamic decode (as rlx.load)",
                "rlx_version": getattr(rlx, "__version__", None)}

    def first(self, ids):
        t0 = time.perf_counter()
        self.gen.prefill(ids)
        tok = self.gen.step_cached()
        return time.perf_counter() - t0, int(tok)

    def context(self, ids):
        t0 = time.perf_counter()
        logits = self.gen.prefill_get_last_logits(ids)  # the cache then holds all of ids
        return time.perf_counter() - t0, np.asarray(logits, dtype=np.float32)

    def extend(self, ids, at):
        self.gen.truncate(at)
        t0 = time.perf_counter()
        logits = self.gen.extend(ids)
        return time.perf_counter() - t0, np.asarray(logits, dtype=np.float32)

    def decode(self, n, tok, steps):
        self.gen.truncate(n)
        self.gen.append(tok)
        t0 = time.perf_counter()
        out = self.gen.generate_cached(steps)
        dt = time.perf_counter() - t0
        assert len(out) == steps, (len(out), steps)
        return dt, [int(x) for x in out]

    def logits(self, prompt, feed):
        rows = [np.array(self.gen.prefill_get_last_logits(prompt), dtype=np.float32)]
        for t in feed:
            rows.append(np.array(self.gen.decode_get_logits(t), dtype=np.float32))
        return np.stack(rows)

    def kv_bytes(self):
        return int(self.gen.kv_bytes)

    def batch_open(self, b, n_ctx_seq, slot="main"):
        seqs = self.slots[slot] = [self.gen.new_sequence() for _ in range(b)]
        return {"batch": b, "kv_type": seqs[0].kv_dtype, "threads": self.rlx.get_num_threads(),
                "api": "Generator.new_sequence + Generator.step_batch / logits_batch (rlx.batching)"}

    def batch_logits(self, prompts, feed, slot="main"):
        seqs = self.slots[slot]
        for s, p in zip(seqs, prompts):
            s.prefill(p)
        rows = [self.gen.logits_batch(seqs)]  # the first batched pass runs every prompt
        for j in range(len(feed[0]) if feed else 0):
            for s, f in zip(seqs, feed):
                s.append(f[j])
            rows.append(self.gen.logits_batch(seqs))
        return np.stack([np.stack([np.asarray(r[i], dtype=np.float32) for r in rows]) for i in range(len(prompts))])

    def batch_decode(self, ns, toks, steps, slot="main"):
        greedy = self.rlx.SampleOpts.greedy()
        seqs = self.slots[slot]
        for s, n, t in zip(seqs, ns, toks):
            s.truncate(n)
            s.append(t)
        out = []
        t0 = time.perf_counter()
        for _ in range(steps):
            out.append(self.gen.step_batch(seqs, greedy))
        dt = time.perf_counter() - t0
        return dt, [[int(r[i]) for r in out] for i in range(len(seqs))]

    def profile_prefill(self, ids):
        self.gen.profile(True)
        try:
            self.gen.prefill_get_last_logits(ids)
            return self.gen.last_profile()
        finally:
            self.gen.profile(False)

    def profile(self, n, tok):
        self.gen.truncate(n)
        self.gen.append(tok)
        self.gen.profile(True)
        try:
            self.gen.step_cached()
            return self.gen.last_profile()
        finally:
            self.gen.profile(False)


class LlamaCppEngine:
    name = "llama.cpp"

    def __init__(self):
        self.bslots = {}  # batch slot -> its context, llama_batch and sequences (batch_open)

    def load(self, gguf, threads, kv, n_ctx, fa=False, extra_bufts=True):
        import ctypes

        import llama_cpp
        import llama_cpp.llama_cpp as low
        self.lib = llama_cpp
        self.log = []

        @llama_cpp.llama_log_callback
        def cb(level, text, user_data):
            self.log.append(text.decode("utf-8", errors="replace"))
        self._cb = cb  # kept alive: llama.cpp holds the pointer
        llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
        defaults = low.llama_model_default_params
        if not extra_bufts:  # the Llama class has no argument for it: its default params, patched
            def no_extra():
                p = defaults()
                p.use_extra_bufts = False
                return p
            low.llama_model_default_params = no_extra
        try:
            self.llm = llama_cpp.Llama(model_path=gguf, n_ctx=n_ctx, n_batch=2048, n_ubatch=512, n_threads=threads,
                                       n_threads_batch=threads, flash_attn=bool(fa), type_k=GGML_TYPE[kv],
                                       type_v=GGML_TYPE[kv], use_mmap=True, logits_all=False, verbose=True)
        finally:
            low.llama_model_default_params = defaults
        self.n_vocab = self.llm.n_vocab()
        self.threads, self.fa, self.kv = threads, bool(fa), kv
        rb, self.kv_bytes_per_cell = self._readback("".join(self.log), self.llm.ctx)
        rb["n_batch"], rb["n_ubatch"] = 2048, 512
        rb["use_extra_bufts"] = bool(self.llm.model_params.use_extra_bufts)
        rb["weight_buffers"] = re.findall(r"load_tensors:\s+(\S+) model buffer size", "".join(self.log))
        self.readback = rb
        return rb

    def _readback(self, text, ctx):
        """The settings a context runs with, from llama.cpp's log of its creation (text) and the
        context itself; and the KV bytes per cell."""
        llama_cpp = self.lib
        rb = {"log_lines": [l for l in text.splitlines() if re.search(
            r"flash_attn|llama_kv_cache: size|n_ctx |n_ctx_seq|n_seq_max|kv_unified|n_batch|n_ubatch|causal_attn|"
            r"type_k|type_v|CPU_REPACK|system_info|buffer size", l)][:40]}
        m = re.search(r"flash_attn\s*=\s*(\w+)", text)
        rb["flash_attn"] = m.group(1) if m else None
        for key in ("n_ctx_seq", "n_seq_max", "kv_unified"):
            m = re.search(rf"{key}\s*=\s*(\w+)", text)
            rb[key] = (int(m.group(1)) if m.group(1).isdigit() else m.group(1)) if m else None
        m = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells.*K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):"
                      r"\s*([\d.]+) MiB", text)
        per_cell = None
        if m:
            rb.update(kv_alloc_mib=float(m.group(1)), kv_cells=int(m.group(2)), type_k=m.group(3),
                      type_v=m.group(5))
            per_cell = float(m.group(1)) * 2**20 / int(m.group(2))
        rb["kv_type"] = rb.get("type_k") if rb.get("type_k") == rb.get("type_v") else \
            f"{rb.get('type_k')}/{rb.get('type_v')}"
        rb["n_ctx"] = int(llama_cpp.llama_n_ctx(ctx))
        rb["threads"] = int(llama_cpp.llama_n_threads(ctx))
        rb["threads_batch"] = int(llama_cpp.llama_n_threads_batch(ctx))
        rb["system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
        rb["llama_cpp_python"] = getattr(llama_cpp, "__version__", None)
        libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        try:
            rb["libs"] = sorted(f for f in os.listdir(libdir) if re.search(r"\.so\.\d+\.\d+\.\d+$", f))
        except OSError:
            pass
        return rb, per_cell

    def _argmax(self):
        ptr = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def _logits(self):
        ptr = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return np.array(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)), dtype=np.float32)

    def first(self, ids):
        t0 = time.perf_counter()
        self.llm.reset()
        self.llm.eval(ids)
        tok = self._argmax()
        return time.perf_counter() - t0, tok

    def context(self, ids):
        t0 = time.perf_counter()
        self.llm.reset()
        self.llm.eval(ids)
        dt = time.perf_counter() - t0
        return dt, self._logits()

    def extend(self, ids, at):
        self.llm.n_tokens = at  # eval() drops the cache's positions from n_tokens on
        t0 = time.perf_counter()
        self.llm.eval(ids)
        dt = time.perf_counter() - t0
        return dt, self._logits()

    def decode(self, n, tok, steps):
        self.llm.n_tokens = n  # eval() drops the cache's positions from n_tokens on
        out = []
        t0 = time.perf_counter()
        for _ in range(steps):
            self.llm.eval([tok])
            tok = self._argmax()
            out.append(tok)
        return time.perf_counter() - t0, out

    def logits(self, prompt, feed):
        self.llm.reset()
        self.llm.eval(prompt)
        rows = [self._logits()]
        for t in feed:
            self.llm.eval([t])
            rows.append(self._logits())
        return np.stack(rows)

    def kv_bytes(self):
        return int(self.kv_bytes_per_cell * self.llm.n_tokens) if self.kv_bytes_per_cell else None

    def profile(self, n, tok):
        raise NotImplementedError("per-op profile: rlx only")

    def batch_open(self, b, n_ctx_seq, slot="main"):
        """A context of its own for b sequences (the slot's previous one freed)."""
        L = self.lib
        self.batch_close(slot)
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = b * n_ctx_seq, 2048, 512, b
        p.n_threads = p.n_threads_batch = self.threads
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.fa else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.type_k = p.type_v = GGML_TYPE[self.kv]
        p.no_perf = True
        n0 = len(self.log)
        ctx = L.llama_init_from_model(self.llm.model, p)
        if not ctx:
            raise RuntimeError(f"llama_init_from_model failed for {b} sequences: {''.join(self.log[n0:])[-500:]}")
        self.bslots[slot] = {"ctx": ctx, "batch": L.llama_batch_init(2048, 0, 1), "cap": 2048, "b": b}
        rb, _ = self._readback("".join(self.log[n0:]), ctx)
        rb.update(batch=b, n_seq_max_ctx=int(L.llama_n_seq_max(ctx)), n_batch=2048, n_ubatch=512)
        return rb

    def batch_close(self, slot):
        st = self.bslots.pop(slot, None)
        if st:
            self.lib.llama_batch_free(st["batch"])
            self.lib.llama_free(st["ctx"])

    def _bdecode(self, st, items):
        """One llama_decode of items in slot st's context: (token, position, seq_id, logits wanted) each."""
        bt = st["batch"]
        if len(items) > st["cap"]:
            raise ValueError(f"{len(items)} tokens in one batch, at most {st['cap']}")
        for i, (tok, pos, sid, want) in enumerate(items):
            bt.token[i], bt.pos[i], bt.n_seq_id[i], bt.logits[i] = tok, pos, 1, want
            bt.seq_id[i][0] = sid
        bt.n_tokens = len(items)
        rc = self.lib.llama_decode(st["ctx"], bt)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _brow(self, st, i):
        ptr = self.lib.llama_get_logits_ith(st["ctx"], i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def batch_logits(self, prompts, feed, slot="main"):
        st = self.bslots[slot]
        mem = self.lib.llama_get_memory(st["ctx"])
        self.lib.llama_memory_clear(mem, True)
        items, last = [], []
        for sid, ids in enumerate(prompts):
            items += [(int(t), j, sid, j == len(ids) - 1) for j, t in enumerate(ids)]
            last.append(len(items) - 1)
        self._bdecode(st, items)
        rows = [[np.array(self._brow(st, i), dtype=np.float32)] for i in last]
        pos = [len(ids) for ids in prompts]
        for j in range(len(feed[0]) if feed else 0):
            self._bdecode(st, [(int(f[j]), pos[sid], sid, True) for sid, f in enumerate(feed)])
            for sid in range(len(prompts)):
                rows[sid].append(np.array(self._brow(st, sid), dtype=np.float32))
                pos[sid] += 1
        return np.stack([np.stack(r) for r in rows])

    def batch_decode(self, ns, toks, steps, slot="main"):
        st = self.bslots[slot]
        mem = self.lib.llama_get_memory(st["ctx"])
        for sid, n in enumerate(ns):
            if not self.lib.llama_memory_seq_rm(mem, sid, n, -1):
                raise RuntimeError(f"llama_memory_seq_rm({sid}, {n}, -1) failed")
        pos, toks, b = list(ns), [int(t) for t in toks], len(ns)
        out = [[] for _ in range(b)]
        t0 = time.perf_counter()
        for _ in range(steps):
            self._bdecode(st, [(toks[i], pos[i], i, True) for i in range(b)])
            toks = [int(np.argmax(self._brow(st, i))) for i in range(b)]
            for i in range(b):
                out[i].append(toks[i])
                pos[i] += 1
        return time.perf_counter() - t0, out


ENGINES = {"rlx": RlxEngine, "llama.cpp": LlamaCppEngine}


def handle(eng, msg):
    cmd = msg["cmd"]
    if cmd == "load":
        e = ENGINES[msg["engine"]]()
        rss0 = rss_mib()
        t0 = time.perf_counter()
        extra = {k: msg[k] for k in ("extra_bufts", "dtype") if k in msg}
        rb = e.load(msg["gguf"], msg["threads"], msg["kv"], msg["n_ctx"], msg.get("fa"), **extra)
        return e, {"readback": rb, "load_s": time.perf_counter() - t0, "rss_before_mib": rss0,
                   "rss_mib": rss_mib(), "pid": os.getpid()}
    if eng is None:
        raise RuntimeError("load first")
    if cmd == "logits":
        np.save(msg["out"], eng.logits(msg["prompt"], msg["feed"]))
        return eng, {"out": msg["out"]}
    if cmd == "first":
        s, tok = eng.first(msg["ids"])
        return eng, {"s": s, "tok": tok}
    if cmd in ("context", "extend"):
        s, logits = eng.context(msg["ids"]) if cmd == "context" else eng.extend(msg["ids"], msg["at"])
        out = {"s": s, "top1": int(np.argmax(logits))}
        if msg.get("out"):
            np.save(msg["out"], logits)
            out["out"] = msg["out"]
        return eng, out
    if cmd == "decode":
        s, toks = eng.decode(msg["n"], msg["tok"], msg["steps"])
        return eng, {"s": s, "tokens": toks}
    if cmd == "mem":
        return eng, {"rss_mib": rss_mib(), "peak_rss_mib": peak_rss_mib(), "kv_bytes": eng.kv_bytes()}
    if cmd == "profile":
        return eng, {"profile_s": eng.profile(msg["n"], msg["tok"])}
    if cmd == "profile_prefill":
        return eng, {"profile_s": eng.profile_prefill(msg["ids"])}
    if cmd == "batch_open":
        return eng, {"readback": eng.batch_open(msg["b"], msg["n_ctx_seq"], msg.get("slot", "main"))}
    if cmd == "batch_logits":
        np.save(msg["out"], eng.batch_logits(msg["prompts"], msg["feed"], msg.get("slot", "main")))
        return eng, {"out": msg["out"]}
    if cmd == "batch_decode":
        s, toks = eng.batch_decode(msg["n"], msg["tok"], msg["steps"], msg.get("slot", "main"))
        return eng, {"s": s, "tokens": toks}
    raise ValueError(f"unknown command {cmd!r}")


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    eng = None
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            proto.write(json.dumps({"ok": True}) + "\n")
            break
        try:
            eng, out = handle(eng, msg)
            out["ok"] = True
        except Exception as e:  # noqa: BLE001 - sent to the coordinator
            traceback.print_exc()
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
