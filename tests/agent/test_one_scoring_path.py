"""One final scoring (agent.final_scoring.score_final) for the agent's score node, the runner, the search's
re-measurement and `pkb rescore`; `pkb rescore` loads no model stack; one RunLayout names a run folder's paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent import final_scoring, remeasure
from agent.cli import run as cli_run
from agent.executors.request import device_seconds
from agent.rescore import rescore_run
from agent.rundir import RunLayout
from agent.scheduler import DeviceScheduler
from harness.common.paths import REPO_ROOT
from harness.emulation import layout
from harness.evaluate import evaluate
from harness.problems.registry import get, load_suite
from tests.agent_support import BROKEN, eval_config, fenced, run_samples, scripted
from tests.conftest import CANDIDATES
from tools.base import ToolContext, ToolSettings

MODEL_STACK = ("langchain", "langgraph")  # every module of LangChain's and LangGraph's packages starts so


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(file name, seed) of every agent.final_scoring.score_final call."""
    seen: list[tuple[str, int]] = []
    real = final_scoring.score_final

    def spy(problem: Any, path: Path, **kwargs: Any) -> final_scoring.FinalScore:
        seen.append((Path(path).name, kwargs["config"].seed))
        return real(problem, path, **kwargs)

    monkeypatch.setattr(final_scoring, "score_final", spy)
    return seen


def test_the_score_node_rescore_and_remeasure_score_through_one_function(tmp_path: Path,
                                                                         calls: list[tuple[str, int]]) -> None:
    runner, summary = run_samples(tmp_path, [scripted([("text", fenced(BROKEN))])], conditions=["zero-shot"])
    assert summary.records[0]["verdict"] == "compile_error"
    assert calls == [("final.py", final_scoring.scoring_seed(0))]  # the graph's score node

    rescore_run(runner.run_dir, runner.config, {p.name: p for p in load_suite()},
                scheduler=DeviceScheduler("cpu", 2, cpu_slots=1))
    assert calls[1:] == [("000.py", final_scoring.scoring_seed(0))]  # `pkb rescore` of the sample run

    problem = get(load_suite(), "all_reduce")
    candidate = runner.run_dir.sample("all_reduce", "zero-shot", 0).candidate(0)
    measured = remeasure.remeasure(problem, candidate, evaluate=evaluate, config=eval_config(), seeds=[7, 8],
                                   world_size=2, device="cpu", shape="small")
    assert calls[2:] == [("000.py", 7)]  # the search's re-measurement: a round each, stopped at the untrusted one
    assert measured.rounds[0].verdict == "compile_error"


def test_the_runner_scores_a_replayed_file_through_the_same_function(tmp_path: Path,
                                                                     calls: list[tuple[str, int]]) -> None:
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "all_reduce.py").write_text(BROKEN)
    code = cli_run.main(["--model", f"replay:{solutions}", "--problems", "all_reduce", "--trials", "2",
                         "--runs-dir", str(tmp_path / "runs"), "--run-id", "replayed"])
    assert code == 0  # the run finished; its one file is judged (wrong)
    assert calls == [("final.py", final_scoring.scoring_seed(0))]
    record = RunLayout(tmp_path / "runs" / "replayed").sample("all_reduce", "replay", 0).record() or {}
    assert record["verdict"] == "compile_error" and record["scoring_seed"] == final_scoring.scoring_seed(0)


def test_pkb_rescore_loads_no_model_stack(tmp_path: Path) -> None:
    """`pkb rescore` of a sample run, in a fresh interpreter: it scores the run's candidate, and neither LangChain nor
    LangGraph was imported; nor by what the search run's rescore imports."""
    runner, _ = run_samples(tmp_path, [scripted([("text", fenced(BROKEN))])], conditions=["zero-shot"])
    script = (
        "import json, sys\n"
        "from agent.cli import main\n"
        f"rc = main(['rescore', {str(runner.run_dir.path)!r}])\n"
        "import agent.search.rescore, agent.cli.search, agent.search.layout, harness.common.flags\n"
        f"loaded = sorted(m for m in sys.modules if m.startswith({MODEL_STACK!r}))\n"
        "print(json.dumps({'rc': rc, 'loaded': loaded}))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"rc": 0, "loaded": []}
    sample = runner.run_dir.sample("all_reduce", "zero-shot", 0)
    rescored = json.loads(sample.rescored_json.read_text())["candidates"]
    assert rescored["candidates/000.py"]["verdict"] == "compile_error"


def test_the_run_layout_names_every_path_of_a_run_folder(tmp_path: Path) -> None:
    run = RunLayout(tmp_path / "r")
    sample = run.sample("all_reduce", "agent", 2)
    names = {p.relative_to(run.path).as_posix() for p in (
        run.run_json, run.events, run.checkpoints, run.replay_matches, run.rescored, sample.sample_json,
        sample.result_json, sample.transcript_json, sample.final_py, sample.logs, sample.rescored_json,
        sample.attempts, sample.candidate(7))}
    assert names == {"run.json", "events.jsonl", "checkpoints.sqlite", "replay_matches.json", "rescored.json",
                     "samples/all_reduce/agent/2/sample.json", "samples/all_reduce/agent/2/result.json",
                     "samples/all_reduce/agent/2/transcript.json", "samples/all_reduce/agent/2/final.py",
                     "samples/all_reduce/agent/2/logs", "samples/all_reduce/agent/2/rescored.json",
                     "samples/all_reduce/agent/2/attempts", "samples/all_reduce/agent/2/candidates/007.py"}
    assert run.sample_dirs() == []  # no samples folder yet
    sample.candidates.mkdir(parents=True)
    for name in ("001.py", "000.py", "000.json", "notes.py", "10.py"):
        (sample.candidates / name).write_text("")
    assert [p.name for p in sample.candidate_files()] == ["000.py", "001.py", "10.py"]
    assert run.sample_dirs() == []  # a folder without sample.json is no sample
    sample.sample_json.write_text("{}")
    assert run.sample_dirs() == [sample]


def test_gpu_seconds_have_one_definition_whoever_measures_them(tmp_path: Path) -> None:
    """An evaluation's figure (its executor's held seconds), a device call's and a tool's own wall time are each
    harness.emulation.layout.device_seconds: the GPUs held, ranks sharing one counted once."""
    problem = get(load_suite(), "all_reduce")
    emulated = eval_config().model_copy(update={"ranks_per_gpu": 2})
    ctx = ToolContext(problem=problem, settings=ToolSettings(4, "cuda", "small"), config=emulated, workdir=tmp_path)
    assert ctx.gpu_seconds(10.0) == layout.device_seconds(10.0, 4, 2) == 20.0  # two GPUs held, not four
    on_cpu = replace(ctx, settings=ToolSettings(4, "cpu", "small"))
    assert on_cpu.gpu_seconds(10.0) == 0.0  # a tool on CPU holds no GPU

    result = evaluate(problem, CANDIDATES / "compile_error_syntax.py", world_size=4, device="cpu", shape="small",
                      config=emulated)
    result = result.model_copy(update={"environment": {**result.environment, "executor": {"held_s": 3.0}}})
    assert device_seconds(result) == layout.device_seconds(3.0, 4, 2) == 6.0
