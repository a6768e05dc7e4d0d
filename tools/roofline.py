"""`roofline`: the hardware lower bound for the problem here, and with `source`, how close a candidate gets.

Without code it costs no candidate run: harness.measure.roofline traces the reference and divides bytes and FLOPs
by the machine's ceilings. With code the candidate is benchmarked first (the full protocol, as `bench`)
and its timings go to harness.measure.roofline, which reports the fraction of the bound it reaches; the model reads
the record as tools.summaries.roofline_text writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.measure import roofline
from tools.base import ToolContext, ToolOutcome, as_data, bounded, stopwatch
from tools.bench import timing_blocks
from tools.check import result_data, run_evaluation, verdict_blocks
from tools.render import Block, count_tokens
from tools.summaries import roofline_text


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    verdict: list[Block] = []
    timing: list[Block] = []
    data: dict[str, Any] = {"tool": "roofline", "available": True}
    gpu_s = 0.0
    measured = None
    if candidate is not None:
        result, gpu_s = run_evaluation(ctx, candidate, timing=True)
        data["candidate"] = result_data("roofline", result)
        verdict = verdict_blocks(result, ctx, "roofline")[:1]
        timing = timing_blocks(result, ctx)
        measured = result if result.timings is not None else None  # only a timed (correct) run has a fraction
    with stopwatch() as clock:
        if ctx.on_devices is not None:
            bound = ctx.on_devices(ctx.world_size, ctx.device, roofline.roofline, ctx.problem, ctx.shape,
                                   ctx.world_size, ctx.device, candidate_result=measured, seed=ctx.config.seed)
        else:
            bound = roofline.roofline(ctx.problem, ctx.shape, ctx.world_size, ctx.device, candidate_result=measured,
                                      seed=ctx.config.seed)
    gpu_s += ctx.gpu_seconds(clock["seconds"])
    others = verdict + timing
    used = count_tokens("\n".join(b.text for b in others)) + len(others) if others else 0
    room = max(1, ctx.answer_tokens - used)
    blocks = verdict + [Block(str(roofline_text(bound, room)))] + timing
    data["roofline"] = as_data(bound)
    data["wall_s"] = round(clock["seconds"], 4)
    return ToolOutcome("roofline", bounded(ctx, blocks), data, gpu_s, candidate)
