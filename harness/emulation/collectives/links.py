"""Byte links between the ranks of one process group: a loopback TCP connection to every peer (mesh.py),
frames filed into mailboxes as they arrive, and a thread that keeps every connection drained. Rank side;
standard library only.

Why loopback sockets rather than shared memory: the harness reads the sandbox's loopback byte counter
from outside the sandbox (harness.launch.pool.RankPool.net_bytes), so every byte a torch collective moves is
seen by a process the candidate cannot reach, and `uses_torch_collectives` keeps coming from a signal
the candidate cannot wind back (tests/exploits/README.md, "Collectives counted from outside").

Who reads a connection: the caller, while it waits for a frame, reads that peer's socket itself, and every
other peer's that nobody else is reading (one wake-up per message, not a thread's wake-up and then the
caller's; measured at W=4, an all_to_all of 4 KiB went from 1.4-4.7x gloo's time to 0.85-1.1x), and so does a
send that would block (the peer may be blocked sending to this rank). The draining thread reads between
operations only: while one is under way (`owned`: from the group's entry to its return, and around every
wait for a frame) the connections are disarmed in the thread's epoll, so a message for the caller wakes the
caller alone, not the thread too, which would take the interpreter's lock from the caller (W=2 all_to_all of
64 KiB: 2.2-3.0x gloo's time with the thread woken, docs/performance.md). Without the thread a send would
wait for its peer to call something: a rank that `isend`s a large tensor and then computes would leave its
peer's send blocked with full socket buffers (NCCL never waits so). A per-peer lock makes one reader at a
time; every decision (which frame belongs to which call, whether it matches) is taken by the caller.

Frames (frames.py) are filed under (peer, kind, key): kind COLLECTIVE (and COLLECTIVE_SECOND, for a
collective's second round) with the group's collective sequence number as key, kind P2P with the count of
point-to-point messages between the two ranks in that direction.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from harness.emulation.collectives.frames import Frame, Reader, encode_head, send_all
from harness.emulation.collectives.mesh import connect

COLLECTIVE = 0
P2P = 1
COLLECTIVE_SECOND = 2  # a collective's second round (an all_reduce's all-gather), under the same key
_ARMED = select.EPOLLIN | select.EPOLLONESHOT  # the draining thread's interest in a connection between operations
_DISARMED = select.EPOLLONESHOT  # during one: a hang-up still wakes it, once
# A payload from this size on is sent with the draining thread reading meanwhile: the kernel's copy of a large
# send and the reading of the peers' large sends then overlap (W=4 all_reduce of 16 MiB sends 4 MiB pieces).
LARGE = 1 << 20


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
        self._owners = 0  # operations under way in this process (their callers read the connections)
        self._arm_lock = threading.Lock()
        self._poll = select.epoll() if self._socks else None
        self._peer_of = {sock.fileno(): peer for peer, sock in self._socks.items()}
        if self._poll is not None:
            for fd in self._peer_of:
                self._poll.register(fd, _ARMED)
            self._thread = threading.Thread(target=self._drain, name=f"pkb-links-{rank}", daemon=True)
            self._thread.start()

    # -- who reads ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def owned(self) -> Iterator[None]:
        """An operation under way: its caller reads the connections (while it waits for a frame, and while a
        send of its would block), and the draining thread is kept off them until the last one ends."""
        with self._arm_lock:
            self._owners += 1
            if self._owners == 1:
                self._arm_all(_DISARMED)
        try:
            yield
        finally:
            with self._arm_lock:
                self._owners -= 1
                if self._owners == 0:
                    self._arm_all(_ARMED)

    @contextlib.contextmanager
    def _lent(self) -> Iterator[None]:
        """The connections handed back to the draining thread for a while (a large send of an operation)."""
        with self._arm_lock:
            lent = self._owners > 0  # outside any operation the thread reads them already
            if lent:
                self._owners -= 1
                if self._owners == 0:
                    self._arm_all(_ARMED)
        try:
            yield
        finally:
            if lent:
                with self._arm_lock:
                    self._owners += 1
                    if self._owners == 1:
                        self._arm_all(_DISARMED)

    def _arm_all(self, events: int) -> None:
        for peer in self._socks:
            self._arm(peer, events)

    def _arm(self, peer: int, events: int) -> None:
        """Set the draining thread's interest in `peer`'s connection (the arm lock held)."""
        if self._poll is None or peer in self._gone or self._closed:
            return
        try:
            self._poll.modify(self._socks[peer].fileno(), events)
        except (OSError, ValueError):  # closed under us: close() is under way
            pass

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
                if body.nbytes < LARGE:
                    send_all(self._socks[peer], [memoryview(head), body],
                             blocked=lambda: self._read_while_blocked(peer))
                else:  # the kernel copies while the draining thread reads (on another core): as before for these
                    with self._lent():
                        send_all(self._socks[peer], [memoryview(head), body])
        except OSError as err:
            raise PeerGone(f"rank {peer} of this group closed its connection: {err}") from err
        self.bytes_sent += len(head) + body.nbytes

    def _read_while_blocked(self, peer: int) -> None:
        """A send to `peer` would block: wait (a second at most) until its connection takes bytes again,
        reading meanwhile every connection nobody else is reading (the peer may be blocked sending here)."""
        held = [p for p in self._socks if p not in self._gone and self._read_locks[p].acquire(blocking=False)]
        try:
            readable, _, _ = select.select([self._socks[p] for p in held], [self._socks[peer]], [], 1.0)
            for p in held:
                if self._socks[p] in readable:
                    self._pump(p)
        except (OSError, ValueError):  # a connection closed under us: the send says what is wrong
            pass
        finally:
            for p in held:
                self._read_locks[p].release()

    # -- receiving ------------------------------------------------------------------------------------
    def take(self, peer: int, kind: int, key: int, what: str) -> Frame:
        """The frame filed under (peer, kind, key), waiting for it as long as the group's timeout; while
        it waits, this thread reads the peer's connection itself unless the draining thread is at it."""
        with self.owned():
            return self._take(peer, kind, key, what)

    def _take(self, peer: int, kind: int, key: int, what: str) -> Frame:
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
        """Read the connections between operations: each is armed once (EPOLLONESHOT) and armed again after
        its read, unless an operation has begun meanwhile (its caller reads then) or the peer is gone."""
        poll = self._poll
        assert poll is not None
        try:
            while not self._closed:
                for fd, _ in poll.poll(1.0):
                    peer = self._peer_of.get(fd)
                    if peer is None:
                        continue
                    with self._read_locks[peer]:  # waits while a caller reads this peer itself
                        self._pump(peer)
                    with self._cond:
                        self._cond.notify_all()  # a caller that found the lock taken looks again
                    with self._arm_lock:
                        if self._owners == 0:
                            self._arm(peer, _ARMED)
        except (OSError, ValueError):
            pass  # closed under us: close() is under way
        finally:
            poll.close()

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
