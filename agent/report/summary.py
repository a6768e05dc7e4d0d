"""The lines `pkb run` prints under its table about what the report will say first: an incomplete run (which
problems are not judged, and why) and speed that was not measured (agent.report.accounting). Reads the run
folder, as every report does: the run's own records are what is on disk."""

from __future__ import annotations

from pathlib import Path

from agent.report import accounting
from agent.report.run_reader import read_run


def run_summary(path: str | Path) -> list[str]:
    """Plain-text lines (one fact each) for the run at `path`; empty for a complete run that measured speed."""
    run = read_run(path, transcripts=False)
    forced = {"emulated": True} if int(run.config.get("ranks_per_gpu") or 1) > 1 else {}
    records = [{**s.record.metrics_view(), **forced} for s in run.samples]
    return accounting.run_summary_lines(records, [s.result for s in run.samples], run.config, run.manifest)
