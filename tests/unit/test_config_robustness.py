"""rlx.config against hostile and careless configs: sizes that would exhaust memory, floats that
do not survive float32, token ids outside the vocabulary, and malformed files. Every one must be
an rlx.ConfigError naming the field (FileNotFoundError for a path that does not exist), raised
before anything is sized by the config. A hand list of cases, then property-based tests
(hypothesis) over mutated configs and raw bytes; tests/fuzz/config_file.py fuzzes the same
entry point coverage-guided."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx.config import (
    FLOAT32_MAX,
    FLOAT32_TINY,
    MAX_DIM,
    MAX_LAYERS,
    MAX_PARAMETERS,
    LlamaConfig,
    Qwen3Config,
    config_from_dict,
    load_config,
)
from rlx.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LLAMA = {"model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
QWEN3 = {"model_type": "qwen3", "vocab_size": 131, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "rms_norm_eps": 1e-6, "rope_theta": 1e6, "use_sliding_window": True, "sliding_window": 8}
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def write(tmp_path: Path, config, generation=None) -> Path:
    raw = config if isinstance(config, bytes) else json.dumps(config).encode()
    (tmp_path / "config.json").write_bytes(raw)
    if generation is not None:
        graw = generation if isinstance(generation, bytes) else json.dumps(generation).encode()
        (tmp_path / "generation_config.json").write_bytes(graw)
    return tmp_path


def refused(tmp_path: Path, config, *words, generation=None) -> str:
    """load_config's ConfigError message for this config.json; every word must appear in it."""
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, config, generation))
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    assert len(msg) < 1000, msg
    return msg


# -- 1. sizes: checked before anything is sized by them --------------------------------------------

def test_max_layers_is_the_c_cores_limit():
    header = (ROOT / "csrc/include/rlx/model.h").read_text()
    assert int(re.search(r"#define RLX_MAX_LAYERS\s+(\d+)", header).group(1)) == MAX_LAYERS


# Sizes the old code accepted quickly. Larger ones for Qwen3 made it build a layer_types tuple of
# that length: test_a_billion_layers_takes_no_memory covers those under an address-space cap.
@pytest.mark.parametrize("base, layers", [(LLAMA, MAX_LAYERS + 1), (LLAMA, 10**6), (LLAMA, 2**64), (LLAMA, 10**300),
                                          (QWEN3, MAX_LAYERS + 1), (QWEN3, 10**6)])
def test_layer_count_beyond_the_c_limit_is_refused(tmp_path, base, layers):
    refused(tmp_path, dict(base, num_hidden_layers=layers), "num_hidden_layers", "256")
    d = dict(base, num_hidden_layers=MAX_LAYERS)
    if base is QWEN3:
        d["max_window_layers"] = 4
    cfg = config_from_dict(d)
    assert cfg.num_hidden_layers == MAX_LAYERS and len(getattr(cfg, "layer_types", range(MAX_LAYERS))) == MAX_LAYERS


def test_a_billion_layers_takes_no_memory(tmp_path):
    """The original report: num_hidden_layers 1e9 (Qwen3 built a 1e9-entry layer_types; Llama's
    expected_weights and the generator's config looped over every layer). Run in a child process
    capped at 2 GiB of address space so that a regression fails instead of eating the machine
    (no cap under ASan, whose shadow memory needs terabytes of address space)."""
    import rlx

    write(tmp_path, dict(QWEN3, num_hidden_layers=10**9))
    asan = "asan" in os.environ.get("LD_PRELOAD", "")
    code = textwrap.dedent(f"""
        import resource
        if not {asan}:
            resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        import rlx
        from rlx.weights import expected_weights
        try:
            cfg = rlx.load_config({str(tmp_path)!r})
            expected_weights(cfg)
        except rlx.ConfigError as e:
            print("ConfigError", e)
        """)
    package_root = os.path.dirname(os.path.dirname(rlx.__file__))  # the rlx this test imported
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0 and "ConfigError" in r.stdout and "num_hidden_layers" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("change, words", [
    ({"vocab_size": 2**62}, ["vocab_size", str(MAX_DIM)]),
    ({"hidden_size": 2**31, "num_attention_heads": 1, "num_key_value_heads": 1}, ["hidden_size"]),
    ({"intermediate_size": 10**40}, ["intermediate_size"]),
    ({"max_position_embeddings": 2**31}, ["max_position_embeddings"]),
    ({"num_attention_heads": 2**40}, ["num_attention_heads"]),
    ({"head_dim": 2**32}, ["head_dim"]),
    ({"num_attention_heads": 2**16, "num_key_value_heads": 1, "head_dim": 2**16}, ["head_dim", "num_attention_heads"]),
    ({"vocab_size": MAX_DIM, "hidden_size": 2**20, "num_attention_heads": 2**14}, ["parameters", "2**40"]),
    ({"intermediate_size": MAX_DIM, "hidden_size": 2**16, "num_hidden_layers": 256}, ["parameters"]),
    ({"rope_scaling": dict(LLAMA3, original_max_position_embeddings=2**63)}, ["original_max_position_embeddings"]),
])
def test_sizes_beyond_what_the_core_can_hold(tmp_path, change, words):
    refused(tmp_path, dict(LLAMA, **change), *words)


@pytest.mark.parametrize("change, words", [
    ({"max_window_layers": 2**64}, ["max_window_layers"]),
    ({"sliding_window": 2**40}, ["sliding_window"]),
])
def test_qwen3_sizes(tmp_path, change, words):
    refused(tmp_path, dict(QWEN3, **change), *words)


def test_largest_real_configs_pass():
    # Llama 3.1 405B and Qwen3-32B sizes: under every limit
    config_from_dict(dict(LLAMA, vocab_size=128256, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                          num_attention_heads=128, num_key_value_heads=8, max_position_embeddings=131072,
                          bos_token_id=128000, eos_token_id=[128001, 128008, 128009]))
    config_from_dict(dict(QWEN3, vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                          num_attention_heads=64, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960))


def test_configs_are_frozen():
    """A validated config cannot be changed into an unvalidated one behind the validator's back."""
    cfg = config_from_dict(QWEN3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_hidden_layers = 10**9
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        dataclasses.replace(cfg, num_hidden_layers=10**9, layer_types=None)
    assert dataclasses.replace(cfg, num_hidden_layers=4, layer_types=None, max_window_layers=1).layer_types[3] == \
        "sliding_attention"


# -- 2. floats that must survive float32 -----------------------------------------------------------

@pytest.mark.parametrize("eps", [1e300, 1e39, 2.0, 1e-300, 1e-40, 0.0, -1e-5, 10**400,
                                 float("inf"), float("nan")])
def test_rms_norm_eps_must_be_a_normal_float32_up_to_1(tmp_path, eps):
    refused(tmp_path, dict(LLAMA, rms_norm_eps=eps), "rms_norm_eps", "[1.17549e-38, 1]")


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-12, FLOAT32_TINY, 1.0, 1])
def test_rms_norm_eps_accepted(eps):
    assert config_from_dict(dict(LLAMA, rms_norm_eps=eps)).rms_norm_eps == float(eps)


@pytest.mark.parametrize("theta", [1e300, 1e39, 10**400, 1.0, 0.5, -3.0, float("inf"), float("nan")])
def test_rope_theta_must_fit_float32_and_exceed_1(tmp_path, theta):
    refused(tmp_path, dict(LLAMA, rope_theta=theta), "rope_theta", "(1, 3.40282e+38]")
    v5 = {k: v for k, v in LLAMA.items() if k != "rope_theta"}
    refused(tmp_path, dict(v5, rope_parameters={"rope_type": "default", "rope_theta": theta}), "rope_theta")


@pytest.mark.parametrize("change, words", [
    ({"factor": 1e300}, ["rope_scaling.factor", "[1, 3.40282e+38]"]),
    ({"factor": 0.5}, ["rope_scaling.factor"]),
    ({"factor": 0.0}, ["rope_scaling.factor"]),
    ({"factor": float("nan")}, ["rope_scaling.factor"]),
    ({"factor": True}, ["rope_scaling.factor", "bool"]),
    ({"low_freq_factor": 1e-300}, ["rope_scaling.low_freq_factor", "normal float32"]),
    ({"high_freq_factor": 1e39}, ["rope_scaling.high_freq_factor"]),
    ({"low_freq_factor": 1.0, "high_freq_factor": 1.0 + 1e-9}, ["high_freq_factor", "float32"]),
    ({"original_max_position_embeddings": 0}, ["original_max_position_embeddings"]),
])
def test_llama3_scaling_must_fit_float32(tmp_path, change, words):
    refused(tmp_path, dict(LLAMA, rope_scaling=dict(LLAMA3, **change)), *words)


@settings(max_examples=300, deadline=None)
@given(theta=st.floats(1.0, FLOAT32_MAX, exclude_min=True),
       factor=st.floats(1.0, FLOAT32_MAX), low=st.floats(FLOAT32_TINY, FLOAT32_MAX),
       gap=st.floats(FLOAT32_TINY, FLOAT32_MAX), orig=st.integers(1, MAX_DIM),
       head_dim=st.sampled_from([2, 4, 16, 64, 128]), scaled=st.booleans())
def test_every_accepted_rope_gives_finite_frequencies(theta, factor, low, gap, orig, head_dim, scaled):
    """What validation accepts never turns into inf or NaN RoPE frequencies."""
    high = low + gap
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
               "original_max_position_embeddings": orig} if scaled else None
    try:
        cfg = LlamaConfig(97, 64, 96, 1, 4, head_dim=head_dim, rope_theta=theta, rope_scaling=scaling)
    except ConfigError:  # only a high_freq_factor beyond float32, or equal to low in float32
        with np.errstate(over="ignore"):
            assert scaled and (high > FLOAT32_MAX or not np.float32(high) > np.float32(low))
        return
    with np.errstate(all="ignore"):
        inv = cfg.rope_inv_freq()
    assert inv.shape == (head_dim // 2,) and np.all(np.isfinite(inv)) and np.all(inv >= 0) and np.all(inv <= 1)


# -- 3. token ids inside the vocabulary ------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"bos_token_id": 97}, ["bos_token_id", "97", "vocab_size = 97"]),
    ({"bos_token_id": 2**64}, ["bos_token_id"]),
    ({"eos_token_id": 97}, ["eos_token_id", "97"]),
    ({"eos_token_id": [2, 500]}, ["eos_token_id", "500"]),
    ({"eos_token_id": -1}, ["eos_token_id"]),
])
def test_token_ids_beyond_the_vocabulary(tmp_path, change, words):
    refused(tmp_path, dict(LLAMA, **change), *words)


def test_token_ids_from_generation_config_are_checked_too(tmp_path):
    refused(tmp_path, LLAMA, "eos_token_id", "1000", "generation_config.json", generation={"eos_token_id": [1, 1000]})
    refused(tmp_path, LLAMA, "bos_token_id", "generation_config.json", generation={"bos_token_id": 97})
    assert load_config(write(tmp_path, LLAMA, {"bos_token_id": 96, "eos_token_id": 0})).eos_token_ids == (0,)


def test_direct_construction_checks_token_ids():
    with pytest.raises(ConfigError, match="eos_token_id"):
        LlamaConfig(97, 64, 96, 2, 4, eos_token_ids=(5, 97))
    with pytest.raises(ConfigError, match="bos_token_id"):
        Qwen3Config(97, 64, 96, 2, 4, bos_token_id=1000)


# -- 4. malformed files: always ConfigError (or FileNotFoundError) ---------------------------------

DEEP = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HAND_LIST = {
    "not utf-8": b'{"model_type": "ll\xffama"}',
    "latin-1 text": json.dumps(dict(LLAMA, note="caf\u00e9"), ensure_ascii=False).encode("latin-1"),
    "utf-16": json.dumps(LLAMA).encode("utf-16"),
    "deeply nested": DEEP,
    "deeply nested object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "5000-digit int": b'{"model_type": "llama", "vocab_size": ' + b"9" * 5000 + b"}",
    "float layers": json.dumps(dict(LLAMA, num_hidden_layers=1e9)).encode(),
    "float vocab": json.dumps(dict(LLAMA, vocab_size=97.5)).encode(),
    "float eos": json.dumps(dict(LLAMA, eos_token_id=2.0)).encode(),
    "huge float theta": json.dumps(dict(LLAMA, rope_theta=1e308)).encode(),
    "huge int theta": json.dumps(dict(LLAMA, rope_theta=10**400)).encode(),
    "huge int eps": json.dumps(dict(LLAMA, rms_norm_eps=-10**400)).encode(),
    "huge int factor": json.dumps(dict(LLAMA, rope_scaling=dict(LLAMA3, factor=10**400))).encode(),
    "huge int everywhere": json.dumps({k: (10**300 if isinstance(v, int) else v) for k, v in LLAMA.items()}).encode(),
    "NaN eps": json.dumps(dict(LLAMA, rms_norm_eps=float("nan"))).encode(),
    "Infinity theta": json.dumps(dict(LLAMA, rope_theta=float("inf"))).encode(),
    "-Infinity layers": json.dumps(dict(LLAMA, num_hidden_layers=float("-inf"))).encode(),
    "NaN factor": json.dumps(dict(LLAMA, rope_scaling=dict(LLAMA3, factor=float("nan")))).encode(),
    "NaN partial_rotary_factor": json.dumps(dict(LLAMA, partial_rotary_factor=float("nan"))).encode(),
    "list model_type": json.dumps(dict(LLAMA, model_type=["llama"])).encode(),
    "dict model_type": json.dumps(dict(LLAMA, model_type={"llama": 1})).encode(),
    "list config": b"[1, 2, 3]",
    "string config": b'"llama"',
    "null config": b"null",
    "empty file": b"",
    "list rope_scaling": json.dumps(dict(LLAMA, rope_scaling=["llama3"])).encode(),
    "list rope_parameters": json.dumps(dict(LLAMA, rope_parameters=[1])).encode(),
    "list rope_type": json.dumps(dict(LLAMA, rope_scaling={"rope_type": ["llama3"], "factor": 2.0})).encode(),
    "dict eos": json.dumps(dict(LLAMA, eos_token_id={"id": 2})).encode(),
    "dict layer_types": json.dumps(dict(QWEN3, layer_types={"0": "full_attention"})).encode(),
    "list in layer_types": json.dumps(dict(QWEN3, layer_types=[["full_attention"]] * 3)).encode(),
    "dict num_experts": json.dumps(dict(LLAMA, num_experts={"n": 8})).encode(),
    "string hidden_act list": json.dumps(dict(LLAMA, hidden_act=["silu"])).encode(),
    "bool partial_rotary_factor": json.dumps(dict(LLAMA, partial_rotary_factor=[1.0])).encode(),
    "byte-order mark then garbage": b"\xef\xbb\xbf\xef\xbb\xbf{}",
}


@pytest.mark.parametrize("name", sorted(HAND_LIST))
def test_malformed_config_files(tmp_path, name):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, HAND_LIST[name]))
    assert "config.json" in str(e.value) and len(str(e.value)) < 1000


def test_byte_order_mark_is_accepted(tmp_path):
    assert load_config(write(tmp_path, b"\xef\xbb\xbf" + json.dumps(LLAMA).encode())).vocab_size == 97


@pytest.mark.parametrize("generation", [b"[1]", b'"x"', b"\xff\xfe", DEEP, b'{"eos_token_id": ' + b"1" * 5000 + b"}",
                                        b'{"eos_token_id": {"a": 1}}', b'{"bos_token_id": NaN}'])
def test_malformed_generation_config(tmp_path, generation):
    with pytest.raises(ConfigError, match="generation_config"):
        load_config(write(tmp_path, LLAMA, generation))


def test_a_weights_file_passed_instead_of_the_directory(tmp_path):
    from safetensors.numpy import save_file

    write(tmp_path, LLAMA)
    save_file({"x": np.zeros(3, np.float32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "tok.model").write_bytes(b"\x0a\x0b\x80\x81binary")
    for name in ("model.safetensors", "tok.model"):
        with pytest.raises(ConfigError, match="pass the model directory"):
            load_config(tmp_path / name)


def test_paths_that_are_not_a_config(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_config(tmp_path)  # a directory without config.json
    (tmp_path / "config.json").mkdir()  # the reverse: a directory where the file belongs
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="not a model directory"):
        load_config("/dev/null")
    os.mkfifo(tmp_path / "fifo.json")  # opening it would block forever
    with pytest.raises(ConfigError):
        load_config(tmp_path / "fifo.json")


def test_oversized_config_file(tmp_path):
    (tmp_path / "config.json").write_bytes(b" " * (16 << 20) + json.dumps(LLAMA).encode())
    with pytest.raises(ConfigError, match="MAX_CONFIG_BYTES"):
        load_config(tmp_path)


def test_error_messages_stay_short():
    with pytest.raises(ConfigError) as e:
        config_from_dict(dict(LLAMA, hidden_act="x" * 100_000))
    assert len(str(e.value)) < 300
    with pytest.raises(ConfigError) as e:
        LlamaConfig(97, 10**5000, 96, 2, 4)  # its repr would raise ValueError (int digit limit)
    assert "hidden_size" in str(e.value) and "bits" in str(e.value)


# -- property-based: any JSON value in any field, any bytes as the file ----------------------------

FIELDS = sorted(set(LLAMA) | set(QWEN3) | {
    "head_dim", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias", "rope_scaling",
    "rope_parameters", "partial_rotary_factor", "eos_token_ids", "max_window_layers", "layer_types",
    "num_experts", "num_local_experts", "n_routed_experts"})
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70).map(lambda i: i * 2**64)
           | st.floats() | st.sampled_from([0, 1, 2, 255, 256, 257, 2**31 - 1, 2**31, 2**63, 1e-5, 1e300, -0.0])
           | st.text(max_size=20) | st.sampled_from(["llama", "qwen3", "silu", "llama3", "default",
                                                     "full_attention", "sliding_attention"]))
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "low_freq_factor",
                                                       "high_freq_factor", "rope_theta", "x",
                                                       "original_max_position_embeddings"]), kids, max_size=5),
                    max_leaves=12)


def check_accepted(cfg) -> None:
    """What a returned config promises: every limit of the module note holds."""
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "max_position_embeddings"):
        v = getattr(cfg, name)
        assert type(v) is int and 1 <= v <= MAX_DIM, (name, v)
    assert 1 <= cfg.num_hidden_layers <= MAX_LAYERS
    assert cfg.num_attention_heads * cfg.head_dim <= MAX_DIM
    assert cfg.vocab_size * cfg.hidden_size <= MAX_PARAMETERS
    assert FLOAT32_TINY <= cfg.rms_norm_eps <= 1 and 1 < cfg.rope_theta <= FLOAT32_MAX
    assert all(0 <= e < cfg.vocab_size for e in cfg.eos_token_ids)
    assert cfg.bos_token_id is None or 0 <= cfg.bos_token_id < cfg.vocab_size
    with np.errstate(all="ignore"):
        assert np.all(np.isfinite(cfg.rope_inv_freq()))
    assert [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)]
    assert math.isfinite(cfg.rms_norm_eps) and np.isfinite(np.float32(cfg.rms_norm_eps))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([LLAMA, QWEN3, dict(LLAMA, rope_scaling=LLAMA3)]),
       changes=st.dictionaries(st.sampled_from(FIELDS), JSON, min_size=1, max_size=4),
       generation=st.none() | st.dictionaries(st.sampled_from(["bos_token_id", "eos_token_id", "x"]), JSON))
def test_any_json_in_any_field_is_accepted_or_a_config_error(base, changes, generation):
    try:
        cfg = config_from_dict(dict(base, **changes), generation)
    except ConfigError as e:
        assert str(e) and len(str(e)) < 1000
        return
    check_accepted(cfg)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_as_config_json_are_accepted_or_a_config_error(tmp_path, data):
    try:
        cfg = load_config(write(tmp_path, data))
    except ConfigError:
        return
    check_accepted(cfg)
