"""`check`: is the candidate correct on every rank? The harness's correctness protocol, no timing.

The answer names the verdict and, on failure, the failing rank, trial and phase, where the mismatch is
(which output, which flat index), how large the error is against the tolerance, a hint for the failure
class, and the trimmed traceback or compiler output. The full EvalResult goes to `data`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.common import failures
from harness.evaluate import evaluate
from harness.records.results import EvalResult
from tools.base import OutOfWall, ToolContext, ToolOutcome, bounded, out_of_wall, stopwatch, within_deadline
from tools.build_note import build_note, result_build
from tools.render import Block, Keep

# What each verdict but `correct` means for the model (the verdicts themselves: harness.common.failures).
HINTS = {
    failures.COMPILE_ERROR:
        "The file did not compile. Line numbers are the Python file's, or the CUDA source's for nvcc/NVRTC errors.",
    failures.API_ERROR:
        "`solution` must be defined at module level with the reference's parameters, and every import must exist "
        "on this machine.",
    failures.RUNTIME_ERROR:
        "An exception on this rank (traceback below). Its peers may have been left waiting, so only the first "
        "failing rank is reported.",
    failures.SHAPE_MISMATCH: "Return the same structure, shapes and dtypes as the reference, on every rank.",
    failures.OUTPUT_MISMATCH:
        "Values differ. Check which rank owns which slice (data partitioning), that every rank reads peer data "
        "only after a barrier with acquire, and that no buffer is overwritten while a peer may still read it.",
    failures.DEADLOCK:
        "A rank never finished: every rank must make the same barrier and collective calls in the same order, "
        "signal slots and epochs must match on both sides, and blocks that spin on flags must all be resident at "
        "once (grid <= SM count). The stacks below show where each rank was.",
    failures.TIMEOUT:
        "Every rank was still busy in its own code when time ran out (stacks below): too slow, not stuck. Look "
        "for a host loop, a per-element Python operation or a synchronize in a loop.",
    failures.INFRA_ERROR: "The harness failed, not your code; the call can be repeated.",
}
# What the harness's integrity flags (harness/common/integrity.py) mean for the model; unknown flags show by name.
FLAG_HINTS = {
    "stale_output": "the output equals the previous call's answer: a buffer was reused before the new data "
                    "arrived, or a result was cached across calls",
    "mutates_inputs": "solution modified an input tensor; work on your own buffers",
    "race": "correct when the ranks run in step, wrong when one rank is late: a missing or one-sided barrier, "
            "or a buffer reused while a peer still reads it",
    "reduced_precision": "fails a precision probe although random inputs pass: accumulate in fp32, round once",
    "uses_torch_collectives": "torch.distributed collectives (NCCL, gloo) ran inside solution() after the first call",
    "unsynchronized_work": "the output was not complete on the caller's stream when solution returned: launch "
                           "on torch.cuda.current_stream() and join side streams back",
    "lazy_output": "the output was not a plain finished tensor, or it changed after the call returned",
    "output_reused": "a later call overwrote an earlier call's output: return fresh tensors",
    "timed_output_wrong": "a timed call returned a wrong output although the check passed",
    "input_caching": "never-seen inputs ran much slower than repeated ones: results must not be cached",
    "impossible": "faster than the hardware allows: the timing does not cover the work",
    "timing_inconsistent": "the times measured in your ranks do not match the harness's own clock: the claimed "
                           "call time is smaller than what the harness saw",
}


def flag_line(flags: list[str]) -> str | None:
    if not flags:
        return None
    return "flags: " + "; ".join(f"{f} ({FLAG_HINTS[f]})" if f in FLAG_HINTS else f for f in flags)


_OUTPUT = re.compile(r"(?:rank \d+, trial \d+: )?(out(?:\[\d+\])*)\b")
_INDEX = re.compile(r"flat index (\d+)")
_COUNT = re.compile(r"(\d+) of (\d+) elements")


def location(message: str) -> dict[str, Any] | None:
    """Which output and element a mismatch message points at (the harness's compare messages)."""
    output = _OUTPUT.search(message)
    if output is None:
        return None
    where: dict[str, Any] = {"output": output.group(1)}
    if index := _INDEX.search(message):
        where["flat_index"] = int(index.group(1))
    if count := _COUNT.search(message):
        where["mismatched"], where["numel"] = int(count.group(1)), int(count.group(2))
    return where


def run_evaluation(ctx: ToolContext, candidate: Path, *, timing: bool) -> tuple[EvalResult, float]:
    """The harness protocol on the sample's problem, shape and W; returns the result and the GPU seconds
    (wall time with ranks up, times W on CUDA: the compile step before launch holds no GPU). The whole
    evaluation, queueing included, ends by ctx.deadline (tools.base.within_deadline: OutOfWall)."""
    config = ctx.config.model_copy(update={"skip_timing": not timing})
    run = ctx.evaluate or evaluate
    with within_deadline(ctx), stopwatch() as clock:
        result = run(ctx.problem, candidate, world_size=ctx.world_size, device=ctx.device, shape=ctx.shape,
                     config=config, gpus=ctx.gpus)
    held = max(0.0, clock["seconds"] - result.stages.get("compile", 0.0))
    return result, ctx.gpu_seconds(held)


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def verdict_blocks(result: EvalResult, ctx: ToolContext, tool: str) -> list[Block]:
    """The verdict as text blocks in priority order (headline first, evidence last)."""
    tol = f"atol={ctx.problem.atol:g} rtol={ctx.problem.rtol:g}"
    setting = f"shape {ctx.shape!r}, W={ctx.world_size}, {ctx.device}"
    build = build_note(*result_build(result))
    if result.correct:
        summary = [f"{tool}: correct on all {ctx.world_size} ranks over {result.trials} trials ({setting}); "
                   f"max abs err {_g(result.max_abs_err)}, max rel err {_g(result.max_rel_err)} within {tol}.",
                   flag_line(result.flags), build]
        return [Block("\n".join(line for line in summary if line))]
    failure = result.failure
    assert failure is not None
    where = [f"rank {failure.rank}" if failure.rank is not None else None,
             f"trial {failure.trial}" if failure.trial is not None else None,
             f"phase {failure.phase}" if failure.phase else None]
    head = f"{tool}: {result.verdict} ({', '.join(w for w in where if w)}; {setting})"
    lines = [head, failure.message]
    if failure.max_abs_err is not None:
        lines.append(f"error magnitude: max abs err {_g(failure.max_abs_err)}, max rel err "
                     f"{_g(failure.max_rel_err)} (tolerance {tol})")
    loc = location(failure.message)
    if loc and result.verdict in ("output_mismatch", "shape_mismatch"):
        text = f"location: output `{loc['output']}`"
        if "flat_index" in loc:
            text += f", flat index {loc['flat_index']}"
        if "mismatched" in loc:
            text += f" ({loc['mismatched']} of {loc['numel']} elements outside tolerance)"
        lines.append(text)
    if flags := flag_line(result.flags):
        lines.append(flags)
    if build:
        lines.append(build)
    if result.verdict in HINTS:
        lines.append(f"hint: {HINTS[result.verdict]}")
    blocks = [Block("\n".join(lines))]
    if failure.evidence.strip():
        # Tracebacks and compiler logs: the end holds the error, the start the first error; keep both.
        keep: Keep = "tail" if result.verdict in ("runtime_error", "api_error") else "both"
        blocks.append(Block(failure.evidence.strip(), keep, title="evidence:"))
    return blocks


def result_data(tool: str, result: EvalResult) -> dict[str, Any]:
    failure = result.failure
    return {
        "tool": tool,
        "verdict": result.verdict,
        "correct": result.correct,
        "speedup": result.speedup,
        "failing_rank": failure.rank if failure else None,
        "failing_trial": failure.trial if failure else None,
        "location": location(failure.message) if failure else None,
        "max_abs_err": failure.max_abs_err if failure else result.max_abs_err,
        "max_rel_err": failure.max_rel_err if failure else result.max_rel_err,
        "flags": list(result.flags),
        "stages": dict(result.stages),
        "result": result.model_dump(mode="json"),
    }


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    assert candidate is not None  # run_tool requires `source` for check
    try:
        result, gpu_s = run_evaluation(ctx, candidate, timing=False)
    except OutOfWall as stop:
        return out_of_wall("check", ctx, candidate, stop)
    blocks = verdict_blocks(result, ctx, "check")
    if result.correct:
        blocks.append(Block("Not timed: `bench` measures speed against the reference."))
    return ToolOutcome("check", bounded(ctx, blocks), result_data("check", result), gpu_s, candidate)
