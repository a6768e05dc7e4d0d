"""The tools as LangChain tool objects, for `model.bind_tools(...)` and LangGraph's ToolNode.

Each tool is a StructuredTool with a pydantic argument schema ({"source": str} for the code tools, an
optional source for roofline, an optional topic for guide) and the description from prompts/tools.md.
It answers with the bounded text as the ToolMessage content and the outcome's JSON record as its artifact
(kept in the transcript and checkpoints); `on_outcome` also receives every ToolOutcome, for budgets
(GPU seconds) and for ending the sample on submit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field, create_model

import prompts
from tools import bash
from tools.base import ToolContext, ToolOutcome
from tools.dispatch import run_tool
from tools.specs import BASH_TOOL, BY_NAME, TOOL_NAMES


def args_schema(name: str) -> type[BaseModel]:
    """The pydantic model of one tool's arguments (from its ToolSpec), with descriptions from prompts/tools.md."""
    spec = BY_NAME.get(name)
    if spec is None:
        raise ValueError(f"unknown tool {name!r}; the tools are: {', '.join(TOOL_NAMES)}")
    described = prompts.arg_descriptions()
    fields: dict[str, Any] = {}
    if spec.source == "required":
        fields["source"] = (str, Field(description=described["source"]))
    elif spec.source == "optional":
        fields["source"] = (str | None, Field(None, description=described["source_optional"]))
    if spec.argument is not None:
        arg = spec.argument
        fields[arg.name] = ((arg.type, Field(description=described[arg.name])) if arg.required
                            else (arg.type | None, Field(None, description=described[arg.name])))
    return create_model(f"{name.capitalize()}Args", **fields)


def make_tool(name: str, ctx: ToolContext, on_outcome: Callable[[ToolOutcome], None] | None = None) -> BaseTool:
    descriptions = prompts.tool_descriptions()
    if name not in TOOL_NAMES or name not in descriptions:
        raise ValueError(f"unknown tool {name!r}; the tools are: {', '.join(TOOL_NAMES)}")

    def call(**kwargs: Any) -> tuple[str, dict[str, Any]]:
        outcome = run_tool(name, kwargs, ctx)
        if on_outcome is not None:
            on_outcome(outcome)
        return outcome.text, outcome.record()

    return StructuredTool.from_function(
        func=call, name=name, args_schema=args_schema(name),
        description=descriptions[name] + (f" {bash.limits_note(ctx)}" if name == BASH_TOOL else ""),
        response_format="content_and_artifact",
    )


def make_tools(names: Sequence[str], ctx: ToolContext,
               on_outcome: Callable[[ToolOutcome], None] | None = None) -> list[BaseTool]:
    """One LangChain tool per name, in the order given; an unknown name raises ValueError."""
    unknown = [n for n in names if n not in TOOL_NAMES]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(map(repr, unknown))}; the tools are: {', '.join(TOOL_NAMES)}")
    return [make_tool(name, ctx, on_outcome) for name in names]
