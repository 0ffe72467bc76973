"""rlx.Generator against transformers (PyTorch CPU, float32) on every HF_CASES model, loaded by rlx
from the directory transformers wrote with save_pretrained.

Per case and device:
- prefill (prefill_get_last_logits) logits within 1e-4 max-abs of transformers' last position;
- 8 KV-cached decode steps (decode_get_logits with the greedy token), each within 1e-4 of
  transformers' logits for the same growing sequence (full recompute);
- 16 greedy tokens from `generate` (naive) and `generate_cached` both identical to
  transformers' `model.generate(do_sample=False, max_new_tokens=16)` (no early stop).

These run with an f32 KV cache (kv_dtype="f32"): transformers computes in float32, and the claim
here is that rlx computes the same function. The default f16 cache (and bf16) round K and V: that
costs accuracy, bounded and measured by test_kv_dtype_error_is_bounded below.

Every backend compiled in runs every case (Qwen3-MoE's included), except the slow scalar "ref"
device: a subset. The largest logit
difference per (case, device) is recorded and printed by the last test (run with -s to see it).
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_cases import HF_CASES, case_ids, hf_logits, torch

import rlx

TOL = 1e-4
N_PROMPT = 13
N_DECODE = 8
N_GREEDY = 16
REF_CASES = ["llama_gqa2_tied", "llama_rope_llama3", "qwen3_sliding", "qwen3moe_e8_k2_norm_dense"]

# every backend compiled in runs every case, except the slow scalar oracle "ref": a subset
PARAMS = [pytest.param(c, d, id=f"{c}-{d}") for d in rlx.backends() for c in (REF_CASES if d == "ref" else HF_CASES)]

# (case, device) -> largest |rlx - transformers| over prefill and the decode steps
MAX_DIFF: dict[tuple[str, str], float] = {}


def _hf_greedy(model, ids, n):
    x = torch.tensor([list(ids)], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, eos_token_id=None, pad_token_id=0, temperature=None, top_p=None,
                             top_k=None)
    new = out[0, len(ids):].tolist()
    assert len(new) == n
    return new


@pytest.mark.parametrize("hf_model,device", PARAMS, indirect=["hf_model"])
def test_generator_matches_transformers(hf_model, device, request):
    path, model = hf_model
    case = request.node.callspec.params["hf_model"]
    gen = rlx.Generator.from_pretrained(path, device=device, kv_dtype="f32")
    V = gen.config.vocab_size
    prompt = [int(t) for t in case_ids(model, N_PROMPT)]

    # prefill: last-position logits
    got = gen.prefill_get_last_logits(prompt)
    assert got.shape == (V,) and got.dtype == np.float32
    want = hf_logits(model, prompt)[-1]
    diffs = [float(np.abs(got - want).max())]
    assert diffs[-1] <= TOL, f"prefill: max |rlx - hf| = {diffs[-1]:.3g}"
    assert gen.kv_len == len(prompt)

    # 8 cached decode steps, each fed the greedy token of the previous logits
    seq = list(prompt)
    for step in range(N_DECODE):
        tok = int(np.argmax(got))
        seq.append(tok)
        got = gen.decode_get_logits(tok)
        want = hf_logits(model, seq)[-1]
        diffs.append(float(np.abs(got - want).max()))
        assert diffs[-1] <= TOL, f"decode step {step}: max |rlx - hf| = {diffs[-1]:.3g}"
        assert gen.tokens == seq and gen.kv_len == len(seq)
    MAX_DIFF[(case, device)] = max(diffs)

    # 16 greedy tokens: transformers' generate vs rlx naive and cached
    want_ids = _hf_greedy(model, prompt, N_GREEDY)
    gen.prefill(prompt)
    naive = gen.generate(N_GREEDY, rlx.SampleOpts.greedy())
    gen.prefill(prompt)
    cached = gen.generate_cached(N_GREEDY, rlx.SampleOpts.greedy())
    assert naive == want_ids, f"naive {naive} != transformers {want_ids}"
    assert cached == want_ids, f"cached {cached} != transformers {want_ids}"
    assert gen.tokens == prompt + want_ids
    assert gen.kv_len == len(prompt) + N_GREEDY - 1


# Unit roundoff of each KV dtype: a stored K or V value is its f32 value times (1 + e), |e| <= u.
UNIT_ROUNDOFF = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}
# The error model for a KV cache of dtype kv: each of the L layers rounds K and V with relative
# error <= u; to first order the attention output of a layer moves by <= u * max|v| * (1 + 2 *
# max|score|) (the rounded values, plus the softmax weights moving by <= 2 * max|score change|),
# and the rest of the network carries that to the logits. The budget allows each layer's rounding
# to move the logits by 8 u max|logits|: |logits(kv) - logits(f32)| <= 8 u L max|logits(f32)|.
# Measured on these cases (prefill + 8 teacher-forced steps): f16 0.28 to 1.01 u L max|logits|
# (2e-3 to 5e-3 absolute), bf16 0.33 to 1.79 (1e-2 to 7e-2).
KV_BUDGET = 8.0
KV_RATIO: dict[tuple[str, str], float] = {}


@pytest.mark.parametrize("kv", ["f16", "bf16"])
@pytest.mark.parametrize("hf_model", list(HF_CASES), indirect=True)
def test_kv_dtype_error_is_bounded(hf_model, kv, request):
    """f16 / bf16 KV caches against the f32 one on transformers' greedy sequence (teacher forced):
    logits within the budget above, and the same argmax wherever transformers' top-2 margin exceeds
    twice the observed difference (where no error within it could flip the choice)."""
    path, model = hf_model
    case = request.node.callspec.params["hf_model"]
    prompt = [int(t) for t in case_ids(model, N_PROMPT)]
    seq = prompt + _hf_greedy(model, prompt, N_DECODE)
    a = rlx.Generator.from_pretrained(path, kv_dtype="f32")
    b = rlx.Generator.from_pretrained(path, kv_dtype=kv)
    assert b.kv_dtype == kv and b.sequence.kv_dtype == kv
    la, lb = [a.prefill_get_last_logits(prompt)], [b.prefill_get_last_logits(prompt)]
    for tok in seq[len(prompt):]:
        la.append(a.decode_get_logits(tok))
        lb.append(b.decode_get_logits(tok))
    la, lb = np.stack(la), np.stack(lb)
    L, u = a.config.num_hidden_layers, UNIT_ROUNDOFF[kv]
    diff = float(np.abs(la - lb).max())
    scale = u * L * float(np.abs(la).max())
    KV_RATIO[(case, kv)] = diff / scale
    assert diff <= KV_BUDGET * scale, f"{kv}: max |logits - f32 logits| = {diff:.3g} > {KV_BUDGET} * {scale:.3g}"
    top2 = np.sort(la, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * diff
    assert np.array_equal(la.argmax(1)[clear], lb.argmax(1)[clear])
    # the cache really holds kv: half the bytes of an f32 one for the same positions
    assert b.kv_bytes * 2 == a.kv_bytes


def test_zz_summary():
    """Prints the largest logit difference per case (last in the file: runs after the others)."""
    if not MAX_DIFF:
        pytest.skip("no comparison ran")
    print("\nmax |rlx - transformers| over prefill + 8 decode steps:")
    for (case, device), d in sorted(MAX_DIFF.items()):
        print(f"  {case:22s} {device:4s} {d:.3g}")
    assert max(MAX_DIFF.values()) <= TOL
    if KV_RATIO:
        print("max |logits(kv) - logits(f32 kv)| / (u L max|logits|):")
        for (case, kv), r in sorted(KV_RATIO.items()):
            print(f"  {case:22s} {kv:4s} {r:.2f}")
