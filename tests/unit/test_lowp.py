"""Low-precision weights (bf16, f16): the matmul and embedding ops against NumPy / ml_dtypes
references on both backends, and whole models computed from bf16 / f16 weights against the same
model in f32 (within the dtype's tolerance), with KV-cached == naive kept exact in every dtype."""

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import rlx
from rlx.reference import ops as ref

LOWP = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K" / "hf"


def matmul_plan(device, dtype, M, K, N):
    g = rlx.Graph()
    x = g.input("x", ("SEQ", K))
    w = g.param("w", (N, K), dtype=dtype)
    g.output(g.matmul(x, w, transpose_b=True), "y")
    return rlx.compile(g, device=device)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("M,K,N", [(1, 64, 33), (3, 77, 5), (4, 1024, 130), (5, 300, 31), (17, 129, 64),
                                   (64, 1000, 33)])
def test_matmul_lowp_matches_reference(device, dtype, M, K, N):
    rng = np.random.default_rng(M * 1000 + K + N)
    a = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.1).astype(LOWP[dtype])
    plan = matmul_plan(device, dtype, M, K, N)
    plan.set_param("w", w)
    (y,) = plan.run({"x": a})
    want = ref.matmul_lowp(a, w)
    scale = np.abs(a).astype(np.float64) @ np.abs(w.astype(np.float64)).T  # sum |a||w| per output
    assert np.all(np.abs(y - want) <= 1e-5 * scale + 1e-6), np.max(np.abs(y - want) / (scale + 1e-30))


def test_matmul_bf16_rounds_activations_on_every_path(device):
    # an activation that bf16 cannot hold: 1 + 2^-10 rounds to 1; the result must show it on the
    # decode path (M <= 4) and the prefill path (M > 4) alike
    K, N = 32, 16
    w = np.ones((N, K), ml_dtypes.bfloat16)
    plan = matmul_plan(device, "bf16", 8, K, N)
    plan.set_param("w", w)
    for M in (1, 8):
        a = np.full((M, K), 1 + 2.0 ** -10, np.float32)
        (y,) = plan.run({"x": a})
        np.testing.assert_array_equal(y, np.full((M, N), K, np.float32))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_embedding_lowp_is_exact(device, dtype):
    table = np.array([[0.0, -0.0, np.inf, -np.inf], [1e-6, -3.5, 65504.0, 2.0 ** -24],
                      [1.0, 2.0, 3.0, 4.0]], np.float32).astype(LOWP[dtype])
    g = rlx.Graph()
    t = g.param("t", (3, 4), dtype=dtype)
    ids = g.input("ids", ("SEQ",), dtype="i32")
    g.output(g.embedding(t, ids), "e")
    plan = rlx.compile(g, device=device)
    plan.set_param("t", table)
    (e,) = plan.run({"ids": np.array([2, 0, 1, 1], np.int32)})
    want = table.astype(np.float32)[[2, 0, 1, 1]]
    np.testing.assert_array_equal(e, want)
    assert np.array_equal(np.signbit(e), np.signbit(want))


@pytest.mark.skipif(not STORIES.is_dir(), reason="../shared/models/stories260K is not here")
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_model_in_lowp_matches_f32_within_tolerance(dtype):
    exp = json.loads((STORIES.parent / "expected" / "greedy_once_upon_a_time.json").read_text())
    weights = rlx.load_weights(STORIES)
    f32 = rlx.Generator(rlx.load_config(STORIES), weights)
    low = rlx.Generator(rlx.load_config(STORIES), weights, dtype=dtype)
    assert f32.dtype == "f32" and low.dtype == dtype
    a = f32.prefill_get_last_logits(exp["prompt_tokens"])
    b = low.prefill_get_last_logits(exp["prompt_tokens"])
    tol = {"bf16": 2e-2, "f16": 2e-3}[dtype]  # relative to the logit range; bf16 keeps 8 bits
    assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(a)), np.max(np.abs(a - b))
    assert int(np.argmax(a)) == int(np.argmax(b)) == exp["new_tokens"][0]


@pytest.mark.skipif(not STORIES.is_dir(), reason="../shared/models/stories260K is not here")
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_lowp_cached_equals_naive(device, dtype):
    exp = json.loads((STORIES.parent / "expected" / "greedy_once_upon_a_time.json").read_text())
    gen = rlx.Generator.from_pretrained(STORIES, device=device, dtype=dtype)
    gen.prefill(exp["prompt_tokens"])
    naive = gen.generate(24)
    gen.prefill(exp["prompt_tokens"])
    cached = gen.generate_cached(24)
    assert naive == cached


@pytest.mark.skipif(not STORIES.is_dir(), reason="../shared/models/stories260K is not here")
def test_bf16_files_are_used_in_place(tmp_path):
    """A bf16 safetensors model is computed from its bf16 bytes: the generator picks bf16 and the
    arrays it holds are views of the file's map (no f32 copy)."""
    from safetensors.numpy import save_file

    weights = rlx.load_weights(STORIES)
    save_file({k: np.asarray(v).astype(ml_dtypes.bfloat16) for k, v in weights.items()},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((STORIES / "config.json").read_text())
    loaded = rlx.load_weights(tmp_path)
    emb = loaded["model.embed_tokens.weight"]
    assert emb.dtype == np.dtype(ml_dtypes.bfloat16) and not emb.flags.owndata
    gen = rlx.Generator(rlx.load_config(tmp_path), loaded)
    assert gen.dtype == "bf16"
    held = rlx.weights.check_weights(gen.config, loaded, dtype="bf16")
    assert held["model.embed_tokens.weight"] is emb  # the very array: zero-copy
    gen.prefill([1, 403, 407])
    assert 0 <= gen.step_cached() < gen.config.vocab_size
