"""Striped ring attention forward (causal): token i lives on rank i mod W, so every ring step carries an
(almost) equal causal workload."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "stripe_attention",
    "category": "context",
    "source": {
        "codebase": "ring-flash-attention (zhuzilin)",
        "path": "ring_flash_attn/stripe_flash_attn.py",
        "symbol": "stripe_flash_attn_forward",
    },
    "summary": (
        "Striped Attention (Brandon et al.), the causal ring variant that stripes tokens round-robin: rank "
        "r holds positions r, r+W, r+2W, ... of q, k, v, [batch, seq/W, heads, head_dim]. K/V rotate "
        "around the ring; at step s the block in hand comes from rank j = r-s mod W. When j <= r, local "
        "query i sees block key i' <= i (ordinary causal mask); when j > r it sees only i' < i, which the "
        "real code runs as causal attention of q[:, 1:] on k[:, :-1] and merges into rows 1.. only. "
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


def _causal_attention(q, k, v, scale):
    """fp32 causal attention of q [b, n, h, d] on k, v [b, n, h, d]: out [b, n, h, d], lse [b, h, n].

    Heads go in groups so the fp32 score tile stays near 1 GiB."""
    b, n, h, _ = q.shape
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    step = max(1, (1 << 28) // (b * n * n))
    outs, lses = [], []
    for h0 in range(0, h, step):
        qh, kh, vh = (t[:, :, h0:h0 + step].transpose(1, 2).float() for t in (q, k, v))
        s = (torch.matmul(qh, kh.transpose(-1, -2)) * scale).masked_fill(future, float("-inf"))
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
        if step <= rank:  # block from rank j <= r: key i' precedes query i iff i' <= i
            block = _causal_attention(q, k, v, scale)
            out, lse = block if out is None else _merge(out, lse, *block)
        else:  # block from rank j > r: strictly earlier, i' < i; query 0 sees nothing
            block = _causal_attention(q[:, 1:], k[:, :-1], v[:, :-1], scale)
            o1, l1 = _merge(out[:, 1:], lse[:, :, 1:], *block)
            out = torch.cat([out[:, :1], o1], dim=1)
            lse = torch.cat([lse[:, :, :1], l1], dim=2)
        if step + 1 != world:
            for req in reqs:
                req.wait()
            k, v = next_k, next_v
    return out.to(q.dtype), lse


def oracle(shape, world_size, inputs_by_rank):
    seq, w = shape["seq"], world_size
    q, k, v = (torch.empty(shape["batch"], seq, shape["heads"], shape["head_dim"], dtype=torch.float64)
               for _ in range(3))
    for r, inputs in enumerate(inputs_by_rank):
        for full, local in zip((q, k, v), inputs, strict=True):
            full[:, r::w] = local.double()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)
    return [(out[:, r::w].to(torch.bfloat16), lse[:, :, r::w].float()) for r in range(w)]


def traffic(shape, world_size):
    """FLOPs of causal attention alone: rank r holds positions i*W + r. Its query i sees i + 1 keys of
    every rank j <= r and i keys of every rank j > r, 4 * head_dim FLOPs per pair and head. The
    reference's blocks are computed dense and masked, about twice that."""
    n = shape["seq"] // world_size
    per_pair = 4 * shape["batch"] * shape["heads"] * shape["head_dim"]
    return [{"flops": per_pair * ((rank + 1) * n * (n + 1) // 2 + (world_size - 1 - rank) * n * (n - 1) // 2)}
            for rank in range(world_size)]
