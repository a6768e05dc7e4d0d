"""Scatter of a bf16 tensor from rank 0 along dim 0: rank r receives row chunk r of the root's tensor."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "scatter",
    "category": "collective",
    "source": {
        "codebase": "PyTorch",
        "path": "torch/distributed/tensor/_collective_utils.py",
        "symbol": "mesh_scatter",
    },
    "summary": (
        "Rank 0 holds a full [W*tokens, hidden] tensor; rank r needs rows [r*tokens, (r+1)*tokens). This "
        "is DTensor's mesh_scatter, which distribute_tensor / Shard._shard_tensor use to shard a tensor "
        "that lives on the source rank (src_data_rank=0) along dim 0, e.g. when sharding freshly "
        "loaded weights. Every rank passes a tensor of the full shape; only rank 0's contents matter. "
        "Bandwidth bound on the root's links. A pure copy: bit-exact."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 1024, "hidden": 8192},  # each rank receives 16 MiB
        "small": {"tokens": 8, "hidden": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 12, "hidden": 96},
        "default": {"tokens": 768, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    # Non-root inputs are random and ignored, so a kernel that reads its own copy fails.
    x = torch.randn(world_size * shape["tokens"], shape["hidden"], generator=generator, device=device)
    return (x.to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    world = dist.get_world_size()
    out = x.new_empty(x.shape[0] // world, *x.shape[1:])
    chunks = [c.contiguous() for c in x.chunk(world, dim=0)] if dist.get_rank() == 0 else None
    dist.scatter(out, scatter_list=chunks, src=0)
    return out


def oracle(shape, world_size, inputs_by_rank):
    root = inputs_by_rank[0][0]
    t = shape["tokens"]
    return [root[r * t:(r + 1) * t].clone() for r in range(world_size)]
