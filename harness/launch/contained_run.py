"""Run a command under a time limit and end every process it started, wherever they went.

A process group is not enough for programs that start sessions of their own: PKB's run_local.py starts
torchrun with `start_new_session=True`, so killing run_local's group leaves torchrun and its ranks
running (and, on the device machines, a new session outlives the command that started it). Every process
started here therefore carries a fresh token in its environment (children inherit it: run_local passes
its environment to torchrun, torchrun to the ranks, the ranks to nvcc); when the command ends or runs out
of time, its own group is killed, then every process whose environment holds the token, until none is
left. Linux only (it reads /proc); elsewhere only the command's own group is ended.

A program that rewrites its own environment before exec'ing could hide from the scan: this is meant for
trusted launchers (PKB's own scripts) running code that was never written to evade it, not as a sandbox.

Standard library only (and harness.common.hostile_files, which is).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.common.hostile_files import HostileFile, read_tail

TOKEN_VAR = "PKB_CONTAINED_RUN_TOKEN"
GRACE_S = 3.0  # after SIGTERM, how long processes get to exit before SIGKILL
REAP_S = 15.0  # how long to keep killing and waiting for the token's processes to disappear
PROC = Path("/proc")
OUTPUT_KEPT = 16 << 20  # bytes of the command's stdout and of its stderr read back (the end of each)


@dataclass
class RunOutcome:
    """What one contained command did. `returncode` is None when it was killed for its time limit."""

    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    token: str
    leftovers: list[int] = field(default_factory=list)  # pids still alive after the command, then ended
    survivors: list[int] = field(default_factory=list)  # pids that could not be ended (should stay empty)


def token_pids(token: str, proc: Path = PROC) -> list[int]:
    """Pids of live processes whose environment holds TOKEN_VAR=token (zombies have none to read)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    me = os.getpid()
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's process
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def _signal_all(pids: Sequence[int], group: int | None, sig: int) -> None:
    if group is not None:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_token_processes(token: str, group: int | None = None, grace_s: float = GRACE_S,
                        reap_s: float = REAP_S) -> tuple[list[int], list[int]]:
    """SIGTERM, then SIGKILL, the process group `group` and every process carrying `token`, until none is
    left or `reap_s` has passed. Returns (pids found alive, pids still alive at the end)."""
    seen = token_pids(token)
    _signal_all(seen, group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and token_pids(token):
        time.sleep(0.05)
    deadline = time.monotonic() + reap_s
    alive = token_pids(token)
    while alive and time.monotonic() < deadline:
        seen = sorted(set(seen) | set(alive))
        _signal_all(alive, group, signal.SIGKILL)
        time.sleep(0.05)
        alive = token_pids(token)
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)  # anything of the group that dropped the token
        except (ProcessLookupError, PermissionError):
            pass
    return seen, alive


def run_contained(command: Sequence[str], *, timeout_s: float, cwd: str | Path | None = None,
                  env: Mapping[str, str] | None = None, log_dir: str | Path) -> RunOutcome:
    """Run `command` (stdout and stderr to files under `log_dir`, read back at the end), kill it and
    everything it started when `timeout_s` passes, and in any case end whatever it left running."""
    token = uuid.uuid4().hex
    full_env = {**(os.environ if env is None else env), TOKEN_VAR: token}
    log = Path(log_dir)
    log.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log / "stdout.txt", log / "stderr.txt"
    started = time.monotonic()
    timed_out = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(list(command), cwd=str(cwd) if cwd else None, env=full_env, stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out, returncode = True, None
        finally:
            # Also after a normal exit: torchrun in its own session, or a daemon, may outlive the command.
            leftovers, survivors = end_token_processes(token, group=proc.pid)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    wall = time.monotonic() - started
    return RunOutcome(returncode=returncode, stdout=_tail(out_path), stderr=_tail(err_path), wall_s=wall,
                      timed_out=timed_out, token=token, leftovers=[p for p in leftovers if p != proc.pid],
                      survivors=survivors)


def _tail(path: Path) -> str:
    """The last OUTPUT_KEPT bytes the command wrote: whatever ran in it (a solution, in PKB's harness) may have
    written gigabytes, and its verdict lines come last."""
    try:
        return read_tail(path, OUTPUT_KEPT).decode(errors="replace")
    except (OSError, HostileFile):
        return ""
