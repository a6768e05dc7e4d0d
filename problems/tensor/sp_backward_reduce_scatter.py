"""Sequence-parallel ColumnParallelLinear backward: all-gather x for wgrad, reduce-scatter the dgrad."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "sp_backward_reduce_scatter",
    "category": "tensor",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/layers.py",
        "symbol": "LinearWithGradAccumulationAndAsyncCommunication.backward",
    },
    "summary": (
        "Backward pass of a column-parallel linear layer with sequence parallelism (Megatron's "
        "sequence_parallel branch). Each TP rank holds grad_output [tokens, out/W], its sequence shard "
        "of the layer input x [tokens/W, in] and its weight shard [out/W, in]. The weight gradient "
        "grad_output^T @ x_full needs the all-gathered input (Megatron re-gathers it asynchronously "
        "behind the dgrad GEMM), and the partial input gradient grad_output @ w [tokens, in] is "
        "reduce-scattered along tokens (hidden behind the wgrad GEMM). Returns (grad_input_shard "
        "[tokens/W, in], grad_weight [out/W, in]). Shapes: Llama-70B MLP up-projection, 4096 tokens."
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
    x = torch.randn(tokens // world_size, k, generator=generator, device=device) / math.sqrt(tokens)
    w = torch.randn(n, k, generator=generator, device=device) / math.sqrt(shape["out_features"])
    return grad_output.to(torch.bfloat16), x.to(torch.bfloat16), w.to(torch.bfloat16)


@torch.no_grad()
def solution(grad_output, x, w):
    world_size = dist.get_world_size()
    total_input = x.new_empty(x.shape[0] * world_size, x.shape[1])
    gather = dist.all_gather_into_tensor(total_input, x.contiguous(), async_op=True)
    grad_input = grad_output @ w
    gather.wait()
    grad_input_shard = grad_input.new_empty(x.shape)
    scatter = dist.reduce_scatter_tensor(grad_input_shard, grad_input, op=dist.ReduceOp.SUM, async_op=True)
    grad_weight = grad_output.t() @ total_input
    scatter.wait()
    return grad_input_shard, grad_weight


def oracle(shape, world_size, inputs_by_rank):
    g_full = torch.cat([inp[0].double() for inp in inputs_by_rank], dim=1)  # [tokens, out]
    x_full = torch.cat([inp[1].double() for inp in inputs_by_rank], dim=0)  # [tokens, in]
    w_full = torch.cat([inp[2].double() for inp in inputs_by_rank], dim=0)  # [out, in]
    grad_input = g_full @ w_full
    rows = shape["tokens"] // world_size
    return [
        (
            grad_input[r * rows : (r + 1) * rows].to(torch.bfloat16),
            (inputs_by_rank[r][0].double().t() @ x_full).to(torch.bfloat16),
        )
        for r in range(world_size)
    ]
