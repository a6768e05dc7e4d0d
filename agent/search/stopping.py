"""Why a problem, or the whole search, stops. Every stop is recorded in the archive with its reason.

Problem stops (checked before each decision, on the candidates the loop may see):
- `target_fraction`: its best trusted kernel reached the configured roofline fraction;
- `target_speedup`: its best trusted kernel reached the configured speedup;
- `no_improvement`: `patience` candidates in a row did not raise its best trusted speedup by `min_gain`
  (relative); with no trusted kernel at all, `patience` candidates without one;
- `problem_budget:<kind>`: its own budget (candidates, gpu_hours, cost_usd, tokens, wall_hours) is spent;
- `search_budget:<kind>`: the whole search's budget is spent (every problem still active stops with it).

Search stops (archive meta `stop_reason`): `all_problems_stopped`, `search_budget:<kind>`, `model_fatal`
(a bad key or model: every call would fail), `provider_unavailable` (the provider stayed down longer than
the search waits: `--resume` continues), `interrupted` (Ctrl-C).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.search.archive import Candidate
from agent.search.budget import Spent, reached
from agent.search.config import Limits, StopConfig
from agent.search.strategies import best

TARGET_FRACTION = "target_fraction"
TARGET_SPEEDUP = "target_speedup"
NO_IMPROVEMENT = "no_improvement"
PROBLEM_BUDGET = "problem_budget"
SEARCH_BUDGET = "search_budget"
ALL_STOPPED = "all_problems_stopped"
MODEL_FATAL = "model_fatal"
PROVIDER_UNAVAILABLE = "provider_unavailable"
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Decision:
    reason: str
    detail: dict[str, Any]


def since_improvement(evaluated: Sequence[Candidate], min_gain: float) -> tuple[int, float | None]:
    """(candidates evaluated after the last improvement of the best trusted speedup, that best)."""
    top: float | None = None
    last = -1
    for i, c in enumerate(evaluated):
        if not (c.trusted and c.speedup is not None):
            continue
        if top is None or c.speedup > top * (1.0 + min_gain):
            top, last = c.speedup, i
        elif c.speedup > top:
            top = c.speedup  # a gain too small to reset the patience still raises the bar
    return len(evaluated) - 1 - last, top


def problem_stop(visible: Sequence[Candidate], config: StopConfig, limits: Limits, used: Spent) -> Decision | None:
    """The reason a problem stops now, or None. `visible`: its candidates the decision may see, in order."""
    evaluated = [c for c in visible if c.done and c.verdict != "infra_error"]
    top = best(list(evaluated))
    if top is not None:
        if config.target_fraction is not None and top.roofline_fraction is not None \
                and top.roofline_fraction >= config.target_fraction:
            return Decision(TARGET_FRACTION, {"best": top.id, "fraction": top.roofline_fraction,
                                              "target": config.target_fraction})
        if config.target_speedup is not None and top.speedup is not None and top.speedup >= config.target_speedup:
            return Decision(TARGET_SPEEDUP, {"best": top.id, "speedup": top.speedup, "target": config.target_speedup})
    if config.patience is not None:
        stale, best_speedup = since_improvement(evaluated, config.min_gain)
        if stale >= config.patience:
            return Decision(NO_IMPROVEMENT, {"patience": config.patience, "best_speedup": best_speedup,
                                             "best": top.id if top else None, "evaluated": len(evaluated)})
    kind = reached(limits, used)
    if kind is not None:
        return Decision(f"{PROBLEM_BUDGET}:{kind}", {"limit": limits.given()[kind], "spent": used.amount(kind)})
    return None
