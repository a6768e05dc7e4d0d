"""Context management for long agent loops: what is sent must fit the model's window, and stay cacheable.

Every code tool call carries a whole candidate file, so a transcript grows by a kernel at every turn. Tool
answers are bounded already (tools/render.py); candidates are what grows. Once the request would pass
`share` of the model's context window (agent/models.json, or --context-window), older candidates' sources
in the request are replaced by a one-line reference: the saved file, and what the tools measured on it.
The best candidate so far (correct, fastest) and the newest are always sent in full; the `recall` tool
brings any other back (tools/recall.py), and an old recall's answer is shortened the same way.

Shortening happens in batches: once the trigger is passed, candidates go oldest first until the request is
under `relief` of the trigger. Between batches the request grows only at its end, so the cached prefix
(agent.caching) survives most turns; each batch costs one cache rebuild from the first shortened message.
Which calls are shortened is kept in the graph's state, so a resumed sample sends the same bytes.

Sizes are counted with tiktoken (tools.render.count_tokens) and scaled by the ratio between what the
server reported for the previous request and what was counted for it, so a model with another tokenizer
(Claude's, SmolLM's) is measured in its own tokens after the first turn; before that a margin is used.
If even the shortest request is over the window, the sample stops with `context_full` before sending it.

The graph's messages are never changed: `prepare` returns the request's messages and the new state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from tools.render import count_tokens

DEFAULT_SHARE = 0.5
RELIEF = 0.7  # a batch shortens until the request is under RELIEF x the trigger
FIRST_RATIO = 1.25  # before the server has reported a size: tiktoken undercounts other tokenizers by up to this
RATIO_MARGIN = 1.05  # on top of the measured ratio
MESSAGE_OVERHEAD = 4  # role and separators, per message, as chat templates add them
RECALL = "recall"


@dataclass(frozen=True)
class ContextPolicy:
    window: int | None  # input tokens the model accepts; None: unknown, nothing is managed
    share: float = DEFAULT_SHARE

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"context share must be in (0, 1], got {self.share}")
        if self.window is not None and self.window <= 0:
            raise ValueError(f"context window must be positive, got {self.window}")

    @property
    def trigger(self) -> int | None:
        return None if self.window is None else int(self.window * self.share)


@dataclass
class ContextState:
    """What the graph keeps between turns (AgentState["context"])."""

    shortened: list[str] = field(default_factory=list)  # tool_call ids whose payload is replaced, in order
    ratio: float | None = None  # server tokens / counted tokens of the last request
    counted: int = 0  # tokens counted for the last request (before scaling)
    estimate: int = 0  # its scaled estimate
    batches: int = 0  # how many times shortening ran

    def as_dict(self) -> dict[str, Any]:
        return {"shortened": list(self.shortened), "ratio": self.ratio, "counted": self.counted,
                "estimate": self.estimate, "batches": self.batches}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ContextState:
        data = data or {}
        return cls(shortened=list(data.get("shortened") or []), ratio=data.get("ratio"),
                   counted=int(data.get("counted") or 0), estimate=int(data.get("estimate") or 0),
                   batches=int(data.get("batches") or 0))

    def observe(self, server_input_tokens: int) -> None:
        """Calibrate the count with what the server said the last request was."""
        if self.counted > 0 and server_input_tokens > 0:
            self.ratio = min(max(server_input_tokens / self.counted, 0.5), 4.0)


@dataclass(frozen=True)
class Prepared:
    messages: list[BaseMessage]
    state: ContextState
    estimate: int  # tokens, scaled
    overflow: bool  # over the window even with everything shortened
    newly_shortened: list[str]


def best_and_newest(candidates: Sequence[dict[str, Any]]) -> set[str]:
    """tool_call ids never shortened: the best candidate (correct, highest speedup, newest on ties) and the
    newest candidate."""
    keep: set[str] = set()
    with_call = [c for c in candidates if c.get("tool_call_id")]
    if with_call:
        keep.add(with_call[-1]["tool_call_id"])
    correct = [c for c in with_call if c.get("verdict") == "correct"]
    if correct:
        best = max(correct, key=lambda c: (float(c.get("speedup") or 0.0), int(c.get("index") or 0)))
        keep.add(best["tool_call_id"])
    return keep


def reference(entry: dict[str, Any], source: str) -> str:
    """The one line that stands for a shortened candidate's source."""
    said = [f"verdict {entry['verdict']}" if entry.get("verdict") else "not evaluated"]
    if isinstance(entry.get("speedup"), (int, float)):
        said.append(f"speedup {entry['speedup']:.3g}x")
    lines = source.count("\n") + (0 if source.endswith("\n") else 1)
    return (f"[candidate {entry['index']} ({entry['path']}, {lines} lines) shortened to save context; "
            f"{entry.get('tool') or 'tool'} said: {', '.join(said)}. recall(candidate={entry['index']}) returns "
            "the whole file.]")


def _recall_reference(message: ToolMessage) -> str:
    return ("[an earlier recall answer, shortened to save context; call recall again for the file.]"
            f" {str(message.content).splitlines()[0][:200] if message.content else ''}")


def render(messages: Sequence[BaseMessage], candidates: Sequence[dict[str, Any]],
           shortened: Sequence[str]) -> list[BaseMessage]:
    """The messages with the payloads of the `shortened` tool calls replaced (copies; the rest as they are)."""
    if not shortened:
        return list(messages)
    wanted = set(shortened)
    by_call = {c["tool_call_id"]: c for c in candidates if c.get("tool_call_id")}
    out: list[BaseMessage] = []
    for message in messages:
        if isinstance(message, AIMessage) and any(c.get("id") in wanted for c in message.tool_calls):
            out.append(_shorten_calls(message, wanted, by_call))
        elif isinstance(message, ToolMessage) and message.tool_call_id in wanted and message.name == RECALL:
            out.append(message.model_copy(update={"content": _recall_reference(message)}))
        else:
            out.append(message)
    return out


def _shorten_calls(message: AIMessage, wanted: set[str], by_call: dict[str, dict[str, Any]]) -> AIMessage:
    calls = []
    replaced: dict[str, dict[str, Any]] = {}
    for call in message.tool_calls:
        args = dict(call.get("args") or {})
        call_id = call.get("id")
        entry = by_call.get(call_id or "")
        if call_id in wanted and entry is not None and isinstance(args.get("source"), str):
            args["source"] = reference(entry, args["source"])
            replaced[call_id] = args
        calls.append({**call, "args": args})
    content = message.content
    if isinstance(content, list):  # Anthropic's tool_use blocks carry the input too; keep them in step
        content = [{**b, "input": replaced[b["id"]]} if isinstance(b, dict) and b.get("type") == "tool_use"
                   and b.get("id") in replaced else b for b in content]
    return message.model_copy(update={"tool_calls": calls, "content": content})


def count_message(message: BaseMessage) -> int:
    """tiktoken tokens of what a message sends: its text, and its tool calls' names and arguments."""
    content = message.content
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
    total = count_tokens(text) + MESSAGE_OVERHEAD
    if isinstance(message, AIMessage):
        for call in message.tool_calls:
            total += count_tokens(call.get("name") or "") + count_tokens(json.dumps(call.get("args") or {}))
    return total


def _shortenable(messages: Sequence[BaseMessage], candidates: Sequence[dict[str, Any]], done: set[str],
                 keep: set[str]) -> list[tuple[str, int]]:
    """(tool_call id, message index) that could still be shortened, oldest first: code calls with a saved
    candidate, and recall answers; never the best or newest candidate, never the newest message."""
    with_candidate = {c["tool_call_id"] for c in candidates if c.get("tool_call_id")}
    found: list[tuple[str, int]] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                cid = call.get("id") or ""
                if cid in with_candidate and cid not in done and cid not in keep \
                        and isinstance((call.get("args") or {}).get("source"), str):
                    found.append((cid, i))
        elif isinstance(message, ToolMessage) and message.name == RECALL and i != last \
                and message.tool_call_id not in done:
            found.append((message.tool_call_id, i))
    return found


def prepare(messages: Sequence[BaseMessage], candidates: Sequence[dict[str, Any]], policy: ContextPolicy,
            state: ContextState, *, tools_tokens: int = 0) -> Prepared:
    """The request's messages under `policy`, shortening another batch when the trigger is passed."""
    state = ContextState.from_dict(state.as_dict())
    ratio = (state.ratio * RATIO_MARGIN) if state.ratio is not None else FIRST_RATIO
    view = render(messages, candidates, state.shortened)
    counts = [count_message(m) for m in view]
    new: list[str] = []
    trigger = policy.trigger
    if trigger is not None and math.ceil((tools_tokens + sum(counts)) * ratio) > trigger:
        target = int(trigger * RELIEF)
        keep = best_and_newest(candidates)
        for cid, i in _shortenable(messages, candidates, set(state.shortened), keep):
            if math.ceil((tools_tokens + sum(counts)) * ratio) <= target:
                break
            new.append(cid)
            view[i] = render([messages[i]], candidates, [*state.shortened, *new])[0]
            counts[i] = count_message(view[i])
        if new:
            state.shortened.extend(new)
            state.batches += 1
    state.counted = tools_tokens + sum(counts)
    state.estimate = math.ceil(state.counted * ratio)
    overflow = policy.window is not None and state.estimate > policy.window
    return Prepared(view, state, state.estimate, overflow, new)


def tools_token_count(schemas: Sequence[dict[str, Any]]) -> int:
    """tiktoken tokens of the bound tools' schemas (sent with every request)."""
    return count_tokens(json.dumps(list(schemas), sort_keys=True)) if schemas else 0
