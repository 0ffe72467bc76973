"""The rlx command line.

    python -m rlx generate --model DIR|FILE.gguf --prompt TEXT [--max-new-tokens N] [--temperature T] ...
    echo TEXT | python -m rlx generate --model DIR          # the prompt from stdin
    python -m rlx chat --model DIR [--system TEXT]          # an interactive chat (the model's template)
    python -m rlx serve --model DIR [--host 127.0.0.1 --port 8000]   # OpenAI-compatible HTTP server
    python -m rlx demo      # stories260K from ../shared when present, else a tiny random model
    python -m rlx info      # build facts (BLAS, ISA, backends, threads)
    python -m rlx quantize SRC DST [--type q4_k_m]              # HF dir or GGUF -> GGUF (rlx/quantize.py)
    python -m rlx pipeline --model DIR --world N --prompt TEXT   # N ranks on this host (TCP)
    mpirun -np N python -m rlx pipeline --model DIR --prompt TEXT # N ranks under MPI
    python -m rlx --version

Arguments are checked before anything is loaded or printed; a bad one exits with status 2 and a
message on stderr.
"""

from __future__ import annotations

import argparse
import os
import secrets
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
    t0 = time.perf_counter()
    stream = model.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed, stream=True)
    sys.stdout.write(prompt)  # after the checks that generate makes
    sys.stdout.flush()
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
        args.max_new_tokens = 64 if args.max_new_tokens is None else args.max_new_tokens
        return _run_generate(stories, "Once upon a time", args)
    import rlx

    print("[rlx] demo: ../shared/models/stories260K is not here, so this runs a tiny RANDOM-weight model "
          "that rlx builds itself: the output ids are meaningless, the run is real.", file=sys.stderr)
    with tempfile.TemporaryDirectory() as d:
        _tiny_random_model(d)
        gen = rlx.Generator.from_pretrained(d, device=args.device).with_dynamic_decode_cache()
        gen.prefill([1, 10, 20, 30])
        t0 = time.perf_counter()
        ids = gen.generate_cached(32 if args.max_new_tokens is None else args.max_new_tokens)
        dt = time.perf_counter() - t0
    print("generated ids:", ids)
    print(f"[rlx] {len(ids)} tokens in {dt:.3f} s ({len(ids) / dt:.1f} tok/s)", file=sys.stderr)
    return 0


def _info(args: argparse.Namespace) -> int:
    import rlx

    for k, v in rlx.build_info().items():
        print(f"{k}: {v}")
    return 0


def _quantize(args: argparse.Namespace) -> int:
    import rlx

    t0 = time.perf_counter()
    types = rlx.quantize(args.src, args.dst, type=args.type, progress=not args.quiet, threads=args.threads or None,
                         allow_requantize=args.allow_requantize)
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    size = os.path.getsize(args.dst)
    print(f"[rlx] {args.dst}: {len(types)} tensors ({', '.join(f'{n} {t}' for t, n in sorted(counts.items()))}), "
          f"{size / 2**20:.1f} MiB, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _pipeline(args: argparse.Namespace, argv: list[str]) -> int:
    from rlx.distributed import MpiTransport, TcpTransport
    from rlx.distributed.launch import die_with_launcher, run_rank, spawn, under_mpirun

    args.max_new_tokens = 64 if args.max_new_tokens is None else args.max_new_tokens
    if args.seed is None:  # rank 0 samples; the others never draw
        args.seed = secrets.randbits(63)
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


def _chat(args: argparse.Namespace) -> int:
    """A read-eval-print loop over the model's chat template: each line is a user turn, the reply
    streams to stdout; the conversation's sequence is kept, so a turn prefills only its new tokens.
    /reset starts over, /exit (or end of input) ends; the prefix-reuse totals go to stderr."""
    import rlx

    if args.threads:
        rlx.set_num_threads(args.threads)
    template = None
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            template = f.read()
    model = rlx.load(args.model, device=args.device, chat_template=template)
    if model.chat_template is None:
        raise ValueError(f"{args.model} has no chat template: give one with --chat-template FILE.jinja")
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        print(f"[rlx] chatting with {model.name}; /reset starts over, /exit or Ctrl-D ends", file=sys.stderr)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    turns = 0
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if line.strip() in ("/exit", "/quit"):
            break
        if line.strip() == "/reset":
            messages = list(start)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = []
        try:
            for chunk in model.create_chat_completion(
                    messages, max_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repetition_penalty, seed=args.seed,
                    stream=True):
                delta = chunk["choices"][0]["delta"].get("content", "")
                reply.append(delta)
                sys.stdout.write(delta)
                sys.stdout.flush()
        except KeyboardInterrupt:  # stops this reply; the chat goes on
            sys.stdout.write(" [interrupted]")
        sys.stdout.write("\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": "".join(reply)})
        turns += 1
    st = model.stats
    print(f"[rlx] {turns} turns; prompt tokens {st['prompt_tokens']}, of which {st['cached_tokens']} came from the "
          f"cache (prefix reuse) and {st['prefill_tokens']} were prefilled", file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"the server needs starlette and uvicorn ({e}): pip install 'rlx[serve]'") from None
    import rlx
    from rlx.server import serve

    if args.threads:
        rlx.set_num_threads(args.threads)
    model = rlx.load(args.model, device=args.device, cached_sequences=args.cached_sequences, name=args.name,
                     batch_invariant=args.batch_invariant)
    serve(model, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _number(kind, lo=None, hi=None, lo_open=False):
    """An argparse type: a number of `kind` in the range (checked before anything runs)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text} is outside {'(' if lo_open else '['}{lo}, "
                                             f"{hi if hi is not None else 'inf'}]")
        return v
    return parse


def _existing_path(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text}: no such file or directory")
    return text


def main(argv: list[str] | None = None) -> int:
    import rlx

    p = argparse.ArgumentParser(prog="python -m rlx", description="rlx: LLM inference with a C core.")
    p.add_argument("--version", action="version", version=f"rlx {rlx.__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log rlx's INFO lines to stderr")
    sub = p.add_subparsers(dest="cmd", required=True)

    def sampling(sp: argparse.ArgumentParser, default_tokens: int = 64) -> None:
        sp.add_argument("--max-new-tokens", type=_number(int, 0), default=None,
                        help=f"tokens to generate (default {default_tokens}; 0 generates none)")
        sp.add_argument("--temperature", type=_number(float, 0.0), default=None,
                        help="0 = greedy (default: the model's generation_config, else greedy)")
        sp.add_argument("--top-k", type=_number(int, 0), default=None)
        sp.add_argument("--top-p", type=_number(float, 0.0, 1.0, lo_open=True), default=None)
        sp.add_argument("--min-p", type=_number(float, 0.0, 1.0), default=None)
        sp.add_argument("--repetition-penalty", type=_number(float, 0.0, lo_open=True), default=None)
        sp.add_argument("--seed", type=int, default=None, help="an int reproduces; default: random")
        sp.add_argument("--device", default="cpu", choices=rlx.backends())
        sp.add_argument("--threads", type=_number(int, 0), default=0, help="CPU threads (default: all)")

    g = sub.add_parser("generate", help="generate text from a model directory or GGUF file")
    g.add_argument("--model", required=True, type=_existing_path,
                   help="model directory (config.json, safetensors, tokenizer) or GGUF file")
    g.add_argument("--prompt", default=None, help="the prompt (default: read from stdin)")
    sampling(g)
    c = sub.add_parser("chat", help="an interactive chat over the model's chat template (lines from stdin)")
    c.add_argument("--model", required=True, type=_existing_path)
    c.add_argument("--system", default=None, help="a system message")
    c.add_argument("--chat-template", default=None, type=_existing_path,
                   help="a Jinja chat template file, for a model without one")
    sampling(c, default_tokens=512)
    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    sv.add_argument("--model", required=True, type=_existing_path)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=_number(int, 0, 65535), default=8000, help="0 picks a free port")
    sv.add_argument("--name", default=None, help="the model's name in the API (default: its file or folder name)")
    sv.add_argument("--cached-sequences", type=_number(int, 0), default=4,
                    help="finished requests' sequences kept for prefix reuse (default 4)")
    sv.add_argument("--batch-invariant", action="store_true",
                    help="each request's logits the same whatever others share its steps (slower batches; with "
                         "--cached-sequences 0 its tokens depend on nothing but the request)")
    sv.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    sv.add_argument("--device", default="cpu", choices=rlx.backends())
    sv.add_argument("--threads", type=_number(int, 0), default=0)
    d = sub.add_parser("demo", help="generate with stories260K (or a tiny random model)")
    sampling(d)
    sub.add_parser("info", help="build facts")
    qp = sub.add_parser("quantize", help="write a Hugging Face directory or GGUF file as a (quantised) GGUF file")
    qp.add_argument("src", help="Hugging Face model directory or GGUF file")
    qp.add_argument("dst", help="GGUF file to write")
    qp.add_argument("--type", default="q4_k_m", help="q4_k_m (default), q8_0, q4_0, q6_k, f16, ... "
                    "(rlx/quantize.py lists them all)")
    qp.add_argument("--threads", type=int, default=0, help="quantisation threads (default: all)")
    qp.add_argument("--allow-requantize", action="store_true", help="requantise a source that is already quantised")
    qp.add_argument("--quiet", action="store_true", help="no line per tensor")
    pp = sub.add_parser("pipeline", help="pipeline-parallel generation over N ranks (TCP on this host, or MPI)")
    pp.add_argument("--model", required=True, type=_existing_path)
    pp.add_argument("--prompt", required=True)
    pp.add_argument("--world", type=_number(int, 1), default=2,
                    help="ranks to start on this host (ignored under mpirun)")
    pp.add_argument("--recompute", action="store_true", help="recompute each block per step (no KV cache)")
    pp.add_argument("--max-past", type=_number(int, 0), default=0, help="bucketed decode plans up to this past length")
    pp.add_argument("--mpi", action="store_true", help="use MPI (automatic under mpirun)")
    pp.add_argument("--timeout", type=_number(float, 0.0, lo_open=True), default=60.0,
                    help="seconds any rank waits for another")
    pp.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    pp.add_argument("--addrs", default=None, help=argparse.SUPPRESS)
    pp.add_argument("--listen-fd", type=int, default=None, help=argparse.SUPPRESS)
    pp.add_argument("--launcher-pid", type=int, default=None, help=argparse.SUPPRESS)
    sampling(pp)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw)
    if args.verbose:
        rlx.logs.log_to_stderr()
    if args.cmd == "pipeline":  # the pipeline's SampleOpts take plain values
        for name, off in (("temperature", 0.0), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0),
                          ("repetition_penalty", 1.0)):
            if getattr(args, name) is None:
                setattr(args, name, off)
    try:
        if args.cmd == "generate":
            args.max_new_tokens = 64 if args.max_new_tokens is None else args.max_new_tokens
            prompt = args.prompt
            if prompt is None:
                if sys.stdin.isatty():
                    p.error("generate: give --prompt TEXT, or pipe the prompt on stdin")
                prompt = sys.stdin.read()
                prompt = prompt[:-1] if prompt.endswith("\n") else prompt  # echo's newline
            return _run_generate(args.model, prompt, args)
        if args.cmd == "chat":
            args.max_new_tokens = 512 if args.max_new_tokens is None else args.max_new_tokens
            return _chat(args)
        if args.cmd == "serve":
            return _serve(args)
        if args.cmd == "demo":
            return _demo(args)
        if args.cmd == "pipeline":
            return _pipeline(args, raw)
        if args.cmd == "quantize":
            return _quantize(args)
        return _info(args)
    except (ValueError, TypeError, OSError, RuntimeError) as e:
        # One write: ranks of a pipeline share this stderr, and print() writes the newline apart.
        sys.stderr.write(f"rlx: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
