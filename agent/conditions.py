"""Experimental conditions are configuration, not code: zero-shot, an agent with a tool subset, or replay.

Names (docs/run-layout.md): `zero-shot`; `agent:<tool>+<tool>...` with the tools sorted by name, e.g.
`agent:bench+check+compile`; `bash`, an agent with one sandboxed shell in the sample's scratch folder and the
harness's check as a command in it (PKB's own agent has bash only); `replay` for solution files read from a
directory. A plain `agent` means
every ablatable tool, or the ones `--tools` names. `submit` and `recall` are not part of a condition's
name: every agent can submit (it is how a sample ends) and recall its own earlier candidates, so only the
feedback tools are ablated.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from tools.specs import BASH_TOOL, TOOL_NAMES

SUBMIT = "submit"
# Always given to an agent, never ablated: it only returns the model's own earlier candidate, which the
# loop may have shortened in a long conversation (agent.context); binding it from the first turn keeps the
# tool list, and so the cached prompt prefix, the same at every turn.
RECALL = "recall"
# The feedback tools a condition may pick from, in name order.
# The shell is a condition of its own (`bash`), not a feedback tool to mix with the structured ones.
AGENT_TOOLS: tuple[str, ...] = tuple(sorted(name for name in TOOL_NAMES if name not in (SUBMIT, RECALL, BASH_TOOL)))

Kind = Literal["zero-shot", "agent", "bash", "replay"]
# Final: each name keeps its literal type, so Condition(AGENT) type-checks as a Kind.
ZERO_SHOT: Final = "zero-shot"
AGENT: Final = "agent"
BASH: Final = "bash"
REPLAY: Final = "replay"
TOOL_USING: tuple[str, ...] = (AGENT, BASH)  # the kinds whose model is given tools and loops


class ConditionError(ValueError):
    """A condition or tool list that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Condition:
    kind: Kind
    tools: tuple[str, ...] = ()  # the feedback tools of an agent condition, sorted; empty otherwise

    @property
    def name(self) -> str:
        if self.kind == AGENT:
            return f"{AGENT}:{'+'.join(self.tools)}"
        return self.kind

    @property
    def bound_tools(self) -> tuple[str, ...]:
        """What the model is given: the condition's tools plus recall and submit (an agent), the shell alone
        (bash: the sample ends with a reply that runs no command, and the file it wrote is scored), nothing
        otherwise."""
        if self.kind == AGENT:
            return (*self.tools, RECALL, SUBMIT)
        return (BASH_TOOL,) if self.kind == BASH else ()

    @property
    def uses_tools(self) -> bool:
        return self.kind in TOOL_USING

    @property
    def uses_model(self) -> bool:
        return self.kind != REPLAY

    def __str__(self) -> str:
        return self.name


def parse_tools(text: str | Iterable[str]) -> tuple[str, ...]:
    """Tool names from "compile,check" / "compile+check" (or a list), checked and sorted."""
    parts = text.replace("+", ",").split(",") if isinstance(text, str) else list(text)
    names = [p.strip() for p in parts if p.strip()]
    if not names:
        raise ConditionError(f"no tool named; choose from {', '.join(AGENT_TOOLS)}")
    unknown = [n for n in names if n not in AGENT_TOOLS]
    for always in (SUBMIT, RECALL):
        if always in unknown:
            raise ConditionError(f"'{always}' is always given to an agent; choose feedback tools from "
                                 f"{', '.join(AGENT_TOOLS)}")
    if unknown:
        raise ConditionError(f"unknown tool {unknown[0]!r}; choose from {', '.join(AGENT_TOOLS)}")
    return tuple(sorted(set(names)))


def parse_condition(text: str, tools: str | Sequence[str] | None = None) -> Condition:
    """One condition: "zero-shot", "agent" (every tool, or `tools`), "agent:compile+check", "replay"."""
    text = text.strip()
    kind, sep, listed = text.partition(":")
    kind = kind.strip().lower()
    if kind == ZERO_SHOT and not sep:
        if tools:
            raise ConditionError("--tools applies to agent conditions; zero-shot has no tools")
        return Condition(ZERO_SHOT)
    if kind == REPLAY and not sep:
        return Condition(REPLAY)
    if kind == BASH and not sep:
        if tools:
            raise ConditionError("--tools applies to agent conditions; bash has its shell only")
        return Condition(BASH)
    if kind == AGENT:
        if sep and tools:
            parsed, given = parse_tools(listed), parse_tools(tools)
            if parsed != given:
                raise ConditionError(f"condition {text!r} and --tools {','.join(given)} disagree; give the tools once")
            return Condition(AGENT, parsed)
        if sep:
            return Condition(AGENT, parse_tools(listed))
        return Condition(AGENT, parse_tools(tools) if tools else AGENT_TOOLS)
    raise ConditionError(f"unknown condition {text!r}: use zero-shot, agent, agent:<tool>+<tool> or bash "
                         f"(tools: {', '.join(AGENT_TOOLS)})")


def parse_conditions(texts: str | Sequence[str], tools: str | Sequence[str] | None = None) -> list[Condition]:
    """Several conditions, comma-separated or repeated; `tools` applies to each plain `agent`."""
    items = [texts] if isinstance(texts, str) else list(texts)
    parts = [p.strip() for item in items for p in item.split(",") if p.strip()]
    if not parts:
        raise ConditionError("no condition given: use zero-shot, agent, agent:<tool>+<tool> or bash")
    conditions: list[Condition] = []
    for part in parts:
        is_agent = part.lower().startswith(AGENT)
        condition = parse_condition(part, tools if is_agent else None)
        if condition not in conditions:
            conditions.append(condition)
    if tools and not any(c.kind == AGENT for c in conditions):
        raise ConditionError("--tools applies to agent conditions; none was given")
    return conditions
