"""An agent proposer: each candidate of a search written by one episode of `pkb run`'s agent loop (agent.graph).

`pkb search --proposer agent:compile+check` (a condition name, agent.conditions) gives the model those tools
for at most `--proposer-turns` model calls: it may compile and check drafts before one is handed to the
search, so a broken draft costs a tool call instead of an evaluation slot. The episode is the agent loop of
a `pkb run` sample (the same graph: budget guard, tool calls through agent.tool_calls with a device lease or
the executor, context management, provider errors) without its final scoring: the candidate it submits, or
else its last one, is what the search evaluates, records and breeds from, exactly as a zero-shot proposal.

The prompt is the search's (the task, and for a refinement the parent, its measurements and roofline), with
the system prompt of the agent condition (the tools listed). The tools check with a seed of their own,
derived from the search's seed and the slot, never the one the evaluation draws its inputs from. Each
episode's files (its candidates with their tool results, and transcript.json) are kept in
runs/<search>/episodes/<slot>/; a slot killed mid-episode starts its episode again on resume. What it spent
goes to the search's budgets: tokens and dollars as a proposal's, its tools' device seconds beside the
evaluation's (the archive's proposer_gpu_s), its wall time as the model's seconds.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from agent.budgets import Budget, Spent
from agent.conditions import Condition
from agent.executors.interface import Executor
from agent.graph import build_graph, recursion_limit, write_transcript
from agent.run_config import RunConfig
from agent.rundir import SampleDir
from agent.sample_context import SampleContext
from agent.scheduler import DeviceScheduler
from agent.usage import PriceTable
from harness.config import EvalConfig
from harness.problems.problem import Problem


@dataclass
class Episode:
    source: str | None  # the candidate handed to the search; None when the episode produced none
    final: str | None  # its path within the episode's folder
    stop_reason: str | None
    spent: Spent
    error: str | None = None


@dataclass
class Where:
    """Where an episode's tools run: this node's scheduler, or an executor (a Ray cluster)."""

    scheduler: DeviceScheduler | None
    executor: Executor | None
    world_size: int
    device: str
    shape: str
    topology: dict[str, Any] | None = None


def run(*, problem: Problem, condition: Condition, model: BaseChatModel, model_name: str,
        messages: list[BaseMessage], folder: Path, turns: int, config: EvalConfig, where: Where,
        prices: PriceTable | None, model_attempts: int, guide_in_prompt: bool, log: Any = None) -> Episode:
    """One episode (see the module doc); provider errors leave as agent.graph raises them."""
    if folder.exists():  # a slot killed mid-episode: its episode starts again
        shutil.rmtree(folder)
    directory = SampleDir(folder)
    folder.mkdir(parents=True)
    budget = Budget(max_turns=turns, max_wall_s=None)
    # The episode's settings as a run's: its own budget (turns, no wall), where it runs, the search's model.
    settings = RunConfig(model=model_name, conditions=[condition.name], problems=[problem.name],
                         world_size=where.world_size, device=where.device, shape=where.shape,
                         budgets=budget.as_dict(), model_attempts=model_attempts, guide_in_prompt=guide_in_prompt)
    ctx = SampleContext(problem=problem, condition=condition, model=model, run=settings, directory=directory,
                        prices=prices, config=config, scheduler=where.scheduler, topology=where.topology, log=log,
                        executor=where.executor)
    start = {"messages": messages, "spent": Spent().as_dict(), "candidates": [], "stop_reason": None,
             "submitted": None}
    state = build_graph(ctx, score_final=False).invoke(start, {"recursion_limit": recursion_limit(budget)})
    write_transcript(directory, state.get("messages") or [], state.get("candidates") or [])
    final = (state.get("scoring") or {}).get("final")
    source = (folder / final).read_text() if final else None
    return Episode(source, final, state.get("stop_reason"), Spent.from_dict(state.get("spent")), state.get("error"))
