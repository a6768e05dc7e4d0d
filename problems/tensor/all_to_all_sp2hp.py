"""All-to-all from sequence-sharded [tokens/W, hidden] to hidden-sharded [tokens, hidden/W]."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_to_all_sp2hp",
    "category": "tensor",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/mappings.py",
        "symbol": "all_to_all_sp2hp",
    },
    "summary": (
        "Megatron's all_to_all_sp2hp switches an activation from sequence-parallel layout (each TP "
        "rank holds tokens/W rows of all hidden columns) to hidden-parallel layout (each rank holds all "
        "tokens of hidden/W columns), as MoE layers with expert tensor parallelism do around the "
        "experts. The local shard is split into W column blocks, the blocks are stacked along rows and "
        "exchanged with one equal-split all-to-all: rank r receives column block r from every rank, in "
        "rank order, giving [tokens, hidden/W]. Pure data movement; the output is compared exactly "
        "(bf16 copies)."
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
    x = torch.randn(shape["tokens"] // world_size, shape["hidden"], generator=generator, device=device)
    return (x.to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    world_size = dist.get_world_size()
    send = torch.cat(torch.split(x, x.shape[-1] // world_size, dim=1), dim=0).contiguous()
    out = torch.empty_like(send)
    dist.all_to_all_single(out, send)
    return out


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inp[0] for inp in inputs_by_rank], dim=0)  # [tokens, hidden] in token order
    cols = shape["hidden"] // world_size
    return [full[:, r * cols : (r + 1) * cols].clone() for r in range(world_size)]
