"""Transports (rlx.distributed.TcpTransport, MpiTransport): meshes of 2-4 ranks on loopback, one thread
per rank (the GIL is released while a rank waits), and the faults: a rank that closes, never
connects, or dies; a bad HELLO (version, world, token, magic) crafted with struct; an oversize and
a truncated frame. Every test joins its threads with a timeout, closes every transport and socket
in finally, and checks that no file descriptor is left open.

The MPI check runs tests/distributed/mpi_transport_check.py under `mpirun -np 3`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import rlx
from rlx.distributed import MpiTransport, TcpTransport, free_loopback_addrs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

HELLO = struct.Struct("<4sHHIIQ")  # magic, version, flags, rank, world, token hash (24 bytes)
FRAME = struct.Struct("<4sIQ")     # magic, tag, length (16 bytes)
MARGIN = 1.5                       # seconds allowed past a timeout


def token_hash(token: str | None) -> int:
    """The 64-bit FNV-1a of csrc/distributed/wire.h (domain prefix with its NUL, then the token)."""
    h = 0xCBF29CE484222325
    for b in b"rlx-dist-token-v1\0" + (token or "").encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def open_fds() -> set[int]:
    return set(int(f) for f in os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_fd_left_behind():
    before = open_fds()
    yield
    deadline = time.monotonic() + 2.0
    while True:
        leaked = {fd for fd in open_fds() - before if os.path.exists(f"/proc/self/fd/{fd}")}
        links = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in leaked if os.path.exists(f"/proc/self/fd/{fd}")}
        sockets = {fd: l for fd, l in links.items() if l.startswith("socket:")}
        if not sockets or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not sockets, f"sockets left open: {sockets}"


def run_ranks(world: int, fn, ranks=None, join_timeout: float = 30.0):
    """Runs fn(rank) on one thread per rank; returns ({rank: result}, {rank: exception})."""
    results, errors = {}, {}

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
               for r in (range(world) if ranks is None else ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after {join_timeout} s: {alive}"
    return results, errors


def mesh(world: int, body, timeout: float = 10.0, **kw):
    """Builds a loopback mesh of `world` ranks and runs body(transport) on each; re-raises the
    first rank's error."""
    addrs, listeners = free_loopback_addrs(world)
    try:
        def fn(r):
            with TcpTransport(r, world, addrs, listener=listeners[r], timeout=timeout, **kw) as t:
                return body(t)
        results, errors = run_ranks(world, fn)
    finally:
        for s in listeners:
            s.close()
    if errors:
        raise next(iter(errors.values()))
    return results


# ------------------------------------------------------------------------------------------------
# Working meshes
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_and_round_trip(world):
    def body(t):
        r, w = t.rank, t.world
        # Ring: small messages fit the socket buffers, so send-then-recv cannot deadlock.
        t.send_array((r + 1) % w, 7, np.full(16, r, dtype=np.float32))
        got = t.recv_array((r - 1) % w, 7, np.empty(16, dtype=np.float32))
        assert np.all(got == (r - 1) % w)
        # Round trips of 8 MiB arrays between rank 0 and every other rank.
        big = np.random.default_rng(r).standard_normal((1024, 2048)).astype(np.float32)
        if r == 0:
            for peer in range(1, w):
                t.send_array(peer, 3, big)
                echo = t.recv_array(peer, 4, np.empty_like(big))
                np.testing.assert_array_equal(echo, big * peer)
        else:
            x = t.recv_array(0, 3, np.empty((1024, 2048), dtype=np.float32))
            t.send_array(0, 4, x * r)
        return t.rank

    assert mesh(world, body) == {r: r for r in range(world)}


def test_messages_arrive_in_order_with_their_tags():
    n = 200

    def body(t):
        if t.rank == 0:
            for i in range(n):
                t.send(1, i % 5, struct.pack("<I", i) * (i % 7))
        else:
            for i in range(n):
                data = t.recv_bytes(0, i % 5, 64)
                assert data == struct.pack("<I", i) * (i % 7)

    mesh(2, body)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_broadcast_from_every_root(world):
    def body(t):
        for root in range(t.world):
            buf = np.arange(1000, dtype=np.float32) + root if t.rank == root else np.zeros(1000, np.float32)
            t.broadcast(root, buf)
            np.testing.assert_array_equal(buf, np.arange(1000, dtype=np.float32) + root)
            ints = np.array([root * 10 + 1, -5] if t.rank == root else [0, 0], dtype=np.int64)
            t.broadcast(root, ints)
            assert ints.tolist() == [root * 10 + 1, -5]

    mesh(world, body)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_barrier_waits_for_every_rank(world):
    arrived = {}

    def body(t):
        time.sleep(0.05 * t.rank)
        arrived[t.rank] = time.monotonic()
        t.barrier()
        left = time.monotonic()
        t.barrier()  # a second one reuses the same frames
        return left

    left = mesh(world, body)
    assert min(left.values()) >= max(arrived.values())


def test_buffers_bytes_and_edge_cases():
    def body(t):
        if t.rank == 0:
            t.send(1, 1, b"")
            t.send(1, 2, bytearray(b"abc"))
            t.send(1, 3, memoryview(b"hello"))
            t.send(1, 4, b"x" * 100)           # too big for the receiver's buffer: discarded
            t.send(1, 5, b"tag")               # received with the wrong tag: discarded
            t.send(1, 6, b"after")
            t.send(1, (1 << 24) - 1, b"max tag")
            with pytest.raises(ValueError, match="itself"):
                t.send(0, 1, b"")
            with pytest.raises(ValueError, match="out of range"):
                t.send(2, 1, b"")
            with pytest.raises(ValueError, match="tag"):
                t.send(1, 1 << 24, b"")
            with pytest.raises(ValueError, match="tag"):
                t.send(1, -1, b"")
            with pytest.raises(ValueError, match="C-contiguous"):
                t.send(1, 1, np.zeros((4, 4), np.float32)[:, 1])
            with pytest.raises(TypeError, match="bytes-like"):
                t.send(1, 1, 3.5)
            with pytest.raises(ValueError, match="float32"):
                t.send_array(1, 1, np.zeros(3, np.float64))
        else:
            buf = bytearray(8)
            assert t.recv(0, 1, buf) == 0
            assert t.recv(0, 2, buf) == 3 and bytes(buf[:3]) == b"abc"
            assert t.recv_bytes(0, 3, 5) == b"hello"
            with pytest.raises(ValueError, match="more than the 8-byte buffer"):
                t.recv(0, 4, buf)
            with pytest.raises(rlx.Error, match="expected a message with tag 9 from rank 0, got one with tag 5"):
                t.recv(0, 9, buf)
            assert t.recv_bytes(0, 6, 16) == b"after"   # the stream stayed in step
            assert t.recv_bytes(0, (1 << 24) - 1, 16) == b"max tag"
            with pytest.raises(ValueError, match="writable"):
                t.recv(0, 1, b"read-only")

    mesh(2, body)


def test_world_of_one_and_lifetime():
    t = TcpTransport(0, 1, ["127.0.0.1:1"], timeout=1)
    assert (t.rank, t.world, t.name, t.closed) == (0, 1, "tcp", False)
    t.barrier()
    buf = np.arange(3, dtype=np.float32)
    t.broadcast(0, buf)
    assert buf.tolist() == [0, 1, 2]
    t.close()
    t.close()  # idempotent
    assert t.closed and "closed" in repr(t)
    with pytest.raises(rlx.Error, match="closed"):
        t.barrier()
    with pytest.raises(rlx.Error, match="closed"):
        t.send(0, 0, b"")


def test_bad_arguments():
    with pytest.raises(ValueError, match="not in a world"):
        TcpTransport(2, 2, ["127.0.0.1:1", "127.0.0.1:2"])
    with pytest.raises(ValueError, match="entries for a world"):
        TcpTransport(0, 2, ["127.0.0.1:1"])
    with pytest.raises(ValueError, match="host:port"):
        TcpTransport(0, 2, ["127.0.0.1:1", "nonsense"], timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        TcpTransport(0, 2, ["127.0.0.1:1", "127.0.0.1:2"], timeout=0)
    addrs, listeners = free_loopback_addrs(2)
    try:
        # A listener is consumed (its duplicate closed) even when the call fails.
        with pytest.raises(ValueError, match="timeout"):
            TcpTransport(0, 2, addrs, listener=listeners[0], timeout=-1)
    finally:
        for s in listeners:
            s.close()


def test_tuple_addresses_and_token_from_environment(monkeypatch):
    monkeypatch.setenv("RLX_DIST_TOKEN", "s3cret")
    addrs, listeners = free_loopback_addrs(2)
    pairs = [(a.split(":")[0], int(a.split(":")[1])) for a in addrs]
    try:
        def fn(r):
            with TcpTransport(r, 2, pairs, listener=listeners[r], timeout=5) as t:
                t.barrier()
                return t.rank
        results, errors = run_ranks(2, fn)
    finally:
        for s in listeners:
            s.close()
    assert not errors and results == {0: 0, 1: 1}


def test_ranks_bind_their_own_addresses():
    # No listener handed over: each rank binds addrs[rank] itself (SO_REUSEADDR), and the higher
    # rank retries its connect until the lower one listens.
    addrs, listeners = free_loopback_addrs(3)
    for s in listeners:
        s.close()

    def fn(r):
        time.sleep(0.3 * (2 - r))  # rank 2 starts first and must wait for the others
        with TcpTransport(r, 3, addrs, timeout=10) as t:
            t.barrier()
            return r

    results, errors = run_ranks(3, fn)
    assert not errors, errors
    assert results == {0: 0, 1: 1, 2: 2}


# ------------------------------------------------------------------------------------------------
# Faults: peers that vanish
# ------------------------------------------------------------------------------------------------

def test_rank_that_never_connects():
    addrs, listeners = free_loopback_addrs(3)
    timeout = 2.0
    try:
        def fn(r):
            start = time.monotonic()
            try:
                TcpTransport(r, 3, addrs, listener=listeners[r], timeout=timeout).close()
            except rlx.Error as e:
                return str(e), time.monotonic() - start
            return "no error", 0.0
        results, errors = run_ranks(3, fn, ranks=[0, 1])
    finally:
        for s in listeners:
            s.close()
    assert not errors
    for r in (0, 1):
        msg, elapsed = results[r]
        assert "rank 2 to connect" in msg, msg
        assert "timed out after 2.0 s" in msg, msg
        assert elapsed < timeout + MARGIN


def test_rank_that_closes_mid_run():
    addrs, listeners = free_loopback_addrs(3)
    timeout = 2.0
    try:
        def fn(r):
            with TcpTransport(r, 3, addrs, listener=listeners[r], timeout=timeout) as t:
                t.barrier()
                if r == 2:
                    return "left", 0.0    # closes its connections
                start = time.monotonic()
                try:
                    t.barrier()           # rank 0 sees rank 2 gone; rank 1 sees rank 0 gone
                except rlx.Error as e:
                    return str(e), time.monotonic() - start
                return "no error", 0.0
        results, errors = run_ranks(3, fn)
    finally:
        for s in listeners:
            s.close()
    assert not errors, errors
    assert "rank 2 closed the connection" in results[0][0], results[0]
    assert "rank 0 closed the connection" in results[1][0], results[1]
    for r in (0, 1):
        assert results[r][1] < timeout + MARGIN


def test_silent_rank_times_out():
    addrs, listeners = free_loopback_addrs(2)
    timeout = 1.0
    release = threading.Event()
    try:
        def fn(r):
            with TcpTransport(r, 2, addrs, listener=listeners[r], timeout=timeout) as t:
                if r == 1:
                    release.wait(10)      # alive but silent
                    return None
                start = time.monotonic()
                try:
                    t.recv(1, 0, bytearray(4))
                except rlx.Error as e:
                    return str(e), time.monotonic() - start
                finally:
                    release.set()
                return "no error", 0.0
        results, errors = run_ranks(2, fn)
    finally:
        release.set()
        for s in listeners:
            s.close()
    assert not errors, errors
    msg, elapsed = results[0]
    assert "timed out after 1.0 s waiting for rank 1" in msg, msg
    assert timeout - 0.1 < elapsed < timeout + MARGIN


def test_rank_process_that_dies():
    """A real process that joins the mesh and then exits abruptly (os._exit): the others raise."""
    addrs, listeners = free_loopback_addrs(2)
    timeout = 3.0
    script = textwrap.dedent(f"""
        import os, sys
        from rlx.distributed import TcpTransport
        t = TcpTransport(1, 2, {addrs!r}, timeout={timeout})
        t.send(0, 1, b"hello")
        os._exit(3)
    """)
    proc = None
    try:
        listeners[1].close()  # the child binds its own address
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
        with TcpTransport(0, 2, addrs, listener=listeners[0], timeout=timeout) as t:
            assert t.recv_bytes(1, 1, 16) == b"hello"
            start = time.monotonic()
            with pytest.raises(rlx.Error, match="rank 1 closed the connection"):
                t.recv_bytes(1, 1, 16)
            assert time.monotonic() - start < timeout + MARGIN
        assert proc.wait(timeout=30) == 3
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for s in listeners:
            s.close()


# ------------------------------------------------------------------------------------------------
# Faults: HELLO refused
# ------------------------------------------------------------------------------------------------

def accept_with_raw_peer(peer_fn, world=2, timeout=2.0, **kw):
    """Rank 0 of `world` builds its mesh while peer_fn(sock) plays rank 1 over a raw socket.
    Returns (rank 0's transport or exception, elapsed, peer_fn's result)."""
    addrs, listeners = free_loopback_addrs(world)
    out = {}
    try:
        def rank0():
            start = time.monotonic()
            try:
                out["t"] = TcpTransport(0, world, addrs, listener=listeners[0], timeout=timeout, **kw)
            except Exception as e:  # noqa: BLE001
                out["t"] = e
            out["elapsed"] = time.monotonic() - start

        th = threading.Thread(target=rank0, daemon=True)
        th.start()
        host, port = addrs[0].split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            peer = peer_fn(s)
            th.join(timeout + 10)
            assert not th.is_alive()
    finally:
        for s in listeners:
            s.close()
    return out["t"], out["elapsed"], peer


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_wrong_protocol_version_is_refused():
    def peer(s):
        s.sendall(HELLO.pack(b"RLXH", 9, 0, 1, 2, token_hash(None)))
        return HELLO.unpack(recv_exact(s, HELLO.size))

    res, elapsed, reply = accept_with_raw_peer(peer)
    assert isinstance(res, rlx.Error), res
    assert "rank 1 sent protocol version 9, expected 1" in str(res)
    # Rank 0 answered with its own HELLO before refusing: version 1, rank 0, world 2.
    assert reply == (b"RLXH", 1, 0, 0, 2, token_hash(None))


def test_wrong_world_size_is_refused_raw():
    def peer(s):
        s.sendall(HELLO.pack(b"RLXH", 1, 0, 1, 5, token_hash(None)))
        return recv_exact(s, HELLO.size)

    res, _, _ = accept_with_raw_peer(peer)
    assert isinstance(res, rlx.Error)
    assert "rank 1 runs with world size 5, expected 2" in str(res)


def test_wrong_world_size_between_ranks():
    addrs, listeners = free_loopback_addrs(3)
    try:
        def fn(r):
            world = 2 if r == 0 else 3
            with TcpTransport(r, world, addrs[:world], listener=listeners[r], timeout=2):
                return "no error"
        results, errors = run_ranks(2, fn)
    finally:
        for s in listeners:
            s.close()
    assert "rank 1 runs with world size 3, expected 2" in str(errors[0])
    assert "rank 0 runs with world size 2, expected 3" in str(errors[1])


def test_wrong_token_is_refused():
    addrs, listeners = free_loopback_addrs(2)
    try:
        def fn(r):
            with TcpTransport(r, 2, addrs, listener=listeners[r], timeout=2, token=["alpha", "beta"][r]):
                return "no error"
        results, errors = run_ranks(2, fn)
    finally:
        for s in listeners:
            s.close()
    assert set(errors) == {0, 1}, (results, errors)
    assert "rank 1 uses a different token than rank 0" in str(errors[0])
    assert "rank 0 uses a different token than rank 1" in str(errors[1])


def test_wrong_token_raw_and_bad_magic():
    def wrong_token(s):
        s.sendall(HELLO.pack(b"RLXH", 1, 0, 1, 2, token_hash("guess")))
        return recv_exact(s, HELLO.size)

    res, _, _ = accept_with_raw_peer(wrong_token, token="right")
    assert isinstance(res, rlx.Error) and "different token" in str(res)

    def http(s):
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            return recv_exact(s, 1)  # nothing is sent back to a non-rlx peer...
        except ConnectionResetError:
            return b""               # ...closed with the rest of its request unread: a reset

    res, _, reply = accept_with_raw_peer(http)
    assert isinstance(res, rlx.Error) and "is not an rlx rank" in str(res), res
    assert reply == b""


def test_peer_claiming_an_impossible_rank():
    def peer(s):
        s.sendall(HELLO.pack(b"RLXH", 1, 0, 0, 2, token_hash(None)))  # "rank 0" connecting to rank 0
        return recv_exact(s, HELLO.size)

    res, _, _ = accept_with_raw_peer(peer)
    assert isinstance(res, rlx.Error) and "says it is rank 0" in str(res), res


def test_peer_that_never_sends_hello():
    res, elapsed, _ = accept_with_raw_peer(lambda s: time.sleep(1.5), timeout=1.0)
    assert isinstance(res, rlx.Error) and "timed out" in str(res) and "HELLO" in str(res), res
    assert elapsed < 1.0 + MARGIN


# ------------------------------------------------------------------------------------------------
# Faults: frames
# ------------------------------------------------------------------------------------------------

def raw_rank1(frames: bytes, linger: float = 0.0):
    """A raw rank 1 that completes a valid HELLO, sends `frames`, and closes."""
    def peer(s):
        s.sendall(HELLO.pack(b"RLXH", 1, 0, 1, 2, token_hash(None)))
        assert HELLO.unpack(recv_exact(s, HELLO.size))[:5] == (b"RLXH", 1, 0, 0, 2)
        s.sendall(frames)
        time.sleep(linger)
    return peer


def test_truncated_frame():
    frames = FRAME.pack(b"RLXF", 5, 4) + b"good" + FRAME.pack(b"RLXF", 5, 1000) + b"only 16 bytes..."
    t, _, _ = accept_with_raw_peer(raw_rank1(frames))
    assert not isinstance(t, Exception), t
    with t:
        assert t.recv_bytes(1, 5, 2000) == b"good"
        with pytest.raises(rlx.Error, match=r"rank 1 closed the connection in the middle of .* \(16 of 1000 bytes\)"):
            t.recv_bytes(1, 5, 2000)
        with pytest.raises(rlx.Error, match="closed after an earlier error"):
            t.recv_bytes(1, 5, 2000)


def test_oversize_frame_from_raw_peer_is_not_read():
    # A header announcing 1 TiB: refused at once, the connection closed, nothing allocated.
    frames = FRAME.pack(b"RLXF", 5, 1 << 40)
    t, _, _ = accept_with_raw_peer(raw_rank1(frames, linger=0.5), max_message_bytes=1024)
    assert not isinstance(t, Exception), t
    with t:
        start = time.monotonic()
        with pytest.raises(rlx.Error, match="1099511627776-byte frame, above max_message_bytes 1024"):
            t.recv_bytes(1, 5, 10)
        assert time.monotonic() - start < 0.5
        with pytest.raises(rlx.Error, match="closed after an earlier error"):
            t.send(1, 5, b"")


def test_bad_frame_magic():
    t, _, _ = accept_with_raw_peer(raw_rank1(b"XXXX" + bytes(12)))
    assert not isinstance(t, Exception), t
    with t, pytest.raises(rlx.Error, match="bad magic"):
        t.recv_bytes(1, 5, 10)


def test_oversize_frame_between_ranks():
    def body(t):
        if t.rank == 1:
            with pytest.raises(ValueError, match="above max_message_bytes"):
                t.send(0, 1, bytes(2 << 20))          # refused before sending anything
            t.send(0, 1, b"small")                     # the connection is still fine
            t.send(0, 2, bytes(4096))                  # rank 0 accepts only 1 KiB
            return None
        assert t.recv_bytes(1, 1, 16) == b"small"
        with pytest.raises(rlx.Error, match="4096-byte frame, above max_message_bytes 1024"):
            t.recv_bytes(1, 2, 1 << 20)
        return None

    addrs, listeners = free_loopback_addrs(2)
    try:
        def fn(r):
            with TcpTransport(r, 2, addrs, listener=listeners[r], timeout=5,
                              max_message_bytes=[1024, 1 << 20][r]) as t:
                return body(t)
        _, errors = run_ranks(2, fn)
    finally:
        for s in listeners:
            s.close()
    assert not errors, errors


# ------------------------------------------------------------------------------------------------
# MPI
# ------------------------------------------------------------------------------------------------

def test_mpi_three_ranks():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev; `make` installs them)")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3",
           sys.executable, os.path.join(HERE, "mpi_transport_check.py")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # mpirun forwards each rank's output on its own schedule: lines may interleave.
    assert sorted(re.findall(r"OK rank (\d+)", proc.stdout)) == ["0", "1", "2"], out


def test_mpi_missing_module_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpi(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "rlx" and fromlist and "_mpi" in fromlist:
            raise ImportError("No module named 'rlx._mpi'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_mpi)
    with pytest.raises(rlx.Error, match="rlx was built without MPI: install libopenmpi-dev"):
        MpiTransport()
