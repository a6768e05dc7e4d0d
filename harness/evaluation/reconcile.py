"""What the timings claim, held against what else is known: implausible times, inputs cached between calls,
the rank's clock against this process's, and, after the ranks are gone, the roofline's lower bound."""

from __future__ import annotations

from harness.common import integrity
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.judge import plausibility, timing
from harness.measure import roofline
from harness.records.results import TimingStats


def timing_claims(ctx: Context, record: Record, run: timing.TimingRun, candidate: TimingStats,
                  reference: TimingStats) -> None:
    """Flags and evidence of the timing phase's claims: implausible times, input caching, inconsistency."""
    checks = ctx.checks
    problems = [p for ranks in run.times.get("timed", []) for p in plausibility.timing_problems(ranks)]
    problems = sorted(set(problems + plausibility.timing_problems([max(r) for r in run.times.get("timed", [])])))
    if problems:
        record.flags.append(integrity.TIMING_IMPLAUSIBLE)
        record.evidence["timing_problems"] = problems
    pairs = timing.fresh_pairs(run)
    if plausibility.caching_suspected(pairs, reference.median_ms, checks):
        record.flags.append(integrity.INPUT_CACHING)
        record.evidence["input_caching"] = {
            "pairs_ms": [[round(r, 4), round(f, 4)] for r, f in pairs],
            "median_excess_ms": plausibility.caching_excess_ms(pairs, checks),
            "margin_ms": plausibility.caching_margin_ms(reference.median_ms, checks)}
    if checks.reconcile:
        inconsistent = timing.reconcile(candidate, reference, checks)
        if inconsistent:
            record.flags.append(integrity.TIMING_INCONSISTENT)
            record.evidence["timing_inconsistent"] = inconsistent


def roofline_bound(ctx: Context, record: Record) -> None:
    """A candidate faster than the roofline's lower bound is `impossible`. Called after the ranks are gone:
    the bound traces the reference once (then reads a cache), in clean processes of its own, never beside a
    candidate."""
    assert record.timings is not None
    try:
        bound = plausibility.usable_bound(roofline.lower_bound_ms(ctx.problem, ctx.shape, ctx.world_size, ctx.device))
    except Exception as exc:  # noqa: BLE001 - the reference's trace failed: no bound, said so
        record.evidence["roofline_bound_error"] = f"{type(exc).__name__}: {exc}"[:500]
        bound = None
    if bound is not None:
        record.evidence["roofline_bound_ms"] = bound
        if plausibility.beats_the_roofline(record.timings.candidate.median_ms, bound, ctx.checks):
            record.flags.append(integrity.IMPOSSIBLE)
