"""What one sample may spend, what it has spent, and the reason it stops when a limit is reached.

Limits are per sample: model turns (calls), input tokens, output tokens, dollars, wall-clock seconds and
GPU seconds (device time the sample's tool evaluations held). Dollars are what was billed: cache reads at
the read rate, cache writes at the write rate, reasoning at the output rate (agent.usage); the token
limits count every token the model read or wrote, cached or not. A limit of None is no limit. A limit is
reached when the amount spent is at or above it. Turns are checked before a model call (the reply of
the last allowed turn is still acted on); the others are checked after every model reply and every
round of tool calls, so no tool runs on a budget already spent.

What was spent lives in the agent's graph state (as `Spent.as_dict()`), so a sample resumed from its
checkpoint keeps counting where it stopped; the time a killed run lay dead is not charged to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agent.usage import Usage

# Stop reasons of docs/run-layout.md, one per limit.
MAX_TURNS = "max_turns"
MAX_INPUT_TOKENS = "max_input_tokens"
MAX_OUTPUT_TOKENS = "max_output_tokens"
MAX_COST = "max_cost"
MAX_WALL = "max_wall"
MAX_GPU = "max_gpu"


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

    def stop_reason(self, *, before_model_call: bool) -> str | None:
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
