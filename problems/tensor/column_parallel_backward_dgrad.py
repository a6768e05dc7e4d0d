"""ColumnParallelLinear backward: dgrad all-reduced across TP, overlapped with the local wgrad GEMM."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "column_parallel_backward_dgrad",
    "category": "tensor",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/layers.py",
        "symbol": "LinearWithGradAccumulationAndAsyncCommunication.backward",
    },
    "summary": (
        "Backward pass of a column-parallel linear layer without sequence parallelism. Each TP rank "
        "holds grad_output for its slice of the output features [tokens, out/W], the replicated input "
        "x [tokens, in] and its weight shard [out/W, in]. The input gradient grad_output @ w is only a "
        "partial sum over the output features, so it is all-reduced across the TP group; Megatron "
        "launches that all-reduce asynchronously and hides it behind the weight-gradient GEMM "
        "grad_output^T @ x, which needs no communication. Returns (grad_input, grad_weight). Shapes: "
        "a Llama-70B MLP up-projection (8192 -> 28672) over 4096 tokens."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "in_features": 8192, "out_features": 28672},
        "small": {"tokens": 16, "in_features": 32, "out_features": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "in_features": 48, "out_features": 64},
        "default": {"tokens": 3072, "in_features": 6144, "out_features": 28672},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    tokens, k, n = shape["tokens"], shape["in_features"], shape["out_features"] // world_size
    grad_output = torch.randn(tokens, n, generator=generator, device=device)
    # Without sequence parallelism the layer input is replicated: every TP rank sees the same x.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    x = torch.randn(tokens, k, generator=shared, device=device) / math.sqrt(tokens)
    w = torch.randn(n, k, generator=generator, device=device) / math.sqrt(shape["out_features"])
    return grad_output.to(torch.bfloat16), x.to(torch.bfloat16), w.to(torch.bfloat16)


@torch.no_grad()
def solution(grad_output, x, w):
    grad_input = grad_output @ w
    handle = dist.all_reduce(grad_input, op=dist.ReduceOp.SUM, async_op=True)
    grad_weight = grad_output.t() @ x
    handle.wait()
    return grad_input, grad_weight


def oracle(shape, world_size, inputs_by_rank):
    g_full = torch.cat([inp[0].double() for inp in inputs_by_rank], dim=1)  # [tokens, out]
    w_full = torch.cat([inp[2].double() for inp in inputs_by_rank], dim=0)  # [out, in]
    grad_input = (g_full @ w_full).to(torch.bfloat16)
    return [
        (grad_input, (g.double().t() @ x.double()).to(torch.bfloat16)) for g, x, _ in inputs_by_rank
    ]
