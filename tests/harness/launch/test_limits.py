"""harness.launch.sandbox.limits and .budget: one definition of every sandbox's limits. A rank's budget derives
from its problem and shape (inputs and outputs times a factor, plus a base), a problem may raise it, the
integrity settings and the host cap it; the executor admits evaluations while their budgets fit the host."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.executors.local import REFERENCE_SHARE, LocalExecutor
from agent.executors.request import EvalRequest
from agent.scheduler import MemoryGate
from harness.common.integrity import IntegrityConfig
from harness.config import EvalConfig
from harness.launch.sandbox import budget as budget_module
from harness.launch.sandbox import limits as limits_module
from harness.launch.sandbox.budget import evaluation_limits, rank_io_bytes
from harness.launch.sandbox.limits import DEFAULT_BUDGET, SandboxLimits
from harness.problems.registry import get, load_suite


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


def test_the_budget_follows_the_shape_not_the_largest_problem(all_reduce) -> None:
    small = evaluation_limits(all_reduce, "small", 2, "cpu", IntegrityConfig())
    default = evaluation_limits(all_reduce, "default", 2, "cpu", IntegrityConfig())
    io = rank_io_bytes(all_reduce, "small", 2)
    assert io is not None and io < 1 << 20  # a few KiB: the inputs of one rank and W outputs
    # was 2 x 32 GiB of memory and 2 x 8 GiB of /dev/shm whatever the shape
    assert small.memory_bytes == 2 * (DEFAULT_BUDGET.memory_base + int(DEFAULT_BUDGET.memory_factor * io))
    assert small.shm_bytes < 256 << 20 and small.tmp_bytes < 256 << 20 and small.scratch_bytes < 2 << 30
    assert default.memory_bytes > small.memory_bytes and default.shm_bytes > small.shm_bytes
    assert "rank_memory_bytes" in small.describe("memory") and "budget" in small.describe("memory")


def test_the_settings_and_the_host_cap_the_budget(all_reduce, monkeypatch: pytest.MonkeyPatch) -> None:
    capped = evaluation_limits(all_reduce, "small", 2, "cpu", IntegrityConfig(rank_memory_bytes=512 << 20))
    assert capped.memory_bytes == 1 << 30
    # a 4 GiB host: the settings' defaults alone (32 GiB a rank) would be 64 GiB
    monkeypatch.setattr(limits_module, "meminfo", lambda field="MemTotal", path=None: 4 << 30)
    host = SandboxLimits.for_ranks(2, IntegrityConfig())
    assert host.memory_bytes == (4 << 30) - limits_module.HOST_RESERVE
    assert host.shm_bytes <= host.memory_bytes and "capped by the host" in host.describe("memory")


def test_a_problem_may_raise_its_budget(all_reduce, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(all_reduce.module, "RANK_BUDGET", {"shm": 3 << 30}, raising=False)
    raised = evaluation_limits(all_reduce, "small", 2, "cpu", IntegrityConfig())
    assert raised.shm_bytes == min(2 * (3 << 30), raised.memory_bytes)
    monkeypatch.setattr(all_reduce.module, "RANK_BUDGET", {"disk": 1}, raising=False)
    with pytest.raises(ValueError):
        evaluation_limits(all_reduce, "small", 2, "cpu", IntegrityConfig())


def test_unknown_inputs_fall_back_to_the_settings(all_reduce, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget_module, "rank_io_bytes", lambda problem, shape, world_size: None)
    limits = evaluation_limits(all_reduce, "small", 2, "cpu", IntegrityConfig(rank_shm_bytes=64 << 20))
    assert limits.shm_bytes == 128 << 20 and "integrity settings" in limits.describe("shm")


def test_the_gate_is_measured_from_meminfo(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       25165824 kB\nMemAvailable:   12582912 kB\n")
    assert MemoryGate.measured(info).capacity == (12 << 30) - limits_module.HOST_RESERVE
    assert MemoryGate.measured(tmp_path / "missing").capacity == 0  # nothing assumed: one at a time


def test_the_gate_admits_only_what_fits() -> None:
    gate = MemoryGate(10)
    first_in, release_first, second_in = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with gate.hold(6):
            first_in.set()
            release_first.wait()

    def second() -> None:
        with gate.hold(6):
            second_in.set()

    a = threading.Thread(target=first)
    a.start()
    first_in.wait()
    b = threading.Thread(target=second)
    b.start()
    with gate.hold(4):  # fits beside the first
        assert gate.held == 10
    assert not second_in.is_set()  # 6 + 6 > 10: waits
    release_first.set()
    a.join()
    b.join()
    assert second_in.is_set() and gate.peak == 10 and gate.held == 0
    with gate.hold(50):  # larger than the whole capacity: alone
        assert gate.running == 1


def test_the_executor_admits_by_the_budget_the_harness_uses(all_reduce, tmp_path: Path) -> None:
    candidate = tmp_path / "c.py"
    candidate.write_text("def solution(x):\n    return x\n")
    request = EvalRequest.build(all_reduce, candidate, world_size=2)
    executor = LocalExecutor(SimpleNamespace(memory=MemoryGate(1 << 40)))
    expected = evaluation_limits(all_reduce, "small", 2, "cpu", IntegrityConfig.for_device("cpu"))
    assert executor.memory_budget(request, EvalConfig()) == int(expected.memory_bytes * (1 + REFERENCE_SHARE))


def test_an_evaluation_runs_inside_the_gate(all_reduce, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    candidate = tmp_path / "c.py"
    candidate.write_text("def solution(x):\n    return x\n")
    gate = MemoryGate(1 << 40)
    executor = LocalExecutor(SimpleNamespace(memory=gate, lease=None))
    executor.scheduler = None  # no devices: the gate alone
    seen: list[int] = []

    def evaluate(*args: object, **kwargs: object) -> None:
        seen.append(gate.held)
        raise RuntimeError("stop here")

    monkeypatch.setattr("agent.executors.local.harness_evaluate", evaluate)
    result = executor.evaluate(EvalRequest.build(all_reduce, candidate, world_size=2))
    assert result.verdict == "infra_error" and seen == [executor.memory_budget(
        EvalRequest.build(all_reduce, candidate, world_size=2), EvalConfig())]
    assert gate.held == 0
