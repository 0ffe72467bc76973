"""The command line, run as a user would (subprocesses): --version, a prompt from stdin,
--max-new-tokens 0, arguments checked before anything is printed, and `rlx chat` reading turns
from stdin with prefix reuse between them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from chat_paths import STORIES, needs_stories

import rlx

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlx", *args], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"rlx {rlx.__version__}"


@needs_stories
def test_prompt_from_stdin_and_zero_new_tokens():
    want = rlx.load(STORIES).generate("Once upon a time", max_new_tokens=8)
    r = run("generate", "--model", str(STORIES), "--max-new-tokens", "8", stdin="Once upon a time\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Once upon a time" + want + "\n"
    r = run("generate", "--model", str(STORIES), "--prompt", "Once upon a time", "--max-new-tokens", "0")
    assert r.returncode == 0 and r.stdout == "Once upon a time\n" and "[rlx] 0 tokens" in r.stderr


@needs_stories
@pytest.mark.parametrize("args,words", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--max-new-tokens", "-3"], "--max-new-tokens"),
    (["--max-new-tokens", "lots"], "not an integer"),
    (["--device", "tpu"], "--device"),
])
def test_bad_arguments_fail_before_anything_is_printed(args, words):
    r = run("generate", "--model", str(STORIES), "--prompt", "Hi", *args)
    assert r.returncode == 2 and r.stdout == "" and words in r.stderr


def test_a_missing_model_or_a_file_for_a_directory_is_a_clear_error(tmp_path):
    r = run("generate", "--model", str(tmp_path / "nope"), "--prompt", "Hi")
    assert r.returncode == 2 and r.stdout == "" and "no such file or directory" in r.stderr
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\x00" * 16)
    r = run("generate", "--model", str(f), "--prompt", "Hi")
    assert r.returncode == 2 and r.stdout == "" and "is a file, not a model" in r.stderr


def test_chat_reads_turns_from_stdin_and_reuses_the_prefix(qwen3_dir):
    r = run("chat", "--model", str(qwen3_dir), "--system", "Be brief.", "--max-new-tokens", "5",
            "--temperature", "0", stdin="Hello!\nTell me more.\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) >= 2
    assert "2 turns" in r.stderr
    cached = int(r.stderr.split("of which ")[1].split()[0])
    assert cached > 0, r.stderr
    # the first reply is the library's
    m = rlx.load(qwen3_dir)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    first = m.create_chat_completion(msgs,
                                     max_tokens=5, temperature=0)["choices"][0]["message"]["content"]
    assert r.stdout.startswith(first + "\n")


@needs_stories
def test_chat_needs_a_template(tmp_path):
    r = run("chat", "--model", str(STORIES), stdin="Hi\n")
    assert r.returncode == 2 and "no chat template" in r.stderr and r.stdout == ""
    t = tmp_path / "plain.jinja"
    t.write_text("{% for m in messages %}{{ m.content }} {% endfor %}")
    r = run("chat", "--model", str(STORIES), "--chat-template", str(t), "--max-new-tokens", "4",
            "--temperature", "0", stdin="Once upon a time\n/reset\nThe dog\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2 and "2 turns" in r.stderr
