"""Async-TP all-gather + matmul: gather a sequence-sharded activation and multiply by gate and up shards."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "async_tp_all_gather_matmul",
    "category": "tensor",
    "source": {
        "codebase": "PyTorch",
        "path": "torch/distributed/_symmetric_memory/__init__.py",
        "symbol": "_fused_all_gather_matmul",
    },
    "summary": (
        "PyTorch async tensor parallelism (torch.ops.symm_mem.fused_all_gather_matmul, which "
        "torchtitan turns on with maybe_enable_async_tp in torchtitan/distributed/tensor_parallel.py): "
        "the inductor micro-pipeline pass replaces all_gather_into_tensor(A_shard) followed by matmuls "
        "of the gathered A with a fused op that overlaps the gather with the GEMMs chunk by chunk. "
        "Here A is the sequence-parallel input of a SwiGLU MLP [tokens/W, hidden] and the matmuls are "
        "the column-parallel gate and up projections, weights [ffn/W, hidden] (nn.Linear layout). "
        "Returns (A_gathered [tokens, hidden], gate [tokens, ffn/W], up [tokens, ffn/W]): the op's "
        "default return_A=True, since in training the gathered input is saved for the weight gradient. "
        "Shapes: Llama-70B (8192 -> 2 x 28672), 4096 tokens."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192, "ffn": 28672},
        "small": {"tokens": 16, "hidden": 32, "ffn": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "ffn": 64},
        "default": {"tokens": 3072, "hidden": 6144, "ffn": 28672},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    h, n = shape["hidden"], shape["ffn"] // world_size
    a = torch.randn(shape["tokens"] // world_size, h, generator=generator, device=device)
    w_gate = torch.randn(n, h, generator=generator, device=device) / math.sqrt(h)
    w_up = torch.randn(n, h, generator=generator, device=device) / math.sqrt(h)
    return a.to(torch.bfloat16), w_gate.to(torch.bfloat16), w_up.to(torch.bfloat16)


@torch.no_grad()
def solution(a_shard, w_gate, w_up):
    world_size = dist.get_world_size()
    a = a_shard.new_empty(a_shard.shape[0] * world_size, a_shard.shape[1])
    dist.all_gather_into_tensor(a, a_shard.contiguous())
    return a, a @ w_gate.t(), a @ w_up.t()


def oracle(shape, world_size, inputs_by_rank):
    a = torch.cat([inp[0] for inp in inputs_by_rank], dim=0)
    a64 = a.double()
    return [
        (a.clone(), (a64 @ wg.double().t()).to(torch.bfloat16), (a64 @ wu.double().t()).to(torch.bfloat16))
        for _, wg, wu in inputs_by_rank
    ]
