"""QK RMSNorm over the full (tensor-parallel sharded) q and k widths: all-reduce the fp32 statistics."""

import torch
import torch.distributed as dist

EPS = 1e-6

PROBLEM = {
    "name": "tp_qk_rmsnorm",
    "category": "tensor",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/model_executor/layers/mamba/linear_attn.py",
        "symbol": "MiniMaxText01RMSNormTP.forward_qk",
    },
    "summary": (
        "QK-norm of models that normalise q and k over their whole projection width rather than per head "
        "(MiniMax-M2: vLLM's MiniMaxM2Attention.forward calls MiniMaxText01RMSNormTP.forward_qk). Under "
        "tensor parallelism each rank holds a head shard q[tokens, q_heads*d/W], k[tokens, kv_heads*d/W] "
        "and the matching slices of the norm weights. Each rank computes per-token fp32 means of squares "
        "of its shards, the ranks all-reduce the [tokens, 2] statistics and divide by W, and each rank "
        "scales its shard by rsqrt(mean + eps) and its weight slice. vLLM replaces this with a Lamport "
        "one-shot fused all-reduce + RMSNorm kernel for up to 2048 tokens. Default: MiniMax-M2 attention "
        "(48 query heads, 8 KV heads, head dim 128)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 2048, "q_heads": 48, "kv_heads": 8, "head_dim": 128},
        "decode": {"tokens": 64, "q_heads": 48, "kv_heads": 8, "head_dim": 128},
        "small": {"tokens": 16, "q_heads": 16, "kv_heads": 8, "head_dim": 8},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-2, "rtol": 1e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "q_heads": 16, "kv_heads": 8, "head_dim": 8},
        "default": {"tokens": 1536, "q_heads": 48, "kv_heads": 8, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, d = shape["tokens"], shape["head_dim"]
    q_width = shape["q_heads"] * d // world_size
    k_width = shape["kv_heads"] * d // world_size
    q = torch.randn(t, q_width, generator=generator, device=device)
    k = torch.randn(t, k_width, generator=generator, device=device)
    q_weight = 1.0 + 0.25 * torch.randn(q_width, generator=generator, device=device)
    k_weight = 1.0 + 0.25 * torch.randn(k_width, generator=generator, device=device)
    return tuple(v.to(torch.bfloat16) for v in (q, k, q_weight, k_weight))


@torch.no_grad()
def solution(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor):
    q32, k32 = q.float(), k.float()
    var = torch.cat([q32.pow(2).mean(dim=-1, keepdim=True), k32.pow(2).mean(dim=-1, keepdim=True)], dim=-1)
    dist.all_reduce(var, op=dist.ReduceOp.SUM)
    var = var / dist.get_world_size()
    q_out = q32 * torch.rsqrt(var[:, :1] + EPS) * q_weight
    k_out = k32 * torch.rsqrt(var[:, 1:] + EPS) * k_weight
    return q_out.to(q.dtype), k_out.to(k.dtype)


def oracle(shape, world_size, inputs_by_rank):
    outs = []
    for i in (0, 1):  # q, then k: normalise the full width, then hand each rank its slice
        full = torch.cat([inp[i] for inp in inputs_by_rank], dim=1).double()
        weight = torch.cat([inp[i + 2] for inp in inputs_by_rank]).double()
        rms = full.square().mean(dim=1, keepdim=True).add(EPS).sqrt()
        outs.append((full / rms * weight).to(torch.bfloat16).chunk(world_size, dim=1))
    return [(outs[0][r], outs[1][r]) for r in range(world_size)]
