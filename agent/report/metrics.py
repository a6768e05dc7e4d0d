"""Metrics over finished samples: pass@k, fast_p@k, intervals, speedups, failures, usage. Pure: no I/O.
(The report's, and the run summary's: agent.cli.run counts what is fast by the same rule.)

A sample record is a mapping shaped like docs/run-layout.md's sample.json. Only finished samples
(`"status": "finished"`) count, and an `infra_error` verdict (the harness's failure, not the model's) is
left out of n. Per problem with n samples of which c are correct:

    pass@k   = 1 - C(n-c, k) / C(n, k)        (the unbiased estimator; needs n >= k)
    fast_p@k = the same with f = samples that are correct AND have a measured speedup > p that counts

A speedup counts unless the sample is flagged not fast-eligible (`fast_eligible: false` in the record,
or, in a record without that field, a flag of harness.common.flags.SPEEDUP_DISQUALIFIERS such as
uses_torch_collectives or
impossible), or comes from an emulated evaluation (`emulated: true`: ranks shared a GPU, so its timing
says nothing about the interconnect): such a sample is correct, and never fast. Speedup statistics use
counted speedups only.

Over problems a metric is the plain mean, with a percentile-bootstrap 95% interval that resamples
problems (explicit seed). Two conditions are compared per problem on the problems both have: the mean
of the per-problem differences, with a paired bootstrap interval.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.common import failures
from harness.common.flags import EMULATED, SPEEDUP_DISQUALIFIERS, fast_eligible, is_emulated

NO_CODE = "no_code"
# Failure-class labels in PKB's taxonomy, in the order reports show them; no_code is ours (no candidate).
FAILURE_LABELS: dict[str, str] = {**failures.PKB_LABELS, NO_CODE: "no code"}
FAILURE_ORDER: tuple[str, ...] = (*failures.VERDICTS, NO_CODE)

DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.95
FAST_P_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(61))  # 0.00, 0.05, ..., 3.00

SampleRecord = Mapping[str, Any]


# -- estimators -------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct.

    1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1..n} (1 - k/i) so no factorial overflows.
    Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (the unbiased estimator), got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def fast_p_at_k(n: int, f: int, k: int) -> float:
    """fast_p@k: pass@k where f counts the samples that are correct and have speedup > p."""
    return pass_at_k(n, f, k)


# -- per problem ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProblemScore:
    """One condition's finished samples on one problem."""

    problem: str
    category: str
    condition: str
    n: int
    correct: int
    speedups: tuple[float, ...]  # counted speedups (see counted_speedup) of correct samples, in sample order
    roofline_fractions: tuple[float, ...]  # of correct samples that have one
    verdicts: tuple[str, ...]  # every sample's verdict, in sample order
    not_counted: int = 0  # correct, timed samples whose speedup does not count (not fast-eligible)

    def pass_at(self, k: int) -> float:
        return pass_at_k(self.n, self.correct, k)

    def fast_count(self, p: float) -> int:
        """Samples that are correct with a counted speedup above p (is_fast; an untimed sample is never
        fast)."""
        return sum(1 for s in self.speedups if s > p)

    def fast_at(self, p: float, k: int) -> float:
        return fast_p_at_k(self.n, self.fast_count(p), k)


def counted_speedup(record: SampleRecord) -> float | None:
    """The sample's speedup if it may count toward fast_p and speedup statistics: correct, timed,
    fast-eligible and measured on real devices (not emulated). None otherwise."""
    speedup = record.get("speedup")
    if not record.get("correct") or speedup is None or is_emulated(record):
        return None
    eligible = record.get("fast_eligible")
    if eligible is None:  # a record written before the field existed: judge by its flags
        eligible = fast_eligible(list(record.get("flags") or []))
    return float(speedup) if eligible else None


def is_fast(record: SampleRecord, p: float) -> bool:
    """Correct, with a speedup above p that counts: a correct sample flagged uses_torch_collectives, impossible,
    input_caching, ... is never fast, whatever it measured."""
    speedup = counted_speedup(record)
    return speedup is not None and speedup > p


def finished(records: Iterable[SampleRecord]) -> list[SampleRecord]:
    return [r for r in records if r.get("status", "finished") == "finished"]


def scored(records: Iterable[SampleRecord]) -> list[SampleRecord]:
    """Finished samples that count: an infra_error is the harness's failure, never charged to the model."""
    return [r for r in finished(records) if r.get("verdict") != failures.INFRA_ERROR]


def uncounted_speedups(records: Iterable[SampleRecord]) -> dict[str, Any]:
    """Correct, timed, finished samples whose speedup does not count (an integrity flag: uses_torch_collectives,
    ...), with how often each disqualifying flag was raised. Without this a correct arm's empty fast_p reads as slow."""
    flags: Counter[str] = Counter()
    n = 0
    for r in finished(records):
        if r.get("correct") and r.get("speedup") is not None and counted_speedup(r) is None:
            n += 1
            reasons = {f for f in r.get("flags") or [] if f in SPEEDUP_DISQUALIFIERS}
            flags.update(reasons | ({EMULATED} if is_emulated(r) else set()))
    return {"samples": n, "flags": dict(sorted(flags.items()))}


def score_problems(records: Iterable[SampleRecord]) -> dict[str, list[ProblemScore]]:
    """Scored samples grouped as {condition: [ProblemScore, ...]} (problems sorted by name)."""
    groups: dict[tuple[str, str], list[SampleRecord]] = {}
    for r in scored(records):
        groups.setdefault((str(r["condition"]), str(r["problem"])), []).append(r)
    out: dict[str, list[ProblemScore]] = {}
    for (condition, problem), rows in sorted(groups.items()):
        rows = sorted(rows, key=lambda r: int(r.get("sample", 0)))
        ok = [r for r in rows if r.get("correct")]
        out.setdefault(condition, []).append(ProblemScore(
            problem=problem,
            category=str(rows[0].get("category", "other")),
            condition=condition,
            n=len(rows),
            correct=len(ok),
            speedups=tuple(s for s in map(counted_speedup, ok) if s is not None),
            roofline_fractions=tuple(float(r["roofline_fraction"]) for r in ok
                                     if r.get("roofline_fraction") is not None),
            verdicts=tuple(str(r.get("verdict", NO_CODE)) for r in rows),
            not_counted=sum(1 for r in ok if r.get("speedup") is not None and counted_speedup(r) is None),
        ))
    return out


def score_asked(records: Iterable[SampleRecord], condition: str, asked: Mapping[str, int], categories:
                Mapping[str, str], k: int) -> list[ProblemScore]:
    """One condition's scores over every asked problem ({problem: samples asked}), counting what was not judged
    (an infra_error, a sample unfinished or never started) as a sample that is not solved: the lower bound of
    what the arm would score once everything is judged. n is at least k, so pass@k is defined for every problem."""
    rows_by: dict[str, list[SampleRecord]] = {}
    for r in records:
        if str(r.get("condition")) == condition:
            rows_by.setdefault(str(r.get("problem")), []).append(r)
    out = []
    for problem, wanted in asked.items():
        rows = sorted(rows_by.get(problem, []), key=lambda r: int(r.get("sample", 0)))
        ok = [r for r in scored(rows) if r.get("correct")]
        n = max(wanted, len(rows), k)
        verdicts = [str(r.get("verdict", NO_CODE)) if r.get("status", "finished") == "finished" else "unfinished"
                    for r in rows]
        out.append(ProblemScore(
            problem=problem, category=str(categories.get(problem, "other")), condition=condition, n=n,
            correct=len(ok), speedups=tuple(s for s in map(counted_speedup, ok) if s is not None),
            roofline_fractions=tuple(float(r["roofline_fraction"]) for r in ok
                                     if r.get("roofline_fraction") is not None),
            verdicts=tuple(verdicts + ["not_started"] * (n - len(rows))),
            not_counted=sum(1 for r in ok if r.get("speedup") is not None and counted_speedup(r) is None),
        ))
    return out


def eligible(scores: Sequence[ProblemScore], k: int) -> tuple[list[ProblemScore], list[str]]:
    """The problems with at least k finished samples, and the names of those left out."""
    keep = [s for s in scores if s.n >= k]
    return keep, [s.problem for s in scores if s.n < k]


# -- over problems ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """A mean over problems with its bootstrap interval; n is the number of problems."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def bootstrap_mean(values: Sequence[float], *, seed: int, resamples: int = DEFAULT_RESAMPLES,
                   level: float = DEFAULT_LEVEL) -> Interval:
    """The mean of `values` with a percentile-bootstrap interval (resampling the values with replacement)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, mean, mean, 1)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(mean, float(low), float(high), int(x.size))


Metric = Callable[[ProblemScore], float]


def pass_metric(k: int) -> Metric:
    return lambda s: s.pass_at(k)


def fast_metric(p: float, k: int) -> Metric:
    return lambda s: s.fast_at(p, k)


def mean_over_problems(scores: Sequence[ProblemScore], metric: Metric, *, seed: int,
                       resamples: int = DEFAULT_RESAMPLES) -> Interval:
    return bootstrap_mean([metric(s) for s in scores], seed=seed, resamples=resamples)


def per_category(scores: Sequence[ProblemScore], metric: Metric, *, seed: int,
                 resamples: int = DEFAULT_RESAMPLES) -> dict[str, Interval]:
    """The metric's mean and interval within each category (categories sorted by name)."""
    by_cat: dict[str, list[ProblemScore]] = {}
    for s in scores:
        by_cat.setdefault(s.category, []).append(s)
    return {cat: mean_over_problems(rows, metric, seed=seed, resamples=resamples)
            for cat, rows in sorted(by_cat.items())}


def fast_p_curve(scores: Sequence[ProblemScore], k: int,
                 ps: Sequence[float] = FAST_P_GRID) -> list[tuple[float, float]]:
    """(p, mean fast_p@k over problems) for each p; p = 0 counts every correct, timed sample."""
    if not scores:
        return [(float(p), math.nan) for p in ps]
    return [(float(p), float(np.mean([s.fast_at(p, k) for s in scores]))) for p in ps]


# -- speedups, roofline, failures, usage ------------------------------------------------------------
def geomean_speedup(scores: Sequence[ProblemScore]) -> float | None:
    """Geometric mean of the counted speedups (correct, timed, fast-eligible samples); None for none."""
    values = [v for s in scores for v in s.speedups if v > 0]
    if not values:
        return None
    return float(math.exp(sum(math.log(v) for v in values) / len(values)))


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    median: float
    p10: float
    p90: float
    minimum: float
    maximum: float

    def as_dict(self) -> dict[str, float | int]:
        return {"count": self.count, "mean": self.mean, "median": self.median, "p10": self.p10,
                "p90": self.p90, "min": self.minimum, "max": self.maximum}


def summarize(values: Sequence[float]) -> Distribution | None:
    """Count, mean, median, p10, p90, min and max; None for no values."""
    if not values:
        return None
    x = np.asarray(values, dtype=float)
    p10, median, p90 = np.quantile(x, [0.1, 0.5, 0.9])
    return Distribution(int(x.size), float(x.mean()), float(median), float(p10), float(p90),
                        float(x.min()), float(x.max()))


def roofline_summary(scores: Sequence[ProblemScore]) -> Distribution | None:
    """The roofline fractions reached by correct samples (1.0 means at the hardware's bound)."""
    return summarize([v for s in scores for v in s.roofline_fractions])


def failure_counts(records: Iterable[SampleRecord]) -> dict[str, int]:
    """Finished samples per verdict, keyed by PKB's label (plus 'no code'), every class present."""
    counts = Counter(str(r.get("verdict", NO_CODE)) for r in finished(records))
    out = {FAILURE_LABELS[v]: counts.pop(v, 0) for v in FAILURE_ORDER}
    for verdict, n in sorted(counts.items()):  # a verdict this version does not know: shown as is
        out[verdict] = n
    return out


@dataclass(frozen=True)
class Usage:
    samples: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    wall_s: float
    gpu_s: float

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict[str, float | int]:
        return {"samples": self.samples, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "tokens": self.tokens, "cost_usd": self.cost_usd, "wall_s": self.wall_s, "gpu_s": self.gpu_s}


def usage_totals(records: Iterable[SampleRecord]) -> dict[str, Usage]:
    """Tokens, dollars, wall and GPU seconds summed per condition over every sample (finished or not)."""
    sums: dict[str, list[float]] = {}
    for r in records:
        u = r.get("usage") or {}
        row = sums.setdefault(str(r["condition"]), [0, 0, 0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += int(u.get("input_tokens") or 0)
        row[2] += int(u.get("output_tokens") or 0)
        row[3] += float(u.get("cost_usd") or 0.0)
        row[4] += float(r.get("wall_s") or 0.0)
        row[5] += float(r.get("gpu_s") or 0.0)
    return {c: Usage(int(v[0]), int(v[1]), int(v[2]), v[3], v[4], v[5]) for c, v in sorted(sums.items())}


# -- two conditions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairedDifference:
    """treatment - baseline, per problem, over the problems both have."""

    mean: float
    low: float
    high: float
    n: int
    wins: int  # problems where the treatment scores higher
    losses: int
    ties: int
    problems: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n, "wins": self.wins,
                "losses": self.losses, "ties": self.ties, "problems": list(self.problems)}


def paired_difference(baseline: Sequence[ProblemScore], treatment: Sequence[ProblemScore], metric: Metric, *,
                      seed: int, resamples: int = DEFAULT_RESAMPLES) -> PairedDifference:
    """Mean per-problem difference (treatment - baseline) with a paired bootstrap interval.

    Resampling whole problems keeps each problem's two scores together, so problem difficulty, which
    both conditions share, cancels out of the interval.
    """
    base = {s.problem: s for s in baseline}
    pairs = [(base[s.problem], s) for s in treatment if s.problem in base]
    diffs = [metric(t) - metric(b) for b, t in pairs]
    interval = bootstrap_mean(diffs, seed=seed, resamples=resamples)
    return PairedDifference(
        mean=interval.mean, low=interval.low, high=interval.high, n=interval.n,
        wins=sum(d > 0 for d in diffs), losses=sum(d < 0 for d in diffs), ties=sum(d == 0 for d in diffs),
        problems=tuple(t.problem for _, t in pairs),
    )
