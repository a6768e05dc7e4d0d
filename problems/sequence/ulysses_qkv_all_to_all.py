"""DeepSpeed-Ulysses pre-attention all-to-all: q, k, v go from sequence-sharded to head-sharded."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "ulysses_qkv_all_to_all",
    "category": "sequence",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/sequence/layer.py",
        "symbol": "_SeqAllToAll.forward -> single_all_to_all (scatter_idx=2, gather_idx=0, batch_dim_idx=1)",
    },
    "summary": (
        "DeepSpeed-Ulysses sequence parallelism, before the attention kernel: each rank holds q, k and v for "
        "its contiguous 1/W of the sequence and all heads, laid out [seq/W, batch, heads, head_dim]. Three "
        "all-to-alls (one per tensor, as DistributedAttention.forward issues them) scatter the heads and "
        "gather the sequence, so each rank ends with the full sequence for heads/W heads, "
        "[seq, batch, heads/W, head_dim]. Pure data movement: 3 x (W-1)/W of the local q/k/v bytes per rank."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"seq": 32768, "batch": 1, "heads": 32, "head_dim": 128},  # 3 x 256 MiB of q/k/v in all
        "small": {"seq": 32, "batch": 2, "heads": 8, "head_dim": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # a permutation: bit-exact
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
    # [s/W, b, h, d] -> [W, s/W, b, h/W, d]: slot i of the send buffer is head group i, bound for rank i
    send = x.reshape(s_local, b, world, h // world, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    # slot i now holds sequence block i of this rank's head group
    return recv.reshape(world * s_local, b, h // world, d)


@torch.no_grad()
def solution(q, k, v):
    world = dist.get_world_size()
    return tuple(_seq_to_heads(t, world) for t in (q, k, v))


def oracle(shape, world_size, inputs_by_rank):
    hl = shape["heads"] // world_size
    full = [torch.cat([inputs[i] for inputs in inputs_by_rank], dim=0) for i in range(3)]  # [s, b, h, d]
    return [tuple(t[:, :, r * hl:(r + 1) * hl].clone() for t in full) for r in range(world_size)]
