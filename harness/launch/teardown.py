"""Ending a pool: every process it started, wherever it went, then its pipes, and its ranks' logs kept where
asked. Sandboxed: SIGKILL of bwrap takes its init with it (--die-with-parent), and the kernel then ends every
process of the sandbox's PID namespace. Unsandboxed: the launcher's session, then every process carrying the
pool's marker (what called setsid).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from harness.common import channel, hostile_files
from harness.launch.replies import RankPipes
from harness.launch.sandbox.namespace import pid_namespace_members, sandbox_init
from harness.launch.spawn import LauncherProcess, Spawned
from harness.records.redaction import redact_bytes


def signal_processes(proc: LauncherProcess, marker: str) -> None:
    """SIGKILL of the pool's session and of whatever carries its marker: signals only, no pipe or folder is
    touched, so any thread may call it while the pool's owner is inside a request."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # sandboxed: bwrap's init, and so the namespace, dies with it
    except (ProcessLookupError, PermissionError):
        pass
    channel.kill_session(proc.pid)
    channel.kill_marked(marker)


def end_processes(proc: LauncherProcess, sandboxed: bool, marker: str) -> None:
    """End the launcher, everything in its sandbox or session, and everything carrying the pool's marker."""
    init = sandbox_init(proc.pid) if sandboxed else None
    members = pid_namespace_members(init) if init is not None else []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    channel.kill_session(proc.pid)
    proc.wait_ended(30)
    channel.kill_session(proc.pid)
    for pid in members:  # normally gone with the namespace's init already
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    channel.kill_marked(marker)


def end_spawned(spawned: Spawned, sandboxed: bool, marker: str, status_fd: int | None,
                keep_logs_in: Path | None) -> None:
    """Everything a pool spawned, ended: its processes, its memory cgroup (and whatever is still in it), its
    pipes; the ranks' logs kept in `keep_logs_in` where given."""
    end_processes(spawned.proc, sandboxed, marker)
    if spawned.cgroup is not None:
        spawned.cgroup.remove()
    close_pipes(spawned.ranks, status_fd)
    if keep_logs_in is not None:
        keep_logs(spawned.ranks, keep_logs_in)


def close_pipes(ranks: list[RankPipes], status_fd: int | None) -> None:
    for r in ranks:
        for conn in (r.requests, r.replies):
            try:
                conn.close()
            except OSError:
                pass
        for fd in (r.events_fd, r.log_fd):
            if fd < 0:  # drained to the end and closed already (harness.launch.replies.drain)
                continue
            try:
                os.close(fd)
            except OSError:
                pass
    if status_fd is not None:
        try:
            os.close(status_fd)
        except OSError:
            pass


def keep_logs(ranks: list[RankPipes], folder: Path) -> None:
    """Each rank's output tail, redacted, as `rank<r>.log` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        hostile_files.replace_file(folder / f"rank{r.rank}.log", redact_bytes(bytes(r.log)))
