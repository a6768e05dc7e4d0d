"""Run a long command (`pkb run`, `pkb search`) as a child in its own session, for at most a wall budget, and
come back with what it did however it ended: done, stopped at the budget, or stopped because this script was
told to stop (SIGTERM or SIGINT, as `timeout` or a device call's limit sends). A benchmark that is stopped must
still write its results: on 2026-12-02 a search killed by its caller's limit lost 7 minutes of GPU work,
because the summary was never written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

# The child's own grace to end its evaluations (and their rank pools) after SIGTERM, before SIGKILL.
GRACE_S = 30.0


class _Stopped(Exception):
    """Raised in the main thread by our own SIGTERM handler."""


@dataclass(frozen=True)
class ChildRun:
    wall_s: float
    ended: Literal["done", "budget", "stopped"]
    returncode: int | None


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's whole session, then SIGKILL after the grace; never raises for a group gone."""
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_for(command: list[str], *, cwd: Path, log: Path, budget_s: float, env: Mapping[str, str],
            on_tick: Callable[[float], object] | None = None, tick_s: float = 10.0) -> ChildRun:
    """Run `command` (output appended to `log`) until it exits, `budget_s` passes, or we are told to stop;
    `on_tick(wall_s)` every `tick_s` meanwhile."""
    started = time.perf_counter()
    with log.open("ab") as out, _sigterm_raises():
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(env))
        try:
            while True:
                left = budget_s - (time.perf_counter() - started)
                if left <= 0:
                    raise subprocess.TimeoutExpired(command, budget_s)
                try:
                    proc.wait(timeout=min(left, tick_s))
                    break
                except subprocess.TimeoutExpired:
                    if on_tick is not None:
                        on_tick(time.perf_counter() - started)
            ended: Literal["done", "budget", "stopped"] = "done"
        except subprocess.TimeoutExpired:
            ended = "budget"
        except (_Stopped, KeyboardInterrupt):
            ended = "stopped"
        except BaseException:
            # Our own failure (an on_tick that raised, say) must not leave the child running either.
            with _ignoring_stops():
                _end_group(proc)
            raise
        if ended != "done":
            # A second signal while the child winds down must not leave it behind.
            with _ignoring_stops():
                _end_group(proc)
    return ChildRun(wall_s=time.perf_counter() - started, ended=ended, returncode=proc.returncode)


@contextmanager
def _ignoring_stops() -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Segments:
    """The segments of a long job, one per machine it ran on, kept in `path` beside the job's folder so they
    travel with it. The open segment's wall is written as the job goes (`update`), so that when its machine goes
    back, the copy of the folder carried on holds the wall up to that copy: the work the copy holds. A resumed job
    marks such a segment `lost` and adds its own; a job started afresh starts the list over."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = path
        earlier: list[dict[str, Any]] = json.loads(path.read_text()) if resume and path.exists() else []
        for segment in earlier:
            if segment.get("ended") == "running":
                segment["ended"] = "lost"
        self.segments = [*earlier, {"wall_s": 0.0, "ended": "running",
                                    "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
        self._write()

    def update(self, wall_s: float, ended: str = "running", **extra: Any) -> list[dict[str, Any]]:
        self.segments[-1].update(wall_s=round(wall_s, 1), ended=ended, **extra)
        self._write()
        return self.segments

    @property
    def wall_s(self) -> float:
        return sum(float(x["wall_s"]) for x in self.segments)

    def _write(self) -> None:
        # Whole or not at all: the folder may be copied at any moment.
        part = self.path.with_name(self.path.name + ".part")
        part.write_text(json.dumps(self.segments, indent=1))
        os.replace(part, self.path)
