"""Byte links between the ranks of one process group: a loopback TCP connection to every peer (mesh.py),
frames filed into mailboxes as they arrive, and a thread that keeps every connection drained. Rank side;
standard library only.

Why loopback sockets rather than shared memory: the harness reads the sandbox's loopback byte counter
from outside the sandbox (harness.launch.pool.RankPool.net_bytes), so every byte a torch collective moves is
seen by a process the candidate cannot reach, and `uses_torch_collectives` keeps coming from a signal
the candidate cannot wind back (tests/exploits/README.md, "Collectives counted from outside").

Who reads a connection: the caller, while it waits for a frame, reads that peer's socket itself, and every
other peer's that nobody else is reading (one wake-up per message, not a thread's wake-up and then the
caller's; measured at W=4, an all_to_all of 4 KiB went from 1.4-4.7x gloo's time to 0.85-1.1x); the
draining thread reads the connections nobody is waiting on. Without the thread a send would wait for its peer to call
something: two ranks that both `isend` a large tensor before their `irecv` would each block in sendmsg
with full socket buffers (NCCL never waits so). A per-peer lock makes one reader at a time; every decision
(which frame belongs to which call, whether it matches) is taken by the caller.

Frames (frames.py) are filed under (peer, kind, key): kind COLLECTIVE (and COLLECTIVE_SECOND, for a
collective's second round) with the group's collective sequence number as key, kind P2P with the count of
point-to-point messages between the two ranks in that direction.
"""

from __future__ import annotations

import select
import selectors
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from harness.emulation.collectives.frames import Frame, Reader, encode_head, send_all
from harness.emulation.collectives.mesh import connect

COLLECTIVE = 0
P2P = 1
COLLECTIVE_SECOND = 2  # a collective's second round (an all_reduce's all-gather), under the same key


class PeerGone(RuntimeError):
    """A peer closed its connection (its process died or left the group)."""


def _bytes(n: int) -> memoryview:
    return memoryview(bytearray(n))


class Links:
    """A full mesh of loopback connections among the `size` ranks of one group, built through `store`
    (the group's prefix store: each rank publishes its listening port under `prefix`). `alloc` gives a
    payload's buffer (writable, n bytes)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, prefix: str = "pkb-links",
                 alloc: Callable[[int], memoryview] = _bytes) -> None:
        self.rank, self.size = rank, size
        self.timeout_s = max(1.0, timeout.total_seconds())
        self.bytes_sent = 0
        self._box: dict[tuple[int, int, int], Frame] = {}
        self._gone: dict[int, str] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._socks = connect(store, rank, size, self.timeout_s, prefix) if size > 1 else {}
        self._send_locks = {peer: threading.Lock() for peer in self._socks}
        self._read_locks = {peer: threading.Lock() for peer in self._socks}
        self._readers = {peer: Reader(peer, alloc) for peer in self._socks}
        if self._socks:
            self._thread = threading.Thread(target=self._drain, name=f"pkb-links-{rank}", daemon=True)
            self._thread.start()

    # -- sending --------------------------------------------------------------------------------------
    def send(self, peer: int, kind: int, key: int, meta: dict[str, Any], payload: memoryview | bytes = b"") -> None:
        """One frame to `peer`. Returns once the kernel holds every byte; the peer's thread drains them
        whatever the peer is doing, so this never waits on the peer's program."""
        if peer in self._gone:
            raise PeerGone(f"rank {peer} of this group is gone: {self._gone[peer]}")
        body = memoryview(payload).cast("B") if len(payload) else memoryview(b"")
        head = encode_head(kind, key, meta, body.nbytes)
        try:
            with self._send_locks[peer]:
                send_all(self._socks[peer], [memoryview(head), body])
        except OSError as err:
            raise PeerGone(f"rank {peer} of this group closed its connection: {err}") from err
        self.bytes_sent += len(head) + body.nbytes

    # -- receiving ------------------------------------------------------------------------------------
    def take(self, peer: int, kind: int, key: int, what: str) -> Frame:
        """The frame filed under (peer, kind, key), waiting for it as long as the group's timeout; while
        it waits, this thread reads the peer's connection itself unless the draining thread is at it."""
        slot = (peer, kind, key)
        deadline = time.monotonic() + self.timeout_s
        while True:
            with self._cond:
                if slot in self._box:
                    return self._box.pop(slot)
                if peer in self._gone:
                    raise PeerGone(f"{what}: rank {peer} of this group is gone: {self._gone[peer]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{what}: nothing from rank {peer} within {self.timeout_s:.0f} s "
                                       f"(the process group's timeout)")
                if not self._read_locks[peer].acquire(blocking=False):
                    self._cond.wait(min(left, 1.0))  # the draining thread is reading it: it notifies
                    continue
            # Every other peer nobody is reading is read too: a collective's frames from them come next.
            held = [peer] + [p for p in self._socks if p != peer and p not in self._gone
                             and self._read_locks[p].acquire(blocking=False)]
            try:
                readable, _, _ = select.select([self._socks[p] for p in held], [], [], min(left, 1.0))
                for p in held:
                    if self._socks[p] in readable:
                        self._pump(p)
            except (OSError, ValueError) as err:  # closed under us (abort), or an unusable descriptor
                self._lose(peer, f"{type(err).__name__}: {err}")
            finally:
                for p in held:
                    self._read_locks[p].release()

    def _pump(self, peer: int) -> None:
        """Read what the peer's connection has now and file the frames it completes (the peer's read
        lock held)."""
        if peer in self._gone:
            return
        try:
            frames = self._readers[peer].read(self._socks[peer])
        except (OSError, ValueError) as err:
            self._lose(peer, f"{type(err).__name__}: {err}")
            return
        if frames is None:
            self._lose(peer, "it closed its connection (its process ended or left the group)")
            return
        if frames:
            with self._cond:
                for kind, key, frame in frames:
                    self._box[(peer, kind, key)] = frame
                self._cond.notify_all()

    def _lose(self, peer: int, why: str) -> None:
        with self._cond:
            self._gone.setdefault(peer, why)
            self._cond.notify_all()

    def _drain(self) -> None:
        selector = selectors.DefaultSelector()
        for peer, sock in self._socks.items():
            selector.register(sock, selectors.EVENT_READ, peer)
        try:
            while selector.get_map() and not self._closed:
                for key, _ in selector.select(timeout=1.0):
                    peer = int(key.data)
                    with self._read_locks[peer]:  # waits while a caller reads this peer itself
                        self._pump(peer)
                    with self._cond:
                        self._cond.notify_all()  # a caller that found the lock taken looks again
                    if peer in self._gone:
                        selector.unregister(key.fileobj)
        except (OSError, ValueError):
            pass  # closed under us: close() is under way
        finally:
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
