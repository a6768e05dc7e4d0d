"""Bad input gets one clear line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.cli import main as pkb
from harness.common.paths import REPO_ROOT
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


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"langgraph", "langchain_openai", "langchain_anthropic", "langchain_core"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from agent.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv, code, says", [
    (["run", "--model", "scripted:x", "--problems", "all_reduce"], 2, "pkb run needs the Python package 'lang"),
    (["problems", "list", "collective"], 0, "all_reduce"),
])
def test_harness_commands_work_where_the_agent_stack_is_not_installed(argv, code, says):
    # A GPU node often has torch but not the model stack: pkb problems/eval/topology/... must still run
    # there, and pkb run must say in one line what is missing.
    done = subprocess.run([sys.executable, "-c", BLOCKER, *argv], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    assert done.returncode == code, done.stderr
    assert says in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
