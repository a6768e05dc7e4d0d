"""ZeRO++ qwZ: block-quantize fp16 ZeRO-3 partitions to int8, all-gather int8 + scales, dequantize."""

import math

import torch
import torch.distributed as dist

TARGET_GROUP_SIZE = 8000  # CUDAQuantizer.target_group_size

PROBLEM = {
    "name": "zeropp_int8_quantized_all_gather",
    "category": "fsdp_zero",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/runtime/zero/partition_parameters.py",
        "symbol": "all_gather_coalesced(quantize=True) / CUDAQuantizer / AllGatherCoalescedHandle.wait",
    },
    "summary": (
        "ZeRO++ quantized weight communication (qwZ, zero_quantized_weights=True) for one ZeRO-3 fetch "
        "of a Llama-style decoder layer plus a 32001-row embedding, fp16 params. Each rank concatenates "
        "its ds_tensor partitions (ceil(numel/W) each, zero-padded) and CUDAQuantizer.quantize splits "
        "that flat partition into `groups` equal blocks (its group-count search: start at "
        "ceil(n/8000), step up until n % (8*groups) == 0, double while n % (16*groups) == 0 and "
        "n/groups > 8000). Per block, symmetric 8-bit: s = 256 / (2*absmax) in fp32 (1 if absmax is "
        "0), q = clamp(round_half_even(x*s), -128, 127), and the stored scale is 1/s. The int8 blocks "
        "and the fp32 scales are all-gathered (two all_gather_into_tensor calls), dequantized as "
        "fp16(q * stored scale), and every param is stitched back from its slices of the W partitions. "
        "The oracle reproduces the quantization exactly, so the tolerance only admits fp16 rounding: "
        "the group sizes and rounding rule are part of the specification."
    ),
    "dtype": "float16",
    "shapes": {
        "default": {"params": [[32001, 4096], [6144, 4096], [4096, 4096], [28672, 4096], [4096, 14336],
                               [4096], [4096]]},
        # large enough for several quantization groups; partition sizes stay multiples of 8 for W = 2, 4, 8
        "small": {"params": [[37, 512], [24, 512], [64, 512], [16, 1792], [512], [63]]},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-5, "rtol": 1e-3},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"params": [[53, 512], [40, 512], [72, 512], [24, 1792], [768], [127]]},
        "default": {
            "params": [[24000, 4096], [4608, 4096], [3072, 4096], [21504, 4096], [3072, 14336], [3072], [3072]],
        },
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    ds_tensors = []
    for s in shape["params"]:
        numel = math.prod(s)
        part = -(-numel // world_size)
        valid = max(0, min(part, numel - rank * part))
        t = torch.zeros(part, dtype=torch.float16, device=device)
        t[:valid] = (0.02 * torch.randn(valid, generator=generator, device=device)).to(torch.float16)
        ds_tensors.append(t)
    return ds_tensors, shape["params"]


def _num_groups(numel: int) -> int:
    groups = math.ceil(numel / TARGET_GROUP_SIZE)
    while groups < numel and numel % (8 * groups) != 0:
        groups += 1
    while numel % (8 * groups * 2) == 0 and numel / groups > TARGET_GROUP_SIZE:
        groups *= 2
    return groups


@torch.no_grad()
def solution(ds_tensors, param_shapes):
    world = dist.get_world_size()
    flat = torch.cat(ds_tensors)
    groups = _num_groups(flat.numel())
    x = flat.float().view(groups, -1)
    absmax = x.abs().amax(dim=1, keepdim=True)
    q_scale = torch.where(absmax == 0, torch.ones_like(absmax), torch.full_like(absmax, 256.0) / (2 * absmax))
    quantized = torch.round(x * q_scale).clamp_(-128, 127).to(torch.int8).view(-1)
    stored_scale = torch.ones_like(q_scale) / q_scale

    all_q = quantized.new_empty(quantized.numel() * world)
    dist.all_gather_into_tensor(all_q, quantized)
    all_scales = stored_scale.new_empty(groups * world, 1)
    dist.all_gather_into_tensor(all_scales, stored_scale)
    partitions = (all_q.view(groups * world, -1).float() * all_scales).to(torch.float16).view(world, -1)

    params, offset = [], 0
    for t, shape in zip(ds_tensors, param_shapes):
        numel, part = math.prod(shape), t.numel()
        pieces = [partitions[r, offset:offset + min(numel - r * part, part)] for r in range(world)
                  if r * part < numel]
        params.append(torch.cat(pieces).view(shape))
        offset += part
    return tuple(params)


def _quantize_dequantize(partition: torch.Tensor) -> torch.Tensor:
    """The partition as receivers decode it, block by block (the quantizer kernel's fp32 arithmetic)."""
    blocks = partition.float().view(_num_groups(partition.numel()), -1)
    out = torch.empty_like(blocks)
    for g, block in enumerate(blocks):
        amax = block.abs().max()
        s = torch.tensor(1.0) if amax == 0 else torch.tensor(256.0) / (2 * amax)
        q = torch.clamp(torch.round(block * s), -128, 127)
        out[g] = q * (torch.tensor(1.0) / s)
    return out.view(-1).to(torch.float16)


def oracle(shape, world_size, inputs_by_rank):
    decoded = [_quantize_dequantize(torch.cat(ds_tensors)) for ds_tensors, _ in inputs_by_rank]
    params, offset = [], 0
    for s in shape["params"]:
        part = -(-math.prod(s) // world_size)
        flat = torch.cat([d[offset:offset + part] for d in decoded])
        params.append(flat[: math.prod(s)].reshape(s))
        offset += part
    return [tuple(params)] * world_size
