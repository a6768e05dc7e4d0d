"""harness.rank.launcher: the limits every process of a sandbox inherits, set before any worker starts."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common import messages
from harness.common.paths import REPO_ROOT
from harness.launch.pool import RankPool

PROBE = """
import json, resource, sys
from harness.rank.launcher import set_limits
set_limits(json.loads(sys.argv[1]))
print(json.dumps({name: resource.getrlimit(getattr(resource, name)) for name in
                  ("RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_FSIZE")}))
"""


def limits_after(limits: dict[str, int]) -> dict[str, list[int]]:
    # In a process of its own: lowered hard limits cannot be raised again.
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(limits)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60, check=True)
    return dict(json.loads(done.stdout))


def test_the_limits_are_set_soft_and_hard_and_no_core_is_dumped():
    got = limits_after({"nofile": 64, "fsize": 1 << 20})
    assert got["RLIMIT_CORE"] == [0, 0]
    assert got["RLIMIT_NOFILE"] == [64, 64] and got["RLIMIT_FSIZE"] == [1 << 20, 1 << 20]


def test_without_limits_only_core_dumps_are_off():
    got = limits_after({})
    assert got["RLIMIT_CORE"] == [0, 0] and got["RLIMIT_NOFILE"][0] > 64


def _pipe_inode(fd: int) -> str | None:
    target = os.readlink(f"/proc/self/fd/{fd}")
    return target if target.startswith("pipe:") else None


def _held_pipes(pid: int) -> set[str]:
    held = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("pipe:"):
                held.add(target)
    return held


@pytest.mark.parametrize(("role", "started_as"), [("candidate", b"harness.rank.launcher"),
                                                  ("trusted", b"harness.rank.zygote")])
def test_a_cpu_pools_ranks_fork_from_the_launcher_and_hold_only_their_own_pipes(role, started_as):
    """A candidate pool's launcher is started (in its sandbox); a trusted pool's is forked by the fork server
    (harness.launch.zygote). Either way the ranks fork from the launcher and keep the command line of the
    process that was exec'd."""
    pool = RankPool(2, "cpu", role=role).start()
    try:
        assert pool.spawned is not None
        own = {r.rank: {_pipe_inode(fd) for fd in (r.requests.fileno(), r.replies.fileno(), r.events_fd, r.log_fd)}
               for r in pool.ranks}
        status = _pipe_inode(pool.spawned.status_fd)
        for rank, pid in enumerate(pool.pids()):
            assert started_as in Path(f"/proc/{pid}/cmdline").read_bytes()
            held = _held_pipes(pid)
            assert held <= own[rank], held - own[rank]  # not the status pipe, not the other rank's pipes
            assert status not in held
            assert len(held & own[rank]) == 4  # request, reply, events; stdout and stderr on the log pipe
        replies = pool.request(messages.Ping(), timeout=60)
        assert [r["ok"] for r in replies] == [True, True]  # and they answer
    finally:
        pool.close()


THREADED = """
import threading, time
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
from harness.rank.launcher import preloaded_worker
print(preloaded_worker() is None)
"""
ALONE = THREADED.replace("threading.Thread(target=time.sleep, args=(30,), daemon=True).start()", "")


def test_the_launcher_forks_only_from_a_single_threaded_process():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    threaded = subprocess.run([sys.executable, "-c", THREADED], capture_output=True, text=True, cwd=REPO_ROOT,
                              timeout=120, check=True, env=env)
    assert threaded.stdout.split() == ["True"]  # a thread is running: every rank is started, none forked
    alone = subprocess.run([sys.executable, "-c", ALONE],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=True, env=env)
    assert alone.stdout.split() == ["False"]
