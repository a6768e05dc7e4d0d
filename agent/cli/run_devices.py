"""Whether this node can run `pkb run`'s evaluations: the world size, emulation (--ranks-per-gpu), evaluations
sharing GPUs (--evaluations-per-gpu), a visible CUDA device; and the scheduler that hands its devices out."""

from __future__ import annotations

import torch

from agent.cli import emulation
from agent.cli.common import CliError
from agent.run_config import RunConfig
from agent.scheduler import DeviceScheduler, SchedulerError
from harness.emulation import layout


def check_device(config: RunConfig, executor: str = "local", evaluations_per_gpu: int = 1) -> DeviceScheduler | None:
    """This node's scheduler; None for a Ray run, whose driver needs no devices (the cluster is checked when the
    executor is built). `evaluations_per_gpu` > 1: untimed evaluations may share the GPUs (the stored run's
    --no-timing decides, so a resumed run is checked as well)."""
    if config.world_size < 1:
        raise CliError(f"--world-size must be at least 1, got {config.world_size}")
    emulation.check(config.device, config.world_size, config.ranks_per_gpu)
    if evaluations_per_gpu > 1:
        if not config.skip_timing:
            raise CliError("--evaluations-per-gpu needs --no-timing: a timing never shares its GPUs")
        if config.device != "cuda":
            raise CliError("--evaluations-per-gpu needs --device cuda (on CPU the rank slots are the concurrency)")
        if executor != "local":
            raise CliError("--evaluations-per-gpu shares this machine's GPUs: leave --executor at local")
    if executor != "local":
        if layout.is_emulated(config.ranks_per_gpu):
            raise CliError("--ranks-per-gpu runs on this machine's GPUs: leave --executor at local")
        return None
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise CliError("--device cuda: no CUDA device is visible on this machine")
    try:
        return DeviceScheduler(config.device, config.world_size, ranks_per_gpu=config.ranks_per_gpu,
                               shared_evaluations=evaluations_per_gpu)
    except SchedulerError as err:
        raise CliError(str(err)) from None
