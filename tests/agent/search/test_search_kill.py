"""SIGKILL `pkb search` at random moments, resume it each time: it ends with the same archive as a search that
was never killed (same seed, same scripted model, the deterministic fake evaluator).

The loop is what is under test, so evaluations are tests/search_fakes.evaluate, slowed to a few
milliseconds each so that kills land mid-step: between a decision, the model's answer, the evaluation and
its record, and during the rescoring at the end. The command is `python -m agent.cli.search`, which is
`pkb search` without the other commands' imports.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.cli import search as cli_search
from agent.search.archive import Archive
from harness.common.paths import REPO_ROOT

REPO = REPO_ROOT
KILLS = 3
ARGS = ["--model", "scripted:mutator", "--problems", "all_reduce", "all_gather", "reduce_scatter",
        "--strategy", "islands", "--islands", "2", "--migration-interval", "4", "--budget-candidates", "40",
        "--window", "3", "--seed", "5", "--evaluator", "tests.search_fakes", "--no-live"]


def command(runs: Path, run_id: str, resume: bool) -> list[str]:
    base = [sys.executable, "-m", "agent.cli.search", "--run-id", run_id, "--runs-dir", str(runs)]
    return base + (["--resume", "--evaluator", "tests.search_fakes", "--no-live"] if resume else ARGS)


def env() -> dict[str, str]:
    return {**os.environ, "PKB_FAKE_EVAL_DELAY": "0.02"}


def evaluated(archive: Path) -> int:
    try:
        with sqlite3.connect(f"file:{archive}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT COUNT(*) FROM candidates WHERE status = 'evaluated'").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.mark.slow
def test_killed_and_resumed_search_ends_with_the_archive_of_an_uninterrupted_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv("PKB_FAKE_EVAL_DELAY", env()["PKB_FAKE_EVAL_DELAY"])
    assert cli_search.main(command(runs, "whole", False)[3:]) == 0  # the uninterrupted one, in this process

    rng = random.Random(2024)
    archive = runs / "killed" / "archive.sqlite"
    for kill in range(KILLS):
        proc = subprocess.Popen(command(runs, "killed", kill > 0), cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        before = evaluated(archive)
        deadline = time.monotonic() + 120
        while proc.poll() is None and evaluated(archive) <= before and time.monotonic() < deadline:
            time.sleep(0.01)  # started, and making progress: now a random moment
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"finished before kill {kill}: {err[-2000:]}"
    final = subprocess.run(command(runs, "killed", True), cwd=REPO, env=env(), capture_output=True, text=True,
                           timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]

    with Archive(runs / "whole" / "archive.sqlite") as a, Archive(archive) as b:
        expected, got = a.canonical(), b.canonical()
        assert len(expected["candidates"]) == 40 and expected["rescores"] and expected["island_members"]
        assert got == expected
        assert len(b.sessions()) == KILLS + 1  # every start is on record
