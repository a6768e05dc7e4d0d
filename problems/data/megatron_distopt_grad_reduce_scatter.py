"""Megatron distributed-optimizer grad sync: scale the grad buffer by 1/W, reduce-scatter each bucket."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "megatron_distopt_grad_reduce_scatter",
    "category": "data",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/distributed/param_and_grad_buffer.py",
        "symbol": "_ParamAndGradBucketGroup.start_grad_sync",
    },
    "summary": (
        "Gradient reduction of Megatron-Core DDP with use_distributed_optimizer=True and "
        "grad_reduce_in_fp32=True. The fp32 main-grad buffer of one Llama-3-8B decoder layer is laid out "
        "as _ParamAndGradBuffer does: params in reverse order, each starting at a multiple of 64 "
        "elements, a bucket closing once it holds bucket_size (40M) elements and its end padded to a "
        "multiple of lcm(W, 128); padding is zero. start_grad_sync multiplies every bucket by "
        "gradient_scaling_factor = 1/W and reduce-scatters it (SUM) into this rank's contiguous 1/W "
        "shard of the bucket (one coalesced group of reduce-scatters). Inputs: the rank's full grad "
        "buffer and the bucket bounds; output: this rank's shard of every bucket. A real layer's sizes are "
        "already multiples of 128, so only the small shape has padding gaps."
    ),
    "dtype": "float32",
    "shapes": {
        "default": {"params": [[4096], [6144, 4096], [4096, 4096], [4096], [28672, 4096], [4096, 14336]],
                    "bucket_size": 40_000_000},
        # odd sizes so that CPU validation exercises the 64-element starts and lcm(W, 128) bucket ends
        "small": {"params": [[17], [51, 17], [17, 17], [17], [113, 17], [17, 57]], "bucket_size": 700},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-5, "rtol": 1e-5},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"params": [[26], [77, 17], [26, 17], [26], [170, 17], [26, 57]], "bucket_size": 700},
        "default": {
            "params": [[3072], [4608, 4096], [3072, 4096], [3072], [21504, 4096], [3072, 14336]],
            "bucket_size": 40000000,
        },
    },
}


def _layout(param_shapes, world_size: int, bucket_size: int):
    """(param regions [(start, numel)], bucket bounds [(start, end)]) of _ParamAndGradBuffer.__init__."""
    pad = lambda n, d: -(-n // d) * d  # noqa: E731
    regions, buckets = [], []
    bucket_start = param_start = param_end = 0
    in_bucket = 0
    for shape in reversed(param_shapes):
        param_start = pad(param_start, 64)
        param_end = param_start + math.prod(shape)
        regions.append((param_start, math.prod(shape)))
        in_bucket += 1
        if param_end - bucket_start >= bucket_size:
            bucket_start = param_start = pad(param_end, math.lcm(world_size, 128))
            buckets.append((buckets[-1][1] if buckets else 0, bucket_start))
            in_bucket = 0
        else:
            param_start = param_end
    if in_bucket:
        buckets.append((bucket_start, pad(param_end, math.lcm(world_size, 128))))
    return regions, buckets


def make_inputs(shape, rank, world_size, generator, device):
    regions, buckets = _layout(shape["params"], world_size, shape["bucket_size"])
    grad_data = torch.zeros(buckets[-1][1], dtype=torch.float32, device=device)
    for start, numel in regions:
        grad_data[start:start + numel] = torch.randn(numel, generator=generator, device=device)
    return grad_data, [list(b) for b in buckets]


@torch.no_grad()
def solution(grad_data, bucket_bounds):
    world, rank = dist.get_world_size(), dist.get_rank()
    grad_data = grad_data.clone()
    shards = []
    for start, end in bucket_bounds:
        bucket = grad_data[start:end]
        bucket *= 1.0 / world  # gradient_scaling_factor
        local = bucket.chunk(world)[rank]
        dist.reduce_scatter_tensor(local, bucket, op=dist.ReduceOp.SUM)
        shards.append(local)
    return tuple(shards)


def oracle(shape, world_size, inputs_by_rank):
    mean = sum(grad_data.double() for grad_data, _ in inputs_by_rank) / world_size
    bounds = inputs_by_rank[0][1]
    return [tuple(mean[s:e].view(world_size, -1)[r].float() for s, e in bounds) for r in range(world_size)]
