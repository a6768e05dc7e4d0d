"""A fork server for trusted CPU pools: imports the rank worker once, then forks a launcher for each pool asked.

    python -m harness.rank.zygote SOCKET_FD

A CPU pool's launcher spends most of its start importing torch (harness.rank.launcher); a trusted pool's
launcher runs nothing but the harness's own code, so one process per harness process (harness.launch.zygote)
can pay that import once and fork a launcher for each trusted pool from there. Candidate pools never come
here: they start in a sandbox of their own.

Requests come on SOCKET_FD (a SOCK_SEQPACKET socket: one message per request) as JSON with the launcher's
descriptors attached (SCM_RIGHTS): {"spec": the launcher's spec, "env": {...}, "cwd": "...", "fds": [the
caller's numbers of the attached descriptors, in order], "stdout": the caller's number of the launcher's log}.
The reply is {"pid": N} with a pidfd of the launcher attached (so the caller can wait for a process that is
not its child, without a recycled pid ever standing in for it), or {"error": "..."}.

The forked launcher is set up as a started one is: its own session, the request's environment and working
directory, stdin from /dev/null, stdout and stderr on its log, nothing of the server's (the socket, other
pools' descriptors); it dies with the server (which is single-threaded, so the parent-death signal is reliable).
One difference stays: /proc/PID/environ shows the environment a process was exec'd with, and these launchers
and their ranks were not, so the pool's marker is in their environment but not in that file. Teardown ends
them by their session (harness.launch.teardown), which trusted code does not leave.

The server reaps its launchers, and ends when its socket closes (the harness process ended or retired it),
once every launcher it forked has ended. Standard library only at its top, as the launcher.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from types import ModuleType
from typing import Any, NoReturn

from harness.rank import launcher

MAX_MESSAGE = 1 << 20  # bytes of one request: a spec and an environment
MAX_FDS = 253  # the kernel's limit of descriptors in one message (SCM_MAX_FD)
REAP_EVERY_MS = 500


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _renumbered(request: dict[str, Any], received: list[int]) -> tuple[dict[str, Any], int]:
    """The spec with each of the caller's descriptor numbers replaced by the one received here, and the log's."""
    theirs = request["fds"]
    if not isinstance(theirs, list) or len(theirs) != len(received) or len(set(theirs)) != len(theirs):
        raise ValueError(f"{len(received)} descriptor(s) came for {theirs!r}")
    mine = dict(zip(theirs, received))
    spec = json.loads(json.dumps(request["spec"]))
    for entry in spec["ranks"]:
        for key in ("request_fd", "reply_fd", "events_fd", "log_fd"):
            entry[key] = mine[entry[key]]
    spec["status_fd"] = mine[spec["status_fd"]]
    return spec, mine[request["stdout"]]


def _launcher(worker: ModuleType, spec: dict[str, Any], stdout: int, env: dict[str, str], cwd: str,
              server: int, keep: set[int]) -> NoReturn:
    """In the forked child: the process `python -m harness.rank.launcher SPEC` would be, then its run."""
    def body() -> int:
        os.setsid()
        launcher.die_with_parent(server)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        launcher.become_started(stdout, keep)  # the socket and the log's own number go
        sys.argv = [str(launcher.__file__), json.dumps(spec)]
        launcher.set_limits(spec.get("limits", {}))
        return launcher.run(spec, worker)

    launcher.exit_with(body)


def _serve_one(sock: socket.socket, worker: ModuleType) -> bool:
    """Answer one request; False when the socket has closed."""
    message, received, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not message and not received:
        return False
    pid, pidfd = 0, -1
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("the request was cut short")
        request = json.loads(message)
        spec, stdout = _renumbered(request, received)
        env, cwd = dict(request["env"]), str(request["cwd"])
        keep = {fd for entry in spec["ranks"] for fd in
                (entry["request_fd"], entry["reply_fd"], entry["events_fd"], entry["log_fd"])} | {spec["status_fd"]}
        pid = os.fork()
        if pid == 0:
            _launcher(worker, spec, stdout, env, cwd, os.getppid(), keep)
        pidfd = os.pidfd_open(pid)  # before any reap: the pid cannot have been recycled yet
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
    except Exception as err:  # a bad request is answered, not fatal: the caller starts its launcher itself
        if pid:  # forked, but the caller will not hear of it: the launcher must not run beside the one it starts
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        sock.send(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
    finally:
        for fd in (*received, pidfd):
            if fd >= 0:
                os.close(fd)
    return True


def serve(sock: socket.socket, worker: ModuleType) -> None:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        _reap()
        if poller.poll(REAP_EVERY_MS) and not _serve_one(sock, worker):
            break
    while True:  # retired: the launchers still running end on their own (their pools close them)
        try:
            os.wait()
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    worker = launcher.preloaded_worker()
    if worker is None:  # not safe to fork from here: the caller sees the socket close and starts launchers
        return 1
    serve(sock, worker)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    os._exit(code)  # torch's teardown at exit is not needed: nothing here holds a resource to release
