"""Comparing arms with paired statistics: which pairs, the tests, Holm's correction, cost per solved problem.

Pure (numpy and scipy, no I/O); agent.report.build calls it. An arm is one condition of one run (agent.report.build).

**Which pairs.** Any condition may be the baseline (`baseline`: a condition name or an arm's label; default
zero-shot where some arm has it, else the first arm's condition). The first arm of the baseline condition is
the reference arm. Every other arm of the baseline condition is compared with the reference arm; every arm of
another condition with the baseline-condition arm of its own run, else of a run with the same model settings,
else with the reference arm. With a label, every arm that shares the model or the condition with that arm is
compared with it. `all_pairs`: every two arms that share the model or the condition. So each comparison changes
one factor, the condition or the model; whether the runs agree on everything else is their manifests' to say
(agent.manifest; `compared_factor`).

**Statistics**, over the problems both arms have (at least k finished samples each), each problem once:

- Δpass@k and Δfast_1@k: the mean of the per-problem differences (treatment − baseline), a paired bootstrap
  interval (agent.report.metrics.paired_difference: problems resampled whole), and a two-sided paired
  permutation test of the mean difference: every problem's two scores swapped or not
  (scipy.stats.permutation_test, permutation_type="samples"), exact (all 2^n patterns) when 2^n is at most
  PERMUTATIONS, else that many random patterns.
- The speedup ratio: on problems both arms solved with a counted speedup (agent.report.metrics.counted_speedup),
  the per-problem log ratio of the geometric means of the two arms' speedups; reported as exp(mean log ratio),
  the ratio of geometric-mean speedups over those problems with each problem weighed once, with its bootstrap
  interval (exponentiated) and the permutation test of the log ratios.
- wins/losses/ties: problems where the treatment's per-problem figure is higher, lower, equal.
- Holm's step-down correction over every p-value of the comparisons shown (pairs x the three metrics).

**Per solved problem**: an arm's dollars, tokens and wall seconds divided by the problems it solved (at least
one correct finished sample); None where it solved none, or where its dollars are not known.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from agent.report import metrics

PERMUTATIONS = 9999  # sign patterns drawn when 2^n exceeds it; below, the test is exact
PRIMARY = ("pass_at_k", "fast_1_at_k", "speedup_ratio")  # the metrics tested, in the table's order


# -- tests ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TestResult:
    p_value: float  # NaN where there is nothing to test (no shared problem)
    exact: bool
    patterns: int  # sign patterns the p-value is over

    def as_dict(self) -> dict[str, Any]:
        return {"p_value": self.p_value, "exact": self.exact, "patterns": self.patterns,
                "test": "paired permutation (sign flips), two-sided"}


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def paired_permutation(differences: Sequence[float], *, seed: int = 0,
                       permutations: int = PERMUTATIONS) -> TestResult:
    """Two-sided p-value of the mean of paired differences under the null that each pair's two values are
    exchangeable: each difference's sign flipped or not, exact when 2^n <= permutations."""
    d = np.asarray(differences, dtype=float)
    n = int(d.size)
    if n == 0:
        return TestResult(math.nan, True, 0)
    exact = n < 63 and 2 ** n <= permutations
    patterns = 2 ** n if exact else permutations
    if n == 1 or not np.any(d):  # one pair (both patterns give the same |mean|), or every pair tied: p = 1
        return TestResult(1.0, exact, patterns)
    result = stats.permutation_test((d, np.zeros(n)), _mean_difference, permutation_type="samples", vectorized=True,
                                    n_resamples=permutations, alternative="two-sided", rng=seed)
    return TestResult(float(min(1.0, result.pvalue)), exact, patterns)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order. NaN stays NaN and is not counted in m."""
    tested = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    m = len(tested)
    out = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(tested, key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


# -- one pair ---------------------------------------------------------------------------------------
def _shared(baseline: Sequence[metrics.ProblemScore], treatment: Sequence[metrics.ProblemScore]
            ) -> list[tuple[metrics.ProblemScore, metrics.ProblemScore]]:
    base = {s.problem: s for s in baseline}
    return [(base[s.problem], s) for s in treatment if s.problem in base]


def _log_geomean(values: Sequence[float]) -> float:
    return float(np.mean(np.log(np.asarray(values, dtype=float))))


def speedup_ratio(baseline: Sequence[metrics.ProblemScore], treatment: Sequence[metrics.ProblemScore], *,
                  seed: int, resamples: int, permutations: int = PERMUTATIONS) -> dict[str, Any]:
    """The ratio of geometric-mean speedups on the problems both solved with a counted speedup (module doc)."""
    pairs = [(b, t) for b, t in _shared(baseline, treatment)
             if any(v > 0 for v in b.speedups) and any(v > 0 for v in t.speedups)]
    logs = [_log_geomean([v for v in t.speedups if v > 0]) - _log_geomean([v for v in b.speedups if v > 0])
            for b, t in pairs]
    interval = metrics.bootstrap_mean(logs, seed=seed, resamples=resamples)
    test = paired_permutation(logs, seed=seed, permutations=permutations)
    finite = interval.n > 0
    return {"ratio": math.exp(interval.mean) if finite else math.nan,
            "low": math.exp(interval.low) if finite else math.nan,
            "high": math.exp(interval.high) if finite else math.nan,
            "n": interval.n, "wins": sum(x > 0 for x in logs), "losses": sum(x < 0 for x in logs),
            "ties": sum(x == 0 for x in logs), "problems": [t.problem for _, t in pairs], **test.as_dict()}


def difference(baseline: Sequence[metrics.ProblemScore], treatment: Sequence[metrics.ProblemScore],
               metric: metrics.Metric, *, seed: int, resamples: int, test: bool,
               permutations: int = PERMUTATIONS) -> dict[str, Any]:
    """metrics.paired_difference, and (test=True) its permutation test."""
    out = metrics.paired_difference(baseline, treatment, metric, seed=seed, resamples=resamples).as_dict()
    if test:
        diffs = [metric(t) - metric(b) for b, t in _shared(baseline, treatment)]
        out.update(paired_permutation(diffs, seed=seed, permutations=permutations).as_dict())
    return out


def compare(baseline: Sequence[metrics.ProblemScore], treatment: Sequence[metrics.ProblemScore],
            headline: dict[str, metrics.Metric], *, seed: int, resamples: int,
            permutations: int = PERMUTATIONS) -> dict[str, Any]:
    """Every headline metric's paired difference (the primary ones tested) and the speedup ratio."""
    out = {key: difference(baseline, treatment, fn, seed=seed, resamples=resamples, test=key in PRIMARY,
                           permutations=permutations)
           for key, fn in headline.items()}
    out["speedup_ratio"] = speedup_ratio(baseline, treatment, seed=seed, resamples=resamples,
                                         permutations=permutations)
    return out


def apply_holm(comparisons: list[dict[str, Any]]) -> int:
    """Write `p_holm` beside every tested p-value of `comparisons` (in place); returns how many were corrected."""
    cells = [(c, key) for c in comparisons for key in PRIMARY if "p_value" in c["metrics"].get(key, {})]
    adjusted = holm([c["metrics"][key]["p_value"] for c, key in cells])
    for (c, key), p in zip(cells, adjusted, strict=True):
        c["metrics"][key]["p_holm"] = p
    return sum(1 for p in adjusted if not math.isnan(p))


# -- per solved problem -----------------------------------------------------------------------------
def per_solved(usage: dict[str, Any], scores: Sequence[metrics.ProblemScore]) -> dict[str, Any]:
    """Dollars, tokens and wall seconds per solved problem (a problem with a correct finished sample)."""
    solved = sum(1 for s in scores if s.correct > 0)
    cost = usage.get("cost_usd")
    # tokens nobody counted (replayed code, replies without counts) are unknown, never 0: the headline's rule
    tokens = None if not usage.get("usage_reported", True) and not usage.get("tokens") else usage.get("tokens")

    def per(value: float | None) -> float | None:
        return None if value is None or solved == 0 else float(value) / solved

    return {"solved": solved, "cost_usd": per(cost), "tokens": per(tokens),
            "wall_s": per(usage.get("wall_s"))}


# -- which pairs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmKey:
    """What pairing needs of an arm: its label, condition, run (a path) and model settings (a canonical string)."""

    label: str
    condition: str
    run: str
    model: str


class PairingError(ValueError):
    """A baseline that names no arm or condition; one line."""


def pairs(arms: Sequence[ArmKey], baseline: str | None = None, *, all_pairs: bool = False,
          default_condition: str = "zero-shot") -> list[tuple[int, int]]:
    """(baseline index, treatment index) of every comparison (module doc), in the arms' order."""
    if len(arms) < 2:
        return []

    def related(a: ArmKey, b: ArmKey) -> bool:
        return a.model == b.model or a.condition == b.condition

    if all_pairs:
        return [(i, j) for i in range(len(arms)) for j in range(i + 1, len(arms)) if related(arms[i], arms[j])]
    labels = [a.label for a in arms]
    if baseline is not None and baseline in labels:
        b = labels.index(baseline)
        return [(b, j) for j, a in enumerate(arms) if j != b and related(arms[b], a)]
    conditions = [a.condition for a in arms]
    if baseline is not None and baseline not in conditions:
        raise PairingError(f"--baseline {baseline!r} names no condition or arm of the report; conditions: "
                           f"{', '.join(dict.fromkeys(conditions))}; arms: {', '.join(labels)}")
    condition = baseline or (default_condition if default_condition in conditions else conditions[0])
    reference = conditions.index(condition)
    out: list[tuple[int, int]] = []
    for j, arm in enumerate(arms):
        if j == reference:
            continue
        if arm.condition == condition:
            out.append((reference, j))
            continue
        partner = _first(arms, condition, run=arm.run)
        if partner is None:
            partner = _first(arms, condition, model=arm.model)
        out.append((reference if partner is None else partner, j))
    return out


def _first(arms: Sequence[ArmKey], condition: str, *, run: str | None = None, model: str | None = None) -> int | None:
    """The first arm of `condition` in `run` (or with `model`'s settings)."""
    return next((i for i, a in enumerate(arms) if a.condition == condition
                 and (run is None or a.run == run) and (model is None or a.model == model)), None)


def compared_factor(base: ArmKey, treatment: ArmKey) -> str:
    """What a pair compares: 'condition', 'model', or 'run' (two runs of the same condition and model)."""
    if base.condition != treatment.condition:
        return "condition"
    if base.model != treatment.model:
        return "model"
    return "run" if base.run != treatment.run else "condition"
