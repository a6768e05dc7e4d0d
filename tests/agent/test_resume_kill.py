"""`pkb run` killed with SIGKILL resumes with nothing finished lost and nothing counted twice.

Both tests drive `pkb run` (python -m agent.cli.run, the same command) as a subprocess with a scripted
model read from a JSON script, on CPU (gloo, W=2), and kill it from outside.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import agent.tool_calls
import tools.dispatch
from agent.cli import run as cli_run
from agent.report import metrics
from harness.common.paths import REPO_ROOT
from tests.agent_support import BROKEN, run_samples, scripted
from tests.conftest import CANDIDATES

REPO = REPO_ROOT
CORRECT = (CANDIDATES / "correct_all_gather_sum.py").read_text()


def write_script(path: Path, steps: list[Any]) -> Path:
    path.write_text(json.dumps(steps))
    return path


def pkb_run(runs: Path, run_id: str, script: Path, *extra: str, resume: bool = False) -> subprocess.Popen:
    argv = [sys.executable, "-m", "agent.cli.run", "--model", f"scripted:{script}", "--runs-dir", str(runs),
            "--run-id", run_id, "--trials", "2", "--world-size", "2", *extra]
    if resume:
        argv = [sys.executable, "-m", "agent.cli.run", "--runs-dir", str(runs), "--run-id", run_id, "--resume"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)


def records(run_dir: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((run_dir / "samples").glob("*/*/*/sample.json")):
        out[path.parent.relative_to(run_dir / "samples").as_posix()] = json.loads(path.read_text())
    return out


def outcome(run_dir: Path, key: str, record: dict[str, Any]) -> tuple:
    """What must not depend on kills: the record's outcome, its candidates and its conversation."""
    folder = run_dir / "samples" / key
    transcript = json.loads((folder / "transcript.json").read_text())
    candidates = sorted(p.name for p in (folder / "candidates").glob("*")) if (folder / "candidates").exists() else []
    return (record["status"], record["stop_reason"], record["verdict"], record["correct"], record["turns"],
            record["tool_calls"], record["usage"]["input_tokens"], record["candidates"], candidates,
            [(m["role"], m.get("name")) for m in transcript])


def started(run_dir: Path) -> int:
    """How many `pkb run` processes have begun work on this run (run_started events)."""
    events = run_dir / "events.jsonl"
    return events.read_text().count('"event": "run_started"') if events.exists() else 0


def condition_metrics(recs: list[dict[str, Any]]) -> dict[str, list[tuple]]:
    return {condition: [(s.problem, s.n, s.correct, s.verdicts, s.pass_at(1)) for s in scores]
            for condition, scores in metrics.score_problems(recs).items()}


class Killed(BaseException):
    """Stands for the process dying: nothing below the graph catches it."""


def test_a_sample_stopped_inside_a_tool_call_resumes_at_that_call(tmp_path, monkeypatch):
    """In process and deterministic: the check tool saves its candidate, then the 'process dies'."""
    real = tools.dispatch.run_tool  # what agent.tool_calls calls

    def dies_in_check(name, args, ctx):
        outcome = real(name, args, ctx)
        if name == "check":
            raise Killed
        return outcome

    steps = [("tool", "compile", {"source": BROKEN}), ("tool", "check", {"source": BROKEN}),
             ("tool", "submit", {"source": BROKEN})]
    monkeypatch.setattr(agent.tool_calls, "run_tool", dies_in_check)
    with pytest.raises(Killed):
        run_samples(tmp_path, [scripted(steps)], conditions=["agent:check+compile"])
    folder = tmp_path / "run" / "samples" / "all_reduce" / "agent:check+compile" / "0"
    assert json.loads((folder / "sample.json").read_text())["status"] == "running"
    assert (folder / "candidates" / "001.py").exists()  # saved by the check that never answered
    # What a SIGKILL between an atomic write and its rename leaves (harness.common.atomic_write's temporary name).
    leftover = folder / "candidates" / ".002.py.0123456789ab.tmp"
    leftover.write_text("half a candidate")
    monkeypatch.setattr(agent.tool_calls, "run_tool", real)
    model = scripted(steps)
    runner, summary = run_samples(tmp_path, [model], conditions=["agent:check+compile"])
    assert summary.complete
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e["event"] == "sample_resumed"]
    assert len(resumed) == 1 and resumed[0]["next"] == ["tools"] and resumed[0]["turns"] == 2
    record = summary.records[0]
    assert (record["turns"], record["tool_calls"], record["stop_reason"]) == (
        3, {"compile": 1, "check": 1, "submit": 1}, "submitted")
    assert sorted(p.name for p in (folder / "candidates").glob("*.py")) == ["000.py", "001.py", "002.py"]
    assert not leftover.exists()  # removed when the sample started again
    roles = [(m["role"], m.get("name")) for m in json.loads((folder / "transcript.json").read_text())]
    assert roles == [("system", None), ("user", None), ("assistant", None), ("tool", "compile"),
                     ("assistant", None), ("tool", "check"), ("assistant", None), ("tool", "submit")]


@pytest.mark.slow
def test_a_run_killed_mid_thread_resumes_without_losing_or_redoing_samples(tmp_path):
    script = write_script(tmp_path / "script.json", [["tool", "compile", {"source": CORRECT}],
                                                     ["tool", "check", {"source": CORRECT}],
                                                     ["tool", "submit", {"source": CORRECT}]])
    runs, condition = tmp_path / "runs", "agent:check+compile"
    run_dir = runs / "mid"
    proc = pkb_run(runs, "mid", script, "--condition", condition, "--problems", "all_reduce", "--samples", "2")
    mid_thread = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        recs = records(run_dir) if run_dir.exists() else {}
        done = [k for k, r in recs.items() if r["status"] == "finished"]
        # a sample past its first turn, with its check running: its second candidate is on disk
        running = [k for k, r in recs.items() if r["status"] == "running"
                   and (run_dir / "samples" / k / "candidates" / "001.py").exists()]
        if done and running:
            mid_thread = running[0]
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    kill(proc)
    assert mid_thread is not None, "never saw a finished sample next to one mid-thread"
    before = records(run_dir)
    finished = {k: (run_dir / "samples" / k / "sample.json") for k, r in before.items() if r["status"] == "finished"}
    stamps = {k: (p.stat().st_mtime_ns, p.read_bytes()) for k, p in finished.items()}
    assert finished and mid_thread not in finished

    out = finish(pkb_run(runs, "mid", script, resume=True))
    after = records(run_dir)
    assert set(after) == {f"all_reduce/{condition}/{k}" for k in range(2)}
    assert all(r["status"] == "finished" for r in after.values()), out
    for key, (mtime, content) in stamps.items():  # finished samples were not touched
        path = run_dir / "samples" / key / "sample.json"
        assert (path.stat().st_mtime_ns, path.read_bytes()) == (mtime, content)
    # the interrupted sample continued from its checkpoint: one compile, one check, one submit, in order
    for key, record in after.items():
        assert outcome(run_dir, key, record) == (
            "finished", "submitted", "correct", True, 3, {"compile": 1, "check": 1, "submit": 1}, 300, 3,
            ["000.json", "000.py", "001.json", "001.py", "002.json", "002.py"],
            [("system", None), ("user", None), ("assistant", None), ("tool", "compile"), ("assistant", None),
             ("tool", "check"), ("assistant", None), ("tool", "submit")]), key
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()
              and line.startswith("{") and line.endswith("}")]
    resumed = [e for e in events if e["event"] == "sample_resumed"]
    assert [f"{e['problem']}/{e['condition']}/{e['sample']}" for e in resumed] == [mid_thread]
    assert resumed[0]["turns"] >= 1  # it picked up after the turns it had taken


@pytest.mark.slow
def test_random_sigkills_then_resume_give_the_same_final_metrics(tmp_path):
    script = write_script(tmp_path / "script.json", [["tool", "compile", {"source": CORRECT}],
                                                     ["tool", "submit", {"source": CORRECT}]])
    # zero-shot gets the tool-call reply as its answer: no code, no evaluation; the agent's samples are
    # scored (correct on all_reduce, wrong shape on all_gather)
    extra = ("--condition", "zero-shot,agent:compile", "--problems", "all_reduce,all_gather", "--concurrency", "2")
    runs = tmp_path / "runs"
    # the uninterrupted run, in this process (the same command, without a second interpreter's start-up)
    assert cli_run.main(["--model", f"scripted:{script}", "--runs-dir", str(runs), "--run-id", "base", "--trials", "2",
                         *extra]) == 0
    base = records(runs / "base")
    assert len(base) == 4

    # Each attempt is killed at a random moment of its work: 0-2 s after it logged run_started (the
    # imports before that take seconds, more on a loaded machine, and would make most kills no-ops).
    rng = random.Random(20261129)
    run_dir = runs / "killed"
    kills = 0
    for attempt in range(10):
        proc = pkb_run(runs, "killed", script, *extra, resume=(run_dir / "run.json").exists())
        deadline = time.monotonic() + 300
        while proc.poll() is None and started(run_dir) <= attempt and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 2.0))
        kills += proc.poll() is None
        kill(proc)
    assert kills >= 8  # most attempts really were killed mid-run
    finish(pkb_run(runs, "killed", script, resume=True))
    killed = records(run_dir)

    assert set(killed) == set(base)
    for key in base:
        assert outcome(run_dir, key, killed[key]) == outcome(runs / "base", key, base[key]), key
    assert condition_metrics(list(killed.values())) == condition_metrics(list(base.values()))
    verdicts = {(r["problem"], r["condition"]): r["verdict"] for r in killed.values()}
    assert verdicts == {("all_reduce", "zero-shot"): "no_code", ("all_gather", "zero-shot"): "no_code",
                        ("all_reduce", "agent:compile"): "correct", ("all_gather", "agent:compile"): "shape_mismatch"}
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    torn = [line for line in lines if not (line.startswith("{") and line.endswith("}"))]
    assert len(torn) <= kills  # at most one half-written line per kill; every later event starts a fresh line
    assert all(json.loads(line) for line in lines if line not in torn)
