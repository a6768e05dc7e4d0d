"""The lease-order replay's simulation (benchmarks/lease_order_replay.py): a recorded log's requests served
again under agent.lease_order's policy. Its figures go into docs/pkb.md, so its clock is checked here."""

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


def log() -> list[dict[str, Any]]:
    """`slow` holds the GPU 60 s; `judged` is judged again alone from 5 s; `x` and `y` ask at 10 s for 10 s."""
    return [
        {"event": "run_started", "timestamp": at(0), "capacity": 4},
        lease("asked", 0, "slow default", True), lease("granted", 0, "slow default", True, waited_s=0),
        lease("asked", 0, "judged default", True), lease("granted", 0, "judged default", True, waited_s=0),
        lease("returned", 5, "judged default", True, held_s=5.0),
        lease("asked", 5, "judged default", False),
        lease("asked", 10, "x default", True), lease("asked", 10, "y default", True),
        lease("returned", 60, "slow default", True, held_s=60.0),
        lease("granted", 60, "judged default", False, waited_s=55.0),
        lease("returned", 65, "judged default", False, held_s=5.0),
        lease("granted", 65, "x default", True, waited_s=55.0), lease("granted", 65, "y default", True, waited_s=55.0),
        lease("returned", 75, "x default", True, held_s=10.0),
        {"event": "run_stopped", "timestamp": at(80)},  # y never returned: its hold is estimated
    ]


def test_the_exclusive_first_order_reproduces_the_recorded_run():
    steps = replay.chains(log())
    assert [(s.gap_s, s.shared, s.hold_s) for s in steps["judged"]] == [(0, True, 5.0), (0, False, 5.0)]
    assert replay.estimate_missing(steps) == 1 and steps["y"][0].hold_s == pytest.approx(10.0)  # shared median
    outcome = replay.simulate(steps, groups=1, room=4, long_hold_s=math.inf)
    assert outcome.end_s == pytest.approx(75) and outcome.waited_s == pytest.approx(55 * 3)
    assert outcome.lease_s == pytest.approx(60 + 5 + 5 + 10 + 10)


def test_beside_a_long_hold_the_shared_requests_run_while_the_re_judge_waits():
    steps = replay.chains(log())
    replay.estimate_missing(steps)
    outcome = replay.simulate(steps, groups=1, room=4, long_hold_s=30.0)
    # x and y go beside `slow` once it has held 30 s (30-40 s); the re-judge still gets the group at 60 s
    assert outcome.end_s == pytest.approx(65) and outcome.waited_s == pytest.approx(55 + 20 + 20)
    assert outcome.held_s == pytest.approx(65)


def test_the_command_reads_a_kept_gzip_log_and_writes_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    kept = tmp_path / "run.events.jsonl.gz"
    kept.write_bytes(gzip.compress("".join(json.dumps(e) + "\n" for e in log()).encode() + b'{"torn'))
    assert replay.main([str(kept), "--long-hold-s", "inf", "30", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "4 samples, 5 lease requests (1 holds estimated), 1 group(s) of 4" in printed
    assert "| exclusive first (until 2026-12-02) | 75 | 165 |" in printed
    assert "| beside holds >= 30 s | 65 | 95 |" in printed
    written = json.loads((tmp_path / "out" / "lease_order.json").read_text())
    assert [row["long_hold_s"] for row in written["simulated"]] == [None, 30.0]
    assert written["recorded"]["end_s"] == pytest.approx(80)
