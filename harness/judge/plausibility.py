"""What the judge can tell about a candidate's times without trusting the process that measured them:
impossible values, fresh inputs much slower than rotated ones, faster than the roofline bound (a number the
caller computed: harness.measure.roofline.lower_bound_ms). Judge side.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from harness.common.integrity import IntegrityConfig


def timing_problems(times_ms: Iterable[float]) -> list[str]:
    """What is impossible about a list of measured times (a clock cannot run backwards or stop)."""
    values = list(times_ms)
    if not values:
        return ["no timed iterations"]
    if any(not math.isfinite(v) for v in values):
        return ["non-finite times"]
    if min(values) <= 0:
        return [f"non-positive time {min(values):.3g} ms"]
    if len(values) >= 10 and max(values) == min(values):
        # A coefficient of variation of exactly zero: no clock measures 10 calls identically.
        return [f"all {len(values)} iterations took exactly {values[0]:.6g} ms"]
    return []


def caching_margin_ms(reference_median_ms: float, config: IntegrityConfig) -> float:
    """The caching check's margin: the noise floor, or a share of what one honest call costs (the reference's
    median, measured in the clean pool), whichever is larger."""
    work = reference_median_ms if math.isfinite(reference_median_ms) else 0.0
    return max(config.caching_margin_ms, config.caching_margin_work * work)


def caching_excess_ms(pairs: Sequence[tuple[float, float]], config: IntegrityConfig) -> float | None:
    """Per pair (a call on rotated buffers, then one on never-seen buffers), how much longer the never-seen
    call took than `caching_ratio` times its neighbour; the median over pairs. Each call is set against its
    own neighbour, not the median of all neighbours against the median of all fresh calls: load on a busy
    machine comes in bursts longer than a call, and a burst that fell on three fresh calls and missed their
    neighbours read as caching (2 of 16 honest evaluations, two at a time on 2 cores, 2026-12-02). None
    without a finite pair."""
    excess = [fresh - config.caching_ratio * rotated for rotated, fresh in pairs
              if math.isfinite(rotated) and math.isfinite(fresh)]
    return statistics.median(excess) if excess else None


def caching_suspected(pairs: Sequence[tuple[float, float]], reference_median_ms: float,
                      config: IntegrityConfig) -> bool:
    """True when calls on never-seen buffers are much slower than their neighbouring calls on the rotated
    ones: something the candidate keeps per buffer (or per input content) saved work on the rotated calls.
    Every timed call's contents are fresh (harness.rank.refill), so only what is keyed on the buffers
    themselves is left for this check to see."""
    excess = caching_excess_ms(pairs, config)
    return excess is not None and excess > caching_margin_ms(reference_median_ms, config)


def usable_bound(value: object) -> float | None:
    """A roofline bound (ms) the check can use: finite and positive, else None (a missing bound never fails
    an evaluation)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def beats_the_roofline(median_ms: float, bound_ms: float, config: IntegrityConfig) -> bool:
    """A median below the hardware's lower bound (with the configured slack) is impossible: the times were
    not what the calls took."""
    return median_ms < config.impossible_slack * bound_ms
