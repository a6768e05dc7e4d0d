"""`--ranks-per-gpu N` (with `--device cuda`): W ranks share the visible GPUs, N on each, with symmetric memory
emulated (harness.emulation, docs/emulation.md). Kernels are checked for real; their timings are not speedups.

One place for the option, its checks and what the CLI says about it, shared by `pkb eval` and `pkb run`.
"""

from __future__ import annotations

import argparse

from agent.cli.common import CliError
from harness.emulation import layout

HELP = ("ranks sharing each GPU (with --device cuda; default 1): W > GPUs runs on fewer GPUs with symmetric memory "
        "emulated; timings are then not speedups")


def notice(ranks_per_gpu: int | None = None) -> str:
    who = f"{ranks_per_gpu} ranks share each GPU" if ranks_per_gpu and ranks_per_gpu > 1 else "ranks share GPUs"
    return (f"emulated: {who} (symmetric memory emulated, host collectives); the timings are not speedups and "
            "never count as fast")


def add_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup, default: int | None = 1) -> None:
    p.add_argument("--ranks-per-gpu", type=int, default=default, help=HELP)


def check(device: str, world_size: int, ranks_per_gpu: int, visible_gpus: int | None = None) -> None:
    """One line for what cannot run: N < 1, N > 1 without --device cuda, too few GPUs for W at N a GPU, or a
    harness without the emulated mode."""
    if ranks_per_gpu < 1:
        raise CliError(f"--ranks-per-gpu must be at least 1, got {ranks_per_gpu}")
    if not layout.is_emulated(ranks_per_gpu):
        return
    if device != "cuda":
        raise CliError("--ranks-per-gpu needs --device cuda (on CPU every rank is a process already)")
    from harness.config import EvalConfig  # pydantic: only where emulation is asked for, not while parsing

    if "ranks_per_gpu" not in EvalConfig.model_fields:
        raise CliError("--ranks-per-gpu: this harness has no emulated mode (EvalConfig.ranks_per_gpu) yet")
    if visible_gpus is not None and visible_gpus < layout.gpus_needed(world_size, ranks_per_gpu):
        raise CliError(f"--world-size {world_size} at --ranks-per-gpu {ranks_per_gpu} needs "
                       f"{layout.gpus_needed(world_size, ranks_per_gpu)} GPUs; {visible_gpus} visible")
