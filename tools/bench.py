"""`bench`: check, then time candidate and reference with the same protocol, and give the speedup.

Device time per call (CUDA events after an L2 flush, a device-side spin and a cross-rank barrier; the
maximum over ranks per iteration) is the figure the speedup uses; the host-inclusive latency (launch
overhead included) is reported apart. On CPU the timings only prove the plumbing, and the text says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.common.flags import is_emulated
from harness.records.results import EvalResult, TimingStats
from tools.base import OutOfWall, ToolContext, ToolOutcome, bounded, out_of_wall
from tools.check import result_data, run_evaluation, verdict_blocks
from tools.render import Block


def duration(ms: float) -> str:
    """A time in the unit that reads best: us below a millisecond, ms below a second, else s."""
    if ms != ms:  # NaN: nothing measured
        return "n/a"
    if ms < 1.0:
        return f"{ms * 1e3:.1f} us"
    if ms < 1e3:
        return f"{ms:.3f} ms"
    return f"{ms / 1e3:.2f} s"


def _stats_line(label: str, s: TimingStats) -> str:
    cached = " (cached)" if s.cached else ""
    return (f"{label}: median {duration(s.median_ms)}, p10 {duration(s.p10_ms)}, p90 {duration(s.p90_ms)}, "
            f"cv {s.cv * 100:.1f}%; host-inclusive {duration(s.host_median_ms)}; slowest rank {s.slowest_rank}"
            f"{cached}")


def timing_blocks(result: EvalResult, ctx: ToolContext) -> list[Block]:
    timings = result.timings
    if timings is None:
        return []
    cand, ref = timings.candidate, timings.reference
    speed = result.speedup
    verdict = "faster than" if speed and speed > 1 else "slower than" if speed and speed < 1 else "as fast as"
    head = (f"speedup: {speed:.3g}x ({verdict} the reference; reference median / candidate median device time, "
            f"each iteration's time the max over ranks)" if speed is not None else "speedup: n/a")
    if is_emulated(result):
        ratio = f"{speed:.3g}x" if speed is not None else "n/a"
        head = (f"time ratio: {ratio} (reference median / candidate median). EMULATED: ranks share a GPU and take "
                "turns on it, so this is not a speedup and does not count as fast; it says nothing about NVLink")
    lines = [head, _stats_line("candidate", cand), _stats_line("reference", ref)]
    if cand.clock == "cuda_events":
        lines.append(f"protocol: CUDA events, {cand.iterations} iterations, {cand.input_sets} input sets rotated, "
                     f"L2 flushed and a {cand.spin_us:.0f} us device spin before each call")
    else:
        lines.append(f"protocol: host clock over {cand.iterations} iterations on CPU (gloo): these numbers only "
                     "prove the plumbing, not the speed on GPUs")
    return [Block("\n".join(lines))]


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    assert candidate is not None  # run_tool requires `source` for bench
    try:
        result, gpu_s = run_evaluation(ctx, candidate, timing=True)
    except OutOfWall as stop:
        return out_of_wall("bench", ctx, candidate, stop)
    blocks = verdict_blocks(result, ctx, "bench")
    if result.correct:
        blocks = blocks[:1] + timing_blocks(result, ctx) + blocks[1:]
    else:
        blocks.append(Block("Not timed: only a correct candidate is timed."))
    return ToolOutcome("bench", bounded(ctx, blocks), result_data("bench", result), gpu_s, candidate)
