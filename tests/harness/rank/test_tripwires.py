"""harness.rank.tripwires: the collective monitor counts torch.distributed calls inside watched calls only, and
the guard names what changed in the process since it captured it."""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from harness.rank.tripwires import CollectiveMonitor, Guard


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> Iterator[CollectiveMonitor]:
    """A monitor installed over torch.distributed's functions, undone after the test."""
    from torch.distributed import distributed_c10d as c10d

    for namespace in (dist, c10d):
        for name in ("all_reduce", "barrier"):
            monkeypatch.setattr(namespace, name, getattr(namespace, name))  # restored by monkeypatch
    m = CollectiveMonitor()
    m.install()
    yield m


def test_collectives_count_only_inside_a_watched_call(monitor: CollectiveMonitor):
    calls = []
    assert getattr(dist.all_reduce, "__pkb_monitor__", False)

    def solution() -> None:
        try:
            dist.all_reduce(None)  # no process group here: the call itself fails
        except Exception:
            calls.append("tried")

    dist_state = monitor.state()
    solution()  # not watched: not counted
    watched = monitor.watch(solution, lambda: True)
    watched()
    assert monitor.since(dist_state)["calls"] == {"all_reduce": 1} and calls == ["tried", "tried"]
    monitor.watch(solution, lambda: False)()  # the first call (set-up) is not counted
    assert monitor.since(dist_state)["calls"] == {"all_reduce": 1}


def test_installing_twice_wraps_once(monitor: CollectiveMonitor):
    first = dist.all_reduce
    monitor.install()
    assert dist.all_reduce is first


def test_each_counted_call_is_reported_as_it_happens(monkeypatch: pytest.MonkeyPatch):
    read, write = os.pipe()
    try:
        m = CollectiveMonitor(events_fd=write)
        m.report("all_reduce")
        m.report("barrier")
        assert os.read(read, 100) == b"all_reduce\nbarrier\n"
    finally:
        os.close(read)
        os.close(write)


def test_the_guard_names_a_replaced_function_a_swapped_code_object_and_a_trace_hook():
    guard = Guard()
    target = types.ModuleType("target")

    def honest() -> int:
        return 1

    target.check = honest  # type: ignore[attr-defined]
    guard.capture(extra=[("target", target)])
    assert guard.violations() == []
    clock = time.perf_counter
    try:
        time.perf_counter = lambda: 0.0
        assert "time.perf_counter" in guard.violations()
    finally:
        time.perf_counter = clock
    original_code = honest.__code__
    try:
        honest.__code__ = (lambda: 2).__code__
        assert "target.check (code)" in guard.violations()
    finally:
        honest.__code__ = original_code
    previous = sys.gettrace()
    try:
        sys.settrace(lambda *a: None)
        assert "sys.settrace hook" in guard.violations()
    finally:
        sys.settrace(previous)
    assert guard.violations() == []
