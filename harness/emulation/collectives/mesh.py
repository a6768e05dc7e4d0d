"""The group's connections: a full mesh of loopback TCP connections among its ranks, built through the
group's store. Rank side; standard library only.

Rank 0 draws the group's token; every rank listens, publishes its port, connects to the ranks below it
and accepts the ranks above it. The listener closes once the mesh stands: no connection is taken later,
and a connection that does not bring the token is dropped.
"""

from __future__ import annotations

import secrets
import socket
import struct
import time
from typing import Any

_HELLO = struct.Struct("!16sI")  # the group's token, the connecting rank
_ACCEPT_POLL_S = 0.5


def connect(store: Any, rank: int, size: int, timeout_s: float, prefix: str) -> dict[int, socket.socket]:
    """A connected socket to every other rank (blocking, TCP_NODELAY), by peer rank."""
    socks: dict[int, socket.socket] = {}
    try:
        _build(store, rank, size, timeout_s, prefix, socks)
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    return socks


def _adopt(socks: dict[int, socket.socket], peer: int, sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)  # blocking: readers read only what select says is there, or with MSG_DONTWAIT
    socks[peer] = sock


def _build(store: Any, rank: int, size: int, timeout_s: float, prefix: str, socks: dict[int, socket.socket]) -> None:
    if rank == 0:
        store.set(f"{prefix}/token", secrets.token_bytes(16))
    token = bytes(store.get(f"{prefix}/token"))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(size)
        store.set(f"{prefix}/port/{rank}", str(listener.getsockname()[1]))
        for peer in range(rank):
            port = int(bytes(store.get(f"{prefix}/port/{peer}")).decode())
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
            sock.sendall(_HELLO.pack(token, rank))
            _adopt(socks, peer, sock)
        deadline = time.monotonic() + timeout_s
        listener.settimeout(_ACCEPT_POLL_S)
        while len(socks) < size - 1:
            if time.monotonic() > deadline:
                missing = sorted(set(range(size)) - set(socks) - {rank})
                raise RuntimeError(f"process group set-up: rank(s) {missing} did not connect within "
                                   f"{timeout_s:.0f} s")
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(timeout_s)
            try:
                hello = _read_exactly(sock, _HELLO.size)
            except OSError:
                sock.close()
                continue
            got, peer = _HELLO.unpack(hello)
            if got != token or not rank < peer < size or peer in socks:
                sock.close()
                continue
            _adopt(socks, peer, sock)
    finally:
        listener.close()


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed during the handshake")
        data += chunk
    return bytes(data)
