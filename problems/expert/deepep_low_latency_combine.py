"""DeepEP low-latency combine: expert outputs return to their token's rank, weighted top-k sum in fp32."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-5x the mean load

PROBLEM = {
    "name": "deepep_low_latency_combine",
    "category": "expert",
    "source": {
        "codebase": "DeepEP",
        "path": "deep_ep/buffer.py",
        "symbol": "Buffer.low_latency_combine",
    },
    "summary": (
        "DeepEP's low-latency combine for decoding (DeepSeek-V3: 256 experts, top-8, hidden 7168, 128 "
        "tokens per rank), the inverse of deepep_low_latency_dispatch_fp8. Each rank holds its local "
        "experts' outputs x [rows, hidden] bf16, packed expert by expert and within an expert by source "
        "rank, then source token ascending (DeepEP's padded [local_experts, W * max_tokens, hidden] "
        "buffer with the padding dropped), plus the dispatch handle: packed_recv_src_info [rows] int32 "
        "(source token index) and packed_recv_layout_range [local_experts, W] int64 ((begin within the "
        "expert's rows) << 32 | count). Every row goes back to the rank that owns its token, which "
        "computes out[t] = sum_k topk_weights[t, k] * expert_output(t, topk_idx[t, k]) in fp32 and "
        "returns [tokens, hidden] bf16 (DeepEP's combine reduces WITH weights). Inputs also carry the "
        "owner's topk_idx [tokens, k] int64 and topk_weights [tokens, k] fp32."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 128, "hidden": 7168, "experts": 256, "topk": 8},
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "topk": 2},
        "default": {"tokens": 96, "hidden": 5376, "experts": 256, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    num_local = e // world_size
    # This rank's expert rows depend on every rank's routing: all of it comes from the shared stream.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    topk_idx, topk_weights = [], []
    for _ in range(world_size):
        top_logits, idx = (torch.randn(t, e, generator=shared, device=device) + bias).topk(k, dim=-1)
        topk_idx.append(idx)
        topk_weights.append(top_logits.softmax(dim=-1))
    src_info, counts = [], torch.zeros(num_local, world_size, dtype=torch.int64, device=device)
    for le in range(num_local):
        for s in range(world_size):
            tokens = (topk_idx[s] == rank * num_local + le).any(dim=1).nonzero().squeeze(1)
            src_info.append(tokens)
            counts[le, s] = tokens.numel()
    packed_recv_src_info = torch.cat(src_info).int()
    layout_range = ((counts.cumsum(dim=1) - counts) << 32) | counts
    x = torch.randn(packed_recv_src_info.numel(), h, generator=generator, device=device).to(torch.bfloat16)
    return x, topk_idx[rank], topk_weights[rank], packed_recv_src_info, layout_range


@torch.no_grad()
def solution(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    packed_recv_src_info: torch.Tensor,
    packed_recv_layout_range: torch.Tensor,
):
    world_size = dist.get_world_size()
    num_local = packed_recv_layout_range.shape[0]
    num_tokens = topk_idx.shape[0]
    counts = packed_recv_layout_range & 0xFFFFFFFF  # [local expert, source rank]; rows are packed in this order
    # Each stored row's owner rank; a stable sort groups the rows by owner and keeps (expert, token) order.
    owner = torch.arange(world_size, device=x.device).repeat(num_local)
    owner_of_row = torch.repeat_interleave(owner, counts.reshape(-1), output_size=x.shape[0])
    send_rows = torch.sort(owner_of_row, stable=True).indices
    # what comes back: this rank's (token, expert) pairs, per expert rank
    recv_counts = torch.bincount(topk_idx.reshape(-1) // num_local, minlength=world_size)
    sizes = torch.cat([counts.sum(dim=0), recv_counts]).tolist()  # NCCL needs the split sizes on the host
    send_sizes, recv_sizes = sizes[:world_size], sizes[world_size:]

    def send_back(payload: torch.Tensor) -> torch.Tensor:
        out = payload.new_empty(sum(recv_sizes), *payload.shape[1:])
        dist.all_to_all_single(out, payload.contiguous(), recv_sizes, send_sizes)
        return out

    rows = send_back(x[send_rows])
    token = send_back(packed_recv_src_info[send_rows]).long()
    # rows from expert rank d arrive expert by expert: recover each row's global expert id
    per_expert = torch.bincount(topk_idx.reshape(-1), minlength=world_size * num_local)
    expert = torch.repeat_interleave(torch.arange(world_size * num_local, device=x.device), per_expert,
                                     output_size=topk_idx.numel())
    dense_weights = torch.zeros(num_tokens, world_size * num_local, device=x.device)
    dense_weights.scatter_(1, topk_idx, topk_weights)
    weighted = rows.float() * dense_weights[token, expert].unsqueeze(-1)
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    out.index_add_(0, token, weighted)
    return out.to(x.dtype)


def oracle(shape, world_size, inputs_by_rank):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    num_local = e // world_size
    outs = [torch.zeros(t, h, dtype=torch.float64) for _ in range(world_size)]
    # walk each expert rank's rows in storage order: local expert, source rank, source token
    for d, (x, _, _, _, _) in enumerate(inputs_by_rank):
        row = 0
        for le in range(num_local):
            g = d * num_local + le
            for s, (_, topk_idx, topk_weights, _, _) in enumerate(inputs_by_rank):
                for tok in range(t):
                    for j in range(k):
                        if int(topk_idx[tok, j]) == g:
                            outs[s][tok] += float(topk_weights[tok, j]) * x[row].double()
                            row += 1
        assert row == x.shape[0]
    return [o.to(torch.bfloat16) for o in outs]


def traffic(shape, world_size):
    """The rows of one token from one rank's experts can be summed there: the owner sends the fp32 weight
    of each (token, expert) pair and gets back one bf16 row per (token, remote rank). The reference returns
    one row per (token, expert) pair. Averaged over 8 routing draws distributed like make_inputs'."""
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    gen = torch.Generator().manual_seed(0)
    draws, hits = 8, 0.0
    for _ in range(draws):
        bias = -ZIPF * torch.log1p(torch.randperm(e, generator=gen).float())
        idx = (torch.randn(t, e, generator=gen) + bias).topk(k, dim=-1).indices
        hit = torch.zeros(t, world_size, dtype=torch.bool).scatter_(1, idx // (e // world_size), True)
        hits += hit.sum().item() / world_size / draws  # tokens of one rank that reach a given rank
    moved = (world_size - 1) * (hits * h * 2 + t * k / world_size * 4)
    return {"send_bytes": moved, "recv_bytes": moved}
