"""Every rank's Python stack at the moment a request overran, taken from outside the rank before the pool
is killed: harness.judge.watchdog reads them to tell ranks that wait on each other (deadlock) from ranks
that are busy (timeout)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

STACK_CHARS = 6000  # of each rank's stack kept (the innermost frames: the end of a dump)


def capture(pids: dict[int, int], log_length: Callable[[int], int], log_since: Callable[[int, int], str],
            timeout: float = 15.0) -> dict[int, str]:
    """The stacks of the ranks `pids` (rank -> host pid): py-spy (from outside) where it is installed, else
    the worker's faulthandler (SIGUSR1; the dump lands in its log: `log_length(rank)` marks where the log
    stood before the signal, `log_since(rank, mark)` reads what came after)."""
    spy = shutil.which("py-spy")
    out: dict[int, str] = {}
    if spy:
        procs = {rank: subprocess.Popen([spy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                 for rank, pid in pids.items()}
        deadline = time.monotonic() + timeout
        for rank, proc in procs.items():
            try:
                text, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                out[rank] = text.decode(errors="replace")[-STACK_CHARS:]
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        if all(("Thread" in text) for text in out.values()) and len(out) == len(pids):
            return out
    marks = {}
    for rank, pid in pids.items():
        marks[rank] = log_length(rank)
        try:
            os.kill(pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError):
            pass
    time.sleep(0.5)
    for rank, mark in marks.items():
        if rank not in out:
            dump = log_since(rank, mark)
            if "File " in dump:
                out[rank] = dump[-STACK_CHARS:]
    return out
