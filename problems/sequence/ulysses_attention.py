"""DeepSpeed-Ulysses attention end to end: all-to-all q/k/v, causal attention per head group, all-to-all
back."""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

PROBLEM = {
    "name": "ulysses_attention",
    "category": "sequence",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/sequence/layer.py",
        "symbol": "DistributedAttention.forward",
    },
    "summary": (
        "A whole DeepSpeed-Ulysses attention layer (DistributedAttention.forward with a causal "
        "scaled_dot_product_attention as local_attn): q, k, v arrive sequence-sharded [seq/W, batch, heads, "
        "head_dim]; three all-to-alls make them head-sharded over the full sequence; each rank runs causal "
        "attention for its heads/W heads; one all-to-all returns the output to [seq/W, batch, heads, "
        "head_dim]. A fused kernel can overlap the all-to-alls with the attention of heads already received."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"seq": 32768, "batch": 1, "heads": 32, "head_dim": 128},
        "small": {"seq": 32, "batch": 2, "heads": 8, "head_dim": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"seq": 48, "batch": 2, "heads": 8, "head_dim": 16},
        "default": {"seq": 24576, "batch": 1, "heads": 32, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    dims = (shape["seq"] // world_size, shape["batch"], shape["heads"], shape["head_dim"])
    return tuple(
        torch.randn(dims, generator=generator, device=device).to(torch.bfloat16) for _ in range(3)
    )


def _seq_to_heads(x: torch.Tensor, world: int) -> torch.Tensor:
    s_local, b, h, d = x.shape
    send = x.reshape(s_local, b, world, h // world, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.reshape(world * s_local, b, h // world, d)


def _heads_to_seq(x: torch.Tensor, world: int) -> torch.Tensor:
    s, b, hl, d = x.shape
    send = x.reshape(world, s // world, b, hl, d).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 0, 3, 4).reshape(s // world, b, world * hl, d)


@torch.no_grad()
def solution(q, k, v):
    world = dist.get_world_size()
    q, k, v = (_seq_to_heads(t, world) for t in (q, k, v))  # [s, b, h/W, d]
    # SDPA wants [b, h, s, d]; flash/cuDNN kernels accumulate in fp32 and write bf16
    out = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True)
    return _heads_to_seq(out.permute(2, 0, 1, 3).contiguous(), world)


def oracle(shape, world_size, inputs_by_rank):
    q, k, v = (torch.cat([inputs[i] for inputs in inputs_by_rank], dim=0).double() for i in range(3))
    s = q.shape[0]
    scores = torch.einsum("qbhd,kbhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    out = torch.einsum("bhqk,kbhd->qbhd", probs, v).to(torch.bfloat16)  # [s, b, h, d]
    s_local = s // world_size
    return [out[r * s_local:(r + 1) * s_local].clone() for r in range(world_size)]


def traffic(shape, world_size):
    """FLOPs of causal attention alone: after the exchange a rank attends heads/W heads over the whole
    sequence, s(s+1)/2 pairs, 4 * head_dim FLOPs per pair and head (PyTorch's FLOP counter ignores
    is_causal on GPUs and counts nothing for the CPU kernel)."""
    s = shape["seq"]
    return {"flops": 4 * shape["batch"] * (shape["heads"] // world_size) * shape["head_dim"] * s * (s + 1) // 2}
