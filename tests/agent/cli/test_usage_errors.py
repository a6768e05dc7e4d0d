"""Usage errors are said while the arguments are parsed: one line, exit code 2, with the words that help (the
nearest option or choice, the option's range, the argument at fault), before anything heavy is imported.
benchmarks/cli_errors.py times them; here only what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import main as pkb
from agent.cli.common import RANGES, Range
from harness.common.paths import REPO_ROOT
from tests.conftest import CANDIDATES

GOOD = str(CANDIDATES / "correct_all_gather_sum.py")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "usage:" not in err, err
    return err


@pytest.mark.parametrize(("argv", "words"), [
    (["report", "missing-dir"], ["missing-dir", "no such directory"]),
    (["run", "--modle", "x"], ["--modle", "did you mean --model?"]),
    (["eval", "--trials", "1"], ["--trials must be at least 2, got 1", "stale answer"]),
    (["run", "--model", "scripted:x", "--trials", "1"], ["--trials must be at least 2, got 1"]),
    (["run", "--model", "scripted:x", "--samples", "0"], ["--samples must be at least 1, got 0"]),
    (["run", "--model", "scripted:x", "--budget-cost", "-1"], ["--budget-cost must be at least 0", "no limit"]),
    (["run", "--model", "scripted:x", "--context-share", "2"], ["--context-share", "at most 1"]),
    (["eval", "--problem", "all_reduce", "--solution", GOOD, "--check-timeout", "0"], ["--check-timeout", "above 0"]),
    (["problems", "validate", "--trials", "0"], ["--trials", "at least 1"]),  # its own range: one draw is a check
    (["eval", "--device", "cud"], ["'cud'", "did you mean cuda?"]),
    (["rnu"], ["'rnu'", "did you mean run?"]),
    (["problems", "shw", "all_reduce"], ["'shw'", "did you mean show?"]),
    (["eval", "--problem", "all_reduce", "--solution", "/no/such/file.py"], ["--solution", "does not exist"]),
])
def test_a_usage_error_is_one_line_that_says_what_helps(argv, words, capsys):
    assert pkb(argv) == 2
    err = one_line(capsys)
    assert err.startswith("pkb"), err
    for word in words:
        assert word in err, (word, err)


def test_an_empty_solution_file_is_a_usage_error_of_solution(tmp_path: Path, capsys):
    empty = tmp_path / "empty.py"
    empty.write_text("\n  \n")
    for argv in (["eval", "--solution", str(empty)], ["eval", "--problem", "all_reduce", "--solution", str(empty)]):
        assert pkb(argv) == 2
        err = one_line(capsys)
        assert "--solution" in err and "is empty" in err and "solution(*inputs)" in err, err


def test_the_range_of_an_option_reads_plainly():
    assert Range(2, why="w").check(1) == "must be at least 2, got 1 (w)"
    assert Range(0, above=True).check(0) == "must be above 0, got 0"
    assert Range(0, above=True, maximum=1).check(1.5) == "must be above 0 and at most 1, got 1.5"
    assert Range(1).check(1) is None and RANGES["--trials"].check(2) is None


def test_the_console_script_says_it_in_one_line(tmp_path: Path):
    """As a user types it: a fresh interpreter, exit code 2, one line on stderr."""
    (tmp_path / "empty.py").write_text("")
    for argv in (["report", str(tmp_path / "missing-dir")], ["run", "--modle", "x"], ["eval", "--trials", "1"],
                 ["eval", "--solution", str(tmp_path / "empty.py")]):
        proc = subprocess.run([sys.executable, "-m", "agent.cli", *argv], capture_output=True, text=True,
                              timeout=300, cwd=REPO_ROOT)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("pkb"), (argv, proc.stderr)
