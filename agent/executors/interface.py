"""The Executor protocol (what the runner and the agent's tools need of wherever evaluations run) and
adapters that let code below the agent layer use one without importing it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from agent.executors.request import EvalRequest, device_seconds
from harness.config import EvalConfig
from harness.emulation import layout
from harness.problems.problem import Problem
from harness.records.results import EvalResult


class Executor(Protocol):
    """What the runner needs: one evaluation; a harness function on W devices (a profile, a trace); how many
    evaluations fit at once; and to let go of the devices or the cluster at the end."""

    name: str

    def evaluate(self, request: EvalRequest) -> EvalResult: ...

    def run_on_devices(self, world_size: int, device: str, fn: Callable[..., Any], /, *args: Any,
                       **kwargs: Any) -> Any:
        ...

    def capacity(self, world_size: int, device: str) -> int: ...

    def close(self) -> None: ...


class Scheduler(Protocol):
    """What LocalExecutor needs of agent.scheduler.DeviceScheduler: a lease (exclusive unless `shared`, which
    only an untimed evaluation asks for and only a scheduler whose `shares` is true grants); `label` names it
    in the scheduler's events."""

    def lease(self, *, shared: bool = False, label: str = "") -> Any: ...



def evaluate_all(executor: Executor, requests: Sequence[EvalRequest]) -> list[EvalResult]:
    """Every request, in order, as concurrently as the executor allows."""
    many: Callable[[Sequence[EvalRequest]], list[EvalResult]] | None = getattr(executor, "evaluate_many", None)
    return many(requests) if many is not None else [executor.evaluate(r) for r in requests]


def as_evaluate(executor: Executor, spent: list[float] | None = None) -> Callable[..., EvalResult]:
    """A function with harness.evaluate.evaluate's signature that evaluates through `executor`, for code below
    the agent layer (tools/) that must not import it. `gpus` is the executor's to choose and is ignored.
    Each evaluation's device_seconds is appended to `spent`."""

    def evaluate(problem: Problem, candidate_path: Path, *, world_size: int, device: str = "cpu",
                 shape: str = "small", config: EvalConfig | None = None, log_dir: Path | None = None,
                 gpus: list[int] | None = None) -> EvalResult:
        result = executor.evaluate(EvalRequest.build(problem, candidate_path, world_size=world_size, device=device,
                                                     shape=shape, config=config, log_dir=log_dir))
        if spent is not None:
            spent.append(device_seconds(result))
        return result

    return evaluate


def as_device_call(executor: Executor, spent: list[float] | None = None) -> Callable[..., Any]:
    """executor.run_on_devices, appending the GPU-seconds of each call's wall time to `spent`
    (harness.emulation.layout.device_seconds; queueing included: a device call reports no stages)."""

    def call(world_size: int, device: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return executor.run_on_devices(world_size, device, fn, *args, **kwargs)
        finally:
            if spent is not None:
                spent.append(layout.device_seconds(time.perf_counter() - started, world_size))

    return call
