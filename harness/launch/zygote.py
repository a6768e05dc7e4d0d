"""The harness's side of harness.rank.zygote: one fork server per harness process (per environment), asked
for the launcher of each trusted CPU pool, and the handle of a launcher that is not this process's child.

A trusted CPU pool's launcher costs about one torch import of CPU (a second or more on two cores) when
started; forked from a server that imported it once, a few milliseconds. Only trusted pools come here:
their launcher and ranks run the harness's own code, and each one is forked from a server that has run
nothing else, so no pool sees another's state. Anything that goes wrong with the server (it cannot start,
its import leaves a thread, a request is refused or the socket breaks) gives None, and the caller starts
its launcher as it always could (harness.launch.spawn). A server that ended before it ever answered is not
started again for that environment: what stopped it (a thread left by the import) would stop the next.

A server is keyed by the environment it imported torch under (minus what changes per pool or per test), so
a pool never gets a launcher whose libraries read another environment at import. A new environment
retires the oldest server beyond MAX_SERVERS: its socket is closed, and it ends once the launchers it
forked have ended. At exit every server is closed the same way.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

from harness.common.paths import REPO_ROOT
from harness.launch import leftovers

# Variables that differ per pool (the pool's marker) or per test (pytest's), and that nothing the server
# imports reads: they do not make a new server.
VOLATILE = frozenset({leftovers.POOL_MARKER, "PYTEST_CURRENT_TEST"})
MAX_SERVERS = 2
MAX_FDS = 253  # the kernel's limit of descriptors in one message (SCM_MAX_FD)
MAX_REPLY = 4096
REPLY_TIMEOUT_S = 60.0  # the server's first answer waits for its torch import


class ForkedLauncher:
    """A launcher forked by the server: watched through a pidfd, as it is not this process's child. Its exit
    status is the server's to reap; the pool reads each rank's end from the status pipe, not from here."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._ended = False
        self._closer = weakref.finalize(self, os.close, pidfd)

    def ended(self) -> bool:
        return self.wait_ended(0.0)

    def wait_ended(self, timeout: float) -> bool:
        """True once the launcher has exited (waiting up to `timeout` seconds for it)."""
        if not self._ended:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            if poller.poll(max(0, int(timeout * 1000))):
                self._ended = True
                self._closer()
        return self._ended


@dataclass
class _Server:
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    # Held for a whole request, and by close(): a server retired by another thread (a new environment) is never
    # closed between a request and its answer, which would leave unknown whether a launcher was forked.
    lock: threading.RLock = field(default_factory=threading.RLock)
    broken: bool = False
    answered: bool = False  # it answered a request once (a launcher or a refusal): it could serve
    failed_unanswered: bool = False  # it broke before it ever answered

    @classmethod
    def start(cls, env: dict[str, str]) -> _Server:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "harness.rank.zygote", str(theirs.fileno())],
                                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=env, cwd=str(REPO_ROOT), start_new_session=True)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        return cls(proc, mine)

    def fork(self, request: dict[str, object], fds: list[int]) -> ForkedLauncher | None:
        with self.lock:
            if self.broken:
                return None
            try:
                self.sock.settimeout(REPLY_TIMEOUT_S)
                socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
                message, received, flags, _ = socket.recv_fds(self.sock, MAX_REPLY, 1)
            except OSError:
                # No answer in time, or the socket broke: whether a launcher was forked is unknown, and the caller
                # is about to start one on the same pipes. Ending the server ends whatever it forked (each launcher
                # dies with it), its other pools' launchers too: the price of a server that stopped answering.
                self.kill()
                return None
        try:
            if not message:
                self.kill()  # the server ended (its import failed, or left a thread): reaped, not asked again
                return None
            try:
                reply = json.loads(message) if not flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) else {}
            except ValueError:
                reply = {}
            pid = reply.get("pid") if isinstance(reply, dict) else None
            if type(pid) is int and pid > 0 and len(received) == 1:
                self.answered = True
                return ForkedLauncher(pid, received.pop())
            if not isinstance(reply, dict) or "error" not in reply:
                self.kill()  # an answer that is neither a launcher nor a refusal: as no answer
                return None
            self.answered = True
            return None  # refused (a bad request): nothing was forked, and the server goes on
        finally:
            for fd in received:
                os.close(fd)

    def close(self) -> None:
        """Retire: the server ends once its launchers have."""
        with self.lock:
            self.broken = True
            self.sock.close()

    def kill(self) -> None:
        """End the server now, and with it every launcher it forked."""
        self.failed_unanswered = not self.answered
        self.close()
        self.proc.kill()
        self.proc.wait()

    def reap(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False


class _Servers:
    """This process's servers by environment, the most recent last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: OrderedDict[tuple[tuple[str, str], ...], _Server] = OrderedDict()
        self.retired: list[_Server] = []
        # Environments whose server ended before it ever answered (its import left a thread: OMP_NUM_THREADS
        # above 1, as Ray sets it for a task, makes torch's import start its pool). Not started again: each try
        # cost a torch import, on every evaluation of a Ray worker.
        self.unservable: set[tuple[tuple[str, str], ...]] = set()

    def get(self, env: dict[str, str]) -> _Server | None:
        """The server for `env`, started if need be; None for an environment whose server could not serve."""
        key = tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE))
        with self.lock:
            self.retired = [s for s in self.retired if not s.reap(0)]
            server = self.live.get(key)
            if key in self.unservable:
                return None
            if server is None or server.broken:
                if server is not None:
                    self._retire(self.live.pop(key))
                    if server.failed_unanswered:
                        self.unservable.add(key)
                        return None
                server = self.live[key] = _Server.start({k: v for k, v in env.items() if k not in VOLATILE})
                while len(self.live) > MAX_SERVERS:
                    self._retire(self.live.popitem(last=False)[1])
            self.live.move_to_end(key)
            return server

    def _retire(self, server: _Server) -> None:
        server.close()
        self.retired.append(server)

    def pids(self) -> list[int]:
        with self.lock:
            return [s.proc.pid for s in (*self.live.values(), *self.retired)]

    def close_all(self, timeout: float = 5.0) -> None:
        with self.lock:
            servers = [*self.live.values(), *self.retired]
            self.live.clear()
            self.retired = []
        for server in servers:
            server.close()
        for server in servers:
            server.reap(timeout)

    def forget(self) -> None:
        """In a forked child: the parent's servers are the parent's (its copies of the sockets are closed)."""
        for server in (*self.live.values(), *self.retired):
            server.sock.close()
        self.lock = threading.Lock()
        self.live = OrderedDict()
        self.retired = []
        self.unservable = set()


_SERVERS = _Servers()
atexit.register(_SERVERS.close_all)
os.register_at_fork(after_in_child=_SERVERS.forget)


def fork_launcher(spec: dict[str, object], env: dict[str, str], fds: list[int], stdout: int) -> ForkedLauncher | None:
    """A launcher for `spec` forked by this process's server for `env` (started on first use), holding `fds`
    (the numbers the spec names) and `stdout`; None where the caller is to start it itself."""
    passed = [*fds, stdout]
    if len(passed) > MAX_FDS or not hasattr(os, "pidfd_open"):
        return None
    request = {"spec": spec, "env": env, "cwd": str(REPO_ROOT), "fds": passed, "stdout": stdout}
    try:
        server = _SERVERS.get(env)
    except OSError:
        return None
    return server.fork(request, passed) if server is not None else None


def server_pids() -> list[int]:
    """The pids of this process's servers, live and retired (tests tell them from a pool's leftovers)."""
    return _SERVERS.pids()
