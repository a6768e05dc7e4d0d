"""The task prompt (task.md) for one problem at one named shape and world size."""

from __future__ import annotations

import importlib.util
import inspect
import json
from typing import Any

from prompts.guide import guide_text
from prompts.inputs import input_lines
from prompts.machine import target, topology_text
from prompts.source import reference_source
from prompts.system import answer_format
from prompts.templates import SHELL_SOLUTION, substitute


def _cupy_line() -> str:
    if importlib.util.find_spec("cupy") is not None:
        return "CuPy is installed on this machine."
    return "CuPy is not installed on this machine: use load_inline."


def render_task(problem: Any, shape: str, world_size: int, topology: dict[str, Any] | None,
                include_guide: bool, answer: str = "reply") -> str:
    """The task prompt for one problem at one named shape and world size (see the module docstring)."""
    dims = problem.shape(shape)
    signature = f"solution{inspect.signature(problem.solution)}"
    source = problem.source
    text = substitute(
        "task.md",
        name=problem.name, category=problem.category, codebase=source.get("codebase", "?"),
        source_path=source.get("path", "?"), symbol=source.get("symbol", "?"), summary=problem.summary,
        reference_source=reference_source(problem.path).strip(), signature=signature,
        dtype=str(problem.dtype).replace("torch.", ""), shape_name=shape, shape_json=json.dumps(dims),
        inputs=input_lines(problem.loader_spec, shape, world_size), world_size=world_size,
        atol=f"{problem.atol:g}", rtol=f"{problem.rtol:g}", topology=topology_text(topology),
        cupy=_cupy_line(), target=target(topology), answer_format=answer_format(answer, solution_file=SHELL_SOLUTION),
        guide_section=f"\n# Multi-GPU programming guide\n\n{guide_text()}\n" if include_guide else "",
    )
    return text.strip() + "\n"
