"""The timing phase: the candidate timed one request per iteration, the same requests as the reference's
(harness.judge.timing drives them); then, with the ranks idle, the kept outputs of the judged calls
(timed_outputs), the input sets' fingerprints, and the claimed times against this process's clock
(reconcile)."""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import cast

import torch

from harness.common import hostile_files, messages
from harness.common.seeds import TIMING_TRIAL_BASE, fill_recipe
from harness.evaluation.asking import ask, note_collectives
from harness.evaluation.context import Context
from harness.evaluation.reconcile import timing_claims
from harness.evaluation.record import Record
from harness.evaluation.stop import candidate_files, inputs_changed
from harness.evaluation.timed_outputs import TimedJudge, Wrong
from harness.judge.reference import ReferenceRun, TimingSets
from harness.judge.timing import Plan, drive, miss_probability, recipes_for, stats
from harness.launch.pool import RankPool
from harness.records.results import Clock, Timings, TimingStats


def time_candidate(ctx: Context, record: Record, reference: ReferenceRun, pool: RankPool, ref_stats: TimingStats,
                   plan: Plan) -> None:
    """The candidate's timings in the record, beside the reference's; a wrong judged call, changed inputs, a
    failure or a hang raises Stop."""
    sets = reference.sets
    assert sets is not None
    limits = ctx.config.limits
    scratch, files = pool.scratch, pool.scratch_files
    assert scratch is not None and files is not None
    started = time.perf_counter()
    keep_dir = scratch / "kept"
    ask(ctx, record, pool, _begin(ctx, sets, plan, files, scratch / "sets"), "timing", limits.time_s)
    pool.take_events()
    judged = [it for it in plan.iterations if it.judged]
    calls = sum(1 for it in plan.iterations if it.kind != "probe")
    record.evidence["timed_judging"] = {
        "refill": plan.refill, **({} if plan.refill else {"why_not": sets.why_not}),
        "calls": calls, "judged": len(judged), "probes": sum(1 for it in judged if it.kind == "probe"),
        "miss_probability_at_20pct_wrong": round(
            miss_probability(calls, len(judged) - sum(1 for it in judged if it.kind == "probe"), 0.2), 6)}
    run = drive(pool, functools.partial(ask, ctx, record), plan, n_sets=sets.count, recipes=recipes_for(ctx.seed),
                config=ctx.config.timing, cuda=ctx.device == "cuda", keep_dir=keep_dir,
                call_timeout=limits.time_s, deadline=time.monotonic() + limits.time_s,
                on_kept=lambda kept: None, check_inputs=not sets.mutated)
    note_collectives(record, "timing", pool.take_events())
    clock: Clock = "cuda_events" if ctx.device == "cuda" else "host"
    candidate = stats(run, clock)
    record.timings = Timings(reference=ref_stats, candidate=candidate)
    record.stages["timing"] = time.perf_counter() - started
    # Judged after the phase, not between its iterations: the judge's own work (torch's threads spinning
    # after a comparison) would otherwise slow the candidate's next iterations and not the reference's.
    # One torch thread: the comparisons are of at most timed_check_elements each, and on a busy machine
    # torch's thread pool made each one 5-15x slower (30 ms against 170-500 ms at 256K elements, 2 cores).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    judge = TimedJudge(ctx, files, sets, plan.refill)
    wrong: list[Wrong] = []
    try:
        for kept in run.kept:
            wrong += judge.judge(kept)
    finally:
        torch.set_num_threads(threads)
        record.evidence["timed_outputs_judged"] = judge.judged
        for kept in run.kept:  # what judging left (it stopped early): the scratch goes at the end anyway
            for path in kept.paths.values():
                with contextlib.suppress(hostile_files.HostileFile, OSError):
                    judge.remove(path)
    record.stages["timing_judge"] = time.perf_counter() - started - record.stages["timing"]
    if not plan.refill and not sets.mutated:
        for rank, prints in run.fingerprints.items():
            if prints != sets.fingerprints.get(rank):
                raise inputs_changed(rank, "an input set changed while it was timed")
    if wrong:
        raise judge.verdict(record, wrong)
    timing_claims(ctx, record, run, candidate, ref_stats)


def _begin(ctx: Context, sets: TimingSets, plan: Plan, files: hostile_files.Folder,
           sets_dir: Path) -> dict[int, messages.CallTimeBegin]:
    """Each rank's first request of the phase: where it refills, the recipes of its sets' first contents (the
    rank draws them itself, as every call's); otherwise the sets, copied into its scratch."""
    per_rank: dict[int, messages.CallTimeBegin] = {}
    with candidate_files("timing"):
        files.make_dir("sets")
        files.make_dir("kept")
        for rank in range(ctx.world_size):
            if plan.refill:
                fills = [cast(messages.Recipe, fill_recipe(ctx.seed, TIMING_TRIAL_BASE + k, rank))
                         for k in range(sets.count)]
                per_rank[rank] = messages.CallTimeBegin(candidate=str(ctx.code_path), clone_inputs=sets.mutated,
                                                        set_fills=fills)
                continue
            names = [f"set{i}" for i in range(sets.count)] + [f"fresh{j}" for j in range(sets.fresh)]
            paths = []
            for name in names:
                target = sets_dir / f"{name}-r{rank}.pt"
                files.copy_new(target, ctx.ref_dir / f"in-{name}-r{rank}.pt")
                paths.append(str(target))
            per_rank[rank] = messages.CallTimeBegin(candidate=str(ctx.code_path), clone_inputs=sets.mutated,
                                                    sets=paths[:sets.count], fresh=paths[sets.count:])
    return per_rank
