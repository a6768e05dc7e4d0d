"""`pkb search` and `pkb report` on a search, through the CLI; and one search on CPU with the real harness."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from agent.cli import main
from agent.search.archive import Archive
from tests.conftest import live_children

FAKE = ["--evaluator", "tests.search_fakes", "--no-live"]


def search(tmp_path: Path, *args: str) -> int:
    return main(["search", "--runs-dir", str(tmp_path / "runs"), *args])


def test_search_then_resume_then_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = search(tmp_path, "--model", "scripted:mutator", "--problems", "all_reduce", "all_gather",
                  "--budget-candidates", "12", "--strategy", "best_first", "--run-id", "s", *FAKE)
    assert code == 0
    out = capsys.readouterr().out
    assert "search_budget:candidates" in out and "pkb report" in out
    run = tmp_path / "runs" / "s"
    assert (run / "search.json").is_file() and (run / "live.html").is_file()
    assert json.loads((run / "search.json").read_text())["config"]["strategy"]["name"] == "best_first"
    capsys.readouterr()
    assert search(tmp_path, "--run-id", "s", "--resume", *FAKE) == 0  # nothing left to do: still fine
    assert "pkb: search s: every problem has stopped (12 candidates evaluated); nothing left to search" in \
        capsys.readouterr().err
    with Archive(run / "archive.sqlite") as a:
        assert len(a.candidates()) == 12 and len(a.sessions()) == 2
    assert main(["report", str(run), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "# Search s" in text and "Lineage of the best kernel" in text
    assert (tmp_path / "r_figures" / "speedup_vs_device_hours.png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["report", str(run), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["problem"] for p in data["problems"]] == ["all_reduce", "all_gather"]
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert "<table>" in (tmp_path / "r.html").read_text()
    (tmp_path / "other").mkdir()
    capsys.readouterr()
    assert main(["report", str(run), str(tmp_path / "other")]) == 2  # a search beside a sample run: apart
    assert "not search runs" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    ([], "--model is required"),
    (["--model", "replay:x", "--budget-candidates", "3"], "replay"),
    (["--model", "scripted:mutator"], "never end"),
    (["--model", "scripted:mutator", "--budget-candidates", "3", "--problems", "nope"], "nope"),
    (["--model", "scripted:mutator", "--budget-candidates", "3", "--shape", "huge", "--problems", "all_reduce"],
     "no shape"),
    (["--model", "scripted:mutator", "--budget-cost", "1", "--problems", "all_reduce"], "no price"),
    (["--resume"], "--resume needs --run-id"),
    (["--resume", "--run-id", "missing"], "no search to resume"),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                               message: str) -> None:
    assert search(tmp_path, *args, *FAKE) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_resume_refuses_options_that_change_the_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert search(tmp_path, "--model", "scripted:mutator", "--problems", "all_reduce", "--budget-candidates", "3",
                  "--run-id", "s", *FAKE) == 0
    assert search(tmp_path, "--model", "scripted:mutator", "--problems", "all_reduce", "--budget-candidates", "3",
                  "--run-id", "s", *FAKE) == 2  # exists
    assert search(tmp_path, "--run-id", "s", "--resume", "--budget-candidates", "9", *FAKE) == 2
    assert "leave out --budget-candidates" in capsys.readouterr().err


def test_a_search_on_cpu_with_the_real_harness(tmp_path: Path) -> None:
    """Every step for real, small: the CPU family of all_reduce, edited by the scripted model, evaluated by the
    harness (gloo ranks, shared-memory exchange), the roofline bound traced, the best re-scored."""
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    code = search(tmp_path, "--model", "scripted:mutator:syntax=0,wrong=0,hang=0,runtime=0,collective=0,no_code=0",
                  "--problems", "all_reduce", "--budget-candidates", "2", "--window", "1", "--trials", "2",
                  "--rescore-seeds", "1", "--rescore-candidates", "1", "--strategy", "best_first",
                  "--phase-timeout", "60", "--run-id", "cpu", "--no-live")
    assert code == 0
    with Archive(tmp_path / "runs" / "cpu" / "archive.sqlite") as a:
        rows = a.rows()
        bound_ms, binding, _ = a.bounds()["all_reduce"]
        rescores = a.rescores()
    assert [r["verdict"] for r in rows] == ["correct"] * 2
    assert all(r["trusted"] and r["speedup"] > 0 and r["roofline_fraction"] > 0 for r in rows)
    assert json.loads(rows[1]["parents"]) == [0] and json.loads(rows[0]["parents"]) == []  # bred from the first
    assert bound_ms and bound_ms > 0 and binding == "interconnect"
    stages = json.loads(rows[0]["stages"])
    assert {"compile", "launch", "check", "timing"} <= set(stages) and rows[0]["gpu_s"] > 0
    assert len(rescores) == 1 and rescores[0].trusted and rescores[0].seed != 0
    assert (tmp_path / "runs" / "cpu" / "candidates" / "all_reduce" / "00000.py").is_file()
    assert live_children() == []  # no rank outlives its evaluation
    leftovers = (set(os.listdir("/dev/shm")) - shm_before) if os.path.isdir("/dev/shm") else set()
    assert not {n for n in leftovers if n.startswith("pkb-cpu-symm-")}


def test_the_best_the_search_prints_is_the_one_its_report_and_live_page_show(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """One function (agent.search.summary.headline_best) names a problem's best for the terminal, live.html and
    the report: before, the terminal's "best (search)" said 9.11x where the report said 6.91x."""
    monkeypatch.setenv("COLUMNS", "200")  # a wide table: each row on one line, to read its cells back
    assert search(tmp_path, "--model", "scripted:mutator", "--problems", "all_reduce", "all_gather",
                  "--budget-candidates", "16", "--rescore-candidates", "2", "--run-id", "b", *FAKE) == 0
    printed = capsys.readouterr().out
    run = tmp_path / "runs" / "b"
    assert main(["report", str(run), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    live = (run / "live.html").read_text()
    assert main(["report", str(run), "--out", str(tmp_path / "r.md")]) == 0
    markdown = (tmp_path / "r.md").read_text()
    for problem in report["problems"]:
        best = problem["best"]
        assert best is not None and best["confirmed"]  # re-scored at the end of the search
        row = next(line for line in printed.splitlines() if f" {problem['problem']} " in line)
        cells = re.split(r"\s{2,}", row.strip())  # a piped table: columns apart by runs of spaces
        assert best["text"] in cells, (best["text"], cells)
        assert f"<td>{best['text']}</td>" in live
        assert f"| {problem['problem']} | {best['text']} |" in markdown
        assert best["speedup"] == best["rescored_speedup"]  # the figure shown is the re-scored median
    assert "CPU timings only prove the plumbing" in printed and "CPU timings only prove the plumbing" in live
