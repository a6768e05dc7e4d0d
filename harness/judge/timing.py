"""Timing, driven from the harness one iteration per request, and the judgement of what ranks claim.
Judge side.

The reference is timed in its own clean pool, the candidate in its sandbox, with the same plan of requests
(harness.rank.timed does one iteration per request). The plan (`make_plan`) is drawn from the evaluation's
secret before the phase: every call's inputs come from a recipe of their own (a rank draws them anew:
harness.rank.refill), a few calls are precision probes, and a sample of all calls (warm-up, timed,
host-timed, fresh) is judged. Because the harness sends every iteration, it
- times every iteration with its own clock (the span from sending the request to the last reply);
- tells a rank that a call is judged only in the request after it, so a rank cannot know which calls
  count: a candidate that gets a fraction f of its calls wrong is caught unless none of the judged calls
  is among them (`miss_probability`);
- sets the spin that hides the host's enqueue time from the measurement, from the warm-up's claims.

What a rank reports (event times, enqueue times) is a claim. `reconcile` holds the claims against the
harness's clock: a device time longer than the span the harness saw around it is impossible, and
per-iteration time the claims leave unexplained (its 20th percentile: load only ever adds time) beyond
what the reference's identical protocol leaves unexplained means the claimed times are smaller than the
calls were (`timing_inconsistent`). The span is that of the call's own request: drawing the next inputs
and handing over a judged output happen in a request before it. The margin grows with the work
(`unexplained_allowed`: a floor for the protocol's noise, or a share of the claimed and of the reference's
per-call time); tests/exploits/README.md says what hides inside it.
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

import torch

from harness.common.integrity import IntegrityConfig
from harness.common.seeds import TIMED_CALL_OFFSET, TIMING_TRIAL_BASE, fill_recipe
from harness.common.spin import spin_us
from harness.config import TimingConfig
from harness.launch.pool import RankPool
from harness.rank import timed as rank_timed
from harness.records.results import Clock, TimingStats

Ask = Callable[[RankPool, Any, str, float], list[dict[str, Any]]]

# The trial number of the timing phase's i-th call (its inputs' recipes); the rotated sets' first contents
# use TIMING_TRIAL_BASE + k, far below.
CALL_TRIAL_BASE = TIMING_TRIAL_BASE + TIMED_CALL_OFFSET


@dataclass(frozen=True)
class Iteration:
    """One timed call of the plan: what the harness records it as, what the rank is asked to do, and whether
    its output will be judged (the rank is told so only after the call returned)."""

    kind: str  # "warmup", "timed", "host", "fresh_pair", "fresh" or "probe" (judged, never counted)
    request: str  # the rank's kind: "warmup", "timed", "host" or "fresh"
    trial: int  # the trial whose recipes (harness.common.seeds.fill_recipe) draw its inputs
    judged: bool


@dataclass
class Plan:
    iterations: list[Iteration]
    refill: bool = True  # False: the inputs cannot be drawn in a rank; calls rotate the given sets

    @property
    def judged(self) -> list[Iteration]:
        return [it for it in self.iterations if it.judged]

    def without_refill(self) -> Plan:
        """The plan for inputs a rank cannot draw: no probe calls (their contents would need a recipe)."""
        return Plan([it for it in self.iterations if it.kind != "probe"], refill=False)


def recipes_for(seed: int) -> Callable[[Iteration, int], dict[str, Any]]:
    """What each rank is handed to draw its inputs of an iteration (a probe's include the probe's seed)."""
    return lambda it, rank: fill_recipe(seed, it.trial, rank, it.kind == "probe")


def make_plan(config: TimingConfig, n_fresh: int, judged: int, probes: int, rng: random.Random) -> Plan:
    """Warm-up, timed, host-latency and fresh iterations in order, `probes` precision-probe calls inserted at
    random places, and `judged` of the others chosen at random to be judged (every probe is). Which calls are
    judged is drawn here, from the evaluation's secret, and reaches a rank only after the call returned."""
    its: list[tuple[str, str]] = [("warmup", "warmup")] * max(config.warmup, 1) + [("timed", "timed")] * config.iters
    its += [("host", "host")] * config.host_iters + [("fresh_pair", "timed"), ("fresh", "fresh")] * n_fresh
    chosen = set(rng.sample(range(len(its)), min(judged, len(its))))
    marked = [(kind, request, i in chosen) for i, (kind, request) in enumerate(its)]
    for _ in range(probes):
        at = rng.randrange(len(marked) + 1)
        before = marked[at - 1][1] if at > 0 else "warmup"
        marked.insert(at, ("probe", "timed" if before == "fresh" else before, True))
    return Plan([Iteration(kind, request, CALL_TRIAL_BASE + i, judged) for i, (kind, request, judged)
                 in enumerate(marked)])


def miss_probability(calls: int, judged: int, fraction: float) -> float:
    """Probability that none of `judged` calls drawn without replacement from `calls` is among the
    round(fraction * calls) calls a candidate got wrong (hypergeometric); at most (1 - fraction) ** judged."""
    bad = round(fraction * calls)
    if judged > calls - bad:
        return 0.0
    return math.comb(calls - bad, judged) / math.comb(calls, judged)


def sampled(expected: Any, got: Any, limit: int, rng: random.Random) -> tuple[Any, Any]:
    """The two outputs with every pair of strided tensors of the same shape and dtype that holds more than
    `limit` elements cut down to the same `limit` positions, drawn at random by the judge after the call:
    a call that skipped work, or did it at lower precision, is wrong almost everywhere, and a sample of a
    million elements sees that as surely as all of them do, at a fraction of the judge's time. Anything else
    (containers, shapes that differ, sparse tensors) is returned as it is, for the full comparison."""
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        if (expected.layout != torch.strided or got.layout != torch.strided or expected.shape != got.shape
                or expected.dtype != got.dtype or expected.numel() <= limit):
            return expected, got
        gen = torch.Generator().manual_seed(rng.getrandbits(62))
        at = torch.randint(0, expected.numel(), (limit,), generator=gen)
        return expected.reshape(-1)[at], got.reshape(-1)[at]
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(expected) == len(got) \
            and type(expected) is type(got):
        pairs = [sampled(e, g, limit, rng) for e, g in zip(expected, got)]
        return type(expected)(p[0] for p in pairs), type(got)(p[1] for p in pairs)
    if isinstance(expected, dict) and isinstance(got, dict) and list(expected) == list(got):
        pairs_by_key = {k: sampled(expected[k], got[k], limit, rng) for k in expected}
        return {k: v[0] for k, v in pairs_by_key.items()}, {k: v[1] for k, v in pairs_by_key.items()}
    return expected, got


@dataclass
class Kept:
    """A timed call whose output the harness judges: its plan entry, the input set it used, the files."""

    iteration: Iteration
    set_index: int
    paths: dict[int, Path]
    intact: dict[int, bool] = field(default_factory=dict)  # rank -> its inputs were as drawn after the call (a claim)


@dataclass
class TimingRun:
    times: dict[str, list[list[float]]] = field(default_factory=dict)  # kind -> iteration -> rank -> ms
    spans: dict[str, list[float]] = field(default_factory=dict)  # kind -> iteration -> harness span, ms
    refill: list[float] = field(default_factory=list)  # per iteration: the slowest rank's refill, ms
    refilled: dict[str, list[str]] = field(default_factory=dict)  # kind -> iteration -> how its inputs were made
    spin_us: float = 0.0
    kept: list[Kept] = field(default_factory=list)
    fingerprints: dict[int, list[list[int]]] = field(default_factory=dict)  # rank -> set -> fingerprint
    input_sets: int = 0

    def add(self, kind: str, replies: list[dict[str, Any]], span_s: float, refilled: str = "i") -> None:
        """One iteration's claims and span; `refilled` as `refilled_as` found it (drive always says)."""
        self.times.setdefault(kind, []).append([float(r.get("ms", float("nan"))) for r in replies])
        self.spans.setdefault(kind, []).append(span_s * 1e3)
        self.refilled.setdefault(kind, []).append(refilled)

    def counted(self, kind: str) -> list[tuple[list[float], float]]:
        """(per-rank claimed times, harness span) of the iterations of `kind` that may be counted: every one
        whose inputs were made as the plan asked; never one a rank did not say it refilled ("-")."""
        return [(ms, span) for ms, span, how in zip(self.times.get(kind, []), self.spans.get(kind, []),
                                                     self.refilled.get(kind, [])) if how != NOT_REFILLED]


NOT_REFILLED = "-"


def refilled_as(plan: Plan, request: str, prepared: list[dict[str, Any]]) -> str:
    """How one iteration's inputs were made, agreed by every rank (harness.rank.timed.REFILLED), or "-": a
    plan that refills sent every rank a recipe, so only a fresh draw ("f" for a never-seen call) or the recipe's
    contents ("i", "d") count; a plan that does not refill rotates its sets ("r"). Anything else, or ranks
    that disagree, fails closed: that iteration's inputs may be the ones an earlier call saw."""
    allowed = ({rank_timed.FRESH} if request == "fresh" else {rank_timed.IN_PLACE, rank_timed.DRAWN}) if plan.refill \
        else {rank_timed.ROTATED}
    said = {r.get("refilled") for r in prepared}
    if len(said) != 1:
        return NOT_REFILLED
    how = next(iter(said))
    return how if isinstance(how, str) and how in allowed and how in rank_timed.REFILLED else NOT_REFILLED


def not_refilled(refilled: dict[str, str] | None) -> dict[str, list[int]]:
    """Per kind, the iterations (in plan order within the kind) whose inputs were not made as the plan asked."""
    return {kind: [i for i, how in enumerate(marks) if how == NOT_REFILLED]
            for kind, marks in (refilled or {}).items() if NOT_REFILLED in marks}


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
    return spin_us(enqueue, config.min_spin_us, config.max_spin_us)


def drive(pool: RankPool, ask: Ask, plan: Plan, *, n_sets: int, recipes: Callable[[Iteration, int], dict[str, Any]],
          config: TimingConfig, cuda: bool, keep_dir: Path, call_timeout: float, deadline: float,
          on_kept: Callable[[Kept], None], check_inputs: bool = True) -> TimingRun:
    """Every iteration of `plan` on a pool whose ranks have done time_begin: a request that prepares the call
    (it carries the recipe of the call's inputs on that rank, `recipes(iteration, rank)`, none where the plan
    does not refill, and for the previous call if it is judged, where to write its output copy and whether to
    say if its inputs are still as drawn), then the call's own request, the one the harness's clock times.
    `on_kept` gets each judged call once its files are written. The reference and the candidate go through
    the same requests. `ask(pool, message, phase, timeout)` sends one
    request and raises on failure (the caller's error handling)."""
    run = TimingRun(input_sets=n_sets)
    world = pool.world_size
    pending: Kept | None = None  # the call just made, if judged: the next request hands its output over
    rotation = 0

    def request(it: Iteration) -> list[dict[str, Any]]:
        nonlocal pending, rotation
        index = len(run.times.get("fresh", []))  # without refill each fresh set is used once, in order
        if it.request != "fresh":
            index, rotation = rotation % n_sets, rotation + 1
        handed = pending
        timeout = max(0.5, min(call_timeout, deadline - time.monotonic()))
        prepare = {rank: {"op": "time_prepare", "kind": it.request, "set": index,
                          "fill": recipes(it, rank) if plan.refill else None,
                          "keep_previous": str(handed.paths[rank]) if handed is not None else None,
                          "check_previous": check_inputs and handed is not None} for rank in range(world)}
        prepared = ask(pool, prepare, "timing", timeout)
        run.refill.append(max(float(r.get("refill_ms", float("nan"))) for r in prepared))
        if handed is not None:
            handed.intact = {r["rank"]: r.get("kept_intact") is True for r in prepared}
            run.kept.append(handed)
            on_kept(handed)
        call = {"op": "time_call", "kind": it.request, "set": index, "spin_us": run.spin_us}
        replies = ask(pool, call, "timing", max(0.5, min(call_timeout, deadline - time.monotonic())))
        run.add(it.kind, replies, pool.last_span_s, refilled_as(plan, it.request, prepared))
        pending = None
        if it.judged:
            pending = Kept(it, index, {r: keep_dir / f"kept-{it.trial}-r{r}.bin" for r in range(world)})
        return replies

    warm: list[list[dict[str, Any]]] = []
    for it in plan.iterations:
        if cuda and warm and not run.spin_us and it.kind not in ("warmup", "probe"):
            run.spin_us = spin_for(warm, config)  # from the warm-up's claims, before the first counted call
        replies = request(it)
        if it.kind == "warmup":
            warm.append(replies)
    end = {r: {"op": "time_end", "keep_previous": str(pending.paths[r]) if pending is not None else None,
               "check_previous": check_inputs and pending is not None} for r in range(world)}
    replies = ask(pool, end, "timing", max(0.5, min(call_timeout, deadline - time.monotonic())))
    if pending is not None:
        pending.intact = {r["rank"]: r.get("kept_intact") is True for r in replies}
        run.kept.append(pending)
        on_kept(pending)
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


def _unexplained(run: TimingRun) -> list[float]:
    """Per counted iteration (timed, fresh-pair and host-latency ones, which the reference's plan has too):
    the harness's span around the call's request minus the slowest rank's claimed time (and the device spin,
    where there was one)."""
    spin_ms = run.spin_us / 1e3
    every = []
    for kind, spin in (("timed", spin_ms), ("fresh_pair", spin_ms), ("host", 0.0)):
        every += [span - max(ranks) - spin for ranks, span in run.counted(kind)]
    return every


def fresh_pairs(run: TimingRun) -> list[tuple[float, float]]:
    """(rotated call, the never-seen call after it): the slowest rank's claimed time of each, in plan order;
    a pair either of whose calls was not refilled is left out."""
    marks = zip(run.refilled.get("fresh_pair", []), run.refilled.get("fresh", []))
    return [(max(r), max(f)) for r, f, (a, b) in zip(run.times.get("fresh_pair", []), run.times.get("fresh", []), marks)
            if NOT_REFILLED not in (a, b)]


def stats(run: TimingRun, clock: Clock) -> TimingStats:
    """Per iteration the slowest rank's claimed time; quantiles; the harness's own spans beside them. Probe
    calls and warm-up are judged but never counted."""
    # Only iterations whose inputs were made as the plan asked are counted; where none were, every one is
    # kept so the stats exist, and reconcile() (the `refilled` record) makes the candidate not fast.
    counted = run.counted("timed") or list(zip(run.times.get("timed", []), run.spans.get("timed", [])))
    timed = [ranks for ranks, _ in counted]
    per_iter = [max(ranks) for ranks in timed]
    per_rank = list(zip(*timed)) if timed else []
    rank_medians = [statistics.median(t) for t in per_rank]
    mean = statistics.fmean(per_iter)
    qs = statistics.quantiles(per_iter, n=10, method="inclusive") if len(per_iter) > 1 else per_iter * 9
    spans = [span for _, span in counted]
    unexplained = _unexplained(run)
    host = [max(r) for r, _ in run.counted("host")]
    fresh = [max(r) for r, _ in run.counted("fresh")]
    pairs = [max(r) for r, _ in run.counted("fresh_pair")]
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
        host_span_median_ms=_median([span for _, span in run.counted("host")]),
        judged_outputs=len(run.kept),
        refill_median_ms=_median(run.refill),
        refilled={kind: "".join(marks) for kind, marks in run.refilled.items()},
    )


def unexplained_allowed(candidate: TimingStats, reference: TimingStats, checks: IntegrityConfig) -> float:
    """How much more per-iteration time than the reference's the candidate's claims may leave unexplained:
    the protocol's noise floor, or a share of what a call costs (the candidate's claimed median, the
    reference's measured one), whichever is larger: a margin that grows with the work, not a fixed one."""
    return max(checks.unexplained_margin_ms, checks.unexplained_ratio * candidate.median_ms,
               checks.unexplained_work_ratio * reference.median_ms)


def reconcile(candidate: TimingStats, reference: TimingStats, checks: IntegrityConfig) -> list[str]:
    """Why the candidate's claimed times cannot be squared with the harness's clock (empty: they can)."""
    problems = []
    missed = not_refilled(candidate.refilled)
    if missed:
        where = "; ".join(f"{kind} {', '.join(map(str, at))}" for kind, at in missed.items())
        problems.append(f"{sum(map(len, missed.values()))} timing iteration(s) ran on inputs that were not refilled "
                        f"from their recipes ({where}): none of them is counted, and times that may include "
                        f"remembered answers are not compared")
    if candidate.span_median_ms is not None and candidate.median_ms > candidate.span_median_ms + 0.05:
        problems.append(f"the claimed median {candidate.median_ms:.4g} ms is longer than the "
                        f"{candidate.span_median_ms:.4g} ms the harness observed around each call")
    if candidate.unexplained_low_ms is not None and reference.unexplained_low_ms is not None:
        excess = candidate.unexplained_low_ms - reference.unexplained_low_ms
        allowed = unexplained_allowed(candidate, reference, checks)
        if excess > allowed:
            problems.append(f"each timed iteration took {candidate.unexplained_low_ms:.4g} ms more than the claimed "
                            f"call time and spin (the reference's identical protocol: "
                            f"{reference.unexplained_low_ms:.4g} ms; allowed {allowed:.4g} ms more): the claimed "
                            f"{candidate.median_ms:.4g} ms per call is smaller than what the harness's clock saw")
    return problems
