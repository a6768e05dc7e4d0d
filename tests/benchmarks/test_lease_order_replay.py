"""The lease-order replay's simulation (benchmarks/lease_order_replay.py): a recorded log's requests served
again under agent.lease_order's policy. Its figures go into docs/measurements/pkb-runs.md, so its clock is checked
here."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import lease_order_replay as replay


def at(seconds: float) -> str:
    return f"2026-12-02T10:{int(seconds) // 60:02d}:{int(seconds) % 60:02d}.000000Z"


def lease(name: str, seconds: float, label: str, shared: bool, **fields: Any) -> dict[str, Any]:
    return {"event": f"lease_{name}", "timestamp": at(seconds), "label": label, "shared": shared, **fields}


def sample(name: str, seconds: float, problem: str) -> dict[str, Any]:
    return {"event": f"sample_{name}", "timestamp": at(seconds), "problem": problem}


def log() -> list[dict[str, Any]]:
    """Three samples at once. `slow` holds the GPU 60 s; `judged` is judged again alone from 5 s; `x` asks
    after a 10 s build; `y` starts when `slow` ends, builds 10 s and is still holding when the run stops."""
    return [
        {"event": "run_started", "timestamp": at(0), "capacity": 4, "concurrency": 3},
        sample("started", 0, "slow"), sample("started", 0, "judged"), sample("started", 0, "x"),
        lease("asked", 0, "slow default", True), lease("granted", 0, "slow default", True, waited_s=0),
        lease("asked", 0, "judged default", True), lease("granted", 0, "judged default", True, waited_s=0),
        lease("returned", 5, "judged default", True, held_s=5.0),
        lease("asked", 5, "judged default", False),
        lease("asked", 10, "x default", True),
        lease("returned", 60, "slow default", True, held_s=60.0),
        lease("granted", 60, "judged default", False, waited_s=55.0),
        sample("finished", 61, "slow"), sample("started", 61, "y"),
        lease("returned", 65, "judged default", False, held_s=5.0), sample("finished", 65, "judged"),
        lease("granted", 65, "x default", True, waited_s=55.0),
        lease("asked", 71, "y default", True), lease("granted", 71, "y default", True, waited_s=0.0),
        lease("returned", 75, "x default", True, held_s=10.0), sample("finished", 75, "x"),
        {"event": "run_stopped", "timestamp": at(80)},  # y never returned: its hold is estimated
    ]


def test_a_log_becomes_each_samples_build_requests_and_tail():
    samples = replay.samples_of(log())
    assert list(samples) == ["slow", "judged", "x", "y"]  # the order the run started them
    assert [(s.gap_s, s.shared, s.hold_s) for s in samples["judged"].steps] == [(0, True, 5.0), (0, False, 5.0)]
    assert samples["x"].steps[0].gap_s == pytest.approx(10) and samples["slow"].tail_s == pytest.approx(1)
    assert samples["y"].started_s == pytest.approx(61) and samples["y"].steps[0].gap_s == pytest.approx(10)
    assert replay.estimate_missing(samples) == 1 and samples["y"].steps[0].hold_s == pytest.approx(10)  # the median


def test_the_exclusive_first_order_reproduces_the_recorded_run():
    samples = replay.samples_of(log())
    replay.estimate_missing(samples)
    outcome = replay.simulate(samples, groups=1, room=4, long_hold_s=math.inf, concurrency=3)
    assert outcome.finished_s == pytest.approx([61, 65, 75, 81])  # y: its estimated 10 s from 71 s
    assert outcome.waited_s == pytest.approx(55 + 55) and outcome.lease_s == pytest.approx(60 + 5 + 5 + 10 + 10)


def test_beside_a_long_hold_shared_requests_run_while_the_re_judge_waits_and_the_next_build_starts_sooner():
    samples = replay.samples_of(log())
    replay.estimate_missing(samples)
    outcome = replay.simulate(samples, groups=1, room=4, long_hold_s=30.0, concurrency=3)
    # x goes beside `slow` once it has held 30 s (30-40 s); y starts in x's place at 40 s and runs 50-60 s;
    # the re-judge still gets the group when it empties at 60 s
    assert outcome.finished_s == pytest.approx([40, 60, 61, 65])
    assert outcome.waited_s == pytest.approx(55 + 20) and outcome.held_s == pytest.approx(65)
    # without the concurrency limit y asks when it did in the run (71 s): the order alone
    as_recorded = replay.simulate(samples, groups=1, room=4, long_hold_s=30.0, concurrency=None)
    assert as_recorded.finished_s == pytest.approx([40, 61, 65, 81])


def test_the_command_reads_a_kept_gzip_log_and_writes_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    kept = tmp_path / "run.events.jsonl.gz"
    kept.write_bytes(gzip.compress("".join(json.dumps(e) + "\n" for e in log()).encode() + b'{"torn'))
    assert replay.main([str(kept), "--long-hold-s", "inf", "30", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "4 samples, 5 lease requests (1 holds estimated), 1 group(s) of 4, 3 samples at once" in printed
    assert "| the run itself (unfinished samples left out) | 80 | 3 | 110 |" in printed
    assert "| exclusive first (until 2026-12-02) | 81 | 3 | 110 |" in printed
    assert "| beside holds >= 30 s | 65 | 4 | 75 |" in printed
    written = json.loads((tmp_path / "out" / "lease_order.json").read_text())
    assert [row["long_hold_s"] for row in written["simulated"]] == [None, 30.0] and written["concurrency"] == 3
