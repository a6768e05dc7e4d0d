"""How samples improve turn by turn, and what the final scoring adds (held-out shapes, the best candidate).

Read from sample.json (agent.final_scoring writes `trajectory`, `held_out`, `correct_visible`, `best`) and,
where `pkb rescore` ran, each sample's rescored.json (every distinct candidate scored by the final scorer).
Per arm (one condition of one run):
- held-out: samples correct at the visible shape, correct on every shape (what counts), and the best
  candidate's figures beside the submitted one's;
- curves: the share of samples with a correct candidate so far, and the median best counted speedup so far
  (0 for a sample without one), against the turn, the tokens and the dollars spent when each candidate came.
  By the tools' own evidence (what the agent knew), and, after `pkb rescore`, by the final scorer.
agent.report.figures draws both curves per arm; a condition whose tools judge nothing (zero-shot) has only
the rescored curve.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.rundir import SampleLayout

if TYPE_CHECKING:
    from agent.report.build import Arm, Report
    from agent.report.run_reader import Sample

GRID_POINTS = 24
AXES = (("turn", "turn"), ("tokens", "tokens (input + output)"), ("cost_usd", "dollars"))


def rescored(sample: Sample) -> dict[str, dict[str, Any]]:
    """path -> the final scorer's summary of that candidate (rescored.json), {} where none was written."""
    path = SampleLayout(Path(sample.directory)).rescored_json
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    found = data.get("candidates") if isinstance(data, dict) else None
    return {str(k): v for k, v in found.items() if isinstance(v, dict)} if isinstance(found, dict) else {}


def _points(sample: Sample, by: str) -> list[dict[str, Any]]:
    """The sample's candidates in order with `correct` and `speedup` by the tools (by="tools") or by the final
    scorer (by="rescored"; only candidates it scored)."""
    trajectory = [t for t in (sample.record.model_extra or {}).get("trajectory") or [] if isinstance(t, dict)]
    if by == "tools":
        return trajectory
    scores = rescored(sample)
    out = []
    for t in trajectory:
        s = scores.get(str(t.get("path")))
        if s is not None:
            counted = s.get("speedup") if s.get("correct") and s.get("fast_eligible", True) else None
            out.append({**t, "correct": bool(s.get("correct")), "speedup": counted})
    return out


def _so_far(points: list[dict[str, Any]], axis: str, limit: float) -> tuple[bool, float]:
    """(a correct candidate so far, the best counted speedup so far) among points with axis value <= limit."""
    seen = [p for p in points if isinstance(p.get(axis), (int, float)) and p[axis] <= limit]
    correct = any(p.get("correct") is True for p in seen)
    speeds = [float(p["speedup"]) for p in seen if p.get("correct") is True and isinstance(p.get("speedup"),
                                                                                          (int, float))]
    return correct, max(speeds, default=0.0)


def curve(samples: Sequence[Sample], by: str, axis: str) -> list[dict[str, float]]:
    """[{x, pass, best_speedup}] over a grid of the axis: turns 1..max, or GRID_POINTS steps of tokens or
    dollars up to the largest any sample reached. Empty where no sample has a point on this axis."""
    per_sample = [_points(s, by) for s in samples]
    values = [float(p[axis]) for pts in per_sample for p in pts if isinstance(p.get(axis), (int, float))]
    if not values or not samples:
        return []
    top = max(values)
    grid = (list(range(1, int(top) + 1)) if axis == "turn" else
            [float(x) for x in np.linspace(top / GRID_POINTS, top, GRID_POINTS)]) if top > 0 else [0.0]
    out = []
    for x in grid:
        states = [_so_far(pts, axis, x) for pts in per_sample]
        out.append({"x": float(x), "pass": sum(c for c, _ in states) / len(states),
                    "best_speedup": float(statistics.median(s for _, s in states))})
    return out


def _held_out(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    finished = [r for r in records if r.get("status") == "finished"]
    ran = [r for r in finished if (r.get("held_out") or {}).get("shapes")]
    best = [r["best"] for r in finished if isinstance(r.get("best"), dict)]
    apart = [b for b in best if not b.get("same_as_final")]
    return {"samples": len(finished),
            "correct_visible": sum(bool(r.get("correct_visible", r.get("correct"))) for r in finished),
            "correct": sum(bool(r.get("correct")) for r in finished),
            "held_out_run": len(ran),
            "held_out_failed": sum((r.get("held_out") or {}).get("correct") is False for r in finished),
            "best_found": len(best), "best_is_final": len(best) - len(apart),
            "best_apart_correct": sum(bool(b.get("correct")) for b in apart),
            "final_correct_where_best_apart": sum(bool(r.get("correct")) for r in finished
                                                  if isinstance(r.get("best"), dict)
                                                  and not r["best"].get("same_as_final"))}


def summarize(arms: Sequence[Arm]) -> list[dict[str, Any]]:
    """Per arm: the held-out and best-candidate counts, and the curves (JSON-ready, part of the report's data)."""
    out = []
    for arm in arms:
        curves = {by: {axis: curve(arm.samples, by, axis) for axis, _ in AXES} for by in ("tools", "rescored")}
        out.append({"label": arm.label, "final_scoring": _held_out(arm.records), "curves": curves,
                    "rescored_samples": sum(1 for s in arm.samples if rescored(s))})
    return out


# -- layout ---------------------------------------------------------------------------------------------


def rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["arm", "samples finished", "correct (visible shape)", "correct (all shapes)", "failed a held-out shape",
            "best candidate was not the submitted one", "that best candidate correct",
            "the submitted one correct there"]
    body = []
    for arm in report.data.get("trajectories") or []:
        f = arm["final_scoring"]
        body.append([arm["label"], str(f["samples"]), str(f["correct_visible"]), str(f["correct"]),
                     str(f["held_out_failed"]), str(f["best_found"] - f["best_is_final"]),
                     str(f["best_apart_correct"]), str(f["final_correct_where_best_apart"])])
    return head, body


NOTE = ("Correct (all shapes) is what pass@k counts: the scored file is also checked on the problem's held-out "
        "shapes, which no tool used. The best candidate is the one the tools judged best (fastest counted "
        "speedup, else the latest correct); where it is not the submitted file it is scored apart. Curves: the "
        "share of samples with a correct candidate so far and the median best speedup so far, by the tools' "
        "evidence (solid) and, after `pkb rescore RUN`, by the final scorer (dashed).")
