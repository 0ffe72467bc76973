"""Fuzz target config_file: rlx.load_config on a fuzzed model directory.

Input: a flags byte, then config.json's bytes and generation_config.json's bytes (split at
fuzz_common.SEP). Flags: bit 0 passes the path of config.json instead of the directory; bit 1
writes generation_config.json; bit 2 makes config.json a directory instead of a file.

Acceptable outcomes: a config, or rlx.ConfigError, or FileNotFoundError. A returned config must
keep every promise of rlx/config.py's module note (sizes in range, float32-safe floats, token ids
inside the vocabulary), and the code sized by it must run quickly on it: expected_weights, the
generator's conversion to the C config, the RoPE frequencies (finite). Anything else is a finding.

    python tests/fuzz/config_file.py [libFuzzer flags] [corpus dirs]    # tools/run_fuzz.sh runs it
"""

from __future__ import annotations

import os

import numpy as np
from fuzz_common import fresh_dir, main, split


def check_config(cfg) -> None:
    from rlx.config import FLOAT32_MAX, FLOAT32_TINY, MAX_DIM, MAX_LAYERS, MAX_PARAMETERS
    from rlx.generator import _c_config
    from rlx.weights import expected_weights

    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "max_position_embeddings"):
        v = getattr(cfg, name)
        assert type(v) is int and 1 <= v <= MAX_DIM, (name, v)
    assert type(cfg.num_hidden_layers) is int and 1 <= cfg.num_hidden_layers <= MAX_LAYERS
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0 and cfg.head_dim % 2 == 0
    assert cfg.num_attention_heads * cfg.head_dim <= MAX_DIM and cfg.vocab_size * cfg.hidden_size <= MAX_PARAMETERS
    assert FLOAT32_TINY <= cfg.rms_norm_eps <= 1.0 and 1.0 < cfg.rope_theta <= FLOAT32_MAX
    assert np.isfinite(np.float32(cfg.rms_norm_eps)) and np.float32(cfg.rms_norm_eps) > 0
    assert cfg.bos_token_id is None or 0 <= cfg.bos_token_id < cfg.vocab_size
    assert isinstance(cfg.eos_token_ids, tuple) and all(type(e) is int and 0 <= e < cfg.vocab_size
                                                        for e in cfg.eos_token_ids)
    with np.errstate(all="ignore"):
        inv = cfg.rope_inv_freq()
    assert inv.dtype == np.float32 and np.all(np.isfinite(inv)) and np.all(inv >= 0), inv
    assert len(expected_weights(cfg)) >= 3
    c = _c_config(cfg)
    assert len(c["layer_windows"]) == cfg.num_hidden_layers and all(w >= 0 for w in c["layer_windows"])


def test_one_input(data: bytes) -> None:
    from rlx.config import load_config
    from rlx.errors import ConfigError

    flags, rest = (data[0], data[1:]) if data else (0, b"")
    config, generation = split(rest, 2)
    d = fresh_dir()
    path = os.path.join(d, "config.json")
    if flags & 4:
        os.mkdir(path)
    else:
        with open(path, "wb") as f:
            f.write(config)
    if flags & 2:
        with open(os.path.join(d, "generation_config.json"), "wb") as f:
            f.write(generation)
    try:
        cfg = load_config(path if flags & 1 else d)
    except (ConfigError, FileNotFoundError):  # the acceptable failures; anything else is a finding
        return
    check_config(cfg)


if __name__ == "__main__":
    main(test_one_input, ["rlx.config", "rlx.weights", "rlx.generator"])
