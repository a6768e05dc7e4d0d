"""What a search charges: device seconds as the GPUs held (ranks sharing a GPU count it once), a devices-busy
figure that counts the evaluation slots held (so it cannot pass 100%), and an agent proposer whose episode's
tools are charged to the search and catch broken drafts before an evaluation is spent."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import agent.executors.local
from agent.executors.local import LocalExecutor
from agent.executors.request import device_seconds
from agent.scheduler import DeviceScheduler
from agent.scoring import Scored
from agent.search import budget, scoring
from agent.search.archive import Archive
from agent.search.config import Limits, SearchConfig
from agent.search.layout import SearchDir, create
from agent.search.loop import Search
from agent.search.summary import throughput
from harness.problems.problem import Problem, load_problem
from harness.problems.registry import SUITE_ROOT
from harness.records.results import CandidateInfo, EvalResult
from tests import search_fakes

PROBLEMS = ["all_reduce", "all_gather", "reduce_scatter"]


@pytest.fixture(scope="module")
def suite() -> list[Problem]:
    return [load_problem(SUITE_ROOT / "collective" / f"{name}.py") for name in PROBLEMS]


def result(world_size: int, ranks_per_gpu: int, stages: dict[str, float], held_s: float | None = None) -> EvalResult:
    environment = {"executor": {"name": "local", "held_s": held_s}} if held_s is not None else {}
    return EvalResult(problem="all_reduce", category="collective", shape="small", world_size=world_size,
                      device="cuda", candidate=CandidateInfo(path="c.py", sha256="0" * 64), verdict="correct",
                      correct=True, seed=0, trials=2, stages=stages, environment=environment,
                      config={"ranks_per_gpu": ranks_per_gpu})


# -- GPU seconds ----------------------------------------------------------------------------------------
def test_an_evaluation_is_charged_the_gpus_it_held_not_its_ranks():
    # W=4 at two ranks per GPU holds two GPUs: 3 s held is 6 GPU-seconds (the old figure said 4 x the stages)
    shared = result(4, 2, {"reference": 1.0, "launch": 1.0, "launch_wait": 0.2, "check": 1.5}, held_s=3.0)
    assert device_seconds(shared) == pytest.approx(6.0)
    assert scoring.outcome(Scored(shared, 1, 3.2, device_seconds(shared)), None, 10.0)["gpu_s"] == pytest.approx(6.0)
    # without the executor's own figure, the stages that do not overlap (launch runs while the reference is
    # prepared; build_in_call is part of check): 1 + 0.2 + 1.5
    untimed = result(4, 2, {"reference": 1.0, "launch": 1.0, "launch_wait": 0.2, "check": 1.5, "build_in_call": 0.4})
    assert device_seconds(untimed) == pytest.approx(2 * 2.7)
    assert device_seconds(result(4, 1, {"check": 1.0}, held_s=2.0)) == pytest.approx(8.0)  # one rank per GPU
    config = SearchConfig(model="scripted:mutator", problems=["all_reduce"], world_size=4, ranks_per_gpu=2,
                          device="cuda", budget=Limits(candidates=1))
    assert config.gpus_per_evaluation == 2 and config.eval_config().ranks_per_gpu == 2


def test_the_busy_figure_and_the_gpu_budget_read_the_gpus_held_with_ranks_per_gpu_2(tmp_path: Path):
    with Archive(tmp_path / "archive.sqlite") as archive:
        session = archive.start_session("local", 1)
        archive.heartbeat(session, 10.0)
        archive.decide(0, "all_reduce", 0, None, [], "best_first", {})
        archive.propose(0, model="m", input_tokens=1, output_tokens=1, cost_usd=0.0, cost_known=True, model_s=0.1,
                        note="", source="x", sha256="0", path="p", proposer_gpu_s=2.0, tool_calls={"check": 1})
        held = result(4, 2, {"check": 4.0}, held_s=4.0)
        archive.evaluate(0, scoring.outcome(Scored(held, 1, 4.0, device_seconds(held)), None, 9.0))
        t = throughput(archive, gpus_per_evaluation=2)
        # 8 GPU-seconds of evaluation + 2 of the proposer's check, over 2 GPUs a slot: 5 slot-seconds of 10
        assert t["device_s"] == pytest.approx(10.0) and t["held_s"] == pytest.approx(5.0)
        assert t["busy_fraction"] == pytest.approx(0.5)
        (c,) = archive.candidates()
        assert budget.spent([c], [c], 10.0).gpu_s == pytest.approx(10.0)  # the GPU budget counts the tools too


# -- the busy figure -------------------------------------------------------------------------------------
SLEEP_S = 0.15
# Stage times as a report of harness.evaluate gives them, larger than the 0.15 s the fake holds its lease (on a
# loaded machine the real ones are, and `launch` runs inside `reference`): the sum of 3 s per evaluation is what
# the busy figure used to count.
OVERLAPPING = {"reference": 1.2, "launch": 1.2, "launch_wait": 0.0, "load": 0.1, "check": 0.2, "timing": 0.2,
               "teardown": 0.1}


def slow_harness(problem: Problem, path: Path, **kwargs: Any) -> EvalResult:
    """harness.evaluate as LocalExecutor calls it, inside its lease: the fake's verdict after SLEEP_S, with stage
    times that overlap as the real ones do and sum to more than the time the lease was held."""
    time.sleep(SLEEP_S)
    kwargs.pop("gpus", None)
    return search_fakes.evaluate(problem, path, **kwargs).model_copy(update={"stages": dict(OVERLAPPING)})


def test_the_devices_busy_figure_counts_slots_held_and_cannot_pass_100_percent(tmp_path: Path, suite, monkeypatch):
    monkeypatch.setattr(agent.executors.local, "harness_evaluate", slow_harness)
    config = SearchConfig(model="scripted:mutator", problems=PROBLEMS, budget=Limits(candidates=12), window=4,
                          rescore_seeds=1, rescore_candidates=1)
    directory = SearchDir(tmp_path / "s")
    create(directory, config)
    executor = LocalExecutor(DeviceScheduler("cpu", 2, cpu_slots=1))  # one evaluation at a time, four in flight
    search = Search(directory, config, suite, executor=executor, bound=search_fakes.bound)
    assert search.run().stop_reason == "search_budget:candidates"
    with Archive(directory.archive) as archive:
        t = throughput(archive, config.gpus_per_evaluation)
        rows = [r for r in archive.rows(("stages", "attempts")) if (r["attempts"] or 0) > 0]
        summed = sum(sum(json.loads(r["stages"]).values()) for r in rows)
        summed += sum(sum(json.loads(r["result"])["stages"].values()) for r in archive._rows("SELECT result FROM "
                                                                                              "rescores"))
    evaluations = len(rows) + t["rescores"]
    assert evaluations >= 10 and t["capacity"] == 1
    assert t["held_s"] >= evaluations * SLEEP_S * 0.99  # every lease counted
    assert 0 < t["busy_fraction"] <= 1.0
    # what the figure was before: the stages' sum over the same wall, which passed 100%
    assert summed / t["wall_s"] > 1.0


# -- an agent proposer ------------------------------------------------------------------------------------
def agent_search(tmp_path: Path, suite: list[Problem], proposer: str, name: str) -> tuple[SearchConfig, SearchDir]:
    config = SearchConfig(model="scripted:mutator:syntax=0.3,wrong=0.3,hang=0,runtime=0,collective=0,no_code=0",
                          problems=PROBLEMS, budget=Limits(candidates=12), proposer=proposer, proposer_turns=3,
                          rescore_seeds=1, rescore_candidates=1, seed=5)
    directory = SearchDir(tmp_path / name)
    create(directory, config)
    search = Search(directory, config, suite, executor=search_fakes.RemoteLike(), bound=search_fakes.bound)
    assert search.run().stop_reason == "search_budget:candidates"
    return config, directory


def test_an_agent_proposer_checks_drafts_before_an_evaluation_is_spent(tmp_path: Path, suite):
    _, plain = agent_search(tmp_path, suite, "zero-shot", "plain")
    config, directory = agent_search(tmp_path, suite, "agent:check", "agent")
    with Archive(plain.archive) as a:
        broken_plain = [c for c in a.candidates() if not c.correct]
        assert all(c.tool_calls == {} and c.proposer_gpu_s == 0 for c in a.candidates())
    with Archive(directory.archive) as a:
        rows = a.candidates()
        t = throughput(a, config.gpus_per_evaluation)
    assert len(rows) == 12
    for c in rows:
        checks = c.tool_calls.get("check", 0)
        assert 1 <= checks <= config.proposer_turns and c.proposer_gpu_s > 0, c
        if not c.correct:  # a broken draft reached the evaluation only when every turn's check had failed
            assert checks == config.proposer_turns, c
        episode = directory.episodes / f"{c.id:05d}"
        roles = [m["role"] for m in json.loads((episode / "transcript.json").read_text())]
        assert roles[:2] == ["system", "user"] and roles.count("tool") == checks
    assert len([c for c in rows if not c.correct]) < len(broken_plain)
    assert t["proposer_device_s"] == pytest.approx(sum(c.proposer_gpu_s for c in rows))
    assert "`check`" in json.loads((directory.episodes / "00000" / "transcript.json").read_text())[0]["content"]


def test_a_proposer_is_named_like_a_condition():
    with pytest.raises(ValueError, match="unknown tool 'frob'"):
        SearchConfig(model="scripted:mutator", problems=["all_reduce"], budget=Limits(candidates=1),
                     proposer="agent:frob")
    config = SearchConfig(model="scripted:mutator", problems=["all_reduce"], budget=Limits(candidates=1),
                          proposer="agent:compile+check")
    assert config.proposer == "agent:check+compile"  # its canonical name
