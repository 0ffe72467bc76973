"""Fuzz target tokenizer_dir: rlx.Tokenizer.from_dir on a fuzzed directory layout and fuzzed
tokenizer files.

Input: one byte per candidate name in NAMES saying what lies there (byte % 6: 0 nothing, 1 a
regular file, 2 a directory, 3 a dangling symlink, 4 a symlink to the regular file ../shared.bin,
5 a FIFO, which must never be opened: opening one blocks), then a flags byte (bit 0: pass the
path of tokenizer.json instead of the directory; bit 1: call the directory "tok[1]*?", glob
metacharacters and all), then the contents of the regular files, in NAMES order, split at
fuzz_common.SEP (../shared.bin gets the last part).

Acceptable outcomes: a Tokenizer, or rlx.ConfigError, or FileNotFoundError. Anything else,
including a hang (libFuzzer's -timeout), is a finding.

    python tests/fuzz/tokenizer_dir.py [libFuzzer flags] [corpus dirs]  # tools/run_fuzz.sh runs it
"""

from __future__ import annotations

import os

from fuzz_common import fresh_dir, main, scratch_root, split

NAMES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "a.model", "b.model")


def build(data: bytes) -> str:
    """The directory the input describes; returns the path to pass to from_dir."""
    kinds = [(data[i] if i < len(data) else 0) % 6 for i in range(len(NAMES))]
    flags = data[len(NAMES)] if len(data) > len(NAMES) else 0
    contents = split(data[len(NAMES) + 1:], len(NAMES) + 1)
    root = scratch_root()
    with open(os.path.join(root, "shared.bin"), "wb") as f:
        f.write(contents[-1])
    d = fresh_dir("tok[1]*?" if flags & 2 else "tok")
    for name, kind, content in zip(NAMES, kinds, contents):
        p = os.path.join(d, name)
        if kind == 1:
            with open(p, "wb") as f:
                f.write(content)
        elif kind == 2:
            os.mkdir(p)
        elif kind == 3:
            os.symlink(os.path.join(root, "gone"), p)
        elif kind == 4:
            os.symlink(os.path.join(root, "shared.bin"), p)
        elif kind == 5:
            os.mkfifo(p)
    return os.path.join(d, "tokenizer.json") if flags & 1 else d


def test_one_input(data: bytes) -> None:
    from rlx.errors import ConfigError
    from rlx.tokenizer import Tokenizer

    path = build(data)
    try:
        tok = Tokenizer.from_dir(path)
    except (ConfigError, FileNotFoundError):  # the acceptable failures; anything else is a finding
        return
    assert isinstance(tok, Tokenizer) and (tok.bos_id is None or isinstance(tok.bos_id, int)), tok


if __name__ == "__main__":
    main(test_one_input, ["rlx.tokenizer"])
