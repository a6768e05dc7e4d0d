"""An OpenAI chat-completions server on 127.0.0.1 that enforces the rules the real one does, and caches.

Rules (each a 400 with OpenAI's error shape, as the real API answers):
- a reasoning model refuses `temperature` (other than 1), `top_p`, `max_tokens` (it wants
  `max_completion_tokens`); a non-reasoning model refuses `reasoning_effort`;
- every `tool` message answers a tool call of the assistant message before it, and every tool call is
  answered before the next non-tool message;
- a prompt over the model's window is refused with code `context_length_exceeded`;
- an unknown model is a 404.

Caching is automatic, as OpenAI's: the prompt (tools, then messages, serialised in the order sent) is
compared with every earlier prompt; the longest common prefix, byte for byte, is reported as
`cached_tokens` when it is at least 1024 tokens, rounded down to a multiple of 128 (OpenAI's rule).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.base import Answer, ApiError, Brain, FakeApi, Turn, fake_tokens

MIN_CACHED = 1024
CACHE_STEP = 128


@dataclass(frozen=True)
class OpenAIModel:
    window: int
    reasoning: bool = False


def error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(status, {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                       "code": code}})


@dataclass
class OpenAIFake(FakeApi):
    brain: Brain = field(default=lambda turn, body: Turn(text="ok"))
    models: dict[str, OpenAIModel] = field(default_factory=lambda: {"gpt-fake": OpenAIModel(200_000, True)})
    cache: bool = True
    reasoning_content: bool = False  # answer like vLLM / llama.cpp with a reasoning text beside the reply
    prompts: list[str] = field(default_factory=list)  # every accepted prompt, serialised
    usages: list[dict[str, Any]] = field(default_factory=list)  # the usage of every answer, in order
    count: Callable[[str], int] = fake_tokens  # the server's tokenizer

    def __post_init__(self) -> None:
        FakeApi.__init__(self)

    def handle(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        if not path.endswith("/chat/completions"):
            raise error(404, f"no route {path}")
        name = body.get("model")
        model = self.models.get(name) if isinstance(name, str) else None
        if model is None:
            raise error(404, f"The model `{name}` does not exist or you do not have access to it.",
                        code="model_not_found")
        self._check_parameters(model, body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise error(400, "'messages' must be a non-empty array", param="messages")
        self._check_tool_order(messages)
        prompt = json.dumps(body.get("tools") or []) + "".join(json.dumps(m) for m in messages)
        tokens = self.count(prompt)
        if tokens > model.window:
            raise error(400, f"This model's maximum context length is {model.window} tokens. However, your "
                             f"messages resulted in {tokens} tokens. Please reduce the length of the messages.",
                        param="messages", code="context_length_exceeded")
        cached = self._cached(prompt) if self.cache else 0
        self.prompts.append(prompt)
        turns = sum(1 for m in messages if m.get("role") == "assistant")
        turn = self.brain(turns, body)
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.tool is not None:
            tool_name, args = turn.tool
            message["tool_calls"] = [{"id": f"call_{turns}", "type": "function",
                                      "function": {"name": tool_name, "arguments": json.dumps(args)}}]
        if self.reasoning_content and turn.thinking:
            message["reasoning_content"] = turn.thinking
        reasoning = turn.reasoning_tokens if model.reasoning else 0
        completion = self.count(json.dumps(message)) + reasoning
        usage = {"prompt_tokens": tokens, "completion_tokens": completion, "total_tokens": tokens + completion,
                 "prompt_tokens_details": {"cached_tokens": cached},
                 "completion_tokens_details": {"reasoning_tokens": reasoning}}
        self.usages.append(usage)
        return Answer(200, {"id": f"chatcmpl-{len(self.prompts)}", "object": "chat.completion",
                            "created": 1796000000, "model": name,
                            "choices": [{"index": 0, "message": message,
                                         "finish_reason": "tool_calls" if turn.tool else "stop"}],
                            "usage": usage})

    def _check_parameters(self, model: OpenAIModel, body: dict[str, Any]) -> None:
        if model.reasoning:
            temperature = body.get("temperature")
            if temperature is not None and temperature != 1:
                raise error(400, f"Unsupported value: 'temperature' does not support {temperature} with this "
                                 "model. Only the default (1) value is supported.", param="temperature",
                            code="unsupported_value")
            if body.get("top_p") not in (None, 1):
                raise error(400, "Unsupported parameter: 'top_p' is not supported with this model.",
                            param="top_p", code="unsupported_parameter")
            if "max_tokens" in body:
                raise error(400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                                 "'max_completion_tokens' instead.", param="max_tokens",
                            code="unsupported_parameter")
            effort = body.get("reasoning_effort")
            if effort is not None and effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
                raise error(400, f"Invalid value for 'reasoning_effort': {effort!r}", param="reasoning_effort")
        elif "reasoning_effort" in body:
            raise error(400, "Unrecognized request argument supplied: reasoning_effort", param="reasoning_effort")

    @staticmethod
    def _check_tool_order(messages: list[dict[str, Any]]) -> None:
        open_calls: set[str] = set()
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                raise error(400, f"Invalid value for 'messages[{i}].role': {role!r}", param=f"messages[{i}].role")
            if role == "tool":
                if m.get("tool_call_id") not in open_calls:
                    raise error(400, "Invalid parameter: messages with role 'tool' must be a response to a "
                                     "preceeding message with 'tool_calls'.", param=f"messages.[{i}].role")
                open_calls.discard(m["tool_call_id"])
                continue
            if open_calls:
                raise error(400, "An assistant message with 'tool_calls' must be followed by tool messages "
                                 "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                                 f"response messages: {', '.join(sorted(open_calls))}",
                            param=f"messages.[{i}].role")
            if role == "assistant":
                open_calls = {c.get("id") for c in m.get("tool_calls") or []}

    def _cached(self, prompt: str) -> int:
        best = max((common_prefix(earlier, prompt) for earlier in self.prompts), default=0)
        tokens = self.count(prompt[:best])
        return tokens // CACHE_STEP * CACHE_STEP if tokens >= MIN_CACHED else 0


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over slice comparisons, which run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
