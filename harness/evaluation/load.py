"""The candidate loaded on every rank of its pool: the problem set up, the candidate imported, and what its
import did (flags, collectives) recorded."""

from __future__ import annotations

import time

from harness.common import messages
from harness.evaluation.asking import ask
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.evaluation.stop import flags_of
from harness.judge.reference import ReferenceRun
from harness.launch.pool import RankPool
from harness.rank.candidate import required_positional


def load(ctx: Context, record: Record, reference: ReferenceRun, pool: RankPool) -> None:
    """Set up and import the candidate on every rank (the reference's process groups given to them)."""
    limits = ctx.config.limits
    started = time.perf_counter()
    ask(ctx, record, pool, messages.Setup(problem=ctx.problem.loader_spec, shape=ctx.shape,
                                          groups=list(reference.groups)), "load", limits.load_s)
    params = len(required_positional(ctx.problem.solution))
    replies = ask(ctx, record, pool, messages.LoadCandidate(candidate=str(ctx.code_path), params=params),
                  "load", limits.load_s)
    record.flags.extend(flags_of(replies))
    events = pool.take_events()
    if events or any(r.get("collectives") for r in replies):
        record.evidence.setdefault("collectives", {})["import"] = {
            str(r["rank"]): r.get("collectives", {}) for r in replies if r.get("collectives")} | (
            {"events": {str(k): v for k, v in events.items()}} if events else {})
    record.stages["load"] = time.perf_counter() - started
