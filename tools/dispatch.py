"""Running one tool call: save the candidate the call carries, run the tool, record its result.

    from tools.dispatch import run_tool
    outcome = run_tool("check", {"source": code}, ctx)   # outcome.text for the model, outcome.data kept
"""

from __future__ import annotations

import traceback
from typing import Any

from tools import render
from tools.base import ToolContext, ToolInputError, ToolOutcome, save_candidate, save_record, source_arg
from tools.specs import BY_NAME, TOOL_NAMES


def run_tool(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    """Run one tool call: save the candidate (if the call carries one), run the tool, record the result.

    Bad arguments and harness failures come back as an outcome the model can read, with the details in
    `data`; they never raise into the agent loop.
    """
    spec = BY_NAME.get(name)
    if spec is None:
        text = f"unknown tool {name!r}; the tools are: {', '.join(TOOL_NAMES)}"
        return ToolOutcome(name, render.truncate(text, ctx.answer_tokens), {"tool": name, "error": "unknown_tool"})
    args = dict(args or {})
    try:
        source = source_arg(args, required=spec.source == "required") if spec.source != "none" else None
    except ToolInputError as err:
        return ToolOutcome(name, render.truncate(f"{name}: {err}", ctx.answer_tokens),
                           {"tool": name, "error": "bad_arguments", "message": str(err)})
    candidate = save_candidate(ctx, source) if source is not None else None
    try:
        outcome = spec.run(args, ctx, candidate)
    except ToolInputError as err:
        outcome = ToolOutcome(name, render.truncate(f"{name}: {err}", ctx.answer_tokens),
                              {"tool": name, "error": "bad_arguments", "message": str(err)}, candidate=candidate)
    except Exception as exc:  # the harness's own failure: reported as such, never charged to the model
        text = (f"{name}: the tool itself failed ({type(exc).__name__}: {exc}). This is an infrastructure "
                "error, not a verdict on your code; you may call the tool again.")
        outcome = ToolOutcome(name, render.truncate(text, ctx.answer_tokens),
                              {"tool": name, "verdict": "infra_error", "error": f"{type(exc).__name__}: {exc}",
                               "traceback": traceback.format_exc()[-4000:]}, candidate=candidate)
    save_record(outcome, ctx)
    return outcome
