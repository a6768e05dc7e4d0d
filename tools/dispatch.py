"""Running one tool call: save the candidate the call carries, run the tool, record its result.

    from tools.dispatch import run_tool
    outcome = run_tool("check", {"source": code}, ctx)   # outcome.text for the model, outcome.data kept
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from tools import render
from tools.base import (
    ToolContext,
    ToolInputError,
    ToolOutcome,
    argument_refusal,
    save_candidate,
    save_record,
    source_arg,
)
from tools.specs import BY_NAME, TOOL_NAMES


def run_tool(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    """Run one tool call: save the candidate (if the call carries one), run the tool, record the result.

    Bad arguments and harness failures come back as an outcome the model can read, with the details in
    `data`; they never raise into the agent loop. Bad arguments (over the size or nesting limits, unusable by
    the tool) are the model's error: no verdict, no infra_error, nothing saved.
    """
    spec = BY_NAME.get(name)
    if spec is None:
        text = f"unknown tool {name!r}; the tools are: {', '.join(TOOL_NAMES)}"
        return ToolOutcome(name, render.truncate(text, ctx.answer_tokens), {"tool": name, "error": "unknown_tool"})
    refusal = argument_refusal(name, {} if args is None else args)
    if refusal is not None:
        return _bad_arguments(name, refusal, ctx)
    args = dict(args or {})
    try:
        source = source_arg(args, required=spec.source == "required") if spec.source != "none" else None
    except ToolInputError as err:
        return _bad_arguments(name, f"{name}: {err}", ctx)
    candidate = save_candidate(ctx, source) if source is not None else None
    try:
        outcome = spec.run(args, ctx, candidate)
    except ToolInputError as err:
        outcome = _bad_arguments(name, f"{name}: {err}", ctx)
        outcome.candidate = candidate
    except Exception as exc:  # noqa: BLE001 - a tool call always ends with an answer
        outcome = _unexpected(name, exc, ctx, candidate)
    save_record(outcome, ctx)
    return outcome


def _bad_arguments(name: str, message: str, ctx: ToolContext) -> ToolOutcome:
    """The model's own error: what was wrong, with no verdict and no invitation to try the same call again."""
    return ToolOutcome(name, render.truncate(message, ctx.answer_tokens),
                       {"tool": name, "error": "bad_arguments", "message": message})


def _unexpected(name: str, exc: Exception, ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    """A tool that raised. The harness turns every failure a candidate can cause into a verdict, so this is
    rare; with a candidate involved it still counts as the candidate's runtime_error (fail closed: an
    infra_error would invite the model to call again for another draw). Without one, it is the harness's."""
    error = f"{type(exc).__name__}: {exc}"
    data: dict[str, Any] = {"tool": name, "error": error, "traceback": traceback.format_exc()[-4000:]}
    if candidate is not None:
        text = (f"{name}: the tool failed while handling this candidate ({error}); this counts as the candidate's "
                "runtime_error.")
        data.update(verdict="runtime_error")
    else:
        text = (f"{name}: the tool itself failed ({error}). This is an infrastructure error, not a verdict on your "
                "code; you may call the tool again.")
        data.update(verdict="infra_error", infra_cause="harness")
    return ToolOutcome(name, render.truncate(text, ctx.answer_tokens), data, candidate=candidate)
