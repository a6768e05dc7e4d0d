"""`pkb export RUN --format jsonl`: one line per sample, read back by pandas as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import cli
from tests.report_support import OUTCOMES, PROBLEMS, make_run

pandas = pytest.importorskip("pandas", reason="pandas is a dev dependency (pip install -e '.[dev]')")


def test_the_export_is_one_line_per_sample_that_pandas_reads_as_it_is(tmp_path: Path, capsys):
    run = make_run(tmp_path, "run-a")
    header = json.loads((run / "run.json").read_text())
    header["manifest"] = {"code": {"commit": "c" * 40, "dirty": True, "diff_sha256": "d" * 64},
                          "problem_sha256": {name: name[:3] * 2 for name, _ in PROBLEMS},
                          "hardware": {"fingerprint": "f" * 16}, "executor": "local"}
    (run / "run.json").write_text(json.dumps(header))
    out = tmp_path / "samples.jsonl"
    assert cli.main(["export", str(run), "--format", "jsonl", "--out", str(out)]) == 0
    frame = pandas.read_json(out, lines=True)
    conditions = list(OUTCOMES)
    assert len(frame) == len(conditions) * len(PROBLEMS) * 3
    expected = {(c, p, k): v for c in conditions for p, _ in PROBLEMS for k, (v, _, _) in enumerate(OUTCOMES[c][p])}
    got = {(r.condition, r.problem, r.sample): r.verdict for r in frame.itertuples()}
    assert got == expected
    # the manifest's keys are columns; the problem's own source hash is each row's
    assert set(frame["manifest.code.commit"]) == {"c" * 40} and frame["manifest.code.dirty"].all()
    assert set(frame["manifest.hardware.fingerprint"]) == {"f" * 16}
    assert dict(zip(frame["problem"], frame["problem_sha256"])) == {name: name[:3] * 2 for name, _ in PROBLEMS}
    assert set(frame["manifest.seed"]) == {0} and set(frame["manifest.budgets.max_turns"]) == {8}
    assert set(frame["manifest.model.model"]) == {"scripted:demo"} and set(frame["manifest.device"]) == {"cpu"}
    # metrics and usage, ready to group: the agent's pass rate per problem, its tokens
    by = frame.groupby("condition")["correct"].mean()
    assert by["agent:check+compile"] == pytest.approx(7 / 9) and by["zero-shot"] == pytest.approx(2 / 9)
    assert frame.loc[frame.condition == "zero-shot", "usage.input_tokens"].sum() == 9 * 1200
    assert frame.loc[frame.condition == "agent:check+compile", "tool_calls.check"].sum() == 9
    fast = frame[frame.fast_1]
    assert sorted(fast.speedup) == [1.1, 1.2, 1.3, 1.4, 1.6, 1.9, 2.4]
    # to stdout, the same lines
    capsys.readouterr()
    assert cli.main(["export", str(run)]) == 0
    assert capsys.readouterr().out == out.read_text()


def test_a_run_that_is_not_one_is_one_line(tmp_path: Path, capsys):
    assert cli.main(["export", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pkb: error: ") and len(err.splitlines()) == 1 and "run.json is missing" in err
