"""Starts a pool's W rank workers inside its sandbox, after setting the sandbox's resource limits.

    python -m harness.rank.launcher SPEC_JSON

SPEC_JSON: {"ranks": [{"rank": r, "request_fd": .., "reply_fd": .., "events_fd": .., "log_fd": ..}, ...],
"worker_args": [...], "limits": {"nofile": N, "fsize": BYTES}, "status_fd": S}. Each rank's worker gets
its own pipes and has its stdout and stderr on its log pipe (the harness reads and caps them). When a
worker exits, a line {"rank": r, "returncode": c} goes to the status pipe, so the harness can say how a
rank died (a negative code is the signal). The launcher ends when every worker has ended; the sandbox
(bwrap) ends with it. Standard library only at its top: it runs before any torch or candidate import.

With "fork": true in the spec (CPU pools: harness.launch.spawn) the launcher imports harness.rank.worker once,
after the limits are set, and forks each worker from itself instead of starting a new interpreter: a worker's
start is mostly importing torch (about 2.5 s of CPU each), so a pool of W ranks pays it once, not W times. The
forked worker is set up as the started one is: its own four descriptors and nothing else of the launcher's
(the status pipe, the other ranks' pipes), stdin from /dev/null, stdout and stderr on its log pipe, killed with
the launcher. A rank with a prefix (a profiler in front of it) is always started, and so is every rank where the
import left a second thread running (forking a threaded process can copy a held lock).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn

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


def die_with_parent(parent: int) -> None:
    """In each worker, between fork and exec: SIGKILL when the launcher (`parent`) dies. Whoever kills the
    launcher without the sandbox (Ray kills a dead worker's direct children; the launcher is one) would otherwise
    leave the ranks orphaned, holding their GPUs; sandboxed, bwrap's --die-with-parent ends the namespace anyway.
    The launcher is single-threaded, so 'the parent thread' is the launcher (the same holds for a launcher
    forked by harness.rank.zygote). A parent that died before the flag was set is not noticed by the kernel:
    the child checks and ends itself."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the reaper and the harness's kill of the launcher's group remain
    if os.getppid() != parent:
        os._exit(1)


def _worker_argv(entry: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    return ["--rank", str(entry["rank"]), "--request-fd", str(entry["request_fd"]), "--reply-fd",
            str(entry["reply_fd"]), "--events-fd", str(entry["events_fd"]), *entry.get("args", []),
            *spec["worker_args"]]


def preloaded_worker() -> ModuleType | None:
    """harness.rank.worker imported into the launcher, or None where forking from it would not be safe."""
    try:
        from harness.rank import worker  # deferred: after the limits, and only when the spec asks to fork
    except Exception:
        return None  # started ranks then fail to import it each, in their own logs, as they always did
    if len(os.listdir("/proc/self/task")) != 1:  # a native thread started by an import (an OpenMP pool...)
        return None
    return worker


def become_started(log_fd: int, keep: set[int]) -> None:
    """In a forked child: the descriptors a started process would have: stdin from /dev/null, stdout and stderr
    on `log_fd`, and of the rest only `keep` (as Popen's close_fds: the parent's other pipes go)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    keep = {0, 1, 2, *keep}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the listing's own descriptor, closed already


def exit_with(body: Callable[[], int | None]) -> NoReturn:
    """In a forked child: run `body` and end the process with its code (0 for None), never returning into the
    parent's code; an exception is printed (on the log) and ends it with 1."""
    code = 1
    try:
        returned = body()
        code = 0 if returned is None else returned
    except SystemExit as exc:  # argparse's usage error (2), or an exit of the worker's own
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _forked_worker(worker: ModuleType, entry: dict[str, Any], argv: list[str], launcher: int) -> NoReturn:
    """In the forked child: the same process a started worker would be, then the worker's main."""
    def body() -> None:
        die_with_parent(launcher)
        become_started(entry["log_fd"], {entry["request_fd"], entry["reply_fd"], entry["events_fd"]})
        sys.argv = [str(worker.__file__), *argv]
        worker.main(argv)

    exit_with(body)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    set_limits(spec.get("limits", {}))
    return run(spec, preloaded_worker() if spec.get("fork") else None)


def run(spec: dict[str, Any], preloaded: ModuleType | None) -> int:
    """Start the spec's ranks (forked from `preloaded` where given, else started), report each one's end on
    the status pipe, and return once every rank has ended. The limits are set already."""
    status = os.fdopen(spec["status_fd"], "w", buffering=1)
    procs: dict[int, int] = {}
    started: list[subprocess.Popen[bytes]] = []  # held: a dropped Popen may be reaped by the next one's cleanup
    me = os.getpid()
    for entry in spec["ranks"]:
        fds = (entry["request_fd"], entry["reply_fd"], entry["events_fd"])
        if preloaded is not None and not entry.get("prefix"):
            pid = os.fork()
            if pid == 0:
                _forked_worker(preloaded, entry, _worker_argv(entry, spec), me)
        else:
            started.append(subprocess.Popen(
                [*entry.get("prefix", []), sys.executable, "-m", "harness.rank.worker", *_worker_argv(entry, spec)],
                pass_fds=fds, stdin=subprocess.DEVNULL, stdout=entry["log_fd"], stderr=entry["log_fd"],
                preexec_fn=lambda: die_with_parent(me)))
            pid = started[-1].pid
        procs[pid] = entry["rank"]
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
    if preloaded is not None:  # skip torch's teardown at exit (about 0.5 s): nothing is left to tear down here
        status.close()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
