"""Sequences over one loaded model: what the upper floor promises.

- the weights cross to the device once, however many plans and sequences use them, and a decode
  step moves a constant number of bytes whatever the past (counted on every backend; on "ref" and
  "vulkan", which have memory of their own, the counts are the real traffic);
- sequences of one model are independent: interleaved steps, interleaved streams and 8 threads of
  rlx.load(...).generate give exactly what each gives alone; a Generator used from two threads
  serialises;
- extend (a next turn through the cache) == one prefill of the whole history (1e-5);
- save_state -> a new process -> load_state continues with the same tokens; states of another
  model shape or KV dtype are refused;
- f16 / bf16 KV caches hold half the bytes of f32 ones (measured), and cached == naive for each.

Oracles: the same computation done another way (alone, one prefill, a fresh process) and the NumPy
reference with K/V rounded to the cache dtype.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.reference import forward as ref_forward
from rlx.weights import expected_weights

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K" / "hf"

CFG = rlx.Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=96,
                      rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False, attention_bias=True,
                      use_sliding_window=True, sliding_window=5, max_window_layers=1)
PROMPT = [3, 17, 5, 42, 8, 33, 1]


def weights(cfg=CFG, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_weights(cfg).items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = a.astype(np.float32)
    return out


W = weights()


def greedy(seq, n: int) -> list[int]:
    return seq.generate_cached(n, rlx.SampleOpts.greedy())


# ---- bytes that cross -------------------------------------------------------------------------

def test_weights_cross_once_and_a_decode_step_moves_constant_bytes(device):
    gen = rlx.Generator(CFG, W, device=device, kv_dtype="f32")
    after_load = gen.device_stats()
    wbytes = sum(a.nbytes for a in W.values()) + CFG.head_dim // 2 * 4  # + rope.inv_freq
    own_memory = not rlx.Device(device).zero_copy
    if own_memory:  # memory of its own (ref, vulkan): every weight uploaded, once
        assert after_load["upload_bytes"] == wbytes
    else:
        assert after_load["upload_bytes"] == 0 and after_load["wrapped_bytes"] == wbytes  # used in place
    # several plans (one-shot prefill of three lengths, decode steps) and three sequences
    seqs = [gen] + [gen.new_sequence() for _ in range(2)]
    for i, s in enumerate(seqs):
        s.prefill(PROMPT[: 3 + i])
        greedy(s, 4)
    assert gen.compile_stats()["prefill_compiles"] >= 3
    inputs = gen.device_stats()["upload_bytes"] - after_load["upload_bytes"]
    assert inputs < 1024, f"{inputs} bytes uploaded besides the weights: weights crossed again"
    # decode steps of one sequence: the same bytes each, whatever its past
    s = seqs[1]
    s.decode_get_logits(5)  # the cache catches up with the last generated token (two positions)
    ups, downs = [], []
    for _ in range(20):
        before = gen.device_stats()
        s.decode_get_logits(5)
        now = gen.device_stats()
        ups.append(now["upload_bytes"] - before["upload_bytes"])
        downs.append(now["download_bytes"] - before["download_bytes"])
    assert len(set(ups)) == 1 and len(set(downs)) == 1, (ups, downs)
    if own_memory:
        assert ups[0] == 8 and downs[0] == CFG.vocab_size * 4  # the token and its position in, the logits out


def test_kv_bytes_halve_with_16_bit_caches(device):
    seen = {}
    for kv in ("f32", "f16", "bf16"):
        gen = rlx.Generator(CFG, W, device=device, kv_dtype=kv)
        before = gen.device_stats()["allocated_bytes"]
        gen.prefill(PROMPT)
        greedy(gen, 20)
        seen[kv] = (gen.kv_bytes, gen.device_stats()["allocated_bytes"] - before)
        assert gen.kv_dtype == kv and gen.kv_cache(0)[0].dtype == rlx.dtypes.DTYPES[kv].numpy
    assert seen["f32"][0] == 2 * seen["f16"][0] == 2 * seen["bf16"][0] > 0
    # The device holds the cache (plus the plans' arenas, which do not depend on kv_dtype); on host devices a
    # cache below 2 MiB a buffer keeps its buffers in one mapping with room for every position up to that size
    # (kv.h), committed as rows are written.
    def held(kv):
        if device not in ("cpu", "ref"):
            return seen[kv][0]
        row = CFG.num_key_value_heads * CFG.head_dim * (4 if kv == "f32" else 2)
        return 2 * CFG.num_hidden_layers * min(CFG.max_position_embeddings, (2**21 - 1) // row) * row
    assert seen["f32"][1] - seen["f16"][1] == held("f32") - held("f16")


def test_a_prompt_in_pieces_takes_the_caches_room_once():
    """A prompt run in pieces (with_prefill_chunk, or a batch's chunk) reserves the cache's rows for
    all of it before the first piece (seq.c: forward_history, run_batch_locked), so the cache never
    grows under it: no row is copied on the device (piece by piece it had grown at 512 and 1024
    positions, copying every row so far)."""
    cfg = rlx.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                          max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6)
    r = np.random.default_rng(0)
    w = {k: (r.standard_normal(s) * 0.02).astype(np.float32) for k, s in expected_weights(cfg).items()}
    gen = rlx.Generator(cfg, w, kv_dtype="f32").with_dynamic_prefill_cache().with_prefill_chunk(512)
    before = gen.device_stats()["copy_bytes"]
    gen.prefill_get_last_logits([int(t) for t in r.integers(3, 60, 1500)])
    assert gen.kv_len == 1500 and gen.device_stats()["copy_bytes"] == before
    assert gen.kv_bytes == 2 * 2 * 1536 * 256 * 4  # one mapping: 1500 rounded up to 64
    # the same through a batch, the prompt entering 512 positions a step (seq.c: run_batch_locked)
    seq = gen.new_sequence()
    seq.prefill([int(t) for t in r.integers(3, 60, 1500)])
    before = gen.device_stats()["copy_bytes"]
    steps = 0
    while gen.logits_batch([seq], chunk=512)[0] is None:
        steps += 1
    assert steps == 2 and seq.kv_len == 1500 and gen.device_stats()["copy_bytes"] == before


# The start of the subprocesses that measure the peak RSS of a growing cache: hwm() (MiB), a model of
# 8 layers whose K or V rows are 1 KiB (f32), its weights W and a generator r.
RSS_SETUP = textwrap.dedent("""
        import numpy as np, rlx
        from rlx.weights import expected_weights
        def hwm():
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
        cfg = rlx.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=8,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                              max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1e6)
        r = np.random.default_rng(0)
        W = {k: (r.standard_normal(s) * 0.02).astype(np.float32) for k, s in expected_weights(cfg).items()}
""")


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="ASan's shadow memory blurs the RSS")
def test_a_growing_cache_holds_one_buffer_twice_not_the_whole_cache():
    """Growing the KV cache (4096 -> 8192 positions) copies it buffer by buffer: the process's peak
    RSS rises by about one layer's K or V (1 MiB here), not by the 64 MiB of the whole cache
    (which it did when every new buffer was allocated and filled before the old ones were freed)."""
    code = RSS_SETUP + textwrap.dedent("""
        gen = rlx.Generator(cfg, W, kv_dtype="f32").with_dynamic_prefill_cache()
        gen.prefill_get_last_logits([int(t) for t in r.integers(3, 60, 4096)])
        assert gen.kv_bytes == 8 * 2 * 4096 * 256 * 4
        h0 = hwm()
        gen.extend([5])
        assert gen.kv_bytes == 2 * 8 * 2 * 4096 * 256 * 4
        print(hwm() - h0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 64 / 4, f"peak RSS grew by {out.stdout.strip()} MiB"


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="ASan's shadow memory blurs the RSS")
def test_a_cache_leaving_the_shared_mapping_holds_one_buffer_twice():
    """A small cache keeps its 16 buffers (8 layers, K and V) in one mapping (kv.h); the step past
    2047 positions (2 MiB a buffer) moves them into a buffer each, giving back each one's rows in the
    shared mapping once copied (kv_cache.c: leave_arena): the process's peak RSS rises by about one
    buffer (2 MiB here), not by the 32 MiB of the whole cache."""
    code = RSS_SETUP + textwrap.dedent("""
        gen = rlx.Generator(cfg, W, kv_dtype="f32").with_dynamic_prefill_cache().with_prefill_chunk(2046)
        gen.prefill_get_last_logits([int(t) for t in r.integers(3, 60, 2046)])
        gen.extend([5])  # the plans for one new row compiled, and their scratch taken
        assert gen.kv_len == 2047 and gen.kv_bytes == 8 * 2 * 2047 * 256 * 4  # the most the shared mapping takes
        h0 = hwm()
        gen.extend([5])
        assert gen.kv_bytes == 8 * 2 * 4094 * 256 * 4
        print(hwm() - h0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 32 / 4, f"peak RSS grew by {out.stdout.strip()} MiB"


@pytest.mark.skipif(not rlx.mapping._linux_thp(), reason="Linux with transparent huge pages only")
def test_the_whole_2_mib_pages_of_a_caches_rows_are_advised_for_huge_pages():
    """The KV cache tells the device which rows a step will hold (kv_cache.c: rlx_dev_settle) and
    the host devices advise the whole 2 MiB pages of them MADV_HUGEPAGE (host.c): the anonymous
    mappings the kernel deems eligible for transparent huge pages (smaps' THPeligible, whether or not
    it then had a free huge page to give) grow by those pages and no more. 8 buffers (4 layers, K
    and V) of 1 KiB rows, in one mapping below 2048 positions (2 MiB a buffer; kv.h): 512 positions
    (512 KiB buffers, 4 MiB in all) all 4 MiB; a 2048-token prompt (room for all of it taken before
    its first 512-row piece: a buffer each of 2048 positions) all 16 MiB; a 1100-token prompt and a
    step (1152 positions, a multiple of 64: 9 MiB) the whole pages of it, 8 MiB; more rows to 2047
    positions (the most the shared mapping takes: 16 MiB less 8 KiB) 7 pages; the 2048th row (a
    buffer each of 2 x 2047 positions) the first page of each buffer (the copy faults it in huge)."""
    code = textwrap.dedent("""
        import re, numpy as np, rlx
        from rlx.weights import expected_weights
        def eligible():
            n = 0
            for vma in re.split(r"\\n(?=[0-9a-f]+-[0-9a-f]+ )", open("/proc/self/smaps").read()):
                head = vma.split("\\n")[0].split()
                if len(head) == 5 and re.search(r"^THPeligible:\\s+1", vma, re.M):  # anonymous
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    n += hi - lo
            return n
        cfg = rlx.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=4,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                              max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6)
        r = np.random.default_rng(0)
        W = {k: (r.standard_normal(s) * 0.02).astype(np.float32) for k, s in expected_weights(cfg).items()}
        def fresh():
            gen = rlx.Generator(cfg, W, kv_dtype="f32").with_dynamic_prefill_cache()
            gen.prefill_get_last_logits([5])
            return gen, eligible()
        for n in (512, 2048):
            gen, e0 = fresh()
            gen.prefill_get_last_logits([int(t) for t in r.integers(3, 60, n)])
            print(n, gen.kv_bytes, eligible() - e0)
            del gen
        gen, e0 = fresh()
        gen.prefill_get_last_logits([int(t) for t in r.integers(3, 60, 1100)])
        gen.extend([5])
        print(gen.kv_len, gen.kv_bytes, eligible() - e0)
        gen.extend([int(t) for t in r.integers(3, 60, 2047 - 1101)])
        print(gen.kv_len, gen.kv_bytes, eligible() - e0)
        gen.extend([5])
        print(gen.kv_len, gen.kv_bytes, eligible() - e0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [tuple(map(int, line.split())) for line in out.stdout.split("\n") if line]
    MiB = 1 << 20
    KiB = 1 << 10
    assert rows[0] == (512, 4 * MiB, 4 * MiB)  # 512 KiB buffers in one mapping
    assert rows[1][:2] == (2048, 16 * MiB) and 16 * MiB <= rows[1][2] < 17 * MiB
    assert rows[2] == (1101, 8 * 1152 * KiB, 8 * MiB)
    assert rows[3] == (2047, 8 * 2047 * KiB, 14 * MiB)  # 16 MiB less 8 KiB: 7 whole pages
    assert rows[4][:2] == (2048, 8 * 4094 * KiB) and 16 * MiB <= rows[4][2] < 17 * MiB


def cache_rows(seq) -> list:
    return [seq.kv_cache(layer) for layer in range(CFG.num_hidden_layers)]


def assert_rows_within_one_unit(got: list, want: list, kv: str) -> None:
    """Every stored K / V element against the reference's: the two f32 values (before the cache's
    rounding) are within f32 math's 1e-5 x max(|x|, 1) of each other, and rounding each to the
    cache dtype moves them apart by at most one more unit in its last place (at the larger
    magnitude's binade; f16: 2^-24 below its smallest normal)."""
    bits = {"f16": 10, "bf16": 7}.get(kv)
    for layer, (g_kv, w_kv) in enumerate(zip(got, want)):
        for g, w in zip(g_kv, w_kv):
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            big = np.maximum(np.abs(g), np.abs(w))
            bound = 1e-5 * np.maximum(big, 1.0)
            if bits is not None:
                tiny = 2.0**-14 if kv == "f16" else 2.0**-126
                bound += np.exp2(np.floor(np.log2(np.maximum(big, tiny))) - bits)
            assert (np.abs(g - w) <= bound).all(), f"layer {layer}: {np.abs(g - w).max()}"


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16"])
def test_every_kv_dtype_matches_the_reference_and_the_naive_path(device, kv):
    """Each path's logits against the reference fed the K / V rows that path stored (the f32 bound,
    1e-4, whatever the cache dtype), and those rows within one unit of the reference's own. For
    16-bit caches, cached == naive is not an identity: the decode matvec and the prefill GEMM
    compute a row apart in f32's last bits, and rounding to 16 bits can turn that into one unit of
    a stored element (seen on the scalar ISA: logits 9e-5 apart); naive then equals a fresh prefill
    of the same history (the same GEMM rows), which the reference checks the same way."""
    gen = rlx.Generator(CFG, W, device=device, kv_dtype=kv)
    ids = PROMPT + greedy_ids(kv)
    ref_rows: list = []
    ref_forward(CFG, W, ids, kv, kv_out=ref_rows)
    gen.prefill(ids[:4])
    for t in range(4, len(ids)):
        cached = gen.decode_get_logits(ids[t])
        rows = cache_rows(gen)
        want = ref_forward(CFG, W, ids[: t + 1], kv, kv_rows=rows)[-1]
        assert np.abs(cached - want).max() < 1e-4
        assert_rows_within_one_unit(rows, [(k[: t + 1], v[: t + 1]) for k, v in ref_rows], kv)
        naive = gen._c.logits(cached=False)
        if kv == "f32":
            assert np.abs(cached - naive).max() < 1e-5
        else:
            fresh = gen.new_sequence()
            assert np.abs(fresh.prefill_get_last_logits(ids[: t + 1]) - naive).max() < 1e-5
            want = ref_forward(CFG, W, ids[: t + 1], kv, kv_rows=cache_rows(fresh))[-1]
            assert np.abs(naive - want).max() < 1e-4


def greedy_ids(kv: str) -> list[int]:
    g = rlx.Generator(CFG, W, kv_dtype=kv)
    g.prefill(PROMPT)
    return greedy(g, 9)


# ---- independence -----------------------------------------------------------------------------

def test_interleaved_sequences_give_what_each_gives_alone(device):
    gen = rlx.Generator(CFG, W, device=device).with_dynamic_prefill_cache().with_dynamic_decode_cache()
    prompts = [PROMPT, [9, 8, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    alone = []
    for p in prompts:
        s = gen.new_sequence()
        s.prefill(p)
        alone.append(greedy(s, 12))
    seqs = [gen.new_sequence() for _ in prompts]
    for s, p in zip(seqs, prompts):
        s.prefill(p)
    out = [[] for _ in prompts]
    for _ in range(12):
        for i, s in enumerate(seqs):
            out[i].append(s.step_cached())
    assert out == alone
    assert gen.compile_stats()["plans_cached"] == 2  # one dynamic prefill and one decode plan for all


def test_fork_continues_like_the_original(device):
    gen = rlx.Generator(CFG, W, device=device)
    gen.prefill(PROMPT)
    greedy(gen, 5)
    f = gen.fork()
    assert f.tokens == gen.tokens and f.kv_len == gen.kv_len and f.kv_dtype == gen.kv_dtype
    a, b = greedy(gen, 8), greedy(f, 8)
    assert a == b
    f.truncate(len(PROMPT))
    assert gen.tokens[len(PROMPT):] != [] and f.tokens == PROMPT  # the fork has its own history


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_extend_equals_one_prefill(device, family, kv_dtype):
    cfg = CFG if family == "qwen3" else rlx.LlamaConfig(
        vocab_size=90, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=True)
    w = W if family == "qwen3" else weights(cfg, seed=3)
    gen = rlx.Generator(cfg, w, device=device, kv_dtype=kv_dtype)
    turn1, turn2, turn3 = PROMPT, [11, 12, 13, 14, 15, 16, 17, 18, 19], [20, 21]
    whole = gen.new_sequence()
    want = whole.prefill_get_last_logits(turn1 + turn2 + turn3)
    s = gen.new_sequence()
    s.prefill_get_last_logits(turn1)
    s.extend(turn2)
    got = s.extend(turn3)
    assert s.tokens == turn1 + turn2 + turn3 and s.kv_len == len(s.tokens)
    # The two paths run the projections on 2-18 rows at a time, so a BLAS may sum in another order
    # (OpenBLAS's Haswell sgemm does): f32 rounding apart, the f32 cache gives the same logits. In an
    # f16 cache such a difference can move a K/V element to the neighbouring f16 value (the rows
    # below); the logits then move by at most what rounding the whole cache to f16 moves them (each
    # element by up to half a step there), measured on the NumPy reference.
    if kv_dtype == "f32":
        bound = 1e-5
    else:
        ids = np.array(turn1 + turn2 + turn3)
        bound = np.abs(ref_forward(cfg, w, ids, kv_dtype="f16")[-1] - ref_forward(cfg, w, ids)[-1]).max()
    assert np.abs(got - want).max() <= bound
    rtol = 2.0**-10 if kv_dtype == "f16" else 1e-5  # the same rows, up to one rounding step
    for layer in range(cfg.num_hidden_layers):
        for a, b in zip(s.kv_cache(layer), whole.kv_cache(layer)):
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=rtol, atol=1e-6)
    # a refused extend takes its tokens back
    with pytest.raises(ValueError):
        s.extend([1, cfg.vocab_size])
    assert s.tokens == turn1 + turn2 + turn3


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_a_prompt_in_chunks_equals_one_run(device, chunk):
    """A prompt (and a next turn) going `chunk` positions per plan run, across the sliding window
    of 5 and with a remainder, gives one run's logits and cache rows (f32 cache: the oracle is the
    same computation in one piece; only f32 summation order differs)."""
    gen = rlx.Generator(CFG, W, device=device, kv_dtype="f32").with_prefill_chunk(0)
    prompt, turn = [(7 * i + 3) % CFG.vocab_size for i in range(23)], [9, 4, 61, 2, 30, 11, 5, 8, 19]
    whole = gen.new_sequence()
    want = [whole.prefill_get_last_logits(prompt), whole.extend(turn)]
    gen.with_prefill_chunk(chunk)
    s = gen.new_sequence()
    got = [s.prefill_get_last_logits(prompt), s.extend(turn)]
    assert s.kv_len == len(prompt) + len(turn)
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-5
    for layer in range(CFG.num_hidden_layers):
        for a, b in zip(s.kv_cache(layer), whole.kv_cache(layer)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert greedy(s, 4) == greedy(whole, 4)


def test_prefill_chunk_bounds_the_plans_memory():
    """The intermediates a long prompt plans: the size of the chunk, not of the prompt."""
    cfg = dataclasses.replace(CFG, max_position_embeddings=1024)
    planned = {}
    for chunk in (0, 32):
        gen = rlx.Generator(cfg, weights(cfg), kv_dtype="f32").with_prefill_chunk(chunk)
        gen.prefill_get_last_logits([(5 * i + 1) % cfg.vocab_size for i in range(1000)])
        planned[chunk] = gen.compile_stats()["planned_bytes"]
    assert planned[32] * 8 < planned[0], planned


def test_prefill_chunk_refuses_what_is_not_a_count():
    gen = rlx.Generator(CFG, W)
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError):
            gen.with_prefill_chunk(bad)
    assert gen.with_prefill_chunk(0) is gen


def test_a_generator_used_from_two_threads_serialises():
    gen = rlx.Generator(CFG, W)
    gen.prefill(PROMPT)
    want = greedy(gen, 20)
    gen.prefill(PROMPT)
    barrier = threading.Barrier(2)
    errors = []

    def worker():
        try:
            barrier.wait()
            greedy(gen, 10)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert gen.tokens == PROMPT + want  # each call ran whole, one after the other


# ---- the high-level API: its own sequence per call --------------------------------------------

needs_stories = pytest.mark.skipif(not (STORIES / "model.safetensors").is_file(),
                                   reason=f"stories260K not found under {STORIES}")

PROMPTS = ["Once upon a time", "The dog", "Lily and Ben", "One day, a little bird", "The sun was"]


@needs_stories
def test_interleaved_streams_give_their_own_text():
    m = rlx.load(STORIES)
    alone = [m.generate(p, max_new_tokens=40) for p in PROMPTS[:2]]
    a = m.generate(PROMPTS[0], max_new_tokens=40, stream=True)
    b = m.generate(PROMPTS[1], max_new_tokens=40, stream=True)
    got = ["", ""]
    for da, db in zip(a, b):
        got[0] += da
        got[1] += db
    got[0] += "".join(a)
    got[1] += "".join(b)
    assert got == alone


@needs_stories
def test_eight_threads_of_generate_give_their_single_threaded_text():
    m = rlx.load(STORIES)
    jobs = [(PROMPTS[i % len(PROMPTS)], i % 3 == 0, 100 + i) for i in range(20)]

    def run(job):
        prompt, sampled, seed = job
        if sampled:
            return m.generate(prompt, max_new_tokens=24, temperature=0.9, top_p=0.9, seed=seed)
        return m.generate(prompt, max_new_tokens=24)

    want = [run(j) for j in jobs]
    results: dict[tuple[int, int], str] = {}
    errors = []

    def worker(t):
        try:
            for i, job in enumerate(jobs):
                results[(t, i)] = run(job)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (t, i), text in results.items():
        assert text == want[i], f"thread {t}, call {i}"
    assert len(results) == 8 * 20


# ---- save / load --------------------------------------------------------------------------------

def test_save_state_then_load_in_a_new_process(tmp_path):
    gen = rlx.Generator(CFG, W)
    gen.prefill(PROMPT)
    greedy(gen, 6)
    path = tmp_path / "seq.state"
    gen.save_state(path)
    np.savez(tmp_path / "w.npz", **W)
    want = greedy(gen.fork(), 10)
    script = textwrap.dedent(f"""
        import numpy as np, rlx
        w = dict(np.load({str(tmp_path / "w.npz")!r}))
        cfg = rlx.config.config_from_dict({CFG.to_dict()!r})
        gen = rlx.Generator(cfg, w)
        gen.load_state({str(path)!r})
        print(gen.generate_cached(10, rlx.SampleOpts.greedy()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(rlx.__file__).parents[1])})
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout.strip()) == want


def test_load_state_refuses_what_does_not_fit(device):
    gen = rlx.Generator(CFG, W, device=device)
    gen.prefill(PROMPT)
    greedy(gen, 3)
    state = gen.save_state()
    keep = gen.tokens
    other = rlx.Generator(CFG, W, device=device, kv_dtype="bf16")
    with pytest.raises(ValueError, match="f16"):
        other.load_state(state)
    assert other.tokens == []
    for bad in (state[:-1], state[:10], b"nonsense" * 20, state[:8] + bytes(len(state) - 8)):
        with pytest.raises(ValueError):
            gen.load_state(bad)
    assert gen.tokens == keep  # unchanged by refusals
    cfg2 = rlx.config.config_from_dict({**CFG.to_dict(), "hidden_size": 16, "head_dim": 4, "intermediate_size": 24})
    g2 = rlx.Generator(cfg2, weights(cfg2), device=device)
    with pytest.raises(ValueError, match="another config"):
        g2.load_state(state)
    # the same state twice: round trip exact
    fresh = rlx.Generator(CFG, W, device=device)
    fresh.load_state(state)
    assert fresh.tokens == keep and fresh.save_state() == state


# ---- Ctrl-C ----------------------------------------------------------------------------------

def test_ctrl_c_stops_a_step_midway_and_leaves_the_sequence_as_before():
    # One forward pass over 2048 positions on "ref" takes seconds; SIGINT a second into it. If the
    # pass ran to its end (Ctrl-C seen only between tokens), the token would be in the history.
    script = textwrap.dedent("""
        import signal, sys, time, numpy as np, rlx
        from rlx.weights import expected_weights
        # Python's Ctrl-C handler, whatever the test run inherited: a run started in the background
        # (`cmd &` in a script) ignores SIGINT, the child would inherit that, and rlx leaves an
        # ignored SIGINT ignored (signals.c)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cfg = rlx.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                              max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e4,
                              tie_word_embeddings=True)
        rng = np.random.default_rng(0)
        w = {n: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
             for n, s in expected_weights(cfg).items()}
        gen = rlx.Generator(cfg, w, device="ref")
        ids = [int(i) for i in rng.integers(0, 64, 2048)]
        gen.prefill(ids)
        for how in ("naive", "cached"):
            print("ready", flush=True)
            try:
                gen.generate(5) if how == "naive" else gen.generate_cached(5)
                print("not interrupted", flush=True)
            except KeyboardInterrupt:
                print(how, len(gen.tokens), gen.kv_len, flush=True)
            sys.stdin.readline()
        gen.truncate(8)
        fresh = rlx.Generator(cfg, w, device="ref")
        fresh.prefill(ids[:8])
        print("same", gen.generate_cached(4) == fresh.generate_cached(4), flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(rlx.__file__).parents[1])})
    try:
        lines = []
        for _ in range(2):
            assert child.stdout.readline() == "ready\n", child.stderr.read()
            threading.Event().wait(1.0)
            child.send_signal(2)  # SIGINT
            lines.append(child.stdout.readline().split())
            child.stdin.write("\n")
            child.stdin.flush()
        lines.append(child.stdout.readline().split())
        assert child.wait(timeout=120) == 0, child.stderr.read()
    finally:
        child.kill()
    assert lines == [["naive", "2048", "0"], ["cached", "2048", "0"], ["same", "True"]]
