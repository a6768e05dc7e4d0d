"""The graph's `model` node: one call of the chat model (agent.graph's module doc says what it checks before and
after). The request is the state's messages as agent.context shortens them, with the provider's cache
breakpoints; the reply's usage and cost are recorded; a reply without tool calls is the sample's answer."""

from __future__ import annotations

import time
import uuid
from typing import Any

from langchain_core.messages import AIMessage

from agent import caching, prompting
from agent.budgets import MAX_WALL, BudgetTracker
from agent.conditions import BASH
from agent.context import ContextState, Prepared, prepare
from agent.graph_state import (
    CONTEXT_OVERFLOW,
    MODEL_ENDED,
    MODEL_ERROR,
    NO_CODE,
    SUBMITTED,
    ZERO_SHOT,
    AgentState,
    FatalProviderError,
    NodeContext,
    TransientProviderError,
    drop_orphans,
    is_fatal,
    is_transient,
    progress,
)
from agent.model_spec import ProviderError
from agent.reasoning import least_reply, reply_limit
from agent.retry import WALL, invoke_model
from agent.tool_calls import bound_reply, reply_candidate
from agent.transcript import finish_reason, message_text
from agent.usage import Usage, usage_of

STABLE_PREFIX = 2  # initial_messages: the system prompt and the task, the same at every turn


def model(nodes: NodeContext, state: AgentState) -> dict[str, Any]:
    """One model call: its update of the state, or a stop before it is sent (too long, over a budget)."""
    ctx, log = nodes.sample, nodes.log
    started = time.perf_counter()
    spend = nodes.tracker(state)
    prepared = _prepared(nodes, state, spend)
    context = prepared.state
    if prepared.overflow:
        why = (f"the request is about {prepared.estimate} tokens with every old candidate shortened, over the "
               f"context window of {nodes.policy.window} tokens; not sent")
        if log is not None:
            log.warning("context_overflow", estimate=prepared.estimate, window=nodes.policy.window)
        return {"stop_reason": CONTEXT_OVERFLOW, "error": why, "context": context.as_dict()}
    limit = spend.before_request(prepared.estimate, nodes.price, least_reply=least_reply(ctx.model))
    if limit.stop is not None:
        if log is not None:
            log.info("budget_stop", reason=limit.stop.value, before_request=limit.why, spent=state.get("spent"))
        return {"stop_reason": limit.stop.value, "context": context.as_dict()}
    request = caching.for_request(prepared.messages, ctx.provider, enabled=ctx.prompt_cache,
                                  stable_prefix=STABLE_PREFIX)
    call = nodes.bound if limit.max_tokens is None else \
        nodes.bound.bind(**reply_limit(ctx.provider, nodes.info, ctx.model, limit.max_tokens))
    try:
        wall_left = spend.wall_left()  # the request's timeout and retries end with the wall budget
        reply = bound_reply(invoke_model(call, request, attempts=ctx.model_attempts, log=log, wall_left=None if
                                         wall_left is None else wall_left - (time.perf_counter() - started)))
    except ProviderError as err:
        spend.record_wall(time.perf_counter() - started)
        return _failed(nodes, spend, context, err)
    usage = usage_of(reply)
    if usage is not None:
        context.observe(usage.input_tokens)
    cost = ctx.prices.cost(ctx.model_name, usage) if (ctx.prices is not None and usage is not None) else None
    spend.record_model_call(usage, cost)
    spend.record_wall(time.perf_counter() - started)
    if log is not None:
        _log_reply(log, spend, reply, usage, cost, estimate=prepared.estimate, reply_limit=limit.max_tokens)
    update: dict[str, Any] = {"messages": [reply], "spent": spend.spent.as_dict(), "context": context.as_dict()}
    if ctx.condition.uses_tools and (reply.tool_calls or reply.invalid_tool_calls):
        budget_stop = spend.stop_reason(before_model_call=False)
        if budget_stop:
            update["stop_reason"] = budget_stop.value
        return update
    if ctx.condition.kind == BASH:  # a reply that runs no command ends it; the score node takes the file
        update["stop_reason"] = SUBMITTED
        return update
    return {**update, **_answer(nodes, state, spend, reply)}


def _prepared(nodes: NodeContext, state: AgentState, spend: BudgetTracker) -> Prepared:
    """The request's messages as agent.context shortens them to fit the model's window (logged when it does)."""
    prepared = prepare(state["messages"], state.get("candidates") or [], nodes.policy,
                       ContextState.from_dict(state.get("context")), tools_tokens=nodes.tools_tokens)
    if prepared.newly_shortened and nodes.log is not None:
        nodes.log.info("context_shortened", turn=spend.spent.turns + 1, calls=prepared.newly_shortened,
                       estimate=prepared.estimate, window=nodes.policy.window, batches=prepared.state.batches)
    return prepared


def _failed(nodes: NodeContext, spend: BudgetTracker, context: ContextState, err: ProviderError) -> dict[str, Any]:
    """A request the provider refused after agent.retry's retries: the wall budget's stop, the run's end (fatal),
    the sample left at its checkpoint (transient), or the sample's stop (context overflow, model error)."""
    log = nodes.log
    if err.kind == WALL:  # cut by the wall budget: the budget's stop, not the model's error
        if log is not None:
            log.info("budget_stop", reason=MAX_WALL.value, during_request=str(err), spent=spend.spent.as_dict())
        return {"stop_reason": MAX_WALL.value, "spent": spend.spent.as_dict(), "context": context.as_dict()}
    if is_fatal(err):
        raise FatalProviderError(str(err), kind=err.kind, status=err.status) from err
    if is_transient(err):  # leaves the graph: the checkpoint stays before this call
        raise TransientProviderError(str(err), kind=err.kind, status=err.status) from err
    reason = CONTEXT_OVERFLOW if err.kind == "context" else MODEL_ERROR
    if log is not None:
        log.warning(reason, kind=err.kind, status=err.status, error=str(err))
    return {"stop_reason": reason, "error": str(err), "spent": spend.spent.as_dict(), "context": context.as_dict()}


def _log_reply(log: Any, spend: BudgetTracker, reply: AIMessage, usage: Usage | None, cost: float | None,
               **request: Any) -> None:
    log.info("model_reply", turn=spend.spent.turns, tool_calls=[c["name"] for c in reply.tool_calls],
             input_tokens=usage.input_tokens if usage else None,
             output_tokens=usage.output_tokens if usage else None,
             cache_read_tokens=usage.cache_read_tokens if usage else None,
             cache_write_tokens=usage.cache_write_tokens if usage else None,
             reasoning_tokens=usage.reasoning_tokens if usage else None,
             finish_reason=finish_reason(reply), cost_usd=cost, **request)


def _answer(nodes: NodeContext, state: AgentState, spend: BudgetTracker, reply: AIMessage) -> dict[str, Any]:
    """A reply with no tool call (always so for zero-shot): its code, if any, is the answer."""
    ctx = nodes.sample
    if reply.id is None:  # add_messages would give it one; the candidate record needs it now
        reply.id = str(uuid.uuid4())
    code = prompting.extract(state.get("prompt") or {}, message_text(reply))
    if code is None:  # the last candidate, if any, is scored; a reply cut by a spent budget says so
        budget_stop = spend.stop_reason(before_model_call=False)
        return {"stop_reason": budget_stop.value if budget_stop else
                MODEL_ENDED if state.get("candidates") else NO_CODE}
    drop_orphans(ctx, state)
    entry = reply_candidate(ctx, code, reply.id, **progress(spend.spent))
    return {"candidates": [*(state.get("candidates") or []), entry], "submitted": entry["path"],
            "stop_reason": SUBMITTED if ctx.condition.uses_tools else ZERO_SHOT}
