"""Ring attention backward (causal): K/V rotate around the ring while the fp32 dK/dV accumulators travel
with them, arriving home after W hops."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "ring_attention_backward",
    "category": "context",
    "source": {
        "codebase": "ring-flash-attention (zhuzilin)",
        "path": "ring_flash_attn/ring_flash_attn.py",
        "symbol": "ring_flash_attn_backward",
    },
    "summary": (
        "Backward of causal ring attention with contiguous sequence blocks (rank r holds block r). Inputs "
        "per rank: q, k, v, the forward's out (bf16) and lse ([batch, heads, seq/W] fp32), and dout. Each "
        "of W steps posts send/recv of the K/V block in hand (to r+1, from r-1); when the block comes from "
        "rank j <= r it computes the flash-attention block gradients (causal on the diagonal step) from "
        "P = exp(QK^T*scale - lse) and D = rowsum(dout*out), adds dQ locally and adds dK/dV to the fp32 "
        "accumulators of that block, which were received from r-1; then it sends those accumulators on "
        "to r+1. After W hops each block's dK/dV is back on its owner. Returns dq, dk, dv bf16. Traffic "
        "per rank: (W-1) bf16 K/V blocks plus W fp32 dK/dV blocks."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 1, "seq": 16384, "heads": 32, "head_dim": 128},
        "small": {"batch": 2, "seq": 32, "heads": 4, "head_dim": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 2, "seq": 48, "heads": 4, "head_dim": 16},
        "default": {"batch": 1, "seq": 12288, "heads": 32, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    # out and lse must be the true forward of the global q, k, v: every rank draws the same global
    # tensors from a shared generator and keeps its own block.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    b, s, h, d = shape["batch"], shape["seq"], shape["heads"], shape["head_dim"]
    q, k, v, dout = (torch.randn(b, s, h, d, generator=shared, device=device).to(torch.bfloat16)
                     for _ in range(4))
    out = torch.empty(b, s, h, d, dtype=torch.bfloat16, device=device)
    lse = torch.empty(b, h, s, dtype=torch.float32, device=device)
    future = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
    for i in range(h):  # one head at a time keeps the fp32 scores of the default shape near 1 GiB
        scores = torch.einsum("bqd,bkd->bqk", q[:, :, i].float(), k[:, :, i].float()) / math.sqrt(d)
        scores = scores.masked_fill(future, float("-inf"))
        lse[:, i] = torch.logsumexp(scores, dim=-1)
        probs = torch.softmax(scores, dim=-1)
        out[:, :, i] = torch.einsum("bqk,bkd->bqd", probs, v[:, :, i].float()).to(out.dtype)
    n = s // world_size
    mine = slice(rank * n, (rank + 1) * n)
    return (q[:, mine].contiguous(), k[:, mine].contiguous(), v[:, mine].contiguous(),
            out[:, mine].contiguous(), lse[:, :, mine].contiguous(), dout[:, mine].contiguous())


def _block_grads(q, k, v, out, lse, dout, scale, causal):
    """fp32 flash-attention backward of one (q block, K/V block) pair: dq, dk, dv in [b, n, h, d].

    Heads go in groups so each fp32 [sq, sk] tile stays near 1 GiB."""
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    future = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1) if causal else None
    step = max(1, (1 << 28) // (b * sq * sk))
    dqs, dks, dvs = [], [], []
    for h0 in range(0, h, step):
        qh, kh, vh, oh, doh = (t[:, :, h0:h0 + step].transpose(1, 2).float() for t in (q, k, v, out, dout))
        s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(future, float("-inf"))
        p = torch.exp(s - lse[:, h0:h0 + step].unsqueeze(-1))
        dp = torch.matmul(doh, vh.transpose(-1, -2))
        ds = p * (dp - (doh * oh).sum(-1, keepdim=True))
        dqs.append(torch.matmul(ds, kh) * scale)
        dks.append(torch.matmul(ds.transpose(-1, -2), qh) * scale)
        dvs.append(torch.matmul(p.transpose(-1, -2), doh))
    return tuple(torch.cat(t, 1).transpose(1, 2).contiguous() for t in (dqs, dks, dvs))


def _ring_send_recv(tensors, rank, world):
    """Post send to rank+1 and receive from rank-1 for each tensor; return the receive buffers and the
    requests."""
    bufs = [torch.empty_like(t) for t in tensors]
    ops = []
    for t, buf in zip(tensors, bufs, strict=True):
        ops.append(dist.P2POp(dist.isend, t, (rank + 1) % world))
        ops.append(dist.P2POp(dist.irecv, buf, (rank - 1) % world))
    return bufs, dist.batch_isend_irecv(ops)


@torch.no_grad()
def solution(q, k, v, out, lse, dout):
    world, rank = dist.get_world_size(), dist.get_rank()
    scale = q.shape[-1] ** -0.5
    dq = dk = dv = next_dk = next_dv = None
    d_reqs = []
    for step in range(world):
        if step + 1 != world:
            (next_k, next_v), kv_reqs = _ring_send_recv((k, v), rank, world)
        if step <= rank:  # block of rank r-step: visible, causal only on the diagonal
            bq, bk, bv = _block_grads(q, k, v, out, lse, dout, scale, causal=step == 0)
            if step == 0:
                dq, dk, dv = bq, bk, bv
            else:
                dq = dq + bq
                for req in d_reqs:
                    req.wait()
                dk, dv = bk + next_dk, bv + next_dv
        else:  # block of a later rank: invisible, just forward its accumulators
            for req in d_reqs:
                req.wait()
            dk, dv = next_dk, next_dv
        if step + 1 != world:
            for req in kv_reqs:
                req.wait()
            k, v = next_k, next_v
        (next_dk, next_dv), d_reqs = _ring_send_recv((dk, dv), rank, world)
    for req in d_reqs:
        req.wait()
    return dq.to(q.dtype), next_dk.to(q.dtype), next_dv.to(q.dtype)


def oracle(shape, world_size, inputs_by_rank):
    q, k, v, dout = (torch.cat([inputs[i] for inputs in inputs_by_rank], dim=1).double()
                     for i in (0, 1, 2, 5))
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    s = q.shape[1]
    with torch.enable_grad():
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), dout)
    n = s // world_size
    return [tuple(g[:, r * n:(r + 1) * n].to(torch.bfloat16) for g in (dq, dk, dv))
            for r in range(world_size)]


def traffic(shape, world_size):
    """FLOPs of the causal backward alone: rank r's n queries see the r earlier blocks whole and their
    own block causally, n(n+1)/2 pairs; five products of 2 * head_dim FLOPs per pair and head (S, dP, dQ,
    dK, dV). The reference's diagonal block is computed dense and masked."""
    n = shape["seq"] // world_size
    per_pair = 10 * shape["batch"] * shape["heads"] * shape["head_dim"]
    return [{"flops": per_pair * (rank * n * n + n * (n + 1) // 2)} for rank in range(world_size)]
