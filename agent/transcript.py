"""The conversation as docs/run-layout.md's transcript.json keeps it, and what is read off a model's reply
(its text, the reasoning the API returned, why the server stopped generating)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from agent.rundir import SampleDir, write_json_atomic
from agent.usage import usage_of


def finish_reason(message: BaseMessage) -> str | None:
    """Why the server stopped generating: OpenAI's finish_reason (stop, length, tool_calls) or Anthropic's
    stop_reason (end_turn, max_tokens, tool_use)."""
    meta = getattr(message, "response_metadata", None) or {}
    value = meta.get("finish_reason") or meta.get("stop_reason")
    return str(value) if value else None


def reasoning_text(message: BaseMessage) -> str | None:
    """The reasoning the API returned with a reply: Anthropic's (summarized) thinking blocks, or a compatible
    server's reasoning_content. None where there is none (OpenAI's chat completions return only a count)."""
    parts: list[str] = []
    if isinstance(message.content, list):
        for block in message.content:
            if isinstance(block, dict) and block.get("type") == "thinking" and block.get("thinking"):
                parts.append(str(block["thinking"]))
            elif isinstance(block, dict) and block.get("type") == "redacted_thinking":
                parts.append("[redacted thinking]")
    extra = message.additional_kwargs.get("reasoning_content")
    if isinstance(extra, str) and extra:
        parts.append(extra)
    return "\n\n".join(parts) if parts else None


def message_text(message: BaseMessage) -> str:
    """The text of a message whose content may be a list of blocks (Anthropic's replies are)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def transcript(messages: list[BaseMessage], candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation in docs/run-layout.md's transcript schema."""
    by_call = {c["tool_call_id"]: c["path"] for c in candidates if c.get("tool_call_id")}
    by_message = {c["message_id"]: c["path"] for c in candidates if c.get("message_id")}
    out: list[dict[str, Any]] = []
    for m in messages:
        entry: dict[str, Any] = {"content": m.content}
        if isinstance(m, SystemMessage):
            entry["role"] = "system"
        elif isinstance(m, HumanMessage):
            entry["role"] = "user"
        elif isinstance(m, AIMessage):
            entry["role"] = "assistant"
            entry["tool_calls"] = [{"id": c.get("id"), "name": c["name"], "args": c.get("args", {})}
                                   for c in m.tool_calls]
            entry["tool_calls"] += [{"id": c.get("id"), "name": c.get("name") or "", "args": {"raw": c.get("args")},
                                     "invalid": c.get("error") or True} for c in m.invalid_tool_calls]
            usage = usage_of(m)
            if usage is not None:
                entry["usage"] = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                                  "cache_read_tokens": usage.cache_read_tokens,
                                  "cache_write_tokens": usage.cache_write_tokens,
                                  "reasoning_tokens": usage.reasoning_tokens}
            if (reason := finish_reason(m)) is not None:
                entry["finish_reason"] = reason
            if (thought := reasoning_text(m)) is not None:
                entry["reasoning"] = thought
            if m.id in by_message:
                entry["candidate"] = by_message[m.id]
        elif isinstance(m, ToolMessage):
            entry.update(role="tool", tool_call_id=m.tool_call_id, name=m.name)
            if m.tool_call_id in by_call:
                entry["candidate"] = by_call[m.tool_call_id]
        else:
            entry["role"] = m.type
        out.append(entry)
    return out


def write_transcript(directory: SampleDir, messages: list[BaseMessage], candidates: list[dict[str, Any]]) -> None:
    write_json_atomic(directory.transcript_json, transcript(messages, candidates))

