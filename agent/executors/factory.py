"""make_executor: an executor by name (`local` or `ray`)."""

from __future__ import annotations

from typing import Any, Literal, overload

from agent.executors import EXECUTORS, ExecutorError
from agent.executors.interface import Scheduler
from agent.executors.local import LocalExecutor
from agent.executors.ray_cluster import RayExecutor


@overload
def make_executor(name: Literal["ray"], ray_address: str | None = None, *, scheduler: Scheduler | None = None,
                  **ray_options: Any) -> RayExecutor: ...


@overload
def make_executor(name: str = "local", ray_address: str | None = None, *, scheduler: Scheduler | None = None,
                  **ray_options: Any) -> LocalExecutor | RayExecutor: ...


def make_executor(name: str = "local", ray_address: str | None = None, *, scheduler: Scheduler | None = None,
                  **ray_options: Any) -> LocalExecutor | RayExecutor:
    """`local` (this node, through `scheduler`) or `ray` (the cluster at `ray_address`)."""
    if name == "local":
        if ray_address is not None:
            raise ExecutorError("--ray-address applies to --executor ray only")
        return LocalExecutor(scheduler)
    if name == "ray":
        return RayExecutor(ray_address, **ray_options)
    raise ExecutorError(f"unknown executor {name!r}; expected one of {', '.join(EXECUTORS)}")
