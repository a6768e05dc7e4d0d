"""Watching a running pool from outside: its sandbox's limits (the watch thread's breaches, the process count, the
ranks' output volume), the loopback bytes its ranks sent, every rank's stack when a request overruns, and the
record of what sandbox was in force. A limit broken is the candidate's failure (RankMisbehaved).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.common.paths import REPO_ROOT
from harness.launch.replies import RankPipes
from harness.launch.sandbox.namespace import pid_namespace_members, sandbox_init
from harness.launch.sandbox.watch import SandboxWatch
from harness.launch.spawn import PoolSettings, Spawned
from harness.launch.stacks import capture as capture_stacks


class RankMisbehaved(RuntimeError):
    """A rank broke a limit of its sandbox (output volume, process count, memory, tmpfs, scratch): the
    candidate's failure. `evidence`: the limits in force and what was measured, where known."""

    def __init__(self, rank: int | None, message: str, evidence: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.evidence = evidence


class Oversight:
    """The limits of one started pool, checked from outside it."""

    def __init__(self, settings: PoolSettings, spawned: Spawned, scratch: Path,
                 drain_log: Callable[[RankPipes], None]) -> None:
        self.settings = settings
        self.spawned = spawned
        self.drain_log = drain_log
        self.watch: SandboxWatch | None = None
        self._process_check_at = 0.0
        if spawned.policy is not None:
            watched = [scratch,
                       *([settings.extensions] if settings.extensions is not None else [])]
            self.watch = SandboxWatch(settings.sandbox_limits, spawned.proc.pid, watched, kill=self._kill_sandbox,
                                      cgroup=spawned.cgroup, names=self._rank_name).start()

    def _rank_name(self, pid: int) -> str:
        named = [r.rank for r in self.spawned.ranks if r.host_pid == pid]
        return f"rank {named[0]}" if named else f"process {pid}"

    def _kill_sandbox(self) -> None:
        """From the watch's thread: end the sandbox (bwrap's group; its PID namespace dies with it). The
        harness's thread then finds the ranks gone and the watch's reason."""
        try:
            os.killpg(self.spawned.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def limit_reached(self, failed: bool, sealed: bool) -> None:
        """Raise RankMisbehaved naming the sandbox's limit when the watch killed the sandbox, or when ranks
        failed (`failed`) and a limit explains it (a full tmpfs, the cgroup's OOM kill)."""
        if self.watch is None or not sealed:
            return  # no candidate code ran before the channel was sealed
        reason = self.watch.breach or (self.watch.explain() if failed else None)
        if reason:
            cgroup = self.spawned.cgroup
            measured = {"limits": self.settings.sandbox_limits.record(), "peak_memory_bytes": self.watch.peak_bytes,
                        "memory": cgroup.record() if cgroup is not None else {"backend": "watchdog"}}
            raise RankMisbehaved(None, reason, evidence=json.dumps(measured))

    def check_processes(self) -> None:
        """At most once a second: a sandbox holding more processes than its limit fails the pool (a fork
        bomb must not take the machine; RLIMIT_NPROC does not bind when the harness runs as root)."""
        now = time.monotonic()
        if not self.settings.sandboxed or now < self._process_check_at:
            return
        self._process_check_at = now + 1.0
        inside = sandbox_init(self.spawned.proc.pid)
        if inside is None:
            return
        count = len(pid_namespace_members(inside))
        limit = self.settings.sandbox_limits.processes
        if count > limit:
            raise RankMisbehaved(None, f"the ranks started {count} processes, more than the sandbox's limit of {limit}")

    def over_cap(self, r: RankPipes) -> None:
        """After each chunk of a rank's output: the ranks together may write `output_cap` bytes."""
        total = sum(x.log_bytes for x in self.spawned.ranks)
        cap = self.settings.output_cap
        if total > cap:
            raise RankMisbehaved(r.rank, f"the ranks wrote more than {cap >> 20} MiB to stdout "
                                         f"and stderr (rank {r.rank} wrote {r.log_bytes >> 20} MiB)")

    def net_bytes(self) -> int | None:
        """Bytes sent over the sandbox's loopback since it started (gloo and NCCL socket traffic between
        its ranks), read from outside; None where the pool has no network namespace of its own."""
        if not self.settings.sandboxed:
            return None
        inside = sandbox_init(self.spawned.proc.pid)
        if inside is None:
            return None
        try:
            for line in Path(f"/proc/{inside}/net/dev").read_text().splitlines():
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])  # transmitted bytes (on loopback every byte is also received)
        except (OSError, ValueError, IndexError):
            return None
        return None

    def stacks(self, timeout: float = 15.0) -> dict[int, str]:
        """Every live rank's Python stack (harness.launch.stacks)."""
        ranks = self.spawned.ranks

        def log_length(rank: int) -> int:
            return len(ranks[rank].log)

        def log_since(rank: int, mark: int) -> str:
            self.drain_log(ranks[rank])
            return bytes(ranks[rank].log[mark:]).decode(errors="replace")

        return capture_stacks({r.rank: r.host_pid for r in ranks if r.host_pid}, log_length, log_since, timeout)

    def record(self) -> dict[str, Any]:
        """integrity.sandbox: the sandbox in force, its uid model, what it bound, its limits and how memory was
        limited (a cgroup or the watchdog)."""
        return sandbox_record(self.settings, self.spawned)


def sandbox_record(settings: PoolSettings, spawned: Spawned | None) -> dict[str, Any]:
    """integrity.sandbox for a pool, started (`spawned`) or not."""
    if spawned is None or spawned.policy is None:
        return settings.sandbox.record()
    out = spawned.policy.record(REPO_ROOT)
    out["memory"] = spawned.cgroup.record() if spawned.cgroup is not None else {"backend": "watchdog"}
    return out
