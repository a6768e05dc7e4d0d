"""Column-parallel linear under sequence parallelism: all-gather the token-sharded input, then GEMM."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "sp_all_gather_gemm",
    "category": "tensor",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/layers.py",
        "symbol": "LinearWithGradAccumulationAndAsyncCommunication.forward",
    },
    "summary": (
        "Megatron's ColumnParallelLinear with sequence parallelism, e.g. the MLP up projection (linear_fc1, "
        "gate and up fused, Llama-3-70B 8192->2*28672): each rank holds a token shard of the activation, "
        "x[tokens/W, hidden], all-gathers it along tokens into [tokens, hidden], and multiplies by its "
        "weight shard w[out/W, hidden]^T, giving [tokens, out/W]. PyTorch's async-TP fused_all_gather_matmul "
        "(torch/distributed/_symmetric_memory/__init__.py) is the symmetric-memory version that starts "
        "GEMM tiles on the chunks already received while the rest of the gather is in flight."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192, "out_features": 57344},
        "qkv": {"tokens": 4096, "hidden": 8192, "out_features": 10240},
        "small": {"tokens": 16, "hidden": 64, "out_features": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 96, "out_features": 32},
        "default": {"tokens": 3072, "hidden": 6144, "out_features": 57344},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["tokens"] // world_size, shape["hidden"], generator=generator, device=device)
    w = torch.randn(shape["out_features"] // world_size, shape["hidden"], generator=generator, device=device)
    return x.to(torch.bfloat16), (w / shape["hidden"] ** 0.5).to(torch.bfloat16)


@torch.no_grad()
def solution(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    world = dist.get_world_size()
    total = torch.empty(x.shape[0] * world, x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(total, x.contiguous())
    return torch.matmul(total, w.t())


def oracle(shape, world_size, inputs_by_rank):
    x = torch.cat([inp[0] for inp in inputs_by_rank], dim=0).double()
    return [(x @ inp[1].double().t()).to(torch.bfloat16) for inp in inputs_by_rank]
