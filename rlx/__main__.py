"""The rlx command line.

    python -m rlx generate --model DIR|FILE.gguf --prompt TEXT [--max-new-tokens N] [--temperature T] ...
    python -m rlx demo      # stories260K from ../shared when present, else a tiny random model
    python -m rlx info      # build facts (BLAS, ISA, backends, threads)
    python -m rlx pipeline --model DIR --world N --prompt TEXT   # N ranks on this host (TCP)
    mpirun -np N python -m rlx pipeline --model DIR --prompt TEXT # N ranks under MPI
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np


def _shared_stories() -> str | None:
    """../shared/models/stories260K/hf next to the checkout, if it is there."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(os.path.dirname(repo), "shared", "models", "stories260K", "hf")
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def _run_generate(model_dir: str, prompt: str, args: argparse.Namespace) -> int:
    import rlx

    if args.threads:
        rlx.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = rlx.load(model_dir, device=args.device)
    t_load = time.perf_counter() - t0
    sys.stdout.write(prompt)
    sys.stdout.flush()
    t0 = time.perf_counter()
    stream = model.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed, stream=True)
    for delta in stream:
        sys.stdout.write(delta)
        sys.stdout.flush()
    dt = time.perf_counter() - t0
    n_new = len(stream.new_ids)
    sys.stdout.write("\n")
    print(f"[rlx] {n_new} tokens in {dt:.3f} s ({n_new / dt if dt > 0 else 0:.1f} tok/s incl. prefill; "
          f"load {t_load:.2f} s; device {args.device}; {rlx.get_num_threads()} threads)", file=sys.stderr)
    return 0


def _tiny_random_model(dir_path: str) -> None:
    """A 2-layer Llama with random weights, written as a Hugging Face directory (no tokenizer)."""
    import json

    from safetensors.numpy import save_file

    import rlx
    from rlx.weights import expected_weights

    cfg = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    with open(os.path.join(dir_path, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = np.random.default_rng(0)
    shapes = expected_weights(rlx.load_config(dir_path))
    save_file({k: (rng.standard_normal(s) * 0.2).astype(np.float32) for k, s in shapes.items()},
              os.path.join(dir_path, "model.safetensors"))


def _demo(args: argparse.Namespace) -> int:
    stories = _shared_stories()
    if stories:
        print(f"[rlx] demo: stories260K (a real 260K-parameter TinyStories Llama) from {stories}", file=sys.stderr)
        args.max_new_tokens = args.max_new_tokens or 64
        return _run_generate(stories, "Once upon a time", args)
    import rlx

    print("[rlx] demo: ../shared/models/stories260K is not here, so this runs a tiny RANDOM-weight model "
          "that rlx builds itself: the output ids are meaningless, the run is real.", file=sys.stderr)
    with tempfile.TemporaryDirectory() as d:
        _tiny_random_model(d)
        gen = rlx.Generator.from_pretrained(d, device=args.device).with_dynamic_decode_cache()
        gen.prefill([1, 10, 20, 30])
        t0 = time.perf_counter()
        ids = gen.generate_cached(args.max_new_tokens or 32)
        dt = time.perf_counter() - t0
    print("generated ids:", ids)
    print(f"[rlx] {len(ids)} tokens in {dt:.3f} s ({len(ids) / dt:.1f} tok/s)", file=sys.stderr)
    return 0


def _info(args: argparse.Namespace) -> int:
    import rlx

    for k, v in rlx.build_info().items():
        print(f"{k}: {v}")
    return 0


def _pipeline(args: argparse.Namespace, argv: list[str]) -> int:
    from rlx.distributed import MpiTransport, TcpTransport
    from rlx.distributed.launch import die_with_launcher, run_rank, spawn, under_mpirun

    args.max_new_tokens = args.max_new_tokens or 64
    if args.mpi or under_mpirun():
        with MpiTransport(timeout=args.timeout) as t:
            return run_rank(args, t)
    if args.rank is None:
        if args.world < 1:
            raise ValueError("--world must be >= 1")
        return spawn(args, argv)
    import socket

    if args.launcher_pid is not None:
        die_with_launcher(args.launcher_pid)
    listener = socket.socket(fileno=args.listen_fd) if args.listen_fd is not None else None
    try:
        t = TcpTransport(args.rank, args.world, args.addrs.split(","), listener=listener, timeout=args.timeout)
    finally:
        if listener is not None:
            listener.close()   # the transport took a duplicate, and closes it once the mesh is up
    with t:
        return run_rank(args, t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlx", description="rlx: LLM inference with a C core.")
    sub = p.add_subparsers(dest="cmd", required=True)

    def sampling(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--max-new-tokens", type=int, default=0, help="tokens to generate (default 64)")
        sp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
        sp.add_argument("--top-k", type=int, default=0)
        sp.add_argument("--top-p", type=float, default=1.0)
        sp.add_argument("--min-p", type=float, default=0.0)
        sp.add_argument("--repetition-penalty", type=float, default=1.0)
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--device", default="cpu", help="cpu or ref")
        sp.add_argument("--threads", type=int, default=0, help="CPU threads (default: all)")

    g = sub.add_parser("generate", help="generate text from a Hugging Face model directory")
    g.add_argument("--model", required=True, help="model directory (config.json, safetensors, tokenizer) or GGUF file")
    g.add_argument("--prompt", required=True)
    sampling(g)
    d = sub.add_parser("demo", help="generate with stories260K (or a tiny random model)")
    sampling(d)
    sub.add_parser("info", help="build facts")
    pp = sub.add_parser("pipeline", help="pipeline-parallel generation over N ranks (TCP on this host, or MPI)")
    pp.add_argument("--model", required=True)
    pp.add_argument("--prompt", required=True)
    pp.add_argument("--world", type=int, default=2, help="ranks to start on this host (ignored under mpirun)")
    pp.add_argument("--recompute", action="store_true", help="recompute each block per step (no KV cache)")
    pp.add_argument("--max-past", type=int, default=0, help="bucketed decode plans up to this past length")
    pp.add_argument("--mpi", action="store_true", help="use MPI (automatic under mpirun)")
    pp.add_argument("--timeout", type=float, default=60.0, help="seconds any rank waits for another")
    pp.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    pp.add_argument("--addrs", default=None, help=argparse.SUPPRESS)
    pp.add_argument("--listen-fd", type=int, default=None, help=argparse.SUPPRESS)
    pp.add_argument("--launcher-pid", type=int, default=None, help=argparse.SUPPRESS)
    sampling(pp)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw)
    try:
        if args.cmd == "generate":
            args.max_new_tokens = args.max_new_tokens or 64
            return _run_generate(args.model, args.prompt, args)
        if args.cmd == "demo":
            return _demo(args)
        if args.cmd == "pipeline":
            return _pipeline(args, raw)
        return _info(args)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"rlx: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
