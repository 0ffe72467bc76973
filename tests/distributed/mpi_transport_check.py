"""The MPI transport under a real mpirun (run by tests/distributed/test_transport.py::test_mpi_three_ranks):

    mpirun --allow-run-as-root --oversubscribe -np 3 .venv/bin/python tests/distributed/mpi_transport_check.py

Every rank checks send/recv (a ring, ordering, tags, a buffer too small), broadcast from every
root, and barrier, then prints "OK rank N". Any failure raises (non-zero exit; mpirun ends the job).
"""

import sys
import time

import numpy as np

import rlx
from rlx.distributed import MpiTransport


def main() -> None:
    t = MpiTransport(timeout=30, max_message_bytes=1 << 20)
    r, w = t.rank, t.world
    assert t.name == "mpi" and w >= 2, (t.name, w)

    # Ring of float32 arrays.
    t.send_array((r + 1) % w, 7, np.full(1000, r, dtype=np.float32))
    got = t.recv_array((r - 1) % w, 7, np.empty(1000, dtype=np.float32))
    assert np.all(got == (r - 1) % w)

    # Ordering and tags between rank 0 and rank 1; a too-small buffer; a wrong tag.
    if r == 0:
        for i in range(50):
            t.send(1, i % 3, np.array([i], dtype=np.int64))
        t.send(1, 9, bytes(64))
        t.send(1, 8, b"wrong tag")
        t.send(1, 10, b"after")
    elif r == 1:
        for i in range(50):
            assert np.frombuffer(t.recv_bytes(0, i % 3, 8), dtype=np.int64)[0] == i
        try:
            t.recv(0, 9, bytearray(8))
            raise AssertionError("a 64-byte message fit an 8-byte buffer")
        except ValueError as e:
            assert "more than the 8-byte buffer" in str(e), e
        try:
            t.recv(0, 11, bytearray(16))
            raise AssertionError("a wrong tag was accepted")
        except rlx.Error as e:
            assert "expected a message with tag 11 from rank 0, got one with tag 8" in str(e), e
        assert t.recv_bytes(0, 10, 16) == b"after"

    # Sends above max_message_bytes are refused locally.
    try:
        t.send((r + 1) % w, 1, bytes(2 << 20))
        raise AssertionError("an oversize send was accepted")
    except ValueError as e:
        assert "max_message_bytes" in str(e), e

    # Broadcast from every root.
    for root in range(w):
        buf = np.arange(100, dtype=np.float32) * (root + 1) if r == root else np.zeros(100, np.float32)
        t.broadcast(root, buf)
        assert np.array_equal(buf, np.arange(100, dtype=np.float32) * (root + 1))

    # Barrier: nobody leaves before the slowest rank arrives.
    time.sleep(0.1 * r)
    arrived = np.array([time.time()], dtype=np.float64)
    t.barrier()
    left = time.time()
    latest = np.zeros(1, np.float64)
    for root in range(w):
        b = arrived.copy() if r == root else np.zeros(1, np.float64)
        t.broadcast(root, b)
        latest[0] = max(latest[0], b[0])
    assert left >= latest[0] - 0.01, (left, latest[0])

    # A second transport (collective) with a short timeout: recv gives up when nothing comes, and
    # the transport stays usable (nothing was matched).
    t2 = MpiTransport(timeout=0.5)
    if r == 0:
        start = time.monotonic()
        try:
            t2.recv(1, 3, bytearray(4))
            raise AssertionError("recv returned without a message")
        except rlx.Error as e:
            assert "timed out after 0.5 s waiting for rank 1" in str(e), e
        assert 0.4 < time.monotonic() - start < 5.0
    t.barrier()     # not t2's: the others would wait longer than its 0.5 s for rank 0
    t2.barrier()
    t2.close()
    t.barrier()
    t.close()
    try:
        t.barrier()
        raise AssertionError("a closed transport still worked")
    except rlx.Error as e:
        assert "closed" in str(e)
    sys.stdout.write(f"OK rank {r}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
