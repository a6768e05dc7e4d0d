"""Reasoning settings (--reasoning-effort, --thinking-budget) and sampling options, mapped per provider.

One request shape per kind of model (agent/models.json's "reasoning"):

- OpenAI reasoning models ("effort"): `reasoning_effort` and `max_completion_tokens`; a temperature is
  refused before any request when the model does not accept one (the API answers 400 otherwise), and
  `max_tokens` is never sent (they refuse it).
- Anthropic "adaptive" models (Opus 4.7+, Sonnet 5): thinking {"type": "adaptive", "display": "summarized"}
  with output_config.effort; a token budget is refused (the API has none for them).
- Anthropic "budget" models (Sonnet 4.5, Haiku 4.5): thinking {"type": "enabled", "budget_tokens": N}, N
  from --thinking-budget or the table's budget for --reasoning-effort; max_tokens is raised above N when it
  is not (the API requires max_tokens > budget_tokens), and no temperature is sent (thinking allows only 1).
- Models the table does not list (a self-hosted model on a base URL): what was asked is sent as is, and
  the output limit goes out as both `max_completion_tokens` and `max_tokens`, because servers such as
  llama.cpp's read only the older name.

`request_options` returns the keyword arguments of the LangChain chat model; a contradiction is a
ProviderError of kind "config", raised before any request. `reply_limit` returns the keyword arguments of
one request that hold its reply to what the budgets leave (agent.budgets.before_request), by the same
names: `max_tokens` (LangChain sends it to OpenAI as `max_completion_tokens`), for unlisted OpenAI-compatible
models also in the body, never above the model's own limit; `least_reply` is the smallest such limit a
model takes (an Anthropic thinking budget needs max_tokens above it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.model_spec import ProviderError
from agent.model_table import ModelInfo, ModelTable

# What an Anthropic reply may hold when no limit is given: ChatAnthropic would take the model's whole
# output limit (128K), which a budget cap then has to cover in full; 32K is far above any kernel file.
DEFAULT_ANTHROPIC_MAX_TOKENS = 32_000
# Thinking needs room for the answer after the budget is spent.
ANSWER_ROOM_TOKENS = 8_000


@dataclass(frozen=True)
class ReasoningConfig:
    effort: str | None = None  # --reasoning-effort
    thinking_budget: int | None = None  # --thinking-budget (Anthropic "budget" models)

    @property
    def asked(self) -> bool:
        return self.effort is not None or self.thinking_budget is not None


def request_options(provider: str, model: str, info: ModelInfo | None, table: ModelTable | None,
                    reasoning: ReasoningConfig, *, temperature: float | None,
                    max_output_tokens: int | None) -> dict[str, Any]:
    """The chat model's keyword arguments for these settings (see the module docstring)."""
    if reasoning.thinking_budget is not None and reasoning.thinking_budget < 1024:
        raise ProviderError(f"--thinking-budget must be at least 1024 tokens (the API's minimum), got "
                            f"{reasoning.thinking_budget}")
    if info is not None and reasoning.effort is not None and info.effort_levels \
            and reasoning.effort not in info.effort_levels:
        raise ProviderError(f"{provider}:{model} takes --reasoning-effort {', '.join(info.effort_levels)}; "
                            f"got {reasoning.effort!r}")
    if max_output_tokens is not None and info is not None and info.max_output_tokens is not None \
            and max_output_tokens > info.max_output_tokens:
        raise ProviderError(f"--max-reply-tokens {max_output_tokens} is over {provider}:{model}'s output limit "
                            f"of {info.max_output_tokens}")
    if provider == "openai":
        return _openai(model, info, reasoning, temperature, max_output_tokens)
    if provider == "anthropic":
        return _anthropic(model, info, table, reasoning, temperature, max_output_tokens)
    return {}


def _openai(model: str, info: ModelInfo | None, reasoning: ReasoningConfig, temperature: float | None,
            max_output_tokens: int | None) -> dict[str, Any]:
    if reasoning.thinking_budget is not None:
        raise ProviderError("--thinking-budget is Anthropic's; OpenAI models take --reasoning-effort")
    out: dict[str, Any] = {}
    known_reasoner = info is not None and info.reasoning == "effort"
    if temperature is not None:
        if info is not None and not info.temperature:
            raise ProviderError(f"openai:{model} is a reasoning model and refuses a temperature; leave "
                                "--temperature out (use --reasoning-effort)")
        out["temperature"] = temperature
    if reasoning.effort is not None:
        if info is not None and info.reasoning is None:
            raise ProviderError(f"openai:{model} is not a reasoning model: --reasoning-effort does not apply")
        out["reasoning_effort"] = reasoning.effort
    if max_output_tokens is not None:
        out["max_completion_tokens"] = max_output_tokens
        if not known_reasoner:
            # llama.cpp's server (and older compatible ones) read only max_tokens; OpenAI's reasoning models
            # refuse it, so it goes only to models the table does not call reasoning models.
            out["extra_body"] = {"max_tokens": max_output_tokens}
    return out


def _anthropic(model: str, info: ModelInfo | None, table: ModelTable | None, reasoning: ReasoningConfig,
               temperature: float | None, max_output_tokens: int | None) -> dict[str, Any]:
    kind = info.reasoning if info is not None else None
    if kind is None and reasoning.asked:
        kind = "budget" if reasoning.thinking_budget is not None else "adaptive"
    out: dict[str, Any] = {}
    max_tokens = max_output_tokens
    if not reasoning.asked:
        if temperature is not None:
            if info is not None and not info.temperature:
                raise ProviderError(f"anthropic:{model} refuses a non-default temperature; leave --temperature out")
            out["temperature"] = temperature
        out["max_tokens"] = max_tokens if max_tokens is not None else _default_max(info)
        return out
    if temperature is not None:
        raise ProviderError("extended thinking allows no --temperature (Anthropic accepts only the default)")
    if kind == "adaptive":
        if reasoning.thinking_budget is not None:
            raise ProviderError(f"anthropic:{model} thinks adaptively and takes no token budget; use "
                                "--reasoning-effort")
        out["thinking"] = {"type": "adaptive", "display": "summarized"}
        if reasoning.effort is not None:
            out["output_config"] = {"effort": reasoning.effort}
        out["max_tokens"] = max_tokens if max_tokens is not None else _default_max(info)
        return out
    budget = reasoning.thinking_budget
    if budget is None:
        budgets = table.thinking_budgets if table is not None else {}
        if reasoning.effort not in budgets:
            raise ProviderError(f"no thinking budget for --reasoning-effort {reasoning.effort!r} (the model table "
                                f"has {', '.join(sorted(budgets)) or 'none'}); give --thinking-budget N")
        budget = budgets[reasoning.effort]
    if max_tokens is None:
        max_tokens = max(_default_max(info), budget + ANSWER_ROOM_TOKENS)
        if info is not None and info.max_output_tokens is not None:
            max_tokens = min(max_tokens, info.max_output_tokens)
    if max_tokens <= budget:
        raise ProviderError(f"the reply limit ({max_tokens} tokens) must exceed the thinking budget ({budget}); "
                            "raise --max-reply-tokens or lower --thinking-budget")
    out["thinking"] = {"type": "enabled", "budget_tokens": budget}
    out["max_tokens"] = max_tokens
    return out


def _default_max(info: ModelInfo | None) -> int:
    limit = info.max_output_tokens if info is not None else None
    return min(DEFAULT_ANTHROPIC_MAX_TOKENS, limit) if limit is not None else DEFAULT_ANTHROPIC_MAX_TOKENS




def least_reply(model: Any) -> int:
    """The smallest reply limit a request of `model` can carry: above its thinking budget where it has one."""
    thinking = getattr(model, "thinking", None)
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        return int(thinking.get("budget_tokens") or 0) + 1
    return 1


def reply_limit(provider: str, info: ModelInfo | None, model: Any, cap: int) -> dict[str, Any]:
    """One request's keyword arguments that hold its reply to `cap` tokens (reasoning included), or to the
    model's own limit where that is lower (see the module docstring)."""
    own = getattr(model, "max_tokens", None)
    limit = min(cap, own) if isinstance(own, int) and own > 0 else cap
    out: dict[str, Any] = {"max_tokens": limit}
    if provider == "openai" and not (info is not None and info.reasoning == "effort"):
        # llama.cpp's server reads only the body's max_tokens (request_options does the same)
        out["extra_body"] = {**(getattr(model, "extra_body", None) or {}), "max_tokens": limit}
    return out
