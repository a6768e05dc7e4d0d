"""A sample's files scored finally (agent.final_scoring) through the sample's executor, else this node's devices
in the scheduler's leases: the graph's score node and the runner's replay and judgement again call these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent import final_scoring
from agent.executors.interface import as_evaluate
from agent.executors.local import LocalExecutor
from agent.sample_context import SampleContext


def evaluator(ctx: SampleContext) -> final_scoring.EvaluateFn:
    return as_evaluate(ctx.executor if ctx.executor is not None else LocalExecutor(ctx.scheduler))


def score_file(ctx: SampleContext, path: Path, *, log_dir: Path | None = None) -> final_scoring.FinalScore:
    """`path` scored finally: the visible shape on scoring_seed(seed), then the held-out shapes."""
    return final_scoring.score_submission(ctx.problem, path, evaluate=evaluator(ctx), config=ctx.config,
                                          world_size=ctx.world_size, device=ctx.device, shape=ctx.shape,
                                          log_dir=log_dir, log=ctx.log)


def score_best(ctx: SampleContext, candidates: list[dict[str, Any]], final: str) -> dict[str, Any] | None:
    """The best candidate by the tools' evidence, scored the same way when it is not `final` (None: none was judged
    correct)."""
    return final_scoring.score_best(ctx.problem, ctx.directory.path, candidates, final, evaluate=evaluator(ctx),
                                    config=ctx.config, world_size=ctx.world_size, device=ctx.device,
                                    shape=ctx.shape, log=ctx.log)
