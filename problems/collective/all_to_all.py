"""Equal-split all-to-all of bf16 rows: chunk j of every rank's input goes to rank j."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_to_all",
    "category": "collective",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/mappings.py",
        "symbol": "_AllToAll",
    },
    "summary": (
        "Every rank holds [tokens, hidden] rows split into W equal chunks along dim 0; chunk j goes to "
        "rank j, and rank r's output is the chunks it received, ordered by source rank "
        "(all_to_all_single semantics). This is Megatron's _AllToAll with equal splits, the layout "
        "exchange used by MoE expert-parallel dispatch with fixed capacity and by Ulysses-style "
        "sequence/head re-sharding. Bandwidth bound at the default size. A pure copy: bit-exact."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192},  # 64 MiB per rank
        "small": {"tokens": 8, "hidden": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 96},
        "default": {"tokens": 3072, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["tokens"], shape["hidden"], generator=generator, device=device)
    return (x.to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous())
    return out


def oracle(shape, world_size, inputs_by_rank):
    chunks = [inputs[0].chunk(world_size, dim=0) for inputs in inputs_by_rank]  # chunks[src][dst]
    return [torch.cat([chunks[src][dst] for src in range(world_size)], dim=0) for dst in range(world_size)]
