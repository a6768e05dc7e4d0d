"""Stopping every evaluation of this process at once: what Ctrl-C (or SIGTERM) of `pkb run`, `pkb search` or
`pkb sweep` asks for.

`request()` is called by the process's main thread when the user interrupts it. From then on:
- every process the harness is waiting on is killed at once, through the killers registered here (rank
  pools, native builds): a killer only sends signals, so it is safe from any thread while the owner still
  holds the pool's pipes;
- every wait of the harness (a pool's replies, a device lease) raises Cancelled at its next poll, at most
  half a second later, and so does `sleep()` (the agent's pauses between a model's attempts) at once;
- `evaluate()` never returns a result for an evaluation that was cancelled while it ran (a verdict read off
  killed ranks would be the harness's doing, not the candidate's): it raises Cancelled once its processes
  and folders are cleaned up.

Cancelled derives from BaseException, like KeyboardInterrupt, so no `except Exception` on its way up (an
executor's infra_error, a tool's error reply, the runner's per-sample handler) turns it into a result: the
sample stays unfinished and `--resume` runs it again.

The same stop, for one thread's work only, at a time: within `deadline(at)` (the agent's tool calls, bounded
by the sample's wall budget) the killers this thread registers run when time.monotonic() reaches `at`, and
this thread's checks, waits and `sleep()` raise DeadlinePassed (a Cancelled) from then on; other threads'
evaluations go on. The harness's cleanup is the same as after Ctrl-C. Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["Cancelled", "DeadlinePassed", "check", "deadline", "kill_all", "killable", "register", "request",
           "requested", "reset", "sleep", "unregister"]

Killer = Callable[[], None]

_event = threading.Event()
_lock = threading.Lock()
_killers: dict[int, Killer] = {}
_ids = itertools.count()


class Cancelled(BaseException):
    """The evaluation was stopped because the user interrupted the process; it has no verdict."""


class DeadlinePassed(Cancelled):
    """This thread's work ran past the deadline it was given (`deadline()`); it has no verdict either."""


class _Deadline:
    """One `deadline()` block: when it ends, and the killers registered from its thread within it."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.keys: set[int] = set()
        self.passed = threading.Event()
        self.timer = threading.Timer(max(0.0, at - time.monotonic()), self.fire)
        self.timer.daemon = True

    def fire(self) -> None:
        """Once, from the timer or from the first of this thread's checks that sees the time passed (a loaded
        machine runs the timer late: the killers still run before the thread leaves the block)."""
        with _lock:
            if self.passed.is_set():
                return
            self.passed.set()
            killers = [_killers[k] for k in self.keys if k in _killers]
        for kill in killers:
            with contextlib.suppress(Exception):
                kill()

    def reached(self) -> bool:
        return self.passed.is_set() or time.monotonic() >= self.at


_local = threading.local()


def _deadlines() -> list[_Deadline]:
    stack: list[_Deadline] | None = getattr(_local, "deadlines", None)
    if stack is None:
        stack = _local.deadlines = []
    return stack


def _passed() -> _Deadline | None:
    scope = next((d for d in _deadlines() if d.reached()), None)
    if scope is not None:
        scope.fire()
    return scope


def requested() -> bool:
    """The process was interrupted, or this thread's deadline passed: stop waiting."""
    return _event.is_set() or _passed() is not None


def check() -> None:
    """Raise Cancelled if the process was interrupted; DeadlinePassed if this thread's deadline passed."""
    if _event.is_set():
        raise Cancelled("stopped: the process was interrupted")
    if (passed := _passed()) is not None:
        raise DeadlinePassed(f"stopped: the time limit of {passed.at:.3f} (monotonic) passed")


def sleep(seconds: float) -> None:
    """time.sleep(seconds), cut short by request() or this thread's deadline: then Cancelled (a pause
    between attempts never holds up Ctrl-C)."""
    stack = _deadlines()
    until = min((d.at for d in stack), default=None)
    wait = max(0.0, seconds if until is None else min(seconds, until - time.monotonic()))
    if _event.wait(wait) or stack:
        check()


@contextlib.contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Within the block, this thread's work ends at time.monotonic() == `at` (None: no deadline): the
    killers it registers run then (from a timer thread), and its checks raise DeadlinePassed. Blocks nest;
    the earliest deadline wins."""
    if at is None:
        yield
        return
    scope = _Deadline(at)
    stack = _deadlines()
    stack.append(scope)
    scope.timer.start()
    try:
        yield
    finally:
        scope.timer.cancel()
        stack.remove(scope)


def request() -> None:
    """Stop every evaluation of this process: kill what they wait on, and make every wait raise Cancelled."""
    _event.set()
    kill_all()


def kill_all() -> None:
    """Run every registered killer (signals only: nothing here waits). Also what a second Ctrl-C does, from
    its signal handler, just before the process ends: so it takes no lock (a copy of the table is
    retried if another thread changes it meanwhile)."""
    for _ in range(10):
        try:
            killers = list(_killers.values())
            break
        except RuntimeError:  # the table changed size while being copied
            continue
    else:
        killers = []
    for kill in killers:
        try:
            kill()
        except Exception:  # a process already gone, a pid reused: the next killer still runs
            continue


@contextlib.contextmanager
def killable(kill: Killer) -> Iterator[None]:
    """While the block runs, `kill` (which must only send signals) ends its processes on request(); one
    registered after request() is called at once."""
    key = register(kill)
    try:
        yield
    finally:
        unregister(key)


def register(kill: Killer) -> int:
    """Add a killer; returns the key unregister() takes. Called after request(), or past this thread's
    deadline, it runs at once; within a deadline() block it also runs when the deadline comes."""
    scopes = _deadlines()
    with _lock:
        key = next(_ids)
        _killers[key] = kill
        for scope in scopes:
            scope.keys.add(key)
    if _event.is_set() or any(scope.passed.is_set() for scope in scopes):
        with contextlib.suppress(Exception):
            kill()
    return key


def unregister(key: int) -> None:
    with _lock:
        _killers.pop(key, None)


def reset() -> None:
    """Forget a request (tests, which interrupt and then go on in the same process)."""
    _event.clear()
