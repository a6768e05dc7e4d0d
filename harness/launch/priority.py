"""CPU priority for work that holds no device (a candidate's build) beside work that does (ranks under a GPU
lease, a timed candidate's host side).

Linux schedules the sessions of a machine as groups when autogroups are on (the default of many desktop and
VM kernels; on on the CPU machine and on the H200 node, 2026-12-02): every session gets an equal share
of the CPU, and a process's own nice value orders it only within its session. A niced build in a session of
its own took as much CPU from an evaluation as before (2-core CPU machine, 2026-12-02: docs/performance.md).
So both are set: the processes' nice value (inherited by every child; unprivileged code cannot lower it
again) and their sessions' autogroup nice value, which any process may set back to 0 for its own session
(or leave by setsid): the harness, as the sandbox's watch, sets it again while the sandbox lives.

Best effort throughout: a priority decides how fast a build goes, never what it may do; without autogroups
the files are absent and the nice value alone counts.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable


def niced(command: list[str], niceness: int) -> list[str]:
    """`command` started through coreutils' nice; unchanged where nice is missing or niceness is 0."""
    nice = shutil.which("nice")
    return [nice, "-n", str(niceness), *command] if nice and niceness else command


def session_niceness(pid: int) -> int | None:
    """The nice value of the autogroup (session) of `pid`, or None (no autogroups, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_session_niceness(pid: int, niceness: int) -> bool:
    """Give the session of `pid` the autogroup nice value `niceness`; whether it took."""
    try:
        fd = os.open(f"/proc/{pid}/autogroup", os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        os.write(fd, str(niceness).encode())  # an error surfaces here, not at close
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def keep_sessions_nice(pids: Iterable[int], niceness: int) -> int:
    """Set again every session among `pids` whose autogroup has become less nice than `niceness` (a process
    wrote its own autogroup back, or called setsid); the number of sessions set."""
    done: set[int] = set()
    for pid in pids:
        current = session_niceness(pid)
        if current is not None and current < niceness and set_session_niceness(pid, niceness):
            done.add(pid)
    return len(done)
