"""The graph builder and the compile passes, seen from Python.

- shape inference: bad shapes are ValueErrors raised by the call that adds the node, naming the
  node, its op and the shapes; symbolic dims are inferred and printed;
- fusion changes nothing observable (fuse=False == fuse=True on a transformer-like block) and
  does happen (the fused ops show up in the compiled graph);
- the memory plan reuses buffers (planned bytes well under the sum of all intermediates);
- the builder rejects unknown ops, attributes, dtypes, node ids and symbols.
"""

import numpy as np
import pytest

import rlx
from rlx.graph import parse_dim
from rlx.reference import ops as ref


def randn(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# shape errors
# ---------------------------------------------------------------------------------------------

def _bad_matmul(g):
    return g.matmul(g.input("a", (3, 4)), g.input("b", (5, 6)))


def _bad_add(g):
    return g.add(g.input("a", (3, 4)), g.input("b", (3,)))


def _bad_rmsnorm(g):
    return g.rmsnorm(g.input("a", (3, 4)), g.param("w", (5,)))


def _bad_concat(g):
    return g.concat(g.input("a", (3, 4)), g.input("b", (3, 5)), axis=0)


def _bad_reshape(g):
    return g.reshape(g.input("a", (3, 4)), (5, 2))


def _bad_attention(g):
    return g.attention(g.input("q", (2, 3, 4)), g.input("k", (2, 2, 4)), g.input("v", (2, 2, 4)))


def _bad_rope(g):
    return g.rope(g.input("x", (2, 3, 8)), g.input("pos", (2,), "i32"), g.param("f", (3,)))


def _bad_embedding_ids_dtype(g):
    return g.embedding(g.param("t", (10, 4)), g.input("ids", (3,)))


def _bad_slice(g):
    return g.slice(g.input("x", (3, 4)), 1, 2, 5)


def _bad_symbolic_add(g):
    return g.add(g.input("a", ("SEQ", 4)), g.input("b", ("PAST", 4)))


SHAPE_ERRORS = {
    "matmul": (_bad_matmul, ["(3, 4)", "(5, 6)"]),
    "add": (_bad_add, ["(3, 4)", "(3)"]),
    "rmsnorm": (_bad_rmsnorm, ["(3, 4)", "(5)"]),
    "concat": (_bad_concat, ["(3, 4)", "(3, 5)"]),
    "reshape": (_bad_reshape, ["(3, 4)"]),
    "attention": (_bad_attention, ["(2, 3, 4)", "(2, 2, 4)"]),
    "rope": (_bad_rope, ["(2, 3, 8)", "(3)"]),
    "embedding": (_bad_embedding_ids_dtype, ["(10, 4)", "(3)"]),
    "slice": (_bad_slice, ["(3, 4)"]),
    "add ": (_bad_symbolic_add, ["(SEQ, 4)", "(PAST, 4)"]),
}


@pytest.mark.parametrize("op", list(SHAPE_ERRORS))
def test_shape_error_names_node_op_and_shapes(op):
    build, shapes = SHAPE_ERRORS[op]
    g = rlx.Graph()
    n_before = g.node_count
    with pytest.raises(ValueError) as info:
        build(g)
    msg = str(info.value)
    bad_id = g.node_count  # the rejected node would have taken the next id
    assert op.strip() in msg, msg
    assert f"node {bad_id}" in msg, msg
    for s in shapes:
        assert s in msg, msg
    assert g.node_count > n_before  # the leaves were added; the bad node was not
    g.output(g.silu(rlx.Value(g, 0)), "ok")  # the builder is still usable


def test_shape_error_is_not_added():
    g = rlx.Graph()
    a = g.input("a", (3, 4))
    b = g.input("b", (5, 6))
    with pytest.raises(ValueError):
        g.matmul(a, b)
    assert g.node_count == 2


# ---------------------------------------------------------------------------------------------
# symbolic shapes and Value
# ---------------------------------------------------------------------------------------------

def test_symbolic_shape_inference():
    g = rlx.Graph()
    past = g.input("past", ("PAST", 2, 8))
    new = g.input("new", ("SEQ", 2, 8))
    kv = g.concat(past, new, axis=0)
    assert set(kv.shape[0].split("+")) == {"SEQ", "PAST"}
    assert kv.shape[1:] == (2, 8)
    flat = g.reshape(new, ("SEQ", 16))
    assert flat.shape == ("SEQ", 16)
    doubled = g.concat(new, new, axis=0)
    assert doubled.shape[0] == "2*SEQ"
    last = g.gather_last(new)
    assert last.shape == (1, 2, 8)
    assert last.dtype == "f32"
    assert new.name == "new" and new.op == "input"
    assert "concat" in repr(kv) and "f32" in repr(kv)


def test_user_symbol_and_parse_dim():
    assert parse_dim(64) == 64
    assert parse_dim("64") == 64
    assert parse_dim("SEQ") == (0, [("SEQ", 1)])
    assert parse_dim("PAST + SEQ") == (0, [("PAST", 1), ("SEQ", 1)])
    assert parse_dim("2*SEQ+1") == (1, [("SEQ", 2)])
    assert parse_dim("SEQ+SEQ") == (0, [("SEQ", 2)])
    for bad in ["", "SEQ*2", "2*", "+", "a-b", "2**SEQ", "1SEQ"]:
        with pytest.raises(ValueError):
            parse_dim(bad)
    with pytest.raises(TypeError):
        parse_dim(2.0)
    g = rlx.Graph()
    assert g.symbol("SEQ") == 1 and g.symbol("PAST") == 2 and g.symbol("BATCH") == 0
    tok = g.symbol("TOK")
    assert tok >= 3 and g.symbol("TOK") == tok
    x = g.input("x", ("3*TOK+2", 4))
    assert x.shape == ("3*TOK+2", 4)


def test_user_symbol_bound_at_run(device):
    g = rlx.Graph()
    x = g.input("x", ("2*TOK", 4))
    g.output(g.reshape(x, ("TOK", 8)), "y")
    plan = rlx.compile(g, device=device)
    for tok in (1, 3):
        a = np.arange(tok * 8, dtype=np.float32).reshape(2 * tok, 4)
        (y,) = plan.run({"x": a})
        np.testing.assert_array_equal(y, a.reshape(tok, 8))


# ---------------------------------------------------------------------------------------------
# fusion
# ---------------------------------------------------------------------------------------------

def block_graph(d=32, ff=48, layers=2, params_first=True):
    """A transformer-like MLP stack: rmsnorm -> gate/up -> silu*mul -> down -> residual add ->
    the next rmsnorm (so both fusions apply), with the residual stream as an extra output.
    params_first declares every weight before the first op (as the model builder does);
    otherwise each weight is declared where it is first used."""
    g = rlx.Graph()
    x = g.input("x", ("SEQ", d))
    shapes = {"final_norm": (d,)}
    for i in range(layers):
        shapes.update({f"norm{i}": (d,), f"gate{i}": (ff, d), f"up{i}": (ff, d), f"down{i}": (d, ff)})
    declared = {}

    def param(name):
        if name not in declared:
            declared[name] = g.param(name, shapes[name])
        return declared[name]

    if params_first:
        for name in shapes:
            param(name)
    h = x
    for i in range(layers):
        n = g.rmsnorm(h, param(f"norm{i}"), eps=1e-5)
        gate = g.matmul(n, param(f"gate{i}"), transpose_b=True)
        up = g.matmul(n, param(f"up{i}"), transpose_b=True)
        act = g.mul(g.silu(gate), up)
        down = g.matmul(act, param(f"down{i}"), transpose_b=True)
        h = g.add(h, down)
    g.output(g.rmsnorm(h, param("final_norm"), eps=1e-5), "out")
    g.output(h, "residual")
    return g


def block_params(d=32, ff=48, layers=2, seed=0):
    r = np.random.default_rng(seed)
    p = {"final_norm": randn(r, d)}
    for i in range(layers):
        p[f"norm{i}"] = randn(r, d)
        p[f"gate{i}"] = randn(r, ff, d) * 0.2
        p[f"up{i}"] = randn(r, ff, d) * 0.2
        p[f"down{i}"] = randn(r, d, ff) * 0.2
    return p


def block_reference(x, p, layers=2):
    h = x
    for i in range(layers):
        n = ref.rmsnorm(h, p[f"norm{i}"], 1e-5)
        act = ref.silu_mul(ref.matmul(n, p[f"gate{i}"], True), ref.matmul(n, p[f"up{i}"], True))
        h = ref.add(h, ref.matmul(act, p[f"down{i}"], True))
    return ref.rmsnorm(h, p["final_norm"], 1e-5), h


@pytest.mark.parametrize("seq", [1, 7])
@pytest.mark.parametrize("params_first", [True, False])
def test_fused_equals_unfused(device, seq, params_first):
    g = block_graph(params_first=params_first)
    p = block_params()
    x = randn(np.random.default_rng(seq), seq, 32)
    outs = {}
    for fuse in (False, True):
        plan = rlx.compile(g, device=device, fuse=fuse)
        for name, arr in p.items():
            plan.set_param(name, arr)
        outs[fuse] = plan.run({"x": x})
        dump = plan.graph_dump()
        if fuse:
            assert "silu_mul" in dump, dump
            if params_first:
                assert "add_rmsnorm" in dump, dump
        else:
            assert "silu_mul" not in dump and "add_rmsnorm" not in dump, dump
    for a, b in zip(outs[False], outs[True]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    expected = block_reference(x, p)
    for out, e in zip(outs[True], expected):
        np.testing.assert_allclose(out, e, rtol=1e-4, atol=1e-4)


def test_fusion_keeps_values_used_elsewhere(device):
    """silu(gate) also being an output must not be lost by fusing silu*mul."""
    g = rlx.Graph()
    a, b = g.input("a", (4, 8)), g.input("b", (4, 8))
    s = g.silu(a)
    g.output(g.mul(s, b), "prod")
    g.output(s, "silu")
    r = np.random.default_rng(3)
    xa, xb = randn(r, 4, 8), randn(r, 4, 8)
    prod, s_out = rlx.compile(g, device=device).run({"a": xa, "b": xb})
    np.testing.assert_allclose(prod, ref.silu_mul(xa, xb), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s_out, ref.silu(xa), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# memory plan
# ---------------------------------------------------------------------------------------------

def test_memory_plan_reuses_buffers(device):
    d = 64
    g = rlx.Graph()
    h = g.input("x", ("SEQ", d))
    w = g.param("w", (d, d))
    for _ in range(10):
        h = g.rmsnorm(g.silu(g.matmul(h, w)), g.param(f"n{_}", (d,)))
    g.output(h, "y")
    plan = rlx.compile(g, device=device)
    r = np.random.default_rng(0)
    wv = randn(r, d, d) * 0.1
    plan.set_param("w", wv)
    for i in range(10):
        plan.set_param(f"n{i}", np.ones(d, np.float32))
    x = randn(r, 16, d)
    (y,) = plan.run({"x": x})
    expected = x
    for _ in range(10):
        expected = ref.rmsnorm(ref.silu(ref.matmul(expected, wv)), np.ones(d, np.float32), 1e-6)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    planned, unshared = plan.planned_bytes, plan.unshared_bytes
    # every intermediate counted, but each silu writes over its matmul's output (in place)
    assert unshared >= 19 * 16 * d * 4
    assert 0 < planned <= unshared // 4, (planned, unshared)


def test_swiglu_runs_in_place_and_a_live_input_is_never_overwritten(device):
    """silu(gate) * up writes over gate (over up, were gate read again later): the MLP's arena holds
    two (S, F) values, not three. An input still read after a pointwise op keeps its bytes."""
    S, d, F = 16, 32, 256
    g = rlx.Graph()
    x = g.input("x", ("SEQ", d))
    wg, wu, wd = g.param("wg", (F, d)), g.param("wu", (F, d)), g.param("wd", (d, F))
    gate, up = g.matmul(x, wg, transpose_b=True), g.matmul(x, wu, transpose_b=True)
    y = g.matmul(g.mul(g.silu(gate), up), wd, transpose_b=True)
    s = g.silu(y)  # y is read again below: not in place over y
    z = g.add(g.mul(s, y), y)  # mul may take s's bytes; add those of the product, not y's
    g.output(z, "z")
    plan = rlx.compile(g, device=device)
    r = np.random.default_rng(5)
    params = {"wg": randn(r, F, d) * 0.2, "wu": randn(r, F, d) * 0.2, "wd": randn(r, d, F) * 0.1}
    for k, v in params.items():
        plan.set_param(k, v)
    xv = randn(r, S, d)
    (zv,) = plan.run({"x": xv})
    m = ref.silu_mul(xv @ params["wg"].T, xv @ params["wu"].T) @ params["wd"].T
    np.testing.assert_allclose(zv, ref.silu(m) * m + m, rtol=1e-4, atol=1e-5)
    # gate, up and their product: two (S, F) blocks; the (S, d) values fit beside them
    assert plan.planned_bytes <= 2 * S * F * 4 + 4 * S * d * 4, plan.planned_bytes


def test_planned_bytes_before_run_with_caps():
    g = rlx.Graph()
    x = g.input("x", ("SEQ", 32))
    g.output(g.silu(g.silu(x)), "y")
    plan = rlx.compile(g, caps={"SEQ": 128})
    assert plan.planned_bytes >= 128 * 32 * 4
    with pytest.raises(ValueError, match="NOPE"):
        rlx.compile(g, caps={"NOPE": 4})
    with pytest.raises(ValueError):
        rlx.compile(g, caps={"SEQ": -1})


# ---------------------------------------------------------------------------------------------
# dump and builder errors
# ---------------------------------------------------------------------------------------------

def test_dump_contains_ops_and_names():
    g = block_graph(layers=1)
    text = g.dump()
    for word in ("input", "param", "rmsnorm", "matmul", "silu", "mul", "add", "'x'", "'gate0'", "out", "residual"):
        assert word in text, word
    assert "SEQ" in text
    plan = rlx.compile(g)
    assert "matmul" in plan.graph_dump()


def test_unknown_op_is_value_error():
    g = rlx.Graph()
    x = g.input("x", (2, 2))
    with pytest.raises(ValueError, match="gelu"):
        g._g.op("gelu", [x.id])


def test_unknown_attr_is_value_error_naming_it():
    g = rlx.Graph()
    x = g.input("x", (2, 2))
    with pytest.raises(ValueError, match="transpose"):
        g._g.op("matmul", [x.id, x.id], {"transpose": True})
    with pytest.raises(TypeError):
        g._g.op("matmul", [x.id, x.id], {1: True})
    with pytest.raises(TypeError):
        g._g.op("matmul", [x.id, x.id], [("trans_b", True)])


@pytest.mark.parametrize("bad", [
    lambda g: g.input("y", (2,), "f64"),
    lambda g: g.input("x", (2,)),              # duplicate name
    lambda g: g.input("y", (0,)),
    lambda g: g.input("y", (-3,)),
    lambda g: g.input("y", (1, 2, 3, 4, 5)),   # too many dims
    lambda g: g.input("y", (1 << 70,)),
    lambda g: g._g.op("silu", [99]),
    lambda g: g._g.op("silu", [-1]),
    lambda g: g._g.op("add", [0]),             # arity
    lambda g: g._g.op("add", [0] * 7),
    lambda g: g._g.op("input", []),
    lambda g: g._g.op("add_rmsnorm", [0, 0, 0]),
    lambda g: g._g.info(1234),
    lambda g: g.output(rlx.Value(g, 55), "z"),
    lambda g: g.attention(rlx.Value(g, 0), rlx.Value(g, 0), rlx.Value(g, 0)),  # rank 2, not (S, H, D)
    lambda g: g._g.op("state", []),            # internal ops: made by the decoder builder only
    lambda g: g._g.op("cache_write", [0, 0, 0]),
    lambda g: g.convert(rlx.Value(g, 0), "i32"),
    lambda g: g.convert(rlx.Value(g, 0), "nope"),
])
def test_builder_rejects_bad_arguments(bad):
    g = rlx.Graph()
    g.input("x", (2, 2))
    with pytest.raises(ValueError):
        bad(g)
    assert g.node_count == 1


def test_builder_type_errors():
    g = rlx.Graph()
    x = g.input("x", (2, 2))
    with pytest.raises(TypeError):
        g.input("y", 5)
    with pytest.raises(TypeError):
        g._g.input("y", "f32", [2.5])
    with pytest.raises(TypeError):
        g._g.input("y", "f32", [(0, [("SEQ",)])])
    with pytest.raises(TypeError):
        g._g.op("silu", ["0"])
    with pytest.raises(TypeError):
        g.silu(x.id)
    other = rlx.Graph()
    with pytest.raises(ValueError):
        other.silu(x)
    with pytest.raises(TypeError):
        rlx.compile("not a graph")


def test_compile_errors():
    g = rlx.Graph()
    x = g.input("x", (2, 2))
    with pytest.raises(ValueError):
        rlx.compile(g)  # no outputs
    g.output(g.silu(x), "y")
    with pytest.raises((ValueError, rlx.Error)):
        rlx.compile(g, device="tpu")
    with pytest.raises(TypeError):
        rlx.compile(g, caps=[("SEQ", 4)])


def test_compile_does_not_modify_graph():
    g = rlx.Graph()
    x = g.input("x", (2, 4))
    g.output(g.mul(g.silu(x), x), "y")
    before = g.dump()
    rlx.compile(g, fuse=True)
    assert g.dump() == before
    g.output(g.silu(x), "z")  # still extendable
    assert rlx.compile(g).outputs == ("y", "z")
