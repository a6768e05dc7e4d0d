"""The CLI answers at once: `pkb --help` and the mistakes its arguments show import no torch and no model
stack, `pkb problems list` no model stack; problem text prints as written, and piped output is not cut."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from harness.common.paths import REPO_ROOT

REPO = REPO_ROOT
MODEL_STACK = ("langchain", "langchain_core", "langchain_openai", "langchain_anthropic", "langgraph", "anthropic",
               "openai")
HEAVY = ("torch", "matplotlib", *MODEL_STACK)


def imported(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime -m agent.cli ARGV` (stdout piped, as in a script) and return it with the
    top-level packages it imported."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "agent.cli", *argv], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)
    names = set()
    for line in proc.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", line)
        if match:
            names.add(match.group(1).strip().split(".")[0])
    return proc, names


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["run", "--help"],
    ["run", "--concurrency", "0", "--model", "scripted:x"],  # a mistake the arguments alone show
    ["eval", "--problem", "all_reduce", "--solution", "/no/such/file.py"],
    ["report", "--help"],
])
def test_help_and_argument_errors_import_neither_torch_nor_the_model_stack(argv):
    proc, names = imported(argv)
    assert proc.returncode in (0, 2), proc.stderr[-2000:]
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    if proc.returncode == 2 and argv[-1] != "--help":
        errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
        assert len(errors) == 1 and errors[0].startswith("pkb: error:"), errors


def test_problems_list_imports_no_model_stack():
    proc, names = imported(["problems", "list"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch" in names  # the problems themselves need it
    assert not names & set(MODEL_STACK) and "matplotlib" not in names, sorted(names & set(HEAVY))
    assert "all_reduce" in proc.stdout


def test_problems_show_prints_brackets_in_the_summary_as_written(capsys):
    from agent.cli import main

    assert main(["problems", "show", "all_gather"]) == 0
    out = capsys.readouterr().out
    assert "[tokens, hidden]" in out  # rich would read it as markup and drop it
