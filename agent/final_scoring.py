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

This module is the one place a file's final score is computed (`score_final`: the visible shape, then the held-out
shapes, the verdict over both): the graph's score node and the runner's replay and judgement again score the
submitted file with it (`score_submission`, on scoring_seed(seed)), the best candidate too (`score_best`), and
agent.remeasure's rounds (the search's re-measurement, `pkb rescore` of a search or a sample run) are one
`score_final` each on a fresh seed. It imports no LangGraph: `pkb rescore` loads the scoring, not the agent loop.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import scoring
from agent.scoring import Scored
from harness.config import EvalConfig
from harness.problems.problem import Problem
from harness.records.results import EvalResult

EvaluateFn = Callable[..., EvalResult]  # harness.evaluate.evaluate's signature

# The final scoring of a submitted file runs on this far from the run's seed: the tools check with the run's seed,
# so the inputs of the final verdict are ones the model never saw feedback on.
SCORING_SEED_OFFSET = 1_000_003
# A held-out shape's seed is this far from the run's seed (the visible shape's scoring adds 1,000,003, the
# tools add nothing): inputs nobody saw feedback on, and different from the visible scoring's.
HELD_OUT_SEED_OFFSET = 2_000_003


def scoring_seed(seed: int) -> int:
    return seed + SCORING_SEED_OFFSET


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


# -- scoring a file ------------------------------------------------------------------------------------------
@dataclass
class HeldOut:
    summary: dict[str, Any]  # shape_summary
    seconds: float
    gpu_s: float


@dataclass
class FinalScore:
    """A file's final score: the visible shape's evaluation (with its infra retries) and each held-out shape's."""

    visible: Scored
    held_out: list[HeldOut] = field(default_factory=list)

    @property
    def result(self) -> EvalResult:
        return self.visible.result

    @property
    def shapes(self) -> list[dict[str, Any]]:
        """shape_summary of each held-out shape that ran."""
        return [h.summary for h in self.held_out]

    @property
    def seconds(self) -> float:
        return self.visible.seconds + sum(h.seconds for h in self.held_out)

    @property
    def gpu_s(self) -> float:
        return self.visible.gpu_s + sum(h.gpu_s for h in self.held_out)

    def overall(self) -> dict[str, Any]:
        """`combined` over the visible shape and the held-out shapes."""
        return combined(self.result.model_dump(mode="json"), self.shapes)

    def state(self) -> dict[str, Any]:
        """What the sample's state keeps of it (agent.graph.AgentState): `result`, `held_out` and `scoring`."""
        return {"result": self.result.model_dump(mode="json"), "held_out": self.shapes,
                "scoring": {"seconds": self.seconds, "gpu_s": self.gpu_s, "attempts": self.visible.attempts}}


def score_final(problem: Problem, path: Path, *, evaluate: EvaluateFn, config: EvalConfig, world_size: int,
                device: str, shape: str, held_out_seed: Callable[[int], int], log_dir: Path | None = None,
                log: Any = None, event: str = "scoring_infra_error", **context: Any) -> FinalScore:
    """`path` at the visible `shape` with `config` (its seed as given), through `evaluate` (harness.evaluate.evaluate's
    signature) by agent.scoring (an infra_error is retried, bounded); then, when that is correct, on each held-out
    shape of it: correctness only, on held_out_seed(i), no rank logs. Each infra_error is logged as `event` with
    `context`, the shape and the seed."""

    def once(name: str, settings: EvalConfig, logs: Path | None) -> Scored:
        return scoring.score(lambda: evaluate(problem, path, world_size=world_size, device=device, shape=name,
                                              config=settings, log_dir=logs),
                             log=log, event=event, **context, shape=name, seed=settings.seed)

    out = FinalScore(once(shape, config, log_dir))
    if not out.result.correct:  # the file is not correct either way: the held-out shapes need not run
        return out
    for i, name in enumerate(problem.held_out_shapes(shape)):
        checked = once(name, config.model_copy(update={"seed": held_out_seed(i), "skip_timing": True}), None)
        out.held_out.append(HeldOut(shape_summary(name, checked.result.model_dump(mode="json")), checked.seconds,
                                    checked.gpu_s))
    return out


def score_submission(problem: Problem, path: Path, *, evaluate: EvaluateFn, config: EvalConfig, world_size: int,
                     device: str, shape: str, log_dir: Path | None, log: Any = None) -> FinalScore:
    """A sample's file scored finally: the visible shape on scoring_seed(config.seed), the held-out shapes on
    held_out_seed(config.seed, i) (module docstring)."""
    return score_final(problem, path, evaluate=evaluate,
                       config=config.model_copy(update={"seed": scoring_seed(config.seed)}), world_size=world_size,
                       device=device, shape=shape, held_out_seed=lambda i: held_out_seed(config.seed, i),
                       log_dir=log_dir, log=log)


def score_best(problem: Problem, folder: Path, candidates: Sequence[dict[str, Any]], final: str, *,
               evaluate: EvaluateFn, config: EvalConfig, world_size: int, device: str, shape: str,
               log: Any = None) -> dict[str, Any] | None:
    """The best candidate by the tools' evidence (`best_by_evidence`) of the sample in `folder`, scored like the
    submitted file `final` (relative to `folder`) when it is another file; None when no candidate was judged
    correct."""
    entry = best_by_evidence(candidates)
    if entry is None:
        return None
    best = {"candidate": entry["path"], "evidence": evidence_text(entry), "turn": entry.get("turn")}
    final_sha = hashlib.sha256((folder / final).read_bytes()).hexdigest()
    if entry.get("sha256") == final_sha or entry["path"] == final:
        return {**best, "same_as_final": True}
    scored = score_submission(problem, folder / entry["path"], evaluate=evaluate, config=config,
                              world_size=world_size, device=device, shape=shape, log_dir=None, log=log)
    result = scored.result.model_dump(mode="json")
    return {**best, "same_as_final": False, **scored.overall(), "speedup": result.get("speedup"),
            "fast_eligible": bool(result.get("fast_eligible", True)), "flags": list(result.get("flags") or []),
            "held_out": scored.shapes, "seconds": scored.seconds, "gpu_s": scored.gpu_s}
