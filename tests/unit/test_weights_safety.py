"""rlx.load_weights against hostile and careless model directories: shard indexes naming files
outside the directory (absolute paths, `..`, symlinks), tensors in two shards or in a shard the
index does not name, malformed indexes and headers, and paths of the wrong kind. Every one must be
an rlx.WeightsError naming the file and the tensor (FileNotFoundError for a path that does not
exist); tests/fuzz/weights_file.py fuzzes the same entry point coverage-guided."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from rlx.errors import WeightsError
from rlx.weights import load_weights

A = {"a": np.arange(4, dtype=np.float32)}
B = {"b": np.ones((2, 3), np.float32)}
EVIL = {"a": np.full(4, 666, np.float32), "b": np.full((2, 3), 666, np.float32)}


def index(model: Path, weight_map: dict) -> None:
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture
def model(tmp_path) -> Path:
    """A two-shard model (a -> s1, b -> s2) and, beside it, a valid safetensors file it must never read."""
    m = tmp_path / "model"
    m.mkdir()
    save_file(A, str(m / "s1.safetensors"))
    save_file(B, str(m / "s2.safetensors"))
    index(m, {"a": "s1.safetensors", "b": "s2.safetensors"})
    save_file(EVIL, str(tmp_path / "outside.safetensors"))
    return m


def test_the_fixture_loads(model):
    got = load_weights(model)
    assert set(got) == {"a", "b"} and np.array_equal(got["a"], A["a"])


# -- 5. shards confined to the model directory ----------------------------------------------------

@pytest.mark.parametrize("name", ["../outside.safetensors", "sub/../../outside.safetensors",
                                  "..\\outside.safetensors", "{outside}", "/etc/passwd", "/dev/zero", "",
                                  "s1.safetensors\0.txt"])
def test_index_names_outside_the_directory(model, name):
    name = name.format(outside=model.parent / "outside.safetensors")
    index(model, {"a": name, "b": "s2.safetensors"})
    with pytest.raises(WeightsError) as e:
        load_weights(model)
    assert "model.safetensors.index.json" in str(e.value) and "plain relative name" in str(e.value)


def test_symlink_escaping_the_directory(model):
    (model / "link.safetensors").symlink_to(model.parent / "outside.safetensors")
    index(model, {"a": "link.safetensors", "b": "link.safetensors"})
    with pytest.raises(WeightsError, match="link.safetensors.*outside"):
        load_weights(model)
    (model / "sub").symlink_to(model.parent, target_is_directory=True)  # through a linked directory
    index(model, {"a": "sub/outside.safetensors", "b": "sub/outside.safetensors"})
    with pytest.raises(WeightsError, match="outside"):
        load_weights(model)


def test_single_file_symlink_escaping_the_directory(tmp_path):
    m = tmp_path / "m"
    m.mkdir()
    (m / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    save_file(A, str(tmp_path / "elsewhere.safetensors"))
    with pytest.raises(WeightsError, match="outside"):
        load_weights(m)
    assert set(load_weights(m / "model.safetensors")) == {"a"}  # its own path: the caller's choice


def test_symlinks_that_stay_inside_are_fine(model):
    (model / "sub").mkdir()
    os.rename(model / "s2.safetensors", model / "sub" / "s2.safetensors")
    (model / "alias.safetensors").symlink_to("sub/s2.safetensors")
    index(model, {"a": "./s1.safetensors", "b": "alias.safetensors"})
    assert set(load_weights(model)) == {"a", "b"}
    linked = model.parent / "linked-model"  # a symlinked model directory: its target is the bound
    linked.symlink_to(model, target_is_directory=True)
    assert set(load_weights(linked)) == {"a", "b"}


def test_hugging_face_cache_layout(tmp_path):
    """snapshots/<rev>/ links its files to ../../blobs/<hash>: the repo folder is the bound."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    save_file(A, str(repo / "blobs" / "f00d"))
    save_file(B, str(repo / "blobs" / "beef"))
    (snap / "s1.safetensors").symlink_to("../../blobs/f00d")
    (snap / "s2.safetensors").symlink_to("../../blobs/beef")
    index(snap, {"a": "s1.safetensors", "b": "s2.safetensors"})
    assert set(load_weights(snap)) == {"a", "b"}
    sub = snap / "sub"  # a model in a subfolder of the snapshot
    sub.mkdir()
    (sub / "model.safetensors").symlink_to("../../../blobs/f00d")
    assert set(load_weights(sub)) == {"a"}
    save_file(EVIL, str(tmp_path / "hub" / "other"))  # still nothing outside the repo folder
    (snap / "s2.safetensors").unlink()
    (snap / "s2.safetensors").symlink_to("../../../other")
    with pytest.raises(WeightsError, match="outside"):
        load_weights(snap)


# -- 5. each tensor from exactly one file, the one the index names --------------------------------

def test_tensor_in_two_shards(model):
    save_file(EVIL, str(model / "s3.safetensors"))
    index(model, {"a": "s1.safetensors", "b": "s3.safetensors"})
    with pytest.raises(WeightsError) as e:
        load_weights(model)
    msg = str(e.value)
    assert "'a'" in msg and "two files" in msg and "s1.safetensors" in msg and "s3.safetensors" in msg


def test_tensor_in_a_shard_the_index_does_not_name_for_it(model):
    index(model, {"a": "s2.safetensors", "b": "s1.safetensors"})
    with pytest.raises(WeightsError, match="'a' is in shard s1.safetensors but is listed in the index under "
                                           "s2.safetensors"):
        load_weights(model)


def test_tensor_missing_from_the_index(model):
    save_file({"a": A["a"], "z": EVIL["a"]}, str(model / "s1.safetensors"))
    with pytest.raises(WeightsError, match="'z' is in shard s1.safetensors but is not listed in the index"):
        load_weights(model)


def test_same_shard_under_two_names(model):
    (model / "again.safetensors").symlink_to("s1.safetensors")
    index(model, {"a": "s1.safetensors", "b": "s2.safetensors", "c": "again.safetensors"})
    with pytest.raises(WeightsError, match="'a' is in shard again.safetensors"):
        load_weights(model)


# -- malformed indexes and headers ----------------------------------------------------------------

@pytest.mark.parametrize("content, words", [
    (b'{"weight_map": {"a": 5}}', ["'a'", "5"]),
    (b'{"weight_map": {"a": ["s1.safetensors"]}}', ["'a'"]),
    (b'{"weight_map": {"a": null}}', ["'a'"]),
    (b'{"weight_map": ["s1.safetensors"]}', ["weight_map"]),
    (b'{"weight_map": {"a": "s1.safetensors", "a": "s2.safetensors"}}', ["twice"]),
    (b'[]', ["weight_map"]),
    (b'{"weight_map": {"a": "s1.safe\xfftensors"}}', ["malformed"]),
    (b'{"weight_map": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ["nested"]),
    (b'{"metadata": {"total_size": ' + b"7" * 5000 + b'}, "weight_map": {}}', ["malformed"]),
    (b"{broken", ["malformed"]),
])
def test_malformed_index(model, content, words):
    (model / "model.safetensors.index.json").write_bytes(content)
    with pytest.raises(WeightsError) as e:
        load_weights(model)
    for w in ["model.safetensors.index.json"] + words:
        assert w in str(e.value), (w, str(e.value))


def raw_file(header: bytes, body: bytes = b"") -> bytes:
    return len(header).to_bytes(8, "little") + header + body


@pytest.mark.parametrize("content", [
    raw_file(b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],'
             b'"data_offsets":[4,8]}}', b"\0" * 8),
    raw_file(b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}, "__metadata__": {"k": "v", "k": "w"}}',
             b"\0" * 4),
    raw_file(b'{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    raw_file(b'{"x":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}', b"\0" * 4),
])
def test_malformed_header(tmp_path, content):
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(WeightsError, match="model.safetensors"):
        load_weights(tmp_path)


# -- paths of the wrong kind ----------------------------------------------------------------------

def test_a_config_file_passed_instead_of_the_directory(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(WeightsError, match="pass the model directory"):
        load_weights(tmp_path / "config.json")


def test_paths_that_are_not_weights(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_weights(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        load_weights(tmp_path)
    with pytest.raises(WeightsError, match="not a safetensors file or a model directory"):
        load_weights("/dev/null")
    (tmp_path / "model.safetensors").mkdir()  # a directory where the file belongs
    with pytest.raises(WeightsError, match="not a regular file"):
        load_weights(tmp_path)
    (tmp_path / "model.safetensors.index.json").mkdir()
    with pytest.raises(WeightsError, match="index.json: not a regular file"):
        load_weights(tmp_path)


def test_dangling_shard_link(model):
    (model / "s2.safetensors").unlink()
    (model / "s2.safetensors").symlink_to("gone.safetensors")
    with pytest.raises(WeightsError, match="s2.safetensors"):
        load_weights(model)
