"""The CPython/NumPy boundary of rlx._C: ownership, errors, threads, leaks.

- inputs (and params) are never modified; outputs are fresh arrays;
- set_param is zero-copy on host memory (the cpu backend reads the caller's array; the ref
  backend uploads a copy, like a device would);
- every bad call (dtype, shape, missing / unknown input, unknown param, wrong types) raises an
  exception and the plan stays usable;
- the GIL is released while a plan runs; distinct plans run concurrently, threads sharing one
  plan take turns and still get correct results;
- 1,000 compile + run cycles do not grow RSS.
"""

import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import rlx
from rlx.reference import ops as ref


def randn(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


def small_graph(d=16):
    """y = rmsnorm(x @ w, n) + x ; ids -> embedding rows; both outputs."""
    g = rlx.Graph()
    x = g.input("x", ("SEQ", d))
    w = g.param("w", (d, d))
    n = g.param("n", (d,))
    table = g.param("table", (10, d))
    ids = g.input("ids", ("SEQ",), "i32")
    g.output(g.add(g.rmsnorm(g.matmul(x, w), n, eps=1e-6), x), "y")
    g.output(g.embedding(table, ids), "e")
    return g


def small_params(d=16, seed=0):
    r = np.random.default_rng(seed)
    return {"w": randn(r, d, d), "n": randn(r, d), "table": randn(r, 10, d)}


def small_expected(x, ids, p):
    y = ref.add(ref.rmsnorm(ref.matmul(x, p["w"]), p["n"], 1e-6), x)
    return y, ref.embedding(p["table"], ids)


def small_plan(device, d=16, seed=0):
    plan = rlx.compile(small_graph(d), device=device)
    p = small_params(d, seed)
    for name, arr in p.items():
        plan.set_param(name, arr)
    return plan, p


def check_small(plan, p, seq=3, seed=1):
    r = np.random.default_rng(seed)
    x = randn(r, seq, p["n"].shape[0])
    ids = r.integers(0, 10, size=seq).astype(np.int32)
    y, e = plan.run({"x": x, "ids": ids})
    ey, ee = small_expected(x, ids, p)
    np.testing.assert_allclose(y, ey, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(e, ee)


# ---------------------------------------------------------------------------------------------
# ownership
# ---------------------------------------------------------------------------------------------

def test_inputs_and_params_never_mutated(device):
    plan, p = small_plan(device)
    p_copies = {k: v.copy() for k, v in p.items()}
    r = np.random.default_rng(5)
    x = randn(r, 4, 16)
    ids = np.array([1, 2, 3, 9], np.int32)
    x_copy, ids_copy = x.copy(), ids.copy()
    outs1 = plan.run({"x": x, "ids": ids})
    outs2 = plan.run({"x": x, "ids": ids})
    np.testing.assert_array_equal(x, x_copy)
    np.testing.assert_array_equal(ids, ids_copy)
    for k in p:
        np.testing.assert_array_equal(p[k], p_copies[k])
    for a, b in zip(outs1, outs2):
        assert a is not b and not np.shares_memory(a, b)
        np.testing.assert_array_equal(a, b)
        assert a.flags.c_contiguous and a.flags.writeable and a.flags.owndata
    outs1[0][:] = 0  # writing an output does not affect the next run
    np.testing.assert_array_equal(plan.run({"x": x, "ids": ids})[0], outs2[0])


def test_reference_counts_balanced(device):
    """Every path through run/set_param drops exactly the references it took."""
    import sys

    plan, p = small_plan(device)
    x, ids = np.zeros((3, 16), np.float32), np.array([0, 1, 2], np.int32)
    xd = x.astype(np.float64)
    before = [sys.getrefcount(a) for a in (x, ids, xd)]
    for _ in range(50):
        plan.run({"x": x, "ids": ids})
        for bad in ({"x": xd, "ids": ids}, {"x": x, "ids": ids[:2]}, {"x": x}, {"x": x, "ids": ids, "q": x}):
            with pytest.raises(ValueError):
                plan.run(bad)
    del bad
    assert [sys.getrefcount(a) for a in (x, ids, xd)] == before
    w = np.ones(16, np.float32)
    base = sys.getrefcount(w)
    plan.set_param("n", w)
    assert sys.getrefcount(w) == base + 1  # held by the plan (zero-copy)
    with pytest.raises(ValueError):
        plan.set_param("n", np.ones(15, np.float32))
    assert sys.getrefcount(w) == base + 1  # a failed set_param keeps the old binding
    plan.set_param("n", p["n"])
    assert sys.getrefcount(w) == base
    plan.set_param("n", w)
    del plan
    gc.collect()
    assert sys.getrefcount(w) == base


def test_non_contiguous_inputs_read_correctly_not_mutated(device):
    plan, p = small_plan(device)
    r = np.random.default_rng(6)
    big = randn(r, 16, 8)
    x = big.T  # (8, 16), Fortran-ordered view
    ids_big = np.arange(20, dtype=np.int32) % 10
    ids = ids_big[::4]  # 5 strided ids
    x = x[:5]
    x_copy, ids_copy = x.copy(), ids.copy()
    y, e = plan.run({"x": x, "ids": ids})
    ey, ee = small_expected(np.ascontiguousarray(x), np.ascontiguousarray(ids), p)
    np.testing.assert_allclose(y, ey, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(e, ee)
    np.testing.assert_array_equal(x, x_copy)
    np.testing.assert_array_equal(ids, ids_copy)


DTYPES = [("f32", np.float32), ("f16", np.float16), ("i32", np.int32), ("u8", np.uint8), ("u8", np.bool_),
          ("bf16", np.uint16)]


@pytest.mark.parametrize("dt,np_dtype", DTYPES, ids=[f"{a}-{b.__name__}" for a, b in DTYPES])
def test_dtype_round_trip_through_shape_ops(device, dt, np_dtype):
    """concat / slice / reshape carry any dtype; outputs come back with the matching NumPy dtype
    (u8 for bool inputs, uint16 bits for bf16)."""
    g = rlx.Graph()
    x = g.input("x", (2, 3), dt)
    g.output(g.reshape(g.slice(g.concat(x, x, axis=1), 1, 1, 4), (4, 2)), "y")
    a = (np.arange(6).reshape(2, 3) % 2).astype(np_dtype)
    (y,) = rlx.compile(g, device=device).run({"x": a})
    expected = np.concatenate([a, a], 1)[:, 1:5].reshape(4, 2)
    want = {np.bool_: np.uint8}.get(np_dtype, np_dtype)
    assert y.dtype == want
    np.testing.assert_array_equal(y, expected.astype(want))


def test_misaligned_input_is_copied_not_mutated(device):
    g = rlx.Graph()
    g.output(g.silu(g.input("x", (5,))), "y")
    raw = bytearray(4 * 5 + 1)
    x = np.frombuffer(raw, dtype=np.float32, count=5, offset=1)
    assert not x.flags.aligned
    (y,) = rlx.compile(g, device=device).run({"x": x})
    np.testing.assert_array_equal(y, np.zeros(5, np.float32))
    assert raw == bytearray(21)


def test_read_only_inputs_and_params(device):
    plan = rlx.compile(small_graph(), device=device)
    p = small_params()
    for name, arr in p.items():
        arr.setflags(write=False)
        plan.set_param(name, arr)
    x = randn(np.random.default_rng(0), 2, 16)
    x.setflags(write=False)
    ids = np.array([0, 1], np.int32)
    ids.setflags(write=False)
    y, e = plan.run({"x": x, "ids": ids})
    np.testing.assert_allclose(y, small_expected(x, ids, p)[0], rtol=1e-4, atol=1e-4)


def test_set_param_zero_copy_on_cpu():
    """The cpu backend reads the caller's array: a later write to it changes the next result.
    This documents the contract (the plan keeps the array alive, it does not snapshot it)."""
    g = rlx.Graph()
    g.output(g.matmul(g.input("x", (1, 4)), g.param("w", (4, 2))), "y")
    plan = rlx.compile(g, device="cpu")
    w = np.ones((4, 2), np.float32)
    plan.set_param("w", w)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(plan.run({"x": x})[0], [[4, 4]])
    w[:, 1] = 2
    np.testing.assert_array_equal(plan.run({"x": x})[0], [[4, 8]])


def test_set_param_keeps_array_alive():
    g = rlx.Graph()
    g.output(g.matmul(g.input("x", (1, 4)), g.param("w", (4, 2))), "y")
    plan = rlx.compile(g, device="cpu")
    plan.set_param("w", np.full((4, 2), 3, np.float32))  # the only reference is the plan's
    gc.collect()
    np.testing.assert_array_equal(plan.run({"x": np.ones((1, 4), np.float32)})[0], [[12, 12]])
    plan.set_param("w", np.full((4, 2), 1, np.float32))  # replaces (and releases) the first
    np.testing.assert_array_equal(plan.run({"x": np.ones((1, 4), np.float32)})[0], [[4, 4]])


def test_set_param_copies_on_ref_backend():
    g = rlx.Graph()
    g.output(g.matmul(g.input("x", (1, 4)), g.param("w", (4, 2))), "y")
    plan = rlx.compile(g, device="ref")
    w = np.ones((4, 2), np.float32)
    plan.set_param("w", w)
    w[:] = 100  # the ref backend uploaded a copy at set_param
    np.testing.assert_array_equal(plan.run({"x": np.ones((1, 4), np.float32)})[0], [[4, 4]])


def test_set_param_non_contiguous_is_copied_once(device):
    g = rlx.Graph()
    g.output(g.matmul(g.input("x", (1, 4)), g.param("w", (4, 2))), "y")
    plan = rlx.compile(g, device=device)
    wt = np.arange(8, dtype=np.float32).reshape(2, 4)
    w = wt.T  # (4, 2) not C-contiguous
    plan.set_param("w", w)
    x = np.ones((1, 4), np.float32)
    expected = x @ w
    np.testing.assert_array_equal(plan.run({"x": x})[0], expected)
    wt[:] = -1  # the plan reads its own contiguous copy
    np.testing.assert_array_equal(plan.run({"x": x})[0], expected)


# ---------------------------------------------------------------------------------------------
# errors: exceptions, never crashes; the plan stays usable
# ---------------------------------------------------------------------------------------------

GOOD_X = np.zeros((3, 16), np.float32)
GOOD_IDS = np.array([0, 1, 2], np.int32)

BAD_RUNS = {
    "x float64": ({"x": GOOD_X.astype(np.float64), "ids": GOOD_IDS}, ValueError, ["'x'", "f32", "float64"]),
    "ids int64": ({"x": GOOD_X, "ids": GOOD_IDS.astype(np.int64)}, ValueError, ["'ids'", "i32", "int64"]),
    "x list": ({"x": GOOD_X.tolist(), "ids": GOOD_IDS}, ValueError, ["'x'"]),
    "x big-endian": ({"x": GOOD_X.astype(">f4"), "ids": GOOD_IDS}, ValueError, ["'x'"]),
    "x wrong inner dim": ({"x": np.zeros((3, 15), np.float32), "ids": GOOD_IDS}, ValueError, ["x"]),
    "x wrong rank": ({"x": np.zeros((3, 16, 1), np.float32), "ids": GOOD_IDS}, ValueError, ["x"]),
    "x 5-d": ({"x": np.zeros((1, 1, 1, 3, 16), np.float32), "ids": GOOD_IDS}, ValueError, ["'x'"]),
    "SEQ disagrees": ({"x": GOOD_X, "ids": GOOD_IDS[:2]}, ValueError, ["SEQ"]),
    "missing input": ({"x": GOOD_X}, ValueError, ["'ids'"]),
    "unknown input": ({"x": GOOD_X, "ids": GOOD_IDS, "z": GOOD_X}, ValueError, ["'z'"]),
    "id out of range": ({"x": GOOD_X, "ids": np.array([0, 10, 1], np.int32)}, ValueError, []),
    "key not str": ({"x": GOOD_X, "ids": GOOD_IDS, 3: GOOD_X}, TypeError, []),
    "object array": ({"x": np.array([object()] * 48).reshape(3, 16), "ids": GOOD_IDS}, ValueError, ["'x'"]),
}


@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_bad_run_raises_and_plan_stays_usable(device, case):
    plan, p = small_plan(device)
    inputs, exc, words = BAD_RUNS[case]
    with pytest.raises(exc) as info:
        plan.run(inputs)
    for w in words:
        assert w in str(info.value), str(info.value)
    check_small(plan, p)


def test_run_argument_types(device):
    plan, p = small_plan(device)
    with pytest.raises(TypeError):
        plan.run([GOOD_X, GOOD_IDS])
    with pytest.raises(TypeError):
        plan.run()
    with pytest.raises(TypeError):
        plan.run({"x": GOOD_X, "ids": GOOD_IDS}, 1)
    check_small(plan, p)


def test_run_out_arrays_are_written_in_place(device):
    """run(out=) writes the named outputs into the given arrays and returns those very arrays, with
    the same bits as fresh outputs; on cpu the kernels write them directly (they leave the arena)."""
    plan, p = small_plan(device)
    r = np.random.default_rng(3)
    x, ids = randn(r, 3, 16), r.integers(0, 10, size=3).astype(np.int32)
    fresh_y, fresh_e = plan.run({"x": x, "ids": ids})
    unshared = plan.unshared_bytes
    y = np.full((3, 16), np.nan, np.float32)
    e = np.full((3, 16), np.nan, np.float32)
    got = plan.run({"x": x, "ids": ids}, out={"y": y, "e": e})
    assert got[0] is y and got[1] is e
    np.testing.assert_array_equal(y, fresh_y)
    np.testing.assert_array_equal(e, fresh_e)
    if device == "cpu":
        assert plan.unshared_bytes < unshared
    else:
        assert plan.unshared_bytes == unshared
    y2 = np.zeros((3, 16), np.float32)
    got = plan.run({"x": x, "ids": ids}, out={"y": y2})  # one output bound, the other fresh
    assert got[0] is y2 and got[1] is not e
    np.testing.assert_array_equal(y2, fresh_y)
    np.testing.assert_array_equal(got[1], fresh_e)
    y3 = np.zeros((3, 16), np.float32)
    plan.run({"x": x, "ids": ids})  # the binding lasted one run
    assert not y3.any()
    check_small(plan, p)


def _bad_outs(p):
    buf = np.zeros(100, np.float32)
    return {
        "not a dict": ([np.zeros((3, 16), np.float32)], TypeError, ["dict"]),
        "not an array": ({"y": [[0.0] * 16] * 3}, TypeError, ["'y'", "ndarray"]),
        "unknown output": ({"z": np.zeros((3, 16), np.float32)}, ValueError, ["'z'"]),
        "wrong dtype": ({"y": np.zeros((3, 16), np.float64)}, ValueError, ["'y'", "float32", "float64"]),
        "not contiguous": ({"y": np.zeros((3, 32), np.float32)[:, ::2]}, ValueError, ["'y'", "contiguous"]),
        "read-only": ({"y": np.zeros((3, 16), np.float32)[...].view()}, ValueError, ["'y'"]),
        "wrong size": ({"y": np.zeros((2, 16), np.float32)}, ValueError, ["'y'", "bytes"]),
        "wrong shape": ({"y": np.zeros((16, 3), np.float32)}, ValueError, ["'y'", "shape"]),
        "is the input": ({"y": GOOD_X}, ValueError, ["'y'", "input 'x'"]),
        "is a param": ({"e": p["table"][:3]}, ValueError, ["'e'", "param 'table'"]),
        "outs overlap": ({"y": buf[:48].reshape(3, 16), "e": buf[40:88].reshape(3, 16)}, ValueError,
                         ["shares memory with out"]),
    }


@pytest.mark.parametrize("case", list(_bad_outs(small_params())))
def test_bad_out_raises_and_plan_stays_usable(device, case):
    plan, p = small_plan(device)
    out, exc, words = _bad_outs(p)[case]
    if case == "read-only":
        out["y"].flags.writeable = False
    with pytest.raises(exc) as info:
        plan.run({"x": GOOD_X, "ids": GOOD_IDS}, out=out)
    for w in words:
        assert w in str(info.value), str(info.value)
    check_small(plan, p)
    y = np.zeros((3, 16), np.float32)
    assert plan.run({"x": GOOD_X, "ids": GOOD_IDS}, out={"y": y})[0] is y


BAD_PARAMS = {
    "unknown name": ("nope", np.zeros(16, np.float32), ["'nope'"]),
    "wrong dtype": ("n", np.zeros(16, np.float64), ["'n'", "f32", "float64"]),
    "wrong dtype int": ("w", np.zeros((16, 16), np.int32), ["'w'", "int32"]),
    "wrong shape": ("n", np.zeros(15, np.float32), ["n"]),
    "wrong rank": ("w", np.zeros(256, np.float32), ["w"]),
    "5-d": ("w", np.zeros((1, 1, 1, 16, 16), np.float32), ["'w'"]),
}


@pytest.mark.parametrize("case", list(BAD_PARAMS))
def test_bad_set_param_raises_and_plan_stays_usable(device, case):
    plan, p = small_plan(device)
    name, arr, words = BAD_PARAMS[case]
    with pytest.raises(ValueError) as info:
        plan.set_param(name, arr)
    for w in words:
        assert w in str(info.value), str(info.value)
    check_small(plan, p)  # the previous binding is intact


def test_run_before_params_bound_raises(device):
    plan = rlx.compile(small_graph(), device=device)
    with pytest.raises((ValueError, rlx.Error)):
        plan.run({"x": GOOD_X, "ids": GOOD_IDS})
    p = small_params()
    for name, arr in p.items():
        plan.set_param(name, arr)
    check_small(plan, p)


def test_error_class_and_plan_type():
    assert issubclass(rlx.Error, RuntimeError)
    assert rlx.Error is rlx._C.Error
    with pytest.raises(TypeError):
        rlx.Plan()
    plan, _ = small_plan("cpu")
    assert isinstance(plan, rlx.Plan)
    assert plan.inputs == ("x", "ids")
    assert set(plan.params) == {"w", "n", "table"}
    assert plan.outputs == ("y", "e")
    assert plan.device == "cpu"
    assert "cpu" in repr(plan)


# ---------------------------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------------------------

def heavy_plan(n, layers):
    """x (n, n) through `layers` matmuls by a scaled orthogonal-ish matrix: seconds of BLAS work
    in one run() call."""
    g = rlx.Graph()
    h = g.input("x", (n, n))
    w = g.param("w", (n, n))
    for _ in range(layers):
        h = g.matmul(h, w)
    g.output(h, "y")
    plan = rlx.compile(g, device="cpu")
    plan.set_param("w", (np.eye(n, dtype=np.float32) * 0.999))
    return plan


def test_gil_released_during_run():
    n = 512
    x = np.ones((n, n), np.float32)
    old_threads = rlx.get_num_threads()
    rlx.set_num_threads(1)  # keep a core free for the counting thread
    try:
        layers = 4
        while True:  # calibrate: one run() call of at least ~0.3 s
            plan = heavy_plan(n, layers)
            t0 = time.perf_counter()
            plan.run({"x": x})
            took = time.perf_counter() - t0
            if took >= 0.3 or layers >= 4096:
                break
            layers = int(layers * min(8.0, 0.5 / max(took, 1e-3))) + 1

        count = [0]
        stop = threading.Event()

        def counter():
            while not stop.is_set():
                count[0] += 1

        # the counter's rate with the main thread idle (sleeping releases the GIL)
        th = threading.Thread(target=counter)
        th.start()
        time.sleep(0.05)
        c0 = count[0]
        time.sleep(0.2)
        rate = (count[0] - c0) / 0.2

        c0 = count[0]
        t0 = time.perf_counter()
        (y,) = plan.run({"x": x})
        took = time.perf_counter() - t0
        advanced = count[0] - c0
        stop.set()
        th.join()
    finally:
        rlx.set_num_threads(old_threads)
    np.testing.assert_allclose(y, np.full((n, n), 0.999 ** layers, np.float32), rtol=1e-3)
    assert took >= 0.2, took
    print(f"GIL test: run {took:.2f} s, counter {advanced} (idle rate {rate:.0f}/s)")
    # Holding the GIL would allow at most a couple of 5 ms switch intervals of counting.
    assert advanced > 0.25 * rate * took, (advanced, rate, took)


def _worker(plan, p, seed, iters, errors):
    try:
        for i in range(iters):
            check_small(plan, p, seq=1 + (seed + i) % 7, seed=seed * 1000 + i)
    except Exception as e:  # reported by the main thread
        errors.append(e)


def test_two_threads_two_plans(device):
    plans = [small_plan(device, seed=s) for s in (1, 2)]
    errors = []
    threads = [threading.Thread(target=_worker, args=(pl, p, k, 200, errors)) for k, (pl, p) in enumerate(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_threads_sharing_one_plan(device):
    plan, p = small_plan(device)
    errors = []
    threads = [threading.Thread(target=_worker, args=(plan, p, k, 200, errors)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_threads_sharing_one_plan_with_set_param():
    """set_param from one thread while others run: each run sees either binding, never garbage."""
    g = rlx.Graph()
    g.output(g.matmul(g.input("x", (2, 8)), g.param("w", (8, 8))), "y")
    plan = rlx.compile(g, device="cpu")
    eye = np.eye(8, dtype=np.float32)
    plan.set_param("w", eye)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    errors = []
    stop = threading.Event()

    def runner():
        try:
            while not stop.is_set():
                (y,) = plan.run({"x": x})
                if not (np.array_equal(y, x) or np.array_equal(y, 2 * x)):
                    errors.append(y)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=runner) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(300):
        plan.set_param("w", eye * (1 + i % 2))
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_compile_from_threads(device):
    errors = []

    def job(seed):
        try:
            for i in range(20):
                plan, p = small_plan(device, seed=seed + i)
                check_small(plan, p, seed=i)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=job, args=(k * 100,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---------------------------------------------------------------------------------------------
# leaks
# ---------------------------------------------------------------------------------------------

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ASan keeps freed memory in a quarantine (hundreds of MB), so RSS says nothing under it.
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""), reason="RSS is meaningless under ASan")
def test_no_leak_over_1000_compile_run_cycles(device):
    p = small_params()
    r = np.random.default_rng(0)
    x = randn(r, 5, 16)
    ids = np.array([1, 2, 3, 4, 5], np.int32)

    def cycle():
        g = small_graph()
        plan = rlx.compile(g, device=device)
        for name, arr in p.items():
            plan.set_param(name, arr)
        plan.run({"x": x, "ids": ids})
        try:  # the error paths must not leak either
            plan.run({"x": x.astype(np.float64), "ids": ids})
        except ValueError:
            pass
        try:
            plan.run({"x": x, "ids": ids[:2]})
        except ValueError:
            pass
        g.dump()
        plan.graph_dump()

    for _ in range(100):
        cycle()
    gc.collect()
    before = rss_bytes()
    for _ in range(1000):
        cycle()
    gc.collect()
    grown = rss_bytes() - before
    assert grown < 10 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB"


# ---------------------------------------------------------------------------------------------
# module functions
# ---------------------------------------------------------------------------------------------

def test_build_info():
    info = rlx.build_info()
    for key in ("blas", "cc", "cflags", "isa", "backends", "num_threads"):
        assert key in info, key
    assert isinstance(info["num_threads"], int) and info["num_threads"] >= 1
    assert "cpu" in info["backends"] and "ref" in info["backends"]
    assert "openblas" in info["blas"].lower()
    assert set(rlx._C.backends()) >= {"cpu", "ref"}
    assert rlx.__version__ == "0.1.0"


ISA_ORDER = ["x86-64", "avx2", "avx512f", "avx512f+bf16", "avx512f+bf16+amx"]  # build_info()["isa"], lowest first


def isa_in_child(cap):
    env = {k: v for k, v in os.environ.items() if k != "RLX_CPU_ISA"}
    if cap is not None:
        env["RLX_CPU_ISA"] = cap
    return subprocess.run([sys.executable, "-c", "import rlx; print(rlx.build_info()['isa'])"], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("cap", ["scalar", "avx2", "avx512", "avx512bf16"])
def test_cpu_isa_cap_from_the_environment_lowers_the_choice(cap):
    """RLX_CPU_ISA gives min(what cpuid offers, the cap): avx512 is AVX-512 without its BF16 dot
    products, avx512bf16 without AMX."""
    native = isa_in_child(None)
    capped = isa_in_child(cap)
    assert native.returncode == 0 and capped.returncode == 0, native.stderr + capped.stderr
    want = min(ISA_ORDER.index(native.stdout.strip()), ["scalar", "avx2", "avx512", "avx512bf16"].index(cap))
    assert capped.stdout.strip() == ISA_ORDER[want]


def test_unknown_cpu_isa_cap_is_refused_at_import():
    """The core would ignore a value it does not know (a typo that silently caps nothing)."""
    r = isa_in_child("avx512_bf16")
    assert r.returncode != 0
    assert "RLX_CPU_ISA='avx512_bf16' is not one of scalar, avx2, avx512, avx512bf16" in r.stderr


def test_set_num_threads_round_trip():
    old = rlx.get_num_threads()
    try:
        rlx.set_num_threads(1)
        assert rlx.get_num_threads() == 1
        assert rlx.build_info()["num_threads"] == 1
        rlx.set_num_threads(2)
        assert rlx.get_num_threads() == 2
        plan, p = small_plan("cpu")
        check_small(plan, p)
        rlx.set_num_threads(0)  # the default
        assert rlx.get_num_threads() >= 1
        with pytest.raises(TypeError):
            rlx.set_num_threads("2")
        with pytest.raises((ValueError, OverflowError)):
            rlx.set_num_threads(1 << 40)
    finally:
        rlx.set_num_threads(old)
    assert rlx.get_num_threads() == old
