"""The device spin before each timed or profiled call, defined once for every side that sizes or runs it.

Before the call the GPU sleeps (torch.cuda._sleep, counted in SM cycles) long enough for the host to enqueue
the device barrier, the start event and the call, so the GPU reaches the start event only once the whole
iteration is queued: without it small calls measure Python launch latency, not the GPU. The judge sizes it
from the warm-up's enqueue times (harness.judge.timing), calibration and the profiler from their own.
"""

from __future__ import annotations

SM_CYCLES_PER_S = 1.98e9  # H200 SM clock under load: a spin is asked for in cycles
MIN_SPIN_US = 20.0
MAX_SPIN_US = 2000.0  # a spin costs nothing timed, but a slow host must not make iterations endless


def spin_us(enqueue_us: float, min_us: float = MIN_SPIN_US, max_us: float = MAX_SPIN_US) -> float:
    """The spin that outlasts a host enqueue of `enqueue_us` with a generous margin (4x, plus 30 µs)."""
    return min(max_us, max(min_us, 4.0 * enqueue_us + 30.0))


def cycles(us: float) -> int:
    """SM cycles of a spin of `us` microseconds (torch.cuda._sleep's argument)."""
    return int(us * SM_CYCLES_PER_S / 1e6)
