"""All-to-all from hidden-sharded [tokens, hidden/W] back to sequence-sharded [tokens/W, hidden]."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_to_all_hp2sp",
    "category": "tensor",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/mappings.py",
        "symbol": "all_to_all_hp2sp",
    },
    "summary": (
        "The inverse of all_to_all_sp2hp: Megatron's all_to_all_hp2sp takes an activation in "
        "hidden-parallel layout (each TP rank holds all tokens of hidden/W columns) back to "
        "sequence-parallel layout (tokens/W rows of all hidden columns), as after the experts of an MoE "
        "layer with expert tensor parallelism. One equal-split all-to-all sends row block j of the "
        "local [tokens, hidden/W] to rank j; the W received [tokens/W, hidden/W] blocks are then "
        "concatenated along columns in rank order. Pure data movement; compared exactly."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 8192, "hidden": 7168},
        "small": {"tokens": 16, "hidden": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48},
        "default": {"tokens": 6144, "hidden": 5376},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["tokens"], shape["hidden"] // world_size, generator=generator, device=device)
    return (x.to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    world_size = dist.get_world_size()
    received = torch.empty_like(x)
    dist.all_to_all_single(received, x.contiguous())
    return torch.cat(torch.split(received, x.shape[0] // world_size, dim=0), dim=-1)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inp[0] for inp in inputs_by_rank], dim=1)  # [tokens, hidden] in column order
    rows = shape["tokens"] // world_size
    return [full[r * rows : (r + 1) * rows].clone() for r in range(world_size)]
