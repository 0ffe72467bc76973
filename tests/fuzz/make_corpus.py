"""Writes the seed corpus of every fuzz target: tests/fuzz/corpus/<target>/seed-<name>, a few
hundred bytes each, in the input format each target's module note describes. Seeds are small
valid inputs (real Hugging Face config layouts, safetensors files in each dtype, sharded
directories, both tokenizer kinds; for the TCP wire, correct handshakes on both sides with and
without a token followed by frames) plus the edge cases found by hand, so that the fuzzer starts
from inputs that reach deep into the loaders and the transport. Old seed-* files are replaced; inputs the fuzzer
added to a corpus directory are not touched.

    python tests/fuzz/make_corpus.py [--out DIR]
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import struct

import numpy as np
from fuzz_common import join

HERE = os.path.dirname(os.path.abspath(__file__))

LLAMA = {"model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
STORIES260K = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 172, "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 8, "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-05,
               "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu", "attention_bias": False,
               "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
               "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32"}
LLAMA32_1B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
              "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
              "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
              "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
              "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                                                      "low_freq_factor": 1.0,
                                                      "original_max_position_embeddings": 8192,
                                                      "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
              "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
             "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
             "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
             "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
             "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
             "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
             "use_sliding_window": False, "vocab_size": 151936}
QWEN3_SLIDING = {"model_type": "qwen3", "vocab_size": 131, "hidden_size": 64, "intermediate_size": 96,
                 "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                 "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1,
                 "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                 "tie_word_embeddings": True, "attention_bias": True}


def js(value) -> bytes:
    return json.dumps(value).encode()


def config_seeds() -> dict[str, bytes]:
    v5 = {k: v for k, v in LLAMA32_1B.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = dict(LLAMA32_1B["rope_scaling"], rope_theta=500000.0)
    return {
        "llama-dir": b"\x00" + js(LLAMA),
        "llama-file-path": b"\x01" + js(LLAMA),
        "llama-generation": b"\x02" + join(js(LLAMA), js({"bos_token_id": 1, "eos_token_id": [2, 3]})),
        "stories260k": b"\x02" + join(js(STORIES260K), js({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False})),
        "llama-3.2-1b": b"\x00" + js(LLAMA32_1B),
        "llama-rope-parameters-v5": b"\x00" + js(v5),
        "qwen3-0.6b": b"\x02" + join(js(QWEN3_06B), js({"bos_token_id": 151643, "eos_token_id": [151645, 151643]})),
        "qwen3-sliding": b"\x00" + js(QWEN3_SLIDING),
        "qwen3-moe": b"\x00" + js(dict(QWEN3_06B, model_type="qwen3_moe", num_experts=8)),
        "config-is-a-directory": b"\x04",
        "not-utf8": b"\x00" + js(LLAMA)[:20] + b"\xff" + js(LLAMA)[20:],
        "nan-and-infinity": b"\x00" + js(dict(LLAMA, rms_norm_eps=float("nan"), rope_theta=float("inf"))),
        "huge-ints": b"\x00" + js(dict(LLAMA, num_hidden_layers=10**9, vocab_size=2**64)),
        "nested": b"\x00" + b'{"model_type": ' + b"[" * 600 + b"]" * 600 + b"}",
    }


def safetensors_bytes(tensors: dict, metadata: dict | None = None) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata=metadata)


def raw_safetensors(header: dict, body: bytes) -> bytes:
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + body


def weights_seeds() -> dict[str, bytes]:
    import ml_dtypes

    f32 = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.ones(3, np.float32)}
    half = {"h": np.arange(4, dtype=np.float16), "b": np.arange(3, dtype=np.float32).astype(ml_dtypes.bfloat16)}
    unaligned = raw_safetensors({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
                                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [6, 14]}}, bytes(range(14)))
    odd = raw_safetensors({"e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]},
                           "s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
                           "i": {"dtype": "I32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8))
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    shard1, shard2 = safetensors_bytes({"a": np.ones(2, np.float32)}), safetensors_bytes({"b": np.zeros(3, np.float32)})

    def index(weight_map):
        return js({"metadata": {"total_size": 20}, "weight_map": weight_map})

    return {
        "single-f32": b"\x00" + safetensors_bytes(f32),
        "single-f16-bf16": b"\x00" + safetensors_bytes(half),
        "single-metadata-file-path": b"\x01" + safetensors_bytes(f32, {"format": "pt"}),
        "unaligned-f32": b"\x00" + unaligned,
        "empty-scalar-int": b"\x00" + odd,
        "sharded": b"\x02" + join(index({"a": s1, "b": s2}), shard1, shard2),
        "sharded-duplicate": b"\x02" + join(index({"a": s1, "b": s2}), shard1, safetensors_bytes(
            {"a": np.ones(2, np.float32), "b": np.zeros(3, np.float32)})),
        "sharded-wrong-shard": b"\x02" + join(index({"a": s2, "b": s1}), shard1, shard2),
        "sharded-escapes": b"\x03" + join(index({"a": "link.safetensors", "b": "../outside.safetensors",
                                                 "c": "alias.safetensors", "d": "/etc/passwd"}), shard1, shard2),
        "sharded-bad-names": b"\x02" + join(index({"a": 5, "b": ["x"], "c": "", "d": "./" + s2}), shard1, shard2),
    }


def tokenizer_json() -> bytes:
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "<s>": 3},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return tok.to_str().encode()


def sentencepiece_model() -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["hello world", "the cat sat on the mat"] * 20),
                                   model_writer=buf, vocab_size=20, model_type="char", minloglevel=2,
                                   normalization_rule_name="identity", character_coverage=1.0, num_threads=1)
    return buf.getvalue()


def tokenizer_seeds() -> dict[str, bytes]:
    tj, sp = tokenizer_json(), sentencepiece_model()
    cfg = js({"bos_token": "<s>", "add_bos_token": True})
    cfg_dict = js({"bos_token": {"content": "<s>", "lstrip": False}, "add_bos_token": True})

    def seed(kinds, flags, *contents):
        return bytes(kinds) + bytes([flags]) + join(*contents)

    return {
        "hf": seed([1, 1, 0, 0, 0], 0, tj, cfg),
        "hf-bos-dict": seed([1, 1, 0, 0, 0], 0, tj, cfg_dict),
        "hf-file-path": seed([1, 0, 0, 0, 0], 1, tj),
        "sp-tokenizer-model": seed([0, 0, 1, 0, 0], 0, b"", b"", sp),
        "sp-other-model-glob-name": seed([0, 0, 0, 1, 0], 2, b"", b"", b"", sp),
        "sp-two-models": seed([0, 0, 0, 1, 1], 0, b"", b"", b"", sp, sp),
        "sp-symlink": seed([0, 0, 4, 0, 0], 0, b"", b"", b"", b"", b"", sp),
        "not-regular-files": seed([2, 5, 3, 5, 2], 0),
        "empty": seed([0, 0, 0, 0, 0], 0),
    }


def gguf_bytes(arch: str, matrix_type: str, tokenizer: str | None = None, qk_norm: bool = False,
               template: str | None = None) -> bytes:
    """A tiny model (hidden 32, one layer, vocab 8) as a GGUF file: f32 vectors and embedding,
    matrices of matrix_type (gguf-py's quantize), optional tokenizer metadata."""
    import tempfile

    import gguf
    from gguf.constants import GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    H, F, V, heads, kv, hd = 32, 32, 8, 2, 1, 16
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.gguf")
        w = gguf.GGUFWriter(path, arch)
        for key, kind, value in [
            ("block_count", "uint32", 1), ("context_length", "uint32", 64), ("embedding_length", "uint32", H),
            ("feed_forward_length", "uint32", F), ("attention.head_count", "uint32", heads),
            ("attention.head_count_kv", "uint32", kv), ("attention.key_length", "uint32", hd),
            ("attention.value_length", "uint32", hd), ("rope.dimension_count", "uint32", hd),
            ("rope.freq_base", "float32", 10000.0), ("attention.layer_norm_rms_epsilon", "float32", 1e-6)]:
            getattr(w, f"add_{kind}")(f"{arch}.{key}", value)
        if tokenizer == "gpt2":
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre("qwen2")
            w.add_token_list(["h", "e", "l", "o", "he", "ll", "hell", "hello"])
            w.add_token_merges(["h e", "l l", "he ll", "hell o"])
            w.add_eos_token_id(7)
        elif tokenizer == "llama":
            w.add_tokenizer_model("llama")
            toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581hello", "\u2581world"]
            w.add_token_list(toks)
            w.add_token_scores([0.0] * len(toks))
            w.add_token_types([2, 3, 3] + [6] * 256 + [1, 1])
            w.add_bos_token_id(1)
            w.add_eos_token_id(2)
        if template is not None:
            w.add_chat_template(template)
        qtype = getattr(T, matrix_type.upper())

        def matrix(name, rows, cols):
            x = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
            if qtype == T.F32:
                w.add_tensor(name, x)
            else:
                w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

        w.add_tensor("token_embd.weight", rng.standard_normal((V, H)).astype(np.float32))
        w.add_tensor("output_norm.weight", np.ones(H, np.float32))
        w.add_tensor("blk.0.attn_norm.weight", np.ones(H, np.float32))
        w.add_tensor("blk.0.ffn_norm.weight", np.ones(H, np.float32))
        if qk_norm:
            w.add_tensor("blk.0.attn_q_norm.weight", np.ones(hd, np.float32))
            w.add_tensor("blk.0.attn_k_norm.weight", np.ones(hd, np.float32))
        matrix("blk.0.attn_q.weight", heads * hd, H)
        matrix("blk.0.attn_k.weight", kv * hd, H)
        matrix("blk.0.attn_v.weight", kv * hd, H)
        matrix("blk.0.attn_output.weight", H, heads * hd)
        matrix("blk.0.ffn_gate.weight", F, H)
        matrix("blk.0.ffn_up.weight", F, H)
        matrix("blk.0.ffn_down.weight", H, F)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()


def gguf_seeds() -> dict[str, bytes]:
    llama = gguf_bytes("llama", "q4_0", tokenizer="gpt2")
    return {
        "llama-q4_0-bpe": llama,
        "qwen3-q8_0-template": gguf_bytes("qwen3", "q8_0", qk_norm=True,
                                          template="{% for m in messages %}{{ m['content'] }}{% endfor %}"),
        "llama-f32-spm": gguf_bytes("llama", "f32", tokenizer="llama"),
        "llama-q5_1": gguf_bytes("llama", "q5_1"),
        "truncated": llama[: len(llama) // 2],
        "header-only": llama[:24],
        "empty": b"",
    }


# tcp_wire (tests/fuzz/tcp_wire.c, a C target): mode bits, the transport's ops and the peer's script.
CONNECTOR, TOKEN, DIFFER, REMOTE, KEEP_OPEN, AUTO, MAX_DEFAULT, MAX_64 = 1, 2, 4, 8, 16, 32, 0xC0, 0x00
RECV, SEND, BCAST_FROM, BCAST_TO, BARRIER, RECV_FROM = 1, 3, 4, 5, 6, 7
T_BCAST, T_ARRIVE, T_LEAVE, T_2_24 = 0xF0, 0xF1, 0xF2, 0xF4


def tcp_input(mode: int, sizes: int, ops: list[tuple[int, int, int]], script: bytes) -> bytes:
    """mode and sizes bytes, four (kind, tag byte, size) ops, then the peer's script."""
    ops = (ops + [(0, 0, 0)] * 4)[:4]
    return bytes([mode, sizes]) + b"".join(struct.pack("<BBH", k, t, n) for k, t, n in ops) + script


def frame(tag: int, n: int, flags: int = 1, extra: bytes = b"") -> bytes:
    """Peer op FRAME: flags (bit 0: payload generated), tag byte, u16 length, then the flags' fields."""
    return bytes([3, flags, tag]) + struct.pack("<H", n) + extra


def hello(flags: int = 0, fields: bytes = b"") -> bytes:
    return bytes([1, flags]) + fields


def proof(flags: int = 0, fields: bytes = b"") -> bytes:
    return bytes([2, flags]) + fields


def refuse(reason: int, flags: int = 0, fields: bytes = b"") -> bytes:
    return bytes([6, flags]) + fields + struct.pack("<H", reason)


def raw(data: bytes) -> bytes:
    return bytes([0, len(data)]) + data


def tcp_wire_seeds() -> dict[str, bytes]:
    rw = [(RECV, 0, 256), (SEND, 1, 10), (BARRIER, 0, 0), (RECV, 2, 64)]
    frames = frame(0, 10) + frame(T_ARRIVE, 0) + frame(2, 64)
    acc = MAX_DEFAULT | AUTO
    con = MAX_DEFAULT | AUTO | CONNECTOR
    con_ops = [(RECV, 0, 256), (SEND, 1, 10), (BCAST_FROM, 0, 16), (BARRIER, 0, 0)]
    con_frames = frame(0, 5, 0, b"hello") + frame(T_BCAST, 16) + frame(T_LEAVE, 0)
    return {
        "empty": b"",
        # correct handshakes, then frames: received, sent, a barrier, a broadcast
        "acceptor-no-token-frames": tcp_input(acc | REMOTE, 0, rw, frames),
        "acceptor-token-frames": tcp_input(acc | TOKEN, 0, rw, frames),
        "acceptor-token-world5": tcp_input(acc | TOKEN, 0x03 | 1 << 2, rw, frames),
        "connector-token-frames": tcp_input(con | TOKEN, 0x05, con_ops, con_frames),
        "connector-no-token-frames": tcp_input(con | REMOTE, 0x00, con_ops, con_frames),
        "frames-tag-mismatch-and-small-buffer": tcp_input(acc | TOKEN, 0,
                                                          [(RECV, 1, 256), (RECV, 0, 4), (RECV, 0, 256)],
                                                          frame(0, 10) + frame(0, 10) + frame(0, 3)),
        "frames-invalid-args": tcp_input(acc | TOKEN, 0x01, [(RECV, T_2_24, 8), (RECV_FROM, 0, 8), (RECV_FROM, 4, 8),
                                                             (SEND, T_BCAST, 8)], frame(0, 4)),
        # refused handshakes
        "acceptor-wrong-token": tcp_input(acc | TOKEN | DIFFER, 0, rw, frames),
        "acceptor-peer-has-token": tcp_input(acc | REMOTE | DIFFER, 0, rw, frames),
        "acceptor-peer-has-no-token": tcp_input(MAX_DEFAULT | TOKEN, 0, [], hello(4, struct.pack("<H", 0))),
        "acceptor-not-loopback": tcp_input(acc, 0, rw, frames),
        "acceptor-version-2": tcp_input(MAX_DEFAULT | REMOTE, 0, [], hello(2, struct.pack("<H", 2))),
        "acceptor-world-7": tcp_input(MAX_DEFAULT | REMOTE, 0, [], hello(16, struct.pack("<I", 7))),
        "acceptor-rank-self": tcp_input(MAX_DEFAULT | REMOTE, 0, [], hello(8, struct.pack("<I", 0))),
        "acceptor-not-rlx": tcp_input(MAX_DEFAULT | REMOTE, 0, [], raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")),
        "acceptor-hello-cut": tcp_input(MAX_DEFAULT | REMOTE, 0, [], hello(128, bytes([20]))),
        "acceptor-proof-other-rank": tcp_input(MAX_DEFAULT | TOKEN, 0x01 << 2 | 0x02, [],
                                               hello() + proof(32, struct.pack("<I", 3))),
        "acceptor-proof-other-version": tcp_input(MAX_DEFAULT | TOKEN, 0, [],
                                                  hello() + proof(16, struct.pack("<H", 4))),
        "acceptor-proof-reflected": tcp_input(MAX_DEFAULT | TOKEN, 0, [], hello() + proof(8)),
        "acceptor-proof-garbage": tcp_input(MAX_DEFAULT | TOKEN, 0, [], hello() + proof(4, bytes(range(32)))),
        "connector-refused": tcp_input(MAX_DEFAULT | CONNECTOR | REMOTE, 0, [], refuse(2)),
        "connector-refused-token": tcp_input(MAX_DEFAULT | CONNECTOR | TOKEN, 0, [], hello() + refuse(5)),
        "connector-refused-unknown-reason": tcp_input(MAX_DEFAULT | CONNECTOR | REMOTE, 0, [], refuse(77, 4,
                                                                                                   b"\0\0\0\0")),
        "connector-reflected-hello": tcp_input(MAX_DEFAULT | CONNECTOR | REMOTE, 0, [], hello(32)),
        "connector-wrong-rank": tcp_input(MAX_DEFAULT | CONNECTOR | REMOTE, 0, [], hello(8, struct.pack("<I", 1))),
        "connector-proof-wrong-label": tcp_input(MAX_DEFAULT | CONNECTOR | TOKEN, 0, [], hello() + proof(2)),
        "connector-not-loopback": tcp_input(con, 0, con_ops, con_frames),
        # frames that must fail their checks
        "frame-mac-garbage": tcp_input(acc | TOKEN, 0, rw, frame(0, 10, 1 | 4, bytes(32))),
        "frame-mac-next-seq": tcp_input(acc | TOKEN, 0, rw, frame(0, 10, 1 | 8)),
        "frame-mac-reflected": tcp_input(acc | REMOTE, 0, rw, frame(0, 10, 1 | 16)),
        "frame-no-mac": tcp_input(acc | TOKEN, 0, rw, frame(0, 10, 1 | 32)),
        "frame-bad-magic": tcp_input(acc | TOKEN, 0, rw, frame(0, 10, 1 | 64, b"RLXH")),
        "frame-length-huge": tcp_input(acc | TOKEN, 0, rw, frame(0, 10, 1 | 2, struct.pack("<Q", 1 << 62))),
        "frame-length-plus-one": tcp_input(acc | TOKEN, 0, rw, frame(0, 10, 1 | 2, struct.pack("<Q", 11))),
        "frame-above-max": tcp_input(MAX_64 | AUTO | TOKEN, 0, rw, frame(0, 100)),
        "frame-cut": tcp_input(acc | TOKEN, 0, rw, frame(0, 100, 1 | 128, struct.pack("<H", 60))),
        "frame-after-junk": tcp_input(acc | TOKEN, 0, rw, frame(0, 10) + raw(b"RLXF\0\0\0\0") + frame(0, 10)),
        "acceptor-duplicate-rank": tcp_input(acc | TOKEN, 0, [(0, 1, 0), (RECV, 0, 16)], frame(0, 10)),
        "connector-duplicate-rank": tcp_input(con | REMOTE, 0, [(0, 1, 0), (RECV, 0, 16)], frame(0, 10)),
        # timing and closing
        "keep-open-sends-squeezed": tcp_input(acc | TOKEN | KEEP_OPEN, 0, [(SEND, 1, 0x8000 | 4000)] * 4, b""),
        "keep-open-silent": tcp_input(acc | REMOTE | KEEP_OPEN, 0, rw, b""),
        "keep-open-token-frames": tcp_input(acc | TOKEN | KEEP_OPEN, 0, rw, frames),
        "keep-open-frame-cut": tcp_input(acc | TOKEN | KEEP_OPEN, 0, rw, frame(0, 100, 1 | 128, struct.pack("<H", 30))),
        "keep-open-hello-cut": tcp_input(MAX_DEFAULT | REMOTE | KEEP_OPEN, 0, rw, hello(128, bytes([30]))),
        "peer-stops-reading": tcp_input(acc | TOKEN, 0, rw, frames + bytes([4, 1])),
        "connector-peer-stops-reading": tcp_input(con | TOKEN, 0x05, con_ops, bytes([4, 2])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    args = ap.parse_args()
    for target, seeds in (("config_file", config_seeds()), ("weights_file", weights_seeds()),
                          ("tokenizer_dir", tokenizer_seeds()), ("gguf_file", gguf_seeds()),
                          ("tcp_wire", tcp_wire_seeds())):
        d = os.path.join(args.out, target)
        os.makedirs(d, exist_ok=True)
        for old in glob.glob(os.path.join(d, "seed-*")):
            os.unlink(old)
        for name, data in seeds.items():
            with open(os.path.join(d, f"seed-{name}"), "wb") as f:
                f.write(data)
        print(f"{target}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes -> {d}")


if __name__ == "__main__":
    main()
