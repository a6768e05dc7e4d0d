"""Deciding one slot of the search: the stops now due, the problem, the migrations, the parent(s).

A pure function of the archive's candidates below the slot's window and of the run's seed (agent.search.loop
says why that makes a search resumable and deterministic): agent.search.stopping decides the stops,
agent.search.budget the problem (warm-up, then the largest gap), agent.search.strategies the migrations and
the parents, with a random.Random seeded by the run's seed and the slot.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from agent.search import budget, stopping, strategies
from agent.search.archive import Archive
from agent.search.config import SearchConfig, derived_seed


def decide(archive: Archive, config: SearchConfig, order: list[str], slot: int, elapsed_s: float, log: Any) -> bool:
    """Decide slot `slot` into the archive; False when the search is over (every problem stopped, or the
    search's budget spent: then every active problem is stopped with it)."""
    c = config
    visible = archive.candidates(upto=slot - c.window + 1)
    decided = archive.candidates(upto=slot)
    stops = archive.stops()
    active = [p for p in order if p not in stops]
    total = budget.spent(decided, visible, elapsed_s)
    kind = budget.reached(c.budget, total)
    if kind is not None:
        for name in active:
            archive.stop(name, f"{stopping.SEARCH_BUDGET}:{kind}", slot,
                         {"limit": c.budget.given()[kind], "spent": total.amount(kind)})
            log.info("problem_stopped", problem=name, reason=f"{stopping.SEARCH_BUDGET}:{kind}", slot=slot)
        return False
    for name in active:
        mine = [x for x in visible if x.problem == name]
        mine_decided = [x for x in decided if x.problem == name]
        wall = problem_seconds(archive, config, name, slot)
        decision = stopping.problem_stop(mine, c.stop, c.per_problem, budget.spent(mine_decided, mine, wall))
        if decision is not None:
            archive.stop(name, decision.reason, slot, decision.detail)
            log.info("problem_stopped", problem=name, reason=decision.reason, slot=slot, **decision.detail)
    stops = archive.stops()
    active = [p for p in order if p not in stops]
    if not active:
        return False
    counts = Counter(x.problem for x in decided)
    gaps = {name: budget.gap([x for x in visible if x.problem == name]) for name in active}
    problem = budget.choose_problem(active, dict(counts), gaps, c.warmup)
    seq = counts[problem]
    mine = [x for x in visible if x.problem == problem]
    # Only migrations of earlier slots decide this slot's: a killed attempt at this very slot may have
    # recorded some of them already.
    before = [m for m in archive.migrants(problem) if m[2] < slot]
    moves = strategies.migrations(c.strategy, seq, mine, before)
    for to_island, candidate in moves:
        archive.add_member(problem, to_island, candidate, slot)
    migrants = before + [(to_island, candidate, slot) for to_island, candidate in moves]
    uses = Counter(x.parents[0] for x in decided if x.problem == problem and x.parents)
    rng = random.Random(derived_seed(c.seed, slot, "select"))
    choice = strategies.choose(c.strategy, seq, mine, uses, migrants, rng)
    archive.decide(slot, problem, seq, choice.island, choice.parents, c.strategy.name, choice.why)
    log.info("decided", slot=slot, problem=problem, seq=seq, island=choice.island, parents=choice.parents,
             **{k: v for k, v in choice.why.items() if k in ("mode", "reason")})
    return True


def problem_seconds(archive: Archive, config: SearchConfig, problem: str, slot: int) -> float:
    """Seconds the problem's candidates below `slot` spent in model calls and evaluations (its wall budget)."""
    if config.per_problem.wall_hours is None:
        return 0.0  # read only when that limit is set: it depends on the clock
    rows = [r for r in archive.rows(("id", "problem", "model_s", "eval_s"))
            if r["problem"] == problem and r["id"] < slot]
    return sum(float(r["model_s"] or 0.0) + float(r["eval_s"] or 0.0) for r in rows)
