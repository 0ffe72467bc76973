"""Fuzz target weights_file: rlx.load_weights on a fuzzed safetensors file or sharded directory.

Input: a flags byte, then up to three files (split at fuzz_common.SEP). Flags & 3 picks the mode:
  0: model.safetensors = file 0; load the directory
  1: model.safetensors = file 0; load the file by its path
  2: model.safetensors.index.json = file 0, model-00001-of-00002.safetensors = file 1,
     model-00002-of-00002.safetensors = file 2; load the directory
  3: as 2, plus link.safetensors -> ../outside.safetensors (escapes the directory) and
     alias.safetensors -> model-00001-of-00002.safetensors (stays inside)
Beside the model directory lies outside.safetensors, a valid file whose one tensor has a name
chosen at random per process: an index may name it ("../outside.safetensors", "link...", an
absolute path), and it must never be read.

Acceptable outcomes: {name: array}, or rlx.WeightsError, or FileNotFoundError. Returned arrays
must be read-only float32 / float16 / bfloat16 arrays whose bytes can all be read, and never the
outside tensor. Anything else is a finding.

    python tests/fuzz/weights_file.py [libFuzzer flags] [corpus dirs]   # tools/run_fuzz.sh runs it
"""

from __future__ import annotations

import os
import uuid

import numpy as np
from fuzz_common import fresh_dir, main, scratch_root, split

INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
OUTSIDE_TENSOR = f"outside-{uuid.uuid4().hex}"
_outside_written = False


def write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def write_outside() -> None:
    """scratch_root()/outside.safetensors, once per process."""
    global _outside_written
    if not _outside_written:
        from safetensors.numpy import save_file

        save_file({OUTSIDE_TENSOR: np.arange(4, dtype=np.float32)}, os.path.join(scratch_root(), "outside.safetensors"))
        _outside_written = True


def check_weights(weights: dict) -> None:
    import ml_dtypes

    assert isinstance(weights, dict) and OUTSIDE_TENSOR not in weights, "read a file outside the model directory"
    for name, arr in weights.items():
        assert isinstance(name, str) and isinstance(arr, np.ndarray), (name, type(arr))
        assert arr.dtype in (np.float32, np.float16, np.dtype(ml_dtypes.bfloat16)), (name, arr.dtype)
        assert not arr.flags.writeable and arr.size == int(np.prod(arr.shape, dtype=object)), name
        assert arr.dtype != np.float32 or arr.flags.aligned, name
        assert len(arr.tobytes()) == arr.nbytes  # every byte is mapped and readable


def test_one_input(data: bytes) -> None:
    from rlx.errors import WeightsError
    from rlx.weights import load_weights

    write_outside()
    flags, rest = (data[0], data[1:]) if data else (0, b"")
    mode = flags & 3
    files = split(rest, 3)
    d = fresh_dir()
    target = d
    if mode < 2:
        write(os.path.join(d, "model.safetensors"), files[0])
        if mode == 1:
            target = os.path.join(d, "model.safetensors")
    else:
        write(os.path.join(d, INDEX), files[0])
        write(os.path.join(d, SHARDS[0]), files[1])
        write(os.path.join(d, SHARDS[1]), files[2])
        if mode == 3:
            os.symlink(os.path.join("..", "outside.safetensors"), os.path.join(d, "link.safetensors"))
            os.symlink(SHARDS[0], os.path.join(d, "alias.safetensors"))
    try:
        weights = load_weights(target)
    except (WeightsError, FileNotFoundError):  # the acceptable failures; anything else is a finding
        return
    check_weights(weights)


if __name__ == "__main__":
    main(test_one_input, ["rlx.weights"])
