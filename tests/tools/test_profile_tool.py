"""The profile tool where the sample's ranks share a GPU (`--ranks-per-gpu`, harness.emulation): the run's placement
reaches the profiler (through the agent's executor, as a run's tool call goes), and the answer says what an
emulated profile can and cannot tell, right under its first line and within the answer's budget. The profiler is
faked at harness.measure.profiling.profile; the GPU lease is the scheduler's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.executors.interface import as_device_call
from agent.executors.local import LocalExecutor
from agent.scheduler import DeviceScheduler
from harness.config import EvalConfig
from harness.measure import profiling
from harness.problems.registry import get, load_suite
from tools import profile as profile_tool
from tools.base import ToolContext, ToolSettings
from tools.dispatch import run_tool
from tools.render import count_tokens

RIGHT = "import torch\n\ndef solution(x):\n    return x\n"


def _report(world_size: int, device: str, ranks_per_gpu: int = 1, gpus: list[int] | None = None,
            ncu: bool = False, ncu_rank: int = 0, kernels: int = 1, **_: Any) -> profiling.ProfileReport:
    stats = [profiling.KernelStat(f"kernel_number_{i}_of_a_long_name", "compute", 10.0 + i, 1.0)
             for i in range(kernels)]
    ranks = [profiling.RankTimeline(rank=r, iterations=5, call_us=2500.0, call_median_us=2500.0, comm_us=2400.0,
                                    compute_us=50.0, overlap_us=0.0, busy_us=2450.0, idle_us=50.0, gaps_per_iter=1.0,
                                    largest_gap_us=40.0, lanes=1, kernel_count=kernels, kernels=stats,
                                    window_source="spin markers") for r in range(world_size)]
    return profiling.ProfileReport(
        problem="all_reduce", target="000.py", shape="default", world_size=world_size, device=device, warmup=3,
        iterations=5, ranks=ranks, slowest_rank=0, skew=0.0, ranks_per_gpu=ranks_per_gpu,
        emulation=profiling.emulation_caveats(world_size, ranks_per_gpu, device=device, gpus=gpus,
                                              ncu_rank=ncu_rank if ncu else None))


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    # `gpus` named, as the profiler's own signature names it: the executor passes the lease's GPUs to what takes it
    def fake(problem: Any, candidate: Path, *, gpus: list[int] | None = None, **kwargs: Any) -> profiling.ProfileReport:
        calls.append({**kwargs, "gpus": gpus})
        return _report(**kwargs, gpus=gpus)

    monkeypatch.setattr(profiling, "profile", fake)
    return calls


def _ctx(tmp_path: Path, ranks_per_gpu: int, world_size: int = 2, answer_tokens: int = 600, **kw: Any) -> ToolContext:
    config = EvalConfig().model_copy(update={"ranks_per_gpu": ranks_per_gpu})
    return ToolContext(problem=get(load_suite(), "all_reduce"),
                       settings=ToolSettings(world_size, "cuda", "default", answer_tokens=answer_tokens), config=config,
                       workdir=tmp_path, **kw)


def test_a_runs_emulated_placement_reaches_the_profiler_through_its_executor(tmp_path: Path,
                                                                             seen: list[dict[str, Any]]) -> None:
    """As `pkb run --device cuda --world-size 2 --ranks-per-gpu 2` on one GPU: the lease holds GPU 0 for both ranks."""
    executor = LocalExecutor(DeviceScheduler("cuda", 2, gpus=[0], ranks_per_gpu=2))
    outcome = run_tool("profile", {"source": RIGHT}, _ctx(tmp_path, 2, on_devices=as_device_call(executor)))
    assert seen[0]["ranks_per_gpu"] == 2 and seen[0]["gpus"] == [0, 0] and seen[0]["world_size"] == 2
    assert seen[0]["ncu"] is True and seen[0]["device"] == "cuda"
    lines = outcome.text.splitlines()
    assert lines[0].startswith("profile 000.py on all_reduce shape=default W=2 (cuda)")
    assert lines[1] == profiling.emulation_caveats(2, 2, gpus=[0, 0], ncu_rank=0)[0]
    for said in (profiling.EMULATED_TIMES, profiling.EMULATED_TRAFFIC_ONE_GPU, profiling.EMULATED_COLLECTIVES,
                 profiling.EMULATED_NCU.format(rank=0)):
        assert f"- {said}" in lines
    assert outcome.data["result"]["ranks_per_gpu"] == 2 and outcome.data["result"]["emulation"] == lines[1:6]


def test_ranks_on_two_gpus_are_told_nvlink_sees_only_the_far_peers(tmp_path: Path,
                                                                   seen: list[dict[str, Any]]) -> None:
    outcome = run_tool("profile", {"source": RIGHT}, _ctx(tmp_path, 2, world_size=4, gpus=[0, 0, 1, 1]))
    assert seen[0]["gpus"] == [0, 0, 1, 1] and seen[0]["ranks_per_gpu"] == 2
    assert f"- {profiling.EMULATED_TRAFFIC_SOME_GPUS}" in outcome.text.splitlines()
    assert profiling.EMULATED_TRAFFIC_ONE_GPU not in outcome.text


def test_the_caveats_survive_a_long_profile_within_the_budget(tmp_path: Path, seen: list[dict[str, Any]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def long(problem: Any, candidate: Path, **kwargs: Any) -> profiling.ProfileReport:
        return _report(**kwargs, kernels=200)  # far more kernel lines than 600 tokens hold

    monkeypatch.setattr(profiling, "profile", long)
    outcome = run_tool("profile", {"source": RIGHT}, _ctx(tmp_path, 2, gpus=[0, 0], answer_tokens=600))
    assert count_tokens(outcome.text) <= 600 and "cut to fit" in outcome.text
    assert all(line in outcome.text.splitlines() for line in outcome.data["result"]["emulation"])
    for budget in (300, 600, 1000):  # the text alone keeps within any budget the caveats fit in
        text = profile_tool.answer_text(_report(2, "cuda", 2, ncu=True, kernels=200), budget)
        assert count_tokens(text) <= budget and profiling.EMULATED_TIMES in text


def test_one_rank_per_gpu_has_no_caveat(tmp_path: Path, seen: list[dict[str, Any]]) -> None:
    outcome = run_tool("profile", {"source": RIGHT}, _ctx(tmp_path, 1, gpus=[0, 1]))
    assert seen[0]["ranks_per_gpu"] == 1 and "emulated" not in outcome.text
    assert outcome.data["result"]["emulation"] == []
