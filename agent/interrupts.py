"""Ctrl-C and SIGTERM for the commands that run many evaluations (`pkb run`, `pkb search`, `pkb sweep`).

The first signal stops the work within seconds and keeps what finished. The signal handler raises nothing: it
calls harness.cancel.request(), and the loops that hand out the work (agent.runner, agent.search.loop) poll it:

    with interrupts.terminate_as_interrupt():   # SIGINT, SIGTERM: harness.cancel.request(), nothing raised
        try:
            while ...:                                # submit work as slots free up
                if cancel.requested(): raise KeyboardInterrupt
                wait(running, timeout=CANCEL_POLL_S, ...)
        except (KeyboardInterrupt, cancel.Cancelled):
            left = interrupts.stop_work(futures)    # running evaluations end, queued ones never start
            raise ...                                   # a KeyboardInterrupt: RunInterrupted, SearchInterrupted

A KeyboardInterrupt raised into the main thread could land between a lock's acquire and its release
(concurrent.futures.wait holds each future's lock for a moment), and the stop would then wait on that lock
forever; a poll every CANCEL_POLL_S cannot. A Cancelled that leaves the block by another way (a harness wait
of the main thread's own, before the loops began) leaves it as KeyboardInterrupt, so that every command
handles both alike: the "interrupted; continue with ..." line and exit code 130.

`stop_work` kills every process the harness waits on (harness.cancel.request), cancels the futures that have
not started, and waits a few seconds for the running ones to clean up after themselves (their rank pools,
their folders). A thread inside a model's request cannot be cut short (its pauses between attempts can:
harness.cancel.sleep): it is left to the process's end, so the command then leaves with os._exit
(agent.cli.common.leave), never waiting for it. From the first signal on, a
second one ends the process at once (after killing what the harness still holds: signals only).

With a Ray executor the driver's waits poll harness.cancel too: an evaluation's task is cancelled (the harness
in it cleans up), and with force when it has not ended a few seconds later (Ray kills its worker, and the
reaper beside the evaluation ends the rank groups it leaves, agent.executors.reaper); queued samples are
never submitted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Collection, Iterator
from concurrent.futures import Future, wait
from types import FrameType
from typing import Any

from harness import cancel

STOP_WAIT_S = 8.0  # how long running evaluations get to end and clean up after the first signal
CANCEL_POLL_S = 0.5  # how often a loop that hands out work looks whether the process was interrupted
EXIT_CODE = 130  # what a shell reports for a process ended by SIGINT


def stop_work(futures: Collection[Future[Any]], wait_s: float = STOP_WAIT_S) -> int:
    """Stop every evaluation of this process, cancel what has not started, wait up to `wait_s` for the rest;
    returns how many are still running (threads in a model call). A second signal from now on ends the process
    at once."""
    exit_on_second_signal()
    cancel.request()
    running = [f for f in futures if not f.cancel()]
    if running:
        wait(running, timeout=wait_s)
    return sum(1 for f in running if not f.done())


def interrupted(futures: Collection[Future[Any]]) -> int:
    """How many of `futures` the interrupt caught running: still running, or ended by it (harness.cancel makes
    a running evaluation raise Cancelled at once, often before the loop that polls it looks)."""
    return sum(1 for f in futures
               if not f.done() or (not f.cancelled() and isinstance(f.exception(), cancel.Cancelled)))


def exit_on_second_signal() -> None:
    """From now on SIGINT and SIGTERM end the process at once (only the main thread can set handlers; elsewhere
    this does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _end_now)


def _end_now(signum: int, frame: FrameType | None) -> None:
    cancel.kill_all()
    os.write(2, b"\npkb: interrupted again: ended at once\n")
    os._exit(EXIT_CODE)


def _first_signal(signum: int, frame: FrameType | None) -> None:
    """Stop every evaluation now (harness.cancel: what the harness waits on is killed, every wait raises
    Cancelled), and nothing else: the loops that hand out the work poll harness.cancel and stop themselves. No
    KeyboardInterrupt is raised into the main thread, where it could land between a lock's acquire and its
    release (concurrent.futures.wait holds each future's lock for a moment): the stop would then wait on that
    lock forever."""
    exit_on_second_signal()
    cancel.request()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM stop every evaluation (harness.cancel), which the work loops
    (agent.runner, agent.search.loop) notice within CANCEL_POLL_S; a second signal ends the process. A Cancelled
    that reaches the end of the block leaves it as KeyboardInterrupt (what the commands' handlers catch).
    Outside the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, _first_signal)
    try:
        yield
    except cancel.Cancelled as err:
        raise KeyboardInterrupt(str(err)) from None
    finally:
        for sig, handler in before.items():
            if signal.getsignal(sig) is not _end_now:  # after a first signal, a second one still ends it
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
