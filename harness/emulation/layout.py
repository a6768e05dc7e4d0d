"""Where the ranks of an emulated run live: W ranks share the visible GPUs, `ranks_per_gpu` on each.

Pure Python, for the scheduler (which GPUs a lease holds), the pool (what each rank process sees) and
the CLI (what to say). Ranks are placed in blocks: ranks 0..N-1 on the first GPU, N..2N-1 on the next.
"""

from __future__ import annotations


def is_emulated(ranks_per_gpu: int) -> bool:
    """More than one rank on a GPU: NCCL cannot run, so collectives go over gloo and symmetric memory is
    emulated. Timings in this mode are not speedups."""
    return ranks_per_gpu > 1


def check(world_size: int, ranks_per_gpu: int) -> None:
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    if ranks_per_gpu < 1:
        raise ValueError(f"ranks per GPU must be at least 1, got {ranks_per_gpu}")


def gpus_needed(world_size: int, ranks_per_gpu: int) -> int:
    check(world_size, ranks_per_gpu)
    return -(-world_size // ranks_per_gpu)


def device_seconds(seconds: float, world_size: int, ranks_per_gpu: int = 1) -> float:
    """GPU-seconds, the project's one definition: the seconds W ranks held their devices, times the GPUs they held
    (ranks sharing a GPU count it once; on CPU, one slot per rank process). The executors' figure of an evaluation
    (agent.executors.request.device_seconds), a device call's (agent.executors.interface.as_device_call) and a
    tool's own (tools.base.ToolContext.gpu_seconds) are each this of the seconds they measured."""
    return gpus_needed(world_size, ranks_per_gpu) * seconds


def rank_gpus(world_size: int, ranks_per_gpu: int, gpus: list[int]) -> list[int]:
    """The physical GPU of every rank, from the GPUs a lease holds (at least gpus_needed of them)."""
    need = gpus_needed(world_size, ranks_per_gpu)
    if len(gpus) < need:
        raise ValueError(f"{world_size} ranks at {ranks_per_gpu} per GPU need {need} GPUs, got {gpus}")
    return [gpus[rank // ranks_per_gpu] for rank in range(world_size)]


def visible_devices(per_rank: list[int]) -> tuple[str, list[int]]:
    """CUDA_VISIBLE_DEVICES for every rank of the group (the distinct GPUs, in order of first use) and
    each rank's device index under it. A GPU named twice in CUDA_VISIBLE_DEVICES is not one device seen
    twice, so repeats are folded here rather than passed on."""
    distinct: list[int] = []
    for gpu in per_rank:
        if gpu not in distinct:
            distinct.append(gpu)
    return ",".join(map(str, distinct)), [distinct.index(gpu) for gpu in per_rank]


def eval_config_fields(ranks_per_gpu: int) -> dict[str, int]:
    """What EvalConfig gets for this mode: nothing in the ordinary one, so configs and their hashes (the
    reference-timing cache key) are unchanged there."""
    return {"ranks_per_gpu": ranks_per_gpu} if is_emulated(ranks_per_gpu) else {}
