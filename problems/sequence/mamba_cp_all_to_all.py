"""Megatron Mamba context parallel, before conv1d + SSM: five all-to-alls turn sequence sharding into
channel (head) sharding, then undo the attention load-balancing order."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "mamba_cp_all_to_all",
    "category": "sequence",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/ssm/mamba_context_parallel.py",
        "symbol": "MambaContextParallel.pre_conv_ssm (_all_to_all_cp2hp, _undo_attention_load_balancing)",
    },
    "summary": (
        "In a hybrid Mamba/attention model trained with context parallelism, the Mamba mixer's in_proj "
        "output [seq/W, batch, 2*d_inner + 2*ngroups*d_state + nheads] is sharded along the sequence in "
        "Megatron's load-balanced layout (rank r holds chunks r and 2W-1-r of 2W). The conv1d and the SSM "
        "scan need the whole sequence, so pre_conv_ssm splits it into z, x, B, C, dt, replicates the B/C "
        "group states when ngroups < W, runs one all-to-all per piece (sequence gathered, channels "
        "scattered: [seq/W, b, h] -> [seq, b, h/W]), concatenates, and reorders the 2W chunks back to "
        "natural sequence order. The ints are the layer's static sizes. Pure data movement."
    ),
    "dtype": "bfloat16",
    "shapes": {
        # Nemotron-H-8B-like mixer: d_model 4096, expand 2, headdim 64, 8 groups, d_state 128
        "default": {"seq": 8192, "batch": 1, "d_inner": 8192, "nheads": 128, "ngroups": 8, "d_state": 128},
        "small": {"seq": 32, "batch": 2, "d_inner": 64, "nheads": 8, "ngroups": 2, "d_state": 8},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # a permutation: bit-exact
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"seq": 48, "batch": 2, "d_inner": 96, "nheads": 8, "ngroups": 2, "d_state": 8},
        "default": {"seq": 6144, "batch": 1, "d_inner": 6144, "nheads": 128, "ngroups": 8, "d_state": 128},
    },
}


def _width(shape) -> int:
    return 2 * shape["d_inner"] + 2 * shape["ngroups"] * shape["d_state"] + shape["nheads"]


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["seq"] // world_size, shape["batch"], _width(shape), generator=generator,
                    device=device).to(torch.bfloat16)
    return (x, shape["d_inner"], shape["nheads"], shape["ngroups"], shape["d_state"])


def _cp2hp(t: torch.Tensor, world: int) -> torch.Tensor:
    s, b, h = t.shape
    # channel block i of every (token, batch) row goes to rank i; blocks stacked along dim 0
    send = torch.cat(torch.split(t.reshape(s * b, h), h // world, dim=1), dim=0)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.reshape(world * s, b, h // world)


@torch.no_grad()
def solution(xin, d_inner, nheads, ngroups, d_state):
    world = dist.get_world_size()
    z, x, B, C, dt = torch.split(xin, [d_inner, d_inner, ngroups * d_state, ngroups * d_state, nheads], -1)
    repeat = world // ngroups if ngroups < world else 1
    if repeat > 1:
        # replicas of one group state land on consecutive ranks, next to that group's heads
        s, b, _ = B.shape
        B, C = (t.reshape(s, b, ngroups, 1, d_state).expand(s, b, ngroups, repeat, d_state)
                .reshape(s, b, ngroups * repeat * d_state) for t in (B, C))
    out = torch.cat([_cp2hp(t, world) for t in (z, x, B, C, dt)], dim=-1)
    # gathered order is r0c0, r0c(2W-1), r1c1, ...: pick chunks back into 0, 1, ..., 2W-1
    chunks = torch.chunk(out, 2 * world, dim=0)
    order = [2 * i for i in range(world)] + [2 * world - 2 * i - 1 for i in range(world)]
    return torch.cat([chunks[i] for i in order], dim=0)


def oracle(shape, world_size, inputs_by_rank):
    w = world_size
    seq, d_inner, nheads, ngroups, d_state = (shape[k] for k in ("seq", "d_inner", "nheads", "ngroups",
                                                                  "d_state"))
    c = seq // (2 * w)
    full = torch.empty(seq, shape["batch"], _width(shape), dtype=torch.bfloat16)
    for r, inputs in enumerate(inputs_by_rank):  # rank r holds chunks r and 2W-1-r
        full[r * c:(r + 1) * c] = inputs[0][:c]
        full[(2 * w - 1 - r) * c:(2 * w - r) * c] = inputs[0][c:]
    z, x, B, C, dt = torch.split(full, [d_inner, d_inner, ngroups * d_state, ngroups * d_state, nheads], -1)
    if ngroups < w:  # group g's state is needed by the W/ngroups ranks that own its heads
        B, C = (t.unflatten(-1, (ngroups, d_state)).repeat_interleave(w // ngroups, dim=2).flatten(-2)
                for t in (B, C))
    pieces = (z, x, B, C, dt)
    return [torch.cat([p.tensor_split(w, dim=-1)[r] for p in pieces], dim=-1) for r in range(w)]
