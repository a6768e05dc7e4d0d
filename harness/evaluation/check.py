"""The correctness phase: one request per trial, each carrying its inputs, in the secret order; every rank's
output judged here as it comes back (harness.judge.trials), and the trials' verdict."""

from __future__ import annotations

import time
from pathlib import Path

from harness.common import failures, integrity, messages
from harness.evaluation.asking import ask, note_collectives
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.evaluation.stop import Stop, candidate_files, flags_of
from harness.judge import trials
from harness.judge.reference import ReferenceRun
from harness.launch.pool import RankPool
from harness.records.results import Failure


def check(ctx: Context, record: Record, reference: ReferenceRun, pool: RankPool,
          schedule: list[trials.Trial]) -> None:
    """Every trial of `schedule` on the candidate's ranks; a wrong output, a failure or a hang raises Stop."""
    limits, checks = ctx.config.limits, ctx.checks
    scratch, files = pool.scratch, pool.scratch_files
    assert scratch is not None and files is not None
    calls_dir = scratch / "calls"
    with candidate_files("check"):
        files.make_dir("calls")
    # A slow reference (PKB's 76-78 take a minute a call at small shapes) stretches the budget; a fast
    # one leaves it as configured, whatever the machine's load did to its measured time.
    slow = reference.trial_seconds if reference.trial_seconds > 1.0 else 0.0
    budget = max(limits.check_s, limits.check_scale * slow * len(schedule))
    deadline = time.monotonic() + budget
    judge = trials.Judge(ctx.problem.atol, ctx.problem.rtol, ctx.device, ctx.ref_dir, files, ctx.world_size)
    results: list[trials.CallResult] = []
    started = time.perf_counter()
    for index, trial in enumerate(schedule):
        delays = trials.delays(trial, checks, ctx.world_size, ctx.rng)
        per_rank: dict[int, messages.Call] = {}
        paths = {}
        ref = reference.trials[trial.id]
        for rank in range(ctx.world_size):
            stem = calls_dir / f"c{index}-r{rank}"
            inputs = Path(f"{stem}-in.pt")
            with candidate_files("check"):  # a name planted where the inputs go: never written through
                files.copy_new(inputs, ctx.ref_dir / f"in-{trial.id}-r{rank}.pt")
            paths[rank] = {"output": f"{stem}-out.bin", "previous_output": f"{stem}-prev.bin",
                           "inputs_after": f"{stem}-after.bin"}
            per_rank[rank] = messages.Call(
                candidate=str(ctx.code_path), inputs=str(inputs), output=paths[rank]["output"],
                previous_output=paths[rank]["previous_output"],
                return_inputs=paths[rank]["inputs_after"] if ref[rank].get("mutated") else None,
                delay_s=delays[rank], lazy_delay_s=checks.lazy_delay_s, busy_bytes=checks.busy_bytes)
        loopback = pool.net_bytes()
        timeout = max(1.0, deadline - time.monotonic())
        try:
            # A build only a call reveals (PKB's lazy builds) is limited by build_s, not the call's time.
            replies = ask(ctx, record, pool, per_rank, "check", timeout, build_allowance=limits.build_s)
        except Stop as stop:
            if stop.failure.trial is None:
                stop.failure.trial = trial.id
            if index == 0 and stop.failure.verdict == failures.COMPILE_ERROR:
                stop.failure.phase = "compile"
            raise
        after = pool.net_bytes()
        traffic = after - loopback if after is not None and loopback is not None else None
        counted = index > 0  # a rank's first call is set-up: a rendezvous, groups, a lazy build
        events = pool.take_events()
        if counted and (events or traffic or any(r.get("collectives") for r in replies)):
            note_collectives(record, "check", events, replies, traffic)
        record.flags.extend(flags_of(replies))
        result = trials.CallResult(trial, index)
        judge.judge_call(result, replies, paths, ref)
        results.append(result)
        with candidate_files("check"):
            for rank in range(ctx.world_size):
                for suffix in ("-in.pt", "-out.bin", "-out.bin.later", "-prev.bin", "-after.bin"):
                    files.unlink(f"calls/c{index}-r{rank}{suffix}")
    record.stages["check"] = time.perf_counter() - started
    if pool.build_seconds() > 0.0:
        # Builds inside calls, reported apart (and not charged to the check's budget: see build_s).
        record.stages["build_in_call"] = pool.build_seconds()
    _decide(record, reference, judge, results, schedule)


def _decide(record: Record, reference: ReferenceRun, judge: trials.Judge, results: list[trials.CallResult],
            schedule: list[trials.Trial]) -> None:
    """The trials' verdict, their worst errors and the rules that judged them, in the record; a failure raises
    Stop."""
    notes_in = {int(r): rec.get("probe_note") for tid, by_rank in reference.trials.items()
                for r, rec in by_rank.items() if tid == integrity.PROBE_TRIAL}
    failure, flags, notes = trials.decide(results, notes_in)
    record.flags.extend(flags)
    if notes:
        record.evidence["notes"] = notes
    record.evidence["rules"] = {rule: trials.RULES[rule] for rule in sorted(judge.rules)}
    record.evidence["order"] = [t.id for t in schedule]
    record.max_abs, record.max_rel = trials.worst_errors(results)
    if failure is not None:
        record.max_abs = failure.get("max_abs_err", record.max_abs)
        record.max_rel = failure.get("max_rel_err", record.max_rel)
        raise Stop(Failure(verdict=failure["verdict"], message=failure["message"], rank=failure.get("rank"),
                           trial=failure.get("trial"), call=failure.get("call"), phase="check",
                           max_abs_err=failure.get("max_abs_err"), max_rel_err=failure.get("max_rel_err")))
