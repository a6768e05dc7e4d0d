"""`pkb run` and `pkb search` refuse to run candidates where no sandbox works, in one line saying how to install
one; `--no-sandbox` runs anyway and every result records it; `pkb eval` keeps the fallback with a warning."""

from __future__ import annotations

import json

import pytest

from agent.cli import main
from harness.launch.sandbox import OFF_REASON_VAR, policy
from tests.conftest import CANDIDATES, TESTS

MISSING: tuple[str, str, frozenset[str]] = ("", "bubblewrap (bwrap) is not installed: apt-get install bubblewrap",
                                             frozenset())


@pytest.fixture
def no_bubblewrap(monkeypatch):
    """A machine where bubblewrap is missing, PKB_SANDBOX unset; whatever the commands set is undone after."""
    monkeypatch.setattr(policy, "_bwrap_works", lambda: MISSING)
    monkeypatch.setenv("PKB_SANDBOX", "auto")
    monkeypatch.setenv(OFF_REASON_VAR, "")


@pytest.mark.parametrize("command", [
    ["run", "--model", "replay:nowhere", "--problems", "all_reduce"],
    ["search", "--model", "scripted:mutator", "--problems", "all_reduce", "--no-live"],
])
def test_run_and_search_refuse_without_a_sandbox(command, no_bubblewrap, tmp_path, capsys):
    assert main([*command, "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "apt-get install bubblewrap" in err and "--no-sandbox" in err
    assert not (tmp_path / "runs").exists()  # refused before anything was written


@pytest.mark.slow
def test_no_sandbox_runs_and_every_result_says_so(no_bubblewrap, tmp_path):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "all_reduce.py").write_text((CANDIDATES / "correct_all_gather_sum.py").read_text())
    code = main(["run", "--model", f"replay:{solutions}", "--no-sandbox", "--trials", "2", "--no-timing",
                 "--runs-dir", str(tmp_path / "runs"), "--run-id", "open"])
    assert code == 0
    (result,) = (tmp_path / "runs" / "open").rglob("result.json")
    sandbox = json.loads(result.read_text())["integrity"]["sandbox"]
    assert sandbox["backend"] == "none" and sandbox["weaker_fallback"] == "turned off by --no-sandbox"


@pytest.mark.slow
def test_eval_keeps_the_fallback_with_a_warning(no_bubblewrap, capsys):
    code = main(["eval", "--problem", "all_reduce", "--solution", str(CANDIDATES / "correct_all_gather_sum.py"),
                 "--trials", "2", "--no-timing", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["integrity"]["sandbox"]["backend"] == "none"
    assert "warning: the candidate runs unsandboxed" in err and "apt-get install bubblewrap" in err


@pytest.mark.slow
def test_eval_never_crashes_on_a_hostile_candidate(capsys):
    """An artifact that made the judge's parser raise once ended `pkb eval` in a traceback."""
    exploit = TESTS / "exploits" / "deep_header_kept_output.py"
    code = main(["eval", "--problem", "all_reduce", "--solution", str(exploit), "--trials", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err
    assert json.loads(out)["verdict"] == "output_mismatch"
