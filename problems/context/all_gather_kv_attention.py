"""Llama-3 style context parallelism: all-gather the (GQA) K/V of the load-balanced shards, then causal
attention of each local query chunk against the K/V prefix it may see."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_gather_kv_attention",
    "category": "context",
    "source": {
        "codebase": "TransformerEngine",
        "path": "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py",
        "symbol": "AttnFuncWithCPAndKVAllGather.forward (cp_comm_type='all_gather')",
    },
    "summary": (
        "Context parallelism by K/V all-gather (Llama 3 paper, section 3.3.2; Megatron/TE "
        "cp_comm_type='all_gather'), the forward pass. Rank r holds chunks r and 2W-1-r (of 2W) of q "
        "[batch, seq/W, heads, head_dim] and of the GQA k, v [batch, seq/W, kv_heads, head_dim]. K and V "
        "are all-gathered along the sequence and their 2W chunks reordered into natural order; then each "
        "of the two local query chunks runs causal attention (bottom-right aligned) against the K/V prefix "
        "ending with that chunk. GQA keeps the gathered K/V small (kv_heads/heads of q's size), which is "
        "why Llama 3 chose an all-gather over a ring. Returns out [batch, seq/W, heads, head_dim] bf16."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 1, "seq": 16384, "heads": 32, "kv_heads": 8, "head_dim": 128},  # Llama-3-8B
        "small": {"batch": 2, "seq": 32, "heads": 8, "kv_heads": 2, "head_dim": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-2, "rtol": 1e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 2, "seq": 48, "heads": 8, "kv_heads": 2, "head_dim": 16},
        "default": {"batch": 1, "seq": 12288, "heads": 32, "kv_heads": 8, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    b, n, d = shape["batch"], shape["seq"] // world_size, shape["head_dim"]
    q = torch.randn(b, n, shape["heads"], d, generator=generator, device=device)
    k = torch.randn(b, n, shape["kv_heads"], d, generator=generator, device=device)
    v = torch.randn(b, n, shape["kv_heads"], d, generator=generator, device=device)
    return tuple(t.to(torch.bfloat16) for t in (q, k, v))


def _prefix_attention(q, k, v, scale):
    """fp32 causal attention, diagonal at the bottom right: q [b, sq, h, d] is the last sq positions of
    k, v [b, sk, hkv, d]. Returns out [b, sq, h, d] fp32. Heads go in groups so the fp32 score tile stays
    near 1 GiB."""
    b, sq, h, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    future = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(sk - sq + 1)
    step = max(h // hkv, (1 << 28) // (b * sq * sk) // (h // hkv) * (h // hkv))
    outs = []
    for h0 in range(0, h, step):
        qh = q[:, :, h0:h0 + step].transpose(1, 2).float()
        kh, vh = (t[:, :, h0 * hkv // h:(h0 + step) * hkv // h].repeat_interleave(h // hkv, dim=2)
                  .transpose(1, 2).float() for t in (k, v))
        s = (torch.matmul(qh, kh.transpose(-1, -2)) * scale).masked_fill(future, float("-inf"))
        outs.append(torch.matmul(torch.softmax(s, dim=-1), vh))
    return torch.cat(outs, 1).transpose(1, 2)


@torch.no_grad()
def solution(q, k, v):
    world, rank = dist.get_world_size(), dist.get_rank()
    scale = q.shape[-1] ** -0.5
    b, n, hkv, d = k.shape
    half = n // 2
    gathered = []
    for t in (k, v):
        buf = torch.empty(world * b, n, hkv, d, dtype=t.dtype, device=t.device)
        dist.all_gather_into_tensor(buf, t.contiguous())
        # rank i's two halves are chunks i and 2W-1-i: put the 2W chunks in sequence order
        halves = buf.view(world, b, 2, half, hkv, d).permute(0, 2, 1, 3, 4, 5)
        halves = halves.reshape(2 * world, b, half, hkv, d)
        order = [2 * i for i in range(world)] + [2 * (world - 1 - i) + 1 for i in range(world)]
        gathered.append(halves[order].permute(1, 0, 2, 3, 4).reshape(b, 2 * world * half, hkv, d))
    k_all, v_all = gathered
    out = torch.empty_like(q)
    for i, chunk in enumerate((rank, 2 * world - 1 - rank)):
        end = (chunk + 1) * half
        out[:, i * half:(i + 1) * half] = _prefix_attention(
            q[:, i * half:(i + 1) * half], k_all[:, :end], v_all[:, :end], scale).to(q.dtype)
    return out


def oracle(shape, world_size, inputs_by_rank):
    seq, w = shape["seq"], world_size
    c = seq // (2 * w)
    pos = [torch.cat([torch.arange(r * c, (r + 1) * c), torch.arange((2 * w - 1 - r) * c, (2 * w - r) * c)])
           for r in range(w)]
    b, d, h, hkv = shape["batch"], shape["head_dim"], shape["heads"], shape["kv_heads"]
    q = torch.empty(b, seq, h, d, dtype=torch.float64)
    k = torch.empty(b, seq, hkv, d, dtype=torch.float64)
    v = torch.empty(b, seq, hkv, d, dtype=torch.float64)
    for r, inputs in enumerate(inputs_by_rank):
        for full, local in zip((q, k, v), inputs, strict=True):
            full[:, pos[r]] = local.double()
    k, v = (t.repeat_interleave(h // hkv, dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v).to(torch.bfloat16)
    return [out[:, pos[r]].clone() for r in range(w)]


def traffic(shape, world_size):
    """FLOPs of causal attention alone: chunk p of c tokens attends to the p earlier chunks whole and to
    itself causally, c(c+1)/2 pairs; this rank holds chunks r and 2W-1-r, 4 * head_dim FLOPs per pair and
    head. The reference's dense products also count the masked upper half of each diagonal block."""
    c = shape["seq"] // world_size // 2
    pairs = (2 * world_size - 1) * c * c + c * (c + 1)
    return {"flops": 4 * shape["batch"] * shape["heads"] * shape["head_dim"] * pairs}
