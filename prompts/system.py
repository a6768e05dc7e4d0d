"""The system prompt of a condition (system.md with its tools, zero_shot.md without, bash.md for the shell)
and the answer-format paragraph, with the in-context example and the guide where it is given."""

from __future__ import annotations

from collections.abc import Sequence
from string import Template
from typing import Any

from prompts.guide import guide_sections, guide_text, tool_descriptions
from prompts.templates import (
    ANSWER_FORMATS_FILE,
    EXAMPLES,
    SHELL_REFERENCE,
    SHELL_SOLUTION,
    TOOLS_FILE,
    PromptError,
    load,
    markdown_sections,
    substitute,
)


def example_text() -> str:
    """The in-context examples, each as a fenced block under its file name."""
    blocks = [f"`{name}`:\n\n```python\n{load(f'examples/{name}').rstrip()}\n```" for name in EXAMPLES]
    return "\n\n".join(blocks)


def _guide_section(guide_in_prompt: bool, guide_tool: bool) -> str:
    if guide_in_prompt:
        return f"\n# Multi-GPU programming guide\n\n{guide_text()}\n"
    if guide_tool:
        topics = ", ".join(s.topic for s in guide_sections())
        return f"\nThe `guide` tool returns sections of a short multi-GPU programming guide ({topics}).\n"
    return ""


def render_system(condition_tools: Sequence[str], guide_in_prompt: bool) -> str:
    """The system prompt of a condition: zero_shot.md when it has no tools, else system.md listing them."""
    tools = list(condition_tools)
    guide = _guide_section(guide_in_prompt, "guide" in tools)
    if not tools:
        return substitute("zero_shot.md", guide_section=guide, example=example_text()).strip() + "\n"
    descriptions = tool_descriptions()
    unknown = [t for t in tools if t not in descriptions]
    if unknown:
        raise PromptError(f"no description in {TOOLS_FILE} for tool(s): {', '.join(unknown)}")
    tool_list = "\n".join(f"- `{t}`: {descriptions[t]}" for t in tools)
    return substitute("system.md", tool_list=tool_list, guide_section=guide, example=example_text()).strip() + "\n"


def render_bash_system(guide_in_prompt: bool, reference_file: str = SHELL_REFERENCE,
                       solution_file: str = SHELL_SOLUTION) -> str:
    """The bash condition's system prompt: a shell in a scratch folder, the harness's check as a command."""
    guide = _guide_section(guide_in_prompt, False)
    return substitute("bash.md", guide_section=guide, example=example_text(), reference_file=reference_file,
                       solution_file=solution_file).strip() + "\n"


def answer_format(name: str, **values: Any) -> str:
    """The answer-format paragraph of a condition: `reply` (a text reply or a tool's source) or `shell`."""
    sections = dict(markdown_sections(load(ANSWER_FORMATS_FILE)))
    if name not in sections:
        raise PromptError(f"{ANSWER_FORMATS_FILE}: no section {name!r}")
    return Template(sections[name]).substitute({k: str(v) for k, v in values.items()})
