"""A fault-injecting man in the middle for one link of the TCP mesh (tests/distributed/test_faults.py).

The connecting rank (the higher one) is given the proxy's address in place of the accepting
rank's; the proxy forwards to the real one. Ranks bind the handshake to ranks, world and nonces,
never to addresses, so the mesh forms through it unchanged. After the handshake (HELLO each way
and, with a token, PROOF each way: 48 bytes per message) it parses each direction into frames as
csrc/distributed/wire.h lays them out (16-byte header: magic, tag, u64 length; the payload; a
32-byte MAC) and applies one Fault to one frame:

    drop            the frame is swallowed
    delay           the frame (and everything after it in that direction) waits `arg` seconds
    truncate-stall  only its first `arg` bytes go through, then that direction goes silent
    truncate-close  only its first `arg` bytes go through, then both connections are closed
    duplicate       the frame goes through twice
    replay          the previous frame of that direction goes through again in its place
    swap            the frame is held back until the next one has gone through (a reorder); in a
                    lock-step pipeline the next one waits for an answer to this one, so the frame
                    never arrives
    flip            one bit is flipped in the frame's `arg` field: magic, tag, length, payload, mac

Everything else is forwarded byte for byte, and a close on one side is passed on to the other.
`fired_at` is the monotonic time the fault was applied (None if that frame never came).
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import time

FRAME = struct.Struct("<4sIQ")  # magic, tag, length
HANDSHAKE_MSG = 48              # HELLO and PROOF
MAC_BYTES = 32

KINDS = ("drop", "delay", "truncate-stall", "truncate-close", "duplicate", "replay", "swap", "flip")
FLIP_AT = {"magic": 0, "tag": 4, "length": 8}


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str                      # one of KINDS
    direction: str = "c2a"         # "c2a": connector (higher rank) -> acceptor; "a2c": back
    frame: int = 0                 # index of the frame in that direction, from 0
    arg: float | int | str | None = None

    def __post_init__(self):
        assert self.kind in KINDS and self.direction in ("c2a", "a2c"), self

    def __str__(self) -> str:
        arg = "" if self.arg is None else f"({self.arg})"
        return f"{self.kind}{arg} {self.direction} frame {self.frame}"


def _recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class FaultProxy:
    """Forwards the one connection a rank makes to `addr` on to `target`, applying `fault`.
    token: whether the ranks use one (their handshake then has PROOFs). Use as a context manager
    or call close(): every thread and socket is gone afterwards."""

    def __init__(self, target: str, fault: Fault | None, token: bool):
        self.target, self.fault, self.token = target, fault, token
        self.fired_at: float | None = None
        self.frames: dict[str, list[tuple[int, int]]] = {"c2a": [], "a2c": []}   # (tag, length) seen
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept", daemon=True)]
        self._threads[0].start()

    # -- plumbing ---------------------------------------------------------------------------------
    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            host, port = self.target.rsplit(":", 1)
            try:
                up = socket.create_connection((host, int(port)))
            except OSError:
                conn.close()
                return
            with self._lock:
                self._socks += [conn, up]
            for name, src, dst in (("c2a", conn, up), ("a2c", up, conn)):
                th = threading.Thread(target=self._pump, args=(name, src, dst), name=f"proxy-{name}", daemon=True)
                self._threads.append(th)
                th.start()
            return   # one connection: the link between the two ranks

    def _fire(self):
        if self.fired_at is None:
            self.fired_at = time.monotonic()

    def _cut_both(self):
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _pump(self, direction: str, src: socket.socket, dst: socket.socket):
        f = self.fault if self.fault is not None and self.fault.direction == direction else None
        try:
            for _ in range(2 if self.token else 1):   # one message at a time: each waits for an answer
                dst.sendall(_recv_exact(src, HANDSHAKE_MSG))
            prev, held = None, None
            index = 0
            while True:
                head = _recv_exact(src, FRAME.size)
                if len(head) < FRAME.size:
                    dst.sendall(head)
                    break
                _, tag, length = FRAME.unpack(head)
                body = _recv_exact(src, length + MAC_BYTES)
                frame = head + body
                self.frames[direction].append((tag, length))
                if len(body) < length + MAC_BYTES:
                    dst.sendall(frame)
                    break
                out = [frame]
                if f is not None and index == f.frame:
                    self._fire()
                    out = self._apply(f, frame, prev, dst)
                    if out is None:          # the fault ended this direction
                        return
                    if f.kind == "swap":
                        held = frame
                elif held is not None:
                    out, held = [frame, held], None
                for chunk in out:
                    dst.sendall(chunk)
                prev = frame
                index += 1
        except OSError:   # a reset: pass it on as a close
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _apply(self, f: Fault, frame: bytes, prev: bytes | None, dst: socket.socket) -> list[bytes] | None:
        if f.kind == "drop":
            return []
        if f.kind == "delay":
            self._stop.wait(float(f.arg))
            return [frame]
        if f.kind in ("truncate-stall", "truncate-close"):
            dst.sendall(frame[:int(f.arg)])
            if f.kind == "truncate-stall":
                self._stop.wait()
            else:
                self._cut_both()
            return None
        if f.kind == "duplicate":
            return [frame, frame]
        if f.kind == "replay":
            assert prev is not None and len(prev) == len(frame), "replay needs an earlier frame of the same size"
            return [prev]
        if f.kind == "swap":
            return []
        length = FRAME.unpack(frame[:FRAME.size])[2]
        at = FLIP_AT.get(f.arg)
        if f.arg == "payload":
            at = FRAME.size + length // 2
        elif f.arg == "mac":
            at = FRAME.size + length + 5
        assert at is not None, f.arg
        out = bytearray(frame)
        out[at] ^= 0x01
        return [bytes(out)]

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self):
        self._stop.set()
        self._cut_both()
        for th in self._threads:
            th.join(10)
        alive = [th.name for th in self._threads if th.is_alive()]
        self.listener.close()
        with self._lock:
            for s in self._socks:
                s.close()
        assert not alive, f"proxy threads still running: {alive}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
