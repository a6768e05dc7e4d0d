"""A group of W rank processes that the harness can always kill, and whose replies it reads as data.

A pool is one launcher process (harness.rank.launcher) that starts the W `harness.rank.worker`
processes (forked from the launcher on CPU); for a pool that loads candidate code (role "candidate") the
launcher runs inside a sandbox (harness.launch.sandbox: its own PID, user, network and IPC namespaces, a
read-only filesystem, one writable scratch folder), so killing the sandbox ends every process the ranks started.
Pools that only run references and problem code (role "trusted": reference timing, validation, tracing) skip
the sandbox.

Each rank has four pipes: requests (harness -> rank, typed: harness.common.messages), replies, events
(collectives as the rank's monitor sees them, written as they happen) and its stdout+stderr, which the harness
drains while it waits and caps (a rank that writes more than `output_cap` bytes fails the pool). Replies after
the "seal" request are JSON with an HMAC over the request's nonce and the body (harness.common.channel); nothing
a rank writes after that point is unpickled, and each reply is checked against its op's reply type. A rank runs
hostile code, so a reply is a claim: the judge (harness.judge) decides from the data in it, never from a
verdict it states.

When a request overruns, `Hang.stacks` holds every rank's Python stack (py-spy where installed, else
the worker's faulthandler), taken before the pool is killed: harness.judge.watchdog reads them to tell
ranks that wait on each other (deadlock) from ranks that are busy (timeout).

`RankPool` is the face; each job is a module beside it: the pool's folder and scratch (harness.launch.scratch),
starting the processes (.spawn), requests and replies (.exchange, with the pipes' framing in .replies),
watching the sandbox's limits (.oversight, stack capture in .stacks) and ending it all (.teardown); what a
killed harness left behind is harness.launch.leftovers.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from harness import cancel
from harness.common import hostile_files
from harness.launch import leftovers, teardown
from harness.launch.exchange import Exchange, Hang, Outgoing, PoolError, outgoing
from harness.launch.oversight import Oversight, RankMisbehaved, sandbox_record
from harness.launch.replies import RankPipes
from harness.launch.sandbox import SandboxInfo
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.scratch import SCRATCH_DIRS, Lease
from harness.launch.spawn import (
    OUTPUT_CAP,
    LauncherProcess,
    PoolSettings,
    Spawned,
    find_host_pids,
    sandbox_for,
    spawn,
    worker_env,
)

# The names other modules import from here.
__all__ = ["OUTPUT_CAP", "SCRATCH_DIRS", "Hang", "PoolError", "RankMisbehaved", "RankPool", "worker_env"]


class RankPool:
    """W worker processes joined in one process group, with a sealed reply channel. Use as a context
    manager."""

    def __init__(self, world_size: int, device: str = "cpu", *, start_timeout: float = 120.0,
                 env: dict[str, str] | None = None, keep_logs: Path | None = None,
                 gpus: list[int] | None = None, rank_prefix: dict[int, list[str]] | None = None,
                 role: str = "trusted", extensions: Path | None = None, output_cap: int = OUTPUT_CAP,
                 fsize_limit: int = 16 << 30, nofile_limit: int = 16384,
                 sandbox: bool = True, visible: tuple[Path, ...] = (), ranks_per_gpu: int = 1,
                 sandbox_limits: SandboxLimits | None = None) -> None:
        """`gpus`: physical GPU indices, one per rank (default: 0..W-1), exported as CUDA_VISIBLE_DEVICES
        so rank r sees its GPU as cuda:r and two pools on disjoint GPU sets never collide.
        `rank_prefix`: a command to wrap one rank's process with (e.g. a profiler), keyed by rank.
        `role`: "candidate" for pools that load candidate code (sandboxed), "trusted" for the rest.
        `extensions`: the folder mounted as the sandbox's torch extension folder (candidate pools).
        `sandbox=False` runs a candidate pool without its sandbox (Nsight Compute needs the GPU's
        performance counters, which a user namespace cannot reach); the record says so.
        `visible`: files or folders a sandbox must see read-only: the candidate's copy, a problem's file or
        checkout (harness.launch.sandbox.mounts binds the rest from facts).
        `ranks_per_gpu` > 1: ranks share GPUs (gpus may then repeat), join gloo, and a candidate pool's
        ranks get harness.emulation's symmetric memory.
        `sandbox_limits`: memory, tmpfs and scratch limits of a sandboxed pool (default: the integrity
        settings' defaults for W ranks)."""
        if role not in ("trusted", "candidate"):
            raise ValueError(f"unknown pool role {role!r}")
        if gpus is not None and len(gpus) != world_size:
            raise ValueError(f"{world_size} ranks need one GPU entry each, got {gpus}")
        self.settings = PoolSettings(
            world_size=world_size, device=device, role=role, sandbox=sandbox_for(role, sandbox),
            sandbox_limits=sandbox_limits or SandboxLimits.for_ranks(world_size), start_timeout=start_timeout,
            extra_env=env or {}, gpus=gpus, rank_prefix=rank_prefix or {}, extensions=extensions, visible=visible,
            output_cap=output_cap, limits={"nofile": nofile_limit, "fsize": fsize_limit}, ranks_per_gpu=ranks_per_gpu)
        self.world_size, self.device, self.role = world_size, device, role
        self.keep_logs = keep_logs
        self.lease = Lease(self.settings.host_uid_switch, extensions)
        self.spawned: Spawned | None = None
        self.oversight: Oversight | None = None
        self.exchange: Exchange | None = None
        self.start_seconds = 0.0
        self.last_span_s = 0.0
        # In every rank's environment, so inherited by all they start: kill() finds by it what left
        # the ranks' sessions (unsandboxed pools).
        self._marker = f"{leftovers.POOL_MARKER}={secrets.token_hex(12)}"  # matches leftovers.MARKER_LINE
        self._started_at = 0.0
        self._killer: int | None = None  # harness.cancel's key for this pool's processes

    # -- what others read -----------------------------------------------------------------------
    @property
    def sandbox(self) -> SandboxInfo:
        return self.settings.sandbox

    @property
    def sandboxed(self) -> bool:
        return self.settings.sandboxed

    @property
    def scratch(self) -> Path | None:
        return self.lease.scratch

    @property
    def scratch_files(self) -> hostile_files.Folder | None:
        """The scratch held open from before any rank started: the one way the harness touches what the
        ranks wrote there (harness.common.hostile_files)."""
        return self.lease.files

    @property
    def ranks(self) -> list[RankPipes]:
        return self.spawned.ranks if self.spawned is not None else []

    @property
    def proc(self) -> LauncherProcess | None:
        return self.spawned.proc if self.spawned is not None else None

    @property
    def _keys(self) -> dict[int, bytes] | None:
        return self.exchange.keys if self.exchange is not None else None

    @property
    def sealed(self) -> bool:
        return self._keys is not None

    @property
    def alive(self) -> bool:
        proc = self.proc
        return bool(self.ranks) and proc is not None and not proc.ended() \
            and all(r.returncode is None for r in self.ranks)

    def pids(self) -> list[int]:
        """Host pids of the rank workers."""
        return [r.host_pid for r in self.ranks if r.host_pid is not None]

    def record(self) -> dict[str, Any]:
        """integrity.sandbox: the sandbox in force, its uid model, what it bound, its limits and how memory was
        limited (a cgroup or the watchdog)."""
        return sandbox_record(self.settings, self.spawned)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RankPool:
        self.launch()
        return self.wait_ready()

    def launch(self) -> RankPool:
        """Start the processes; wait_ready() waits for them. Between the two the harness may do other work."""
        self._started_at = time.perf_counter()
        folder, scratch = self.lease.take(self._marker)
        self.spawned = spawned = spawn(self.settings, folder, scratch, self._marker)
        self.oversight = Oversight(self.settings, spawned, scratch, self._drain_log)
        self.exchange = Exchange(spawned.ranks, spawned.status_fd, self.role, self.oversight)
        # Ctrl-C of the command ends this pool's processes from the main thread at once; this thread then
        # sees the pipes close (or its next poll) and cleans up with kill().
        self._killer = cancel.register(self._signal_processes)
        return self

    def exchange_dir(self, name: str, writable: bool) -> Path:
        """A folder of the scratch the harness and the ranks exchange files through (harness.launch.scratch)."""
        return self.lease.exchange_dir(name, writable)

    def wait_ready(self) -> RankPool:
        assert self.exchange is not None
        try:
            replies = self.exchange.collect(self.settings.start_timeout, grace=5.0)
        except cancel.Cancelled:
            self.kill()  # a pool entered with `with` has no __exit__ when its start fails
            raise
        except Hang as hang:
            tails = self._log_tails(hang.missing)
            self.kill()
            raise PoolError(f"rank processes did not start: {hang}; {tails}") from hang
        bad = [r for r in replies.values() if not r["ok"]]
        if bad:
            tails = self._log_tails([bad[0]["rank"]])
            self.kill()
            raise PoolError(f"rank {bad[0]['rank']} failed to start: {bad[0].get('message')}\n"
                            f"{bad[0].get('evidence', '')}{tails}")
        for r in self.ranks:
            r.inner_pid = replies[r.rank].get("pid")
        if self.spawned is not None:
            find_host_pids(self.spawned, self.sandboxed)
        self._seal()
        self.start_seconds = time.perf_counter() - self._started_at
        return self

    def _seal(self) -> None:
        assert self.exchange is not None
        try:
            replies = self.exchange.seal(self.settings.start_timeout)
        except cancel.Cancelled:
            self.kill()
            raise
        except (Hang, OSError) as err:
            self.kill()
            raise PoolError(f"rank processes did not take their reply keys: {err}") from err
        bad = [r for r in replies.values() if not r["ok"]]
        if bad:
            self.kill()
            raise PoolError(f"rank {bad[0]['rank']} failed to seal its channel: {bad[0].get('message')}")

    def __enter__(self) -> RankPool:
        return self.start() if not self.ranks else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 10.0) -> None:
        """Ask every rank to exit; kill whatever has not exited by the deadline (at once after Ctrl-C)."""
        if cancel.requested():
            self.kill()
            return
        if self.exchange is not None:
            self.exchange.ask_exit()
        if self.spawned is not None:
            self.spawned.proc.wait_ended(timeout)  # what is left is killed next
        self.kill()

    def kill(self) -> None:
        """End every process of the pool, close the pipes, keep the logs where asked, remove the pool's folder
        (harness.launch.teardown). Nothing when killed already."""
        if self.oversight is not None:
            self.oversight.stop()
        if self._killer is not None:
            cancel.unregister(self._killer)
            self._killer = None
        spawned, self.spawned = self.spawned, None
        if spawned is not None:
            teardown.end_spawned(spawned, self.sandboxed, self._marker,
                                 self.exchange.status_fd if self.exchange is not None else None,
                                 self.keep_logs if self.lease.folder is not None else None)
        if self.exchange is not None:
            self.exchange.forget()
        self.lease.give_back()

    def _signal_processes(self) -> None:
        spawned = self.spawned
        if spawned is not None:
            teardown.signal_processes(spawned.proc, self._marker)

    # -- requests -------------------------------------------------------------------------------
    def request(self, message: Outgoing, timeout: float, grace: float = 5.0,
                build_allowance: float = 0.0) -> list[dict[str, Any]]:
        """Send one request to every rank (the same message, or one per rank keyed by rank; typed, or as the
        dict harness.common.messages checks); return the replies in rank order, each checked against its op's
        reply type. `last_span_s` is the harness's own time from the first send to the last reply.

        Raises Hang (with every rank's stack) when a rank has not answered by `timeout`, or within
        `grace` seconds of another rank reporting a failure (its peers are then usually stuck in a
        collective); RankMisbehaved when a rank breaks a limit of its sandbox. A rank that reported a
        native build starting (a build inside a call) gets up to `build_allowance` seconds from then.
        """
        if self.oversight is not None:
            self.oversight.limit_reached(False, self.sealed)  # the watch ended the sandbox between two requests
        if not self.alive or self.exchange is None:
            raise PoolError("the rank pool is not running")
        per_rank = outgoing(message, self.world_size, self.role)
        started = self.exchange.send(per_rank)
        replies = self.exchange.collect(timeout, grace, build_allowance)
        # Up to the last reply: the harness's own chores after it (the sandbox's process count, a scan of
        # /proc that takes tens of milliseconds on a busy machine) are no part of what the ranks took.
        self.last_span_s = self.exchange.last_reply_at - started
        return [replies[i] for i in range(self.world_size)]

    def building(self, ranks: list[int] | None = None) -> list[int]:
        """Ranks inside a native build right now (from their build events)."""
        return [r.rank for r in self.ranks if r.building_since is not None and (ranks is None or r.rank in ranks)]

    def build_seconds(self) -> float:
        """The longest time any rank spent in native builds inside calls so far."""
        return max((r.build_seconds for r in self.ranks), default=0.0)

    def take_events(self) -> dict[int, dict[str, int]]:
        """Collectives each rank's monitor reported since the last call (drained now)."""
        return self.exchange.take_events() if self.exchange is not None and self.spawned is not None else {}

    def net_bytes(self) -> int | None:
        """Bytes sent over the sandbox's loopback since it started (harness.launch.oversight)."""
        return self.oversight.net_bytes() if self.oversight is not None and self.spawned is not None else None

    def stacks(self, timeout: float = 15.0) -> dict[int, str]:
        """Every live rank's Python stack (harness.launch.stacks)."""
        return self.oversight.stacks(timeout) if self.oversight is not None and self.spawned is not None else {}

    def _drain_log(self, r: RankPipes) -> None:
        if self.exchange is not None:
            self.exchange.drain(r, "log")

    def _log_tails(self, ranks: list[int]) -> str:
        return self.exchange.log_tails(ranks, self.lease.folder) if self.exchange is not None else ""
