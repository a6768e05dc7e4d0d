"""Talking to a pool's ranks: requests out (typed, harness.common.messages, each with a fresh nonce), replies in
with a deadline. Before the channel is sealed only the worker's own code has run, so its startup reply is
unpickled; after it, replies are signed JSON frames read as raw bytes (harness.launch.replies), never
unpickled. Every reply is checked against the reply type of the request's op before anyone reads a field of
it: one that does not fit is that rank's failure (a candidate's: runtime_error, flagged as tampering).

While it waits, the exchange drains every rank's output and event pipes (a rank that writes a lot never
blocks; one that writes too much is stopped) and asks the pool's oversight about its limits.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol, cast

from harness import cancel
from harness.common import failures, hostile_files, messages
from harness.common.flags import TAMPERING
from harness.common.messages import Request
from harness.launch.replies import RankPipes, drain, parse_frame

# What `RankPool.request` takes: one message for every rank, or one per rank keyed by rank; each typed or as
# its wire dict (checked as the rank checks it before it is sent).
Message = Request | dict[str, Any]
Outgoing = Message | Mapping[int, Message]


class PoolError(RuntimeError):
    """The pool itself failed (could not start): an infrastructure error."""


class Hang(RuntimeError):
    """Some ranks did not answer in time. `replies` holds what the others said; `stacks` every rank's
    stack at the moment the limit ran out (empty where none could be taken)."""

    def __init__(self, missing: list[int], replies: dict[int, dict[str, Any]], timeout: float,
                 stacks: dict[int, str] | None = None) -> None:
        super().__init__(f"ranks {missing} did not answer within {timeout:.0f} s")
        self.missing = missing
        self.replies = replies
        self.timeout = timeout
        self.stacks = stacks or {}


class Watcher(Protocol):
    """What the exchange asks of the pool's oversight while it waits (harness.launch.oversight.Oversight)."""

    def over_cap(self, r: RankPipes, /) -> None: ...
    def check_processes(self) -> None: ...
    def limit_reached(self, failed: bool, sealed: bool, /) -> None: ...
    def stacks(self) -> dict[int, str]: ...


def outgoing(message: Outgoing, world_size: int, role: str) -> dict[int, Request]:
    """Each rank's typed request. A dict whose keys are all ints is one message per rank."""
    if isinstance(message, Request):
        return {rank: messages.request_for(message, role) for rank in range(world_size)}
    if message and all(isinstance(k, int) for k in message):
        per_rank = cast(Mapping[int, Message], message)
        return {rank: messages.request_for(per_rank[rank], role) for rank in range(world_size)}
    return {rank: messages.request_for(cast(dict[str, Any], message), role) for rank in range(world_size)}


class Exchange:
    """Requests to and replies from the ranks of one started pool."""

    def __init__(self, ranks: list[RankPipes], status_fd: int, role: str, watcher: Watcher) -> None:
        self.ranks = ranks
        self.role = role
        self.watcher = watcher
        self.status_fd: int | None = status_fd
        self._status_buffer = b""
        # The reply channel: one key per rank once sealed (None before), the current request's nonce and
        # each rank's op, and the bytes read from each rank's reply pipe that do not yet make a whole frame.
        self.keys: dict[int, bytes] | None = None
        self.nonce = ""
        self.ops: dict[int, str] = {r.rank: "ready" for r in ranks}
        self.buffers: dict[int, bytearray] = {}
        self.last_reply_at = 0.0

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def forget(self) -> None:
        """After the pool's processes ended and its pipes closed: no status pipe, reply keys or buffers left."""
        self.status_fd = None
        self.keys = None
        self.buffers = {}

    def send(self, per_rank: dict[int, Request]) -> float:
        """Send each rank its request with a new nonce (a reply to an earlier request can never pass for this
        one's); returns when the first was sent."""
        self.nonce = secrets.token_hex(16)
        started = self.last_reply_at = time.perf_counter()
        for r in self.ranks:
            body = per_rank[r.rank]
            self.ops[r.rank] = body.op
            r.requests.send({**messages.to_wire(body), "nonce": self.nonce})
        return started

    def seal(self, timeout: float) -> dict[int, dict[str, Any]]:
        """Give each rank its reply key. The worker has imported nothing but the harness yet (no problem,
        no candidate), so the key reaches it before anything untrusted runs in its process; the key
        never appears in its environment or command line."""
        keys = {r.rank: secrets.token_bytes(32) for r in self.ranks}
        self.nonce = secrets.token_hex(16)
        for r in self.ranks:
            self.ops[r.rank] = "seal"
            r.requests.send({**messages.to_wire(messages.Seal(key=keys[r.rank])), "nonce": self.nonce})
        self.keys = keys
        self.buffers = {r.rank: bytearray() for r in self.ranks}
        return self.collect(timeout, grace=5.0)

    def ask_exit(self) -> None:
        for r in self.ranks:
            try:
                r.requests.send(messages.to_wire(messages.Exit()))
            except (OSError, ValueError):
                pass

    def collect(self, timeout: float, grace: float, build_allowance: float = 0.0) -> dict[int, dict[str, Any]]:
        """Every rank's reply to the last request. Hang when one is missing at the deadline, or `grace` seconds
        after another failed; a rank inside a native build gets up to `build_allowance` from its start."""
        deadline = time.monotonic() + timeout
        replies: dict[int, dict[str, Any]] = {}
        by_conn = {r.replies: r for r in self.ranks}
        sealed = self.keys is not None

        def take(r: RankPipes, reply: dict[str, Any] | None) -> None:
            nonlocal deadline
            if reply is None:
                return  # part of a message: keep reading until the deadline
            replies[r.rank] = self._checked(r.rank, reply)
            self.last_reply_at = time.perf_counter()
            if not replies[r.rank]["ok"]:
                deadline = min(deadline, time.monotonic() + grace)

        if self.keys is not None:
            for r in self.ranks:  # a frame already buffered (extra bytes from an earlier read) comes first
                take(r, parse_frame(self.buffers[r.rank], self.keys[r.rank], self.nonce, r.rank))
        while len(replies) < self.world_size:
            cancel.check()  # Ctrl-C: the pool is being killed; its caller's cleanup ends it for good
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(self.world_size)) - set(replies))
                builds = [r.building_since for r in self.ranks if r.rank in missing and r.building_since is not None]
                if builds and all(rep["ok"] for rep in replies.values()):
                    remaining = min(builds) + build_allowance - time.monotonic()
                if remaining <= 0:
                    self.watcher.limit_reached(True, sealed)  # ranks stuck because a full /dev/shm failed a peer
                    raise Hang(missing, replies, timeout, self.watcher.stacks())
            pending = [r.replies for r in self.ranks if r.rank not in replies]
            # The ranks' output and event pipes are read while waiting, so a rank that writes a lot
            # never blocks on a full pipe (and one that writes too much is stopped).
            by_fd = {fd: (r, kind) for r in self.ranks for fd, kind in ((r.log_fd, "log"), (r.events_fd, "events"))
                     if fd >= 0}
            ready = wait([*pending, *by_fd], timeout=min(remaining, 0.5))
            for item in ready:
                if isinstance(item, int):
                    r, kind = by_fd[item]
                    self.drain(r, kind)
                    continue
                r = by_conn[cast(Connection, item)]  # wait() returns what it was given: these, and the fds above
                take(r, self._read_sealed(r) if self.keys is not None else self._read_startup(r))
            self.watcher.check_processes()
            self.watcher.limit_reached(False, sealed)
        for r in self.ranks:
            self.drain(r, "log")
            self.drain(r, "events")
        self.watcher.limit_reached(any(not reply["ok"] for reply in replies.values()), sealed)
        return replies

    def _checked(self, rank: int, reply: dict[str, Any]) -> dict[str, Any]:
        """The reply if it fits its op's reply type (harness.common.messages), else this rank's failure."""
        op = self.ops.get(rank, "ready")
        try:
            return messages.check_reply(op, reply)
        except messages.ProtocolError as err:
            why = f"rank {rank}: its reply to {op!r} does not fit the protocol: {err}"[:1500]
            if self.role == "trusted":  # no candidate code runs there: the harness's own bug
                return {"ok": False, "rank": rank, "verdict": failures.INFRA_ERROR, "message": why}
            return {"ok": False, "rank": rank, "verdict": failures.RUNTIME_ERROR, "flags": [TAMPERING],
                    "message": why}

    def drain(self, r: RankPipes, kind: str) -> None:
        drain(r, kind, self.watcher.over_cap)

    def take_events(self) -> dict[int, dict[str, int]]:
        """Collectives each rank's monitor reported since the last call (drained now)."""
        out = {}
        for r in self.ranks:
            self.drain(r, "events")
            if r.events:
                out[r.rank] = dict(r.events)
            r.events.clear()
        return out

    def _read_startup(self, r: RankPipes) -> dict[str, Any]:
        """Before sealing only the worker's own code has run (no problem, no candidate): pickle is safe."""
        try:
            # Only the worker's own startup code has sent on this pipe, and it sends dicts.
            return cast("dict[str, Any]", r.replies.recv())
        except (EOFError, OSError):
            return self._death_reply(r)

    def _read_sealed(self, r: RankPipes) -> dict[str, Any] | None:
        """What is readable now on rank r's reply pipe: a reply, or None for 'not a whole frame yet'."""
        try:
            chunk = os.read(r.replies.fileno(), 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            return self._death_reply(r)
        self.buffers[r.rank] += chunk
        assert self.keys is not None
        return parse_frame(self.buffers[r.rank], self.keys[r.rank], self.nonce, r.rank)

    def read_status(self, wait_s: float) -> None:
        """Exit codes the launcher reported (a line per rank that ended)."""
        deadline = time.monotonic() + wait_s
        while self.status_fd is not None:
            ready, _, _ = select.select([self.status_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return
            try:
                chunk = os.read(self.status_fd, 4096)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return
            *lines, self._status_buffer = (self._status_buffer + chunk).split(b"\n")
            for line in lines:
                try:  # the launcher runs in the sandbox: its lines are claims, kept only when well-formed
                    entry = json.loads(line)
                    rank = int(entry["rank"])
                    if 0 <= rank < len(self.ranks):
                        self.ranks[rank].returncode = int(entry["returncode"])
                except (ValueError, KeyError, IndexError, TypeError, RecursionError):
                    continue
            if time.monotonic() >= deadline:
                return

    def _death_reply(self, r: RankPipes) -> dict[str, Any]:
        """The reply of a rank whose process is gone. `died` marks it as the root failure: its peers then
        fail on the broken connection, and their replies must not be taken for the cause."""
        if r.returncode is None:
            self.read_status(5.0)
        code = r.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        self.drain(r, "log")
        return {"ok": False, "rank": r.rank, "verdict": failures.RUNTIME_ERROR, "died": True,
                "message": f"rank {r.rank} process {how}", "evidence": log_tail(r)}

    def log_tails(self, ranks: list[int], folder: Path | None) -> str:
        """The output tails of `ranks` and the launcher's (its sandbox.log in the pool's `folder`)."""
        for r in self.ranks:
            self.drain(r, "log")
        sandbox = ""
        if folder is not None:
            try:  # the launcher's output: what ranks can reach of it is bounded here, never read whole
                sandbox = hostile_files.read_tail(folder / "sandbox.log", 2000).decode(errors="replace")
            except (OSError, hostile_files.HostileFile):
                pass
        text = "\n".join(f"[rank {r.rank} log]\n{log_tail(r)}" for r in self.ranks if r.rank in ranks)
        return text + (f"\n[sandbox]\n{sandbox}" if sandbox.strip() else "")


def log_tail(r: RankPipes, limit: int = 3000) -> str:
    return bytes(r.log[-limit:]).decode(errors="replace")
