"""What a search has found so far, read from its archive: per problem, over time, and how busy the devices were.

Used by the live view, the end-of-search table and the report, so all three say the same thing.

- The best of a problem (`ProblemRow.best`) is its best trusted candidate by the search's own evaluation
  (its "in-search" figure: one bench, and the best of many draws). What is *reported*
  (`ProblemRow.reported`) is, of the candidates trusted on every round of their re-measurement
  (agent.remeasure: fresh seeds, a fresh bench, the held-out shapes), the one with the best re-measured
  median, with that median and its interval: a kernel that a fresh round shows wrong or flagged is never
  reported, and one that was only timed at a lucky moment loses to one that is fast on the fresh rounds too.
  `figures_line` says both figures of a problem on one line (the end of `pkb search`, `pkb rescore`).
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

from agent.remeasure import NOT_MEASURED, Remeasurement
from agent.search.archive import EVALUATED, Archive, Candidate, Rescore, Stop
from agent.search.scoring import round_of
from agent.search.strategies import rank_key, trusted

CHECK_STAGES = ("audit", "load", "check")


@dataclass
class Reported:
    candidate: Candidate
    speedup: float | None  # its re-measured median (None: not measured, agent.remeasure)
    fraction: float | None
    seeds: list[int]
    remeasured: Remeasurement | None = None


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
    remeasured: dict[int, Remeasurement] = field(default_factory=dict)  # every re-measured kernel, by id
    stop: Stop | None = None
    gpu_s: float = 0.0
    tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    bound_ms: float | None = None
    binding: str | None = None


BEST_NOTE = ("best: the kernel the report names, with its median speedup re-measured on fresh seeds (held-out shapes "
             "checked); before the re-measurement at the end, the search's own best, marked unconfirmed; in-search: "
             "that kernel's figure from the search's one bench")


@dataclass
class Best:
    """The one figure of a problem that the terminal, live.html and the report all show as its best."""

    candidate: Candidate
    speedup: float | None  # the median over its rescores when confirmed, else the search's own measurement
    fraction: float | None
    confirmed: bool  # trusted on every fresh seed (re-scored); False: the search's best, not re-scored yet
    remeasured: Remeasurement | None = None  # its re-measurement, when confirmed

    @property
    def in_search(self) -> float | None:
        """The kernel's figure from the search's own bench."""
        return self.candidate.speedup


def headline_best(row: ProblemRow) -> Best | None:
    """The problem's best: the re-scored one a report names once there is one, else the search's own best
    (marked unconfirmed). Everything that prints a search's best calls this, so they never disagree."""
    if row.reported is not None:
        return Best(row.reported.candidate, row.reported.speedup, row.reported.fraction, True,
                    row.reported.remeasured)
    if row.best is not None:
        return Best(row.best, row.best.speedup, row.best.roofline_fraction, False)
    return None


def speedup_text(value: float | None) -> str:
    return f"{value:.3g}x" if value is not None else "-"


def interval_text(best: Best | None) -> str:
    """The re-measured interval of a confirmed best, e.g. '1.30-1.55x (75%, k=3)'; '-' for none."""
    measured = best.remeasured if best is not None else None
    interval = measured.interval if measured is not None else None
    if interval is None:
        return NOT_MEASURED if measured is not None and measured.rounds else "-"
    return f"{interval.low:.3g}-{interval.high:.3g}x ({interval.confidence:.0%}, k={interval.n})"


def figures_line(row: ProblemRow) -> str:
    """A problem's reported kernel with its in-search figure and its re-measured one with the interval; where
    the in-search best is another kernel, what its re-measurement said (the draw that was lucky)."""
    best = row.best
    if row.reported is not None:
        c, measured = row.reported.candidate, row.reported.remeasured
        line = (f"{row.problem}: #{c.id} in-search {speedup_text(c.speedup)}; re-measured "
                f"{measured.text() if measured else '-'}")
        if best is not None and best.id != c.id:
            other = row.remeasured.get(best.id)
            line += (f" (the in-search best #{best.id}, {speedup_text(best.speedup)}, re-measured "
                     f"{other.text() if other else '-'})")
        return line
    if best is None:
        return f"{row.problem}: no trusted kernel"
    measured = row.remeasured.get(best.id)
    return (f"{row.problem}: #{best.id} in-search {speedup_text(best.speedup)}; re-measured "
            f"{measured.text() if measured else 'not yet (the re-measurement runs when the search ends)'}")


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


def remeasurements(rescores: list[Rescore], k: int, device: str | None = None) -> dict[int, Remeasurement]:
    """Each re-measured candidate's rounds (agent.remeasure), from the archive's rows."""
    out: dict[int, Remeasurement] = {}
    for r in rescores:
        out.setdefault(r.candidate, Remeasurement(k=k)).rounds.append(round_of(r, device or ""))
    return out


def reported_best(candidates: list[Candidate], rescores: list[Rescore], seeds: int,
                  device: str | None = None) -> tuple[Reported | None, list[int]]:
    """Of the candidates trusted on all `seeds` rounds of their re-measurement, the one with the highest
    re-measured median speedup (never the highest in-search figure: that is the luckiest draw); and the ids of
    re-measured candidates a fresh round did not confirm."""
    measured = remeasurements(rescores, seeds, device)
    fractions: dict[int, list[float]] = {}
    for r in rescores:
        if r.roofline_fraction is not None:
            fractions.setdefault(r.candidate, []).append(r.roofline_fraction)
    failed: list[int] = []
    confirmed: list[Reported] = []
    for c in sorted(trusted(candidates), key=rank_key, reverse=True):
        mine = measured.get(c.id)
        if mine is None or not mine.rounds:
            continue
        if not all(r.trusted for r in mine.rounds):
            failed.append(c.id)
        elif mine.confirmed:
            interval = mine.interval
            found = fractions.get(c.id)
            confirmed.append(Reported(c, interval.median if interval else None,
                                      statistics.median(found) if found else None, mine.seeds, mine))
    if not confirmed:
        return None, failed
    top = max(confirmed, key=lambda r: (r.speedup if r.speedup is not None else float("-inf"), -r.candidate.id))
    return top, failed


def problem_rows(archive: Archive, order: list[str], remeasure: int, device: str | None = None) -> list[ProblemRow]:
    """`remeasure`: the rounds a re-measurement needs (SearchConfig.remeasure); `device`: the search's, to read
    the rows of an archive older than rounds."""
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
        mine_rescores = [r for r in rescores if r.problem == name]
        row.reported, row.rescore_failed = reported_best(done, mine_rescores, remeasure, device)
        row.remeasured = remeasurements(mine_rescores, remeasure, device)
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
