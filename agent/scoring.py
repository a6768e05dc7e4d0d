"""One candidate through the harness, the same way for the runner's final scoring, the search and the tools.

Every evaluation goes through an Executor (agent.executors): on this node a LocalExecutor over the
DeviceScheduler, which builds native code before it takes the devices (a GPU never waits on a compiler)
and runs the harness inside a lease; with Ray, a task on a node. What it held is counted one way,
agent.executors.request.device_seconds. An `infra_error` (the harness's or the machine's failure, never
the model's) is tried again, up to INFRA_ATTEMPTS in all, with the same request, unless its cause lasts
(harness.common.failures.LASTING_INFRA_CAUSES: the machine lacks something, the emulation refused an API).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.executors.request import device_seconds
from harness.common import failures
from harness.records.results import EvalResult

INFRA_ATTEMPTS = 3


@dataclass
class Scored:
    result: EvalResult
    attempts: int
    seconds: float  # wall time of every attempt
    gpu_s: float  # device seconds of every attempt (agent.executors.request.device_seconds)


def score(attempt: Callable[[], EvalResult], *, log: Any = None, event: str = "scoring_infra_error",
          **context: Any) -> Scored:
    """`attempt()` (one evaluation through an executor) until its verdict is not infra_error or its infra
    cause lasts, at most INFRA_ATTEMPTS times; each infra_error is logged as `event` with `context`."""
    started = time.perf_counter()
    gpu_s = 0.0
    result: EvalResult | None = None
    attempts = 0
    for attempts in range(1, INFRA_ATTEMPTS + 1):
        result = attempt()
        gpu_s += device_seconds(result)
        if result.verdict != failures.INFRA_ERROR:
            break
        if log is not None:
            log.warning(event, attempt=attempts, attempts=INFRA_ATTEMPTS,
                        message=result.failure.message if result.failure else "", **context)
        if result.failure is not None and result.failure.infra_cause in failures.LASTING_INFRA_CAUSES:
            break
    assert result is not None
    return Scored(result, attempts, time.perf_counter() - started, gpu_s)
