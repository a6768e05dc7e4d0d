"""Enforces a sandbox's limits from outside while it lives (memory, processes, scratch), and names the limit
a failing sandbox reached.

A thread of the harness reads, every quarter second, the sandbox's memory (the cgroup's OOM-kill counter, or
harness.launch.sandbox.memory.measure where there is no cgroup) and its processes, and, every second, the
bytes and entries in its scratch and extension folders (never following a link, stopping at the entry limit).
Over a limit, it kills the sandbox (bubblewrap's process group; the PID namespace dies with it) and keeps the
reason: harness.launch.pool turns it into the candidate's runtime_error, so going over ends the phase at once
instead of at its time limit. `explain` says, after a rank failed, whether a limit was the cause: a tmpfs
(/tmp, /dev/shm) that is full makes its writers fail (ENOSPC, or SIGBUS through a mapping) without any process
of the harness having to act. Given a niceness, it also keeps the sandbox's sessions that nice
(harness.launch.priority), once a second. Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.launch.priority import keep_sessions_nice
from harness.launch.sandbox.limits import SandboxLimits, gib
from harness.launch.sandbox.memory import MemoryCgroup, measure, tmpfs_used
from harness.launch.sandbox.namespace import descendants, sandbox_init

MEMORY_PERIOD_S = 0.25
FOLDER_PERIOD_S = 1.0
FULL_SLACK = 1 << 20  # a tmpfs with less than this left counts as full


def folder_usage(folders: list[Path], max_entries: int) -> tuple[int, int]:
    """(bytes allocated, entries) under `folders`, links not followed; stops counting past max_entries."""
    total = entries = 0
    stack = [str(f) for f in folders]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                entries += 1
                if entries > max_entries:
                    return total, entries
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total, entries


class SandboxWatch:
    """One sandbox's limits, watched from a thread of the harness until `stop`."""

    def __init__(self, limits: SandboxLimits, bwrap_pid: int, folders: list[Path], kill: Callable[[], None],
                 cgroup: MemoryCgroup | None = None, names: Callable[[int], str] | None = None,
                 niceness: int | None = None, full_tmpfs_ends: bool = False) -> None:
        self.limits, self.bwrap_pid, self.folders, self.kill, self.cgroup = limits, bwrap_pid, folders, kill, cgroup
        self.niceness = niceness  # kept on the sandbox's sessions (harness.launch.priority), None: left alone
        self.names = names or (lambda pid: f"pid {pid}")
        # The shell's watch ends a command whose /tmp or /dev/shm is full (the write that did not fit failed,
        # and the command may go on as if it had not); a rank's failure is explained afterwards instead.
        self.full_tmpfs_ends = full_tmpfs_ends
        self.breach: str | None = None
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pkb-sandbox-watch", daemon=True)
        self._folders_at = 0.0

    def start(self) -> SandboxWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(MEMORY_PERIOD_S):
            try:
                reason = self._over()
            except Exception as err:  # a watch that cannot read its sandbox fails it: fail closed
                reason = f"the sandbox's limits could not be read ({type(err).__name__}: {err})"
            if reason and not self._stop.is_set():
                self.breach = reason
                self.kill()
                return

    def _init(self) -> int | None:
        return sandbox_init(self.bwrap_pid)

    def _over(self) -> str | None:
        """The first limit the sandbox is over now, or None."""
        reason = self._memory_over() or self._processes_over()
        if reason is None and time.monotonic() >= self._folders_at:
            self._folders_at = time.monotonic() + FOLDER_PERIOD_S
            reason = self._folders_over() or (self._tmpfs_full() if self.full_tmpfs_ends else None)
            if self.niceness is not None:
                keep_sessions_nice(descendants(self.bwrap_pid), self.niceness)
        return reason

    def _memory_over(self) -> str | None:
        limit = self.limits.memory_bytes
        if self.cgroup is not None:
            kills = self.cgroup.oom_kills()
            if kills:
                peak = self.cgroup.peak_bytes()
                seen = f" (peak {gib(peak)})" if peak else ""
                return (f"the sandbox went over its memory limit of {self.limits.describe('memory')}{seen}: the "
                        f"kernel killed {kills} of its processes")
            used = self.cgroup.charged_bytes() or 0
            self.peak_bytes = max(self.peak_bytes, used)
            if used <= limit:
                return None
            return (f"the sandbox's processes used {gib(used)} of memory (its cgroup's anonymous and shared "
                    f"memory, /dev/shm and /tmp included), over its limit of {self.limits.describe('memory')}")
        init = self._init()
        if init is None:
            return None
        root = f"/proc/{init}/root"
        used, each = measure(descendants(init), [f"{root}/tmp", f"{root}/dev/shm"])
        self.peak_bytes = max(self.peak_bytes, used)
        if used <= limit:
            return None
        top = max(each, key=lambda p: each[p]) if each else None
        biggest = f"; the largest process is {self.names(top)} with {gib(each[top])}" if top is not None else ""
        return (f"the sandbox's processes used {gib(used)} of memory (shared memory in /dev/shm and /tmp "
                f"included), over its limit of {self.limits.describe('memory')}{biggest}")

    def _folders_over(self) -> str | None:
        used, entries = folder_usage(self.folders, self.limits.scratch_files)
        if entries > self.limits.scratch_files:
            return (f"the sandbox's scratch holds more than {self.limits.describe('files')} files and folders, "
                    f"over its limit")
        if used > self.limits.scratch_bytes:
            return (f"the sandbox's scratch holds {gib(used)}, over its limit of "
                    f"{self.limits.describe('scratch')}")
        return None

    def _processes_over(self) -> str | None:
        """A sandbox holding more processes than its limit is ended (a fork bomb must not take the machine;
        RLIMIT_NPROC does not bind when the harness runs as root)."""
        init = self._init()
        if init is None:
            return None
        count = len(descendants(init))
        if count <= self.limits.processes:
            return None
        return f"the sandbox held {count} processes, over its limit of {self.limits.describe('processes')}"

    def explain(self) -> str | None:
        """Why the sandbox's ranks failed, when a limit is the reason: the watch's own finding, the
        cgroup's OOM kills, a full /tmp or /dev/shm, a scratch over its limit. None otherwise."""
        if self.breach:
            return self.breach
        reason = self._memory_over() if self.cgroup is not None else None
        if reason:
            return reason
        return self._tmpfs_full() or self._folders_over()

    def _tmpfs_full(self) -> str | None:
        init = self._init()
        if init is not None:
            for mount, what in (("/dev/shm", "shm"), ("/tmp", "tmp")):
                found = tmpfs_used(f"/proc/{init}/root{mount}")
                if found is not None and found[1] - found[0] < FULL_SLACK:
                    return (f"the sandbox's {mount} is full ({gib(found[0])}): its size is "
                            f"{self.limits.describe(what)}")
        return None
