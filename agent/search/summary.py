"""What a search has found so far, read from its archive: per problem, over time, and how busy the devices were.

Used by the live view, the end-of-search table and the report, so all three say the same thing.

- The best of a problem (`ProblemRow.best`) is its best trusted candidate by the search's own evaluation.
  What is *reported* (`ProblemRow.reported`) is, of the candidates trusted on every one of their rescores
  on fresh seeds, the one with the best median rescored speedup, with that median: a kernel that a fresh
  seed shows wrong or flagged is never reported, and one that was only timed at a lucky moment loses to
  one that is fast on the fresh seeds too.
- `timeline`: per problem, the best trusted speedup and roofline fraction after each evaluation, against
  the search's running seconds and its cumulative device hours.
- `throughput`: device busy fraction (seconds evaluation slots were held, over capacity x wall: at most 1,
  since no more than `capacity` slots are ever held at once; device seconds are the GPUs held times the
  seconds held, agent.executors.request.device_seconds), candidates per device hour, and seconds per
  candidate by stage: model (the model call), build (compile), launch (the rank
  processes starting), check (audit, load, correctness trials), timing, teardown, and queue (the rest of an
  evaluation's wall time: waiting for a lease, and on CUDA the build done before the lease is taken).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agent.search.archive import EVALUATED, Archive, Candidate, Rescore, Stop
from agent.search.strategies import rank_key, trusted

CHECK_STAGES = ("audit", "load", "check")


@dataclass
class Reported:
    candidate: Candidate
    speedup: float | None  # median over its rescores
    fraction: float | None
    seeds: list[int]


@dataclass
class ProblemRow:
    problem: str
    decided: int = 0
    evaluated: int = 0
    correct: int = 0
    trusted: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    best: Candidate | None = None
    reported: Reported | None = None
    rescore_failed: list[int] = field(default_factory=list)  # best kernels a fresh seed did not confirm
    stop: Stop | None = None
    gpu_s: float = 0.0
    tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    bound_ms: float | None = None
    binding: str | None = None


BEST_NOTE = ("best: the kernel the report names, with its median speedup on fresh seeds; before the re-scoring at "
             "the end, the search's own best, marked unconfirmed")


@dataclass
class Best:
    """The one figure of a problem that the terminal, live.html and the report all show as its best."""

    candidate: Candidate
    speedup: float | None  # the median over its rescores when confirmed, else the search's own measurement
    fraction: float | None
    confirmed: bool  # trusted on every fresh seed (re-scored); False: the search's best, not re-scored yet


def headline_best(row: ProblemRow) -> Best | None:
    """The problem's best: the re-scored one a report names once there is one, else the search's own best
    (marked unconfirmed). Everything that prints a search's best calls this, so they never disagree."""
    if row.reported is not None:
        return Best(row.reported.candidate, row.reported.speedup, row.reported.fraction, True)
    if row.best is not None:
        return Best(row.best, row.best.speedup, row.best.roofline_fraction, False)
    return None


def speedup_text(value: float | None) -> str:
    return f"{value:.3g}x" if value is not None else "-"


def percent_text(value: float | None, digits: int = 2) -> str:
    """A fraction as a percentage with `digits` significant digits, never in exponent notation (a CPU run's
    roofline fraction is around 1e-6)."""
    if value is None:
        return "-"
    pct = 100.0 * value
    if pct == 0 or not math.isfinite(pct):
        return f"{pct:g}%"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(pct))))
    return f"{pct:.{decimals}f}%"


def best_text(best: Best | None) -> str:
    """'6.91x (#12)' for a re-scored best, '9.11x (#5, unconfirmed)' before the re-scoring, '-' for none."""
    if best is None:
        return "-"
    return f"{speedup_text(best.speedup)} (#{best.candidate.id}{'' if best.confirmed else ', unconfirmed'})"


def reported_best(candidates: list[Candidate], rescores: list[Rescore], seeds: int) -> tuple[Reported | None,
                                                                                               list[int]]:
    """Of the candidates whose `seeds` rescores are all trusted, the one with the highest median rescored speedup;
    and the ids of re-scored candidates a fresh seed did not confirm."""
    by_candidate: dict[int, list[Rescore]] = {}
    for r in rescores:
        by_candidate.setdefault(r.candidate, []).append(r)
    failed: list[int] = []
    confirmed: list[Reported] = []
    for c in sorted(trusted(candidates), key=rank_key, reverse=True):
        mine = by_candidate.get(c.id)
        if not mine:
            continue
        if not all(r.trusted for r in mine):
            failed.append(c.id)
        elif len(mine) >= seeds:
            speeds = [r.speedup for r in mine if r.speedup is not None]
            fractions = [r.roofline_fraction for r in mine if r.roofline_fraction is not None]
            confirmed.append(Reported(c, statistics.median(speeds) if speeds else None,
                                      statistics.median(fractions) if fractions else None, [r.seed for r in mine]))
    if not confirmed:
        return None, failed
    top = max(confirmed, key=lambda r: (r.speedup if r.speedup is not None else float("-inf"), -r.candidate.id))
    return top, failed


def problem_rows(archive: Archive, order: list[str], rescore_seeds: int) -> list[ProblemRow]:
    candidates = archive.candidates()
    stops = archive.stops()
    bounds = archive.bounds()
    rescores = archive.rescores()
    rows = []
    for name in order:
        mine = [c for c in candidates if c.problem == name]
        done = [c for c in mine if c.status == EVALUATED]
        row = ProblemRow(name, decided=len(mine), evaluated=len(done), correct=sum(c.correct for c in done),
                         trusted=len(trusted(done)), verdicts=Counter(c.verdict or "?" for c in done),
                         stop=stops.get(name), gpu_s=sum(c.device_s for c in mine), tokens=sum(c.tokens for c in mine),
                         cost_usd=sum(c.cost_usd for c in mine), cost_known=all(c.cost_known for c in mine))
        pool = trusted(done)
        row.best = max(pool, key=rank_key) if pool else None
        row.reported, row.rescore_failed = reported_best(done, [r for r in rescores if r.problem == name],
                                                         rescore_seeds)
        if name in bounds:
            row.bound_ms, row.binding = bounds[name][0], bounds[name][1]
        rows.append(row)
    return rows


def timeline(archive: Archive) -> dict[str, list[dict[str, float | None]]]:
    """Per problem, after each evaluation (in the order they finished): running seconds, cumulative device
    hours of the whole search, and the problem's best trusted speedup and fraction so far."""
    done = [c for c in archive.candidates() if c.status == EVALUATED]
    done.sort(key=lambda c: (c.elapsed_s if c.elapsed_s is not None else float("inf"), c.id))
    device_h = 0.0
    best: dict[str, Candidate] = {}
    out: dict[str, list[dict[str, float | None]]] = {}
    for c in done:
        device_h += c.device_s / 3600.0
        if c.trusted and c.speedup is not None and (c.problem not in best or rank_key(c) > rank_key(best[c.problem])):
            best[c.problem] = c
        top = best.get(c.problem)
        out.setdefault(c.problem, []).append({
            "elapsed_s": c.elapsed_s, "device_hours": device_h, "slot": float(c.id),
            "speedup": top.speedup if top else None, "fraction": top.roofline_fraction if top else None})
    return out


def throughput(archive: Archive, gpus_per_evaluation: int) -> dict[str, Any]:
    """`gpus_per_evaluation`: the devices one evaluation slot holds (SearchConfig.gpus_per_evaluation)."""
    rows = [r for r in archive.rows(("status", "model_s", "stages", "eval_s", "attempts", "gpu_s", "proposer_gpu_s"))
            if r["status"] == EVALUATED]
    evaluated = [r for r in rows if (r["attempts"] or 0) > 0]
    sessions = archive.sessions()
    wall_s = sum(float(s["active_s"] or 0.0) for s in sessions)
    capacity = (sum(float(s["active_s"] or 0.0) * int(s["capacity"] or 1) for s in sessions) / wall_s
                if wall_s > 0 else 1.0)
    per_slot = max(1, gpus_per_evaluation)
    rescores = archive.rescores()
    proposer_s = sum(float(r["proposer_gpu_s"] or 0.0) for r in rows)
    device_s = sum(float(r["gpu_s"] or 0.0) for r in rows) + sum(r.gpu_s for r in rescores) + proposer_s
    # Slot-seconds: every evaluation (and every device call of a proposer's tools) holds one slot of
    # `per_slot` devices for as long as it runs, and at most `capacity` slots are held at once.
    held_s = device_s / per_slot
    stages: dict[str, list[float]] = {k: [] for k in ("model", "build", "launch", "check", "timing", "teardown",
                                                      "queue")}
    for r in rows:
        if r["model_s"] is not None:
            stages["model"].append(float(r["model_s"]))
    for r in evaluated:
        st = json.loads(r["stages"] or "{}")
        stages["build"].append(float(st.get("compile", 0.0)))
        stages["launch"].append(float(st.get("launch", 0.0)))
        stages["check"].append(sum(float(st.get(k, 0.0)) for k in CHECK_STAGES))
        stages["timing"].append(float(st.get("timing", 0.0)))
        stages["teardown"].append(float(st.get("teardown", 0.0)))
        stages["queue"].append(max(0.0, float(r["eval_s"] or 0.0) / max(1, r["attempts"] or 1)
                                   - sum(float(v) for v in st.values())))
    return {
        "wall_s": wall_s, "capacity": capacity, "gpus_per_evaluation": per_slot, "candidates": len(rows),
        "evaluations": len(evaluated) + len(rescores), "rescores": len(rescores),
        "device_s": device_s, "proposer_device_s": proposer_s, "held_s": held_s,
        "busy_fraction": held_s / (capacity * wall_s) if wall_s > 0 else None,
        "candidates_per_device_hour": len(evaluated) / (device_s / 3600.0) if device_s > 0 else None,
        "candidates_per_hour": len(rows) / (wall_s / 3600.0) if wall_s > 0 else None,
        "seconds_per_candidate": {k: (statistics.fmean(v) if v else None) for k, v in stages.items()},
    }
