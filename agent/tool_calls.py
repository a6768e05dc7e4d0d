"""How the agent loop runs one tool call: the tools' view of the sample (ToolContext), whose device work goes
through the sample's executor (this node's by default, a lease per evaluation), and the candidate entries the
graph's state keeps. agent.graph's `tools` node calls run_tool_call once per call of a reply.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from agent.executors.interface import as_device_call, as_evaluate
from agent.executors.local import LocalExecutor
from agent.rundir import write_json_atomic
from agent.sample_context import SampleContext
from tools.base import ToolContext, ToolOutcome, save_candidate
from tools.dispatch import run_tool


def tool_context(ctx: SampleContext, gpus: list[int] | None, spent: list[float] | None = None) -> ToolContext:
    """The tools' view of the sample. Their device work goes through the sample's executor, else this node's
    (a LocalExecutor over the scheduler: native code is built before the devices are taken), as the final
    scoring's does (agent.scoring); each evaluation's device seconds are added to `spent`."""
    executor = ctx.executor if ctx.executor is not None else LocalExecutor(ctx.scheduler)
    return ToolContext(problem=ctx.problem, world_size=ctx.world_size, device=ctx.device, shape=ctx.shape,
                       config=ctx.config, workdir=ctx.directory.path, gpus=gpus, answer_tokens=ctx.answer_tokens,
                       evaluate=as_evaluate(executor, spent), on_devices=as_device_call(executor, spent),
                       shell_solution=ctx.shell_solution, shell_timeout_s=ctx.shell_timeout_s,
                       shell_hide=(ctx.directory.path.resolve().parents[3],))


def run_tool_call(ctx: SampleContext, name: str, args: dict[str, Any]) -> tuple[ToolOutcome | None, float, str | None]:
    """One tool call: (ToolOutcome, GPU seconds, None) or (None, GPU seconds, error text for the model).

    GPU seconds are the tool's own figure where it reports one (CUDA), else the device lease it held, in
    seconds x ranks: on CPU that is the rank processes' time, so a GPU budget works the same way there.
    """
    if name not in ctx.condition.bound_tools:
        return None, 0.0, f"error: no tool named {name!r}; available: {', '.join(ctx.condition.bound_tools)}"
    spent: list[float] = []  # device seconds of the executor's evaluations and device calls
    try:
        outcome = run_tool(name, args, tool_context(ctx, gpus=None, spent=spent))
    except Exception as exc:  # a tool's failure is reported to the model, logged, and never ends the run
        if ctx.log is not None:
            ctx.log.exception("tool_failed", tool=name)
        return None, sum(spent), f"error: the {name} tool failed: {type(exc).__name__}: {exc}"[:2000]
    # What the executor held is the figure (agent.executors.request.device_seconds), as for the final scoring;
    # a tool's own figure only where nothing went through it.
    gpu_s = sum(spent) if spent else float(getattr(outcome, "gpu_seconds", 0.0) or 0.0)
    if ctx.log is not None:
        data = getattr(outcome, "data", {}) or {}
        ctx.log.info("tool", tool=name, verdict=data.get("verdict"), gpu_s=round(gpu_s, 3),
                     candidate=str(outcome.candidate) if outcome.candidate else None)
    return outcome, gpu_s, None


def candidate_entry(ctx: SampleContext, path: Path, tool: str | None, tool_call_id: str | None, message_id: str | None,
                    verdict: Any, speedup: Any = None, **progress: Any) -> dict[str, Any]:
    """The state's entry for one candidate; `progress`: what agent.final_scoring keeps for the trajectory
    (turn, correct, counted speedup, sha256, tokens and dollars spent so far)."""
    return {"index": int(path.stem), "path": ctx.directory.relative(path), "tool": tool,
            "tool_call_id": tool_call_id, "message_id": message_id, "verdict": verdict,
            "speedup": speedup if isinstance(speedup, (int, float)) else None, **progress}


def reply_candidate(ctx: SampleContext, code: str, message_id: str | None, source: str = "reply",
                    **progress: Any) -> dict[str, Any]:
    """candidates/NNN.py for code the model wrote in a reply (zero-shot, or an agent's last word), or (source
    "shell") the bash condition's solution file as the session ended."""
    text = code if code.endswith("\n") else code + "\n"
    path = save_candidate(tool_context(ctx, gpus=None), text)
    write_json_atomic(path.with_suffix(".json"), {"source": source, "message_id": message_id,
                                                  "candidate": ctx.directory.relative(path)})
    return candidate_entry(ctx, path, None, None, message_id, None,
                           sha256=hashlib.sha256(text.encode()).hexdigest(), **progress)
