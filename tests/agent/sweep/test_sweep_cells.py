"""A sweep's run cell is done only when every sample was judged: one left in infra_error (the harness's failure)
keeps the cell open, so running the sweep again judges it again (agent.cli.sweep_session, issue 44)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.cli import run as cli_run
from agent.cli import run_session, sweep_session
from agent.runner import RunSummary
from agent.sweep.layout import SweepDir


def _summary(verdicts: list[str]) -> RunSummary:
    summary = RunSummary(run_id="cell", total=len(verdicts))
    summary.records.extend({"status": "finished", "verdict": v, "correct": v == "correct"} for v in verdicts)
    return summary


@pytest.mark.parametrize(("verdicts", "done"), [(["correct", "infra_error"], False),
                                                (["correct", "output_mismatch"], True)])
def test_a_cell_with_an_infra_error_sample_is_not_done(tmp_path: Path, monkeypatch, verdicts, done):
    monkeypatch.setattr(sweep_session, "_parse", lambda parser, argv, cell: SimpleNamespace())
    monkeypatch.setattr(cli_run, "check_args", lambda args: None)
    monkeypatch.setattr(run_session, "run", lambda args, within: (_summary(verdicts), None, None))
    directory = SweepDir(tmp_path)
    planned = SimpleNamespace(argv=[], cell=SimpleNamespace(id="c1"))
    outcome, fatal = sweep_session._run_cell(planned, directory, within=None)  # type: ignore[arg-type]
    assert fatal is None
    assert ("c1" in directory.done()) is done
    if not done:
        assert outcome.startswith("incomplete: 1 sample(s) in infra_error")
