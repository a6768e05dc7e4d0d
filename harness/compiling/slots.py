"""How many native builds run at once in this process, and a build that runs with no other beside it.

A build's limit is wall time, so builds that share the cores slow each other: on the 16-core H200 node,
fourteen PKB builds at once took 111.6 s median (129 s p90) and one (57_ring_attention_pp, 145-170 s in the
runs before) went past its 180 s limit, a compile_error that only the run's --concurrency caused
(2026-12-03, docs/measurements/pkb-runs.md). A build that overran its limit beside others is therefore built again alone
(harness.compiling.compile); only an overrun alone is the candidate's. `alone()` has priority over builds not
yet started, so a stream of new builds cannot keep it waiting for ever.

The slots are this process's: the builds of a `pkb run` or `pkb search` (the local executor's threads). Builds
of other processes on the machine (another run, Ray's tasks, each a process of its own) are neither limited
nor counted as neighbours.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from harness import cancel

POLL_S = 0.5  # how often a build waiting for a slot looks whether the run was interrupted


@dataclass(eq=False)
class Hold:
    """One build's slot: the most other builds that held a slot at one moment while it held this one."""

    beside: int = 0


class BuildSlots:
    """At most `slots` builds at once; `alone()` waits until none runs and keeps the others out meanwhile."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"build slots must be at least 1, not {slots}")
        self.slots = slots
        self._changed = threading.Condition()
        self._holds: set[Hold] = set()
        self._alone_waiting = 0
        self._alone = False

    @contextmanager
    def shared(self) -> Iterator[Hold]:
        """A slot beside other builds, waited for without blocking Ctrl-C (harness.cancel)."""
        with self._changed:
            self._wait(lambda: len(self._holds) < self.slots and not self._alone and not self._alone_waiting)
            hold = Hold()
            self._holds.add(hold)
            for other in self._holds:
                other.beside = max(other.beside, len(self._holds) - 1)
        try:
            yield hold
        finally:
            self._release(hold)

    @contextmanager
    def alone(self) -> Iterator[Hold]:
        """Every slot: no other build runs until this one ends."""
        with self._changed:
            self._alone_waiting += 1
            try:
                self._wait(lambda: not self._holds and not self._alone)
            finally:
                self._alone_waiting -= 1
            self._alone = True
            hold = Hold()
            self._holds.add(hold)
        try:
            yield hold
        finally:
            with self._changed:
                self._alone = False
            self._release(hold)

    def running(self) -> int:
        with self._changed:
            return len(self._holds)

    def _release(self, hold: Hold) -> None:
        with self._changed:
            self._holds.discard(hold)
            self._changed.notify_all()

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Under the lock: until `ready()`, looking every POLL_S whether the run was interrupted."""
        while not ready():
            self._changed.wait(POLL_S)
            cancel.check()
