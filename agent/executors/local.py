"""LocalExecutor: the harness on this node's devices, inside the leases of the runner's DeviceScheduler."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from agent.executors.interface import Scheduler
from agent.executors.request import (
    EvalRequest,
    candidate_file,
    infra_result,
    problem_for,
    with_candidate_name,
    with_gpus,
)
from agent.scheduler import MemoryGate, memory_gate
from harness.common import failures
from harness.common.integrity import IntegrityConfig
from harness.compiling.compile import CompileOutcome, compile_candidate
from harness.config import EvalConfig
from harness.evaluate import build_limits
from harness.evaluate import evaluate as harness_evaluate
from harness.launch.sandbox.budget import evaluation_limits
from harness.records.results import EvalResult

# An evaluation's admission: its candidate sandbox's memory limit, and as much again for its reference pool
# (agent.scheduler.MemoryGate).
REFERENCE_SHARE = 1.0


class LocalExecutor:
    """The harness on this node's devices. With a scheduler, every evaluation runs inside one of its leases
    (W GPUs on CUDA, a rank slot on CPU), native code built before the lease is taken; without one,
    evaluations run where harness.evaluate puts them."""

    name = "local"

    def __init__(self, scheduler: Scheduler | None = None, memory: MemoryGate | None = None) -> None:
        self.scheduler = scheduler
        self.memory = memory or getattr(scheduler, "memory", None) or memory_gate()

    def memory_budget(self, request: EvalRequest, config: EvalConfig) -> int:
        """The bytes an evaluation is admitted with: the same sandbox limits harness.evaluate derives."""
        checks = IntegrityConfig.coerce(config.integrity.overrides(), request.device)
        limits = evaluation_limits(problem_for(request.problem_spec), request.shape, request.world_size,
                                   request.device, checks)
        return int(limits.memory_bytes * (1 + REFERENCE_SHARE))

    @contextmanager
    def _devices(self, *, shared: bool = False, label: str = "") -> Iterator[tuple[list[int] | None, Any]]:
        """(GPUs, the lease) of a lease of the scheduler; (None, None) without one."""
        if self.scheduler is None:
            yield None, None
            return
        with self.scheduler.lease(shared=shared, label=label) as lease:
            yield getattr(lease, "gpus", lease), lease  # a Lease, or a scheduler that yields the GPU list itself

    def _shares(self, config: EvalConfig) -> bool:
        """Untimed evaluations may hold the GPUs beside others when the scheduler allows it."""
        return config.skip_timing and bool(getattr(self.scheduler, "shares", False))

    def evaluate(self, request: EvalRequest) -> EvalResult:
        try:
            problem = problem_for(request.problem_spec)
            config = request.eval_config()
            log_dir = Path(request.log_dir) if request.log_dir else None
            label = f"{problem.name} {request.shape}"
            with candidate_file(request) as path:
                # A GPU never waits on a compiler: native code is built (into the cache the harness's own
                # compile step reads) before the lease; a build that fails needs no device at all: the harness
                # takes that failure as its compile step's and starts no rank (it does not build again, which
                # could succeed where this failed, under load, and start ranks without a lease).
                outcome: CompileOutcome | None = None
                if request.device == "cuda" and self.scheduler is not None:
                    outcome = compile_candidate(path, config.limits.compile_s, request.device,
                                                problem=problem.loader_spec,
                                                limits=build_limits(config, request.device))
                built = outcome is None or outcome.ok

                budget = self.memory_budget(request, config)

                def judge(shared: bool) -> tuple[EvalResult, float, bool]:
                    """One evaluation: its result, the seconds it held the devices (0 without a lease), and
                    whether another evaluation held them too at some moment."""
                    with self.memory.hold(budget), (
                            self._devices(shared=shared, label=label) if built else nullcontext((None, None))) as (
                            gpus, lease):
                        started = time.perf_counter()
                        result = harness_evaluate(problem, path, world_size=request.world_size,
                                                  device=request.device, shape=request.shape, config=config,
                                                  log_dir=log_dir, gpus=gpus, built=outcome)
                        held = time.perf_counter() - started
                    if self.scheduler is not None and lease is None:
                        held = 0.0  # the build failed before the lease: the compile stage ran without devices
                    return result, held, bool(getattr(lease, "overlapped", False))

                result, held, overlapped = judge(self._shares(config))
                # How long the devices were held, for agent.executors.request.device_seconds (the stages
                # overlap), and how long the build before the lease took (the compile stage then finds it cached).
                executor: dict[str, Any] = {"name": self.name, "held_s": round(held, 6)}
                if overlapped:
                    executor["shared"] = True
                    cause = result.failure.infra_cause if result.failure is not None else None
                    if not failures.stands_when_shared(result.verdict, cause):
                        # A neighbour may have caused it (memory, a slowed rank, a race's interleaving): the
                        # verdict that counts is the one this candidate earns alone.
                        first = result.verdict
                        result, alone, _ = judge(False)
                        executor.update(held_s=round(held + alone, 6), judged_again_alone=first)
            if outcome is not None:
                executor["build_before_lease_s"] = round(outcome.seconds, 6)
                if outcome.builds:
                    # The build itself, as it was made before the lease (the compile stage within the lease then
                    # found it cached, and records every build as a "hit"): what the tools' build line reports.
                    executor["builds"] = outcome.builds
            result = result.model_copy(update={"environment": {**result.environment, "executor": executor}})
            return with_candidate_name(result, path, request.candidate_name)
        except Exception as exc:  # the harness's own failure: reported, not raised into the agent loop
            return infra_result(request, f"the harness failed: {type(exc).__name__}: {exc}",
                                evidence=traceback.format_exc(), executor={"name": self.name})

    def run_on_devices(self, world_size: int, device: str, fn: Callable[..., Any], /, *args: Any,
                       **kwargs: Any) -> Any:
        """fn(*args, **kwargs) inside a lease (a harness function that needs W devices: a profile, a trace),
        with `gpus=` the lease's GPUs where fn takes it."""
        with self._devices(label=getattr(fn, "__name__", "")) as (gpus, _):
            return fn(*args, **with_gpus(fn, kwargs, gpus))

    def evaluate_many(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        """In request order; as many at once as the scheduler has leases (one without a scheduler)."""
        with ThreadPoolExecutor(max_workers=self.capacity(), thread_name_prefix="pkb-eval") as pool:
            return list(pool.map(self.evaluate, requests))

    def capacity(self, world_size: int | None = None, device: str | None = None) -> int:
        """Evaluations that run at once: the scheduler's leases (its W and device are fixed)."""
        return max(1, int(getattr(self.scheduler, "capacity", 1) or 1))

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
