"""Zigzag ring attention forward (causal): each rank holds sequence chunks r and 2W-1-r, so every ring
step does the same amount of causal work."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "zigzag_ring_attention",
    "category": "context",
    "source": {
        "codebase": "ring-flash-attention (zhuzilin)",
        "path": "ring_flash_attn/zigzag_ring_flash_attn.py",
        "symbol": "zigzag_ring_flash_attn_forward",
    },
    "summary": (
        "Causal ring attention with the zigzag (load-balanced) layout used by Megatron CP and "
        "ring-flash-attention: the sequence is cut into 2W chunks and rank r holds chunks r and 2W-1-r of "
        "q, k, v, [batch, seq/W, heads, head_dim]. K/V rotate around the ring (send to r+1, receive from "
        "r-1). Step 0 is causal attention on the local pair; at step s <= r the arriving block comes from "
        "an earlier rank and both local query chunks see only its first chunk; at step s > r only the "
        "second local query chunk attends, to the whole block. Partial results merge by log-sum-exp. "
        "Returns out [batch, seq/W, heads, head_dim] bf16 and lse [batch, heads, seq/W] fp32."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 1, "seq": 16384, "heads": 32, "head_dim": 128},
        "small": {"batch": 2, "seq": 32, "heads": 4, "head_dim": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-2, "rtol": 1e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 2, "seq": 48, "heads": 4, "head_dim": 16},
        "default": {"batch": 1, "seq": 12288, "heads": 32, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    dims = (shape["batch"], shape["seq"] // world_size, shape["heads"], shape["head_dim"])
    return tuple(
        torch.randn(dims, generator=generator, device=device).to(torch.bfloat16) for _ in range(3)
    )


def _block_attention(q, k, v, scale, causal):
    """fp32 attention of q [b, sq, h, d] on k, v [b, sk, h, d]: out [b, sq, h, d], lse [b, h, sq].

    causal masks with the diagonal at the top-left (sq == sk here). Heads go in groups so the fp32 score
    tile stays near 1 GiB."""
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    future = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1) if causal else None
    step = max(1, (1 << 28) // (b * sq * sk))
    outs, lses = [], []
    for h0 in range(0, h, step):
        qh, kh, vh = (t[:, :, h0:h0 + step].transpose(1, 2).float() for t in (q, k, v))
        s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(future, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        outs.append(torch.matmul(torch.exp(s - lse.unsqueeze(-1)), vh))
        lses.append(lse)
    return torch.cat(outs, 1).transpose(1, 2), torch.cat(lses, 1)


def _merge(out, lse, block_out, block_lse):
    new_lse = torch.logaddexp(lse, block_lse)
    out = (out * torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1)
           + block_out * torch.exp(block_lse - new_lse).transpose(1, 2).unsqueeze(-1))
    return out, new_lse


@torch.no_grad()
def solution(q, k, v):
    world, rank = dist.get_world_size(), dist.get_rank()
    scale = q.shape[-1] ** -0.5
    half = q.shape[1] // 2
    out = lse = None
    for step in range(world):
        if step + 1 != world:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            reqs = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + 1) % world),
                dist.P2POp(dist.irecv, next_k, (rank - 1) % world),
                dist.P2POp(dist.isend, v, (rank + 1) % world),
                dist.P2POp(dist.irecv, next_v, (rank - 1) % world),
            ])
        if step == 0:
            out, lse = _block_attention(q, k, v, scale, causal=True)
        elif step <= rank:  # block from an earlier rank: its first chunk precedes both of ours
            out, lse = _merge(out, lse, *_block_attention(q, k[:, :half], v[:, :half], scale, causal=False))
        else:  # block from a later rank: only our second chunk comes after both of its chunks
            o2, l2 = _merge(out[:, half:], lse[:, :, half:],
                            *_block_attention(q[:, half:], k, v, scale, causal=False))
            out = torch.cat([out[:, :half], o2], dim=1)
            lse = torch.cat([lse[:, :, :half], l2], dim=2)
        if step + 1 != world:
            for req in reqs:
                req.wait()
            k, v = next_k, next_v
    return out.to(q.dtype), lse


def _positions(rank, world, seq):
    c = seq // (2 * world)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])


def oracle(shape, world_size, inputs_by_rank):
    seq = shape["seq"]
    pos = [_positions(r, world_size, seq) for r in range(world_size)]
    q, k, v = (torch.empty(shape["batch"], seq, shape["heads"], shape["head_dim"], dtype=torch.float64)
               for _ in range(3))
    for r, inputs in enumerate(inputs_by_rank):
        for full, local in zip((q, k, v), inputs, strict=True):
            full[:, pos[r]] = local.double()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)
    return [(out[:, pos[r]].to(torch.bfloat16), lse[:, :, pos[r]].float()) for r in range(world_size)]


def traffic(shape, world_size):
    """FLOPs of causal attention alone: chunk p of c tokens attends to the p earlier chunks whole and to
    itself causally, c(c+1)/2 pairs; this rank holds chunks r and 2W-1-r, 4 * head_dim FLOPs per pair and
    head. The reference's first step counts its whole local block, masked pairs included."""
    c = shape["seq"] // world_size // 2
    pairs = (2 * world_size - 1) * c * c + c * (c + 1)
    return {"flops": 4 * shape["batch"] * shape["heads"] * shape["head_dim"] * pairs}
