"""Process, socket and port bookkeeping for the distributed tests' leak checks (the fixtures are
in conftest.py; the fault suite also uses these directly)."""

from __future__ import annotations

import os
import socket


def children(pid: int) -> list[int]:
    """The direct children of pid (zombies included)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # pid (comm) state ppid ...; comm may hold spaces or parentheses
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def proc_state(pid: int) -> str | None:
    """The one-letter state of pid ("Z" for a zombie), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes in session sid: a job started with start_new_session keeps its
    session in every descendant, even one re-parented to init after its parent died."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":   # state ppid pgrp session ...
                out.append(int(d))
    return out


def own_sockets() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(fd)] = link
    return out


def port_is_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(1)
        return True
    except OSError:
        return False
    finally:
        s.close()


def listening_ports() -> set[int]:
    """Every TCP port some process on this host is listening on (/proc/net/tcp and tcp6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":   # TCP_LISTEN
                out.add(int(fields[1].rsplit(":", 1)[1], 16))
    return out


def established_connections(pid: int) -> int:
    """How many established TCP connections process pid holds (its socket fds matched by inode
    against /proc/net/tcp and tcp6)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return 0
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        n += sum(1 for row in rows if row.split()[3] == "01" and row.split()[9] in inodes)   # TCP_ESTABLISHED
    return n
