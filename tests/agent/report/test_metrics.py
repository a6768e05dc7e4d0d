"""agent.report.metrics: the estimators against hand-computed values, the bootstrap's coverage, paired comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.report import metrics
from agent.report.metrics import (
    bootstrap_mean,
    failure_counts,
    fast_p_at_k,
    fast_p_curve,
    geomean_speedup,
    paired_difference,
    pass_at_k,
    pass_metric,
    per_category,
    score_problems,
    usage_totals,
)


def sample(problem: str, k: int, verdict: str, speedup: float | None = None, *, condition: str = "zero-shot",
           category: str = "collective", status: str = "finished", **extra) -> dict:
    return {"problem": problem, "category": category, "condition": condition, "sample": k, "status": status,
            "verdict": verdict, "correct": verdict == "correct", "speedup": speedup, **extra}


# -- pass@k -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (3, 1, 1, 1 / 3),  # pass@1 is c/n
        (10, 7, 1, 0.7),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 11/12
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2) = 1/2
        (4, 3, 2, 1.0),  # fewer than k failures: some correct sample is always drawn
        (6, 0, 3, 0.0),  # c = 0
        (6, 6, 3, 1.0),  # c = n
        (3, 2, 3, 1.0),  # k = n: any correct sample counts
        (3, 0, 3, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomials_and_stays_stable_for_large_n():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # C(199,100)/C(200,100) = 100/200
    assert pass_at_k(2000, 10, 1000) == pytest.approx(1 - math.comb(1990, 1000) / math.comb(2000, 1000))


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (3, 1, 0), (3, 4, 1), (3, -1, 1), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_fast_p_counts_only_correct_and_faster_samples():
    rows = [sample("a", 0, "correct", 1.6), sample("a", 1, "correct", 0.9), sample("a", 2, "correct", None),
            sample("a", 3, "output_mismatch", 5.0)]  # a wrong answer is never fast, however quick
    (score,) = score_problems(rows)["zero-shot"]
    assert (score.n, score.correct, score.speedups) == (4, 3, (1.6, 0.9))
    assert score.fast_count(1.0) == 1 and score.fast_count(0.0) == 2 and score.fast_count(1.6) == 0
    assert score.fast_at(1.0, 1) == pytest.approx(1 / 4)
    assert score.fast_at(1.0, 2) == pytest.approx(fast_p_at_k(4, 1, 2)) == pytest.approx(1 - 3 / 6)
    assert score.fast_at(0.0, 2) == pytest.approx(1 - 1 / 6)  # f = 2: 1 - C(2,2)/C(4,2)
    assert score.pass_at(2) == pytest.approx(1.0)  # only one failure, k = 2


def test_a_correct_sample_that_is_not_fast_eligible_is_never_fast():
    """uses_torch_collectives, impossible, input_caching...: correct (pass@k counts it), never fast, and its speedup
    stays out of speedup statistics. A record without `fast_eligible` is judged by its flags."""
    rows = [sample("a", 0, "correct", 3.0, fast_eligible=False, flags=["uses_torch_collectives"]),
            sample("a", 1, "correct", 2.0, fast_eligible=True, flags=["output_reused"]),
            sample("a", 2, "correct", 5.0, flags=["impossible"]),  # an older record: no fast_eligible
            sample("a", 3, "correct", 1.5, flags=[])]
    assert [metrics.is_fast(r, 1.0) for r in rows] == [False, True, False, True]
    assert [metrics.counted_speedup(r) for r in rows] == [None, 2.0, None, 1.5]
    assert not metrics.is_fast(sample("b", 0, "output_mismatch", 9.0, fast_eligible=True), 1.0)
    assert not metrics.is_fast(sample("c", 0, "correct", 3.0, flags=["uses_nccl"]), 1.0)  # the flag's old name
    assert not metrics.is_fast(sample("b", 1, "correct", None, fast_eligible=True), 0.0)
    (score,) = score_problems(rows)["zero-shot"]
    assert (score.correct, score.speedups, score.not_counted) == (4, (2.0, 1.5), 2)
    assert score.pass_at(1) == 1.0
    assert score.fast_count(1.0) == 2 and score.fast_count(2.5) == 0  # the 3x and 5x samples do not count
    assert score.fast_at(1.0, 1) == pytest.approx(2 / 4)
    assert geomean_speedup([score]) == pytest.approx(math.sqrt(2.0 * 1.5))


def test_fast_p_curve_is_monotone_from_0_to_3():
    rows = [sample("a", i, "correct", s) for i, s in enumerate((0.5, 1.2, 2.5))] + [
        sample("b", i, v, s) for i, (v, s) in enumerate((("correct", 1.1), ("deadlock", None), ("correct", 3.5)))]
    scores = score_problems(rows)["zero-shot"]
    curve = fast_p_curve(scores, k=1)
    ps = [p for p, _ in curve]
    assert ps[0] == 0.0 and ps[-1] == 3.0 and len(ps) == 61
    values = [v for _, v in curve]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert values[0] == pytest.approx((3 / 3 + 2 / 3) / 2)  # every correct, timed sample is faster than 0
    assert dict(curve)[3.0] == pytest.approx((0 + 1 / 3) / 2)  # only the 3.5x sample


# -- aggregation --------------------------------------------------------------------------------------
def test_unfinished_and_infra_samples_do_not_count():
    rows = [sample("a", 0, "correct", 1.0), sample("a", 1, "runtime_error"),
            sample("a", 2, "correct", 2.0, status="running"), sample("a", 3, "infra_error")]
    (score,) = score_problems(rows)["zero-shot"]
    assert (score.n, score.correct) == (2, 1)
    counts = failure_counts(rows)
    assert counts["correct"] == 1 and counts["runtime"] == 1 and counts["infrastructure"] == 1
    assert list(counts)[:2] == ["correct", "nvcc/syntax"] and "no code" in counts


def test_eligible_leaves_out_problems_with_fewer_than_k_samples():
    rows = [sample("a", i, "correct", 1.0) for i in range(3)] + [sample("b", 0, "correct", 1.0)]
    keep, left_out = metrics.eligible(score_problems(rows)["zero-shot"], k=2)
    assert [s.problem for s in keep] == ["a"] and left_out == ["b"]


def test_geomean_per_category_and_usage():
    rows = [sample("a", 0, "correct", 2.0), sample("a", 1, "correct", 0.5), sample("b", 0, "correct", 4.0,
                                                                               category="expert"),
            sample("b", 1, "compile_error", category="expert",
                   usage={"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.25}, wall_s=3.0, gpu_s=1.5)]
    scores = score_problems(rows)["zero-shot"]
    assert geomean_speedup(scores) == pytest.approx((2.0 * 0.5 * 4.0) ** (1 / 3))
    assert geomean_speedup([]) is None
    cats = per_category(scores, pass_metric(1), seed=0)
    assert list(cats) == ["collective", "expert"]
    assert cats["collective"].mean == 1.0 and cats["expert"].mean == 0.5 and cats["expert"].n == 1
    usage = usage_totals(rows)["zero-shot"]
    assert (usage.samples, usage.tokens, usage.cost_usd, usage.wall_s, usage.gpu_s) == (4, 15, 0.25, 3.0, 1.5)


def test_roofline_summary():
    rows = [sample("a", i, "correct", 1.0, roofline_fraction=f) for i, f in enumerate((0.2, 0.4, 0.6))]
    rows.append(sample("a", 3, "output_mismatch", roofline_fraction=0.99))  # not a correct sample: ignored
    dist = metrics.roofline_summary(score_problems(rows)["zero-shot"])
    assert dist is not None and dist.count == 3 and dist.median == pytest.approx(0.4)
    assert dist.minimum == 0.2 and dist.maximum == 0.6
    assert metrics.roofline_summary([]) is None


# -- bootstrap ----------------------------------------------------------------------------------------
def test_bootstrap_interval_basics():
    iv = bootstrap_mean([0.0, 1.0, 1.0, 0.0, 1.0], seed=3)
    assert iv.mean == pytest.approx(0.6) and iv.low <= iv.mean <= iv.high and iv.n == 5
    assert bootstrap_mean([0.0, 1.0, 1.0, 0.0, 1.0], seed=3) == iv  # the seed fixes it
    assert bootstrap_mean([0.7], seed=0) == metrics.Interval(0.7, 0.7, 0.7, 1)
    assert math.isnan(bootstrap_mean([], seed=0).mean)


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    """200 synthetic suites of 50 problems whose per-problem scores are Beta(2, 3): true mean 0.4."""
    rng = np.random.default_rng(12345)
    true_mean = 2 / (2 + 3)
    hits = 0
    reps = 200
    for rep in range(reps):
        values = rng.beta(2, 3, size=50)
        iv = bootstrap_mean(values.tolist(), seed=rep, resamples=1000)
        hits += iv.low <= true_mean <= iv.high
    coverage = hits / reps
    assert 0.90 <= coverage <= 0.99, coverage


# -- paired comparison --------------------------------------------------------------------------------
def _scores(correct_by_problem: dict[str, int], condition: str, n: int = 4) -> list[metrics.ProblemScore]:
    rows = []
    for problem, c in correct_by_problem.items():
        rows += [sample(problem, i, "correct" if i < c else "output_mismatch", 1.0, condition=condition)
                 for i in range(n)]
    return score_problems(rows)[condition]


def test_paired_difference_sign_and_interval():
    base = _scores({f"p{i}": i % 3 for i in range(12)}, "zero-shot")
    better = _scores({f"p{i}": i % 3 + 1 for i in range(12)}, "agent")  # one more correct sample everywhere
    up = paired_difference(base, better, pass_metric(1), seed=0)
    assert up.mean == pytest.approx(0.25) and up.n == 12 and (up.wins, up.losses, up.ties) == (12, 0, 0)
    assert up.low == pytest.approx(0.25) and up.high == pytest.approx(0.25)  # every difference is 0.25
    down = paired_difference(better, base, pass_metric(1), seed=0)
    assert down.mean == pytest.approx(-0.25) and down.high < 0
    same = paired_difference(base, base, pass_metric(1), seed=0)
    assert (same.mean, same.low, same.high, same.ties) == (0.0, 0.0, 0.0, 12)


def test_paired_difference_uses_only_shared_problems_and_pairs_them():
    base = _scores({"a": 0, "b": 4, "c": 2, "only_base": 4}, "zero-shot")
    treat = _scores({"a": 1, "b": 4, "c": 3, "only_treat": 0}, "agent")
    d = paired_difference(base, treat, pass_metric(1), seed=1)
    assert d.problems == ("a", "b", "c") and d.n == 3
    assert d.mean == pytest.approx((0.25 + 0 + 0.25) / 3)
    assert 0.0 <= d.low <= d.mean <= d.high <= 0.25
    # Pairing matters: an unpaired difference of means would mix in the unshared problems.
    assert d.mean != pytest.approx(np.mean([s.pass_at(1) for s in treat]) - np.mean([s.pass_at(1) for s in base]))
