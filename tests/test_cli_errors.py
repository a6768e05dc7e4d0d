"""Bad input gets one clear line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.cli import main as pkb
from tests.conftest import CANDIDATES

GOOD = str(CANDIDATES / "correct_all_gather_sum.py")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["eval", "--problem", "all_reduc", "--solution", GOOD], "did you mean all_reduce"),
        (["eval", "--problem", "all_reduce", "--solution", "/no/such/file.py"], "does not exist"),
        (["eval", "--problem", "all_reduce", "--solution", GOOD, "--world-size", "3"],
         "does not support world size 3"),
        (["eval", "--problem", "all_reduce", "--solution", GOOD, "--shape", "enormous"], "has no shape 'enormous'"),
        (["problems", "show", "al_reduce"], "did you mean"),
        (["problems", "validate", "--world-size", "two"], "--world-size takes integers"),
        (["problems", "list", "no_such_*"], "no problem or category matches"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys):
    assert pkb(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err


def test_console_script_reports_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "eval", "--problem", "nope", "--solution", GOOD],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "nope" in proc.stderr
