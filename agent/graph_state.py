"""What the agent graph's nodes share (agent.graph wires them): the state's shape, the stop reasons they set,
the provider errors that leave the graph, and NodeContext, what every node reads that is not state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, BaseMessage
from langchain_core.runnables import Runnable
from langgraph.graph import add_messages

from agent.budgets import BudgetTracker, Spent
from agent.context import ContextPolicy
from agent.model_spec import ProviderError
from agent.model_table import ModelInfo
from agent.sample_context import SampleContext
from agent.stop_reasons import StopReason
from agent.usage import Price

# Stop reasons that are not budgets (agent.stop_reasons), by the names the callers know them by.
SUBMITTED = StopReason.SUBMITTED.value
MODEL_ENDED = StopReason.MODEL_ENDED.value
NO_CODE = StopReason.NO_CODE.value
ZERO_SHOT = StopReason.ZERO_SHOT.value
MODEL_ERROR = StopReason.MODEL_ERROR.value
REPLAYED = StopReason.REPLAYED.value
CONTEXT_OVERFLOW = StopReason.CONTEXT_OVERFLOW.value


class FatalProviderError(ProviderError):
    """A provider error that ends the run: retrying other samples cannot succeed."""


class TransientProviderError(ProviderError):
    """Rate limits, server errors or timeouts that outlasted the retries: the sample stops unfinished, at its
    last checkpoint, so `--resume` continues it; nothing is charged to the model."""


def is_fatal(error: ProviderError) -> bool:
    """A bad key, an unknown model or endpoint, a server that cannot be reached."""
    return error.kind in ("config", "unreachable") or error.status in (401, 403, 404)


def is_transient(error: ProviderError) -> bool:
    return error.kind in ("rate_limit", "server", "timeout")


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    spent: dict[str, Any]  # budgets.Spent.as_dict()
    candidates: list[dict[str, Any]]  # {"index", "path", "tool", "tool_call_id", "message_id", "verdict"}
    submitted: str | None  # the submitted candidate, relative to the sample folder
    stop_reason: str | None  # a StopReason's value
    error: str | None  # the provider's message when stop_reason is model_error
    result: dict[str, Any] | None  # the final scoring's EvalResult, as JSON
    scoring: dict[str, Any]  # {"seconds", "gpu_s", "attempts", "final"}
    context: dict[str, Any]  # agent.context.ContextState.as_dict(): which calls are shortened, the size ratio
    prompt: dict[str, Any]  # agent.prompting's record: which prompt the sample opened with, which extraction rule
    held_out: list[dict[str, Any]]  # the scored file on the problem's held-out shapes (agent.final_scoring)
    best: dict[str, Any] | None  # the best candidate by the tools' evidence, scored apart (agent.final_scoring)


@dataclass(frozen=True)
class NodeContext:
    """What every node reads that is not state: the sample (SampleContext), the model with the condition's tools
    bound and the tokens their schemas add to a request, what the model table and the price table say of the
    model, the context policy, and whether the score node evaluates (a search's proposer: it only names)."""

    sample: SampleContext
    bound: Runnable[Any, BaseMessage]
    tools_tokens: int
    info: ModelInfo | None  # what the reply limit of a request is called (agent.reasoning)
    price: Price | None
    policy: ContextPolicy
    score_final: bool = True

    @property
    def log(self) -> Any:
        return self.sample.log

    def tracker(self, state: AgentState) -> BudgetTracker:
        return BudgetTracker(self.sample.budget, Spent.from_dict(state.get("spent")))


def progress(spent: Spent) -> dict[str, Any]:
    """What the trajectory keeps of the spending when a candidate came: turn, tokens, dollars, GPU seconds."""
    return {"turn": spent.turns, "tokens": spent.input_tokens + spent.output_tokens,
            "cost_usd": round(spent.cost_usd, 6) if spent.cost_known else None, "gpu_s": round(spent.gpu_s, 3)}


# The tools save each candidate they are given as candidates/NNN.py (+ .json) in the sample folder; the
# state's list of candidates is the authority. A run killed after a tool saved a candidate but before the
# checkpoint re-runs that tool call on resume, so files beyond the state's list are dropped first.
def drop_orphans(ctx: SampleContext, state: AgentState) -> None:
    known = len(state.get("candidates") or [])
    folder: Path = ctx.directory.candidates
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        stem = path.name.split(".", 1)[0]
        if stem.isdigit() and int(stem) >= known and path.suffix in (".py", ".json"):
            path.unlink(missing_ok=True)
