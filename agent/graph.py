"""One sample of a model condition as a LangGraph StateGraph.

    START -> guard -> model -> tools -> guard -> model -> ... -> score -> END
                  \\        \\        \\
                   score    score     score      (a limit reached, a reply with no tool call, a submit)

- guard: the budget check before every model call (turns, tokens, dollars, wall, GPU seconds).
- model: one call of the chat model with the condition's tools bound (zero-shot: no tools; its code is
  taken from the reply by the rule of the sample's prompt, agent.prompting: this project's or PKB's). The
  request is the state's messages as agent.context shortens them to fit the model's window (old
  candidates become references; `recall` brings them back) with the provider's cache breakpoints
  (agent.caching); a request that cannot fit stops the sample with `context_overflow`
  before it is sent. A request whose prompt alone would take the input tokens or the dollars over their
  budget is not sent either (max_input_tokens, max_cost), and what the output-token and dollar budgets
  leave caps the request's reply limit (agent.budgets.before_request, agent.reasoning.reply_limit). Token
  usage (cache reads and writes, reasoning) and cost are recorded; tokens, dollars and wall time are
  checked again right after the reply, so no tool runs on a spent budget. Tool calls whose arguments
  break the tools' limits are refused before the reply enters the state (agent.tool_calls.bound_reply).
- tools: every tool call of the reply through agent.tool_calls.run_tool_call, within what is left of the
  wall budget. Tools that run candidates on a device take a lease from the DeviceScheduler first. Every
  candidate a tool saw is kept as candidates/NNN.py with
  its structured result in candidates/NNN.json; `submit` ends the sample.
- score: the submitted candidate, or else the last one, is copied to final.py and evaluated with the
  full harness on a fresh seed, scoring_seed(seed): the tools check with the run's seed, so the inputs
  of the final verdict are ones the model never saw feedback on. A `pkb eval` of final.py therefore
  draws other inputs than result.json did (use `--seed` with scoring_seed(seed) to repeat it exactly).
  Then (agent.final_scoring) the problem's held-out shapes, which no tool used, each on a seed of its own;
  and the best candidate by the tools' own evidence, scored the same way and kept apart (`best`). The
  bash condition's answer is its scratch folder's solution file as the session ended.

An agent reply without tool calls ends the sample too: code in it is an implicit submission
(stop reason `submitted`); a reply with no code stops with `model_ended` and the last candidate is
scored, or with `no_code` where there is none (a scored sample never says `no_code`). Every stop reason
is one of agent.stop_reasons.StopReason, checked when the score node ends the sample.
Provider errors, after agent.retry's retries:
- a bad key, an unknown model or endpoint, a server that cannot be reached: FatalProviderError ends
  the whole run (every other sample would fail the same way);
- rate limits, 5xx, timeouts: TransientProviderError leaves the graph at its last checkpoint; the
  sample stays unfinished and `--resume` continues it (an infrastructure failure, not the model's);
- a prompt the server refuses as longer than the model's context stops the sample with
  `context_overflow` (as pkb's own check does before sending);
- anything else the server refuses (a 400) is final for this sample: it stops with `model_error`;
- a request the wall budget cut (agent.retry: each attempt's timeout and each wait between attempts end with
  what is left of it) stops the sample with `max_wall`, never `model_error`.
In these cases its last candidate, if any, is scored.

The state holds only JSON-like values and LangChain messages, so the SQLite checkpointer can store it
after every node; a killed run resumes a sample at the node it was in.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, StateGraph, add_messages

from agent import caching, final_scoring, prompting
from agent.budgets import MAX_WALL, Budget, BudgetTracker, Spent
from agent.conditions import BASH, SUBMIT
from agent.context import ContextPolicy, ContextState, prepare, tools_token_count
from agent.executors.interface import as_evaluate
from agent.executors.local import LocalExecutor
from agent.final_scoring import SCORING_SEED_OFFSET as SCORING_SEED_OFFSET  # re-exported: their old home
from agent.final_scoring import scoring_seed as scoring_seed
from agent.model_spec import ProviderError
from agent.model_table import load_model_table
from agent.reasoning import least_reply, reply_limit
from agent.retry import WALL, invoke_model
from agent.rundir import SampleDir, write_bytes_atomic, write_json_atomic
from agent.sample_context import SampleContext
from agent.stop_reasons import StopReason, checked
from agent.tool_calls import (
    bound_reply,
    candidate_entry,
    invalid_call_answer,
    reply_candidate,
    run_tool_call,
    tool_context,
)
from agent.usage import usage_of
from tools import bash as shell
from tools.langchain_tools import make_tools

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


# -- prompts and text --------------------------------------------------------------------------------
STABLE_PREFIX = 2  # initial_messages: the system prompt and the task, the same at every turn


def opening(ctx: SampleContext) -> prompting.Opening:
    """The sample's first messages and where they come from (agent.prompting); for bash, its scratch files."""
    return prompting.opening(ctx.prompt, ctx.condition, ctx.problem, shape=ctx.shape, world_size=ctx.world_size,
                             topology=ctx.topology, guide_in_prompt=ctx.guide_in_prompt, model_name=ctx.model_name,
                             scratch=ctx.directory.path / shell.SHELL_DIR)


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


# -- candidates -------------------------------------------------------------------------------------
# The tools save each candidate they are given as candidates/NNN.py (+ .json) in the sample folder; the
# state's list of candidates is the authority. A run killed after a tool saved a candidate but before the
# checkpoint re-runs that tool call on resume, so files beyond the state's list are dropped first.
def _drop_orphans(ctx: SampleContext, state: AgentState) -> None:
    known = len(state.get("candidates") or [])
    folder = ctx.directory.candidates
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        stem = path.name.split(".", 1)[0]
        if stem.isdigit() and int(stem) >= known and path.suffix in (".py", ".json"):
            path.unlink(missing_ok=True)


# -- scoring ----------------------------------------------------------------------------------------
def _score(ctx: SampleContext, path: Path, *, log_dir: Path | None = None) -> final_scoring.FinalScore:
    """`path` scored finally by agent.final_scoring, through the sample's executor (else this node's devices, in
    the scheduler's leases)."""
    return final_scoring.score_submission(ctx.problem, path, evaluate=_evaluate(ctx), config=ctx.config,
                                          world_size=ctx.world_size, device=ctx.device, shape=ctx.shape,
                                          log_dir=log_dir, log=ctx.log)


def _evaluate(ctx: SampleContext) -> final_scoring.EvaluateFn:
    return as_evaluate(ctx.executor if ctx.executor is not None else LocalExecutor(ctx.scheduler))


def _shell_file(ctx: SampleContext, candidates: list[dict[str, Any]], spent: Spent) -> tuple[str | None, bool]:
    """The bash condition's solution file as the session ended: (its candidate path, whether that is a new
    entry); the last candidate's path when the file is unchanged since the last check, (None, False) when
    there is no such file."""
    text, _ = shell.read_file(ctx.directory.path / shell.SHELL_DIR, ctx.shell_solution)
    if text is None or not text.strip():
        return None, False
    text = text if text.endswith("\n") else text + "\n"
    if candidates and candidates[-1].get("sha256") == hashlib.sha256(text.encode()).hexdigest():
        return str(candidates[-1]["path"]), False
    entry = reply_candidate(ctx, text, None, source="shell", **_progress(spent))
    candidates.append(entry)
    return str(entry["path"]), True


def _progress(spent: Spent) -> dict[str, Any]:
    """What the trajectory keeps of the spending when a candidate came: turn, tokens, dollars, GPU seconds."""
    return {"turn": spent.turns, "tokens": spent.input_tokens + spent.output_tokens,
            "cost_usd": round(spent.cost_usd, 6) if spent.cost_known else None, "gpu_s": round(spent.gpu_s, 3)}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the graph --------------------------------------------------------------------------------------
def bind_model(ctx: SampleContext) -> tuple[Runnable[Any, BaseMessage], int]:
    """The chat model with the condition's tools bound (zero-shot: the bare model, no tools), and the
    tokens the tool schemas add to every request."""
    if ctx.model is None:
        raise ValueError(f"condition {ctx.condition.name} needs a chat model")
    if not ctx.condition.uses_tools:
        return ctx.model, 0
    schema_ctx = tool_context(ctx, gpus=None)
    tools = make_tools(list(ctx.condition.bound_tools), schema_ctx)
    return ctx.model.bind_tools(tools), tools_token_count([convert_to_openai_tool(t) for t in tools])


def build_graph(ctx: SampleContext, checkpointer: Any = None, *, score_final: bool = True) -> Any:
    """The compiled graph of one sample; `checkpointer` (a SqliteSaver) makes it resumable. With
    `score_final` false the score node only names the final candidate (scoring.final) and evaluates nothing: a
    search's agent proposer, whose candidate the search evaluates itself (agent.search.episode)."""
    bound, tools_tokens = bind_model(ctx)
    log = ctx.log
    info = load_model_table().info(ctx.model_name)  # what the reply limit of a request is called (reasoning)
    price = ctx.prices.price(ctx.model_name) if ctx.prices is not None else None
    is_agent = ctx.condition.uses_tools
    policy = ctx.context_policy or ContextPolicy(window=None)

    def tracker(state: AgentState) -> BudgetTracker:
        return BudgetTracker(ctx.budget, Spent.from_dict(state.get("spent")))

    def guard(state: AgentState) -> dict[str, Any]:
        reason = tracker(state).stop_reason(before_model_call=True)
        if reason and log is not None:
            log.info("budget_stop", reason=reason.value, spent=state.get("spent"))
        return {"stop_reason": reason.value} if reason else {}

    def model(state: AgentState) -> dict[str, Any]:
        started = time.perf_counter()
        spend = tracker(state)
        prepared = prepare(state["messages"], state.get("candidates") or [], policy,
                           ContextState.from_dict(state.get("context")), tools_tokens=tools_tokens)
        context = prepared.state
        if prepared.newly_shortened and log is not None:
            log.info("context_shortened", turn=spend.spent.turns + 1, calls=prepared.newly_shortened,
                     estimate=prepared.estimate,
                     window=policy.window, batches=context.batches)
        if prepared.overflow:
            why = (f"the request is about {prepared.estimate} tokens with every old candidate shortened, over the "
                   f"context window of {policy.window} tokens; not sent")
            if log is not None:
                log.warning("context_overflow", estimate=prepared.estimate, window=policy.window)
            return {"stop_reason": CONTEXT_OVERFLOW, "error": why, "context": context.as_dict()}
        limit = spend.before_request(prepared.estimate, price, least_reply=least_reply(ctx.model))
        if limit.stop is not None:
            if log is not None:
                log.info("budget_stop", reason=limit.stop.value, before_request=limit.why, spent=state.get("spent"))
            return {"stop_reason": limit.stop.value, "context": context.as_dict()}
        request = caching.for_request(prepared.messages, ctx.provider, enabled=ctx.prompt_cache,
                                      stable_prefix=STABLE_PREFIX)
        call = bound if limit.max_tokens is None else \
            bound.bind(**reply_limit(ctx.provider, info, ctx.model, limit.max_tokens))
        try:
            wall_left = spend.wall_left()  # the request's timeout and retries end with the wall budget
            reply = bound_reply(invoke_model(call, request, attempts=ctx.model_attempts, log=log, wall_left=None if
                                             wall_left is None else wall_left - (time.perf_counter() - started)))
        except ProviderError as err:
            spend.record_wall(time.perf_counter() - started)
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
            return {"stop_reason": reason, "error": str(err), "spent": spend.spent.as_dict(),
                    "context": context.as_dict()}
        usage = usage_of(reply)
        if usage is not None:
            context.observe(usage.input_tokens)
        cost = ctx.prices.cost(ctx.model_name, usage) if (ctx.prices is not None and usage is not None) else None
        spend.record_model_call(usage, cost)
        spend.record_wall(time.perf_counter() - started)
        if log is not None:
            log.info("model_reply", turn=spend.spent.turns, tool_calls=[c["name"] for c in reply.tool_calls],
                     input_tokens=usage.input_tokens if usage else None,
                     output_tokens=usage.output_tokens if usage else None,
                     cache_read_tokens=usage.cache_read_tokens if usage else None,
                     cache_write_tokens=usage.cache_write_tokens if usage else None,
                     reasoning_tokens=usage.reasoning_tokens if usage else None,
                     finish_reason=finish_reason(reply), estimate=prepared.estimate, cost_usd=cost,
                     reply_limit=limit.max_tokens)
        update: dict[str, Any] = {"messages": [reply], "spent": spend.spent.as_dict(), "context": context.as_dict()}
        if is_agent and (reply.tool_calls or reply.invalid_tool_calls):
            budget_stop = spend.stop_reason(before_model_call=False)
            if budget_stop:
                update["stop_reason"] = budget_stop.value
            return update
        if ctx.condition.kind == BASH:  # a reply that runs no command ends it; the score node takes the file
            update["stop_reason"] = SUBMITTED
            return update
        # No tool call (always so for zero-shot): the reply's code, if any, is the answer.
        if reply.id is None:  # add_messages would give it one; the candidate record needs it now
            reply.id = str(uuid.uuid4())
        code = prompting.extract(state.get("prompt") or {}, message_text(reply))
        if code is None:  # the last candidate, if any, is scored; a reply cut by a spent budget says so
            budget_stop = spend.stop_reason(before_model_call=False)
            update["stop_reason"] = (budget_stop.value if budget_stop else
                                     MODEL_ENDED if state.get("candidates") else NO_CODE)
            return update
        _drop_orphans(ctx, state)
        entry = reply_candidate(ctx, code, reply.id, **_progress(spend.spent))
        update["candidates"] = [*(state.get("candidates") or []), entry]
        update["submitted"] = entry["path"]
        update["stop_reason"] = SUBMITTED if is_agent else ZERO_SHOT
        return update

    def tools(state: AgentState) -> dict[str, Any]:
        started = time.perf_counter()
        spend = tracker(state)
        reply = state["messages"][-1]
        assert isinstance(reply, AIMessage)
        candidates = list(state.get("candidates") or [])
        _drop_orphans(ctx, state)
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
                messages.append(ToolMessage(content=f"not run: {why}", tool_call_id=call_id, name=name,
                                            status="error"))
                continue
            outcome, gpu_s, error = run_tool_call(ctx, name, call.get("args") or {}, wall_left=left)
            spend.record_tool(name, gpu_s)
            if error is not None:
                messages.append(ToolMessage(content=error, tool_call_id=call_id, name=name, status="error"))
                continue
            assert outcome is not None  # run_tool_call gives an outcome exactly when it gives no error
            if outcome.candidate is not None:  # saved by the tool, with its record beside it
                correct, counted = final_scoring.tool_judgement(outcome.data)
                candidates.append(candidate_entry(
                    ctx, Path(outcome.candidate), name, call_id, None, (outcome.data or {}).get("verdict"),
                    counted, correct=correct, sha256=_sha256(Path(outcome.candidate)), **_progress(spend.spent)))
            if outcome.ends_sample:  # its own candidate, else the last one; "" when there is none (no_code)
                submitted = candidates[-1]["path"] if candidates else ""
            messages.append(ToolMessage(content=outcome.text, tool_call_id=call_id, name=name))
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

    def score(state: AgentState) -> dict[str, Any]:
        candidates = list(state.get("candidates") or [])
        update: dict[str, Any] = {}
        if ctx.condition.kind == BASH:  # the file in the scratch folder is the answer, as PKB's agent's is
            _drop_orphans(ctx, state)
            final, added = _shell_file(ctx, candidates, Spent.from_dict(state.get("spent")))
            if added:
                update["candidates"] = candidates
            update["submitted"] = final
            if final is None and state.get("stop_reason") == SUBMITTED:
                update["stop_reason"] = NO_CODE
        else:
            final = state.get("submitted") or (candidates[-1]["path"] if candidates else None)
        reason = checked(update.get("stop_reason", state.get("stop_reason")))  # an unknown reason fails here
        if final is not None and reason == NO_CODE:  # a scored sample never says no_code
            update["stop_reason"] = MODEL_ENDED
        if final is None or not score_final:
            return {**update, "result": None, "held_out": [], "best": None,
                    "scoring": {"seconds": 0.0, "gpu_s": 0.0, "attempts": 0, "final": final}}
        write_bytes_atomic(ctx.directory.final_py, (ctx.directory.path / final).read_bytes())
        scored = _score(ctx, ctx.directory.final_py, log_dir=ctx.directory.logs)
        if log is not None:
            log.info("scored", final=final, verdict=scored.result.verdict, speedup=scored.result.speedup,
                     seconds=round(scored.visible.seconds, 3), attempts=scored.visible.attempts,
                     held_out=[(h["shape"], h["verdict"]) for h in scored.shapes])
        best = final_scoring.score_best(ctx.problem, ctx.directory.path, candidates, final, evaluate=_evaluate(ctx),
                                        config=ctx.config, world_size=ctx.world_size, device=ctx.device,
                                        shape=ctx.shape, log=log)
        out = scored.state()
        out["scoring"].update(seconds=out["scoring"]["seconds"] + float((best or {}).get("seconds") or 0.0),
                              gpu_s=out["scoring"]["gpu_s"] + float((best or {}).get("gpu_s") or 0.0), final=final)
        return {**update, **out, "best": best}

    def after_guard(state: AgentState) -> str:
        return "score" if state.get("stop_reason") else "model"

    def after_model(state: AgentState) -> str:
        return "score" if state.get("stop_reason") else "tools"

    def after_tools(state: AgentState) -> str:
        return "score" if state.get("stop_reason") else "guard"

    graph = StateGraph(AgentState)
    graph.add_node("guard", guard)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_node("score", score)
    graph.add_edge(START, "guard")
    graph.add_conditional_edges("guard", after_guard, ["model", "score"])
    graph.add_conditional_edges("model", after_model, ["tools", "score"])
    graph.add_conditional_edges("tools", after_tools, ["guard", "score"])
    graph.add_edge("score", END)
    return graph.compile(checkpointer=checkpointer)


def recursion_limit(budget: Budget) -> int:
    """LangGraph's step limit: three steps a turn (guard, model, tools) and a margin; the budget stops first."""
    return 3 * budget.max_turns + 10 if budget.max_turns is not None else 1_000_000


# -- transcript -------------------------------------------------------------------------------------
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

