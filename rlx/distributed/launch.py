"""Running a pipeline from the command line (``python -m rlx pipeline``).

On one host without MPI the launcher binds one loopback listener per rank, then starts one process
per rank, handing each its listener (no port races), the addresses of all, and a fresh random
RLX_DIST_TOKEN (unless one is set already), so that no other process on the host can join the
mesh. Under ``mpirun`` (or with --mpi) every process is a rank already and talks MPI. Each rank
loads only its block of the weights (the safetensors map is lazy: other blocks' pages are never
read). Rank 0 prints the text; every rank prints its per-stage timings (compute, send, wait) when
done.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def under_mpirun() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def run_rank(args, transport) -> int:
    """One rank's whole job: build its stage, generate with the others, report."""
    import rlx
    from rlx.distributed import PipelineCoordinator, ProcessGroup

    rank, world = transport.rank, transport.world
    cfg = rlx.load_config(args.model)
    tok = rlx.Tokenizer.from_pretrained(args.model)
    stage_cls = rlx.PipelineStage if args.recompute else rlx.PipelineDecodeStage
    if args.threads:
        rlx.set_num_threads(args.threads)
    stage = stage_cls(cfg, args.device, rank, world, rlx.load_weights(args.model))
    if args.max_past and not args.recompute:
        stage.with_decode_cache(args.max_past)
    opts = rlx.SampleOpts(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed)
    prompt = tok.encode(args.prompt)
    history = list(prompt)

    def sample_fn(logits):
        t = stage.sample(logits, opts, len(history), history)  # draw index = the new token's position
        history.append(t)
        return t

    eos = set(cfg.eos_token_ids)
    co = PipelineCoordinator(ProcessGroup(transport))
    t0 = time.perf_counter()
    new = co.generate(stage, prompt, args.max_new_tokens, sample_fn, stop_fn=lambda t: t in eos)
    elapsed = time.perf_counter() - t0
    co.barrier()
    if rank == 0:
        text = tok.decode_continuation(prompt, [t for t in new if t not in eos])
        print(args.prompt + text, flush=True)
    t = co.timings
    spec = stage.spec
    sys.stderr.write(  # one write: ranks share stderr
        f"[rlx] rank {rank}/{world} {stage.role.value} layers {spec.layer_begin}..{spec.layer_end - 1}"
        f" ({stage.weight_count()} tensors): {len(new)} tokens in {elapsed:.3f} s ({len(new) / elapsed:.1f} tok/s);"
        f" compute {t['compute']:.3f} s, send {t['send']:.3f} s, wait {t['wait']:.3f} s\n")
    return 0


def die_with_launcher(launcher: int) -> None:
    """Called first thing in a rank process that `spawn` started: SIGTERM comes to it when the
    launcher dies (Linux's PR_SET_PDEATHSIG), so that ranks never outlive a launcher that was
    killed; a launcher already gone ends the rank at once. Elsewhere the ranks end by their own
    timeouts instead."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != launcher:
        raise SystemExit(f"rlx: the launcher (pid {launcher}) is gone")


def spawn(args, argv: list[str]) -> int:
    """Starts args.world rank processes on this host over a loopback TCP mesh; returns the worst exit
    code. A rank that fails makes the others fail within the transport's timeout; the ranks end
    with the launcher if it is killed (die_with_launcher)."""
    from rlx.distributed import free_loopback_addrs

    addrs, listeners = free_loopback_addrs(args.world)
    env = dict(os.environ)
    if not env.get("RLX_DIST_TOKEN"):
        env["RLX_DIST_TOKEN"] = secrets.token_hex(32)   # in the environment: readable by this user only
    procs = []
    try:
        for rank in range(args.world):
            fd = listeners[rank].fileno()
            cmd = [sys.executable, "-m", "rlx", *argv, "--rank", str(rank), "--addrs", ",".join(addrs),
                   "--listen-fd", str(fd), "--launcher-pid", str(os.getpid())]
            procs.append(subprocess.Popen(cmd, pass_fds=(fd,), env=env))
        for s in listeners:
            s.close()
        deadline = time.monotonic() + args.timeout * 4 + 600
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [(r, c) for r, c in enumerate(codes) if c != 0]
    for r, c in bad:
        print(f"rlx: rank {r} exited with status {c}", file=sys.stderr)
    return max((c for _, c in bad), default=0) if bad else 0
