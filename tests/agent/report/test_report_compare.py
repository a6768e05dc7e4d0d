"""`pkb report`'s comparisons on synthetic runs: any condition as the baseline, every pair, the compact table in
markdown and LaTeX, the matrix figure, cost per solved problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import cli
from tests.report_support import OUTCOMES, make_run, md_rows

THREE = {**OUTCOMES, "agent:check": OUTCOMES["zero-shot"]}  # a third condition that never differs from zero-shot


def report(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert cli.main(["report", *argv]) == 0
    return capsys.readouterr().out


def test_any_condition_is_the_baseline_and_every_pair_can_be_shown(tmp_path: Path, capsys):
    run = make_run(tmp_path, "run-a", THREE)
    default = json.loads(report(capsys, str(run), "--format", "json"))
    pairs = [(c["treatment"], c["baseline"]) for c in default["comparisons"]]
    assert pairs == [("agent:check+compile", "zero-shot"), ("agent:check", "zero-shot")]
    never = default["comparisons"][1]["metrics"]["pass_at_k"]
    assert (never["mean"], never["ties"], never["p_value"]) == (0.0, 3, 1.0)
    wins = default["comparisons"][0]["metrics"]["pass_at_k"]
    # zero-shot solves 2 of 3 problems at k=3, the agent 3: one win, two ties; the permutation p over 3 problems
    assert (wins["mean"], wins["wins"], wins["ties"], wins["p_value"]) == (pytest.approx(1 / 3), 1, 2, 1.0)
    assert wins["p_holm"] == 1.0
    other = json.loads(report(capsys, str(run), "--format", "json", "--baseline", "agent:check+compile"))
    assert [(c["treatment"], c["baseline"]) for c in other["comparisons"]] == [
        ("zero-shot", "agent:check+compile"), ("agent:check", "agent:check+compile")]
    assert other["comparisons"][0]["metrics"]["pass_at_k"]["mean"] == pytest.approx(-1 / 3)
    every = json.loads(report(capsys, str(run), "--format", "json", "--all-pairs"))
    assert len(every["comparisons"]) == 3 and every["baseline"] == "zero-shot"
    # the speedup ratio on problems both solved: all_reduce (0.8 -> 1.6, 1.3) and ulysses (1.2 -> 2.4, 1.9, 1.4)
    ratio = default["comparisons"][0]["metrics"]["speedup_ratio"]
    assert ratio["n"] == 2 and ratio["problems"] == ["all_reduce", "ulysses_all_to_all"]
    expected = ((1.6 * 1.3) ** 0.5 / 0.8 * (2.4 * 1.9 * 1.4) ** (1 / 3) / 1.2) ** 0.5
    assert ratio["ratio"] == pytest.approx(expected)
    assert cli.main(["report", str(run), "--baseline", "agent:bench"]) == 2
    assert "names no condition or arm" in capsys.readouterr().err


def test_the_compact_table_in_markdown_and_latex_and_the_matrix_figure(tmp_path: Path, capsys):
    run = make_run(tmp_path, "run-a")
    out = tmp_path / "report.md"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    text = out.read_text()
    arms = {r[0]: r for r in md_rows(text, "| arm | problems |")}
    # 9 samples of 1500 tokens and $0.01 each; zero-shot solved 2 problems, the agent 3 (tokens 3 x 1200 + 300)
    assert arms["zero-shot"][5:8] == ["2", "$0.0450", "6.8k"]
    assert arms["agent:check+compile"][5:8] == ["3", "$0.0300", "11.7k"]
    (pair,) = md_rows(text, "| comparison | problems |")
    assert pair[0] == "agent:check+compile vs zero-shot" and pair[2] == "+0.33 [+0.00, +1.00]" and pair[-1] == "1/0/2"
    assert "![condition matrix](report_figures/matrix.png)" in text
    assert (tmp_path / "report_figures" / "matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tex = report(capsys, str(run), "--format", "tex")
    assert tex.count(r"\begin{tabular}") == 2 and r"\toprule" in tex and r"$\Delta$pass@3" in tex
    assert r"agent:check+compile vs zero-shot & 3 & +0.33 [+0.00, +1.00]" in tex and "fast\\_1@3" in tex
