"""One rank of a pipeline job as its own process, for tests/distributed/test_faults.py:

    fault_rank.py MODEL_DIR N TIMEOUT tcp RANK WORLD ADDRS LISTEN_FD   (ADDRS comma-separated)
    mpirun -np W python fault_rank.py MODEL_DIR N TIMEOUT mpi

Runs stories260K's greedy generation of N tokens after "Once upon a time" (KV-cached stages) and
a barrier, as `python -m rlx pipeline` does, then prints "OK rank R ids a,b,..." and exits 0. An
rlx.Error prints "ERROR rank R after S s: message" (S: seconds since the job's first step) and
exits 3; anything else is a traceback and exit 1. Faults come from fault_hook/sitecustomize.py.
"""

import socket
import sys
import time

import rlx
from rlx.distributed import MpiTransport, PipelineCoordinator, ProcessGroup, TcpTransport

PROMPT = [1, 403, 407, 261, 378]  # "Once upon a time" with stories260K's tokenizer


def main() -> int:
    model, n, timeout, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    rlx.set_num_threads(1)
    cfg, weights = rlx.load_config(model), rlx.load_weights(model)
    if kind == "tcp":
        rank, world, addrs, fd = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7].split(","), int(sys.argv[8])
        transport = TcpTransport(rank, world, addrs, listener=socket.socket(fileno=fd), timeout=timeout)
    else:
        transport = MpiTransport(timeout=timeout)
    start = None
    try:
        with transport as t:
            stage = rlx.PipelineDecodeStage(cfg, "cpu", t.rank, t.world, weights)
            co = PipelineCoordinator(ProcessGroup(t))
            start = time.monotonic()
            ids = co.generate(stage, PROMPT, n, lambda logits: stage.sample(logits))
            co.barrier()
    except rlx.Error as e:
        elapsed = time.monotonic() - start if start is not None else 0.0
        print(f"ERROR rank {transport.rank} after {elapsed:.2f} s: {e}", flush=True)
        return 3
    print(f"OK rank {transport.rank} ids {','.join(map(str, ids))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
