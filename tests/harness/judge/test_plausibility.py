"""harness.judge.plausibility: what the judge tells from times alone, and the roofline bound handed to it as a
number (the caller computes it: harness.measure.roofline.lower_bound_ms)."""

from __future__ import annotations

import math

import pytest

from harness.common.integrity import IntegrityConfig
from harness.judge.plausibility import beats_the_roofline, caching_suspected, timing_problems, usable_bound


@pytest.mark.parametrize(("value", "usable"), [(2.5, 2.5), (3, 3.0), (0.0, None), (-1.0, None), (math.nan, None),
                                               (math.inf, None), (None, None), ("1.0", None)])
def test_only_a_finite_positive_bound_is_used(value: object, usable: float | None):
    assert usable_bound(value) == usable


def test_a_median_below_the_slack_times_the_bound_is_impossible():
    checks = IntegrityConfig()
    bound = 10.0
    assert beats_the_roofline(checks.impossible_slack * bound * 0.99, bound, checks)
    assert not beats_the_roofline(checks.impossible_slack * bound, bound, checks)
    assert not beats_the_roofline(2 * bound, bound, checks)


def test_impossible_times_are_named():
    assert timing_problems([]) == ["no timed iterations"]
    assert timing_problems([1.0, math.nan]) == ["non-finite times"]
    assert timing_problems([1.0, 0.0]) == ["non-positive time 0 ms"]
    assert timing_problems([0.5] * 10) == ["all 10 iterations took exactly 0.5 ms"]
    assert timing_problems([0.5, 0.6]) == []


def test_fresh_inputs_much_slower_than_rotated_ones_suggest_caching():
    checks = IntegrityConfig()
    assert not caching_suspected(1.0, None, 1.0, checks)
    assert not caching_suspected(1.0, 1.05, 1.0, checks)
    assert caching_suspected(1.0, 100.0, 1.0, checks)
