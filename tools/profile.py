"""`profile`: where the candidate's time goes, per rank (harness.measure.profiling; text: tools.summaries).

Every rank's timeline (PyTorch profiler). On CUDA also Nsight Compute on one rank while the others run
free (harness.measure.ncu, as `pkb profile --ncu` does, with the metric set the summary needs), summarised per
kernel: its time and share of the call, DRAM and NVLink throughput against this machine's ceilings, SM
throughput and the top stall reasons; where the counters cannot be read, one line says why. And Nsight
Systems' kernel summary of that rank where nsys is installed (harness.measure.nsys).

Where the sample's ranks share GPUs (`--ranks-per-gpu`, harness.emulation) the same profile runs on the lease's
GPUs, and the answer says under its first line what such a profile can and cannot tell
(harness.measure.profiling.emulation_caveats).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.measure import profiling
from harness.measure.ncu import AGENT_SETS
from tools.base import ToolContext, ToolOutcome, as_data, bounded, stopwatch
from tools.render import Block, count_tokens
from tools.summaries import profile_text

NCU_BUDGET_S = 120.0  # one ncu run (its rank pool, the replayed passes); past it the summary says so
NSYS_BUDGET_S = 60.0


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    assert candidate is not None  # run_tool requires `source` for profile
    extra: dict[str, Any] = {"gpus": ctx.gpus, "seed": ctx.config.seed, "ranks_per_gpu": ctx.config.ranks_per_gpu,
                             "keep_dir": ctx.artifacts_dir}
    if ctx.device == "cuda":  # Nsight on GPUs; each says in one line what it could not do
        extra.update(ncu=True, ncu_metrics=AGENT_SETS, ncu_budget_s=NCU_BUDGET_S, nsys=True,
                     nsys_budget_s=NSYS_BUDGET_S)
    failed: profiling.ProfileError | None = None
    with stopwatch() as clock:
        try:
            if ctx.on_devices is not None:
                result = ctx.on_devices(ctx.world_size, ctx.device, profiling.profile, ctx.problem, candidate,
                                        world_size=ctx.world_size, device=ctx.device, shape=ctx.shape, **extra)
            else:
                result = profiling.profile(ctx.problem, candidate, world_size=ctx.world_size, device=ctx.device,
                                           shape=ctx.shape, **extra)
        except profiling.ProfileError as err:  # the candidate could not run: a verdict, not a crash
            failed = err
    gpu_s = ctx.gpu_seconds(clock["seconds"])
    if failed is not None:
        return _failure(failed, ctx, candidate, gpu_s)
    # The profile's text names problem, shape and W; it is bounded again here, whatever it returns.
    text = answer_text(result, ctx.answer_tokens)
    data = {"tool": "profile", "available": True, "wall_s": round(clock["seconds"], 4), "result": as_data(result)}
    return ToolOutcome("profile", bounded(ctx, [Block(text)]), data, gpu_s, candidate)


def answer_text(report: profiling.ProfileReport, max_tokens: int = 600) -> str:
    """The profile as the model reads it (tools.summaries.profile_text) within `max_tokens`, with what an emulated
    profile cannot tell (the report's `emulation` lines) right under its first line, where no cut reaches them.
    `pkb profile --text` prints the same."""
    caveats = "\n".join(getattr(report, "emulation", None) or [])  # a result without them: the ordinary mode
    if not caveats:
        return str(profile_text(report, max_tokens))
    # The joins' newlines can merge with their neighbours' tokens: a few tokens of room for them.
    head, _, rest = str(profile_text(report, max(max_tokens - count_tokens(caveats) - 4, 1))).partition("\n")
    return "\n".join(part for part in (head, caveats, rest) if part)


def _failure(err: Exception, ctx: ToolContext, candidate: Path, gpu_s: float) -> ToolOutcome:
    """The profiler could not run the candidate: its verdict (compile_error, runtime_error, deadlock, ...),
    or an infrastructure error, which is said to be one."""
    verdict = str(getattr(err, "verdict", "infra_error"))
    evidence = str(getattr(err, "evidence", "") or "").strip()
    if verdict == "infra_error":
        head = f"profile: the profiler itself failed ({err}); this is not a verdict on your code."
    else:
        head = f"profile: the candidate could not be profiled: {verdict}: {err}. `check` gives the full verdict."
    blocks = [Block(head)] + ([Block(evidence, "tail", title="evidence:")] if evidence else [])
    data = {"tool": "profile", "available": True, "verdict": verdict, "error": str(err), "evidence": evidence}
    return ToolOutcome("profile", bounded(ctx, blocks), data, gpu_s, candidate)
