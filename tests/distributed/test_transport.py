"""Transports (rlx.distributed.TcpTransport, MpiTransport): meshes of 2-4 ranks on loopback, with
and without a token, one thread per rank (the GIL is released while a rank waits), and the
faults: a rank that closes, never connects, or dies; an oversize and a truncated frame.

Security (protocol version 3, csrc/distributed/wire.h), against a hand-made peer that speaks the
protocol through Python's own hmac/hashlib (an implementation rlx did not write): a replayed
handshake captured from a good session is refused; a wrong token is refused and what the acceptor
sent before refusing holds nothing derived from the token; reflecting a rank's own HELLO or proof
back at it fails; a frame altered or repeated in transit is detected; a peer sending a byte at a
time cannot stretch a recv past its timeout; stray connections during set-up (a port scan,
garbage, silence, other versions or world sizes, a wrong token, a slow sender) are refused while
the mesh still forms; without a token a non-loopback peer is refused. Each of these fails on
protocol version 1. Every test joins its threads with a timeout, closes every transport and
socket in finally, and checks that no file descriptor is left open.

The MPI check runs tests/distributed/mpi_transport_check.py under `mpirun -np 3`.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
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

# Protocol version 3 (csrc/distributed/wire.h), written out again here from its description.
VERSION = 3
HEAD = struct.Struct("<4sHHII")     # magic, version, info, rank, world (16 bytes)
FRAME = struct.Struct("<4sIQ")      # magic, tag, length (16 bytes)
MSG = 48                            # HELLO and PROOF: HEAD + 32 bytes
FLAG_TOKEN = 1
REFUSE_WORLD, REFUSE_RANK, REFUSE_TOKEN, REFUSE_REMOTE, REFUSE_PROOF, REFUSE_DUPLICATE = range(1, 7)
LABEL_PROOF_C = b"rlx-dist-v3 connector proof"
LABEL_PROOF_A = b"rlx-dist-v3 acceptor proof"
LABEL_KEY_C2A = b"rlx-dist-v3 frames connector to acceptor"
LABEL_KEY_A2C = b"rlx-dist-v3 frames acceptor to connector"
KEY_NO_TOKEN = "rlx-dist-v3 no token"    # the public key of the frame keys without a token
HELLO_V1 = struct.Struct("<4sHHIIQ")  # protocol version 1's HELLO: ..., token hash in clear (24 bytes)
MARGIN = 1.5                          # seconds allowed past a timeout


def token_hash_v1(token: str | None) -> int:
    """What protocol version 1 sent in clear: FNV-1a 64 of a domain prefix (with its NUL) and the token."""
    h = 0xCBF29CE484222325
    for b in b"rlx-dist-token-v1\0" + (token or "").encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def hello(rank: int, world: int, token: str | None = None, version: int = VERSION) -> bytes:
    return HEAD.pack(b"RLXH", version, FLAG_TOKEN if token else 0, rank, world) + os.urandom(32)


def refuse(reason: int, rank: int, world: int) -> bytes:
    return HEAD.pack(b"RLXR", VERSION, reason, rank, world)


def transcript_mac(token: str | None, label: bytes, hello_c: bytes, hello_a: bytes) -> bytes:
    """HMAC(token, label || transcript); without a token, under the public KEY_NO_TOKEN."""
    key = (token or KEY_NO_TOKEN).encode()
    return hmac.new(key, label + b"\0" + hello_c + hello_a, hashlib.sha256).digest()


def proof(rank: int, world: int, token: str, label: bytes, hello_c: bytes, hello_a: bytes) -> bytes:
    return HEAD.pack(b"RLXP", VERSION, 0, rank, world) + transcript_mac(token, label, hello_c, hello_a)


def with_rank(msg: bytes, rank: int) -> bytes:
    """msg with the rank field of its HEAD replaced."""
    return msg[:8] + struct.pack("<I", rank) + msg[12:]


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def recv_to_eof(s) -> bytes:
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


class RawRank:
    """A hand-made connecting rank over a raw socket: the handshake and frames of protocol version 3."""

    def __init__(self, sock, rank: int, world: int, token: str | None = None):
        self.s, self.rank, self.world, self.token = sock, rank, world, token
        self.send_seq = 0

    def handshake(self, peer: int) -> None:
        hc = hello(self.rank, self.world, self.token)
        self.s.sendall(hc)
        ha = recv_exact(self.s, MSG)
        assert ha[:16] == HEAD.pack(b"RLXH", VERSION, FLAG_TOKEN if self.token else 0, peer, self.world), ha
        if self.token:
            self.s.sendall(proof(self.rank, self.world, self.token, LABEL_PROOF_C, hc, ha))
            pa = recv_exact(self.s, MSG)
            assert pa == proof(peer, self.world, self.token, LABEL_PROOF_A, hc, ha), pa
        self.send_key = transcript_mac(self.token, LABEL_KEY_C2A, hc, ha)

    def frame(self, tag: int, payload: bytes) -> bytes:
        """A frame with its MAC (keyed by the token, or without one by public bytes)."""
        head = FRAME.pack(b"RLXF", tag, len(payload))
        mac = hmac.new(self.send_key, struct.pack("<Q", self.send_seq) + head + payload, hashlib.sha256).digest()
        self.send_seq += 1
        return head + payload + mac


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

@pytest.mark.parametrize("token", [None, "s3cret-token"], ids=["no-token", "token"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_and_round_trip(world, token):
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

    assert mesh(world, body, token=token) == {r: r for r in range(world)}


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


@pytest.mark.parametrize("token", [None, "s3cret-token"], ids=["no-token", "token"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_broadcast_from_every_root(world, token):
    def body(t):
        for root in range(t.world):
            buf = np.arange(1000, dtype=np.float32) + root if t.rank == root else np.zeros(1000, np.float32)
            t.broadcast(root, buf)
            np.testing.assert_array_equal(buf, np.arange(1000, dtype=np.float32) + root)
            ints = np.array([root * 10 + 1, -5] if t.rank == root else [0, 0], dtype=np.int64)
            t.broadcast(root, ints)
            assert ints.tolist() == [root * 10 + 1, -5]

    mesh(world, body, token=token)


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


@pytest.mark.parametrize("token", [None, "s3cret-token"], ids=["no-token", "token"])
def test_buffers_bytes_and_edge_cases(token):
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

    mesh(2, body, token=token)


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
# Handshakes refused
# ------------------------------------------------------------------------------------------------

def accept_with_raw_peer(peer_fn, world=2, timeout=2.0, then_rank1=False, **kw):
    """Rank 0 of `world` builds its mesh while peer_fn(sock) talks to it over a raw socket. With
    then_rank1 the real rank 1 (a TcpTransport, same options) connects afterwards and a message
    crosses the mesh: rank 0's result is then "mesh formed". Returns (rank 0's transport, its
    exception or "mesh formed", elapsed, peer_fn's result)."""
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
            if then_rank1:
                with TcpTransport(1, world, addrs, listener=listeners[1], timeout=timeout, **kw) as t1:
                    th.join(timeout + 10)
                    t0 = out["t"]
                    if not isinstance(t0, Exception):
                        with t0:
                            t1.send(0, 5, b"real rank 1")
                            assert t0.recv_bytes(1, 5, 64) == b"real rank 1"
                        out["t"] = "mesh formed"
            th.join(timeout + 10)
            assert not th.is_alive()
    finally:
        for s in listeners:
            s.close()
    return out["t"], out["elapsed"], peer


@pytest.mark.parametrize("version", [2, 9], ids=["previous-release", "unknown"])
def test_wrong_protocol_version_is_refused(version):
    def peer(s):
        s.sendall(HEAD.pack(b"RLXH", version, 0, 1, 2) + bytes(32))
        return recv_to_eof(s)

    res, _, reply = accept_with_raw_peer(peer, timeout=1.0)
    assert isinstance(res, rlx.Error), res
    assert "rank 1 (at 127.0.0.1:" in str(res), res
    assert f"sent protocol version {version}, expected {VERSION}" in str(res), res
    # Rank 0 answered with its HELLO (so the peer can name the version), then closed.
    assert len(reply) == MSG and reply[:16] == HEAD.pack(b"RLXH", VERSION, 0, 0, 2)


def test_protocol_version_1_peer_learns_the_version():
    """A rank of the previous release: its 24-byte HELLO is refused, and the first 24 bytes of the
    answer, read with version 1's layout, give the current version."""
    def peer(s):
        s.sendall(HELLO_V1.pack(b"RLXH", 1, 0, 1, 2, token_hash_v1(None)))
        return recv_to_eof(s)

    res, _, reply = accept_with_raw_peer(peer, then_rank1=True)
    assert res == "mesh formed", res
    assert HELLO_V1.unpack(reply[:24])[:5] == (b"RLXH", VERSION, 0, 0, 2)


def test_wrong_world_size_is_refused_raw():
    def peer(s):
        s.sendall(hello(1, 5))
        return recv_to_eof(s)

    res, _, reply = accept_with_raw_peer(peer, timeout=1.0)
    assert isinstance(res, rlx.Error)
    assert "rank 1 runs with world size 5, expected 2" in str(res), res
    assert reply == refuse(REFUSE_WORLD, 0, 2)


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


def test_wrong_token_between_ranks():
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
    assert "refused rank 1's proof of the token: the ranks use different tokens" in str(errors[1]), errors[1]
    assert "rank 0 is still waiting for rank 1" in str(errors[0]), errors[0]
    assert "sent a wrong proof of the token" in str(errors[0]), errors[0]


def test_token_on_one_side_only():
    addrs, listeners = free_loopback_addrs(2)
    try:
        def fn(r):
            with TcpTransport(r, 2, addrs, listener=listeners[r], timeout=2, token=["alpha", ""][r]):
                return "no error"
        _, errors = run_ranks(2, fn)
    finally:
        for s in listeners:
            s.close()
    assert "rank 0 has a token and rank 1 has no token" in str(errors[1]), errors[1]
    assert "rank 1 (at 127.0.0.1:" in str(errors[0]) and "has no token" in str(errors[0]), errors[0]


def test_bad_magic_gets_no_answer():
    def http(s):
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return recv_to_eof(s)   # nothing is sent back to a non-rlx peer

    res, _, reply = accept_with_raw_peer(http, timeout=1.0)
    assert isinstance(res, rlx.Error) and "is not an rlx rank" in str(res), res
    assert reply == b""


def test_peer_claiming_an_impossible_rank():
    def peer(s):
        s.sendall(hello(0, 2))   # "rank 0" connecting to rank 0
        return recv_to_eof(s)

    res, _, reply = accept_with_raw_peer(peer, timeout=1.0)
    assert isinstance(res, rlx.Error) and "says it is rank 0" in str(res), res
    assert reply == refuse(REFUSE_RANK, 0, 2)


def test_peer_that_never_sends_hello():
    res, elapsed, _ = accept_with_raw_peer(lambda s: time.sleep(1.5), timeout=1.0)
    assert isinstance(res, rlx.Error) and "timed out" in str(res) and "rank 1 to connect" in str(res), res
    assert "still in its handshake" in str(res), res
    assert elapsed < 1.0 + MARGIN


# ------------------------------------------------------------------------------------------------
# Attacks on the handshake (each of these succeeded against protocol version 1)
# ------------------------------------------------------------------------------------------------

class Proxy:
    """A man in the middle for one connection to `target`: records both directions; can flip one
    byte of the connector's stream (at offset flip_at) or send a range of it a second time."""

    def __init__(self, target: str, flip_at: int | None = None, repeat: tuple[int, int] | None = None):
        self.target = target
        self.flip_at, self.repeat = flip_at, repeat
        self.c2a, self.a2c = bytearray(), bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.socks: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._run, daemon=True)]
        self.threads[0].start()

    def _run(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        host, port = self.target.split(":")
        up = socket.create_connection((host, int(port)))
        self.socks += [conn, up]
        for src, dst, rec, edit in ((conn, up, self.c2a, True), (up, conn, self.a2c, False)):
            th = threading.Thread(target=self._pump, args=(src, dst, rec, edit), daemon=True)
            self.threads.append(th)
            th.start()

    def _pump(self, src, dst, record, edit):
        off, repeated = 0, False
        try:
            while data := src.recv(65536):
                buf = bytearray(data)
                if edit and self.flip_at is not None and off <= self.flip_at < off + len(buf):
                    buf[self.flip_at - off] ^= 0x01
                record += data
                due = edit and self.repeat and not repeated and off + len(buf) >= self.repeat[1]
                cut = self.repeat[1] - off if due else len(buf)
                dst.sendall(buf[:cut])
                if due:   # the range goes again right after its own end
                    dst.sendall(bytes(record[self.repeat[0]:self.repeat[1]]))
                    repeated = True
                dst.sendall(buf[cut:])
                off += len(buf)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        self.listener.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for th in self.threads:
            th.join(10)
        for s in self.socks:
            s.close()


def test_replayed_handshake_is_refused():
    token = "correct horse battery staple"
    # 1. A good session, rank 1 -> rank 0 through a recording proxy.
    addrs, listeners = free_loopback_addrs(2)
    proxy = Proxy(addrs[0])
    try:
        def fn(r):
            view = addrs if r == 0 else [proxy.addr, addrs[1]]
            with TcpTransport(r, 2, view, listener=listeners[r], timeout=5, token=token) as t:
                if r == 1:
                    t.send(0, 7, b"genuine")
                else:
                    assert t.recv_bytes(1, 7, 64) == b"genuine"
                t.barrier()
        _, errors = run_ranks(2, fn)
    finally:
        proxy.close()
        for s in listeners:
            s.close()
    assert not errors, errors
    captured, answers = bytes(proxy.c2a), bytes(proxy.a2c)
    assert captured[:4] == b"RLXH" and captured[MSG:MSG + 4] == b"RLXP", captured[:100]
    # Nothing secret on the wire: not the token, not version 1's hash of it.
    for secret in (token.encode(), struct.pack("<Q", token_hash_v1(token))):
        assert secret not in captured and secret not in answers

    # 2. The captured HELLO and proof, replayed to a fresh rank 0 with the same token.
    def replay(s):
        s.sendall(captured[:2 * MSG])
        return recv_to_eof(s)

    res, _, reply = accept_with_raw_peer(replay, timeout=5.0, then_rank1=True, token=token)
    assert reply[:16] == HEAD.pack(b"RLXH", VERSION, FLAG_TOKEN, 0, 2), reply
    assert reply[MSG:] == refuse(REFUSE_PROOF, 0, 2), reply   # refused, and no proof of rank 0
    assert res == "mesh formed", res                            # the real rank 1 still got in


def test_wrong_token_is_refused_before_anything_token_derived_is_sent():
    token = "the real token"

    def guess(s):
        seen = []
        for _ in range(2):   # twice: the acceptor's nonce must be fresh each time
            c = s if not seen else socket.create_connection(s.getpeername(), timeout=5)
            try:
                hc = hello(1, 2, token="a guess")
                c.sendall(hc)
                ha = recv_exact(c, MSG)
                c.sendall(proof(1, 2, "a guess", LABEL_PROOF_C, hc, ha))
                seen.append((hc, ha, recv_to_eof(c)))
            finally:
                if c is not s:
                    c.close()
        return seen

    res, _, seen = accept_with_raw_peer(guess, timeout=5.0, then_rank1=True, token=token)
    assert res == "mesh formed", res
    for hc, ha, rest in seen:
        # Everything the attacker received: rank 0's HELLO (public fields + a nonce), then REFUSE.
        assert ha[:16] == HEAD.pack(b"RLXH", VERSION, FLAG_TOKEN, 0, 2) and len(ha) == MSG, ha
        assert rest == refuse(REFUSE_PROOF, 0, 2), rest
        received = ha + rest
        derived = [token.encode(), struct.pack("<Q", token_hash_v1(token))]
        derived += [transcript_mac(token, label, hc, ha)
                    for label in (LABEL_PROOF_C, LABEL_PROOF_A, LABEL_KEY_C2A, LABEL_KEY_A2C)]
        for d in derived:
            assert d not in received and d[:8] not in received
    assert seen[0][1][16:] != seen[1][1][16:]   # fresh nonces


def test_reflection_back_to_the_acceptor_fails():
    token = "tok"

    def mirror(s):
        hc = hello(1, 2, token=token)   # any HELLO: the attacker has no proof to give
        s.sendall(hc)
        ha = recv_exact(s, MSG)
        # The acceptor's own material presented back to it as the proof.
        s.sendall(HEAD.pack(b"RLXP", VERSION, 0, 1, 2) + ha[16:])
        return ha + recv_to_eof(s)

    res, _, reply = accept_with_raw_peer(mirror, timeout=5.0, then_rank1=True, token=token)
    assert reply[MSG:] == refuse(REFUSE_PROOF, 0, 2), reply
    assert res == "mesh formed", res


@pytest.mark.parametrize("what", ["hello", "proof"])
def test_reflection_back_to_the_connector_fails(what):
    """A fake rank 0 on rank 0's address mirrors rank 1's own HELLO (or its proof) back to it."""
    token = "tok"
    fake = socket.create_server(("127.0.0.1", 0))
    addrs = [f"127.0.0.1:{fake.getsockname()[1]}", "127.0.0.1:1"]  # rank 1 (the last) does not listen

    def fake_rank0():
        conn, _ = fake.accept()
        with conn:
            hc = recv_exact(conn, MSG)
            if what == "hello":
                conn.sendall(with_rank(hc, 0))
            else:
                conn.sendall(hello(0, 2, token=token))
                conn.sendall(with_rank(recv_exact(conn, MSG), 0))
            recv_to_eof(conn)

    th = threading.Thread(target=fake_rank0, daemon=True)
    th.start()
    try:
        with pytest.raises(rlx.Error) as e:
            TcpTransport(1, 2, addrs, timeout=3, token=token)
    finally:
        th.join(10)
        fake.close()
    expect = "own nonce (a reflected HELLO)" if what == "hello" else "failed to prove that it knows the token"
    assert expect in str(e.value), e.value


@pytest.mark.parametrize("token", [None, "tok"], ids=["no-token", "token"])
@pytest.mark.parametrize("attack", ["flip", "repeat"])
def test_frames_altered_in_transit(attack, token):
    """Every frame carries a MAC over its sequence number: a flipped byte or a frame sent twice is
    an error. Without a token too (protocol version 2 delivered the altered payload there): its keys
    come from public bytes, so it catches faults in transit, though not a forger."""
    hs = 2 * MSG if token else MSG                     # the connector's handshake bytes
    first = 16 + 8 + 32                                # its first frame: header, 8 bytes, MAC
    proxy = Proxy("", flip_at=hs + 16 + 3 if attack == "flip" else None,
                  repeat=(hs, hs + first) if attack == "repeat" else None)
    addrs, listeners = free_loopback_addrs(2)
    proxy.target = addrs[0]
    done = threading.Event()
    try:
        def fn(r):
            view = addrs if r == 0 else [proxy.addr, addrs[1]]
            with TcpTransport(r, 2, view, listener=listeners[r], timeout=5, token=token) as t:
                if r == 1:
                    t.send(0, 7, b"12345678")
                    t.send(0, 8, b"second!!")
                    done.wait(10)
                    return None
                try:
                    got = [t.recv_bytes(1, 7, 64)]
                    got.append(t.recv_bytes(1, 8, 64))
                    return got
                except rlx.Error as e:
                    with pytest.raises(rlx.Error, match="closed after an earlier error"):
                        t.recv_bytes(1, 8, 64)
                    return e
                finally:
                    done.set()
        results, errors = run_ranks(2, fn)
    finally:
        done.set()
        proxy.close()
        for s in listeners:
            s.close()
    assert not errors, errors
    assert isinstance(results[0], rlx.Error), results[0]
    assert "failed its integrity check" in str(results[0]), results[0]


# ------------------------------------------------------------------------------------------------
# Deadlines and strays
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("token", [None, "tok"], ids=["no-token", "token"])
def test_byte_a_second_sender_hits_the_deadline(token):
    """A peer that trickles a frame one byte at a time: the recv ends at its timeout (it used to
    wait as long as the bytes kept coming)."""
    timeout, stop = 1.0, threading.Event()

    def trickle(s, link):
        data = link.frame(5, b"x" * 64)
        for i in range(len(data)):
            if stop.wait(0.2):
                return
            try:
                s.send(data[i:i + 1])
            except OSError:
                return

    def peer(s):
        link = RawRank(s, 1, 2, token)
        link.handshake(0)
        th = threading.Thread(target=trickle, args=(s, link), daemon=True)
        th.start()
        return th

    addrs, listeners = free_loopback_addrs(2)
    out = {}
    try:
        def rank0():
            out["t"] = TcpTransport(0, 2, addrs, listener=listeners[0], timeout=timeout, token=token)

        r0 = threading.Thread(target=rank0, daemon=True)
        r0.start()
        with socket.create_connection(("127.0.0.1", int(addrs[0].split(":")[1])), timeout=5) as s:
            th = peer(s)
            r0.join(10)
            with out["t"] as t:
                start = time.monotonic()
                with pytest.raises(rlx.Error, match=r"timed out after 1\.0 s waiting for rank 1 .*stalled after"):
                    t.recv_bytes(1, 5, 64)
                elapsed = time.monotonic() - start
            stop.set()
            th.join(10)
    finally:
        stop.set()
        for s in listeners:
            s.close()
    assert timeout - 0.1 < elapsed < timeout + MARGIN, elapsed


def open_strays(addr: str, world: int, token: str | None, strays: list, threads: list, stop: threading.Event):
    """Connections to a listener that are not ranks of the job: each must be refused while the
    real ranks get through. Every socket goes to `strays` (the caller closes them)."""
    host, port = addr.split(":")
    claim = world - 1   # a rank this listener would accept

    def conn():
        s = socket.create_connection((host, int(port)), timeout=10)
        strays.append(s)
        return s

    conn().close()                                                       # a port scanner
    conn().sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")                 # another protocol
    conn()                                                               # silence
    conn().sendall(os.urandom(48))                                       # noise
    conn().sendall(HEAD.pack(b"RLXH", 9, 0, claim, world) + bytes(32))   # another protocol version
    conn().sendall(HELLO_V1.pack(b"RLXH", 1, 0, claim, world, token_hash_v1(token)))   # version 1
    conn().sendall(hello(claim, world + 1, token))                       # another world size
    conn().sendall(hello(claim, world, None if token else "a token"))    # token on one side only
    conn().sendall(hello(claim, world, token)[:20])                      # a HELLO cut short

    def trickle(s, data):
        for i in range(len(data)):
            if stop.wait(0.1):
                return
            try:
                s.send(data[i:i + 1])
            except OSError:
                return

    def wrong_token(s):
        hc = hello(claim, world, "a guess")
        try:
            s.sendall(hc)
            ha = recv_exact(s, MSG)
            s.sendall(proof(claim, world, "a guess", LABEL_PROOF_C, hc, ha))
        except OSError:
            pass

    jobs = [(trickle, (conn(), hello(claim, world + 1, token)))]         # slow, and wrong
    if token:
        jobs.append((wrong_token, (conn(),)))                            # the wrong token
        jobs.append((lambda s: s.sendall(hello(claim, world, token)), (conn(),)))   # never proves
    for fn, args in jobs:
        th = threading.Thread(target=fn, args=args, daemon=True)
        threads.append(th)
        th.start()


@pytest.mark.parametrize("token", [None, "tok"], ids=["no-token", "token"])
@pytest.mark.parametrize("world", [2, 3])
def test_stray_connections_during_setup_are_ignored(world, token):
    addrs, listeners = free_loopback_addrs(world)
    strays, threads, stop = [], [], threading.Event()
    try:
        for r in range(world - 1):   # every rank that listens
            open_strays(addrs[r], world, token, strays, threads, stop)
        start = time.monotonic()

        def fn(r):
            with TcpTransport(r, world, addrs, listener=listeners[r], timeout=10, token=token) as t:
                ready = time.monotonic() - start
                t.send_array((r + 1) % world, 1, np.full(4, r, np.float32))
                got = t.recv_array((r - 1) % world, 1, np.empty(4, np.float32))
                t.barrier()
                return ready, got[0]
        results, errors = run_ranks(world, fn)
    finally:
        stop.set()
        for th in threads:
            th.join(10)
        for s in strays:
            s.close()
        for s in listeners:
            s.close()
    assert not errors, errors
    for r, (ready, got) in results.items():
        assert got == (r - 1) % world
        assert ready < 5.0, ready   # the strays did not hold set-up until its timeout


# ------------------------------------------------------------------------------------------------
# Without a token: loopback only
# ------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this host that is not loopback (SIOCGIFADDR per interface), or None."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        ip = socket.inet_ntoa(packed[20:24])
        if not ip.startswith("127."):
            return ip
    return None


def test_non_loopback_addresses_need_a_token_or_allow_remote(monkeypatch):
    monkeypatch.delenv("RLX_DIST_TOKEN", raising=False)
    monkeypatch.delenv("RLX_DIST_ALLOW_REMOTE", raising=False)
    # TEST-NET-1 addresses: refused before anything is sent, by every rank (not only by those
    # that would connect to them).
    with pytest.raises(ValueError, match="rank 1, 192.0.2.1:2, is not a loopback address; without a token"):
        TcpTransport(0, 2, ["127.0.0.1:1", "192.0.2.1:2"], timeout=1)
    with pytest.raises(ValueError, match="rank 0, 192.0.2.1:1, is not a loopback"):
        TcpTransport(1, 2, ["192.0.2.1:1", "127.0.0.1:2"], timeout=1)
    monkeypatch.setenv("RLX_DIST_ALLOW_REMOTE", "1")   # the opt-in: rank 0 then just waits for rank 1
    with pytest.raises(rlx.Error, match="still waiting for rank 1"):
        TcpTransport(0, 2, [f"127.0.0.1:{free_port()}", "192.0.2.1:2"], timeout=0.3)


@pytest.mark.skipif(non_loopback_ipv4() is None, reason="this host has no non-loopback IPv4 address")
@pytest.mark.parametrize("allow_remote", [False, True])
def test_without_token_a_non_loopback_peer_is_refused(allow_remote, monkeypatch):
    monkeypatch.delenv("RLX_DIST_TOKEN", raising=False)
    ip = non_loopback_ipv4()
    listener = socket.create_server(("0.0.0.0", 0), backlog=64)
    port = listener.getsockname()[1]
    addrs = [f"127.0.0.1:{port}", "127.0.0.1:1"]
    out = {}
    try:
        def rank0():
            try:
                out["t"] = TcpTransport(0, 2, addrs, listener=listener, timeout=3, allow_remote=allow_remote)
            except Exception as e:  # noqa: BLE001
                out["t"] = e

        th = threading.Thread(target=rank0, daemon=True)
        th.start()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
            s.connect((ip, port))       # from a non-loopback address of this host
            s.sendall(hello(1, 2))
            if allow_remote:
                reply = recv_exact(s, MSG)
                th.join(10)
                assert reply[:16] == HEAD.pack(b"RLXH", VERSION, 0, 0, 2)
                assert not isinstance(out["t"], Exception), out["t"]
                out["t"].close()
                return
            reply = recv_to_eof(s)
        assert reply == refuse(REFUSE_REMOTE, 0, 2), reply
        # The real rank 1 over loopback still gets in.
        with TcpTransport(1, 2, addrs, timeout=3) as t1:
            th.join(10)
            with out["t"] as t0:
                t1.send(0, 1, b"loopback")
                assert t0.recv_bytes(1, 1, 16) == b"loopback"
    finally:
        th.join(10)
        listener.close()


@pytest.mark.skipif(non_loopback_ipv4() is None, reason="this host has no non-loopback IPv4 address")
@pytest.mark.parametrize("token, allow_remote", [("tok", False), (None, True)])
def test_mesh_over_a_non_loopback_address(token, allow_remote, monkeypatch):
    monkeypatch.delenv("RLX_DIST_TOKEN", raising=False)
    ip = non_loopback_ipv4()
    listeners = [socket.create_server((ip, 0)) for _ in range(3)]
    addrs = [f"{ip}:{s.getsockname()[1]}" for s in listeners]
    try:
        def fn(r):
            with TcpTransport(r, 3, addrs, listener=listeners[r], timeout=5, token=token,
                              allow_remote=allow_remote) as t:
                buf = np.arange(8, dtype=np.float32) if r == 2 else np.zeros(8, np.float32)
                t.broadcast(2, buf)
                return buf.tolist()
        results, errors = run_ranks(3, fn)
    finally:
        for s in listeners:
            s.close()
    assert not errors, errors
    assert all(v == list(range(8)) for v in results.values())


# ------------------------------------------------------------------------------------------------
# Faults: frames
# ------------------------------------------------------------------------------------------------

def raw_rank1(frames, linger: float = 0.0):
    """A raw rank 1 that completes a valid handshake (no token), sends `frames` (bytes, or a
    function of its RawRank giving them), and closes."""
    def peer(s):
        link = RawRank(s, 1, 2)
        link.handshake(0)
        s.sendall(frames(link) if callable(frames) else frames)
        time.sleep(linger)
    return peer


def test_truncated_frame():
    def frames(link):
        return link.frame(5, b"good") + FRAME.pack(b"RLXF", 5, 1000) + b"only 16 bytes..."
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


@pytest.mark.parametrize("token", [None, "tok"], ids=["no-token", "token"])
def test_raw_peer_frames_byte_exact(token):
    """A hand-made rank, with the token or without one: its frames (MAC'd with Python's hmac, under
    keys from the token or from the public KEY_NO_TOKEN) are accepted, one with a wrong MAC is not."""
    def peer(s):
        link = RawRank(s, 1, 2, token)
        link.handshake(0)
        good = link.frame(5, b"hand-made")
        bad = bytearray(link.frame(5, b"forged!!"))
        bad[-1] ^= 0x80
        s.sendall(good + bytes(bad))
        time.sleep(0.5)

    t, _, _ = accept_with_raw_peer(peer, token=token)
    assert not isinstance(t, Exception), t
    with t:
        assert t.recv_bytes(1, 5, 64) == b"hand-made"
        with pytest.raises(rlx.Error, match="failed its integrity check"):
            t.recv_bytes(1, 5, 64)


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
