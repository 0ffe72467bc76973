"""Transports between the ranks of a pipeline: a TCP mesh (in rlx._C) and MPI (rlx._mpi, built
when Open MPI's mpicc is present). Both are one C interface (csrc/include/rlx/dist.h) behind one
Python class, ``Transport``.

Every call blocks until it completes, fails, or the timeout passes; failures raise ``rlx.Error``
(I/O, a peer gone, a refused handshake, a timeout) or ``ValueError`` (bad arguments, a message larger
than the buffer given). The GIL is released while waiting, so ranks may run as threads of one
process (the tests do).

    addrs, listeners = free_loopback_addrs(2)
    with TcpTransport(0, 2, addrs, listener=listeners[0]) as t:   # rank 1 likewise, elsewhere
        t.send_array(1, tag=7, arr=np.arange(4, dtype=np.float32))

TCP security. With a token (``token=`` or ``RLX_DIST_TOKEN``, the same on every rank) each
connection is mutually authenticated by an HMAC-SHA-256 challenge-response over fresh nonces from
both sides (nothing secret or replayable crosses the wire; the accepting rank checks the other's
proof before it sends anything derived from the token), and every message then carries an HMAC
over its sequence number: a message altered, injected, repeated or reordered in transit (or one
after a lost message) raises rlx.Error. Messages are not encrypted.
Pick a long random token (``secrets.token_hex(32)``): a recorded handshake lets an eavesdropper
test guesses offline. Without a token nothing is authenticated (messages still carry the HMAC, under
keys anyone can derive: it catches corruption, loss, repeats and reordering, not forgery), so the
mesh accepts and makes loopback connections only, unless ``allow_remote=True`` (or
``RLX_DIST_ALLOW_REMOTE=1``). During
set-up, connections that are not ranks of this job (port scanners, garbage, silence, a wrong
token or version, a replay) are refused and logged through the core's log callback; the mesh
forms as soon as the real ranks arrive.
"""

from __future__ import annotations

import os
import socket
from typing import Sequence

import numpy as np

from rlx import _C
from rlx._C import Error

__all__ = ["Transport", "TcpTransport", "MpiTransport", "free_loopback_addrs"]

DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
DEFAULT_TIMEOUT = 60.0


class Transport:
    """Point-to-point messages, broadcast and barrier between the ranks of a fixed world.

    Methods mirror rlx/dist.h: ``send(dst, tag, data)``, ``recv(src, tag, out) -> nbytes``,
    ``recv_bytes(src, tag, max_bytes)``, ``broadcast(root, buf)``, ``barrier()``, ``close()``.
    Tags are 0 <= tag < 2**24. Messages between two ranks arrive in order. A context manager:
    ``with`` closes it.
    """

    def __init__(self, impl: _C.Transport):
        self._t = impl

    # -- identity -----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._t.rank

    @property
    def world(self) -> int:
        return self._t.world

    @property
    def name(self) -> str:
        return self._t.name

    @property
    def closed(self) -> bool:
        return self._t.closed

    @property
    def c_transport(self) -> _C.Transport:
        """The underlying rlx._C.Transport (for C code: rlx_py_transport_get)."""
        return self._t

    # -- messages -----------------------------------------------------------------------------
    def send(self, dst: int, tag: int, data) -> None:
        """Sends a C-contiguous bytes-like object or array to rank dst."""
        self._t.send(dst, tag, data)

    def recv(self, src: int, tag: int, out) -> int:
        """Receives the next message from rank src into the writable buffer out; returns its size."""
        return self._t.recv(src, tag, out)

    def recv_bytes(self, src: int, tag: int, max_bytes: int) -> bytes:
        return self._t.recv_bytes(src, tag, max_bytes)

    def broadcast(self, root: int, buf) -> None:
        """Every rank passes a writable buffer of the same size; afterwards all equal root's."""
        self._t.broadcast(root, buf)

    def barrier(self) -> None:
        self._t.barrier()

    def close(self) -> None:
        self._t.close()

    # -- float32 arrays -----------------------------------------------------------------------
    def send_array(self, dst: int, tag: int, arr: np.ndarray) -> None:
        """Sends a float32 array's data (made C-contiguous if needed; shape is not sent)."""
        a = np.asarray(arr)
        if a.dtype != np.float32:
            raise ValueError(f"send_array: expected a float32 array, got {a.dtype}")
        self._t.send(dst, tag, np.ascontiguousarray(a))

    def recv_array(self, src: int, tag: int, out: np.ndarray) -> np.ndarray:
        """Receives exactly out.nbytes into out (float32, C-contiguous, writable); returns out."""
        if not isinstance(out, np.ndarray) or out.dtype != np.float32:
            raise ValueError("recv_array: out must be a float32 numpy array")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("recv_array: out must be C-contiguous and writable")
        got = self._t.recv(src, tag, out)
        if got != out.nbytes:
            raise Error(f"recv_array: rank {src} sent {got} bytes with tag {tag}, expected {out.nbytes} "
                        f"(shape {out.shape} float32)")
        return out

    # -- lifetime -----------------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<{type(self).__name__} rank={self.rank} world={self.world}{state}>"


def _addr_str(a) -> str:
    if isinstance(a, str):
        return a
    host, port = a
    host = str(host)
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


class TcpTransport(Transport):
    """The TCP mesh: rank r listens on addrs[r] (or on ``listener``), connects to every lower rank
    and accepts every higher one, each connection opened by a handshake (protocol version, rank,
    world; with a token, mutual proof of it). Returns once the whole mesh is up; raises rlx.Error
    within ``timeout`` otherwise, naming the ranks that never arrived.

    addrs: one "host:port" or (host, port) per rank. listener: a bound, listening socket for this
    rank (e.g. from free_loopback_addrs); it is duplicated, so the caller still owns and closes
    its own socket. token: defaults to $RLX_DIST_TOKEN; None or "" means no token.
    allow_remote: without a token, also talk to non-loopback peers (default: $RLX_DIST_ALLOW_REMOTE
    is "1"/"true"/"yes"; otherwise loopback only, and a non-loopback address in addrs is a
    ValueError). timeout (seconds) bounds the set-up, then each send and recv as a whole.
    """

    def __init__(self, rank: int, world: int, addrs: Sequence, listener: socket.socket | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, timeout: float = DEFAULT_TIMEOUT,
                 token: str | None = None, allow_remote: bool | None = None):
        if token is None:
            token = os.environ.get("RLX_DIST_TOKEN")
        if allow_remote is None:
            allow_remote = os.environ.get("RLX_DIST_ALLOW_REMOTE", "").strip().lower() in ("1", "true", "yes")
        args = (int(rank), int(world), [_addr_str(a) for a in addrs])
        opts = dict(max_message_bytes=int(max_message_bytes), timeout=float(timeout),
                    token=None if token is None else str(token), allow_remote=bool(allow_remote))
        fd = os.dup(listener.fileno()) if listener is not None else -1
        # Arguments are converted above, so they parse: _C.Transport.tcp then consumes fd on
        # every path, success or not.
        super().__init__(_C.Transport.tcp(*args, listen_fd=fd, **opts))


class MpiTransport(Transport):
    """MPI over MPI_COMM_WORLD (rank and world from the MPI environment, e.g. ``mpirun -np N``).
    Collective: every rank must create it. MPI is initialised if nothing has, and finalised when
    the last MpiTransport closes only if rlx initialised it. ``timeout`` bounds every send, recv,
    broadcast and barrier, as on TCP; mpirun ends the job if a rank dies.

    After a failure, MPI is not finalised: a timeout that leaves an MPI request behind, or an MPI
    error, breaks the transport (later calls raise at once), and leaving a ``with`` block by an
    exception abandons finalisation too, because MPI_Finalize would wait for ranks that may never
    get there. The process should then exit (non-zero): mpirun ends the whole job."""

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, timeout: float = DEFAULT_TIMEOUT):
        try:
            from rlx import _mpi
        except ImportError as e:
            raise Error("rlx was built without MPI: install libopenmpi-dev (Debian) and rebuild"
                        f" ({e})") from None
        capsule = _mpi.create(max_message_bytes=max_message_bytes, timeout=float(timeout))
        super().__init__(_C.Transport.from_capsule(capsule))
        self._abandon = _mpi.abandon

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self._abandon()   # this rank is failing: do not wait in MPI_Finalize for the others
        self.close()


def free_loopback_addrs(world: int) -> tuple[list[str], list[socket.socket]]:
    """Binds ``world`` listening sockets on 127.0.0.1 (port 0: the kernel picks free ports) and
    returns their "host:port" addresses and the sockets. Give listeners[r] to rank r's
    TcpTransport (no race for the port), then close them all."""
    addrs, listeners = [], []
    try:
        for _ in range(world):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(s)
            s.bind(("127.0.0.1", 0))
            s.listen(max(world, 64))  # room for strays beside the real ranks
            addrs.append(f"127.0.0.1:{s.getsockname()[1]}")
    except BaseException:
        for s in listeners:
            s.close()
        raise
    return addrs, listeners
