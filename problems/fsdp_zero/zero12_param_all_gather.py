"""ZeRO-1/2 param sync after the step: cast fp32 partitions to bf16 and all-gather each flat param group."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "zero12_param_all_gather",
    "category": "fsdp_zero",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/runtime/utils.py",
        "symbol": "all_gather_into_tensor_dp_groups (via DeepSpeedZeroOptimizer.step)",
    },
    "summary": (
        "End of a ZeRO-1/2 optimizer step (stage_1_and_2.py step): each rank has updated its fp32 "
        "partition of every param group, copies it into its bf16 partition of the group's flat bf16 "
        "buffer (bit16_partitions[partition_id].data.copy_(fp32_partition)), and all_gather_dp_groups "
        "issues one all_gather_into_tensor per group to rebuild the flat buffers the model's bf16 "
        "params are views into. Two param groups (weight-decay: the matrices of a Llama-style decoder "
        "layer plus a 32001-row embedding; no-decay: the norm weights); each flat group is padded to a "
        "multiple of 2W, so the W partitions are equal and the last one ends in zero padding. Outputs: "
        "every param in bf16, group by group."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"groups": [[[32001, 4096], [6144, 4096], [4096, 4096], [28672, 4096], [4096, 14336]],
                               [[4096], [4096]]]},
        "small": {"groups": [[[37, 16], [24, 16], [16, 16], [64, 16], [16, 56]], [[16], [29]]]},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"groups": [[[55, 16], [36, 16], [24, 16], [96, 16], [24, 56]], [[18], [29]]]},
        "default": {
            "groups": [[[24000, 4096], [4608, 4096], [3072, 4096], [21504, 4096], [3072, 14336]], [[3072], [3072]]],
        },
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    partitions = []
    for shapes in shape["groups"]:
        total = sum(math.prod(s) for s in shapes)
        part = -(-total // (2 * world_size)) * 2  # aligned to nccl_start_alignment_factor (2) * W
        valid = max(0, min(part, total - rank * part))
        p = torch.zeros(part, device=device)
        p[:valid] = torch.randn(valid, generator=generator, device=device) * 0.02
        partitions.append(p)
    return partitions, shape["groups"]


@torch.no_grad()
def solution(fp32_partitions, group_shapes):
    world, rank = dist.get_world_size(), dist.get_rank()
    params = []
    for partition, shapes in zip(fp32_partitions, group_shapes):
        flat = torch.empty(partition.numel() * world, dtype=torch.bfloat16, device=partition.device)
        mine = flat.narrow(0, partition.numel() * rank, partition.numel())
        mine.copy_(partition)
        dist.all_gather_into_tensor(flat, mine)
        numels = [math.prod(s) for s in shapes]
        views = flat[: sum(numels)].split(numels)
        params.extend(v.view(s) for v, s in zip(views, shapes))
    return tuple(params)


def oracle(shape, world_size, inputs_by_rank):
    params = []
    for g, shapes in enumerate(shape["groups"]):
        flat = torch.cat([partitions[g] for partitions, _ in inputs_by_rank]).to(torch.bfloat16)
        offset = 0
        for s in shapes:
            params.append(flat[offset:offset + math.prod(s)].reshape(s))
            offset += math.prod(s)
    return [tuple(params)] * world_size
