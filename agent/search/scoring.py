"""The harness side of a search: a problem's roofline bound, one candidate's evaluation, and what the archive
keeps of it.

Evaluations go through a function with harness.evaluate.evaluate's signature; by default
agent.executors.as_evaluate over the search's executor, so on one node every evaluation runs in a lease
of the DeviceScheduler (native code built before the lease is taken: the GPU never waits on a compiler),
and with the Ray executor as a task on a node of the cluster. The model is called elsewhere, never inside
a lease. An `infra_error` (the harness's own failure) is tried again (agent.scoring, as the runner does).

The roofline bound of a problem (harness.measure.roofline: interconnect, HBM and FLOP bounds of the reference's
traffic over this machine's ceilings) is computed once per search, on the devices (`bound_on_node`, via
the executor), and kept in the archive; a candidate's fraction is bound / its median time. On CPU the
fractions are GPU ceilings over CPU times: tiny, and only proof of the plumbing.

At the end, and again with `pkb rescore RUN`, the top kernels are re-measured (`remeasure_kernel`): the search's
settings around agent.remeasure, the one function both call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import remeasure, scoring
from agent.final_scoring import EvaluateFn as EvaluateFn  # harness.evaluate.evaluate's signature
from agent.remeasure import Remeasurement, Round
from agent.scoring import Scored
from agent.search.archive import Rescore
from agent.search.config import SearchConfig, derived_seed
from harness.common.flags import SPEEDUP_DISQUALIFIERS
from harness.config import EvalConfig
from harness.measure.roofline import cached_trace, resolve_ceilings, roofline
from harness.problems.problem import Problem
from harness.records.results import EvalResult

MAX_EVIDENCE_CHARS = 4000



def trusted(result: EvalResult) -> bool:
    """Correct, and no integrity flag voids its speedup: only such results steer the search."""
    return bool(result.correct and result.fast_eligible and not (set(result.flags) & SPEEDUP_DISQUALIFIERS))


def score(evaluate: EvaluateFn, problem: Problem, path: Path, *, config: EvalConfig, world_size: int, device: str,
          shape: str, log_dir: Path | None, log: Any = None) -> Scored:
    """One candidate through the harness by agent.scoring (an infra_error is retried)."""
    return scoring.score(lambda: evaluate(problem, path, world_size=world_size, device=device, shape=shape,
                                          config=config, log_dir=log_dir),
                         log=log, event="search_infra_error", candidate=str(path))


def fraction(result: EvalResult, bound_ms: float | None) -> float | None:
    if bound_ms is None or bound_ms <= 0 or not result.correct or result.timings is None:
        return None
    median = result.timings.candidate.median_ms
    return bound_ms / median if median > 0 else None


def outcome(scored: Scored, bound: tuple[float | None, str | None] | None, elapsed_s: float) -> dict[str, Any]:
    """The archive's evaluated columns for one result."""
    result = scored.result
    failure = result.failure
    bound_ms, binding = bound if bound is not None else (None, None)
    timings = result.timings
    return {
        "verdict": result.verdict, "correct": result.correct,
        "failure_phase": failure.phase if failure else None, "failure_rank": failure.rank if failure else None,
        "failure_message": failure.message if failure else None,
        "failure_evidence": failure.evidence[-MAX_EVIDENCE_CHARS:] if failure else None,
        "speedup": result.speedup if result.correct else None,
        "candidate_ms": timings.candidate.median_ms if timings else None,
        "reference_ms": timings.reference.median_ms if timings else None,
        "roofline_fraction": fraction(result, bound_ms), "binding": binding if result.correct else None,
        "flags": sorted(result.flags), "fast_eligible": result.fast_eligible, "trusted": trusted(result),
        "gpu_s": round(scored.gpu_s, 6), "stages": result.stages, "eval_s": round(scored.seconds, 6),
        "attempts": scored.attempts, "result": result.model_dump_json(), "elapsed_s": round(elapsed_s, 3),
    }


def unevaluated(verdict: str, message: str, elapsed_s: float) -> dict[str, Any]:
    """The evaluated columns of a candidate that never reached the harness (no code, a model error)."""
    return {"verdict": verdict, "correct": False, "failure_message": message[:MAX_EVIDENCE_CHARS], "flags": [],
            "fast_eligible": False, "trusted": False, "gpu_s": 0.0, "stages": {}, "eval_s": 0.0, "attempts": 0,
            "elapsed_s": round(elapsed_s, 3)}


# -- re-measuring -------------------------------------------------------------------------------------------
SEARCH_REMEASURE = "rescore"  # the tag of the search's own re-measurement seeds (its name since the first archives)
CLI_REMEASURE = "pkb-rescore"  # `pkb rescore RUN`'s: fresh again, never the search's


def remeasure_seeds(config: SearchConfig, tag: str, k: int | None = None) -> list[int]:
    """`k` (default: the search's `remeasure`) seeds no evaluation of the search drew (their feedback never
    reached the model), one set per `tag`."""
    return [derived_seed(config.seed, i, tag) % 2**31 for i in range(config.remeasure if k is None else k)]


def remeasure_kernel(config: SearchConfig, evaluate: EvaluateFn, problem: Problem, path: Path, seeds: list[int], *,
                     done: dict[int, Round] | None = None,
                     on_round: Callable[[Round, EvalResult], None] | None = None,
                     log: Any = None) -> Remeasurement:
    """A search's kernel re-measured by agent.remeasure with the search's world size, device, shape and
    evaluation settings (the reference timed beside every round)."""
    return remeasure.remeasure(problem, path, evaluate=evaluate, config=config.eval_config(rescore=True),
                               seeds=seeds, world_size=config.world_size, device=config.device, shape=config.shape,
                               done=done, on_round=on_round, log=log)


def rescore_row(problem: str, candidate: int, found: Round, bound: tuple[float | None, str | None] | None,
                result: EvalResult) -> Rescore:
    """The archive's row of one round (agent.search.archive.Rescore), its clock fields apart."""
    record = {k: v for k, v in found.record().items() if k not in remeasure.CLOCK_FIELDS}
    return Rescore(problem, candidate, found.seed, found.verdict or "", found.correct, found.speedup,
                   fraction(result, bound[0] if bound else None) if found.correct else None, list(found.flags),
                   found.trusted, found.gpu_s, record)


def round_of(r: Rescore, device: str) -> Round:
    """An archived round back as agent.remeasure's; a row of an archive older than rounds is read from its
    columns (its held-out shapes unknown, so none)."""
    if r.record is not None:
        return Round.from_record({**r.record, "gpu_s": r.gpu_s})
    timing = (remeasure.CPU if device == "cpu" else remeasure.GPU) if r.speedup is not None else remeasure.UNTIMED
    return Round(seed=r.seed, shape="", verdict=r.verdict, correct=r.correct, correct_visible=r.correct, held_out=[],
                 timing=timing, speedup=r.speedup, candidate_ms=None, reference_ms=None, flags=list(r.flags),
                 fast_eligible=r.trusted, trusted=r.trusted, gpu_s=r.gpu_s)


# -- the roofline bound ------------------------------------------------------------------------------------
def bound_on_node(problem: Problem, shape: str, world_size: int, device: str) -> dict[str, Any]:
    """The roofline record of `problem` (no timings), computed where the devices are (a Ray task or a lease)."""
    traced = cached_trace(problem, shape, world_size, device)
    record = roofline(problem, shape, world_size, device, resolve_ceilings(None, device), traced=traced)
    return json.loads(record.model_dump_json())


def bound_of(record: dict[str, Any]) -> tuple[float | None, str | None]:
    bound_s = record.get("bound_s")
    if not isinstance(bound_s, (int, float)) or bound_s <= 0:
        return None, None
    return float(bound_s) * 1e3, str(record.get("binding"))
