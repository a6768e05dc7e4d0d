"""agent.report.leases: a run's device use read back from its lease events, a run stopped mid-way included."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.eventlog import open_event_log
from agent.report.leases import lease_use, read_events, summary_lines
from agent.scheduler import DeviceScheduler


def at(seconds: float) -> str:
    whole, frac = divmod(seconds, 1)
    return f"2026-12-02T10:00:{int(whole):02d}.{int(frac * 1e6):06d}Z"


def event(name: str, seconds: float, label: str, **fields: Any) -> dict[str, Any]:
    return {"event": name, "timestamp": at(seconds), "label": label, **fields}


def test_busy_share_waits_and_what_was_open_at_the_end():
    events = [
        {"event": "run_started", "timestamp": at(0)},
        event("lease_asked", 1, "a default"), event("lease_granted", 1, "a default", waited_s=0.0),
        event("lease_asked", 2, "b default"),
        event("lease_returned", 5, "a default", held_s=4.0),
        event("lease_granted", 5, "b default", waited_s=3.0),
        event("lease_returned", 7, "b default", held_s=2.0),
        event("lease_asked", 8, "a held-out:default"), event("lease_granted", 8, "a held-out:default", waited_s=0),
        event("lease_asked", 9, "c default"),  # never granted: the run was stopped
        {"event": "run_stopped", "timestamp": at(10)},
    ]
    use = lease_use(events)
    assert use.wall_s == pytest.approx(10)
    # held 1-7 and 8-10 (still held at the end): 8 of 10 s
    assert use.busy_fraction == pytest.approx(0.8) and use.mean_at_once == pytest.approx(0.8)
    assert use.median_wait_s == pytest.approx(0.0)
    assert use.waited_in_all_s == pytest.approx(3.0 + 1.0)  # b's 3 s, c's 1 s until the log ends
    assert [h.label for h in use.still_held] == ["a held-out:default"]
    assert [label for label, _ in use.waiting] == ["c default"] and use.waiting[0][1] == pytest.approx(9)
    assert [h.label for h in use.longest(1)] == ["a default"]
    text = "\n".join(summary_lines(use))
    assert "devices held 80% of 10 s" in text and "held when the log ends: a held-out:default since 8 s" in text
    assert "waiting when the log ends: c default since 9 s" in text and "median wait 0.0 s, 4 s in all" in text


def test_overlapping_shared_holds_count_once_for_busy_and_twice_for_at_once():
    events = [event("lease_granted", 0, "x", shared=True), event("lease_granted", 1, "y", shared=True),
              event("lease_returned", 3, "x"), event("lease_returned", 4, "y")]
    use = lease_use(events)
    assert use.busy_fraction == pytest.approx(1.0) and use.mean_at_once == pytest.approx(6 / 4)
    assert use.still_held == [] and use.waiting == []
    alone = [event("lease_granted", 5, "x", shared=False), event("lease_returned", 6, "x"),
             event("lease_granted", 6, "z", shared=True)]  # still held: not in the median
    use = lease_use(events + alone)
    assert use.median_hold_s(True) == pytest.approx(3.0) and use.median_hold_s(False) == pytest.approx(1.0)
    assert "held per lease, median: 3.0 s shared (3), 1.0 s alone (1)" in summary_lines(use)
    assert not any("held per lease" in line for line in summary_lines(lease_use(alone[:2])))  # no sharing


def test_a_torn_log_and_one_without_leases_are_read_and_said_plainly(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(event("lease_granted", 0, "x")) + "\n[1, 2]\n{\"event\": \"lease_ret")
    assert [e["event"] for e in read_events(path)] == ["lease_granted"]
    assert summary_lines(lease_use([])) == [
        "no lease events (a run from before they were logged, or one that took no lease)"]


def test_the_scheduler_writes_what_the_reader_reads(tmp_path: Path):
    """The real path: a scheduler's listener on the run's structlog event log, read back."""
    log, handle = open_event_log(tmp_path / "events.jsonl")
    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1], listener=lambda e, f: log.info(e, **f))
    release = threading.Event()

    def holder() -> None:
        with scheduler.lease(label="first small"):
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    while not scheduler.in_use:
        time.sleep(0.01)
    waiter = threading.Thread(target=lambda: scheduler.lease(label="second small").__enter__())
    waiter.start()
    deadline = time.monotonic() + 10
    while not any(e["event"] == "lease_asked" and e["label"] == "second small"
                  for e in read_events(tmp_path / "events.jsonl")):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    use = lease_use(read_events(tmp_path / "events.jsonl"))
    assert [h.label for h in use.still_held] == ["first small"] and [w[0] for w in use.waiting] == ["second small"]
    release.set()
    thread.join(10)
    waiter.join(10)
    handle.close()
    use = lease_use(read_events(tmp_path / "events.jsonl"))
    assert [h.label for h in use.holds] == ["first small", "second small"] and use.waiting == []


def test_pkb_run_prints_how_this_pass_held_the_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A resumed run: only its last pass counts (the hours between passes are not idle devices)."""
    from agent.cli import run_print
    from agent.rundir import RunDir

    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    first = [{"event": "run_started", "timestamp": "2026-12-01T08:00:00Z"},
             {"event": "lease_granted", "timestamp": "2026-12-01T08:00:01Z", "label": "old default"},
             {"event": "lease_returned", "timestamp": "2026-12-01T08:00:02Z", "label": "old default"}]
    second = [{"event": "run_started", "timestamp": at(0)}, event("lease_asked", 0, "a default"),
              event("lease_granted", 0, "a default", waited_s=0.0), event("lease_returned", 5, "a default"),
              {"event": "run_finished", "timestamp": at(10)}]
    run_dir.events.write_text("".join(json.dumps(e) + "\n" for e in first + second))
    run_print.print_device_use(run_dir)
    out = capsys.readouterr().out
    assert "GPUs: devices held 50% of 10 s" in out and "old default" not in out
