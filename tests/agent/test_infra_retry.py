"""A sample that ends in infra_error (the harness's failure, never the model's) is judged again: after waits of
minutes within a pass (injected clock and sleep: nothing here waits), on `--resume` and on `--retry-infra`; every
earlier judgement is kept in the sample's attempts/, and a run left with infra samples says INCOMPLETE and how to
retry them (agent.runner, agent.cli.run_session)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import agent.run_config
import agent.runner
import agent.scoring
import harness.evaluate
from agent.budgets import Budget
from agent.cli import run as cli_run
from agent.rundir import RunDir
from agent.runner import DEFAULT_INFRA_WAITS_S, RunConfig, RunInterrupted, Runner, RunSummary, create_run
from agent.scheduler import DeviceScheduler
from harness import cancel
from harness.common import failures
from harness.problems.registry import get, load_suite
from harness.records.results import CandidateInfo, EvalResult, Failure
from tests.agent_support import BROKEN, SCRIPTED, eval_config, fenced, scripted
from tests.conftest import CANDIDATES

CAUSE = "launch"  # not a lasting cause: agent.scoring tries it INFRA_ATTEMPTS times in a row




def _infra(problem: Any, path: Path) -> EvalResult:
    return EvalResult(problem=problem.name, category=problem.category, shape="small", world_size=2, device="cpu",
                      candidate=CandidateInfo(path=str(path), sha256="0"), verdict=failures.INFRA_ERROR,
                      correct=False, seed=0, trials=2,
                      failure=Failure(verdict=failures.INFRA_ERROR, message="the rank pool did not start",
                                      infra_cause=CAUSE))


class Flaky:
    """harness.evaluate that returns an infra_error for `problems` while `failing(calls)` says so."""

    def __init__(self, problems: set[str], failing: Callable[[int], bool]) -> None:
        self.problems, self.failing, self.calls = problems, failing, 0
        self.real = harness.evaluate.evaluate

    def __call__(self, problem: Any, path: Path, **kwargs: Any) -> EvalResult:
        if problem.name in self.problems:
            self.calls += 1
            if self.failing(self.calls):
                return _infra(problem, path)
        return self.real(problem, path, **kwargs)


class Clock:
    """The runner's clock and sleep: a sleep only moves the clock on, and is recorded."""

    def __init__(self, on_sleep: Callable[[float], None] | None = None) -> None:
        self.now, self.on_sleep = 0.0, on_sleep
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep(seconds)
        self.now += seconds


def _runner(tmp_path: Path, clock: Clock, models: list[int], **config: Any) -> Runner:
    """One zero-shot sample of all_reduce whose reply is a candidate that does not compile (judged without ranks)."""
    problem = get(load_suite(), "all_reduce")
    run_config = RunConfig(model=SCRIPTED, conditions=["zero-shot"], samples=1, problems=[problem.name],
                           budgets=Budget().as_dict(), trials=2, model_attempts=1, **config)
    run_dir = RunDir(tmp_path / "run")
    if not run_dir.run_json.exists():
        create_run(run_dir, run_config, None)

    def model() -> Any:
        models.append(1)
        return scripted([("text", fenced(BROKEN))])

    return Runner(run_dir, run_config, [problem], model_factory=model, eval_config=eval_config(),
                  scheduler=DeviceScheduler("cpu", 2, cpu_slots=1), sleep=clock.sleep, clock=clock)


def _sample(runner: Runner) -> Path:
    return runner.run_dir.path / "samples" / "all_reduce" / "zero-shot" / "0"


def test_an_infra_error_is_judged_again_after_waits_of_minutes(tmp_path, monkeypatch):
    """Three judgements in infra_error (each of agent.scoring's quick attempts too), the fourth judges the code:
    the waits between them are the default schedule, minutes in all, and the model is asked once."""
    judgements_failing = 3
    flaky = Flaky({"all_reduce"}, lambda n: n <= judgements_failing * agent.scoring.INFRA_ATTEMPTS)
    monkeypatch.setattr("agent.executors.local.harness_evaluate", flaky)
    clock, models = Clock(), list[int]()
    runner = _runner(tmp_path, clock, models)
    summary = runner.run()

    assert clock.sleeps == list(DEFAULT_INFRA_WAITS_S) == [30.0, 120.0, 300.0]
    assert sum(clock.sleeps) >= 7 * 60  # over minutes, not the ~12 s of agent.scoring's own retries
    assert models == [1]  # judged again: the model's reply is not asked for again
    record = summary.records[0]
    assert summary.complete and summary.infra_errors == 0 and record["verdict"] == "compile_error"
    assert record["infra_cause"] is None and record["turns"] == 1
    attempts = record["attempts"]
    assert [a["verdict"] for a in attempts] == ["infra_error"] * 3 + ["compile_error"]
    assert [a["infra_cause"] for a in attempts] == [CAUSE] * 3 + [None]
    assert [a["after_wait_s"] for a in attempts] == [None, 30.0, 120.0, 300.0]
    assert [a["kept"] for a in attempts] == ["attempts/1", "attempts/2", "attempts/3", None]
    assert all("rank pool did not start" in a["message"] for a in attempts[:3])
    folder = _sample(runner)
    for n in (1, 2, 3):  # every earlier judgement's records, set aside, none lost
        kept = json.loads((folder / "attempts" / str(n) / "sample.json").read_text())
        assert kept["verdict"] == "infra_error" and kept["status"] == "finished"
        assert json.loads((folder / "attempts" / str(n) / "result.json").read_text())["verdict"] == "infra_error"
    assert json.loads((folder / "result.json").read_text())["verdict"] == "compile_error"
    assert json.loads((folder / "sample.json").read_text()) == record
    events = [json.loads(line)["event"] for line in (runner.run_dir.events).read_text().splitlines()]
    assert events.count("sample_infra_wait") == 3 and events.count("sample_judged_again") == 3


def test_a_sample_left_in_infra_error_is_judged_again_on_resume(tmp_path, monkeypatch):
    """No waits left (a schedule of one wait): the run ends with the sample in infra_error; a later pass with the
    failure gone judges it, and the earlier judgements stay in attempts/."""
    flaky = Flaky({"all_reduce"}, lambda n: True)
    monkeypatch.setattr("agent.executors.local.harness_evaluate", flaky)
    clock, models = Clock(), list[int]()
    summary = _runner(tmp_path, clock, models, infra_waits_s=[60.0]).run()
    assert clock.sleeps == [60.0] and summary.infra_errors == 1 and summary.complete
    assert [r["verdict"] for r in summary.infra_records] == ["infra_error"]
    assert [a["infra_cause"] for a in summary.records[0]["attempts"]] == [CAUSE, CAUSE]

    flaky.failing = lambda n: False
    runner = _runner(tmp_path, clock, models, infra_waits_s=[60.0])
    again = runner.run()  # what --resume does
    assert clock.sleeps == [60.0] and again.skipped == 0 and models == [1]
    record = again.records[0]
    assert again.infra_errors == 0 and record["verdict"] == "compile_error"
    assert [(a["verdict"], a["kept"]) for a in record["attempts"]] == [
        ("infra_error", "attempts/1"), ("infra_error", "attempts/2"), ("compile_error", None)]
    assert (_sample(runner) / "attempts" / "2" / "sample.json").is_file()


def test_a_lasting_infra_cause_is_not_waited_on(tmp_path, monkeypatch):
    """A cause this machine meets again (a multicast refusal under emulation, a missing package) is judged once in
    a pass: no waits of minutes holding the devices for the same refusal; --resume (on another machine) judges it
    again."""
    lasting = sorted(failures.LASTING_INFRA_CAUSES)[0]
    monkeypatch.setattr("tests.agent.test_infra_retry.CAUSE", lasting)
    flaky = Flaky({"all_reduce"}, lambda n: True)
    monkeypatch.setattr("agent.executors.local.harness_evaluate", flaky)
    clock, models = Clock(), list[int]()
    summary = _runner(tmp_path, clock, models).run()
    assert clock.sleeps == [] and flaky.calls == 1
    assert summary.infra_errors == 1 and summary.records[0]["infra_cause"] == lasting


def test_ctrl_c_during_a_wait_stops_the_run_at_once(tmp_path, monkeypatch, fresh_cancel):
    """Ctrl-C (harness.cancel.request, what the signal handler calls) while the runner waits to judge a sample
    again: the wait ends at once (harness.cancel.sleep), the run stops, and the sample's infra_error record is on
    disk for --resume."""
    monkeypatch.setattr("agent.executors.local.harness_evaluate", Flaky({"all_reduce"}, lambda n: True))

    def interrupted(seconds: float) -> None:
        cancel.request()
        cancel.sleep(seconds)  # returns at once, raising Cancelled: nothing here waits 30 s

    clock, models = Clock(on_sleep=interrupted), list[int]()
    runner = _runner(tmp_path, clock, models)
    with pytest.raises(RunInterrupted) as caught:
        runner.run()
    assert clock.sleeps == [30.0]  # the first wait, and no other
    summary: RunSummary = caught.value.summary
    assert [r["verdict"] for r in summary.records] == ["infra_error"]
    record = json.loads((_sample(runner) / "sample.json").read_text())
    assert record["status"] == "finished" and record["verdict"] == "infra_error" and len(record["attempts"]) == 1
    events = [json.loads(line)["event"] for line in runner.run_dir.events.read_text().splitlines()]
    assert "sample_infra_wait" in events and "run_interrupted" in events and "sample_judged_again" not in events


def test_pkb_run_says_incomplete_then_retry_infra_judges_only_those_samples(tmp_path, monkeypatch, capsys):
    """A replay whose all_gather file always meets an infra_error: `pkb run` exits 1 saying INCOMPLETE, naming the
    sample and its cause, and printing the command; `--retry-infra` with the failure gone judges that sample only
    (the other keeps its record untouched), and its earlier judgements stay in attempts/."""
    monkeypatch.setattr(agent.run_config, "DEFAULT_INFRA_WAITS_S", (0.0,))  # one wait, of nothing
    flaky = Flaky({"all_gather"}, lambda n: True)
    monkeypatch.setattr("agent.executors.local.harness_evaluate", flaky)
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    for name in ("all_reduce.py", "all_gather.py"):
        shutil.copy(CANDIDATES / "compile_error_syntax.py", solutions / name)
    runs = tmp_path / "runs"
    code = cli_run.main(["--model", f"replay:{solutions}", "--trials", "2", "--runs-dir", str(runs),
                         "--run-id", "r"])
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert code == 1, out
    label = f"{CAUSE} ({failures.INFRA_CAUSE_LABELS[CAUSE]})"  # the recorded cause, and in a reader's words
    assert "INCOMPLETE" in out and "all_gather/replay/0" in out and f"{label}, {label}" in out, out
    assert "a lasting cause" not in out  # a launch failure may clear here: no word on going elsewhere
    assert f"pkb run --run-id r --retry-infra --runs-dir {runs}" in out, out
    assert flaky.calls == 2 * agent.scoring.INFRA_ATTEMPTS
    samples = runs / "r" / "samples"
    other = samples / "all_reduce" / "replay" / "0" / "sample.json"
    stamp = other.stat().st_mtime_ns

    flaky.failing = lambda n: False
    code = cli_run.main(["--run-id", "r", "--retry-infra", "--runs-dir", str(runs)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "judging again 1 sample(s) that ended in infra_error" in " ".join(captured.err.split())
    assert "INCOMPLETE" not in captured.out
    assert other.stat().st_mtime_ns == stamp  # not judged again
    record = json.loads((samples / "all_gather" / "replay" / "0" / "sample.json").read_text())
    assert record["verdict"] == "compile_error" and record["infra_cause"] is None
    assert [(a["verdict"], a["infra_cause"], a["kept"]) for a in record["attempts"]] == [
        ("infra_error", CAUSE, "attempts/1"), ("infra_error", CAUSE, "attempts/2"), ("compile_error", None, None)]
    first = json.loads((samples / "all_gather" / "replay" / "0" / "attempts" / "1" / "sample.json").read_text())
    assert first["verdict"] == "infra_error" and first["attempts"][0]["infra_cause"] == CAUSE


def test_retry_infra_needs_a_run_id(capsys):
    assert cli_run.main(["--retry-infra"]) == 2
    assert "--retry-infra needs --run-id" in capsys.readouterr().err
