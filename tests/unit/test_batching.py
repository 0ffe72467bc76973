"""Many sequences in one plan step (rlx/batching.py, rlx_seq_batch_logits): each sequence of a
batch gets the logits (1e-5) and the greedy tokens it gets alone, on every backend, with ragged
histories, prompts entering in chunks between decode steps, and sequences joining and leaving.

Oracle: the same sequence run alone (prefill + extend: the single-sequence plans, themselves held
to transformers and NumPy elsewhere), and the NumPy reference forward for the batch's logits.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import rlx
from rlx import batching
from rlx.reference import forward as ref_forward
from rlx.weights import expected_weights

QWEN = rlx.Qwen3Config(vocab_size=90, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                       rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False, attention_bias=True,
                       use_sliding_window=True, sliding_window=6, max_window_layers=1)
LLAMA = rlx.LlamaConfig(vocab_size=70, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
                        rope_theta=5e5, tie_word_embeddings=True,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
TOL = 1e-5


def weights(cfg, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_weights(cfg).items():
        a = 1.0 + 0.2 * rng.standard_normal(shape) if name.endswith("norm.weight") else \
            rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = a.astype(np.float32)
    return out


def prompts(cfg, n: int, seed: int, lo: int = 1, hi: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, cfg.vocab_size, size=int(k))] for k in rng.integers(lo, hi, size=n)]


def alone_logits(gen, prompt: list[int], extra: list[int]) -> list[np.ndarray]:
    """Logits after the prompt and after each extra token, the sequence alone."""
    s = gen.new_sequence()
    rows = [s.prefill_get_last_logits(prompt)]
    rows += [s.decode_get_logits(t) for t in extra]
    return rows


@pytest.mark.parametrize("cfg", [QWEN, LLAMA], ids=["qwen3", "llama"])
@pytest.mark.parametrize("batch", [1, 3, 16])
def test_batch_logits_are_each_sequences_own(device, cfg, batch):
    gen = rlx.Generator(cfg, weights(cfg), device=device, kv_dtype="f32")
    ps = prompts(cfg, batch, seed=batch)
    extra = [[(7 * i + 3 * j) % cfg.vocab_size for j in range(3)] for i in range(batch)]
    want = [alone_logits(gen, p, e) for p, e in zip(ps, extra)]
    seqs = [gen.new_sequence() for _ in ps]
    for s, p in zip(seqs, ps):
        s.prefill(p)
    got = [gen.logits_batch(seqs)]  # the whole prompts: ragged prefill in one plan
    for j in range(3):
        for s, e in zip(seqs, extra):
            s.append(e[j])
        got.append(gen.logits_batch(seqs))  # one position each over ragged pasts
    for i in range(batch):
        for j in range(4):
            np.testing.assert_allclose(got[j][i], want[i][j], rtol=0, atol=TOL, err_msg=f"sequence {i}, row {j}")
        assert seqs[i].kv_len == len(ps[i]) + 3
    # and the reference forward of the whole history (NumPy, float64), for one sequence
    hist = ps[-1] + extra[-1]
    ref = ref_forward(cfg, weights(cfg), hist)[-1]
    np.testing.assert_allclose(got[3][-1], ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "bf16"])
def test_continuous_batching_gives_each_prompt_its_own_greedy_tokens(device, kv_dtype):
    """More prompts than the batch holds, prompts entering in chunks of 4 positions while others
    decode, sequences leaving at different lengths: each prompt's tokens are its own."""
    gen = rlx.Generator(QWEN, weights(QWEN, seed=3), device=device, kv_dtype=kv_dtype)
    ps = prompts(QWEN, 9, seed=11, lo=1, hi=40)
    free = []
    for p in ps:
        s = gen.new_sequence()
        s.prefill(p)
        free.append(s.generate_cached(12))
    stop = {free[0][2], free[3][5]}  # so that some sequences leave early
    want = []
    for p in ps:
        s = gen.new_sequence()
        s.prefill(p)
        want.append(s.generate_cached(12, rlx.SampleOpts.greedy(), stop_ids=stop))
    seen: list[tuple[int, int]] = []
    got = gen.generate_batch(ps, 12, rlx.SampleOpts.greedy(), stop_ids=stop, max_batch=4, chunk=4,
                             on_token=lambda i, t: seen.append((i, t)))
    assert got == want
    assert [t for i, t in seen if i == 0] == want[0]
    assert len({len(w) for w in want}) > 1, "the sequences should leave at different lengths"


def test_sampling_in_a_batch_draws_as_alone(device):
    """Seeded sampling: the draw for a token uses (seed, position), so batching changes nothing."""
    gen = rlx.Generator(LLAMA, weights(LLAMA, seed=5), device=device, kv_dtype="f32")
    ps = prompts(LLAMA, 5, seed=2)
    opts = [rlx.SampleOpts(temperature=0.9, top_k=20, top_p=0.95, seed=s) for s in range(5)]
    want = []
    for p, o in zip(ps, opts):
        s = gen.new_sequence()
        s.prefill(p)
        want.append(s.generate_cached(6, o))
    assert gen.generate_batch(ps, 6, opts, max_batch=5) == want


WIDE = rlx.Qwen3Config(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128,
                      rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False)


@pytest.mark.parametrize("batch", [4, 5, 6, 7, 16])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "q8_0", "q4_k_m"])
def test_decode_batches_on_cpu_give_each_sequence_its_own_bits(dtype, batch):
    """On cpu a decode step of up to 16 sequences multiplies through the matvec / blocked passes,
    whose every output row is one fixed sequence of operations whatever the number of rows
    (matmul.c, quant.c): each sequence of the batch gets exactly the logits it gets alone. Except
    where the product leaves those kernels: f32 weights above 4 rows (sgemm: within 1e-5, as
    test_batch_logits_are_each_sequences_own), block types above 12 rows on AVX2 and 4 on the
    scalar path, bf16 above 6 rows where the CPU has AMX and above 3 where it has AVX512_BF16 without
    it (their GEMMs, and from 4 to 8 rows gemm_bf16.c's lanes path, its even and odd pairs of k summed apart:
    within the quant kernels' bound, 5 % of the logits' scale, tests/unit/test_quant_models.py;
    bf16 by f32 summation order),
    and the K types (q4_k_m) from 5 rows on AMX-INT8, and the block types of 7, 8 and 11 .. 16 rows
    (q8_0: 5 .. 16) on AVX-512 VNNI without it (quant.c: the same integers, summed in f32 in another
    order: 5e-7 .. 4e-6 here, but where such a difference carries an activation across a step of its
    8-bit grid the logits move by a few percent: one of the 5 sequences of the batch of 5 from its first step, 0.056,
    20 % of that logit; as for the other non-exact paths)."""
    # f32 weights with an f32 cache: beyond 4 rows sgemm sums in another order, and an f16 cache
    # would round that difference to a whole f16 step now and then
    gen = rlx.Generator(WIDE, weights(WIDE, seed=7), dtype=dtype, kv_dtype="f32" if dtype == "f32" else "f16")
    isa = rlx.build_info()["isa"]
    quant = rlx.build_info()["quant"]
    bf16_passes = 6 if isa.endswith("+amx") else 3 if isa.startswith("avx512f+bf16") else 16
    passes = {"avx512-vnni+amx-int8": 4 if dtype == "q4_k_m" else 16, "avx512-vnni": 16, "avx2": 12,
              "scalar": 4}[quant] if dtype.startswith("q") \
        else 4 if dtype == "f32" else bf16_passes if dtype == "bf16" else 16
    # block types on VNNI without AMX: 7, 8 and 11 .. 16 rows through the lanes kernel (quant_lanes.c),
    # Q8_0 5 .. 16
    lanes = quant == "avx512-vnni" and dtype.startswith("q") and (
        batch >= 5 if dtype == "q8_0" else batch in (7, 8) or 11 <= batch <= 16)
    exact = batch <= passes and not lanes
    ps = prompts(WIDE, batch, seed=batch, lo=2, hi=20)
    alone, seqs = [], []
    for p in ps:  # prompts run alone in both (prefill kernels depend on the prompt's length)
        a, b = gen.new_sequence(), gen.new_sequence()
        a.prefill(p)
        b.prefill(p)
        a.step_cached()
        b.step_cached()
        alone.append(a)
        seqs.append(b)
    for _ in range(3):  # one uncached position per sequence: its sampled token
        want = [a._c.logits(cached=True) for a in alone]
        got = gen.logits_batch(seqs)
        for i in range(batch):
            if exact:
                np.testing.assert_array_equal(got[i], want[i], err_msg=f"{dtype} sequence {i}")
            elif dtype == "f32":
                np.testing.assert_allclose(got[i], want[i], rtol=0, atol=TOL, err_msg=f"{dtype} sequence {i}")
            else:
                assert np.abs(got[i] - want[i]).max() <= 0.05 * np.abs(want[i]).max(), (dtype, i)
            t = int(np.argmax(want[i]))
            alone[i].append(t)
            seqs[i].append(t)


MOE = rlx.Qwen3MoeConfig(vocab_size=96, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False,
                        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)


def decode_side_by_side(gen, batch: int, steps: int = 3):
    """batch sequences over ragged prompts, each twice (one stepped alone, one in the batch);
    yields, per step, (the batch's logits, each alone's), then feeds both the alone's argmax."""
    cfg = gen._config
    alone, seqs = [], []
    for p in prompts(cfg, batch, seed=batch, lo=2, hi=20):  # prompts run alone in both
        a, b = gen.new_sequence(), gen.new_sequence()
        for s in (a, b):
            s.prefill(p)
            s.step_cached()
        alone.append(a)
        seqs.append(b)
    for _ in range(steps):  # one uncached position per sequence: its sampled token
        want = [a._c.logits(cached=True) for a in alone]
        yield gen.logits_batch(seqs), want
        for a, b, w in zip(alone, seqs, want):
            a.append(int(np.argmax(w)))
            b.append(int(np.argmax(w)))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "q8_0", "q4_k_m"])
def test_batch_invariant_decode_gives_each_sequence_its_own_bits(device, dtype):
    """Generator.with_batch_invariant(): at every batch size, whichever kernels this machine's
    batched products would take (sgemm, the bf16 GEMM and its lanes path, AMX, the quant lanes
    kernel; vulkan's tiled shader above 8 rows), each sequence of a decode step gets exactly the
    logits it gets alone."""
    gen = rlx.Generator(WIDE, weights(WIDE, seed=7), device=device, dtype=dtype,
                        kv_dtype="f32" if dtype == "f32" else "f16").with_batch_invariant()
    for batch in {"cpu": range(2, 17), "vulkan": (2, 9, 16)}.get(device, (2, 5)):
        for got, want in decode_side_by_side(gen, batch):
            for i in range(batch):
                np.testing.assert_array_equal(got[i], want[i], err_msg=f"{dtype} batch {batch} sequence {i}")


@pytest.mark.parametrize("dtype", ["bf16", "q4_k_m"])
def test_batch_invariant_mixture_of_experts(device, dtype):
    """The experts' products (matmul_id) grouped the same way: a Qwen3-MoE decode step of 12
    sequences, each sequence's own bits."""
    if device == "ref":
        pytest.skip("ref: every product is row by row already (matmul_rows_alone: any)")
    gen = rlx.Generator(MOE, weights(MOE, seed=2), device=device, dtype=dtype).with_batch_invariant()
    for got, want in decode_side_by_side(gen, 12):
        for i in range(12):
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"{dtype} sequence {i}")


@pytest.mark.parametrize("dtype", ["bf16", "q8_0", "q4_k_m"])
def test_batch_invariant_generate_batch_gives_each_prompt_its_own_greedy_tokens(dtype):
    """Continuous batching with batch-invariant plans: each joining prompt's first step alone,
    then decode steps of up to 8 sequences, sequences leaving at different lengths: every
    prompt's greedy tokens are exactly those generate_cached makes for it alone."""
    gen = rlx.Generator(WIDE, weights(WIDE, seed=5), dtype=dtype).with_batch_invariant()
    ps = prompts(WIDE, 11, seed=6, lo=2, hi=30)
    want = []
    for p in ps:
        s = gen.new_sequence()
        s.prefill(p)
        want.append(s.generate_cached(16, rlx.SampleOpts.greedy(), stop_ids={5}))
    seen: list[tuple[int, int]] = []
    got = gen.generate_batch(ps, 16, rlx.SampleOpts.greedy(), stop_ids={5}, max_batch=8,
                             on_token=lambda i, t: seen.append((i, t)))
    assert got == want
    assert sorted(seen) == sorted((i, t) for i, w in enumerate(want) for t in w)
    # and off again (the fast plans)
    assert gen.with_batch_invariant(False).batch_invariant is False


@pytest.mark.parametrize("dtype", ["bf16", "q4_k_m"])
def test_batch_invariant_plans_leave_prompts_to_the_prefill_kernels(dtype):
    """Only products of up to 16 rows (a decode step's) are grouped: a prompt of more positions
    gets the bits the default plans give it (the same prefill kernels, not 3- or 6-row groups)."""
    gen = rlx.Generator(WIDE, weights(WIDE, seed=8), dtype=dtype)
    p = prompts(WIDE, 1, seed=3, lo=40, hi=41)[0]
    fast = gen.new_sequence().prefill_get_last_logits(p)
    np.testing.assert_array_equal(gen.with_batch_invariant().new_sequence().prefill_get_last_logits(p), fast)


def test_with_batch_invariant_takes_a_bool():
    gen = rlx.Generator(QWEN, weights(QWEN), kv_dtype="f32")
    with pytest.raises(TypeError, match="bool"):
        gen.with_batch_invariant(1)


def test_step_batch_with_chunks_reports_who_is_still_entering():
    gen = rlx.Generator(QWEN, weights(QWEN), kv_dtype="f32")
    a, b = gen.new_sequence(), gen.new_sequence()
    a.prefill([1, 2, 3])
    b.prefill(list(range(10)))
    assert gen.step_batch([a, b], chunk=4)[1] is None   # b: positions 0..3 cached
    assert b.kv_len == 4 and len(b.tokens) == 10
    toks = gen.step_batch([a, b], chunk=4)               # a decodes, b: 4..7
    assert toks[0] is not None and toks[1] is None and b.kv_len == 8
    toks = gen.step_batch([a, b], chunk=4)               # b: 8, 9 and its first token
    assert toks[1] is not None and len(b.tokens) == 11 and b.kv_len == 10
    alone = gen.new_sequence()
    alone.prefill(list(range(10)))
    assert alone.step_cached() == toks[1]


def test_bad_batches_raise_and_leave_the_sequences_usable():
    gen = rlx.Generator(QWEN, weights(QWEN), kv_dtype="f32")
    other = rlx.Generator(QWEN, weights(QWEN), kv_dtype="f32")
    a, b = gen.new_sequence(), gen.new_sequence()
    a.prefill([1, 2, 3])
    b.prefill([4, 5])
    with pytest.raises(ValueError, match="same sequence"):
        gen.step_batch([a, a])
    with pytest.raises(ValueError, match="1..16"):
        gen.step_batch([])
    with pytest.raises(ValueError, match="1..16"):
        gen.step_batch([gen.new_sequence() for _ in range(17)])
    with pytest.raises(TypeError, match="rlx sequences"):
        gen.step_batch([a, "b"])
    with pytest.raises(ValueError, match="chunk"):
        gen.step_batch([a, b], chunk=-1)
    o = other.new_sequence()
    o.prefill([1])
    with pytest.raises(ValueError, match="another model"):
        gen.step_batch([a, o])
    with pytest.raises(rlx.Error, match="no context"):
        gen.step_batch([a, gen.new_sequence()])
    h = gen.new_sequence(kv_dtype="f16")
    h.prefill([1])
    with pytest.raises(ValueError, match="KV cache"):
        gen.step_batch([a, h])
    with pytest.raises(ValueError, match="2 options for 3"):
        gen.step_batch([a, b, h], [rlx.SampleOpts()] * 2)
    assert a.tokens == [1, 2, 3] and a.kv_len == 0 and b.tokens == [4, 5]
    toks = gen.step_batch([a, b])
    alone = gen.new_sequence()
    alone.prefill([1, 2, 3])
    assert toks[0] == alone.step_cached()


def test_a_full_context_in_a_batch_is_a_clear_error_and_appends_nothing():
    gen = rlx.Generator(QWEN, weights(QWEN), kv_dtype="f32")
    short, full = gen.new_sequence(), gen.new_sequence()
    short.prefill([2, 3])
    full.prefill([1] * QWEN.max_position_embeddings)
    with pytest.raises(ValueError, match="sequence 1 of the batch: the context is full"):
        gen.step_batch([short, full])  # the last position runs; its new token has no room
    assert short.tokens == [2, 3] and len(full.tokens) == QWEN.max_position_embeddings
    full.truncate(10)
    toks = gen.step_batch([short, full])
    assert len(short.tokens) == 3 and len(full.tokens) == 11 and None not in toks


def run_in_one_batch(b: batching.Batcher, threads: list, n: int) -> None:
    """Starts threads whose first Batcher calls (n of them) are held until all are pending, so they
    go in one batch; joins them."""
    b._running = True
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(b._pending) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    with b._cv:
        b._running = False
        b._cv.notify_all()
    for t in threads:
        t.join(60)


def test_batcher_batches_the_calls_of_threads_and_each_gets_its_own_logits():
    """Six threads stepping their own sequences through one Batcher: the calls that meet go in one
    plan step (counted), and each thread's greedy tokens are those of its sequence alone."""
    gen = rlx.Generator(QWEN, weights(QWEN, seed=9), kv_dtype="f32")
    ps = prompts(QWEN, 6, seed=4)
    want = []
    for p in ps:
        s = gen.new_sequence()
        s.prefill(p)
        want.append(s.generate_cached(8))
    b = batching.Batcher(max_batch=16, chunk=8)
    got: list[list[int] | None] = [None] * 6

    def work(i: int) -> None:
        s = gen.new_sequence()
        s.prefill(ps[i])
        out = []
        for _ in range(8):
            logits = b.logits(s)
            tok = s._c.sample(logits, None, len(s.tokens))
            s.append(tok)
            out.append(tok)
        got[i] = out

    run_in_one_batch(b, [threading.Thread(target=work, args=(i,)) for i in range(6)], 6)
    assert got == want
    assert b.batches >= 1 and b.batched_rows >= 6


def test_batch_invariant_batcher_gives_each_thread_its_own_logits():
    """rlx.load's settings (dynamic plans) with batch-invariant ones and a Batcher that knows it:
    eight threads, each a fresh prompt then 8 steps through the Batcher (the prompts entering one at
    a time, alone; the decode steps batched however the threads meet, max_batch 8, where the default
    plans take the quant lanes kernel): every thread's logits, bit for bit, and tokens are those of
    its sequence stepped alone."""
    gen = rlx.Generator(WIDE, weights(WIDE, seed=4), dtype="q8_0")
    gen.with_dynamic_prefill_cache().with_dynamic_decode_cache().with_batch_invariant()
    ps = prompts(WIDE, 8, seed=12, lo=2, hi=25)
    want = []
    for p in ps:
        s = gen.new_sequence()
        s.prefill(p)
        rows = []
        for _ in range(8):
            rows.append(s._c.logits(cached=True))
            s.append(int(np.argmax(rows[-1])))
        want.append(rows)
    b = batching.Batcher(max_batch=8, batch_invariant=True)
    got: list[list | None] = [None] * 8

    def work(i: int) -> None:
        s = gen.new_sequence()
        s.prefill(ps[i])
        rows = []
        for _ in range(8):
            rows.append(b.logits(s))
            s.append(int(np.argmax(rows[-1])))
        got[i] = rows

    run_in_one_batch(b, [threading.Thread(target=work, args=(i,)) for i in range(8)], 8)
    for i in range(8):
        assert got[i] is not None, f"thread {i} did not finish"
        for j in range(8):
            np.testing.assert_array_equal(got[i][j], want[i][j], err_msg=f"thread {i}, step {j}")
    assert b.batches >= 1 and b.batched_rows >= 8


def test_batcher_sends_each_error_to_its_own_call():
    """A batch holding a bad request fails as a whole in C (changing no sequence); the Batcher runs
    its requests again one by one, so the bad one's call raises and the good one's gets logits."""
    gen = rlx.Generator(QWEN, weights(QWEN), kv_dtype="f32")
    b = batching.Batcher()
    good, empty = gen.new_sequence(), gen.new_sequence()
    good.prefill([1, 2])
    want = gen.new_sequence().prefill_get_last_logits([1, 2])
    results: dict = {}

    def call(name, seq):
        try:
            results[name] = b.logits(seq)
        except Exception as e:
            results[name] = e

    run_in_one_batch(b, [threading.Thread(target=call, args=a) for a in (("good", good), ("empty", empty))], 2)
    assert isinstance(results["empty"], rlx.Error) and "no context" in str(results["empty"])
    np.testing.assert_allclose(results["good"], want, rtol=0, atol=TOL)
    assert b.batches == 0  # the failed batch is not counted



def test_a_step_waits_for_its_members_and_no_longer_than_gather_s(monkeypatch):
    """Batcher.member(): a step waits for every member's call (so threads that reach the batcher at
    different moments still share the step), for a member that leaves no longer than its leaving,
    and for one that never asks no longer than GATHER_S."""
    gen = rlx.Generator(QWEN, weights(QWEN, seed=3), kv_dtype="f32")
    b = batching.Batcher()
    a, c = gen.new_sequence(), gen.new_sequence()
    a.prefill([1, 2, 3])
    c.prefill([4, 5])
    want_a = gen.new_sequence().prefill_get_last_logits([1, 2, 3])
    want_c = gen.new_sequence().prefill_get_last_logits([4, 5])
    got: dict = {}

    def ask():
        with b.member():
            got["a"] = b.logits(a)

    monkeypatch.setattr(batching, "GATHER_S", 60.0)
    t0 = time.monotonic()
    with b.member():  # this thread is a member that asks 0.2 s after the other
        t = threading.Thread(target=ask)
        t.start()
        time.sleep(0.2)
        assert "a" not in got  # its step is waiting for this member
        got["c"] = b.logits(c)
    t.join(30)
    assert time.monotonic() - t0 < 30
    assert (b.batches, b.batched_rows) == (1, 2)
    np.testing.assert_allclose(got["a"], want_a, rtol=0, atol=TOL)
    np.testing.assert_allclose(got["c"], want_c, rtol=0, atol=TOL)

    a.append(7)
    t0 = time.monotonic()
    with b.member():  # a member that leaves without asking: the waiting step goes on at once
        t = threading.Thread(target=ask)
        t.start()
        time.sleep(0.2)
        assert t.is_alive()
    t.join(30)
    assert time.monotonic() - t0 < 30 and b.batches == 1

    monkeypatch.setattr(batching, "GATHER_S", 0.05)
    a.append(8)
    with b.member():  # a member that never asks costs the step GATHER_S
        t0 = time.monotonic()
        t = threading.Thread(target=ask)
        t.start()
        t.join(30)
        assert not t.is_alive() and time.monotonic() - t0 < 30
    assert b.batches == 1 and got["a"].shape == (QWEN.vocab_size,)

    def interrupted(timeout=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(batching, "GATHER_S", 60.0)
    a.append(9)
    with b.member(), b.member():  # Ctrl-C while a step gathers: nothing ran, the batcher stays usable
        monkeypatch.setattr(b._cv, "wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            b.logits(a)
        monkeypatch.undo()
        assert not b._running and not b._pending
    np.testing.assert_allclose(b.logits(a), gen.new_sequence().prefill_get_last_logits(a.tokens), rtol=0, atol=TOL)

STORIES = __import__("pathlib").Path(__file__).resolve().parents[2].parent / "shared" / "models" / "stories260K" / "hf"


@pytest.mark.skipif(not (STORIES / "config.json").is_file(), reason="no stories260K beside the repo")
def test_model_generate_and_create_completion_take_several_prompts():
    """Model.generate / create_completion with a list of prompts: each text is the prompt's own
    (generated alone), the completion's choices in prompt order with summed usage, and the
    prompts' steps went through the Batcher together (their first calls held until all three are
    pending: whether free-running threads meet is up to the scheduler, and on a loaded machine
    they did not, 4 runs in 10)."""
    m = rlx.load(STORIES)
    prompts = ["Once upon a time", "The cat sat", "Tom and Lily went to the park"]
    alone = [m.generate(p, max_new_tokens=30, temperature=0) for p in prompts]
    got = []
    run_in_one_batch(m.batcher, [threading.Thread(
        target=lambda: got.append(m.generate(prompts, max_new_tokens=30, temperature=0)))], 3)
    assert got == [alone]
    assert m.stats["batched_steps"] > 0
    ids = [m.tokenizer.encode(p) for p in prompts]
    r = m.create_completion(ids, max_tokens=30, temperature=0)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert [c["text"] for c in r["choices"]] == alone
    assert r["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
    with pytest.raises(ValueError, match="outside the vocabulary"):  # checked before any runs
        m.create_completion([ids[0], [10**6]], max_tokens=3)
    with pytest.raises(ValueError, match="takes one prompt"):
        m.generate(prompts, stream=True)


@pytest.mark.skipif(not (STORIES / "config.json").is_file(), reason="no stories260K beside the repo")
def test_load_batch_invariant_gives_each_prompt_of_a_list_its_own_text():
    """rlx.load(..., batch_invariant=True): the model's plans and its Batcher both batch-invariant;
    eight prompts generated together (q8_0 weights, whose batches of 5 .. 16 take the quant lanes
    kernel by default), each the text it gets alone."""
    m = rlx.load(STORIES, dtype="q8_0", batch_invariant=True, cached_sequences=0)
    assert m.generator.batch_invariant and m.batcher.batch_invariant
    prompts = ["Once upon a time", "The cat sat", "Tom and Lily went to the park", "Lily saw a bird",
               "One day, a little girl", "The sun was", "Max liked to", "A big dog"]
    alone = [m.generate(p, max_new_tokens=24, temperature=0) for p in prompts]
    got = []
    run_in_one_batch(m.batcher, [threading.Thread(
        target=lambda: got.append(m.generate(prompts, max_new_tokens=24, temperature=0)))], 8)
    assert got == [alone]
    assert m.stats["batched_steps"] > 0
