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
(peer, kind, key): kind COLLECTIVE (and COLLECTIVE_SECOND, for a second round) with the group's collective
sequence number as key, kind P2P with the count of point-to-point messages between the two ranks in that
direction.
"""

from __future__ import annotations

import json
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

COLLECTIVE = 0
P2P = 1
COLLECTIVE_SECOND = 2  # a collective's second round (an all_reduce's all-gather), under the same key
_MAGIC = b"PKBL"
_FRAME = struct.Struct("!4sBQIQ")  # magic, kind, key, meta bytes, payload bytes
_HELLO = struct.Struct("!16sI")  # the group's token, the connecting rank
_META_LIMIT = 1 << 16
_ACCEPT_POLL_S = 0.5
_STAGING = 1 << 18  # a receive's first read: whole frames up to this size take one recv


def _bytes(n: int) -> memoryview:
    return memoryview(bytearray(n))


class PeerGone(RuntimeError):
    """A peer closed its connection (its process died or left the group)."""


@dataclass
class Frame:
    meta: dict[str, Any]
    payload: memoryview


class _Reader:
    """The receive side of one peer's connection. Reads what is there into a staging buffer, so one recv
    brings a small frame whole (header, meta and payload); a large payload's rest is read straight into
    its own buffer."""

    def __init__(self, peer: int, alloc: Callable[[int], memoryview]) -> None:
        self.peer = peer
        self._alloc = alloc
        self._buf = bytearray(_STAGING)
        self._have = 0  # bytes of the staging buffer not yet parsed
        self._open: tuple[int, int, dict[str, Any], memoryview] | None = None  # a frame whose payload is arriving
        self._filled = 0

    def read(self, sock: socket.socket) -> list[tuple[int, int, Frame]] | None:
        """The frames completed by what the socket has now; None when the peer closed its end."""
        if self._open is not None:
            kind, key, meta, payload = self._open
            got = sock.recv_into(payload[self._filled:])
            if got == 0:
                return None
            self._filled += got
            if self._filled < payload.nbytes:
                return []
            self._open = None
            return [(kind, key, Frame(meta, payload))]
        got = sock.recv_into(memoryview(self._buf)[self._have:])
        if got == 0:
            return None
        self._have += got
        return self._parse()

    def _parse(self) -> list[tuple[int, int, Frame]]:
        done: list[tuple[int, int, Frame]] = []
        at = 0
        view = memoryview(self._buf)
        while self._have - at >= _FRAME.size:
            magic, kind, key, meta_len, payload_len = _FRAME.unpack_from(self._buf, at)
            if magic != _MAGIC or meta_len > _META_LIMIT:
                raise ValueError(f"rank {self.peer} sent a malformed frame")
            body = at + _FRAME.size + meta_len
            if self._have < body:
                break
            meta = json.loads(bytes(view[at + _FRAME.size:body]).decode()) if meta_len else {}
            meta = meta if isinstance(meta, dict) else {}
            payload = self._alloc(payload_len)
            here = min(payload_len, self._have - body)
            payload[:here] = view[body:body + here]
            at = body + here
            if here < payload_len:
                self._open, self._filled = (kind, key, meta, payload), here
                break
            done.append((kind, key, Frame(meta, payload)))
        view.release()
        if at:
            self._buf[:self._have - at] = self._buf[at:self._have]
            self._have -= at
        return done


def _send_all(sock: socket.socket, parts: list[memoryview]) -> None:
    """sendmsg until every byte of `parts` is in the kernel (a large payload goes in several calls)."""
    parts = [p for p in parts if p.nbytes]
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= parts[0].nbytes:
            sent -= parts[0].nbytes
            parts.pop(0)
        if parts and sent:
            parts[0] = parts[0][sent:]


class Links:
    """A full mesh of loopback connections among the `size` ranks of one group, built through `store`
    (the group's prefix store: each rank publishes its listening port under `prefix`)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, prefix: str = "pkb-links",
                 alloc: Callable[[int], memoryview] = _bytes) -> None:
        self.rank, self.size = rank, size
        self._alloc = alloc  # a writable buffer of n bytes for a payload (the group's: uninitialised memory)
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
        whatever the peer is doing, so this never waits on the peer's program.

        Header, meta and payload leave in one sendmsg, straight from the caller's memory: a small frame is
        one segment (one wake-up of the peer's thread), a large one is never copied in Python."""
        if peer in self._gone:
            raise PeerGone(f"rank {peer} of this group is gone: {self._gone[peer]}")
        encoded = json.dumps(meta, separators=(",", ":")).encode()
        body = memoryview(payload).cast("B") if len(payload) else memoryview(b"")
        head = _FRAME.pack(_MAGIC, kind, key, len(encoded), body.nbytes)
        try:
            with self._send_locks[peer]:
                _send_all(self._socks[peer], [memoryview(head + encoded), body])
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
            readers[peer] = _Reader(peer, self._alloc)
            selector.register(sock, selectors.EVENT_READ, peer)
        while readers and not self._closed:
            for key, _ in selector.select(timeout=1.0):
                peer = int(key.data)
                try:
                    frames = readers[peer].read(key.fileobj)  # type: ignore[arg-type]
                except (OSError, ValueError) as err:
                    frames, why = None, f"{type(err).__name__}: {err}"
                else:
                    why = "it closed its connection (its process ended or left the group)"
                if frames:
                    with self._cond:
                        for kind, seq, frame in frames:
                            self._box[(peer, kind, seq)] = frame
                        self._cond.notify_all()
                if frames is None:
                    selector.unregister(key.fileobj)
                    del readers[peer]
                    with self._cond:
                        self._gone[peer] = why
                        self._cond.notify_all()
        selector.close()

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
