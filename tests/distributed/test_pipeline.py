"""Pipeline-parallel inference (issue 5): stages, the coordinator and the CLI, against the
monolithic Generator.

- split == monolithic, in process: stage[world-1].forward(tokens=...) then stage[r].forward(hidden=...)
  down to rank 0, whose last-token logits must equal the Generator's within 1e-4, for world 1, 2, 4,
  PipelineStage and PipelineDecodeStage (several decode steps), Llama, Qwen3 (tied, untied,
  biased, sliding window) and Qwen3-MoE (blocks holding sparse and dense layers; HF experts as parts).
- over TCP on loopback, one thread per rank: forward_step (world 2-4), generate (recompute, world
  2-4), PipelineDecodeStage bucketed off and on (world 2, 3) equal the Generator's greedy tokens on
  every rank; stories260K's 64 expected ids through 3 ranks; `python -m rlx pipeline` prints the
  expected text.
- MPI: tests/distributed/pipeline_mpi_check.py under `mpirun -np 3`.
- faults: a rank that raises, stalls, or whose process is killed mid-generation makes every other
  rank raise rlx.Error within the timeout; the CLI with a rank process killed exits non-zero.

The HF cases are tests/models/hf_cases.py's (random-initialised transformers models saved with
save_pretrained), built here with 4 layers so that world 4 has a layer per rank. Transport-level
faults (handshake, authentication, frames) are tested in test_transport.py. Every test joins its threads with a
timeout, closes every transport and listener in finally, kills its subprocesses in finally, and an
autouse fixture checks that no thread, socket or child process is left behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from leakcheck import children, established_connections

import rlx
from rlx.distributed import PipelineCoordinator, ProcessGroup, TcpTransport, free_loopback_addrs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K"
STORIES_HF = STORIES / "hf"
STORIES_EXPECTED = STORIES / "expected" / "greedy_once_upon_a_time.json"
have_stories = pytest.mark.skipif(
    not (STORIES_HF / "model.safetensors").is_file() or not STORIES_EXPECTED.is_file(),
    reason=f"stories260K not found under {STORIES} (the shared models directory beside the repo)")

TOL = 1e-4
FAULT_TIMEOUT = 3.0     # the transports' timeout in the fault tests
MARGIN = 3.0            # seconds allowed past it (a loaded 2-core machine)
PROMPT = [5, 17, 3, 42, 8, 29, 11, 60, 2, 33, 21, 9, 14]  # valid for every case's vocabulary (>= 97)
GREEDY = rlx.SampleOpts.greedy()

# -------------------------------------------------------------------------------------------------
# Fixtures: HF models (4 layers), stories260K, leak checks
# -------------------------------------------------------------------------------------------------


def _load_hf_cases():
    """tests/models/hf_cases.py as a plain module (for HF_CASES and its model builder); None when
    torch or transformers is missing."""
    spec = importlib.util.spec_from_file_location("_rlx_pipeline_hf_cases", ROOT / "tests" / "models" / "hf_cases.py")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except pytest.skip.Exception:
        return None
    return mod


_HF = _load_hf_cases()
LLAMA_CASES = ["llama_gqa1_untied", "llama_gqa2_tied", "llama_bias"]
QWEN3_CASES = ["qwen3_tied", "qwen3_bias_gqa4", "qwen3_sliding"]
MOE_CASES = ["qwen3moe_e8_k2_norm_dense", "qwen3moe_e16_k8_step2"]  # a dense layer in each: blocks mix them
N_LAYERS = 4
_models: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def hf_case(request, tmp_path_factory):
    """(cfg, weights) of the HF case named by request.param, with N_LAYERS layers."""
    if _HF is None:
        pytest.skip("torch/transformers not installed")
    name = request.param
    if name not in _models:
        family, kwargs = _HF.HF_CASES[name]
        model = _HF.build(family, dict(kwargs, num_hidden_layers=N_LAYERS))
        path = tmp_path_factory.mktemp(f"pipe_{name}")
        model.save_pretrained(path, safe_serialization=True)
        cfg = rlx.load_config(path)
        assert cfg.num_hidden_layers == N_LAYERS
        _models[name] = (cfg, rlx.load_weights(path))
    return _models[name]


@pytest.fixture(scope="module")
def stories():
    with open(STORIES_EXPECTED, encoding="utf-8") as f:
        exp = json.load(f)
    return rlx.load_config(STORIES_HF), rlx.load_weights(STORIES_HF), exp


@pytest.fixture(autouse=True)
def _no_leaks(nothing_left_behind):
    """No thread, socket or child process left behind (tests/distributed/conftest.py)."""
    yield


# -------------------------------------------------------------------------------------------------
# Helpers
# -------------------------------------------------------------------------------------------------

def make_stages(cls, cfg, weights, world: int, bucketed: int = 0) -> list:
    stages = [cls(cfg, "cpu", r, world, weights) for r in range(world)]
    if bucketed:
        stages = [s.with_decode_cache(bucketed) for s in stages]
    return stages


def run_split(stages, tokens=None) -> np.ndarray:
    """One pass through every block in process: the embedding block takes tokens, each lower rank
    the hidden rows of the one above; returns rank 0's output."""
    world = len(stages)
    h = stages[world - 1].forward(tokens=tokens)
    for r in range(world - 2, -1, -1):
        assert h.shape == (len(tokens), stages[0].config.hidden_size), h.shape
        h = stages[r].forward(hidden=h)
    return h


def greedy_fn(stage):
    return lambda logits: stage.sample(logits)


def run_ranks(world: int, body, timeout: float = 10.0, join_timeout: float = 60.0, ranks=None, listeners=None,
              addrs=None):
    """Runs body(rank, coordinator) on one thread per rank, each over its own TcpTransport of a
    loopback mesh. Returns ({rank: result}, {rank: exception}, {rank: monotonic time it ended})."""
    own = listeners is None
    if own:
        addrs, listeners = free_loopback_addrs(world)
    results, errors, ended = {}, {}, {}

    def rank_main(r):
        try:
            with TcpTransport(r, world, addrs, listener=listeners[r], timeout=timeout) as t:
                results[r] = body(r, PipelineCoordinator(ProcessGroup(t)))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[r] = e
        finally:
            ended[r] = time.monotonic()

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"pipeline-rank{r}", daemon=True)
               for r in (range(world) if ranks is None else ranks)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(join_timeout)
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"ranks still running after {join_timeout} s: {alive}"
    finally:
        if own:
            for s in listeners:
                s.close()
    return results, errors, ended


def all_ok(results, errors, world):
    if errors:
        r, e = next(iter(sorted(errors.items())))
        raise AssertionError(f"rank {r} failed: {type(e).__name__}: {e}") from e
    assert sorted(results) == list(range(world))
    return [results[r] for r in range(world)]


# -------------------------------------------------------------------------------------------------
# Split == monolithic, in process
# -------------------------------------------------------------------------------------------------

ALL_CASES = LLAMA_CASES + QWEN3_CASES + MOE_CASES


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("hf_case", ALL_CASES, indirect=True)
def test_split_equals_monolithic_recompute(hf_case, world):
    cfg, weights = hf_case
    gen = rlx.Generator(cfg, weights)
    stages = make_stages(rlx.PipelineStage, cfg, weights, world)
    ids, worst = list(PROMPT), 0.0
    for _ in range(4):  # several recompute steps, each over the whole (growing) sequence
        want = gen.prefill_get_last_logits(ids)
        got = run_split(stages, ids)
        assert got.shape == want.shape == (cfg.vocab_size,)
        worst = max(worst, float(np.abs(got - want).max()))
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        ids.append(int(np.argmax(want)))
    print(f"parity recompute world {world}: max |dlogit| = {worst:.2e}")


@pytest.mark.parametrize("bucketed", [0, 64])
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("hf_case", ALL_CASES, indirect=True)
def test_split_equals_monolithic_decode(hf_case, world, bucketed):
    cfg, weights = hf_case
    gen = rlx.Generator(cfg, weights)
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, world, bucketed)
    for utterance in range(2):  # reset() starts a fresh sequence on every block
        prompt = PROMPT if utterance == 0 else PROMPT[3:9]
        for s in stages:
            s.reset()
        want = gen.prefill_get_last_logits(prompt)
        got = run_split(stages, prompt)
        worst = float(np.abs(got - want).max())
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        for _ in range(6):  # decode steps: one new position through every block's KV cache
            tok = int(np.argmax(want))
            want = gen.decode_get_logits(tok)
            got = run_split(stages, [tok])
            worst = max(worst, float(np.abs(got - want).max()))
            np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    print(f"parity decode world {world} bucketed {bucketed}: max |dlogit| = {worst:.2e}")


@pytest.mark.parametrize("hf_case", ["qwen3_sliding"], indirect=True)
def test_sliding_window_crosses_blocks(hf_case):
    """Layers keep their global sliding windows in every block: a past longer than the window
    (4) through 4 ranks, decoded well beyond it."""
    cfg, weights = hf_case
    assert [cfg.layer_window(i) for i in range(N_LAYERS)] == [0, 4, 4, 4]
    gen = rlx.Generator(cfg, weights)
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, 4)
    want = gen.prefill_get_last_logits(PROMPT[:2])
    np.testing.assert_allclose(run_split(stages, PROMPT[:2]), want, atol=TOL, rtol=0)
    for tok in PROMPT[2:] + [7, 8, 9]:
        want = gen.decode_get_logits(tok)
        np.testing.assert_allclose(run_split(stages, [tok]), want, atol=TOL, rtol=0)


# -------------------------------------------------------------------------------------------------
# Over TCP, one thread per rank
# -------------------------------------------------------------------------------------------------

TCP_CASES = ["llama_gqa1_untied", "qwen3_sliding", "qwen3moe_e8_k2_norm_dense"]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("hf_case", TCP_CASES, indirect=True)
def test_forward_step_gives_every_rank_the_greedy_token(hf_case, world):
    cfg, weights = hf_case
    want = int(np.argmax(rlx.Generator(cfg, weights).prefill_get_last_logits(PROMPT)))
    stages = make_stages(rlx.PipelineStage, cfg, weights, world)

    def body(r, co):
        st = stages[r]
        tok = co.forward_step(st, PROMPT, greedy_fn(st))
        assert co.timings["steps"] == 1 and co.timings["compute"] > 0, co.timings
        if r > 0:
            assert co.timings["send"] > 0, co.timings
        co.barrier()
        return tok

    assert all_ok(*run_ranks(world, body)[:2], world) == [want] * world


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("hf_case", TCP_CASES, indirect=True)
def test_generate_recompute_equals_monolithic(hf_case, world):
    cfg, weights = hf_case
    gen = rlx.Generator(cfg, weights)
    gen.prefill(PROMPT)
    want = gen.generate(5, GREEDY)
    stages = make_stages(rlx.PipelineStage, cfg, weights, world)

    def body(r, co):
        return co.generate(stages[r], PROMPT, 5, greedy_fn(stages[r]))

    assert all_ok(*run_ranks(world, body)[:2], world) == [want] * world


@pytest.mark.parametrize("bucketed", [0, 64])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("hf_case", TCP_CASES, indirect=True)
def test_decode_stage_equals_cached_generator(hf_case, world, bucketed):
    cfg, weights = hf_case
    gen = rlx.Generator(cfg, weights)
    prompts = [PROMPT, PROMPT[4:]]
    wants = []
    for p in prompts:
        gen.prefill(p)
        wants.append(gen.generate_cached(12, GREEDY))
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, world, bucketed)

    def body(r, co):
        # Two utterances on the same stages: generate() resets every block's cache.
        return [co.generate(stages[r], p, 12, greedy_fn(stages[r])) for p in prompts]

    assert all_ok(*run_ranks(world, body)[:2], world) == [wants] * world


MANY_PROMPTS = [PROMPT, PROMPT[4:], PROMPT[:3], PROMPT[7:] + PROMPT[:2], PROMPT[2:9]]


@pytest.mark.parametrize("requests", [1, 2, 5])
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("kind", ["decode", "recompute"])
@pytest.mark.parametrize("hf_case", ["qwen3_sliding", "qwen3moe_e8_k2_norm_dense"], indirect=True)
def test_micro_batched_pipeline_gives_each_request_its_monolithic_tokens(hf_case, kind, world, requests):
    """generate_many: up to 5 requests in flight through 2-4 ranks (fewer requests than ranks
    leaves bubbles; more keeps every rank busy), stops that end requests at different lengths:
    every rank returns each request's greedy tokens of the monolithic model alone."""
    cfg, weights = hf_case
    gen = rlx.Generator(cfg, weights)
    prompts = MANY_PROMPTS[:requests]
    free = []
    for p in prompts:
        gen.prefill(p)
        free.append(gen.generate_cached(7, GREEDY))
    stop = {free[0][3]}  # request 0 (and any that makes this token) ends early
    wants = [f[:f.index(next(t for t in f if t in stop)) + 1] if stop & set(f) else f for f in free]
    cls = rlx.PipelineDecodeStage if kind == "decode" else rlx.PipelineStage
    stages = make_stages(cls, cfg, weights, world)
    decided = []

    def body(r, co):
        st = stages[r]

        def stop_fn(tok, j):
            decided.append((r, j))
            return tok in stop
        out = co.generate_many(st, prompts, 7, lambda logits, j: st.sample(logits), stop_fn)
        assert co.timings["steps"] == sum(len(w) for w in wants), co.timings
        return out

    assert all_ok(*run_ranks(world, body)[:2], world) == [wants] * world
    assert {r for r, _ in decided} == {0}


@pytest.mark.parametrize("hf_case", ["qwen3_tied"], indirect=True)
def test_stop_is_decided_on_rank_0_and_broadcast(hf_case):
    cfg, weights = hf_case
    gen = rlx.Generator(cfg, weights)
    gen.prefill(PROMPT)
    full = gen.generate_cached(10, GREEDY)
    stop_at = full[3]
    want = full[:full.index(stop_at) + 1]
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, 3)
    calls = {}

    def body(r, co):
        def stop_fn(tok, r=r):
            calls[r] = calls.get(r, 0) + 1
            return tok == stop_at
        return co.generate(stages[r], PROMPT, 10, greedy_fn(stages[r]), stop_fn=stop_fn)

    assert all_ok(*run_ranks(3, body)[:2], 3) == [want] * 3
    assert list(calls) == [0], calls  # only rank 0 decides


@pytest.mark.parametrize("mode", ["decode", "bucketed", "recompute"])
@have_stories
def test_stories260k_expected_ids_through_three_ranks(stories, mode):
    cfg, weights, exp = stories
    cls = rlx.PipelineStage if mode == "recompute" else rlx.PipelineDecodeStage
    stages = make_stages(cls, cfg, weights, 3, 128 if mode == "bucketed" else 0)
    assert [s.layers() for s in stages] == [range(4, 5), range(2, 4), range(0, 2)]
    n = 64 if mode != "recompute" else 24

    def body(r, co):
        ids = co.generate(stages[r], exp["prompt_tokens"], n, greedy_fn(stages[r]))
        co.barrier()
        return ids, dict(co.timings)

    out = all_ok(*run_ranks(3, body)[:2], 3)
    for ids, timings in out:
        assert ids == exp["new_tokens"][:n]
        assert timings["steps"] == n
    # Rank 0 never sends hidden states; the others do, once per step.
    assert out[0][1]["send"] == 0.0 and out[1][1]["send"] > 0 and out[2][1]["send"] > 0


@have_stories
def test_cli_pipeline_prints_the_expected_text(stories):
    exp = stories[2]
    cmd = [sys.executable, "-m", "rlx", "pipeline", "--model", str(STORIES_HF), "--world", "3",
           "--prompt", exp["prompt"], "--max-new-tokens", "64", "--threads", "1", "--timeout", "30"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        _kill_group(proc)
    assert proc.returncode == 0, err
    assert out == exp["text"] + "\n", (out, err)
    # Every rank reports its per-stage timings (ranks share stderr: reports may run together).
    reports = re.findall(r"\[rlx\] rank (\d)/3 (\w+) layers (\d)\.\.(\d) \(\d+ tensors\): 64 tokens in [^;]*;"
                         r" compute [\d.]+ s, send [\d.]+ s, wait [\d.]+ s", err)
    assert sorted(reports) == [("0", "last", "4", "4"), ("1", "middle", "2", "3"), ("2", "first", "0", "1")], err


@have_stories
def test_mpi_pipeline_three_ranks(stories):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev; `make` installs them)")
    try:
        from rlx import _mpi  # noqa: F401
    except ImportError:
        pytest.skip("rlx was built without MPI")
    exp = stories[2]
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3", sys.executable,
           str(HERE / "pipeline_mpi_check.py"), str(STORIES_HF)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        _kill_group(proc)
    assert proc.returncode == 0, out + err
    got = dict(re.findall(r"OK rank (\d+) world 3 ids ([\d,]+)", out))
    assert sorted(got) == ["0", "1", "2"], out + err
    for r, ids in got.items():
        assert [int(i) for i in ids.split(",")] == exp["new_tokens"], r


@pytest.mark.parametrize("longer", [0, 1])
@have_stories
def test_ranks_that_disagree_on_the_prompt_fail_clearly(stories, longer):
    """Every rank must pass the same prompt (its length sizes the hidden rows received): a rank
    given a longer one gets a clear size error, never wrong numbers, and the other one fails too."""
    cfg, weights, exp = stories
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, 2)
    prompts = {0: exp["prompt_tokens"], 1: exp["prompt_tokens"]}
    prompts[longer] = exp["prompt_tokens"] + [400]

    def body(r, co):
        return co.generate(stages[r], prompts[r], 4, greedy_fn(stages[r]))

    results, errors, _ = run_ranks(2, body, timeout=FAULT_TIMEOUT, join_timeout=FAULT_TIMEOUT + 30)
    assert not results and sorted(errors) == [0, 1], (results, errors)
    if longer == 0:   # rank 0 expects 6 rows of hidden state, rank 1 sends 5
        assert isinstance(errors[0], rlx.Error) and "rank 1 sent 1280 bytes" in str(errors[0]), errors[0]
    else:             # rank 0 expects 5 rows, rank 1 sends 6: too large for the buffer
        assert isinstance(errors[0], (rlx.Error, ValueError)) and "1536" in str(errors[0]), errors[0]
    assert isinstance(errors[1], rlx.Error), errors[1]


# -------------------------------------------------------------------------------------------------
# Faults
# -------------------------------------------------------------------------------------------------

def _kill_group(proc: subprocess.Popen) -> None:
    """Kills proc's whole session (it was started with start_new_session) and reaps proc."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


class FailingStage:
    """A stage that raises on its third forward (after two good steps) or, with `stall`, blocks
    there until released."""

    def __init__(self, stage, stall: threading.Event | None = None):
        self.stage, self.stall, self.calls = stage, stall, 0
        self.failed_at = None

    def __getattr__(self, name):
        return getattr(self.stage, name)

    def forward(self, **kw):
        self.calls += 1
        if self.calls == 3:
            self.failed_at = time.monotonic()
            if self.stall is None:
                raise RuntimeError("injected failure")
            self.stall.wait(FAULT_TIMEOUT * 4)
        return self.stage.forward(**kw)


def _check_peer_error(e: BaseException) -> None:
    assert isinstance(e, rlx.Error), f"{type(e).__name__}: {e}"
    assert re.search(r"rank \d+ closed the connection|timed out|time ?out", str(e)), str(e)


@pytest.mark.parametrize("many", [False, True], ids=["generate", "generate_many"])
@pytest.mark.parametrize("failing", [0, 1, 2])
@have_stories
def test_rank_that_raises_mid_generation(stories, failing, many):
    """generate_many (4 requests in flight) fails as generate does: every other rank raises
    within the timeout."""
    cfg, weights, exp = stories
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, 3)
    stages[failing] = FailingStage(stages[failing])
    prompt = exp["prompt_tokens"]

    def body(r, co):
        st = stages[r]
        if many:
            return co.generate_many(st, [prompt, prompt[:2], prompt[1:], prompt], 64, lambda lg, j: st.sample(lg))
        return co.generate(st, prompt, 64, greedy_fn(st))

    results, errors, ended = run_ranks(3, body, timeout=FAULT_TIMEOUT)
    assert not results, results
    assert isinstance(errors[failing], RuntimeError) and "injected failure" in str(errors[failing])
    t_fail = stages[failing].failed_at
    for r in {0, 1, 2} - {failing}:
        _check_peer_error(errors[r])
        assert ended[r] - t_fail < FAULT_TIMEOUT + MARGIN, (r, ended[r] - t_fail, errors[r])
    print(f"fault raise rank {failing}: peers failed after "
          f"{', '.join(f'rank {r} {ended[r] - t_fail:.3f} s' for r in sorted(errors) if r != failing)}")


@have_stories
def test_rank_that_stalls_makes_the_others_time_out(stories):
    cfg, weights, exp = stories
    stall = threading.Event()
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, 3)
    stages[1] = FailingStage(stages[1], stall=stall)

    def body(r, co):
        try:
            return co.generate(stages[r], exp["prompt_tokens"], 64, greedy_fn(stages[r]))
        finally:
            if r != 1:
                done.add(r)
                if done == {0, 2}:
                    stall.set()  # release the stalled rank once the others have given up

    done: set[int] = set()
    results, errors, ended = run_ranks(3, body, timeout=FAULT_TIMEOUT)
    t_stall = stages[1].failed_at
    assert not results, results
    for r in (0, 2):
        _check_peer_error(errors[r])
        waited = ended[r] - t_stall
        assert waited < FAULT_TIMEOUT + MARGIN, (r, waited, errors[r])
    # Rank 0 waits for rank 1's hidden states: it gives up by its own timeout.
    assert ended[0] - t_stall >= FAULT_TIMEOUT - 1.0
    assert isinstance(errors.get(1), rlx.Error), errors.get(1)  # its peers are gone when it wakes
    print(f"fault stall rank 1: rank 0 gave up after {ended[0] - t_stall:.3f} s, rank 2 after "
          f"{ended[2] - t_stall:.3f} s ({errors[0]}; {errors[2]})")


RANK_SCRIPT = textwrap.dedent("""
    import socket, sys, time
    import rlx
    from rlx.distributed import PipelineCoordinator, ProcessGroup, TcpTransport
    model, addrs, fd, timeout = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4])
    cfg, weights = rlx.load_config(model), rlx.load_weights(model)
    st = rlx.PipelineDecodeStage(cfg, "cpu", 2, 3, weights)
    calls = [0]
    forward = st.forward
    def stalling_forward(**kw):
        calls[0] += 1
        if calls[0] == 3:
            print("stalled", flush=True)   # the test kills this process now
            time.sleep(60)
        return forward(**kw)
    st.forward = stalling_forward
    with TcpTransport(2, 3, addrs, listener=socket.socket(fileno=fd), timeout=timeout) as t:
        PipelineCoordinator(ProcessGroup(t)).generate(st, [1, 403, 407, 261, 378], 64, lambda l: st.sample(l))
""")


@have_stories
def test_rank_process_killed_mid_generation(stories):
    """Rank 2 (the embedding block) is a subprocess killed with SIGKILL after two steps; ranks 0
    and 1 (threads here) must raise rlx.Error promptly."""
    cfg, weights, exp = stories
    stages = make_stages(rlx.PipelineDecodeStage, cfg, weights, 3)
    addrs, listeners = free_loopback_addrs(3)
    killed_at = {}
    proc = None
    try:
        fd = listeners[2].fileno()
        proc = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(STORIES_HF), ",".join(addrs), str(fd),
                                 str(FAULT_TIMEOUT * 10)],
                                cwd=ROOT, pass_fds=(fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

        def killer():
            line = proc.stdout.readline()
            if line.strip() == "stalled":
                killed_at["t"] = time.monotonic()
                proc.kill()

        k = threading.Thread(target=killer, name="killer", daemon=True)
        k.start()

        def body(r, co):
            return co.generate(stages[r], exp["prompt_tokens"], 64, greedy_fn(stages[r]))

        # The child imports rlx and builds its stage first: allow for that in the set-up timeout,
        # and a short timeout per wait afterwards is what the peers would hit without an EOF.
        results, errors, ended = run_ranks(3, body, timeout=30.0, ranks=[0, 1], listeners=listeners, addrs=addrs)
        k.join(30)
        assert not k.is_alive()
    finally:
        for s in listeners:
            s.close()
        if proc is not None:
            _kill_group(proc)
    assert "t" in killed_at, proc.stderr
    assert proc.returncode == -signal.SIGKILL
    assert not results, results
    for r in (0, 1):
        _check_peer_error(errors[r])
        assert "closed the connection" in str(errors[r]), errors[r]
        assert ended[r] - killed_at["t"] < FAULT_TIMEOUT + MARGIN, (r, ended[r] - killed_at["t"])
    print("fault kill rank 2 process: "
          + ", ".join(f"rank {r} failed after {ended[r] - killed_at['t']:.3f} s ({errors[r]})" for r in (0, 1)))


@have_stories
def test_cli_with_a_rank_process_killed_exits_nonzero(stories):
    """`python -m rlx pipeline` (3 spawned ranks, --timeout 3, 400 recomputed tokens: several
    seconds) with rank 1's process killed once its mesh is up (both peers' connections
    established) and it is generating: the launcher exits non-zero, promptly, and prints no
    text."""
    exp = stories[2]
    timeout = FAULT_TIMEOUT
    cmd = [sys.executable, "-m", "rlx", "pipeline", "--model", str(STORIES_HF), "--world", "3",
           "--prompt", exp["prompt"], "--max-new-tokens", "400", "--recompute", "--threads", "1",
           "--timeout", str(timeout)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        victim, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if victim is None:
                for pid in children(proc.pid):
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            argv = f.read().split(b"\0")
                    except OSError:
                        continue
                    if b"--rank" in argv and argv[argv.index(b"--rank") + 1] == b"1":
                        victim = pid
            elif established_connections(victim) >= 2:   # to rank 0 and rank 2: the mesh is up
                break
            time.sleep(0.01)
        assert victim is not None and proc.poll() is None, "rank 1 never started or the run ended first"
        time.sleep(0.3)                         # into the generation
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        out, err = proc.communicate(timeout=timeout + 60)
        elapsed = time.monotonic() - t_kill
    finally:
        _kill_group(proc)
    assert proc.returncode != 0, (out, err)
    assert out == "", out                       # rank 0 never got to print the text
    assert "rank 1 exited with status -9" in err, err
    # The surviving ranks fail with the transport's error, not a hang or a bare traceback.
    # (rank 0 sees rank 1 gone; rank 2, waiting for rank 0's broadcast, may see either.)
    assert "rlx: error: rank 1 closed the connection" in err, err
    assert len(re.findall(r"rlx: error: rank [01] closed the connection", err)) == 2, err
    assert elapsed < timeout + MARGIN, elapsed
    print(f"fault CLI kill rank 1: launcher exited {proc.returncode} {elapsed:.2f} s after the kill")
