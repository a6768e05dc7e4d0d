"""FSDP2 foreach all-gather: cast padded fp32 shards to bf16 in one flat buffer, all-gather, copy out."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "fsdp2_all_gather_copy_in",
    "category": "fsdp_zero",
    "source": {
        "codebase": "PyTorch",
        "path": "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",
        "symbol": "foreach_all_gather / foreach_all_gather_copy_out",
    },
    "summary": (
        "FSDP2's parameter unshard for one FSDPParamGroup (a Llama-style decoder layer plus a 32001-row "
        "embedding) under MixedPrecisionPolicy(param_dtype=bfloat16). Each param is sharded on dim 0 "
        "with torch.chunk semantics (ceil(rows/W) rows per rank, trailing ranks get fewer), and every "
        "rank stores its shard padded to ceil(rows/W) rows (zero rows) in fp32. Copy-in casts all "
        "padded shards to bf16 into this rank's slot of one flat all-gather buffer (foreach copy), one "
        "all_gather_into_tensor fills the buffer, and copy-out splits it, viewed as [W, per-rank "
        "numel], into one [W, shard numel] tensor per param (split_with_sizes_copy on dim 1), which "
        "viewed as [W*ceil(rows/W), ...] and cut to the real row count is the unsharded bf16 param. "
        "Inputs: the padded fp32 shards and the unsharded shapes; outputs: the unsharded bf16 params."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"params": [[32001, 4096], [6144, 4096], [4096, 4096], [28672, 4096], [4096, 14336],
                               [4096], [4096]]},
        "small": {"params": [[37, 16], [24, 16], [16, 16], [64, 16], [16, 56], [16], [29]]},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"params": [[55, 16], [36, 16], [24, 16], [96, 16], [24, 56], [24], [43]]},
        "default": {
            "params": [[24000, 4096], [4608, 4096], [3072, 4096], [21504, 4096], [3072, 14336], [3072], [3072]],
        },
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    shards = []
    for s in shape["params"]:
        chunk = -(-s[0] // world_size)
        rows = max(0, min(chunk, s[0] - rank * chunk))
        shard = torch.zeros(chunk, *s[1:], device=device)  # FSDPParam pads its shard with zeros
        shard[:rows] = torch.randn(rows, *s[1:], generator=generator, device=device)
        shards.append(shard)
    return shards, [list(s) for s in shape["params"]]


@torch.no_grad()
def solution(padded_shards, param_shapes):
    world, rank = dist.get_world_size(), dist.get_rank()
    numels = [s.numel() for s in padded_shards]
    total = sum(numels)
    output = torch.empty(total * world, dtype=torch.bfloat16, device=padded_shards[0].device)
    my_slot = output.narrow(0, total * rank, total)
    torch._foreach_copy_(list(my_slot.split(numels)), [s.reshape(-1) for s in padded_shards])
    dist.all_gather_into_tensor(output, my_slot)
    per_param = [output.new_empty(world, n) for n in numels]
    torch.split_with_sizes_copy(output.view(world, total), numels, dim=1, out=per_param)
    return tuple(
        p.view(world * s.shape[0], *s.shape[1:])[: shp[0]]
        for p, s, shp in zip(per_param, padded_shards, param_shapes)
    )


def oracle(shape, world_size, inputs_by_rank):
    params = []
    for i, s in enumerate(shape["params"]):
        full = torch.cat([shards[i] for shards, _ in inputs_by_rank], dim=0)[: s[0]]
        params.append(full.to(torch.bfloat16))
    return [tuple(params)] * world_size
