"""Byte links between the ranks of one process group: a TCP connection over loopback to every peer, and
one thread per group that drains them all into mailboxes. Rank side; standard library only.

Why loopback sockets rather than shared memory: the harness reads the sandbox's loopback byte counter
from outside the sandbox (harness.launch.pool.RankPool.net_bytes), so every byte a torch collective moves is
seen by a process the candidate cannot reach, and `uses_torch_collectives` keeps coming from a signal
the candidate cannot wind back (tests/exploits/README.md, "Collectives counted from outside").

Why a draining thread: a send never waits for its peer to call anything, as on NCCL. Two ranks that both
`isend` a large tensor before their `irecv` would otherwise each block in `sendall` with full socket
buffers. The thread only moves bytes into memory; every decision (which frame belongs to which call,
whether it matches) is taken by the caller.

Frames: a fixed header (magic, kind, key, meta length, payload length), a small JSON meta (what the
sender was doing: operation, dtype, element count), the payload. A frame is filed under
(peer, kind, key): kind COLLECTIVE with the group's collective sequence number as key, kind P2P with
the count of point-to-point messages between the two ranks in that direction.
"""

from __future__ import annotations

import json
import secrets
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

COLLECTIVE = 0
P2P = 1
_MAGIC = b"PKBL"
_FRAME = struct.Struct("!4sBQIQ")  # magic, kind, key, meta bytes, payload bytes
_HELLO = struct.Struct("!16sI")  # the group's token, the connecting rank
_META_LIMIT = 1 << 16
_ACCEPT_POLL_S = 0.5


class PeerGone(RuntimeError):
    """A peer closed its connection (its process died or left the group)."""


@dataclass
class Frame:
    meta: dict[str, Any]
    payload: bytearray


class _Reader:
    """The receive state of one peer's connection: header, then meta, then payload."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.head = bytearray()
        self.meta = bytearray()
        self.payload = bytearray()
        self.filled = 0
        self.kind = 0
        self.key = 0
        self.meta_len = 0
        self.payload_len = -1  # -1: reading the header

    def reset(self) -> None:
        self.head, self.meta, self.payload = bytearray(), bytearray(), bytearray()
        self.filled, self.payload_len = 0, -1


class Links:
    """A full mesh of loopback connections among the `size` ranks of one group, built through `store`
    (the group's prefix store: each rank publishes its listening port under `prefix`)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, prefix: str = "pkb-links") -> None:
        self.rank, self.size = rank, size
        self.timeout_s = max(1.0, timeout.total_seconds())
        self.bytes_sent = 0
        self._socks: dict[int, socket.socket] = {}
        self._send_locks: dict[int, threading.Lock] = {}
        self._box: dict[tuple[int, int, int], Frame] = {}
        self._gone: dict[int, str] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if size > 1:
            self._connect(store, prefix)
            self._thread = threading.Thread(target=self._drain, name=f"pkb-links-{rank}", daemon=True)
            self._thread.start()

    # -- set-up -------------------------------------------------------------------------------------
    def _connect(self, store: Any, prefix: str) -> None:
        """Rank 0 draws the group's token; every rank listens, publishes its port, connects to the ranks
        below it and accepts the ranks above it. The listener closes once the mesh stands: no connection
        is taken later, and a connection that does not bring the token is dropped."""
        if self.rank == 0:
            store.set(f"{prefix}/token", secrets.token_bytes(16))
        token = bytes(store.get(f"{prefix}/token"))
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(self.size)
            store.set(f"{prefix}/port/{self.rank}", str(listener.getsockname()[1]))
            for peer in range(self.rank):
                port = int(bytes(store.get(f"{prefix}/port/{peer}")).decode())
                sock = socket.create_connection(("127.0.0.1", port), timeout=self.timeout_s)
                sock.sendall(_HELLO.pack(token, self.rank))
                self._adopt(peer, sock)
            deadline = time.monotonic() + self.timeout_s
            listener.settimeout(_ACCEPT_POLL_S)
            while len(self._socks) < self.size - 1:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.size)) - set(self._socks) - {self.rank})
                    raise RuntimeError(f"process group set-up: rank(s) {missing} did not connect within "
                                       f"{self.timeout_s:.0f} s")
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    continue
                sock.settimeout(self.timeout_s)
                try:
                    hello = _read_exactly(sock, _HELLO.size)
                except OSError:
                    sock.close()
                    continue
                got, peer = _HELLO.unpack(hello)
                if got != token or not self.rank < peer < self.size or peer in self._socks:
                    sock.close()
                    continue
                self._adopt(peer, sock)
        finally:
            listener.close()

    def _adopt(self, peer: int, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # blocking: the draining thread reads only what select says is there
        self._socks[peer] = sock
        self._send_locks[peer] = threading.Lock()

    # -- sending --------------------------------------------------------------------------------------
    def send(self, peer: int, kind: int, key: int, meta: dict[str, Any], payload: memoryview | bytes = b"") -> None:
        """One frame to `peer`. Returns once the kernel holds every byte; the peer's thread drains them
        whatever the peer is doing, so this never waits on the peer's program."""
        if peer in self._gone:
            raise PeerGone(f"rank {peer} of this group is gone: {self._gone[peer]}")
        encoded = json.dumps(meta, separators=(",", ":")).encode()
        body = memoryview(payload).cast("B") if len(payload) else memoryview(b"")
        head = _FRAME.pack(_MAGIC, kind, key, len(encoded), body.nbytes)
        try:
            with self._send_locks[peer]:
                sock = self._socks[peer]
                sock.sendall(head + encoded)
                if body.nbytes:
                    sock.sendall(body)
        except OSError as err:
            raise PeerGone(f"rank {peer} of this group closed its connection: {err}") from err
        self.bytes_sent += len(head) + len(encoded) + body.nbytes

    # -- receiving ------------------------------------------------------------------------------------
    def take(self, peer: int, kind: int, key: int, what: str) -> Frame:
        """The frame filed under (peer, kind, key), waiting for it as long as the group's timeout."""
        slot = (peer, kind, key)
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while slot not in self._box:
                if peer in self._gone:
                    raise PeerGone(f"{what}: rank {peer} of this group is gone: {self._gone[peer]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{what}: nothing from rank {peer} within {self.timeout_s:.0f} s "
                                       f"(the process group's timeout)")
                self._cond.wait(min(left, 1.0))
            return self._box.pop(slot)

    def ready(self, peer: int, kind: int, key: int) -> bool:
        with self._cond:
            return (peer, kind, key) in self._box

    def _drain(self) -> None:
        selector = selectors.DefaultSelector()
        readers = {}
        for peer, sock in self._socks.items():
            readers[peer] = _Reader(peer)
            selector.register(sock, selectors.EVENT_READ, peer)
        while readers and not self._closed:
            for key, _ in selector.select(timeout=1.0):
                peer = int(key.data)
                try:
                    alive = self._read_some(key.fileobj, readers[peer])  # type: ignore[arg-type]
                except (OSError, ValueError) as err:
                    alive, why = False, f"{type(err).__name__}: {err}"
                else:
                    why = "it closed its connection (its process ended or left the group)"
                if not alive:
                    selector.unregister(key.fileobj)
                    del readers[peer]
                    with self._cond:
                        self._gone[peer] = why
                        self._cond.notify_all()
        selector.close()

    def _read_some(self, sock: socket.socket, r: _Reader) -> bool:
        """Read what is there (select said something is) into the peer's frame; file it when whole.
        False when the peer closed its end."""
        if r.payload_len < 0:
            if len(r.head) < _FRAME.size:
                chunk = sock.recv(_FRAME.size - len(r.head))
                if not chunk:
                    return False
                r.head += chunk
                if len(r.head) < _FRAME.size:
                    return True
                magic, r.kind, r.key, r.meta_len, payload_len = _FRAME.unpack(bytes(r.head))
                if magic != _MAGIC or r.meta_len > _META_LIMIT:
                    raise ValueError(f"rank {r.peer} sent a malformed frame")
                r.payload = bytearray(payload_len)
                r.filled = 0
                if r.meta_len:
                    return True
            if len(r.meta) < r.meta_len:
                chunk = sock.recv(r.meta_len - len(r.meta))
                if not chunk:
                    return False
                r.meta += chunk
                if len(r.meta) < r.meta_len:
                    return True
            r.payload_len = len(r.payload)
        if r.filled < r.payload_len:
            view = memoryview(r.payload)[r.filled:]
            got = sock.recv_into(view, len(view))
            if got == 0:
                return False
            r.filled += got
            if r.filled < r.payload_len:
                return True
        meta = json.loads(bytes(r.meta).decode()) if r.meta_len else {}
        with self._cond:
            self._box[(r.peer, r.kind, r.key)] = Frame(meta if isinstance(meta, dict) else {}, r.payload)
            self._cond.notify_all()
        r.reset()
        return True

    def close(self) -> None:
        self._closed = True
        for sock in self._socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed during the handshake")
        data += chunk
    return bytes(data)
