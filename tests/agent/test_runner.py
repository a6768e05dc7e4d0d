"""The runner and `pkb run`: the run directory, concurrency through the device scheduler, infra retries,
replaying solution directories (ours and PKB's) without an API key, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agent.scoring
import harness.evaluate
from agent.budgets import Budget
from agent.cli import run as cli_run
from agent.report.run_reader import read_run
from agent.scheduler import DeviceScheduler
from harness.common import failures
from harness.common.paths import REPO_ROOT
from harness.records.results import CandidateInfo, EvalResult, Failure
from tests.agent_support import BROKEN, fenced, run_samples, scripted
from tests.conftest import CANDIDATES, TESTS

REPO = REPO_ROOT
FIXTURES = TESTS / "fixtures"


# -- the run directory ------------------------------------------------------------------------------
def test_run_directory_layout_events_and_skipping_finished_samples(tmp_path):
    def model():
        return scripted([("text", fenced(BROKEN))])

    runner, summary = run_samples(tmp_path, model, conditions=["zero-shot"], problems=("all_reduce", "all_gather"),
                                  samples=2, concurrency=2)
    root = runner.run_dir.path
    assert summary.complete and summary.total == 4 and summary.skipped == 0
    header = json.loads((root / "run.json").read_text())
    assert header["schema"] == "pkb-run/1" and header["run_id"] == "run"
    assert header["config"]["model"] == "scripted:test" and header["config"]["conditions"] == ["zero-shot"]
    assert header["config"]["samples"] == 2 and header["config"]["budgets"] == Budget().as_dict()
    assert header["topology"] is None  # CPU
    assert header["prompt_hashes"] and all(isinstance(v, str) for v in header["prompt_hashes"].values())
    assert {"pkb_agent", "torch", "python", "langgraph"} <= set(header["versions"])
    assert header["environment"]["torch"] == header["versions"]["torch"]
    folders = sorted(p.relative_to(root / "samples").as_posix() for p in (root / "samples").glob("*/*/*"))
    assert folders == ["all_gather/zero-shot/0", "all_gather/zero-shot/1", "all_reduce/zero-shot/0",
                       "all_reduce/zero-shot/1"]
    events = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    assert names[0] == "run_started" and names[-1] == "run_finished" and names.count("sample_finished") == 4
    assert all("timestamp" in e and "level" in e for e in events)
    # every lease the final scorings took, granted and returned, named by problem and shape
    granted = [e for e in events if e["event"] == "lease_granted"]
    assert len(granted) == names.count("lease_returned") == 4
    assert sorted(e["label"] for e in granted) == ["all_gather small"] * 2 + ["all_reduce small"] * 2
    assert all(e["waited_s"] >= 0 and e["shared"] is False for e in granted)
    assert runner.scheduler is not None and runner.scheduler.listener is None  # let go when the run ended
    finished = [e for e in events if e["event"] == "sample_finished"]
    assert {(e["problem"], e["sample"]) for e in finished} == {(p, k) for p in ("all_reduce", "all_gather")
                                                               for k in (0, 1)}
    # the report's reader understands the run
    run = read_run(root)
    assert len(run.samples) == 4 and {s.record.verdict for s in run.samples} == {"compile_error"}
    assert all(s.final_code and s.result for s in run.samples)

    # a second pass redoes nothing: every sample is finished
    stamps = {p: p.stat().st_mtime_ns for p in (root / "samples").rglob("sample.json")}
    again = runner.run()
    assert again.skipped == 4 and len(again.records) == 4
    assert stamps == {p: p.stat().st_mtime_ns for p in (root / "samples").rglob("sample.json")}


# -- devices ------------------------------------------------------------------------------------------
def test_scheduler_hands_out_disjoint_gpu_groups():
    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1, 2, 3, 4])
    assert scheduler.groups == [[0, 1], [2, 3]] and scheduler.capacity == 2
    held: list[list[int]] = []
    overlaps: list[tuple[list[int], list[list[int]]]] = []
    peak = [0]
    lock = threading.Lock()

    def work() -> None:
        with scheduler.lease() as lease:
            assert lease.gpus is not None  # a CUDA scheduler's lease names its GPUs
            with lock:
                if any(set(lease.gpus) & set(g) for g in held):
                    overlaps.append((lease.gpus, list(held)))
                held.append(lease.gpus)
                peak[0] = max(peak[0], len(held))
            time.sleep(0.02)
            with lock:
                held.remove(lease.gpus)

    threads = [threading.Thread(target=work) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [] and peak[0] == 2 and scheduler.in_use == {}


def test_concurrent_samples_never_evaluate_at_once_beyond_the_scheduler(tmp_path, monkeypatch):
    """Three sample threads, one CPU slot: tool checks and final scorings all go through the scheduler."""
    active, peak, lock = [0], [0], threading.Lock()

    def counted(real):
        def wrapper(*args: Any, **kwargs: Any) -> EvalResult:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                time.sleep(0.05)
                return real(*args, **kwargs)
            finally:
                with lock:
                    active[0] -= 1
        return wrapper

    # Every evaluation, the tools' and the final scoring's, runs through the local executor's harness call.
    monkeypatch.setattr("agent.executors.local.harness_evaluate", counted(harness.evaluate.evaluate))

    def model():
        return scripted([("tool", "check", {"source": BROKEN}), ("tool", "submit", {"source": BROKEN})])

    _, summary = run_samples(tmp_path, model, conditions=["agent:check"], samples=3, concurrency=3)
    assert summary.complete and peak[0] == 1
    assert {r["verdict"] for r in summary.records} == {"compile_error"}


def test_sample_json_carries_the_results_fast_eligible_flag():
    """An integrity flag (uses_torch_collectives, ...) makes a correct, faster candidate not count toward fast_p:
    sample.json says so beside the verdict; results from before the harness had the field count as eligible."""
    from agent.conditions import parse_condition
    from agent.runner import SampleSpec, sample_record
    from harness.problems.registry import get, load_suite

    spec = SampleSpec(get(load_suite(), "all_reduce"), parse_condition("zero-shot"), 0)
    result = {"verdict": "correct", "correct": True, "speedup": 1.8, "flags": ["uses_torch_collectives"], "seed": 1}

    def record(**fields: Any) -> dict[str, Any]:
        return sample_record(spec, "scripted:test", status="finished", started_at="t",
                             state={"result": {**result, **fields}})

    assert record(fast_eligible=False)["fast_eligible"] is False
    assert record(fast_eligible=True)["fast_eligible"] is True
    assert record()["fast_eligible"] is True  # written before the field existed
    flagged = record(fast_eligible=False)
    assert flagged["correct"] and flagged["speedup"] == 1.8 and flagged["flags"] == ["uses_torch_collectives"]
    assert sample_record(spec, "scripted:test", status="finished", started_at="t")["fast_eligible"] is False


# -- infrastructure failures ----------------------------------------------------------------------------
def _infra_result(path: Path) -> EvalResult:
    return EvalResult(problem="all_reduce", category="collective", shape="small", world_size=2, device="cpu",
                      candidate=CandidateInfo(path=str(path), sha256="0"), verdict=failures.INFRA_ERROR,
                      correct=False, failure=Failure(verdict=failures.INFRA_ERROR, message="pool did not start"),
                      seed=0, trials=2)


@pytest.mark.parametrize("failing", [2, 5])
def test_scoring_infra_errors_are_retried_then_reported_apart(tmp_path, monkeypatch, failing):
    real, calls = harness.evaluate.evaluate, []

    def flaky(problem, path, **kwargs):
        calls.append(kwargs["config"].seed)
        return _infra_result(path) if len(calls) <= failing else real(problem, path, **kwargs)

    monkeypatch.setattr("agent.executors.local.harness_evaluate", flaky)
    # agent.scoring's own attempts only: no judgement again after a wait (tests/agent/test_infra_retry.py)
    _, summary = run_samples(tmp_path, [scripted([("text", fenced(BROKEN))])], conditions=["zero-shot"],
                             infra_waits_s=[])
    record = summary.records[0]
    assert len(set(calls)) == 1  # every attempt with the same (fresh) scoring seed
    if failing < agent.scoring.INFRA_ATTEMPTS:
        assert record["verdict"] == "compile_error" and record["scoring_attempts"] == failing + 1
        assert summary.infra_errors == 0
    else:
        assert len(calls) == agent.scoring.INFRA_ATTEMPTS and record["verdict"] == "infra_error"
        assert summary.infra_errors == 1 and record["status"] == "finished"


# -- replay -----------------------------------------------------------------------------------------------
def _env_without_keys() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_pkb_run_replays_a_solution_directory_without_an_api_key(tmp_path):
    solutions = tmp_path / "solutions"
    (solutions / "all_reduce").mkdir(parents=True)
    shutil.copy(CANDIDATES / "correct_all_gather_sum.py", solutions / "all_reduce" / "a_correct.py")
    shutil.copy(CANDIDATES / "output_mismatch_rank1.py", solutions / "all_reduce" / "b_wrong.py")
    shutil.copy(CANDIDATES / "compile_error_syntax.py", solutions / "all_gather.py")
    (solutions / "notes.txt").write_text("not a solution\n")
    proc = subprocess.run([sys.executable, "-m", "agent.cli.run", "--model", f"replay:{solutions}", "--trials", "2",
                           "--runs-dir", str(tmp_path / "runs"), "--run-id", "replayed"],
                          env=_env_without_keys(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = read_run(tmp_path / "runs" / "replayed")
    assert run.config["conditions"] == ["replay"] and run.config["problems"] == ["all_gather", "all_reduce"]
    got = {(s.record.problem, s.record.sample): s for s in run.samples}
    assert {k: s.record.verdict for k, s in got.items()} == {
        ("all_reduce", 0): "correct", ("all_reduce", 1): "output_mismatch", ("all_gather", 0): "compile_error"}
    for s in run.samples:
        assert s.record.condition == "replay" and s.record.stop_reason == "replayed" and s.record.turns == 0
        assert s.result is not None and s.result["verdict"] == s.record.verdict
        assert s.candidates[0].path == "candidates/000.py"
    assert got[("all_reduce", 0)].final_code == (CANDIDATES / "correct_all_gather_sum.py").read_text()
    assert "2 of 3" not in proc.stdout and "3 of 3 samples finished" in proc.stdout


def test_replay_of_a_pkb_solution_set(tmp_path, capsys):
    code = cli_run.main(["--model", f"replay:{FIXTURES / 'solutions_cuda_bf16_cpu_scripted_demo'}",
                         "--source", f"pkb:{FIXTURES / 'pkb_checkout'}", "--problems", "1", "--trials", "2",
                         "--runs-dir", str(tmp_path), "--run-id", "pkb", "--no-timing"])
    assert code == 0, capsys.readouterr().err
    run = read_run(tmp_path / "pkb")
    assert [(s.record.problem, s.record.verdict) for s in run.samples] == [("1_all_reduce", "correct")]


# -- bad input ----------------------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fails(capsys, argv: list[str], *needles: str) -> str:
    code = cli_run.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("pkb: error: "), err
    for needle in needles:
        assert needle in err, err
    return err


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    runs = ["--runs-dir", str(tmp_path / "runs")]
    _fails(capsys, ["--model", "mystery:model", *runs], "unknown model 'mystery:model'")
    _fails(capsys, ["--model", "openai:", *runs], "nothing after")
    _fails(capsys, ["--model", "openai:gpt-5.4", "--problems", "all_reduce", *runs], "OPENAI_API_KEY")
    _fails(capsys, ["--model", "anthropic:claude-sonnet-5", "--problems", "all_reduce", *runs], "ANTHROPIC_API_KEY")
    _fails(capsys, ["--model", "openai:gpt-5.4", "--api-key-env", "MY_KEY", "--problems", "all_reduce", *runs],
           "MY_KEY")
    _fails(capsys, ["--model", "scripted:/no/such/script.json", *runs], "no script")
    _fails(capsys, ["--model", "openai:x", "--condition", "agent:teleport", *runs], "unknown tool 'teleport'")
    _fails(capsys, ["--model", "openai:x", "--problems", "all_reduse", *runs], "did you mean all_reduce")
    _fails(capsys, ["--resume", *runs], "--resume needs --run-id")
    _fails(capsys, ["--resume", "--run-id", "nothing-here", *runs], "no run to resume")
    _fails(capsys, ["--model", f"replay:{tmp_path / 'missing'}", *runs], "does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(capsys, ["--model", f"replay:{empty}", *runs], "holds no solution file")
    typo = tmp_path / "typo"
    typo.mkdir()
    (typo / "all_reduse.py").write_text("def solution(x):\n    return x\n")
    _fails(capsys, ["--model", f"replay:{typo}", *runs], "all_reduse.py names no problem", "did you mean all_reduce")
    _fails(capsys, ["--model", f"replay:{typo}", "--condition", "agent", *runs], "do not apply")
    _fails(capsys, ["--model", "replay:" + str(FIXTURES / "solutions_cuda_bf16_cpu_scripted_demo"),
                    "--source", f"pkb:{FIXTURES / 'pkb_checkout'}", "--problems", "2", "--samples", "0", *runs],
           "--samples must be at least 1")
    script = tmp_path / "script.json"
    script.write_text(json.dumps([["text", "no code"]]))
    _fails(capsys, ["--model", f"scripted:{script}", "--budget-cost", "1", *runs], "no price for scripted:")
    nothing_written = list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else []
    assert nothing_written == []  # bad input never leaves a half-made run behind

    # an existing run id needs --resume; --resume with a different setting is refused
    ok = ["--model", f"scripted:{script}", "--problems", "all_reduce", "--run-id", "r1", *runs]
    assert cli_run.main(ok) == 0
    capsys.readouterr()
    _fails(capsys, ok, "already exists", "--resume")
    _fails(capsys, [*ok, "--resume", "--samples", "3"], "was started with samples 1")
    # --problems given again is checked where the suite is read (agent.cli.run_problems), with the same line
    _fails(capsys, [*ok, "--resume", "--problems", "all_reduce,all_gather"],
           "was started with problems ['all_reduce'], not ['all_reduce', 'all_gather']", "leave --problems out")
    assert cli_run.main([*ok, "--resume"]) == 0
    assert "all 1 samples are finished; nothing left to run" in capsys.readouterr().err  # --resume says so

    # an unreachable base URL: said so after the retries
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    _fails(capsys, ["--model", "openai:local-model", "--base-url", url, "--model-retries", "1", "--problems",
                    "all_reduce", "--run-id", "down", *runs], f"base URL {url} is unreachable after 1 attempt")


def test_pkb_has_the_run_command():
    from agent.cli import build_parser

    args = build_parser().parse_args(["run", "--model", "replay:x"])
    assert args.handler is cli_run.cmd_run


@pytest.mark.gpu
def test_replay_and_a_scripted_agent_on_gpus(tmp_path):
    """Expert kernels replayed two at a time on CUDA (the scheduler gives each the GPU pair in turn), and a
    scripted agent that benches then submits one."""
    experts = REPO / "problems" / "collective" / "solutions"
    solutions = tmp_path / "solutions"
    (solutions / "all_reduce").mkdir(parents=True)
    for name in ("all_reduce__one_shot.py", "all_reduce__two_shot.py"):
        shutil.copy(experts / name, solutions / "all_reduce" / name)
    common = ["--device", "cuda", "--world-size", "2", "--trials", "3", "--runs-dir", str(tmp_path)]
    assert cli_run.main(["--model", f"replay:{solutions}", "--concurrency", "2", "--run-id", "replay", *common]) == 0
    run = read_run(tmp_path / "replay")
    assert len(run.samples) == 2
    for s in run.samples:
        assert s.record.correct and s.record.speedup and s.record.gpu_s > 0, s.record
        assert s.result is not None and s.result["device"] == "cuda"
        assert s.result["timings"]["candidate"]["clock"] == "cuda_events"

    expert = (experts / "all_reduce__one_shot.py").read_text()
    script = tmp_path / "gpu.json"
    script.write_text(json.dumps([["tool", "bench", {"source": expert}], ["tool", "submit", {"source": expert}]]))
    assert cli_run.main(["--model", f"scripted:{script}", "--condition", "agent:bench", "--problems", "all_reduce",
                         "--run-id", "agent", *common]) == 0
    record = read_run(tmp_path / "agent").samples[0].record
    assert record.correct and record.stop_reason == "submitted" and record.tool_calls == {"bench": 1, "submit": 1}
    assert record.gpu_s > 0 and record.speedup
