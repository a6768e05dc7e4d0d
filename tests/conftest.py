"""What every test shares. Before any test module is imported, the session gets a cache of its own
(PKB_CACHE_DIR, inherited by every process a test starts), so no test reads or writes the user's
~/.cache/pkb-agent: a reference timing, a build or a poisoned entry of one test never reaches the user, nor,
through the user's cache, another run. An audit hook fails any write into the user's cache by this process
at once (and the session at its end, should the error have been swallowed)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:  # the harness is imported after the session's cache is set, below
    from harness.records.results import EvalResult, Failure, Timings

# The tests folder: shared helpers, candidates, exploits and fixtures live here; the tests mirror the package tree
# below it (tests/harness/judge/ tests harness/judge/, ...).
TESTS = Path(__file__).resolve().parent
CANDIDATES = TESTS / "candidates"

# The user's cache, as harness.records.cache_dir finds it without PKB_CACHE_DIR; the session's own, set before any test
# module (or the harness) is imported. A PKB_CACHE_DIR the user exported is overridden too: it may be that one.
USER_CACHE = Path.home() / ".cache" / "pkb-agent"
# Under pytest-xdist this file is imported by the controller first, then by every worker it starts: the controller
# makes the cache and its workers inherit the path (PKB_TEST_SESSION_CACHE), so a build or a reference timing is
# paid once per run, not once per worker (builds, the key and the timings already take file locks, as `pkb run
# --concurrency` needs). The process that made the folder removes it, at its session's end: the controller ends
# after its workers. A worker started without the variable (its controller never imported this file) makes its own.
_SHARED_CACHE = "PKB_TEST_SESSION_CACHE"
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under xdist; None in a plain run
_inherited = os.environ.get(_SHARED_CACHE) if WORKER else None
SESSION_CACHE = Path(_inherited) if _inherited else Path(tempfile.mkdtemp(prefix="pkb-test-cache-"))
_MADE_HERE = not _inherited
os.environ[_SHARED_CACHE] = os.environ["PKB_CACHE_DIR"] = str(SESSION_CACHE)

# Audit events that change the file system, and which of their arguments are paths written.
_WRITES = {"os.mkdir": (0,), "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.link": (1,),
           "os.symlink": (1,), "shutil.rmtree": (0,), "shutil.copytree": (1,), "shutil.move": (1,),
           "os.truncate": (0,), "os.chmod": (0,), "os.utime": (0,)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_violations: list[str] = []


def _in_user_cache(path: Any) -> bool:
    try:
        text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
    except (TypeError, ValueError):
        return False
    if not text:
        return False
    full = os.path.abspath(text)
    return full == str(USER_CACHE) or full.startswith(str(USER_CACHE) + os.sep)


def _guard_user_cache(event: str, args: tuple[Any, ...]) -> None:
    if event == "open":
        path, mode, flags = (args + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        targets = [path] if writing else []
    elif event in _WRITES:
        targets = [args[i] for i in _WRITES[event] if i < len(args)]
    else:
        return
    for path in targets:
        if _in_user_cache(path):
            message = f"a test wrote into the user's cache {USER_CACHE}: {event} {os.fsdecode(path)}"
            _violations.append(message)
            raise RuntimeError(message)


sys.addaudithook(_guard_user_cache)


@pytest.fixture(autouse=True, scope="session")
def _user_cache_untouched() -> Any:
    yield
    assert not _violations, "\n".join(_violations)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _MADE_HERE:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)
        for lock in _LOCKS:
            Path(f"{SESSION_CACHE}.{lock}").unlink(missing_ok=True)


# `@pytest.mark.serial`: a test whose claim is about the whole machine (a folder every process shares, such as
# /dev/shm) runs alone under xdist. Every other test holds a shared lock while it runs, a serial one the exclusive
# lock; the turnstile, taken first by both and held by a serial test while it waits, lets a waiting serial test in
# before the next ordinary ones (flock alone would let a stream of shared holders starve it). The lock files sit
# beside the session cache, made by the process that made the cache; in a plain run there is nothing to exclude.
_LOCKS = ("turnstile", "serial")
_lock_fds: dict[str, int] = {}


def _lock_fd(name: str) -> int:
    if name not in _lock_fds:  # never through a link: the path is in the shared /tmp
        _lock_fds[name] = os.open(f"{SESSION_CACHE}.{name}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  0o600)
    return _lock_fds[name]


@contextlib.contextmanager
def _turn(exclusive: bool) -> Iterator[None]:
    turnstile, serial = _lock_fd("turnstile"), _lock_fd("serial")
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(serial, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    finally:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(serial, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if WORKER is None:
        return (yield)
    with _turn(exclusive=item.get_closest_marker("serial") is not None):
        return (yield)


@pytest.fixture(autouse=True, scope="session")
def _no_sandbox_where_none_works() -> None:
    # `pkb run` and `pkb search` refuse to run candidates without a working sandbox unless told so. On a
    # machine without bubblewrap the suite tells them so, as `--no-sandbox` would (the fallback is what such
    # a machine runs anyway, and every result records it); where bubblewrap works nothing changes.
    from harness.launch.sandbox import probe  # deferred: the session fixture, not every import of conftest

    if "PKB_SANDBOX" not in os.environ and probe().backend == "none":
        os.environ["PKB_SANDBOX"] = "off"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `@pytest.mark.gpu` needs two GPUs; `@pytest.mark.gpu(count=1)` one (ranks sharing a device).
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        needed = int(marker.kwargs.get("count", 2))
        if visible < needed:
            item.add_marker(pytest.mark.skip(reason=f"needs at least {needed} CUDA GPU{'s' if needed > 1 else ''}"))


def live_children() -> list[int]:
    """PIDs of this process's children that are still running (zombies excluded). The fork servers of trusted
    pools (harness.launch.zygote) live as long as this process and are not counted; the launchers they forked
    are, as if this process had started them."""
    from harness.launch.zygote import server_pids  # deferred: the harness loads with the test that asks

    servers = set(server_pids())
    parents = {os.getpid(), *servers}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid in parents and state != "Z" and int(entry.name) not in servers:
            pids.append(int(entry.name))
    return pids


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_mentioning(text: str, wait_s: float = 5.0) -> list[int]:
    """PIDs other than this one whose command line mentions `text`, once killed processes had time to die."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int(entry.name) != os.getpid() and pid_alive(int(entry.name)) \
                        and text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def failure_of(result: EvalResult) -> Failure:
    """A result's failure, which the test expects there (an EvalResult's is optional: None when correct)."""
    assert result.failure is not None, f"no failure: the verdict is {result.verdict}"
    return result.failure


def timings_of(result: EvalResult) -> Timings:
    """A result's timings, which the test expects there (None unless the candidate was correct and timed)."""
    assert result.timings is not None, f"no timings: the verdict is {result.verdict}"
    return result.timings
