"""What the final scoring adds to the submitted file's verdict: held-out shapes, the best candidate, the
trajectory (pure helpers; agent.graph's score node runs the evaluations).

- **Held-out shapes.** A problem declares, for each visible shape, a held-out one of the same meaning and
  another size (harness.problems.problem: PROBLEM["held_out"], `held-out:<shape>`); the tools never use it. Once the
  scored file is correct at the visible shape it is checked there too (correctness only, no timing), each
  held-out shape with a fresh seed of its own. A sample is correct only if correct on every shape;
  sample.json keeps both figures (`correct_visible`, `held_out`).
- **The best candidate by the tools' own evidence.** Among the candidates the tools judged correct, the
  fastest by a speedup that may count (bench, roofline; flagged speedups and none rank below), else the
  latest correct one. When it is not the scored file, it is scored the same way and reported apart
  (`best`): what the agent had, against what it handed in.
- **The trajectory.** Every candidate's tool outcome with the turn, the tokens and the dollars spent when
  it came (`trajectory`), so a report can draw pass and best speedup against turns, tokens and dollars.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# A held-out shape's seed is this far from the run's seed (the visible shape's scoring adds 1,000,003, the
# tools add nothing): inputs nobody saw feedback on, and different from the visible scoring's.
HELD_OUT_SEED_OFFSET = 2_000_003


def held_out_seed(seed: int, index: int) -> int:
    return seed + HELD_OUT_SEED_OFFSET + index


def tool_judgement(data: dict[str, Any] | None) -> tuple[bool | None, float | None]:
    """(correct, speedup that may count) of one tool outcome's data: check, bench, bash's pkb-check (their
    own verdict), roofline (its candidate's); None where the tool judged nothing (compile, profile, submit)."""
    data = dict(data or {})
    inner = data.get("candidate")
    judged: dict[str, Any] = inner if isinstance(inner, dict) else data
    if "correct" not in judged:
        return None, None
    correct = bool(judged.get("correct"))
    found = judged.get("result")
    result: dict[str, Any] = found if isinstance(found, dict) else {}
    eligible = bool(result.get("fast_eligible", True)) and not result.get("emulated", False)
    speedup = judged.get("speedup")
    counted = float(speedup) if correct and eligible and isinstance(speedup, (int, float)) else None
    return correct, counted


def best_by_evidence(candidates: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate entry the tools' evidence ranks first (module docstring), or None when none was judged
    correct."""
    correct = [c for c in candidates if c.get("correct") is True]
    if not correct:
        return None
    timed = [c for c in correct if isinstance(c.get("speedup"), (int, float))]
    if timed:
        return max(timed, key=lambda c: (float(c["speedup"]), int(c.get("index", 0))))
    return max(correct, key=lambda c: int(c.get("index", 0)))


def evidence_text(entry: dict[str, Any]) -> str:
    speed = f", speedup {entry['speedup']:.3g}x" if isinstance(entry.get("speedup"), (int, float)) else ""
    return f"{entry.get('tool') or 'reply'}: correct{speed} (turn {entry.get('turn')})"


def shape_summary(shape: str, result: dict[str, Any]) -> dict[str, Any]:
    failure = result.get("failure") or {}
    return {"shape": shape, "verdict": result.get("verdict"), "correct": bool(result.get("correct")),
            "seed": result.get("seed"), "message": str(failure.get("message") or "")[:500]}


def combined(result: dict[str, Any] | None, held_out: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
    """The sample's verdict over every shape: correct only if correct at the visible shape and on every held-out
    shape that ran; the verdict is the visible shape's unless that passed and a held-out shape failed."""
    if result is None:
        return {"correct": False, "correct_visible": False, "held_out_correct": None, "verdict": None}
    visible = bool(result.get("correct"))
    ran = list(held_out or [])
    held = None if not ran else all(h.get("correct") for h in ran)
    verdict = result.get("verdict")
    if visible and held is False:
        verdict = next(h["verdict"] for h in ran if not h.get("correct"))
    return {"correct": visible and held is not False, "correct_visible": visible, "held_out_correct": held,
            "verdict": verdict}


def trajectory(candidates: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every candidate's tool outcome, in order: the fields a trajectory plot reads."""
    keys = ("index", "path", "tool", "turn", "verdict", "correct", "speedup", "sha256", "tokens", "cost_usd",
            "gpu_s")
    return [{k: c.get(k) for k in keys} for c in candidates]
