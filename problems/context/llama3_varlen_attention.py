"""Llama-3 style context parallelism for packed variable-length documents: all-gather K/V a few KV heads at
a time, then document-causal varlen attention of the local tokens."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "llama3_varlen_attention",
    "category": "context",
    "source": {
        "codebase": "ring-flash-attention (zhuzilin)",
        "path": "ring_flash_attn/llama3_flash_attn_varlen.py",
        "symbol": "llama3_flash_attn_varlen_forward (with llama3_flash_attn_prepare_cu_seqlens)",
    },
    "summary": (
        "Context parallelism for sequence-packed training (thd layout): a packed stream of documents, "
        "boundaries in cu_seqlens (random here, identical on every rank), is split contiguously, rank r "
        "holding tokens [r*T/W, (r+1)*T/W) of q [T/W, heads, head_dim] and GQA k, v [T/W, kv_heads, "
        "head_dim]. For each group of heads_k_stride KV heads, k and v are all-gathered "
        "(all_gather_into_tensor) and sliced to local_k_slice, the tokens from the start of the first "
        "document this rank touches up to its last token; the matching query heads then run causal varlen "
        "attention per document (diagonal bottom-right aligned: a document that starts on an earlier rank "
        "sees its earlier tokens). Strided gathering bounds the gather buffer and lets the next gather "
        "overlap this group's attention. Returns out [T/W, heads, head_dim] bf16 and lse [heads, T/W] "
        "fp32. The cu_seqlens bookkeeping, done once per batch in the real code, is part of the call here."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 16384, "docs": 8, "heads": 32, "kv_heads": 8, "head_dim": 128,
                    "heads_k_stride": 4},
        "small": {"tokens": 64, "docs": 4, "heads": 8, "kv_heads": 2, "head_dim": 16, "heads_k_stride": 1},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-2, "rtol": 1e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 96, "docs": 4, "heads": 8, "kv_heads": 2, "head_dim": 16, "heads_k_stride": 1},
        "default": {"tokens": 12288, "docs": 8, "heads": 32, "kv_heads": 8, "head_dim": 128, "heads_k_stride": 4},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    n, d = shape["tokens"] // world_size, shape["head_dim"]
    q = torch.randn(n, shape["heads"], d, generator=generator, device=device)
    k = torch.randn(n, shape["kv_heads"], d, generator=generator, device=device)
    v = torch.randn(n, shape["kv_heads"], d, generator=generator, device=device)
    # document boundaries are batch metadata every rank agrees on
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    cuts = torch.randperm(shape["tokens"] - 1, generator=shared, device=device)[:shape["docs"] - 1] + 1
    zero = torch.zeros(1, dtype=torch.long, device=device)
    total = torch.full((1,), shape["tokens"], dtype=torch.long, device=device)
    cu_seqlens = torch.cat([zero, cuts.sort().values, total]).to(torch.int32)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    return q, k, v, cu_seqlens, shape["heads_k_stride"]


def _prepare_cu_seqlens(cu_seqlens, rank, world):
    """llama3_flash_attn_prepare_cu_seqlens for causal attention."""
    n = int(cu_seqlens[-1]) // world
    left = int(torch.searchsorted(cu_seqlens, rank * n))
    right = int(torch.searchsorted(cu_seqlens, (rank + 1) * n))
    if int(cu_seqlens[left]) != rank * n:
        left -= 1
    cu_q = cu_seqlens[left:right + 1].clone().long() - rank * n
    cu_q[0], cu_q[-1] = 0, n
    cu_k = cu_seqlens[left:right + 1].clone().long()
    cu_k[-1] = (rank + 1) * n
    k_start = int(cu_k[0])
    return cu_q.tolist(), (cu_k - k_start).tolist(), slice(k_start, (rank + 1) * n)


def _varlen_causal(q, k, v, cu_q, cu_k, scale):
    """fp32 causal attention per document, diagonal bottom-right aligned. q [tq, hq, d], k/v [tk, hk, d].
    Returns out [tq, hq, d] fp32 and lse [hq, tq] fp32. Heads go in groups so the fp32 score tile stays
    near 1 GiB."""
    hq = q.shape[1]
    group = hq // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(hq, q.shape[0], dtype=torch.float32, device=q.device)
    for i in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        lq, lk = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        future = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(lk - lq + 1)
        qi = q[qs].float().transpose(0, 1)  # [hq, lq, d]
        ki, vi = (t[ks].float().repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
        step = max(1, (1 << 28) // (lq * lk))
        for h0 in range(0, hq, step):
            hs = slice(h0, h0 + step)
            s = (torch.matmul(qi[hs], ki[hs].transpose(-1, -2)) * scale).masked_fill(future, float("-inf"))
            lse[hs, qs] = torch.logsumexp(s, dim=-1)
            out[qs, hs] = torch.matmul(torch.exp(s - lse[hs, qs, None]), vi[hs]).transpose(0, 1)
    return out, lse


@torch.no_grad()
def solution(q, k, v, cu_seqlens, heads_k_stride):
    world, rank = dist.get_world_size(), dist.get_rank()
    cu_q, cu_k, k_slice = _prepare_cu_seqlens(cu_seqlens, rank, world)
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    scale = d ** -0.5
    kv_buffer = torch.empty(2, n * world, heads_k_stride, d, dtype=k.dtype, device=k.device)
    outs, lses = [], []
    for i in range(0, kv_heads, heads_k_stride):
        dist.all_gather_into_tensor(kv_buffer[0], k[:, i:i + heads_k_stride].contiguous())
        dist.all_gather_into_tensor(kv_buffer[1], v[:, i:i + heads_k_stride].contiguous())
        q_i = q[:, i * heads // kv_heads:(i + heads_k_stride) * heads // kv_heads]
        out, lse = _varlen_causal(q_i, kv_buffer[0][k_slice], kv_buffer[1][k_slice], cu_q, cu_k, scale)
        outs.append(out.to(q.dtype))
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=0)


def oracle(shape, world_size, inputs_by_rank):
    q, k, v = (torch.cat([inputs[i] for inputs in inputs_by_rank], dim=0).double() for i in range(3))
    cu = inputs_by_rank[0][3].tolist()
    t, h, d = q.shape
    k, v = (x.repeat_interleave(h // shape["kv_heads"], dim=1) for x in (k, v))
    doc = torch.bucketize(torch.arange(t), torch.tensor(cu[1:-1]), right=True)  # document id of each token
    allowed = (doc[:, None] == doc[None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [h, t]
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
    n = t // world_size
    return [(out[r * n:(r + 1) * n].to(torch.bfloat16), lse[:, r * n:(r + 1) * n].float())
            for r in range(world_size)]


def traffic(shape, world_size):
    """Causal attention within documents: rank r's queries need K and V only from the start of the
    document holding its first token up to its own tokens, not every rank's, and each query attends to
    the earlier tokens of its document only. Pairs and K/V rows averaged over 8 draws of document cuts
    distributed like make_inputs'; 4 * head_dim FLOPs per pair and query head."""
    total, n = shape["tokens"], shape["tokens"] // world_size
    gen = torch.Generator().manual_seed(0)
    draws = 8
    pairs, needed, given = [0.0] * world_size, [0.0] * world_size, [0.0] * world_size
    for _ in range(draws):
        cuts = torch.randperm(total - 1, generator=gen)[: shape["docs"] - 1] + 1
        bounds = [0, *sorted(cuts.tolist()), total]
        for rank in range(world_size):
            lo, hi = rank * n, (rank + 1) * n
            for a, b in zip(bounds, bounds[1:]):
                s, e = max(a, lo), min(b, hi)
                if s < e:  # queries s..e-1 of the document starting at a see a..g
                    pairs[rank] += (s - a + 1 + e - a) * (e - s) / 2 / draws
            start = max(a for a in bounds if a <= lo)
            needed[rank] += (lo - start) / draws
            for src in range(rank):
                given[src] += max(0, min(lo, (src + 1) * n) - max(start, src * n)) / draws
    kv = 2 * shape["kv_heads"] * shape["head_dim"] * 2  # K and V rows, bf16
    per_pair = 4 * shape["heads"] * shape["head_dim"]
    return [{"send_bytes": given[r] * kv, "recv_bytes": needed[r] * kv, "flops": pairs[r] * per_pair}
            for r in range(world_size)]
