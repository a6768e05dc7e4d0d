"""What a search (or one problem) has spent, which limit that reaches, and which problem gets the next candidate.

Spending is read from the archive. Candidates count as soon as they are decided (so that limit is exact);
tokens, dollars and GPU seconds count once known, from the candidates the loop may see when it decides
(agent.search.loop), so those limits can be passed by what is in flight, at most window - 1 candidates'
worth. Wall clock: the search's hours running over all its sessions (a killed search is not charged for
the time it lay dead); a problem's hours are what its candidates spent in model calls and evaluations.

Allocation: after `warmup` candidates each, the next candidate goes to the active problem furthest behind
its share, a problem's share being proportional to its gap (1 - the roofline fraction of its best trusted
kernel; 1 where none is known yet). So the budget flows to the problems with the largest gap, and a
problem that stops (its target reached, no more improvement) leaves its share to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.search.archive import Candidate
from agent.search.config import Limits
from agent.search.strategies import best

MIN_SHARE = 0.05  # a problem close to its roofline still gets a trickle until a stop rule ends it


@dataclass(frozen=True)
class Spent:
    candidates: int = 0
    gpu_s: float = 0.0
    cost_usd: float = 0.0
    tokens: int = 0
    wall_s: float = 0.0
    cost_known: bool = True

    def amount(self, kind: str) -> float:
        return {"candidates": self.candidates, "gpu_hours": self.gpu_s / 3600.0, "cost_usd": self.cost_usd,
                "tokens": self.tokens, "wall_hours": self.wall_s / 3600.0}[kind]


def spent(decided: Sequence[Candidate], known: Sequence[Candidate], wall_s: float) -> Spent:
    """`decided`: every candidate decided so far; `known`: those whose costs the decision may read."""
    return Spent(candidates=len(decided), gpu_s=sum(c.device_s for c in known), cost_usd=sum(c.cost_usd for c in known),
                 tokens=sum(c.tokens for c in known), wall_s=wall_s,
                 cost_known=all(c.cost_known for c in known))


def reached(limits: Limits, used: Spent) -> str | None:
    """The first limit `used` has reached (in Limits' field order), or None."""
    for kind, limit in limits.given().items():
        if used.amount(kind) >= limit:
            return kind
    return None


def gap(candidates: Sequence[Candidate]) -> float:
    """1 - the roofline fraction of the best trusted kernel (1 when there is none or no fraction is known)."""
    top = best(list(candidates))
    if top is None or top.roofline_fraction is None:
        return 1.0
    return max(0.0, 1.0 - min(1.0, top.roofline_fraction))


def choose_problem(active: Sequence[str], decided: dict[str, int], gaps: dict[str, float], warmup: int) -> str:
    """The problem the next candidate goes to (see the module doc); ties go to the earlier problem."""
    if not active:
        raise ValueError("no active problem to choose from")
    for name in active:
        if decided.get(name, 0) < warmup:
            return name
    total = sum(max(gaps.get(n, 1.0), MIN_SHARE) for n in active)

    def behind(name: str) -> float:
        share = max(gaps.get(name, 1.0), MIN_SHARE) / total
        return (decided.get(name, 0) + 1) / share

    return min(active, key=lambda n: (behind(n), list(active).index(n)))
