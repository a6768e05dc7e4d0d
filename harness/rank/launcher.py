"""Starts a pool's W rank workers inside its sandbox, after setting the sandbox's resource limits.

    python -m harness.rank.launcher SPEC_JSON

SPEC_JSON: {"ranks": [{"rank": r, "request_fd": .., "reply_fd": .., "events_fd": .., "log_fd": ..}, ...],
"worker_args": [...], "limits": {"nofile": N, "fsize": BYTES}, "status_fd": S}. Each rank's worker gets
its own pipes and has its stdout and stderr on its log pipe (the harness reads and caps them). When a
worker exits, a line {"rank": r, "returncode": c} goes to the status pipe, so the harness can say how a
rank died (a negative code is the signal). The launcher ends when every worker has ended; the sandbox
(bwrap) ends with it. Standard library only: it runs before any torch or candidate import.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_limits(limits: dict[str, int]) -> None:
    """Limits every process of the sandbox inherits. Lowering a hard limit cannot be undone inside."""
    pairs = [(resource.RLIMIT_CORE, 0)]
    if limits.get("nofile"):
        pairs.append((resource.RLIMIT_NOFILE, int(limits["nofile"])))
    if limits.get("fsize"):
        pairs.append((resource.RLIMIT_FSIZE, int(limits["fsize"])))
    for which, value in pairs:
        _, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (cap, cap))


def _die_with_launcher(launcher: int) -> None:
    """In each worker, between fork and exec: SIGKILL when the launcher dies. Whoever kills the launcher
    without the sandbox (Ray kills a dead worker's direct children; the launcher is one) would otherwise leave
    the ranks orphaned, holding their GPUs; sandboxed, bwrap's --die-with-parent ends the namespace anyway.
    The launcher is single-threaded, so 'the parent thread' is the launcher. A launcher that died before
    the flag was set is not noticed by the kernel: the worker checks and ends itself."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the reaper and the harness's kill of the launcher's group remain
    if os.getppid() != launcher:
        os._exit(1)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    set_limits(spec.get("limits", {}))
    status = os.fdopen(spec["status_fd"], "w", buffering=1)
    procs: dict[int, int] = {}
    me = os.getpid()
    for entry in spec["ranks"]:
        fds = (entry["request_fd"], entry["reply_fd"], entry["events_fd"])
        proc = subprocess.Popen(
            [*entry.get("prefix", []), sys.executable, "-m", "harness.rank.worker", "--rank", str(entry["rank"]),
             "--request-fd", str(entry["request_fd"]), "--reply-fd", str(entry["reply_fd"]),
             "--events-fd", str(entry["events_fd"]), *entry.get("args", []), *spec["worker_args"]],
            pass_fds=fds, stdin=subprocess.DEVNULL, stdout=entry["log_fd"], stderr=entry["log_fd"],
            preexec_fn=lambda: _die_with_launcher(me))
        procs[proc.pid] = entry["rank"]
        for fd in (*fds, entry["log_fd"]):
            os.close(fd)
    while procs:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        rank = procs.pop(pid, None)
        if rank is not None:
            returncode = -os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.WEXITSTATUS(code)
            status.write(json.dumps({"rank": rank, "returncode": returncode}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
