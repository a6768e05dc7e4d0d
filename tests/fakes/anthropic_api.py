"""An Anthropic messages server on 127.0.0.1 that enforces the rules the real one does, and caches.

Rules (each a 400 with Anthropic's error shape):
- with thinking enabled, the assistant message before the last tool results must start with a thinking
  (or redacted_thinking) block, and every thinking block sent back must be exactly one this server gave
  out: the text and its signature unchanged (the signature is an HMAC of the text);
- with thinking, no temperature other than 1; "enabled" thinking needs 1024 <= budget_tokens < max_tokens,
  and "adaptive" models refuse a budget ("enabled");
- every tool_result answers a tool_use of the assistant message right before it, and every tool_use is
  answered in the next user message;
- roles alternate, starting with user; at most 4 blocks carry cache_control;
- a prompt over the window: "prompt is too long: N tokens > M maximum".

Caching follows Anthropic's rules: the request is a sequence of blocks (tools, system, then each
message's content blocks); a block with cache_control is a breakpoint. A breakpoint's prefix (everything
up to and including it) is written to the cache, if it is at least `min_cache_tokens` long; a request reads
the longest earlier-written prefix that it repeats byte for byte, found at one of its breakpoints or up to
20 blocks before one. Reported: cache_read_input_tokens (that prefix), cache_creation_input_tokens (from
there to the last breakpoint, split by TTL in `cache_creation` as the real API does) and input_tokens
(the rest, after the last breakpoint). cache_control itself is not content: moving a breakpoint does not
change the bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.base import Answer, ApiError, Brain, FakeApi, Turn, fake_tokens

LOOKBACK = 20
MAX_BREAKPOINTS = 4
_KEY = b"pkb-fake-anthropic"


@dataclass(frozen=True)
class AnthropicModel:
    window: int
    thinking: str = "budget"  # "budget" ({type: enabled, budget_tokens}) or "adaptive"


def error(status: int, message: str, kind: str = "invalid_request_error") -> ApiError:
    return ApiError(status, {"type": "error", "error": {"type": kind, "message": message}})


def signature(thinking: str) -> str:
    return hmac.new(_KEY, thinking.encode(), hashlib.sha256).hexdigest()


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    return []


@dataclass
class AnthropicFake(FakeApi):
    brain: Brain = field(default=lambda turn, body: Turn(text="ok"))
    models: dict[str, AnthropicModel] = field(
        default_factory=lambda: {"claude-fake": AnthropicModel(200_000, "budget")})
    min_cache_tokens: int = 1024
    written: dict[str, int] = field(default_factory=dict)  # prefix hash -> its tokens
    usages: list[dict[str, Any]] = field(default_factory=list)
    count: Callable[[str], int] = fake_tokens  # the server's tokenizer

    def __post_init__(self) -> None:
        FakeApi.__init__(self)

    def handle(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        if not path.endswith("/v1/messages"):
            raise error(404, f"no route {path}", "not_found_error")
        name = body.get("model")
        model = self.models.get(name) if isinstance(name, str) else None
        if model is None:
            raise error(404, f"model: {name}", "not_found_error")
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise error(400, "max_tokens: Field required")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise error(400, "messages: at least one message is required")
        thinking = self._check_thinking(model, body, max_tokens)
        self._check_turns(messages)
        if thinking:
            self._check_thinking_blocks(messages)
        sequence = self._sequence(body)
        breakpoints = [i for i, (_, block) in enumerate(sequence) if "cache_control" in block]
        if len(breakpoints) > MAX_BREAKPOINTS:
            raise error(400, f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                             f"Found {len(breakpoints)}.")
        hashes, cumulative = self._prefixes(sequence)
        total = cumulative[-1] if cumulative else 0
        if total > model.window:
            raise error(400, f"prompt is too long: {total} tokens > {model.window} maximum")
        read, write = self._cache(breakpoints, hashes, cumulative)
        turns = sum(1 for m in messages if m.get("role") == "assistant")
        turn = self.brain(turns, body)
        content: list[dict[str, Any]] = []
        if thinking:
            text = turn.thinking or f"thinking about turn {turns}"
            content.append({"type": "thinking", "thinking": text, "signature": signature(text)})
        if turn.text:
            content.append({"type": "text", "text": turn.text})
        if turn.tool is not None:
            content.append({"type": "tool_use", "id": f"toolu_{turns:04d}", "name": turn.tool[0],
                            "input": turn.tool[1]})
        thought = self.count(content[0]["thinking"]) if thinking else 0
        output = self.count(json.dumps(content)) + turn.reasoning_tokens
        usage = {"input_tokens": total - read - write, "cache_read_input_tokens": read,
                 "cache_creation_input_tokens": write,
                 "cache_creation": {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0},
                 "output_tokens": output,
                 "output_tokens_details": {"thinking_tokens": thought + turn.reasoning_tokens}}
        self.usages.append(usage)
        return Answer(200, {"id": f"msg_{len(self.usages):04d}", "type": "message", "role": "assistant",
                            "model": name, "content": content,
                            "stop_reason": "tool_use" if turn.tool else "end_turn", "stop_sequence": None,
                            "usage": usage})

    # -- rules --------------------------------------------------------------------------------------
    @staticmethod
    def _check_thinking(model: AnthropicModel, body: dict[str, Any], max_tokens: int) -> bool:
        config = body.get("thinking")
        if not isinstance(config, dict) or config.get("type") in (None, "disabled"):
            return False
        if body.get("temperature") not in (None, 1):
            raise error(400, "`temperature` may only be set to 1 when thinking is enabled or in adaptive mode.")
        if config.get("type") == "enabled":
            if model.thinking == "adaptive":
                raise error(400, '`thinking.type: "enabled"` is not supported for this model; use adaptive '
                                 "thinking and output_config.effort.")
            budget = config.get("budget_tokens")
            if not isinstance(budget, int) or budget < 1024:
                raise error(400, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
            if budget >= max_tokens:
                raise error(400, "`max_tokens` must be greater than `thinking.budget_tokens`.")
        elif config.get("type") != "adaptive":
            raise error(400, f"thinking.type: unknown value {config.get('type')!r}")
        return True

    @staticmethod
    def _check_turns(messages: list[dict[str, Any]]) -> None:
        expected = "user"
        previous_uses: set[str] = set()
        for i, message in enumerate(messages):
            role = message.get("role")
            if role != expected:
                raise error(400, f"messages.{i}.role: roles must alternate between user and assistant, "
                                 "starting with user")
            blocks = _blocks(message.get("content"))
            if role == "user":
                results = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
                unknown = results - previous_uses
                if unknown:
                    raise error(400, f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` "
                                     f"blocks: {', '.join(sorted(map(str, unknown)))}. Each `tool_result` block "
                                     "must have a corresponding `tool_use` block in the previous message.")
                missing = previous_uses - results
                if missing:
                    raise error(400, f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                                     f"immediately after: {', '.join(sorted(missing))}. Each `tool_use` block must "
                                     "have a corresponding `tool_result` block in the next message.")
                previous_uses = set()
                expected = "assistant"
            else:
                previous_uses = {str(b["id"]) for b in blocks if b.get("type") == "tool_use" and "id" in b}
                expected = "user"

    @staticmethod
    def _check_thinking_blocks(messages: list[dict[str, Any]]) -> None:
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            for j, block in enumerate(_blocks(message.get("content"))):
                if block.get("type") == "thinking":
                    if not hmac.compare_digest(str(block.get("signature") or ""),
                                               signature(str(block.get("thinking") or ""))):
                        raise error(400, f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
        last_user = messages[-1]
        if last_user.get("role") != "user" or len(messages) < 2:
            return
        if any(b.get("type") == "tool_result" for b in _blocks(last_user.get("content"))):
            blocks = _blocks(messages[-2].get("content"))
            first = blocks[0].get("type") if blocks else None
            if first not in ("thinking", "redacted_thinking"):
                raise error(400, f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or "
                                 f"`redacted_thinking`, but found `{first}`. When `thinking` is enabled, a final "
                                 "`assistant` message must start with a thinking block (preceeding the lastmost "
                                 "set of `tool_use` and `tool_result` blocks).")

    # -- caching ------------------------------------------------------------------------------------
    @staticmethod
    def _sequence(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = [("tool", t) for t in body.get("tools") or []]
        system = body.get("system")
        out += [("system", b) for b in _blocks(system)] if system else []
        for message in body["messages"]:
            out += [(str(message.get("role")), b) for b in _blocks(message.get("content"))]
        return out

    def _prefixes(self, sequence: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[int]]:
        hashes: list[str] = []
        cumulative: list[int] = []
        digest, total = hashlib.sha256(), 0
        for role, block in sequence:
            plain = _without_cache_control(block)
            text = f"{role}:{json.dumps(plain, sort_keys=True)}"
            digest.update(text.encode())
            hashes.append(digest.copy().hexdigest())
            total += self.count(text)
            cumulative.append(total)
        return hashes, cumulative

    def _cache(self, breakpoints: list[int], hashes: list[str], cumulative: list[int]) -> tuple[int, int]:
        if not breakpoints:
            return 0, 0
        hit = -1
        for point in breakpoints:
            for j in range(point, max(point - LOOKBACK, -1), -1):
                if hashes[j] in self.written:
                    hit = max(hit, j)
                    break
        read = cumulative[hit] if hit >= 0 else 0
        last = breakpoints[-1]
        write = 0
        for point in breakpoints:
            if point > hit and cumulative[point] >= self.min_cache_tokens:
                self.written[hashes[point]] = cumulative[point]
        if last > hit and cumulative[last] >= self.min_cache_tokens:
            write = cumulative[last] - read
        return read, write


def _without_cache_control(block: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(out.get("content"), list):  # tool_result blocks nest content blocks
        out["content"] = [_without_cache_control(b) if isinstance(b, dict) else b for b in out["content"]]
    return out
