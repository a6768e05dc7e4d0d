"""DeepEP normal (intranode) dispatch: layout, count notify, then one copy of each token per target rank."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-5x the mean load

PROBLEM = {
    "name": "deepep_intranode_dispatch",
    "category": "expert",
    "source": {
        "codebase": "DeepEP",
        "path": "deep_ep/buffer.py",
        "symbol": "Buffer.get_dispatch_layout + Buffer.dispatch (intranode)",
    },
    "summary": (
        "DeepEP's high-throughput NVLink dispatch used for prefill/training (DeepSeek-V3: 256 experts, "
        "top-8, hidden 7168). get_dispatch_layout turns topk_idx [tokens, k] int64 into "
        "num_tokens_per_rank, num_tokens_per_expert and is_token_in_rank [tokens, W]; the notify step "
        "exchanges the counts; then each rank sends every token ONCE to each rank hosting at least one of "
        "its top-k experts (not once per expert). The receiver gets the bf16 token, its topk_idx remapped "
        "to local expert ids (-1 where the expert lives elsewhere) and topk_weights fp32 (0 where -1). "
        "Receive order is fixed here as source rank, then source token index ascending (DeepEP's "
        "channels also keep each source's tokens in ascending order). Outputs: recv_x [n, hidden] bf16, "
        "recv_topk_idx [n, k] int64, recv_topk_weights [n, k] fp32, num_recv_tokens_per_expert "
        "[local_experts] int32 (expert_alignment 1), and recv_src_idx [n] int32 (source token index, "
        "part of the handle the combine uses)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 7168, "experts": 256, "topk": 8},
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "topk": 2},
        "default": {"tokens": 3072, "hidden": 5376, "experts": 256, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    logits = torch.randn(t, e, generator=generator, device=device) + bias
    top_logits, topk_idx = logits.topk(k, dim=-1)
    topk_weights = top_logits.softmax(dim=-1)
    x = torch.randn(t, h, generator=generator, device=device).to(torch.bfloat16)
    return x, topk_idx, topk_weights, e


@torch.no_grad()
def solution(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    num_local = num_experts // world_size
    num_tokens = x.shape[0]
    device = x.device

    # get_dispatch_layout
    target_rank = topk_idx // num_local
    is_token_in_rank = torch.zeros(num_tokens, world_size, dtype=torch.bool, device=device)
    is_token_in_rank.scatter_(1, target_rank, True)
    num_tokens_per_rank = is_token_in_rank.sum(dim=0).long()
    num_tokens_per_expert = torch.bincount(topk_idx.reshape(-1), minlength=num_experts).long()

    # notify: per-source token counts and per-local-expert counts
    recv_per_rank = torch.empty_like(num_tokens_per_rank)
    dist.all_to_all_single(recv_per_rank, num_tokens_per_rank)
    recv_per_expert = torch.empty_like(num_tokens_per_expert)
    dist.all_to_all_single(recv_per_expert, num_tokens_per_expert)
    num_recv_tokens_per_expert = recv_per_expert.view(world_size, num_local).sum(dim=0).int()

    # one copy per (token, target rank), grouped by target rank, tokens ascending
    dst, src_token = is_token_in_rank.T.nonzero(as_tuple=True)
    send_sizes, recv_sizes = num_tokens_per_rank.tolist(), recv_per_rank.tolist()
    n = sum(recv_sizes)

    def exchange(payload: torch.Tensor) -> torch.Tensor:
        out = payload.new_empty(n, *payload.shape[1:])
        dist.all_to_all_single(out, payload.contiguous(), recv_sizes, send_sizes)
        return out

    recv_x = exchange(x[src_token])
    recv_topk_idx = exchange(topk_idx[src_token])
    recv_topk_weights = exchange(topk_weights[src_token])
    recv_src_idx = exchange(src_token.int())

    local = recv_topk_idx - rank * num_local
    is_local = (local >= 0) & (local < num_local)
    recv_topk_idx = torch.where(is_local, local, torch.full_like(local, -1))
    recv_topk_weights = torch.where(is_local, recv_topk_weights, torch.zeros_like(recv_topk_weights))
    return recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert, recv_src_idx


def oracle(shape, world_size, inputs_by_rank):
    e, k = shape["experts"], shape["topk"]
    num_local = e // world_size
    outs = []
    for r in range(world_size):
        xs, idxs, ws, srcs = [], [], [], []
        counts = [0] * num_local
        for x, topk_idx, topk_weights, _ in inputs_by_rank:
            for t in range(x.shape[0]):
                experts = [int(v) for v in topk_idx[t]]
                if not any(g // num_local == r for g in experts):
                    continue
                xs.append(x[t])
                srcs.append(t)
                row_idx, row_w = [], []
                for j, g in enumerate(experts):
                    if g // num_local == r:
                        row_idx.append(g - r * num_local)
                        row_w.append(float(topk_weights[t, j]))
                        counts[g - r * num_local] += 1
                    else:
                        row_idx.append(-1)
                        row_w.append(0.0)
                idxs.append(row_idx)
                ws.append(row_w)
        h = inputs_by_rank[0][0].shape[1]
        outs.append((
            torch.stack(xs) if xs else torch.empty(0, h, dtype=torch.bfloat16),
            torch.tensor(idxs, dtype=torch.int64).reshape(-1, k),
            torch.tensor(ws, dtype=torch.float32).reshape(-1, k),
            torch.tensor(counts, dtype=torch.int32),
            torch.tensor(srcs, dtype=torch.int32),
        ))
    return outs
