"""The programming guide (guide.md) and the tools' descriptions (tools.md), section by section."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from string import Template

from prompts.templates import GUIDE_FILE, TOOLS_FILE, PromptError, load, markdown_sections


@dataclass(frozen=True)
class GuideSection:
    topic: str  # the short name the `guide` tool takes
    title: str
    body: str

    def text(self) -> str:
        return f"## {self.title}\n\n{self.body}"


@lru_cache(maxsize=1)
def guide_sections() -> tuple[GuideSection, ...]:
    """The guide's sections; a heading reads `## topic: Title`."""
    sections = []
    for heading, body in markdown_sections(load(GUIDE_FILE)):
        topic, sep, title = heading.partition(":")
        if not sep:
            raise PromptError(f"{GUIDE_FILE}: heading {heading!r} must read 'topic: Title'")
        sections.append(GuideSection(topic.strip(), title.strip(), body))
    return tuple(sections)


def guide_text() -> str:
    """The whole guide as one markdown text (for the prompt)."""
    return "\n\n".join(s.text() for s in guide_sections())


@lru_cache(maxsize=1)
def _tool_sections() -> dict[str, str]:
    topics = ", ".join(s.topic for s in guide_sections())
    sections = dict(markdown_sections(load(TOOLS_FILE)))
    return {name: Template(body).substitute(topics=topics) for name, body in sections.items()}


def tool_descriptions() -> dict[str, str]:
    """Each tool's description from tools.md, as one paragraph."""
    return {name: " ".join(body.split()) for name, body in _tool_sections().items() if name != "args"}


def arg_descriptions() -> dict[str, str]:
    """Argument descriptions from the `## args` section of tools.md (`- name: text` lines)."""
    args = {}
    for line in _tool_sections().get("args", "").splitlines():
        match = re.match(r"^-\s*(\w+):\s*(.+)$", line.strip())
        if match:
            args[match.group(1)] = match.group(2).strip()
    return args
