"""The graph's `tools` node: every tool call of the last reply through agent.tool_calls.run_tool_call, within
what is left of the wall budget; a candidate a tool saw becomes an entry of the state's list; `submit` ends
the sample."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from agent import final_scoring
from agent.budgets import BudgetTracker
from agent.conditions import SUBMIT
from agent.graph_state import NO_CODE, SUBMITTED, AgentState, NodeContext, drop_orphans, progress
from agent.tool_calls import candidate_entry, invalid_call_answer, run_tool_call


def tools(nodes: NodeContext, state: AgentState) -> dict[str, Any]:
    started = time.perf_counter()
    spend = nodes.tracker(state)
    reply = state["messages"][-1]
    assert isinstance(reply, AIMessage)
    candidates = list(state.get("candidates") or [])
    drop_orphans(nodes.sample, state)
    # Calls whose arguments were not valid JSON, or were refused (bound_reply), get an error answer.
    messages: list[ToolMessage] = [
        ToolMessage(content=invalid_call_answer(dict(bad)), tool_call_id=bad.get("id") or "",
                    name=bad.get("name") or "", status="error")
        for bad in reply.invalid_tool_calls]
    submitted: str | None = None
    wall_left = spend.wall_left()
    for call in reply.tool_calls:
        call_id = call.get("id") or ""
        name = call["name"]
        left = None if wall_left is None else wall_left - (time.perf_counter() - started)
        if submitted is not None or (left is not None and left <= 0):
            why = f"the sample ended with {SUBMIT}" if submitted is not None else "the wall budget ran out"
            messages.append(ToolMessage(content=f"not run: {why}", tool_call_id=call_id, name=name, status="error"))
            continue
        answer, ends_sample = _call(nodes, spend, candidates, name, call_id, call.get("args") or {}, left)
        if ends_sample:  # its own candidate, else the last one; "" when there is none (no_code)
            submitted = candidates[-1]["path"] if candidates else ""
        messages.append(answer)
    spend.record_wall(time.perf_counter() - started)
    update: dict[str, Any] = {"messages": messages, "spent": spend.spent.as_dict(), "candidates": candidates}
    if submitted is not None:
        update["submitted"] = submitted or None
        update["stop_reason"] = SUBMITTED if submitted else NO_CODE
    else:
        reason = spend.stop_reason(before_model_call=False)
        if reason:
            update["stop_reason"] = reason.value
    return update


def _call(nodes: NodeContext, spend: BudgetTracker, candidates: list[dict[str, Any]], name: str, call_id: str,
          args: dict[str, Any], wall_left: float | None) -> tuple[ToolMessage, bool]:
    """One tool call, its spending recorded and its candidate appended to `candidates`: the model's answer, and
    whether the tool ends the sample (`submit`)."""
    outcome, gpu_s, error = run_tool_call(nodes.sample, name, args, wall_left=wall_left)
    spend.record_tool(name, gpu_s)
    if error is not None:
        return ToolMessage(content=error, tool_call_id=call_id, name=name, status="error"), False
    assert outcome is not None  # run_tool_call gives an outcome exactly when it gives no error
    if outcome.candidate is not None:  # saved by the tool, with its record beside it
        path = Path(outcome.candidate)
        correct, counted = final_scoring.tool_judgement(outcome.data)
        candidates.append(candidate_entry(
            nodes.sample, path, name, call_id, None, (outcome.data or {}).get("verdict"), counted, correct=correct,
            sha256=hashlib.sha256(path.read_bytes()).hexdigest(), **progress(spend.spent)))
    return ToolMessage(content=outcome.text, tool_call_id=call_id, name=name), outcome.ends_sample
