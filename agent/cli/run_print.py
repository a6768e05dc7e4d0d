"""What `pkb run` prints once its run has ended: the summary table by condition, why correct samples are not
fast, the samples still in infra_error and how to judge them again, and how the run held its GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from agent.cli import emulation
from agent.cli.common import console, escape, plain
from agent.report import accounting, metrics
from agent.report.leases import last_pass_summary
from agent.report.summary import run_summary
from agent.rundir import RunDir, read_json
from agent.runner import RunConfig, RunSummary
from harness.common import failures
from harness.common.flags import is_emulated
from harness.emulation import layout


def fast(record: metrics.SampleRecord) -> bool:
    """Correct, faster than the reference, and allowed to count as fast (no integrity flag against it, not
    emulated): agent.report.metrics' rule, the report's."""
    return metrics.is_fast(record, 1.0)


def not_fast(records: Sequence[dict[str, Any]]) -> str | None:
    """Why the correct samples that are not fast are not: the flags that keep a speedup from counting (by
    name, as the report counts them), no speedup over the reference, or no timing. None when all are fast."""
    correct = [r for r in metrics.finished(records) if r.get("correct")]
    left = [r for r in correct if not fast(r)]
    if not left:
        return None
    uncounted = metrics.uncounted_speedups(records)
    untimed = sum(1 for r in left if r.get("speedup") is None)
    slow = sum(1 for r in left if r.get("speedup") is not None and metrics.counted_speedup(r) is not None)
    reasons = []
    if uncounted["samples"]:
        flags = ", ".join(f"{flag} ×{n}" for flag, n in uncounted["flags"].items()) or "not fast-eligible"
        reasons.append(f"{uncounted['samples']} flagged ({flags}): their speedup does not count")
    if slow:
        reasons.append(f"{slow} not faster than the reference")
    if untimed:
        reasons.append(f"{untimed} not timed")
    return f"{len(left)} of {len(correct)} correct sample(s) not fast: " + "; ".join(reasons)


def retry_infra_command(run_id: str, runs_dir: Path) -> str:
    return f"pkb run --run-id {run_id} --retry-infra --runs-dir {runs_dir}"


def print_device_use(run_dir: RunDir) -> None:
    """How this pass of the run held its GPUs (agent.report.leases over its part of events.jsonl)."""
    for line in last_pass_summary(run_dir.events):
        console.print(plain(f"GPUs: {line}"))


def _cost_cell(records: list[dict[str, Any]]) -> str:
    """Dollars, or n/a when any sample's model has no price (a sum of the priced ones would mislead)."""
    if any((r.get("usage") or {}).get("cost_known") is False for r in records):
        return "n/a"
    return f"{sum(float((r.get('usage') or {}).get('cost_usd') or 0.0) for r in records):.4f}"


def _print_incomplete(summary: RunSummary, run_dir: RunDir) -> None:
    """Samples still in infra_error after every judgement: the run is INCOMPLETE. Each one by name, with the cause
    of every judgement, and the command that judges them again."""
    records = summary.infra_records
    console.print(f"[red]INCOMPLETE:[/red] {len(records)} sample(s) still in infra_error (the harness's or the "
                  "machine's failure, not the model's): they count in no rate until judged")
    lasting = False
    for r in records:
        attempts = r.get("attempts") or []
        raw = [str(a.get("infra_cause") or "unknown") for a in attempts] or [str(r.get("infra_cause"))]
        lasting = lasting or raw[-1] in failures.LASTING_INFRA_CAUSES
        causes = ", ".join(f"{c} ({failures.INFRA_CAUSE_LABELS[c]})" if c in failures.INFRA_CAUSE_LABELS else c
                           for c in raw)
        message = next((str(a.get("message")) for a in reversed(attempts) if a.get("message")), "")
        where = f"{r.get('problem')}/{r.get('condition')}/{r.get('sample')}"
        line = f"  {where}: {len(attempts) or 1} judgement(s), cause(s): {causes}" + (f"; {message}" if message else "")
        console.print(plain(line))
    console.print(plain(f"retry them with: {retry_infra_command(summary.run_id, run_dir.path.parent)}"))
    if lasting:  # the same machine meets a lasting cause again: where it can go (docs/reading-numbers.md)
        console.print(plain("  a lasting cause (environment, sandbox, emulation) comes back on this machine: retry "
                            "where it is gone (a GPU machine with --device cuda, the missing package installed, "
                            "bubblewrap installed, one rank per GPU)"))


def print_outcome(summary: RunSummary, run_dir: RunDir, config: RunConfig) -> None:
    """The run's summary, and on CUDA how this pass held its GPUs."""
    _print_summary(summary, run_dir, config.ranks_per_gpu)
    if config.device == "cuda":
        print_device_use(run_dir)


def _print_summary(summary: RunSummary, run_dir: RunDir, ranks_per_gpu: int = 1) -> None:
    emulated = layout.is_emulated(ranks_per_gpu)
    table = Table(title=plain(f"run {summary.run_id}: {len(summary.records)} of {summary.total} samples finished"))
    table.add_column("condition", no_wrap=True)  # a row's name stays whole; the numbers take less room
    for col in ("samples", "correct", "fast (>1x)", "no code", "infra error", "tokens", "cost $"):
        table.add_column(col)
    by_condition: dict[str, list[dict[str, Any]]] = {}
    for r in summary.records:
        by_condition.setdefault(r["condition"], []).append(r)
    config = dict((read_json(run_dir.run_json) or {}).get("config") or {})
    for condition, records in by_condition.items():
        tokens = sum(int(r["usage"]["input_tokens"]) + int(r["usage"]["output_tokens"]) for r in records)
        unmeasured = accounting.speed_not_measured(records, {**config, "ranks_per_gpu": ranks_per_gpu})
        table.add_row(plain(condition), str(len(records)), str(sum(r["correct"] for r in records)),
                      "—" if unmeasured else str(sum(fast(r) for r in records)),
                      str(sum(r["verdict"] == "no_code" for r in records)),
                      str(sum(r["verdict"] == "infra_error" for r in records)), f"{tokens:,}",
                      _cost_cell(records))
    console.print(table)
    for line in run_summary(run_dir.path):  # what the report will say first: problems not judged, speed not measured
        console.print(plain(line))
    for condition, records in by_condition.items():
        if (why := not_fast(records)) is not None:
            console.print(plain(f"{condition}: {why}"))
    if emulated or any(is_emulated(r) for r in summary.records):
        console.print(f"[yellow]{escape(emulation.notice(ranks_per_gpu))}[/yellow]: no sample counts as fast")
    if summary.infra_errors:
        _print_incomplete(summary, run_dir)
    for line in summary.interrupted:
        console.print(f"[yellow]unfinished (provider error, not the model's):[/yellow] {escape(line)}")
    for line in summary.errors:
        console.print(f"[red]unfinished (internal error, see events.jsonl):[/red] {escape(line)}")
    if not summary.complete:
        console.print(plain(f"continue with: pkb run --run-id {summary.run_id} --resume --runs-dir "
                            f"{run_dir.path.parent}"))
    console.print(plain(f"results: {run_dir.path}   report: pkb report {run_dir.path}"))
