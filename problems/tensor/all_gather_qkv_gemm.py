"""One sequence-parallel all-gather feeding the three column-parallel Q, K, V projections (GQA)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

PROBLEM = {
    "name": "all_gather_qkv_gemm",
    "category": "tensor",
    "source": {
        "codebase": "PyTorch",
        "path": "torch/distributed/_symmetric_memory/__init__.py",
        "symbol": "_fused_all_gather_matmul",
    },
    "summary": (
        "The attention input projections under sequence + tensor parallelism, as in torchtitan's Llama "
        "(separate wq, wk, wv, colwise-sharded by heads) with async TP, where the compiler rewrites one "
        "all-gather feeding three matmuls into torch.ops.symm_mem.fused_all_gather_matmul with a list of "
        "B matrices. Each rank holds a token shard x[tokens/W, hidden], gathers it once into [tokens, "
        "hidden] and multiplies by its head shards of Wq [q_heads*d/W, hidden] and Wk, Wv [kv_heads*d/W, "
        "hidden]. Default: Llama-3-70B (hidden 8192, 64 query heads, 8 KV heads, head dim 128), 4096 tokens."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192, "q_heads": 64, "kv_heads": 8, "head_dim": 128},
        "small": {"tokens": 16, "hidden": 64, "q_heads": 16, "kv_heads": 8, "head_dim": 8},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 96, "q_heads": 16, "kv_heads": 8, "head_dim": 8},
        "default": {"tokens": 3072, "hidden": 6144, "q_heads": 64, "kv_heads": 8, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    h, d = shape["hidden"], shape["head_dim"]
    x = torch.randn(shape["tokens"] // world_size, h, generator=generator, device=device)

    def weight(heads):
        w = torch.randn(heads * d // world_size, h, generator=generator, device=device) / h**0.5
        return w.to(torch.bfloat16)

    kv = shape["kv_heads"]
    return x.to(torch.bfloat16), weight(shape["q_heads"]), weight(kv), weight(kv)


@torch.no_grad()
def solution(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor):
    world = dist.get_world_size()
    total = torch.empty(x.shape[0] * world, x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(total, x.contiguous())
    return F.linear(total, wq), F.linear(total, wk), F.linear(total, wv)


def oracle(shape, world_size, inputs_by_rank):
    x = torch.cat([inp[0] for inp in inputs_by_rank], dim=0).double()
    return [tuple((x @ w.double().t()).to(torch.bfloat16) for w in inp[1:]) for inp in inputs_by_rank]
