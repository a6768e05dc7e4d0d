"""vLLM decode context parallel (DCP): all-gather query heads, attend to the local slice of the KV cache,
then merge partial outputs across ranks by all-gathered LSEs and a reduce-scatter over heads."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "decode_context_parallel",
    "category": "context",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/attention/ops/common.py",
        "symbol": "cp_lse_ag_out_rs (with the DCP decode path's get_dcp_group().all_gather(q, dim=-2))",
    },
    "summary": (
        "One decode step of GQA attention under vLLM decode context parallelism, which shards the KV cache "
        "by token instead of replicating it: token t of every request lives on rank t mod W (interleave "
        "size 1). Each rank holds its TP-sharded query heads q [batch, heads/W, head_dim], its cache slice "
        "k, v [batch, max_context/W, kv_heads, head_dim] and the requests' context lengths (same on every "
        "rank). The queries are all-gathered over heads; each rank computes fp32 attention of all heads "
        "over its valid cached tokens, giving a bf16 partial output [batch, heads, head_dim] and fp32 LSE "
        "[batch, heads]; cp_lse_ag_out_rs all-gathers the LSEs, rescales the partial output by "
        "exp(lse_r - logsumexp_r lse_r), and reduce-scatters it over heads. Output [batch, heads/W, "
        "head_dim] bf16. Memory bound: the KV cache read dominates; the collectives are latency bound."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 32, "max_context": 32768, "heads": 32, "kv_heads": 8, "head_dim": 128},
        "small": {"batch": 4, "max_context": 64, "heads": 8, "kv_heads": 2, "head_dim": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-2, "rtol": 1e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 4, "max_context": 96, "heads": 8, "kv_heads": 2, "head_dim": 16},
        "default": {"batch": 32, "max_context": 24576, "heads": 32, "kv_heads": 8, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    b, lmax, d = shape["batch"], shape["max_context"], shape["head_dim"]
    q = torch.randn(b, shape["heads"] // world_size, d, generator=generator, device=device)
    k = torch.randn(b, lmax // world_size, shape["kv_heads"], d, generator=generator, device=device)
    v = torch.randn(b, lmax // world_size, shape["kv_heads"], d, generator=generator, device=device)
    # context lengths are batch metadata every rank agrees on
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    lens = torch.randint(lmax // 2, lmax + 1, (b,), generator=shared, device=device, dtype=torch.int32)
    return q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), lens


@torch.no_grad()
def solution(q, k_cache, v_cache, context_lens):
    world, rank = dist.get_world_size(), dist.get_rank()
    b, hl, d = q.shape
    # all-gather query heads: [W, b, h/W, d] -> [b, h, d]
    q_all = torch.empty(world * b, hl, d, dtype=q.dtype, device=q.device)
    dist.all_gather_into_tensor(q_all, q.contiguous())
    q_all = q_all.view(world, b, hl, d).permute(1, 0, 2, 3).reshape(b, world * hl, d)
    h, hkv = world * hl, k_cache.shape[2]

    # attention over this rank's cached tokens t = rank, rank + W, ...
    local_lens = (context_lens.long() - rank + world - 1) // world
    valid = torch.arange(k_cache.shape[1], device=q.device)[None, :] < local_lens[:, None]  # [b, L/W]
    qg = q_all.float().view(b, hkv, h // hkv, d)  # query heads grouped by the KV head they share
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k_cache.float()) * d ** -0.5
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, hkv, h/hkv]
    out = torch.einsum("bkgl,blkd->bkgd", torch.exp(scores - lse[..., None]), v_cache.float())
    out, lse = out.reshape(b, h, d).to(q.dtype), lse.reshape(b, h)

    # cp_lse_ag_out_rs
    lses = torch.empty(world * b, h, dtype=lse.dtype, device=lse.device)
    dist.all_gather_into_tensor(lses, lse.contiguous())
    lses = lses.view(world, b, h)
    factor = torch.exp(lse - torch.logsumexp(lses, dim=0))
    out = (out.float() * factor[..., None]).to(q.dtype)
    heads_first = out.transpose(0, 1).contiguous()  # reduce-scatter over dim 1 = heads
    mine = torch.empty(hl, b, d, dtype=out.dtype, device=out.device)
    dist.reduce_scatter_tensor(mine, heads_first)
    return mine.transpose(0, 1).contiguous()


def oracle(shape, world_size, inputs_by_rank):
    w, h, hkv, d = world_size, shape["heads"], shape["kv_heads"], shape["head_dim"]
    q = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=1).double()  # [b, h, d]
    lens = inputs_by_rank[0][3]
    b, lmax = shape["batch"], shape["max_context"]
    k = torch.empty(b, lmax, hkv, d, dtype=torch.float64)
    v = torch.empty(b, lmax, hkv, d, dtype=torch.float64)
    for r, inputs in enumerate(inputs_by_rank):  # token t is cached on rank t % W at slot t // W
        k[:, r::w] = inputs[1].double()
        v[:, r::w] = inputs[2].double()
    out = torch.empty(b, h, d, dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        ki, vi = (t[i, :n].repeat_interleave(h // hkv, dim=1) for t in (k, v))  # [n, h, d]
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[i], ki) / d ** 0.5, dim=-1)
        out[i] = torch.einsum("hn,nhd->hd", p, vi)
    out = out.to(torch.bfloat16)
    return [out[:, r * h // w:(r + 1) * h // w].clone() for r in range(w)]


def traffic(shape, world_size):
    """Only the valid cache rows need reading and attending to: context lengths are uniform on
    max_context/2..max_context, so on average 3/4 of the cache. HBM: the queries, the valid K and V rows,
    the output; FLOPs: QK^T and PV over the valid rows for every head."""
    b, h, hkv, d = shape["batch"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    lmax = shape["max_context"]
    valid = (lmax // 2 + lmax) / 2 / world_size  # rows of this rank's cache, on average
    hbm = 2 * b * h // world_size * d * 2 + 2 * b * valid * hkv * d * 2 + b * 4
    return {"hbm_bytes": hbm, "flops": 4 * b * h * d * valid}
