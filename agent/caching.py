"""Prompt caching: what each provider needs so that every turn pays cache reads for all but its newest part.

Anthropic caches only where a request marks a breakpoint (`cache_control` on a content block; at most four
per request). The prefix is tools, then system, then messages, so `with_breakpoints` marks:

1. the system message: caches the tools and the system prompt (with the guide, when it is in the prompt);
2. the task message: the stable prefix, the same for every sample of a problem and condition;
3. the end of the previous request (the last message before the newest reply): the part the previous
   turn wrote, so this turn reads it whatever Anthropic's lookback window (20 blocks) would reach;
4. the newest message: written now, read by the next turn.

A breakpoint is metadata, not content: the cached bytes are the same with or without it, so moving the
rolling breakpoints forward does not change the prefix. Cache writes cost more than plain input (1.25x at
the 5-minute rate), reads a tenth: a 30-turn session pays one write for each message and a read of the
whole prefix at every turn (docs/models.md has the numbers).

OpenAI and compatible servers (vLLM and SGLang with prefix caching, llama.cpp's slot cache) cache any
prefix they saw before, automatically: nothing is marked, but the prefix must stay byte-identical across
turns. The loop ensures that: the system prompt, tools and task never change within a sample, earlier
messages are re-sent as they were, and the context manager (agent.context) shortens old candidates only
in batches, so the prefix breaks rarely.

The state's messages are never changed here: these functions return copies for one request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}  # the 5-minute cache, priced in agent/prices.json
MAX_BREAKPOINTS = 4  # Anthropic refuses a request with more


def uses_breakpoints(provider: str) -> bool:
    return provider == "anthropic"


def breakpoint_positions(messages: Sequence[BaseMessage], stable_prefix: int) -> list[int]:
    """Indexes of the messages that get a breakpoint (see the module docstring), in order, at most four."""
    if not messages:
        return []
    positions: list[int] = []
    if isinstance(messages[0], SystemMessage):
        positions.append(0)
    if 0 < stable_prefix <= len(messages):
        positions.append(stable_prefix - 1)
    last_reply = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None)
    if last_reply is not None and last_reply > 0:
        positions.append(last_reply - 1)
    positions.append(len(messages) - 1)
    unique = sorted(set(positions))
    return unique[-MAX_BREAKPOINTS:] if len(unique) > MAX_BREAKPOINTS else unique


def with_breakpoints(messages: Sequence[BaseMessage], stable_prefix: int) -> list[BaseMessage]:
    """Copies of `messages` with Anthropic cache breakpoints; `stable_prefix` is the number of messages of
    the fixed prompt (system + task)."""
    marked = set(breakpoint_positions(messages, stable_prefix))
    out: list[BaseMessage] = []
    for i, message in enumerate(as_blocks(messages)):
        out.append(_marked(message) if i in marked else message)
    return out


def as_blocks(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """User and tool messages with their text as one text block instead of a plain string.

    A breakpoint needs a block to sit on, and LangChain sends a plain string as it is: a tool result would
    go out as a string while unmarked and as a block list while marked, and those are different bytes, so
    the turn after a rolling breakpoint moved on would miss the cache. As blocks, always, the bytes are the
    same marked or not.
    """
    out: list[BaseMessage] = []
    for message in messages:
        if isinstance(message, (HumanMessage, ToolMessage)) and isinstance(message.content, str) and message.content:
            message = message.model_copy(update={"content": [{"type": "text", "text": message.content}]})
        out.append(message)
    return out


def _marked(message: BaseMessage) -> BaseMessage:
    """The message with cache_control on its last content block (a plain string becomes one text block)."""
    content = message.content
    if isinstance(content, str):
        blocks: list[Any] = [{"type": "text", "text": content, "cache_control": dict(CACHE_CONTROL)}]
        return message.model_copy(update={"content": blocks})
    blocks = [dict(b) if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    # Thinking blocks cannot carry a breakpoint; the last other block does.
    for block in reversed(blocks):
        if block.get("type") not in ("thinking", "redacted_thinking"):
            block["cache_control"] = dict(CACHE_CONTROL)
            break
    return message.model_copy(update={"content": blocks})


def for_request(messages: Sequence[BaseMessage], provider: str, *, enabled: bool,
                stable_prefix: int) -> list[BaseMessage]:
    """The messages as this provider's request should carry them."""
    if uses_breakpoints(provider):
        # The same bytes with caching on or off, so that the two can be compared (and only caching differs).
        return with_breakpoints(messages, stable_prefix) if enabled else as_blocks(messages)
    return list(messages)
