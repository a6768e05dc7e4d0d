"""Parent selection: which archived kernel(s) the next candidate of a problem starts from.

Only trusted candidates (correct, timed, no integrity flag that voids a speedup) are ever parents or
inspirations; a problem with none yet gets a fresh draft, as independent sampling always does.

- independent: always a fresh draft (the control: what k samples of `pkb run` do).
- best_first: the best trusted kernel, or with probability `explore` a weighted pick among the top k.
- islands: candidate n of a problem belongs to island n mod N and picks its parent, weighted, from that
  island's own trusted members and the migrants it received; the loop migrates the best of island i to
  island i+1 every `migration_interval` candidates (`migrations`). With `inspirations`, other members of
  the island are shown beside the parent.

Weights: (speedup / best speedup) ** speedup_weight, times (1 / (1 + times already a parent)) **
reuse_penalty, times (1 + novelty_weight * distance from the best kernel's code), the distance being one
minus the Jaccard similarity of the two files' word sets. Every draw uses the random.Random the loop
passes in, seeded by the run's seed and the candidate's slot.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agent.search.archive import Candidate
from agent.search.config import StrategyConfig

_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:e-?\d+)?")


@dataclass
class Choice:
    parents: list[int]  # the parent first, then inspirations; empty: a fresh draft
    island: int | None
    why: dict[str, Any] = field(default_factory=dict)

    @property
    def parent(self) -> int | None:
        return self.parents[0] if self.parents else None


def words(source: str | None) -> frozenset[str]:
    return frozenset(_WORDS.findall(source or ""))


def distance(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 0.0
    return 1.0 - len(a & b) / len(a | b)


def weights(pool: list[Candidate], uses: Counter[int], config: StrategyConfig) -> list[float]:
    """The selection weight of each candidate of `pool` (all trusted, with speedups)."""
    best = max(pool, key=rank_key)
    top = best.speedup or 1.0
    best_words = words(best.source)
    out = []
    for c in pool:
        ratio = max((c.speedup or 0.0) / top, 1e-9)
        novelty = distance(words(c.source), best_words)
        out.append(ratio ** config.speedup_weight * (1.0 / (1 + uses[c.id])) ** config.reuse_penalty
                   * (1.0 + config.novelty_weight * novelty))
    return out


def rank_key(c: Candidate) -> tuple[float, int]:
    """Best first: the highest speedup; between equals, the earliest."""
    return (c.speedup if c.speedup is not None else float("-inf"), -c.id)


def trusted(candidates: list[Candidate]) -> list[Candidate]:
    return [c for c in candidates if c.trusted and c.speedup is not None]


def best(candidates: list[Candidate]) -> Candidate | None:
    pool = trusted(candidates)
    return max(pool, key=rank_key) if pool else None


def best_distinct(candidates: list[Candidate], top: int) -> list[Candidate]:
    """The `top` best trusted candidates by the search's own figure, one per distinct source (the kernels the
    search re-measures before it reports one)."""
    seen: set[str] = set()
    picked: list[Candidate] = []
    for c in sorted(trusted(candidates), key=rank_key, reverse=True):
        digest = hashlib.sha256((c.source or "").encode()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            picked.append(c)
        if len(picked) == top:
            break
    return picked


def _draw(pool: list[Candidate], uses: Counter[int], config: StrategyConfig, rng: random.Random) -> Candidate:
    w = weights(pool, uses, config)
    return rng.choices(pool, weights=w, k=1)[0]


def island_pool(snapshot: list[Candidate], island: int, migrants: list[tuple[int, int, int]]) -> list[Candidate]:
    """The trusted members of `island`: its own candidates and those that migrated to it."""
    by_id = {c.id: c for c in snapshot}
    arrived = {cand for isl, cand, _ in migrants if isl == island}
    members = {c.id: c for c in snapshot if c.island == island}
    members.update({i: by_id[i] for i in arrived if i in by_id})
    return trusted(sorted(members.values(), key=lambda c: c.id))


def choose(config: StrategyConfig, seq: int, snapshot: list[Candidate], uses: Counter[int],
           migrants: list[tuple[int, int, int]], rng: random.Random) -> Choice:
    """The parents of candidate `seq` of a problem, from the candidates of that problem the loop may see."""
    if config.name == "independent":
        return Choice([], None, {"mode": "fresh"})
    if config.name == "best_first":
        pool = sorted(trusted(snapshot), key=rank_key, reverse=True)
        if not pool:
            return Choice([], None, {"mode": "fresh", "reason": "no trusted kernel yet"})
        if rng.random() >= config.explore or len(pool) == 1:
            return Choice([pool[0].id], None, {"mode": "best", "speedup": pool[0].speedup})
        top = pool[:config.top_k]
        pick = _draw(top, uses, config, rng)
        return Choice([pick.id], None, {"mode": "top_k", "speedup": pick.speedup, "pool": [c.id for c in top]})
    island = seq % config.islands
    pool = island_pool(snapshot, island, migrants)
    if not pool:
        return Choice([], island, {"mode": "fresh", "reason": "island has no trusted kernel yet"})
    parent = _draw(pool, uses, config, rng)
    others = [c for c in pool if c.id != parent.id]
    chosen: list[Candidate] = []
    for _ in range(min(config.inspirations, len(others))):
        pick = _draw(others, uses, config, rng)
        chosen.append(pick)
        others = [c for c in others if c.id != pick.id]
    return Choice([parent.id, *(c.id for c in chosen)], island,
                  {"mode": "island", "speedup": parent.speedup, "pool": [c.id for c in pool]})


def migrations(config: StrategyConfig, seq: int, snapshot: list[Candidate],
               migrants: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """(to island, candidate): the best of each island moves on to the next, every migration_interval
    candidates of the problem (none for other strategies, or with one island)."""
    if config.name != "islands" or config.islands < 2 or seq == 0 or seq % config.migration_interval:
        return []
    moves = []
    for island in range(config.islands):
        top = best(island_pool(snapshot, island, migrants))
        if top is not None:
            moves.append(((island + 1) % config.islands, top.id))
    return moves
