"""Decode-step row-parallel GEMV (a few tokens) followed by the TP all-reduce."""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

PROBLEM = {
    "name": "decode_gemv_all_reduce",
    "category": "tensor",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/model_executor/layers/linear.py",
        "symbol": "RowParallelLinear.forward",
    },
    "summary": (
        "vLLM's RowParallelLinear in a decode step: the Llama-70B MLP down-projection (28672 -> 8192) "
        "at batch 1-8. Each TP rank holds the input slice x [batch, 28672/W] and its weight shard "
        "[8192, 28672/W]; the local skinny GEMM gives a partial [batch, 8192] that is summed across "
        "ranks with tensor_model_parallel_all_reduce (vllm/distributed/communication_op.py). The GEMV "
        "is weight-bandwidth bound and the all-reduce (16-128 KiB) latency bound, which is why "
        "serving engines fuse or overlap them."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 8, "in_features": 28672, "out_features": 8192},
        "batch1": {"batch": 1, "in_features": 28672, "out_features": 8192},
        "small": {"batch": 4, "in_features": 64, "out_features": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 6, "in_features": 96, "out_features": 32},
        "default": {"batch": 6, "in_features": 21504, "out_features": 8192},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    k, n = shape["in_features"] // world_size, shape["out_features"]
    x = torch.randn(shape["batch"], k, generator=generator, device=device)
    w = torch.randn(n, k, generator=generator, device=device) / math.sqrt(shape["in_features"])
    return x.to(torch.bfloat16), w.to(torch.bfloat16)


@torch.no_grad()
def solution(x, w):
    out = F.linear(x, w)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def oracle(shape, world_size, inputs_by_rank):
    x_full = torch.cat([inp[0].double() for inp in inputs_by_rank], dim=1)
    w_full = torch.cat([inp[1].double() for inp in inputs_by_rank], dim=1)
    out = (x_full @ w_full.t()).to(torch.bfloat16)
    return [out for _ in range(world_size)]
