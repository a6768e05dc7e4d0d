"""The reference side of one evaluation: the trials and timing sets drawn and run by the clean pool, the timing
phase's plan drawn from the secret, the reference timed (or read from the signed cache), while the candidate's
pool starts, with no candidate code in it yet."""

from __future__ import annotations

import time

from harness.common import failures, integrity
from harness.config import EvalConfig
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.evaluation.stop import Stop
from harness.judge import timing, trials
from harness.judge.reference import ReferenceRun
from harness.launch.pool import PoolError, RankPool
from harness.problems.problem import Problem
from harness.records import reference_cache
from harness.records.environment import hardware_key
from harness.records.results import Failure, TimingStats


def reference_key(problem: Problem, shape: str, world_size: int, device: str, config: EvalConfig) -> str:
    """The reference cache's key: everything a reference timing depends on."""
    return "|".join([problem.name, problem.source_sha256[:16], shape, str(world_size), device,
                     hardware_key(), config.timing_key(), str(config.seed), f"rpg{config.ranks_per_gpu}",
                     "per-iteration-v3-refill"])


def run_reference(ctx: Context, record: Record, reference: ReferenceRun, pool: RankPool,
                  schedule: list[trials.Trial]) -> tuple[TimingStats, timing.Plan] | None:
    """The reference's trials and sets made and, unless timing is skipped, its timing with the timing phase's
    plan (None when skipped); the candidate's pool ready at the end."""
    config, checks = ctx.config, ctx.checks
    started = time.perf_counter()
    reference.wait_ready()
    reference.prepare_trials(schedule, ctx.seed)
    plan: timing.Plan | None = None
    if not config.skip_timing:
        plan = timing_plan(ctx, reference)
        sets = reference.prepare_sets(ctx.seed, config.timing, checks.fresh_iters, plan)
        if not sets.refill:
            plan = plan.without_refill()
    record.stages["reference"] = time.perf_counter() - started
    # The candidate's pool has been starting meanwhile; no candidate code is in it yet, and it stays
    # idle while the reference is timed.
    launch = time.perf_counter()
    try:
        pool.wait_ready()
    except PoolError as err:
        raise Stop(Failure(verdict=failures.INFRA_ERROR, phase="launch", infra_cause="launch",
                           message=f"the candidate's sandboxed ranks did not start: {err}")) from err
    # From launch to ready, overlapping the reference's work; `launch_wait` is what the reference left.
    record.stages["launch"] = pool.start_seconds
    record.stages["launch_wait"] = time.perf_counter() - launch
    timed = None
    if plan is not None:
        started = time.perf_counter()
        key = reference_key(ctx.problem, ctx.shape, ctx.world_size, ctx.device, config)
        cv_max = checks.reference_cv_max
        ref_stats = reference_cache.lookup(key, cv_max) if config.use_reference_cache else None
        if ref_stats is None:
            seed, drawn = ctx.seed, plan
            ref_stats, outcome = reference_cache.time_until_stable(
                lambda: reference.time(config.timing, seed, drawn), cv_max, checks.reference_attempts)
            outcome["cached"] = outcome["stable"]  # an unstable timing is used here, never reused
            if outcome["stable"]:
                reference_cache.store(key, ref_stats)
        else:
            outcome = {"cv": ref_stats.cv, "cv_max": cv_max, "stable": True, "attempts": 0, "from_cache": True,
                       "cached": True}
        record.evidence["reference_timing"] = outcome
        record.stages["timing_reference"] = time.perf_counter() - started
        timed = (ref_stats, plan)
    reference.close()
    return timed


def timing_plan(ctx: Context, reference: ReferenceRun) -> timing.Plan:
    """The timing phase's calls, drawn from the secret: which are judged, where the precision probes go.
    Probes only where the correctness phase's probe could judge this problem; fewer judged calls where
    their expected outputs would exceed `timed_check_bytes`."""
    checks = ctx.checks
    notes = [rec.get("probe_note") for tid, by_rank in reference.trials.items() for rec in by_rank.values()
             if tid == integrity.PROBE_TRIAL]
    probes = checks.timed_probes if checks.precision_probe and notes and not any(notes) else 0
    judged = checks.timed_checks
    first = min(reference.trials, default=None)
    out_bytes = sum((ctx.ref_dir / f"exp-{first}-r{r}.bin").stat().st_size for r in range(ctx.world_size)
                    if (ctx.ref_dir / f"exp-{first}-r{r}.bin").exists()) if first is not None else 0
    if out_bytes:
        judged = min(judged, max(0, checks.timed_check_bytes // out_bytes - probes))
    return timing.make_plan(ctx.config.timing, checks.fresh_iters, judged, probes, ctx.rng)
