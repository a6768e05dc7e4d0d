"""Every tool the model may call, defined once.

A ToolSpec says what a tool is called, whether a call carries the candidate's source (required, optional or
not at all), its other argument, and whether it needs a device (runs ranks, so the agent loop takes a
device lease first). Everything else is derived here: the name lists the conditions, the dispatcher and
the LangChain schemas use. A tool's body is `run(args, ctx, candidate)` in the module tools/<name>.py.

This module imports nothing of the harness: the conditions, the report and `pkb --help` read the tools'
names without loading torch. The tool modules (which import the harness) are imported when a tool runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tools.base import ToolContext, ToolOutcome

Source = Literal["required", "optional", "none"]
# A tool's body: (the call's arguments, the context, the saved candidate or None) -> outcome.
ToolFn = Callable[[dict[str, Any], "ToolContext", "Path | None"], "ToolOutcome"]


@dataclass(frozen=True)
class Argument:
    """One argument of a tool besides `source`; its description is prompts/tools.md's `## args` entry."""

    name: str
    type: type
    required: bool


BASH_TOOL = "bash"
# Commands of the bash tool that the harness runs (from the trusted side, on the file named, default the
# condition's solution file) instead of the shell: the check and the benchmark, reachable from the shell.
SHELL_HARNESS_COMMANDS: dict[str, str] = {"pkb-check": "check", "pkb-bench": "bench"}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    source: Source  # does a call carry the candidate's complete file?
    argument: Argument | None = None

    @property
    def module(self) -> str:
        return f"tools.{self.name}"

    @property
    def run(self) -> ToolFn:
        """The tool's body, tools/<name>.py's run()."""
        # Deferred on purpose: tool modules import the harness (torch); the facts above are read without it.
        fn: ToolFn = importlib.import_module(self.module).run
        return fn


SPECS: tuple[ToolSpec, ...] = (
    ToolSpec("compile", "required"),  # builds in a process of its own, holds no GPU
    ToolSpec("check", "required"),
    ToolSpec("bench", "required"),
    ToolSpec("profile", "required"),
    ToolSpec("roofline", "optional"),  # without source: the bound of the reference alone
    ToolSpec("submit", "required"),  # records the file; the final scoring runs it later
    ToolSpec("guide", "none", argument=Argument("topic", str, required=False)),
    ToolSpec("recall", "none", argument=Argument("candidate", int, required=True)),
    # A shell command in the sample's sandboxed scratch folder; its harness commands take the devices.
    ToolSpec(BASH_TOOL, "none", argument=Argument("command", str, required=True)),
)
BY_NAME: dict[str, ToolSpec] = {s.name: s for s in SPECS}

TOOL_NAMES: tuple[str, ...] = tuple(s.name for s in SPECS)
