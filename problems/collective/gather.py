"""Gather of bf16 row blocks to rank 0: every rank's [tokens, hidden] rows concatenated on the root only."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "gather",
    "category": "collective",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/distributed/parallel_state.py",
        "symbol": "GroupCoordinator.gather",
    },
    "summary": (
        "Every rank holds a [tokens, hidden] block; rank 0 needs all of them concatenated along dim 0 in "
        "rank order ([W*tokens, hidden]), and no other rank needs anything. This is vLLM's "
        "GroupCoordinator.gather (torch.distributed.gather to dst, then torch.cat), which the driver "
        "uses to collect tensor-parallel shards such as logits. Output: rank 0 returns "
        "[W*tokens, hidden]; every other rank returns an empty [0, hidden] tensor (vLLM returns None "
        "there). Incast-bound on the root's links. A pure copy: bit-exact."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 1024, "hidden": 8192},  # 16 MiB per rank
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
    x = torch.randn(shape["tokens"], shape["hidden"], generator=generator, device=device)
    return (x.to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    x = x.contiguous()
    if dist.get_rank() == 0:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.gather(x, gather_list=parts, dst=0)
        return torch.cat(parts, dim=0)
    dist.gather(x, gather_list=None, dst=0)
    return x.new_empty(0, *x.shape[1:])


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=0)
    empty = full.new_empty(0, shape["hidden"])
    return [full] + [empty.clone() for _ in range(1, world_size)]
