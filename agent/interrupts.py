"""Ctrl-C and SIGTERM for the commands that run many evaluations (`pkb run`, `pkb search`, `pkb sweep`).

The first signal stops the work within seconds and keeps what finished:

    with interrupts.terminate_as_interrupt():   # SIGINT, SIGTERM: harness.cancel, then KeyboardInterrupt
        try:
            ... submit work to a thread pool as slots free up, wait for it ...
        except KeyboardInterrupt:
            left = interrupts.stop_work(futures)    # harness.cancel: running evaluations end, queued ones never start
            raise

`stop_work` kills every process the harness waits on (harness.cancel.request), cancels the futures that have
not started, and waits a few seconds for the running ones to clean up after themselves (their rank pools,
their folders). A thread inside a model call cannot be cut short: it is left to the process's end, so the
command then leaves with os._exit (agent.cli.interrupted), never waiting for it. From the first signal on, a
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
    """Stop every evaluation now, wherever the main thread is (even inside an evaluation of its own, whose
    cleanup then kills instead of waiting), and let the code that was running unwind to its handler."""
    exit_on_second_signal()
    cancel.request()
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM stop every evaluation (harness.cancel) and raise
    KeyboardInterrupt in the main thread; a second one ends the process. Outside the main thread: nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, _first_signal)
    try:
        yield
    finally:
        for sig, handler in before.items():
            if signal.getsignal(sig) is not _end_now:  # after a first signal, a second one still ends it
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
