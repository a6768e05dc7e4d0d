"""harness.judge.plausibility: what the judge tells from times alone, and the roofline bound handed to it as a
number (the caller computes it: harness.measure.roofline.lower_bound_ms)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from harness.common.integrity import IntegrityConfig
from harness.judge.plausibility import (
    beats_the_roofline,
    caching_excess_ms,
    caching_suspected,
    timing_problems,
    usable_bound,
)


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
    assert not caching_suspected([], 1.0, checks)
    assert not caching_suspected([(1.0, 1.05)] * 5, 1.0, checks)
    assert caching_suspected([(1.0, 100.0)] * 5, 1.0, checks)


def test_input_caching_sets_each_fresh_call_against_its_own_neighbour():
    """Honest candidates on a loaded 2-core machine (2026-12-02, evaluations started two or three at once):
    bursts of load fell on never-seen calls. Median against median read the first as caching (4.91 ms
    against 1.5 x 2.49 ms + 0.5); each call against its neighbour does not. Under the heavier load the
    honest never-seen calls ran up to 3x their neighbours: CPU's ratio is 3. A per-buffer memo stays
    caught however the load falls: every pair shows it."""
    cpu = IntegrityConfig.for_device("cpu")
    gpu_ratio = dataclasses.replace(cpu, caching_ratio=IntegrityConfig.for_device("cuda").caching_ratio)
    burst = [(2.491, 6.017), (2.739, 3.485), (2.182, 1.589), (1.784, 5.653), (6.106, 4.907)]
    rotated, fresh = zip(*burst)
    assert statistics.median(fresh) > 1.5 * statistics.median(rotated) + cpu.caching_margin_ms
    assert not caching_suspected(burst, 1.711, gpu_ratio)
    heavy = [(1.929, 7.265), (7.057, 3.624), (3.339, 10.234), (2.458, 7.19), (6.982, 7.951)]
    assert caching_suspected(heavy, 1.711, gpu_ratio)
    assert not caching_suspected(heavy, 1.711, cpu)
    memo = [(0.05, 1.7), (0.9, 2.6), (0.04, 1.8), (0.05, 5.0), (3.0, 1.9)]  # cached calls, two of them in bursts
    assert caching_suspected(memo, 1.711, cpu)
    assert caching_excess_ms([], cpu) is None and not caching_suspected([], 1.0, cpu)
    assert not caching_suspected([(float("nan"), 9.0)], 1.0, cpu)
