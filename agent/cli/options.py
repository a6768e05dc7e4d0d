"""Options several commands share, defined once: `--source`, what `pkb roofline` and `pkb profile` look at,
and where `pkb run` sends its evaluations (`--executor`). `--ranks-per-gpu` is agent.cli.emulation's."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from agent.cli.common import CliError
from agent.executors import EXECUTORS, ExecutorError

if TYPE_CHECKING:
    from agent.executors.interface import Scheduler
    from agent.executors.local import LocalExecutor
    from agent.executors.ray_cluster import RayExecutor


def add_source_argument(p: argparse.ArgumentParser, help: str = "pkb:PATH to use a ParallelKernelBench checkout"
                        " (default: this suite)") -> None:
    """`--source`: this suite (default) or a ParallelKernelBench checkout (agent.cli.source reads it)."""
    p.add_argument("--source", default=None, help=help)


def add_target_arguments(p: argparse.ArgumentParser, solution_help: str) -> None:
    """What `pkb roofline` and `pkb profile` look at: a problem, optionally a candidate, where and how big."""
    p.add_argument("--problem", required=True, help="problem name (required)")
    p.add_argument("--solution", default=None, help=solution_help + " (default: the reference alone)")
    p.add_argument("--shape", default=None, help="shape name (default: 'small' on cpu, 'default' on cuda)")
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes; on cuda one GPU each)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the ranks run")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs")


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """`--executor local|ray`, `--ray-address ADDR`, `--ray-retries N` (for `pkb run`)."""
    parser.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="where evaluations run: this node (local, default) or a Ray cluster (ray)")
    parser.add_argument("--ray-address", default=None,
                        help="the Ray cluster's address (what `ray start --head` printed, or 'auto'); default: "
                             "RAY_ADDRESS, else a cluster started on this machine, else a new one-node instance")
    parser.add_argument("--ray-retries", type=int, default=3,
                        help="times an evaluation whose Ray worker or node died is run again (default 3)")


def executor_from_args(args: argparse.Namespace, *, device: str, world_size: int,
                       scheduler: Scheduler | None = None) -> LocalExecutor | RayExecutor:
    """The executor the options ask for, for a run of W ranks on `device`; bad options, an unreachable
    cluster and a cluster with no node of W devices are one-line CliErrors."""
    # Deferred: the executors import the harness (torch), which the parser and `pkb --help` must not need.
    from agent.executors.factory import make_executor
    from agent.executors.ray_cluster import check_reachable

    name = getattr(args, "executor", "local") or "local"
    address = getattr(args, "ray_address", None)
    retries = getattr(args, "ray_retries", 3)
    if retries is None or retries < 0:
        raise CliError(f"--ray-retries must be at least 0, got {retries}")
    try:
        if name != "ray":
            return make_executor(name, address, scheduler=scheduler)
        check_reachable(address)  # before Ray is even imported
        executor = make_executor("ray", address, max_retries=retries, device=device)
    except ExecutorError as err:
        raise CliError(str(err)) from None
    if executor.capacity(world_size, device) < 1:
        executor.close()
        unit = "GPUs" if device == "cuda" else f"{executor.resource(device)} units"
        raise CliError(f"no live node of the Ray cluster has {world_size} {unit} for one evaluation "
                       f"(a task's devices all come from one node)")
    return executor
