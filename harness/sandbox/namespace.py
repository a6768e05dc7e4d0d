"""A sandbox's processes, found from outside through /proc: its PID namespace's init and members.
Standard library only."""

from __future__ import annotations

import os
from pathlib import Path


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def sandbox_init(bwrap_pid: int) -> int | None:
    """The host pid of the init of a sandbox's PID namespace (bwrap's child), or None when it is gone or
    is not in a namespace of its own."""
    for child in children(bwrap_pid):
        try:
            if os.readlink(f"/proc/{child}/ns/pid") != os.readlink("/proc/self/ns/pid"):
                return child
        except OSError:
            continue
    return None


def pid_namespace_members(host_pid: int) -> list[int]:
    """Host pids of the live processes in the PID namespace of `host_pid`; empty when that namespace is
    this process's own (never the whole machine's processes, whatever pid it is given)."""
    try:
        target = os.readlink(f"/proc/{host_pid}/ns/pid")
        if target == os.readlink("/proc/self/ns/pid"):
            return []
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and os.readlink(entry / "ns" / "pid") == target:
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found
