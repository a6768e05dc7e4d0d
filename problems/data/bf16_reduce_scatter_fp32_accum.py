"""Reduce-scatter of a bf16 grad bucket, bf16 on the wire but fp32 accumulation (all-to-all + fp32 sum)."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "bf16_reduce_scatter_fp32_accum",
    "category": "data",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/distributed/reduce_scatter_with_fp32_accumulation.py",
        "symbol": "reduce_scatter_with_fp32_accumulation",
    },
    "summary": (
        "Megatron-Core DDP with the distributed optimizer, grad_reduce_in_fp32=False and "
        "reduce_scatter_with_fp32_accumulation=True: the bf16 grad bucket (one Llama-3-8B decoder "
        "layer, padded to a multiple of 128) is scaled by gradient_scaling_factor = 1/W in place, then "
        "reduce-scattered so that only bf16 crosses the wire but the W contributions are summed in fp32: "
        "an all_to_all_single of the bucket followed by a local fp32 sum over the W received chunks, "
        "downcast into this rank's bf16 shard. The tolerance is about one bf16 ulp, tight enough that "
        "accumulating in bf16 (a plain bf16 reduce-scatter) fails."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"numel": 218_112_000},
        "small": {"numel": 640},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-3, "rtol": 8e-3},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"numel": 960},
        "default": {"numel": 163584000},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    return (torch.randn(shape["numel"], generator=generator, device=device).to(torch.bfloat16),)


@torch.no_grad()
def solution(grad_bucket):
    world = dist.get_world_size()
    scaled = grad_bucket * (1.0 / world)  # gradient_scaling_factor, applied in bf16
    received = torch.empty_like(scaled)
    dist.all_to_all_single(received, scaled)
    return torch.sum(received.view(world, -1), dim=0, dtype=torch.float32).to(torch.bfloat16)


def oracle(shape, world_size, inputs_by_rank):
    total = sum(g.double() for (g,) in inputs_by_rank) / world_size
    return list(total.view(world_size, -1).to(torch.bfloat16).unbind(0))
