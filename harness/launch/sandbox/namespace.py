"""A sandbox's processes, found from outside through /proc: its PID namespace's init and members.
Standard library only."""

from __future__ import annotations

import os
from pathlib import Path


def children(pid: int) -> list[int]:
    """The children of `pid`, whichever of its threads started them."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


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


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it. From a sandbox's init, that is every process of its PID namespace
    (orphans are given to the init), found without reading the rest of the machine's /proc."""
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children(current))
    return found


def start_time(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot, from /proc): with the pid, a name no later process has."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
