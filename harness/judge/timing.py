"""Timing, driven from the harness one iteration per request, and the judgement of what ranks claim.
Judge side.

The reference is timed in its own clean pool, the candidate in its sandbox, with the same requests
(harness.rank.timed does one iteration per request). Because the harness sends every iteration, it
- times every iteration with its own clock (the span from sending the request to the last reply);
- decides only after a timed call has returned whether its output is kept and judged (the next request
  says so), so a candidate cannot know which timed calls count, and doing less work while timed fails;
- sets the spin that hides the host's enqueue time from the measurement, from the warm-up's claims.

What a rank reports (event times, enqueue times) is a claim. `reconcile` holds the claims against the
harness's clock: a device time longer than the span the harness saw around it is impossible, and
per-iteration time the claims leave unexplained (its 20th percentile: load only ever adds time) far
beyond what the reference's identical protocol leaves unexplained means the claimed times are smaller
than the calls were (`timing_inconsistent`).
This catches a forged clock or a rewritten result, not a small shave: a margin (2 ms on CPU, 0.1 ms on
GPU, or the claimed median itself) absorbs the noise of the protocol, and tests/exploits/README.md says
what hides inside it.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import TimingConfig
from harness.integrity import IntegrityConfig
from harness.pool import RankPool
from harness.results import Clock, TimingStats

Ask = Callable[[RankPool, Any, str, float], list[dict[str, Any]]]


@dataclass
class Kept:
    """A timed call whose output the harness chose to judge, after it had returned."""

    kind: str
    set_index: int
    paths: dict[int, Path]


@dataclass
class TimingRun:
    times: dict[str, list[list[float]]] = field(default_factory=dict)  # kind -> iteration -> rank -> ms
    spans: dict[str, list[float]] = field(default_factory=dict)  # kind -> iteration -> harness span, ms
    spin_us: float = 0.0
    kept: list[Kept] = field(default_factory=list)
    fingerprints: dict[int, list[list[int]]] = field(default_factory=dict)  # rank -> set -> fingerprint
    input_sets: int = 0

    def add(self, kind: str, replies: list[dict[str, Any]], span_s: float) -> None:
        self.times.setdefault(kind, []).append([float(r.get("ms", float("nan"))) for r in replies])
        self.spans.setdefault(kind, []).append(span_s * 1e3)


def spin_for(warmup: list[list[dict[str, Any]]], config: TimingConfig) -> float:
    """The device spin (µs) that outlasts the host's enqueue of barrier, start event and call, with a
    generous margin: it costs nothing timed. From the warm-up's replies (claims, bounded by the config)."""
    per_iter = []
    for replies in warmup[1:] or warmup:  # the first call may compile or allocate
        per_iter.append(max(float(r.get("enqueue_us", 0.0)) + float(r.get("barrier_enqueue_us", 0.0))
                            for r in replies))
    enqueue = statistics.median(per_iter) if per_iter else 0.0
    if not math.isfinite(enqueue):
        enqueue = config.max_spin_us
    return min(config.max_spin_us, max(config.min_spin_us, 4.0 * enqueue + 30.0))


def drive(pool: RankPool, ask: Ask, *, n_sets: int, n_fresh: int, config: TimingConfig, cuda: bool,
          keep_dir: Path | None, keep_probability: float, rng: random.Random, call_timeout: float,
          deadline: float) -> TimingRun:
    """Warm-up, timed, host-latency and fresh iterations, one request each, on a pool whose ranks have
    done time_begin. `keep_dir` None: nothing is kept (the reference). `ask(pool, message, phase, timeout)`
    sends one request and raises on failure (the caller's error handling)."""
    run = TimingRun(input_sets=n_sets)
    world = pool.world_size
    pending: Kept | None = None  # the call just made, if chosen to be kept: the next request says so
    seq = 0

    def request(kind: str, index: int, choose: bool) -> list[dict[str, Any]]:
        nonlocal pending, seq
        per_rank = {}
        keep_paths = pending.paths if pending is not None else {}
        for rank in range(world):
            per_rank[rank] = {"op": "time_call", "kind": kind, "set": index, "spin_us": run.spin_us,
                              "keep_previous": str(keep_paths[rank]) if rank in keep_paths else None}
        if pending is not None:
            run.kept.append(pending)
            pending = None
        remaining = deadline - time.monotonic()
        replies = ask(pool, per_rank, "timing", max(0.5, min(call_timeout, remaining)))
        if choose and keep_dir is not None and rng.random() < keep_probability:
            seq += 1
            pending = Kept(kind, index, {r: keep_dir / f"kept-{seq}-r{r}.bin" for r in range(world)})
        return replies

    warm = []
    for i in range(max(config.warmup, 1)):
        replies = request("warmup", i % n_sets, False)
        warm.append(replies)
    if cuda:
        run.spin_us = spin_for(warm, config)
    for i in range(config.iters):
        replies = request("timed", i % n_sets, True)
        run.add("timed", replies, pool.last_span_s)
    for i in range(config.host_iters):
        replies = request("host", i % n_sets, False)
        run.add("host", replies, pool.last_span_s)
    # Each fresh set is used exactly once, after the candidate has seen every rotated set many times,
    # alternating with rotated sets so each fresh time has a neighbour measured under the same load.
    for j in range(n_fresh):
        replies = request("timed", j % n_sets, False)
        run.add("fresh_pair", replies, pool.last_span_s)
        pending_before = pending
        replies = request("fresh", j, False)
        run.add("fresh", replies, pool.last_span_s)
        if keep_dir is not None and pending_before is None:  # every fresh call's output is judged
            seq += 1
            pending = Kept("fresh", j, {r: keep_dir / f"kept-{seq}-r{r}.bin" for r in range(world)})
    end = {r: {"op": "time_end", "keep_previous": str(pending.paths[r]) if pending is not None else None}
           for r in range(world)}
    if pending is not None:
        run.kept.append(pending)
    replies = ask(pool, end, "timing", max(0.5, min(call_timeout, deadline - time.monotonic())))
    run.fingerprints = {r["rank"]: r.get("fingerprints", []) for r in replies}
    return run


def _median(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _low(values: list[float]) -> float | None:
    """The 20th percentile: load on the machine only ever adds time, so a low quantile is what the
    protocol itself costs, while claims shrunk on every iteration shift all of them."""
    finite = sorted(v for v in values if math.isfinite(v))
    return finite[int(0.2 * (len(finite) - 1))] if finite else None


def stats(run: TimingRun, clock: Clock) -> TimingStats:
    """Per iteration the slowest rank's claimed time; quantiles; the harness's own spans beside them."""
    timed = run.times.get("timed", [])
    per_iter = [max(ranks) for ranks in timed]
    per_rank = list(zip(*timed)) if timed else []
    rank_medians = [statistics.median(t) for t in per_rank]
    mean = statistics.fmean(per_iter)
    qs = statistics.quantiles(per_iter, n=10, method="inclusive") if len(per_iter) > 1 else per_iter * 9
    spans = run.spans.get("timed", [])
    spin_ms = run.spin_us / 1e3
    unexplained = [s - c - spin_ms for s, c in zip(spans, per_iter)]
    host = [max(r) for r in run.times.get("host", [])]
    fresh = [max(r) for r in run.times.get("fresh", [])]
    pairs = [max(r) for r in run.times.get("fresh_pair", [])]
    return TimingStats(
        median_ms=statistics.median(per_iter),
        p10_ms=qs[0],
        p90_ms=qs[-1],
        mean_ms=mean,
        cv=(statistics.stdev(per_iter) / mean) if len(per_iter) > 1 and mean > 0 else 0.0,
        iterations=len(per_iter),
        host_median_ms=statistics.median(host) if host else float("nan"),
        input_sets=run.input_sets,
        spin_us=run.spin_us,
        slowest_rank=max(range(len(rank_medians)), key=rank_medians.__getitem__) if rank_medians else 0,
        rank_medians_ms=rank_medians,
        clock=clock,
        fresh_median_ms=statistics.median(fresh) if fresh else None,
        fresh_iterations=len(fresh),
        fresh_pair_median_ms=statistics.median(pairs) if pairs else None,
        span_median_ms=_median(spans),
        unexplained_low_ms=_low(unexplained),
        host_span_median_ms=_median(run.spans.get("host", [])),
        judged_outputs=len(run.kept),
    )


def reconcile(candidate: TimingStats, reference: TimingStats, checks: IntegrityConfig) -> list[str]:
    """Why the candidate's claimed times cannot be squared with the harness's clock (empty: they can)."""
    problems = []
    if candidate.span_median_ms is not None and candidate.median_ms > candidate.span_median_ms + 0.05:
        problems.append(f"the claimed median {candidate.median_ms:.4g} ms is longer than the "
                        f"{candidate.span_median_ms:.4g} ms the harness observed around each call")
    if candidate.unexplained_low_ms is not None and reference.unexplained_low_ms is not None:
        excess = candidate.unexplained_low_ms - reference.unexplained_low_ms
        allowed = max(checks.unexplained_margin_ms, checks.unexplained_ratio * candidate.median_ms)
        if excess > allowed:
            problems.append(f"each timed iteration took {candidate.unexplained_low_ms:.4g} ms more than the claimed "
                            f"call time and spin (the reference's identical protocol: "
                            f"{reference.unexplained_low_ms:.4g} ms): the claimed {candidate.median_ms:.4g} ms "
                            f"per call is smaller than what the harness's clock saw")
    return problems
