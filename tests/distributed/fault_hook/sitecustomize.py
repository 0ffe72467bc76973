"""A fault for the rank processes of tests/distributed/test_faults.py, which put this directory on
their PYTHONPATH (Python imports sitecustomize at start-up, so it reaches processes the test does
not start itself: the ranks of `python -m rlx pipeline` and of mpirun).

RLX_TEST_FAULT="RANK:CALL:ACTION[:ARG]" acts in the process whose pipeline stage is rank RANK:
    stall, raise           at its CALL-th stage forward (1 = the prefill): sleep (for the test to
                           kill it), or raise RuntimeError("injected fault")
    drop, delay, truncate  at its CALL-th hidden-state send (1 = the prefill's): skip it, send it
                           ARG seconds late, or send only its first half
Just before acting it appends "PID RANK CALL ACTION" to the file RLX_TEST_FAULT_FILE. Without
RLX_TEST_FAULT this file does nothing.
"""

import os

_SPEC = os.environ.get("RLX_TEST_FAULT")


def _install(spec: str) -> None:
    import time

    import numpy as np

    from rlx import stages
    from rlx.distributed import coordinator

    rank, call, action, *arg = spec.split(":")
    rank, call = int(rank), int(call)
    counts = {"forward": 0, "send": 0}

    def note() -> None:
        with open(os.environ["RLX_TEST_FAULT_FILE"], "a") as f:
            f.write(f"{os.getpid()} {rank} {call} {action}\n")
            f.flush()
            os.fsync(f.fileno())

    def hit(kind: str) -> bool:
        counts[kind] += 1
        return counts[kind] == call

    for cls in (stages.PipelineStage, stages.PipelineDecodeStage):
        def forward(self, *a, _orig=cls.__dict__["forward"], **kw):
            if self.rank == rank and action in ("stall", "raise") and hit("forward"):
                note()
                if action == "raise":
                    raise RuntimeError("injected fault")
                time.sleep(3600)
            return _orig(self, *a, **kw)
        cls.forward = forward

    send_array = coordinator.ProcessGroup.send_array

    def faulty_send_array(self, dst, arr):
        if self.rank == rank and action in ("drop", "delay", "truncate") and hit("send"):
            note()
            if action == "drop":
                return None
            if action == "delay":
                time.sleep(float(arg[0]))
            else:
                flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
                arr = flat[: flat.size // 2]
        return send_array(self, dst, arr)

    coordinator.ProcessGroup.send_array = faulty_send_array


if _SPEC:
    _install(_SPEC)
