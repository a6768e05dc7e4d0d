"""Every tool gives the same answer from any working directory and with any runs folder (issue 26).

The agent loop runs as a user runs it (`python -m agent.cli run`, a scripted model) from a folder outside
the checkout, with a relative --runs-dir, against candidates whose verdicts are known: a load_inline C++
file that does not compile, a file with a wrong output on rank 1, and a correct one. Before the fix the
compile tool answered OK for the first (its helper looked for the relative path in the checkout, did not
find it, and the miss counted as a build) and cached that answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.common.paths import REPO_ROOT
from harness.compiling.compile import compile_candidate
from tests.conftest import CANDIDATES
from tools.base import ToolContext, ToolSettings

REPO = REPO_ROOT
BAD_BUILD = (CANDIDATES / "compile_error_load_inline.py").read_text()
WRONG = (CANDIDATES / "output_mismatch_rank1.py").read_text()
RIGHT = (CANDIDATES / "correct_all_gather_sum.py").read_text()

# (tool, source, what its record must say)
SCRIPT: list[tuple[str, str | None, dict[str, Any]]] = [
    ("compile", BAD_BUILD, {"verdict": "compile_error"}),
    ("check", BAD_BUILD, {"verdict": "compile_error"}),
    ("check", WRONG, {"verdict": "output_mismatch"}),
    ("check", RIGHT, {"verdict": "correct"}),
    ("bench", RIGHT, {"verdict": "correct"}),
    ("profile", RIGHT, {"available": True}),
    ("roofline", RIGHT, {"available": True}),
    ("submit", RIGHT, {"tool": "submit"}),
]


def _run_from(cwd: Path, runs_dir: str, cache: Path) -> Path:
    script = cwd / "script.json"
    script.write_text(json.dumps([["tool", tool, {"source": source}] for tool, source, _ in SCRIPT]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PKB_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--model", "scripted:script.json",
                           "--condition", "agent", "--problems", "all_reduce", "--runs-dir", runs_dir,
                           "--run-id", "anywhere", "--trials", "2"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    samples = list((cwd / runs_dir / "anywhere" / "samples" / "all_reduce").glob("*/0"))
    assert len(samples) == 1
    return samples[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["relative", "parent"])
def test_tools_answer_the_same_from_another_directory(tmp_path: Path, layout: str) -> None:
    cwd = tmp_path / "work" / "here"
    cwd.mkdir(parents=True)
    runs_dir = "runs" if layout == "relative" else "../../elsewhere/runs"
    sample = _run_from(cwd, runs_dir, tmp_path / "cache")  # a fresh cache: no earlier answer is reused
    records = [json.loads(p.read_text()) for p in sorted((sample / "candidates").glob("*.json"))]
    assert [r["tool"] for r in records] == [tool for tool, _, _ in SCRIPT]
    for record, (tool, source, expected) in zip(records, SCRIPT):
        for key, value in expected.items():
            assert record["data"].get(key) == value, (tool, record["text"])
        assert (sample / record["candidate"]).read_text() == source
    compile_text = records[0]["text"]
    assert "compile_error" in compile_text and "expected" in records[0]["data"]["evidence"]  # the compiler's line
    assert "speedup" in records[4]["text"]
    assert records[5]["text"].startswith("profile ")
    result = json.loads((sample / "result.json").read_text())
    assert result["verdict"] == "correct"


def test_tool_context_and_compile_take_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("broken.py").write_text(BAD_BUILD)
    outcome = compile_candidate(Path("broken.py"), 120.0, "cpu")
    assert not outcome.ok and outcome.verdict == "compile_error", outcome.evidence[-500:]
    ctx = ToolContext(problem=None, settings=ToolSettings(2, "cpu", "small"), config=None,  # type: ignore[arg-type]
                      workdir=Path("sample"))
    assert ctx.workdir == tmp_path / "sample"
