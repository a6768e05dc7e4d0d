"""Global grad-norm clipping over FSDP/ZeRO-sharded fp32 grads: local sum of squares, all-reduce, scale."""

import math

import torch
import torch.distributed as dist

MAX_NORM = 1.0  # Megatron --clip-grad default

PROBLEM = {
    "name": "grad_norm_clip_all_reduce",
    "category": "data",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/optimizer/clip_grads.py",
        "symbol": "get_grad_norm_fp32 + clip_grad_by_total_norm_fp32",
    },
    "summary": (
        "Gradient clipping by global L2 norm when every rank holds a disjoint shard of the fp32 main "
        "grads (Megatron distributed optimizer / FSDP2 DTensor grads with torch.nn.utils.clip_grad_norm_). "
        "Each rank computes the squared L2 norm of its shards in fp32 (multi_tensor_l2norm, then "
        "**2), sum-all-reduces that one scalar, takes the square root, and scales its shards by "
        "min(1, max_norm / (total_norm + 1e-6)) (the Transformer Engine path: clip_coeff stays a device "
        "tensor, clamp_max(1), multi_tensor_scale_tensor). Shards here are FSDP2 dim-0 chunks of one "
        "Llama-style decoder layer plus a 32001-row embedding (uneven across ranks). Returns the "
        "clipped shards and the total norm (shape [1]). Latency bound on the 4-byte all-reduce, "
        "bandwidth bound on the two passes over the shards."
    ),
    "dtype": "float32",
    "shapes": {
        "default": {"params": [[32001, 4096], [6144, 4096], [4096, 4096], [28672, 4096], [4096, 14336],
                               [4096], [4096]]},
        "small": {"params": [[37, 16], [24, 16], [16, 16], [64, 16], [16, 56], [16], [29]]},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-8, "rtol": 1e-4},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"params": [[56, 16], [37, 16], [25, 16], [97, 16], [25, 56], [25], [44]]},
        "default": {
            "params": [[24000, 4096], [4608, 4096], [3072, 4096], [21504, 4096], [3072, 14336], [3072], [3072]],
        },
    },
}


def _shard_rows(dim0: int, rank: int, world_size: int) -> int:
    chunk = -(-dim0 // world_size)  # torch.chunk: ceil-sized chunks, trailing ranks may get fewer rows
    return max(0, min(chunk, dim0 - rank * chunk))


def make_inputs(shape, rank, world_size, generator, device):
    # All ranks draw the same scale so that the global norm lands near MAX_NORM (clipped about half the time).
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    ratio = 0.5 + 1.5 * torch.rand(1, generator=shared, device=device).item()
    total = sum(math.prod(s) for s in shape["params"])
    std = ratio / math.sqrt(total)
    return tuple(
        torch.randn(_shard_rows(s[0], rank, world_size), *s[1:], generator=generator, device=device) * std
        for s in shape["params"]
    )


@torch.no_grad()
def solution(*grads):
    local_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(grads))))
    total_norm = (local_norm**2).reshape(1)
    dist.all_reduce(total_norm, op=dist.ReduceOp.SUM)
    total_norm = total_norm.pow(0.5)
    clip_coeff = (MAX_NORM / (total_norm + 1.0e-6)).clamp_max(1.0)
    return (*torch._foreach_mul(list(grads), clip_coeff.squeeze(0)), total_norm)


def oracle(shape, world_size, inputs_by_rank):
    sq = sum(float(g.double().pow(2).sum()) for inputs in inputs_by_rank for g in inputs)
    total_norm = math.sqrt(sq)
    coeff = min(1.0, MAX_NORM / (total_norm + 1.0e-6))
    norm_t = torch.tensor([total_norm], dtype=torch.float32)
    return [tuple(g.double().mul(coeff).float() for g in inputs) + (norm_t,) for inputs in inputs_by_rank]


def traffic(shape, world_size):
    """HBM: the gradients are read twice (the norm, then the scaling, which must wait for the global
    norm) and written once; inputs plus outputs would count one read."""
    out = []
    for rank in range(world_size):
        numel = sum(_shard_rows(s[0], rank, world_size) * math.prod(s[1:]) for s in shape["params"])
        out.append({"hbm_bytes": 3 * numel * 4 + 4})  # fp32, plus the norm
    return out
