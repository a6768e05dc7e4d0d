"""agent.report.compare: the paired permutation test and Holm's correction against hand-computed cases, the
speedup ratio, which pairs a report compares, and cost per solved problem."""

from __future__ import annotations

import math

import pytest

from agent.report import compare, metrics
from agent.report.compare import ArmKey


def score(problem: str, n: int, correct: int, speedups: tuple[float, ...] = ()) -> metrics.ProblemScore:
    return metrics.ProblemScore(problem=problem, category="collective", condition="c", n=n, correct=correct,
                                speedups=speedups, roofline_fractions=(), verdicts=("correct",) * correct
                                + ("output_mismatch",) * (n - correct))


# -- the permutation test -------------------------------------------------------------------------------
def test_all_four_problems_better_has_the_two_sided_exact_p_of_two_patterns_in_sixteen():
    # Sign flips of (1, 1, 1, 1): 16 equally likely patterns; |mean| >= 1 only for all + and all -: p = 2/16.
    test = compare.paired_permutation([1.0, 1.0, 1.0, 1.0])
    assert test.p_value == pytest.approx(0.125) and test.exact and test.patterns == 16


def test_mixed_differences_count_the_patterns_at_least_as_extreme():
    # (2, 1, -1, 0.5): sum 2.5. Sums >= 2.5 over the 16 sign patterns: 4.5, 3.5, 2.5 (+2+1-1+0.5), 2.5 (+2-1+1+0.5);
    # as many <= -2.5: p = 8/16.
    assert compare.paired_permutation([2.0, 1.0, -1.0, 0.5]).p_value == pytest.approx(0.5)
    # five problems, all better by different amounts: only the all-+ and all-- patterns reach the sum: 2/32
    assert compare.paired_permutation([0.5, 1.0, 0.25, 2.0, 1.5]).p_value == pytest.approx(2 / 32)


def test_ties_one_pair_and_no_pair():
    assert compare.paired_permutation([0.0, 0.0, 0.0]).p_value == 1.0
    assert compare.paired_permutation([3.0]).p_value == 1.0  # two patterns, both as extreme
    assert math.isnan(compare.paired_permutation([]).p_value)


def test_many_problems_fall_back_to_drawn_patterns_with_the_same_answer():
    # 14 problems: 2^14 = 16384 patterns > 9999, so they are drawn; all better: the exact p is 2/16384.
    test = compare.paired_permutation([1.0] * 14, seed=3)
    assert not test.exact and test.patterns == compare.PERMUTATIONS
    assert test.p_value < 0.002
    exact = compare.paired_permutation([1.0] * 14, permutations=2 ** 14)
    assert exact.exact and exact.p_value == pytest.approx(2 / 2 ** 14)


# -- Holm -------------------------------------------------------------------------------------------------
def test_holm_on_known_p_values():
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): 4*0.005 = 0.02; 3*0.01 = 0.03; 2*0.03 = 0.06; max(1*0.04, 0.06) = 0.06
    assert compare.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1, NaN left out of m
    adjusted = compare.holm([0.5, math.nan, 0.4])
    assert adjusted[0] == pytest.approx(0.8) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.8)
    assert compare.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_apply_holm_corrects_across_every_comparison_and_metric():
    comparisons = [{"metrics": {"pass_at_k": {"p_value": 0.01}, "fast_1_at_k": {"p_value": 0.04},
                                "speedup_ratio": {"p_value": math.nan}, "pass_at_1": {"mean": 0.0}}},
                   {"metrics": {"pass_at_k": {"p_value": 0.03}, "fast_1_at_k": {"p_value": 0.005},
                                "speedup_ratio": {"p_value": math.nan}}}]
    assert compare.apply_holm(comparisons) == 4
    assert comparisons[0]["metrics"]["pass_at_k"]["p_holm"] == pytest.approx(0.03)
    assert comparisons[1]["metrics"]["fast_1_at_k"]["p_holm"] == pytest.approx(0.02)
    assert "p_holm" not in comparisons[0]["metrics"]["pass_at_1"]


# -- the metrics of one pair -------------------------------------------------------------------------------
def test_speedup_ratio_is_the_ratio_of_geometric_means_on_problems_both_solved():
    base = [score("a", 2, 2, (1.0, 4.0)), score("b", 2, 1, (2.0,)), score("c", 2, 0)]
    treat = [score("a", 2, 2, (4.0, 4.0)), score("b", 2, 1, (2.0,)), score("c", 2, 2, (3.0, 3.0))]
    r = compare.speedup_ratio(base, treat, seed=0, resamples=200)
    # a: geomean 2 -> 4 (log ratio ln 2); b: 2 -> 2 (0); c: not solved by the baseline, left out
    assert r["n"] == 2 and r["problems"] == ["a", "b"]
    assert r["ratio"] == pytest.approx(math.sqrt(2.0)) and (r["wins"], r["losses"], r["ties"]) == (1, 0, 1)
    assert r["low"] <= r["ratio"] <= r["high"] and r["exact"] and r["p_value"] == pytest.approx(1.0)


def test_compare_gives_every_headline_delta_and_tests_the_primary_ones():
    base = [score(p, 2, 0) for p in "abcd"]
    treat = [score(p, 2, 2, (1.5, 1.5)) for p in "abcd"]
    headline = {"pass_at_1": metrics.pass_metric(1), "pass_at_k": metrics.pass_metric(2),
                "fast_1_at_k": metrics.fast_metric(1.0, 2)}
    out = compare.compare(base, treat, headline, seed=0, resamples=200)
    assert out["pass_at_k"]["mean"] == 1.0 and out["pass_at_k"]["wins"] == 4
    assert out["pass_at_k"]["p_value"] == pytest.approx(0.125) and out["fast_1_at_k"]["p_value"] == pytest.approx(0.125)
    assert "p_value" not in out["pass_at_1"]
    assert out["speedup_ratio"]["n"] == 0 and math.isnan(out["speedup_ratio"]["ratio"])


def test_per_solved_divides_by_the_problems_with_a_correct_sample():
    usage = {"cost_usd": 0.9, "tokens": 3000, "wall_s": 60.0}
    scores = [score("a", 2, 1), score("b", 2, 2), score("c", 2, 0)]
    assert compare.per_solved(usage, scores) == {"solved": 2, "cost_usd": 0.45, "tokens": 1500.0, "wall_s": 30.0}
    assert compare.per_solved({**usage, "cost_usd": None}, scores)["cost_usd"] is None  # unpriced stays unknown
    assert compare.per_solved(usage, [score("a", 2, 0)])["tokens"] is None


# -- which pairs ------------------------------------------------------------------------------------------
ARMS = [ArmKey("a/zero-shot", "zero-shot", "run-a", "A"), ArmKey("a/agent:check", "agent:check", "run-a", "A"),
        ArmKey("a/agent:compile", "agent:compile", "run-a", "A"), ArmKey("b/zero-shot", "zero-shot", "run-b", "B"),
        ArmKey("b/agent:check", "agent:check", "run-b", "B")]


def test_default_pairs_compare_each_condition_with_its_models_zero_shot_and_models_within_zero_shot():
    assert compare.pairs(ARMS) == [(0, 1), (0, 2), (0, 3), (3, 4)]


def test_any_condition_may_be_the_baseline():
    assert compare.pairs(ARMS, "agent:check") == [(1, 0), (1, 2), (4, 3), (1, 4)]


def test_an_arm_label_as_baseline_pairs_only_arms_that_share_its_model_or_condition():
    assert compare.pairs(ARMS, "b/agent:check") == [(4, 1), (4, 3)]


def test_all_pairs_are_those_that_change_one_factor():
    assert compare.pairs(ARMS, all_pairs=True) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 4), (3, 4)]


def test_an_unknown_baseline_is_one_line():
    with pytest.raises(compare.PairingError, match="names no condition or arm"):
        compare.pairs(ARMS, "agent:bench")


def test_compared_factor():
    assert compare.compared_factor(ARMS[0], ARMS[1]) == "condition"
    assert compare.compared_factor(ARMS[0], ARMS[3]) == "model"
    assert compare.compared_factor(ARMS[0], ArmKey("x", "zero-shot", "run-c", "A")) == "run"
