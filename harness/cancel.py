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
sample stays unfinished and `--resume` runs it again. Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator

__all__ = ["Cancelled", "check", "kill_all", "killable", "register", "request", "requested", "reset", "sleep",
           "unregister"]

Killer = Callable[[], None]

_event = threading.Event()
_lock = threading.Lock()
_killers: dict[int, Killer] = {}
_ids = itertools.count()


class Cancelled(BaseException):
    """The evaluation was stopped because the user interrupted the process; it has no verdict."""


def requested() -> bool:
    return _event.is_set()


def check() -> None:
    """Raise Cancelled if the process was interrupted."""
    if _event.is_set():
        raise Cancelled("stopped: the process was interrupted")


def sleep(seconds: float) -> None:
    """time.sleep(seconds), cut short by request(): then Cancelled (a pause between attempts never holds up
    Ctrl-C)."""
    if _event.wait(max(0.0, seconds)):
        check()


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
    """Add a killer; returns the key unregister() takes. Called after request(), it runs at once."""
    with _lock:
        key = next(_ids)
        _killers[key] = kill
    if _event.is_set():
        with contextlib.suppress(Exception):
            kill()
    return key


def unregister(key: int) -> None:
    with _lock:
        _killers.pop(key, None)


def reset() -> None:
    """Forget a request (tests, which interrupt and then go on in the same process)."""
    _event.clear()
