"""Profiling ranks that share GPUs (harness.emulation): what the report says such a profile cannot tell, Nsight
Compute not asking for NVLink's counters where every rank shares one GPU, and multicast the emulation cannot
rewrite refused before anything runs. ncu's runs are faked at harness.measure.ncu._one_run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.measure import ncu as nsight
from harness.measure import profiling
from harness.problems.registry import get, load_suite


def test_the_caveats_are_said_only_for_ranks_that_share_gpus() -> None:
    assert profiling.emulation_caveats(2, 1) == []
    assert profiling.emulation_caveats(2, 2, device="cpu") == []
    one = profiling.emulation_caveats(2, 2, ncu_rank=1)
    assert one[0].startswith("emulated: 2 ranks share each GPU") and "cannot tell" in one[0]
    assert one[1:] == [f"- {s}" for s in (profiling.EMULATED_TIMES, profiling.EMULATED_TRAFFIC_ONE_GPU,
                                          profiling.EMULATED_COLLECTIVES, profiling.EMULATED_NCU.format(rank=1))]
    assert "NVLink" in profiling.EMULATED_TRAFFIC_ONE_GPU and "speedups" in profiling.EMULATED_TIMES
    # without ncu, nothing about its rank; on two GPUs, NVLink sees the far peers
    assert not any("Nsight" in line for line in profiling.emulation_caveats(2, 2))
    two = profiling.emulation_caveats(4, 2)
    assert f"- {profiling.EMULATED_TRAFFIC_SOME_GPUS}" in two and f"- {profiling.EMULATED_TRAFFIC_ONE_GPU}" not in two
    assert f"- {profiling.EMULATED_TRAFFIC_ONE_GPU}" in profiling.emulation_caveats(4, 2, gpus=[3, 3, 3, 3])


def test_one_gpu_is_read_from_the_lease_else_from_the_placement() -> None:
    assert nsight.on_one_gpu(2, 2) and nsight.on_one_gpu(4, 4) and not nsight.on_one_gpu(4, 2)
    assert nsight.on_one_gpu(4, 2, [1, 1, 1, 1]) and not nsight.on_one_gpu(2, 2, [0, 1])


def _runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...]]]:
    calls: list[tuple[str, tuple[str, ...]]] = []

    def one_run(ncu, problem, candidate, name, metrics, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append((name, tuple(metrics)))
        rows = [{"kernel": "one_shot_all_reduce", **{m: 1.0 for m in metrics}}]
        return nsight.NcuRun(name, list(metrics), [], "collected"), rows, set(metrics)

    monkeypatch.setattr(nsight, "_one_run", one_run)
    monkeypatch.setattr(nsight, "ncu_path", lambda: "/usr/bin/ncu")
    return calls


def test_ranks_on_one_gpu_are_not_asked_for_nvlink(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _runs(monkeypatch)
    report = nsight.collect(SimpleNamespace(loader_spec="x"), None, world_size=2, device="cuda", shape="small",
                            metrics=["core", "throughput"], budget_s=120.0, ranks_per_gpu=2)
    assert [name for name, _ in calls] == ["core", "throughput"]
    assert not any(set(ms) & set(nsight.NVLINK) for _, ms in calls)
    assert calls[0][1] == tuple(m for m in nsight.METRIC_SETS["core"] if m not in nsight.NVLINK)
    assert {m: report.missing[m] for m in nsight.NVLINK} == dict.fromkeys(nsight.NVLINK, nsight.NO_NVLINK_ON_ONE_GPU)
    assert set(report.missing) == set(nsight.NVLINK) and report.status == "partial"
    # a set of NVLink's counters alone has nothing left to run
    calls.clear()
    alone = nsight.collect(SimpleNamespace(loader_spec="x"), None, world_size=2, device="cuda", shape="small",
                           metrics=list(nsight.NVLINK), budget_s=120.0, ranks_per_gpu=2, gpus=[0, 0])
    assert calls == [] and alone.status == "not_collected" and set(alone.missing) == set(nsight.NVLINK)


@pytest.mark.parametrize(("world_size", "ranks_per_gpu", "gpus"), [(2, 1, None), (4, 2, None), (4, 2, [0, 0, 1, 1])])
def test_ranks_with_a_peer_on_another_gpu_are_asked_for_nvlink(world_size: int, ranks_per_gpu: int,
                                                               gpus: list[int] | None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _runs(monkeypatch)
    report = nsight.collect(SimpleNamespace(loader_spec="x"), None, world_size=world_size, device="cuda",
                            shape="small", metrics=["core"], budget_s=120.0, ranks_per_gpu=ranks_per_gpu, gpus=gpus)
    assert calls == [("core", nsight.METRIC_SETS["core"])] and report.status == "collected"


def test_multicast_the_emulation_cannot_rewrite_is_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing_runs(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("started")

    monkeypatch.setattr(profiling, "compile_candidate", nothing_runs)
    monkeypatch.setattr(profiling, "RankPool", nothing_runs)
    candidate = tmp_path / "mc.py"
    candidate.write_text("import torch\n\ndef solution(x):\n    # cuMulticastCreate(&handle, &prop)\n    return x\n")
    problem = get(load_suite(), "all_reduce")
    with pytest.raises(profiling.ProfileError) as err:
        profiling.profile(problem, candidate, world_size=2, device="cuda", shape="small", ranks_per_gpu=2)
    assert err.value.verdict == "infra_error" and str(err.value).startswith("not available in emulation: ")
    assert "cuMulticastCreate" in str(err.value)


@pytest.mark.gpu(count=1)
def test_gpu_two_ranks_on_one_gpu_profile_the_one_shot_expert_with_ncu() -> None:
    """On one GPU (benchmarks/device/profile_emulated.sh runs the CLI and the agent's tool the same way)."""
    if nsight.ncu_path() is None:
        pytest.skip("ncu is not on PATH")
    from harness.common.paths import REPO_ROOT

    expert = REPO_ROOT / "problems/collective/solutions/all_reduce__one_shot.py"
    report = profiling.profile(get(load_suite(), "all_reduce"), expert, world_size=2, device="cuda", shape="default",
                               ranks_per_gpu=2, gpus=[0, 0], ncu=True, ncu_budget_s=120,
                               ncu_metrics=list(nsight.AGENT_SETS))
    assert report.ranks_per_gpu == 2 and report.emulation == profiling.emulation_caveats(2, 2, gpus=[0, 0], ncu_rank=0)
    assert report.ncu is not None and report.ncu.kernels, report.ncu.missing
    assert nsight.DURATION in report.ncu.per_call and not set(report.ncu.per_call) & set(nsight.NVLINK)
    assert all(report.ncu.missing[m] == nsight.NO_NVLINK_ON_ONE_GPU for m in nsight.NVLINK)
