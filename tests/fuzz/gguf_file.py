"""Fuzz target gguf_file: a fuzzed GGUF file through everything rlx.load does with one.

Input: the file's bytes. The target opens it (rlx.gguf.GGUFFile), builds its config, its weights
(zero-copy views, block types as rlx.Packed), its tokenizer and chat template, checks the weights
against the config and, when they fit and are small, runs a model from them on the "ref" device
(one prefill and one cached step: the C side reads every weight, packed blocks included).

Acceptable outcomes: success, or rlx.WeightsError / rlx.ConfigError (the file, its metadata or
its tensors refused, naming them), or ValueError from the core when a block holds a NaN or
infinite scale, or when no logit is finite (f32 weights may hold anything). Every tensor view must
lie inside the file's map with the bytes its type and shape need; a returned config must keep
rlx/config.py's promises (the config_file target's checks); a tokenizer must encode and decode.
Anything else is a finding.

    python tests/fuzz/gguf_file.py [libFuzzer flags] [corpus dirs]    # tools/run_fuzz.sh runs it
"""

from __future__ import annotations

import os

import numpy as np
from fuzz_common import fresh_dir, main

SMALL_MODEL_BYTES = 1 << 20  # run the model only when its weights are this small


def check_tensors(gf) -> None:
    """Every view inside the map, with the bytes gguf-py's table gives its type and shape; every
    block type one that rlx runs (the reader refuses the others)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from rlx import dtypes

    base = gf.buffer.ctypes.data
    for name, t in gf.tensors.items():
        a = t.data
        assert isinstance(a, np.ndarray), name
        start = a.ctypes.data - base
        assert 0 <= start and start + a.nbytes <= gf.buffer.nbytes, (name, start, a.nbytes)
        if t.quantized:
            assert t.type_name.lower() in dtypes.DTYPES, (name, t.type_name)
            bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[t.type_name]]
            want = int(np.prod(t.shape)) // bs * ts
            assert a.nbytes == want, (name, a.nbytes, want)


def test_one_input(data: bytes) -> None:
    import rlx
    from rlx import gguf
    from rlx.chat_template import ChatTemplate
    from rlx.errors import ConfigError, WeightsError
    from rlx.tokenizer import Tokenizer
    from rlx.weights import check_weights

    path = os.path.join(fresh_dir(), "model.gguf")
    with open(path, "wb") as f:
        f.write(data)
    try:
        gf = gguf.GGUFFile(path)
    except WeightsError:
        return
    check_tensors(gf)
    try:
        tok = Tokenizer.from_gguf(gf)
    except (ConfigError, WeightsError):
        tok = None
    if tok is not None:
        ids = tok.encode("hello world")
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
        assert isinstance(tok.decode(ids), str)
        try:
            ChatTemplate.from_gguf(gf, tok)
        except (ConfigError, ValueError):
            pass
    try:
        cfg = gguf.config_from_gguf(gf)
    except ConfigError:
        return
    from config_file import check_config

    check_config(cfg)
    try:
        weights = gguf.model_weights(gf)
        arrays = check_weights(cfg, weights)
    except WeightsError:
        return
    if sum(np.asarray(a[0] if isinstance(a, tuple) else a).nbytes for a in arrays.values()) > SMALL_MODEL_BYTES:
        return
    try:
        gen = rlx.Generator(cfg, weights, device="ref", kv_dtype="f32")
    except ValueError as e:
        assert "scale" in str(e), e
        return
    gen.prefill([0])
    try:
        tok_id = gen.step_cached()
    except ValueError as e:  # weights of huge or non-finite values: no logit to sample
        assert "logits is finite" in str(e), e
        return
    assert 0 <= tok_id < cfg.vocab_size


if __name__ == "__main__":
    main(test_one_input, ["rlx.gguf", "rlx.gguf_tokenizer", "rlx.chat_template", "rlx.weights", "rlx.config"])
