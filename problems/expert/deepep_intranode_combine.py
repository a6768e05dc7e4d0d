"""DeepEP normal (intranode) combine: return each received token to its source rank and sum the copies."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-5x the mean load

PROBLEM = {
    "name": "deepep_intranode_combine",
    "category": "expert",
    "source": {
        "codebase": "DeepEP",
        "path": "deep_ep/buffer.py",
        "symbol": "Buffer.combine (intranode)",
    },
    "summary": (
        "DeepEP's high-throughput NVLink combine, the inverse of deepep_intranode_dispatch (DeepSeek-V3: "
        "256 experts, top-8, hidden 7168). Each rank holds one row per token it received, x [n, hidden] "
        "bf16, already reduced over its local experts and weighted by the caller (DeepEP's combine adds "
        "WITHOUT weights), and the received topk_weights [n, k] fp32 (zeros for experts elsewhere). "
        "Rows are in dispatch order: source rank, then source token ascending. Each row goes back to its "
        "source rank, which sums, in fp32, the copies of each token from every rank it was sent to: "
        "combined_x [tokens, hidden] bf16, and the summed topk_weights [tokens, k] fp32 (which restores "
        "the original weights). The handle from the dispatch is passed in: is_token_in_rank "
        "[tokens, W] bool (where this rank's tokens went), rank_prefix_matrix [W, W] int32 (entry [i, j] "
        "= tokens sent to rank j by ranks 0..i, identical on every rank) and recv_src_idx [n] int32 "
        "(source token index of each received row)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 7168, "experts": 256, "topk": 8},
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "topk": 2},
        "default": {"tokens": 3072, "hidden": 5376, "experts": 256, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    num_local = e // world_size
    # The combine needs every rank's routing (what this rank received and from whom): all of it is shared.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    topk_idx, topk_weights, in_rank = [], [], []
    for _ in range(world_size):
        top_logits, idx = (torch.randn(t, e, generator=shared, device=device) + bias).topk(k, dim=-1)
        topk_idx.append(idx)
        topk_weights.append(top_logits.softmax(dim=-1))
        target = torch.zeros(t, world_size, dtype=torch.bool, device=device)
        in_rank.append(target.scatter_(1, idx // num_local, True))
    sent = torch.stack([m.sum(dim=0) for m in in_rank])  # [source, destination]
    rank_prefix_matrix = sent.cumsum(dim=0).int()
    # what this rank received, in dispatch order (source rank, then source token)
    src_rows = [in_rank[s][:, rank].nonzero().squeeze(1) for s in range(world_size)]
    recv_src_idx = torch.cat(src_rows).int()
    recv_weights = []
    for s, rows in enumerate(src_rows):
        is_local = topk_idx[s][rows] // num_local == rank
        w = topk_weights[s][rows]
        recv_weights.append(torch.where(is_local, w, torch.zeros_like(w)))
    recv_topk_weights = torch.cat(recv_weights)
    x = torch.randn(recv_src_idx.shape[0], h, generator=generator, device=device).to(torch.bfloat16)
    return x, recv_topk_weights, in_rank[rank], rank_prefix_matrix, recv_src_idx


@torch.no_grad()
def solution(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    is_token_in_rank: torch.Tensor,
    rank_prefix_matrix: torch.Tensor,
    recv_src_idx: torch.Tensor,
):
    rank = dist.get_rank()
    num_tokens = is_token_in_rank.shape[0]
    column = rank_prefix_matrix[:, rank].long()
    recv_sizes = torch.diff(column, prepend=column.new_zeros(1)).tolist()  # rows this rank got per source
    back_sizes = is_token_in_rank.sum(dim=0).tolist()  # copies of this rank's tokens per destination
    n_back = sum(back_sizes)

    def send_back(payload: torch.Tensor) -> torch.Tensor:
        out = payload.new_empty(n_back, *payload.shape[1:])
        dist.all_to_all_single(out, payload.contiguous(), back_sizes, recv_sizes)
        return out

    rows = send_back(x)
    weights = send_back(topk_weights)
    token = send_back(recv_src_idx).long()
    combined_x = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    combined_x.index_add_(0, token, rows.float())
    combined_weights = torch.zeros(num_tokens, topk_weights.shape[1], dtype=torch.float32, device=x.device)
    combined_weights.index_add_(0, token, weights)
    return combined_x.to(x.dtype), combined_weights


def oracle(shape, world_size, inputs_by_rank):
    t, h, k = shape["tokens"], shape["hidden"], shape["topk"]
    xs = [torch.zeros(t, h, dtype=torch.float64) for _ in range(world_size)]
    ws = [torch.zeros(t, k, dtype=torch.float64) for _ in range(world_size)]
    # Receiver d's rows, in order: (source s, token) for every token of s with is_token_in_rank[., d].
    for d, (x, weights, _, _, _) in enumerate(inputs_by_rank):
        row = 0
        for s, (_, _, in_rank, _, _) in enumerate(inputs_by_rank):
            for tok in range(t):
                if bool(in_rank[tok, d]):
                    xs[s][tok] += x[row].double()
                    ws[s][tok] += weights[row].double()
                    row += 1
        assert row == x.shape[0]
    return [(xs[r].to(torch.bfloat16), ws[r].float()) for r in range(world_size)]
