"""What one sample may spend, what it has spent, and the reason it stops when a limit is reached.

Limits are per sample: model turns (calls), input tokens, output tokens, dollars, wall-clock seconds and
GPU seconds (device time the sample's tool evaluations held). Dollars are what was billed: cache reads at
the read rate, cache writes at the write rate, reasoning at the output rate (agent.usage); the token
limits count every token the model read or wrote, cached or not. A limit of None is no limit. A limit is
reached when the amount spent is at or above it. Turns are checked before a model call (the reply of
the last allowed turn is still acted on); the others are checked after every model reply and every
round of tool calls, so no tool runs on a budget already spent.

Tokens and dollars are also checked within a request, before it is sent (`before_request`): a prompt that
alone would take the input tokens or the dollars over their limit is not sent (the prompt is the
request's estimate, agent.context, priced at the uncached input rate), and what is left of the output
tokens and the dollars caps the reply's `max_tokens` (agent.reasoning.reply_limit sends it). A model
that honours its reply limit therefore never takes a budget over; the input tokens can go over only by
the estimate's error. A model the price table does not list has no dollar cap (its cost is unknown).

What was spent lives in the agent's graph state (as `Spent.as_dict()`), so a sample resumed from its
checkpoint keeps counting where it stopped; the time a killed run lay dead is not charged to it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agent.stop_reasons import StopReason
from agent.usage import Price, Usage

# The stop reasons of the limits (agent.stop_reasons), by the names the callers know them by.
MAX_TURNS = StopReason.MAX_TURNS
MAX_INPUT_TOKENS = StopReason.MAX_INPUT_TOKENS
MAX_OUTPUT_TOKENS = StopReason.MAX_OUTPUT_TOKENS
MAX_COST = StopReason.MAX_COST
MAX_WALL = StopReason.MAX_WALL
MAX_GPU = StopReason.MAX_GPU


@dataclass(frozen=True)
class Budget:
    max_turns: int | None = 30
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost_usd: float | None = None
    max_wall_s: float | None = 7200.0
    max_gpu_s: float | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value <= 0:
                raise ValueError(f"budget {name} must be positive (or None for no limit), got {value}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Spent:
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    # Parts of the two above, as the server reported them: billed at the cache and output rates.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True  # False once a reply's cost could not be priced (model not in the table)
    usage_reported: bool = True  # False once a reply came without token counts
    wall_s: float = 0.0
    gpu_s: float = 0.0
    tool_calls: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Spent:
        data = data or {}
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class RequestLimit:
    """What the budgets allow the next request: `stop` (not sent), else the reply's `max_tokens` (None: no
    budget limits it), with the one line that says why."""

    stop: StopReason | None
    max_tokens: int | None
    why: str = ""


class BudgetTracker:
    """Records what a sample spends against its Budget; `stop_reason()` names the first limit reached."""

    def __init__(self, budget: Budget, spent: Spent | None = None) -> None:
        self.budget = budget
        self.spent = spent or Spent()

    def record_model_call(self, usage: Usage | None, cost_usd: float | None) -> None:
        s = self.spent
        self.spent = replace(
            s,
            turns=s.turns + 1,
            input_tokens=s.input_tokens + (usage.input_tokens if usage else 0),
            output_tokens=s.output_tokens + (usage.output_tokens if usage else 0),
            cache_read_tokens=s.cache_read_tokens + (usage.cache_read_tokens if usage else 0),
            cache_write_tokens=s.cache_write_tokens + (usage.cache_write_tokens if usage else 0),
            reasoning_tokens=s.reasoning_tokens + (usage.reasoning_tokens if usage else 0),
            cost_usd=s.cost_usd + (cost_usd or 0.0),
            cost_known=s.cost_known and cost_usd is not None,
            usage_reported=s.usage_reported and usage is not None,
        )

    def record_tool(self, name: str, gpu_s: float) -> None:
        calls = dict(self.spent.tool_calls)
        calls[name] = calls.get(name, 0) + 1
        self.spent = replace(self.spent, gpu_s=self.spent.gpu_s + max(gpu_s, 0.0), tool_calls=calls)

    def record_wall(self, seconds: float) -> None:
        self.spent = replace(self.spent, wall_s=self.spent.wall_s + max(seconds, 0.0))

    def wall_left(self) -> float | None:
        """Seconds of the wall budget left (never below 0); None: no limit."""
        b = self.budget.max_wall_s
        return None if b is None else max(b - self.spent.wall_s, 0.0)

    def before_request(self, prompt_tokens: int, price: Price | None, *, least_reply: int = 1) -> RequestLimit:
        """The limit of a request whose prompt is about `prompt_tokens` (see the module doc). `price` is the
        model's (None: not in the table, no dollar cap); `least_reply` is the smallest reply limit the model
        accepts (above an Anthropic thinking budget): a budget that leaves less stops the sample now."""
        b, s = self.budget, self.spent
        if b.max_input_tokens is not None and s.input_tokens + prompt_tokens > b.max_input_tokens:
            return RequestLimit(MAX_INPUT_TOKENS, None, f"the prompt is about {prompt_tokens} tokens; "
                                f"{b.max_input_tokens - s.input_tokens} input tokens are left")
        caps: list[tuple[int, StopReason]] = []
        if b.max_output_tokens is not None:
            caps.append((b.max_output_tokens - s.output_tokens, MAX_OUTPUT_TOKENS))
        if b.max_cost_usd is not None and price is not None:
            left = b.max_cost_usd - s.cost_usd - price.cost(Usage(input_tokens=prompt_tokens))
            if left <= 0:
                return RequestLimit(MAX_COST, None, f"the prompt alone (about {prompt_tokens} tokens) costs more "
                                    f"than the ${max(b.max_cost_usd - s.cost_usd, 0.0):.4f} left")
            if price.output > 0:
                caps.append((math.floor(left * 1_000_000 / price.output), MAX_COST))
        if not caps:
            return RequestLimit(None, None)
        cap, reason = min(caps)
        if cap < least_reply:
            return RequestLimit(reason, None, f"the budget leaves a reply of {max(cap, 0)} tokens; the model needs "
                                f"at least {least_reply}")
        return RequestLimit(None, cap, f"{reason.value} leaves a reply of {cap} tokens")

    def stop_reason(self, *, before_model_call: bool) -> StopReason | None:
        """The first limit reached, or None. Turns count only `before_model_call` (see the module doc)."""
        b, s = self.budget, self.spent
        checks = (
            (MAX_TURNS, before_model_call and b.max_turns is not None and s.turns >= b.max_turns),
            (MAX_INPUT_TOKENS, b.max_input_tokens is not None and s.input_tokens >= b.max_input_tokens),
            (MAX_OUTPUT_TOKENS, b.max_output_tokens is not None and s.output_tokens >= b.max_output_tokens),
            (MAX_COST, b.max_cost_usd is not None and s.cost_usd >= b.max_cost_usd),
            (MAX_WALL, b.max_wall_s is not None and s.wall_s >= b.max_wall_s),
            (MAX_GPU, b.max_gpu_s is not None and s.gpu_s >= b.max_gpu_s),
        )
        return next((reason for reason, hit in checks if hit), None)
