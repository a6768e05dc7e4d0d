"""harness.launch.zygote: trusted CPU pools fork their launcher from one server per harness process; every
other pool starts its own; anything wrong with the server falls back to starting, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.common import messages
from harness.launch import zygote
from harness.launch.pool import RankPool
from harness.launch.spawn import StartedLauncher, worker_env
from tests.conftest import live_children, pid_alive


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _held(pid: int) -> set[str]:
    """What the process's descriptors point at (pipe:[inode], socket:[inode], paths)."""
    found = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return found


def _own(pool: RankPool) -> set[str]:
    """The pool's pipes, as this process holds their other ends."""
    assert pool.spawned is not None
    fds = [pool.spawned.status_fd]
    for r in pool.ranks:
        fds += [r.requests.fileno(), r.replies.fileno(), r.events_fd, r.log_fd]
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in fds}


def _answers(pool: RankPool) -> bool:
    return [r["ok"] for r in pool.request(messages.Ping(), timeout=60)] == [True] * pool.world_size


def _wait_gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_trusted_cpu_pools_fork_their_launcher_from_one_server():
    launchers = []
    for _ in range(2):
        with RankPool(2, "cpu") as pool:
            proc = pool.proc
            assert isinstance(proc, zygote.ForkedLauncher)
            server = _ppid(proc.pid)
            assert server in zygote.server_pids()
            assert os.getsid(proc.pid) == proc.pid  # a session of its own, as a started launcher's
            assert all(_ppid(p) == proc.pid for p in pool.pids())  # the ranks fork from the launcher
            assert _answers(pool)
            launchers.append((server, proc))
    assert launchers[0][0] == launchers[1][0]  # the same server both times
    assert all(proc.wait_ended(10) for _, proc in launchers)
    assert live_children() == []


def test_pools_open_at_once_hold_nothing_of_each_other_or_of_the_server():
    with RankPool(2, "cpu") as first, RankPool(2, "cpu") as second:
        assert first.proc is not None
        server_socket = {h for h in _held(_ppid(first.proc.pid)) if h.startswith("socket:")}
        assert len(server_socket) == 1
        for pool, other in ((first, second), (second, first)):
            assert pool.proc is not None
            assert pool.lease.folder is not None
            assert _held(pool.proc.pid) <= _own(pool) | {"/dev/null", str(pool.lease.folder / "sandbox.log")}
            for pid in (pool.proc.pid, *pool.pids()):
                held = _held(pid)
                assert not held & _own(other), f"{pid} holds the other pool's pipes"
                assert not held & server_socket, f"{pid} holds the server's socket"
            assert _answers(pool)
    assert live_children() == []


def test_a_new_environment_gets_its_own_server_and_a_retired_one_ends_after_its_pools(monkeypatch):
    monkeypatch.setattr(zygote, "MAX_SERVERS", 1)
    monkeypatch.setenv("PKB_TEST_ZYGOTE_KEY", "one")
    first = RankPool(2, "cpu").start()
    try:
        assert first.proc is not None
        old = _ppid(first.proc.pid)
        monkeypatch.setenv("PKB_TEST_ZYGOTE_KEY", "two")  # read by nothing, but a server is per environment
        with RankPool(2, "cpu") as second:
            assert second.proc is not None and _ppid(second.proc.pid) != old
            assert pid_alive(old)  # retired, not ended: its pool is still open
            assert _answers(first) and _answers(second)
    finally:
        first.close()
    assert _wait_gone(old), "a retired server outlived its last pool"
    assert live_children() == []


def test_a_dead_server_gives_a_started_launcher_then_a_new_server():
    with RankPool(2, "cpu") as pool:
        assert pool.proc is not None
        server = _ppid(pool.proc.pid)
    os.kill(server, signal.SIGKILL)
    assert _wait_gone(server)
    with RankPool(2, "cpu") as pool:
        assert isinstance(pool.proc, StartedLauncher) and _answers(pool)
    with RankPool(2, "cpu") as pool:
        assert isinstance(pool.proc, zygote.ForkedLauncher) and _answers(pool)
        assert _ppid(pool.proc.pid) not in (server, os.getpid())
    assert live_children() == []


@pytest.mark.parametrize("settings", [{"role": "candidate"}, {"rank_prefix": {1: ["env"]}}],
                         ids=["candidate", "profiled"])
def test_candidate_and_prefixed_pools_start_their_launcher(settings):
    with RankPool(2, "cpu", **settings) as pool:
        assert isinstance(pool.proc, StartedLauncher) and _answers(pool)
    assert live_children() == []


def test_a_malformed_request_is_refused_and_the_server_goes_on():
    server = zygote._SERVERS.get(worker_env("cpu"))  # the server a trusted CPU pool gets
    assert server is not None
    read, write = os.pipe()
    try:
        assert server.fork({"spec": {"ranks": "no"}, "fds": [read, write], "stdout": write}, [read, write]) is None
        assert server.fork({"fds": [1, 2, 3]}, [read, write]) is None  # numbers for descriptors that did not come
    finally:
        os.close(read)
        os.close(write)
    assert not server.broken and pid_alive(server.proc.pid)
    with RankPool(2, "cpu") as pool:
        assert isinstance(pool.proc, zygote.ForkedLauncher) and _answers(pool)
        assert _ppid(pool.proc.pid) == server.proc.pid


def test_a_server_that_stops_answering_is_ended_and_the_launcher_started(monkeypatch):
    with RankPool(2, "cpu") as pool:
        assert pool.proc is not None
        server = _ppid(pool.proc.pid)
    monkeypatch.setattr(zygote, "REPLY_TIMEOUT_S", 2.0)
    os.kill(server, signal.SIGSTOP)  # alive, but it answers nothing: a launcher may or may not have been forked
    try:
        with RankPool(2, "cpu") as pool:
            assert isinstance(pool.proc, StartedLauncher) and _answers(pool)
        assert _wait_gone(server), "the server that stopped answering was not ended"
    finally:
        if pid_alive(server):
            os.kill(server, signal.SIGKILL)
    assert live_children() == []


def test_a_server_that_cannot_fork_safely_ends_and_the_launcher_is_started(monkeypatch):
    # With several OpenMP threads torch's import leaves a thread running: forking from there could copy a held
    # lock, so the server ends before its first answer (harness.rank.launcher.preloaded_worker).
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    before = set(zygote.server_pids())
    with RankPool(2, "cpu") as pool:
        assert isinstance(pool.proc, StartedLauncher) and _answers(pool)
    started = set(zygote.server_pids()) - before
    assert started and not any(pid_alive(p) for p in started)  # one was started for this environment; it ended
    # ... and is not started again for it (each try costs a torch import): the next pools start their launcher.
    for _ in range(2):
        with RankPool(2, "cpu") as pool:
            assert isinstance(pool.proc, StartedLauncher) and _answers(pool)
    assert set(zygote.server_pids()) - before <= started
    assert live_children() == []


def test_a_server_is_not_retired_in_the_middle_of_a_request():
    server = zygote._SERVERS.get(worker_env("cpu"))
    assert server is not None
    with server.lock:  # what a request holds from sending to its answer
        closer = threading.Thread(target=server.close)
        closer.start()
        closer.join(0.5)
        assert closer.is_alive() and not server.broken  # the retirement waits for the answer
    closer.join(10)
    assert not closer.is_alive() and server.broken
    with RankPool(2, "cpu") as pool:  # the next pool gets a new server
        assert isinstance(pool.proc, zygote.ForkedLauncher) and _ppid(pool.proc.pid) != server.proc.pid
    assert live_children() == []


def test_a_trusted_pools_environment_is_the_same_before_and_after_an_evaluation_measured_its_inputs(monkeypatch):
    """Measuring a problem's inputs on the meta device imports torch._dynamo, which wants its cache folder named
    in the environment: set there during a process's first evaluation, it gave that process a second server
    (and a second torch import) for every later evaluation."""
    from harness.launch.sandbox import budget

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "recorded, so that the test's undo restores it")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    first = worker_env("cpu")
    with budget._meta_mode():
        pass
    assert worker_env("cpu") == first
