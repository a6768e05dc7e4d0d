"""Megatron distributed-optimizer param sync: all-gather every bucket's bf16 shards into the param buffer."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "megatron_distopt_param_all_gather",
    "category": "data",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/distributed/param_and_grad_buffer.py",
        "symbol": "_ParamAndGradBucketGroup.start_param_sync",
    },
    "summary": (
        "After the distributed optimizer's step every rank has updated its contiguous 1/W shard of each "
        "bucket of the bf16 param buffer; start_param_sync all-gathers every bucket (one coalesced group "
        "of all_gather_into_tensor calls) so that each rank again holds the full buffer its model "
        "params are views into. Buffer layout as _ParamAndGradBuffer builds it for one Llama-3-8B "
        "decoder layer: params in reverse order at 64-element-aligned starts, 40M-element buckets whose "
        "ends are padded to lcm(W, 128) (padding is zero in Megatron, random here). Inputs: this rank's "
        "shard of every bucket; output: the full param buffer. Pure data movement, compared exactly."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"params": [[4096], [6144, 4096], [4096, 4096], [4096], [28672, 4096], [4096, 14336]],
                    "bucket_size": 40_000_000},
        # odd sizes so that CPU validation exercises the 64-element starts and lcm(W, 128) bucket ends
        "small": {"params": [[17], [51, 17], [17, 17], [17], [113, 17], [17, 57]], "bucket_size": 700},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
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
    # Padding slots are random too: a trailing shard may be all padding, and the gather copies it anyway.
    _, buckets = _layout(shape["params"], world_size, shape["bucket_size"])
    return tuple(
        torch.randn((end - start) // world_size, generator=generator, device=device).to(torch.bfloat16)
        for start, end in buckets
    )


@torch.no_grad()
def solution(*bucket_shards):
    world = dist.get_world_size()
    param_data = bucket_shards[0].new_empty(sum(s.numel() for s in bucket_shards) * world)
    offset = 0
    for shard in bucket_shards:
        bucket = param_data[offset:offset + shard.numel() * world]
        dist.all_gather_into_tensor(bucket, shard)
        offset += bucket.numel()
    return param_data


def oracle(shape, world_size, inputs_by_rank):
    buckets = [torch.cat([inputs[b] for inputs in inputs_by_rank]) for b in range(len(inputs_by_rank[0]))]
    return [torch.cat(buckets)] * world_size
