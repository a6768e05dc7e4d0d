"""Broadcast of a packed bf16 weight buffer from rank 0 to every rank: the RL trainer-to-inference refit."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "broadcast",
    "category": "collective",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/utils/packed_tensor.py",
        "symbol": "packed_broadcast_producer",
    },
    "summary": (
        "Rank 0 holds a packed buffer of updated policy weights; every rank needs a copy. This is "
        "NeMo-RL's weight refit (packed_broadcast_producer on the trainer, packed_broadcast_consumer on "
        "the vLLM workers): parameters are concatenated into large contiguous buffers and each buffer is "
        "broadcast from src 0. Every rank passes a tensor of the same shape, but only rank 0's contents "
        "matter; rank 0 returns its own buffer. Bandwidth bound. A pure copy: bit-exact."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"rows": 8192, "cols": 8192},  # 128 MiB packed buffer
        "small": {"rows": 8, "cols": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"rows": 12, "cols": 96},
        "default": {"rows": 6144, "cols": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    # Non-root ranks get random contents too, so a kernel that skips the copy cannot pass by accident.
    w = torch.randn(shape["rows"], shape["cols"], generator=generator, device=device)
    return (w.to(torch.bfloat16),)


@torch.no_grad()
def solution(w):
    out = w.clone()
    dist.broadcast(out, src=0)
    return out


def oracle(shape, world_size, inputs_by_rank):
    root = inputs_by_rank[0][0]
    return [root.clone() for _ in range(world_size)]
