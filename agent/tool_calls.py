"""How the agent loop runs one tool call: the tools' view of the sample (ToolContext), whose device work goes
through the sample's executor (this node's by default, a lease per evaluation), and the candidate entries the
graph's state keeps. agent.graph's `tools` node calls run_tool_call once per call of a reply.

The model's tool arguments are bounded before the reply enters the graph's state (`bound_reply`): a call
over tools.base's limits becomes an invalid call whose error is the refusal, its arguments dropped, so
neither the checkpoints nor the transcript keep them; the model reads the refusal as the call's answer.

A tool call runs within what is left of the sample's wall budget (`wall_left`): a shell command is killed
when it runs out, and every time limit of a harness evaluation (compile, start, load, check, build,
timing, the reference's steps) is at most what was left when the call began; an evaluation cut that way
reads as that phase's timeout in its record, and the sample then stops with max_wall. The phases together
are bounded too: the tool's harness work, queueing included, ends at ToolContext.deadline (tools.base
.within_deadline), and the model reads that the wall budget ran out.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage

from agent.executors.interface import as_device_call, as_evaluate
from agent.executors.local import LocalExecutor
from agent.rundir import write_json_atomic
from agent.sample_context import SampleContext
from harness.config import EvalConfig
from tools.base import ToolContext, ToolOutcome, argument_refusal, save_candidate
from tools.dispatch import run_tool

REFUSED = "refused: "  # how an invalid call's error says bound_reply refused it (its answer is the refusal)
RAW_KEEP = 2_000  # characters of an unparsable call's raw arguments kept in the state
LEAST_TOOL_S = 1.0  # the shortest time limit a tool is given (a limit must be positive)
# Limits of harness.config.Limits that are not a phase's time limit: not cut to the wall budget.
_NOT_PHASES = frozenset({"grace_s", "reference_slack_s"})


def within_wall(config: EvalConfig, wall_left: float | None) -> EvalConfig:
    """`config` with every phase's time limit at most `wall_left` seconds (None: as it is)."""
    if wall_left is None:
        return config
    cap = max(wall_left, LEAST_TOOL_S)
    limits = config.limits
    cut = {name: min(value, cap) for name, value in limits.model_dump().items()
           if name.endswith("_s") and name not in _NOT_PHASES}
    return config.model_copy(update={"limits": limits.model_copy(update=cut)})


def bound_reply(reply: AIMessage) -> AIMessage:
    """The reply as the state keeps it (see the module doc): refused calls made invalid, without arguments;
    unparsable calls' raw arguments cut to RAW_KEEP characters."""
    refused = {}
    for call in reply.tool_calls:
        why = argument_refusal(call["name"], call.get("args"))
        if why is not None:
            refused[call.get("id") or ""] = why
    long_raw = any(isinstance(bad.get("args"), str) and len(bad["args"] or "") > RAW_KEEP
                   for bad in reply.invalid_tool_calls)
    if not refused and not long_raw:
        return reply
    invalid: list[Any] = [{**bad, "args": _cut(bad.get("args"))} for bad in reply.invalid_tool_calls]
    invalid += [{"type": "invalid_tool_call", "name": call["name"], "id": call.get("id"), "args": "{}",
                 "error": REFUSED + refused[call.get("id") or ""]}
                for call in reply.tool_calls if (call.get("id") or "") in refused]
    content: Any = reply.content
    if isinstance(content, list):  # Anthropic's tool_use blocks carry the arguments too
        content = [{**b, "input": {}} if isinstance(b, dict) and b.get("type") == "tool_use"
                   and (b.get("id") or "") in refused else b for b in content]
    extra = dict(reply.additional_kwargs)
    if isinstance(extra.get("tool_calls"), list):  # the raw OpenAI calls some integrations keep
        extra["tool_calls"] = [_raw_refused(raw) if isinstance(raw, dict) and (raw.get("id") or "") in refused
                               else raw for raw in extra["tool_calls"]]
    return reply.model_copy(update={
        "tool_calls": [c for c in reply.tool_calls if (c.get("id") or "") not in refused],
        "invalid_tool_calls": invalid, "content": content, "additional_kwargs": extra})


def _cut(raw: Any) -> Any:
    if isinstance(raw, str) and len(raw) > RAW_KEEP:
        return f"{raw[:RAW_KEEP]}[... {len(raw) - RAW_KEEP} characters cut]"
    return raw


def _raw_refused(raw: dict[str, Any]) -> dict[str, Any]:
    function = raw.get("function")
    return {**raw, "function": {**function, "arguments": "{}"}} if isinstance(function, dict) else raw


def invalid_call_answer(bad: dict[str, Any]) -> str:
    """The answer to a call that was not run: the refusal (bound_reply), or the parser's error."""
    error = str(bad.get("error") or "invalid JSON")
    if error.startswith(REFUSED):
        return f"error: {error[len(REFUSED):]}"
    return (f"error: the arguments of this {bad.get('name') or 'tool'} call could not be parsed ({error}); send "
            "them again as a JSON object")


def tool_context(ctx: SampleContext, gpus: list[int] | None, spent: list[float] | None = None,
                 wall_left: float | None = None) -> ToolContext:
    """The tools' view of the sample. Their device work goes through the sample's executor, else this node's
    (a LocalExecutor over the scheduler: native code is built before the devices are taken), as the final
    scoring's does (agent.scoring); each evaluation's device seconds are added to `spent`. `wall_left`: the
    seconds of the sample's wall budget left, which bound the shell's commands, the harness's phases and the
    whole of each evaluation (`deadline`)."""
    executor = ctx.executor if ctx.executor is not None else LocalExecutor(ctx.scheduler)
    shell_s = ctx.shell_timeout_s if wall_left is None else min(ctx.shell_timeout_s, max(wall_left, LEAST_TOOL_S))
    deadline = None if wall_left is None else time.monotonic() + max(wall_left, LEAST_TOOL_S)
    return ToolContext(problem=ctx.problem, settings=ctx.run, config=within_wall(ctx.config, wall_left),
                       workdir=ctx.directory.path, gpus=gpus,
                       evaluate=as_evaluate(executor, spent), on_devices=as_device_call(executor, spent),
                       shell_solution=ctx.shell_solution, shell_timeout_s=shell_s,
                       shell_hide=(ctx.directory.path.resolve().parents[3],), deadline=deadline)


def run_tool_call(ctx: SampleContext, name: str, args: dict[str, Any],
                  wall_left: float | None = None) -> tuple[ToolOutcome | None, float, str | None]:
    """One tool call: (ToolOutcome, GPU seconds, None) or (None, GPU seconds, error text for the model).

    GPU seconds are the tool's own figure where it reports one (CUDA), else the device lease it held, in
    seconds x ranks: on CPU that is the rank processes' time, so a GPU budget works the same way there.
    """
    if name not in ctx.condition.bound_tools:
        return None, 0.0, f"error: no tool named {name!r}; available: {', '.join(ctx.condition.bound_tools)}"
    spent: list[float] = []  # device seconds of the executor's evaluations and device calls
    try:
        outcome = run_tool(name, args, tool_context(ctx, gpus=None, spent=spent, wall_left=wall_left))
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
