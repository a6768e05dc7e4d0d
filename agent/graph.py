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

The nodes are named functions of their own modules over one NodeContext (agent.graph_state): agent.model_node,
agent.tools_node, agent.score_node; this module wires them and holds the guard.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, StateGraph

from agent import prompting
from agent.budgets import Budget
from agent.context import ContextPolicy, tools_token_count
from agent.final_scoring import SCORING_SEED_OFFSET as SCORING_SEED_OFFSET  # re-exported: their old home
from agent.final_scoring import scoring_seed as scoring_seed
from agent.graph_state import CONTEXT_OVERFLOW as CONTEXT_OVERFLOW  # re-exported: the names callers know
from agent.graph_state import MODEL_ENDED as MODEL_ENDED
from agent.graph_state import MODEL_ERROR as MODEL_ERROR
from agent.graph_state import NO_CODE as NO_CODE
from agent.graph_state import REPLAYED as REPLAYED
from agent.graph_state import SUBMITTED as SUBMITTED
from agent.graph_state import ZERO_SHOT as ZERO_SHOT
from agent.graph_state import AgentState, NodeContext
from agent.graph_state import FatalProviderError as FatalProviderError
from agent.graph_state import TransientProviderError as TransientProviderError
from agent.graph_state import is_fatal as is_fatal
from agent.graph_state import is_transient as is_transient
from agent.model_node import model
from agent.model_table import load_model_table
from agent.sample_context import SampleContext
from agent.score_node import score
from agent.tool_calls import tool_context
from agent.tools_node import tools
from agent.transcript import finish_reason as finish_reason  # re-exported: read off a reply
from agent.transcript import write_transcript as write_transcript
from tools import bash as shell
from tools.langchain_tools import make_tools


def opening(ctx: SampleContext) -> prompting.Opening:
    """The sample's first messages and where they come from (agent.prompting); for bash, its scratch files."""
    return prompting.opening(ctx.prompt, ctx.condition, ctx.problem, shape=ctx.shape, world_size=ctx.world_size,
                             topology=ctx.topology, guide_in_prompt=ctx.guide_in_prompt, model_name=ctx.model_name,
                             scratch=ctx.directory.path / shell.SHELL_DIR)


def bind_model(ctx: SampleContext) -> tuple[Runnable[Any, BaseMessage], int]:
    """The chat model with the condition's tools bound (zero-shot: the bare model, no tools), and the
    tokens the tool schemas add to every request."""
    if ctx.model is None:
        raise ValueError(f"condition {ctx.condition.name} needs a chat model")
    if not ctx.condition.uses_tools:
        return ctx.model, 0
    schema_ctx = tool_context(ctx, gpus=None)
    bound_tools = make_tools(list(ctx.condition.bound_tools), schema_ctx)
    return ctx.model.bind_tools(bound_tools), tools_token_count([convert_to_openai_tool(t) for t in bound_tools])


def node_context(ctx: SampleContext, *, score_final: bool = True) -> NodeContext:
    """What the nodes read besides the state: the bound model, the model table's and price table's word on it."""
    bound, tools_tokens = bind_model(ctx)
    return NodeContext(sample=ctx, bound=bound, tools_tokens=tools_tokens,
                       info=load_model_table().info(ctx.model_name),
                       price=ctx.prices.price(ctx.model_name) if ctx.prices is not None else None,
                       policy=ctx.context_policy or ContextPolicy(window=None), score_final=score_final)


def guard(nodes: NodeContext, state: AgentState) -> dict[str, Any]:
    """The budget check before every model call."""
    reason = nodes.tracker(state).stop_reason(before_model_call=True)
    if reason and nodes.log is not None:
        nodes.log.info("budget_stop", reason=reason.value, spent=state.get("spent"))
    return {"stop_reason": reason.value} if reason else {}


def after_guard(state: AgentState) -> str:
    return "score" if state.get("stop_reason") else "model"


def after_model(state: AgentState) -> str:
    return "score" if state.get("stop_reason") else "tools"


def after_tools(state: AgentState) -> str:
    return "score" if state.get("stop_reason") else "guard"


def build_graph(ctx: SampleContext, checkpointer: Any = None, *, score_final: bool = True) -> Any:
    """The compiled graph of one sample; `checkpointer` (a SqliteSaver) makes it resumable. With
    `score_final` false the score node only names the final candidate (scoring.final) and evaluates nothing: a
    search's agent proposer, whose candidate the search evaluates itself (agent.search.episode)."""
    nodes = node_context(ctx, score_final=score_final)
    graph = StateGraph(AgentState)
    for name, step in (("guard", guard), ("model", model), ("tools", tools), ("score", score)):
        graph.add_node(name, partial(step, nodes))
    graph.add_edge(START, "guard")
    graph.add_conditional_edges("guard", after_guard, ["model", "score"])
    graph.add_conditional_edges("model", after_model, ["tools", "score"])
    graph.add_conditional_edges("tools", after_tools, ["guard", "score"])
    graph.add_edge("score", END)
    return graph.compile(checkpointer=checkpointer)


def recursion_limit(budget: Budget) -> int:
    """LangGraph's step limit: three steps a turn (guard, model, tools) and a margin; the budget stops first."""
    return 3 * budget.max_turns + 10 if budget.max_turns is not None else 1_000_000
