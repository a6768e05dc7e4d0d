"""`guide`: sections of the multi-GPU programming guide (prompts/guide.md), chosen by an optional topic.

Whether the model gets the guide at all, in the prompt or through this tool, is an ablation axis set by
the condition; this tool only reads the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import prompts
from tools.base import ToolContext, ToolInputError, ToolOutcome, bounded
from tools.render import Block


def _topic_list() -> str:
    return "; ".join(f"{s.topic} ({s.title})" for s in prompts.guide_sections())


def select(topic: str) -> list[prompts.GuideSection]:
    """Sections whose topic equals `topic`, else those whose topic or title contains it (case-insensitive)."""
    wanted = topic.strip().lower()
    sections = prompts.guide_sections()
    exact = [s for s in sections if s.topic.lower() == wanted]
    return exact or [s for s in sections if wanted in s.topic.lower() or wanted in s.title.lower()]


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    topic = args.get("topic")
    if topic is not None and not isinstance(topic, str):
        raise ToolInputError(f"`topic` must be a string, got {type(topic).__name__}")
    if not topic or not topic.strip():
        text = bounded(ctx, [f"guide topics: {_topic_list()}.",
                             "Call guide with one topic name for that section."])
        return ToolOutcome("guide", text, {"tool": "guide", "topic": None, "sections": []})
    chosen = select(topic)
    if not chosen:
        text = bounded(ctx, [f"guide: no section matches {topic!r}. Topics: {_topic_list()}."])
        return ToolOutcome("guide", text, {"tool": "guide", "topic": topic, "sections": []})
    blocks = [Block(s.text()) for s in chosen]
    return ToolOutcome("guide", bounded(ctx, blocks), {"tool": "guide", "topic": topic,
                                                       "sections": [s.topic for s in chosen]})
