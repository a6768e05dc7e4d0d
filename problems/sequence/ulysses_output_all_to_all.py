"""DeepSpeed-Ulysses post-attention all-to-all: the attention output goes from head-sharded back to
sequence-sharded."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "ulysses_output_all_to_all",
    "category": "sequence",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/sequence/layer.py",
        "symbol": "_SeqAllToAll.forward -> single_all_to_all (scatter_idx=0, gather_idx=2, batch_dim_idx=1)",
    },
    "summary": (
        "DeepSpeed-Ulysses sequence parallelism, after the attention kernel: each rank holds the context "
        "layer for the full sequence and its heads/W heads, [seq, batch, heads/W, head_dim]. One all-to-all "
        "(the 'o' call at the end of DistributedAttention.forward) scatters the sequence and gathers the "
        "heads, returning [seq/W, batch, heads, head_dim] for the output projection. Pure data movement: "
        "(W-1)/W of the local bytes per rank."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"seq": 32768, "batch": 1, "heads": 32, "head_dim": 128},  # 256 MiB / W per rank
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
    dims = (shape["seq"], shape["batch"], shape["heads"] // world_size, shape["head_dim"])
    return (torch.randn(dims, generator=generator, device=device).to(torch.bfloat16),)


@torch.no_grad()
def solution(ctx):
    world = dist.get_world_size()
    s, b, hl, d = ctx.shape
    # [s, b, h/W, d] viewed as [W, s/W, b, h/W, d]: slot i is sequence block i, bound for rank i
    send = ctx.reshape(world, s // world, b, hl, d).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    # slot i now holds head group i of this rank's sequence block
    return recv.permute(1, 2, 0, 3, 4).reshape(s // world, b, world * hl, d)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=2)  # [s, b, h, d]
    s_local = shape["seq"] // world_size
    return [full[r * s_local:(r + 1) * s_local].clone() for r in range(world_size)]
