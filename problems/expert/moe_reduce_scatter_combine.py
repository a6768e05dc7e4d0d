"""Megatron's all-gather dispatcher combine: weighted scatter of local expert outputs, then reduce-scatter."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-3x the mean load

PROBLEM = {
    "name": "moe_reduce_scatter_combine",
    "category": "expert",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/transformer/moe/token_dispatcher.py",
        "symbol": "MoEAllGatherTokenDispatcher.token_unpermutation",
    },
    "summary": (
        "The combine of Megatron's MoEAllGatherTokenDispatcher, the inverse of moe_allgather_dispatch. "
        "Each rank holds its local experts' outputs [rows, hidden] bf16 in (local expert, global token) "
        "order, plus the dispatch state: local_map [W*tokens, local_experts] bool and local_probs "
        "[W*tokens, local_experts] fp32 for the gathered tokens. It scales every row by its router prob "
        "and scatter-adds it in fp32 into the global token positions [W*tokens, hidden] (unpermute; "
        "Megatron core <= 0.10 applied the probs here, newer versions inside the expert), casts to bf16, "
        "and reduce-scatters over the EP group so each rank gets the summed output of its own tokens "
        "[tokens, hidden] bf16. Qwen-MoE/Mixtral-like sizes: 64 experts, top-8, hidden 4096. The "
        "reduce-scatter moves W*tokens*hidden per rank although most rows are zero on each rank; a fused "
        "kernel can send only the rows a rank's experts touched."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 2048, "hidden": 4096, "experts": 64, "topk": 8},
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "topk": 2},
        "default": {"tokens": 1536, "hidden": 3072, "experts": 64, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    num_local = e // world_size
    # The gathered routing is the same on every rank: draw all of it from the shared stream.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    logits = torch.randn(world_size * t, e, generator=shared, device=device) + bias
    top_logits, topk_idx = logits.topk(k, dim=-1)
    probs = torch.zeros(world_size * t, e, device=device).scatter_(1, topk_idx, top_logits.softmax(dim=-1))
    routing_map = torch.zeros(world_size * t, e, dtype=torch.bool, device=device).scatter_(1, topk_idx, True)
    local_map = routing_map[:, rank * num_local : (rank + 1) * num_local].contiguous()
    local_probs = probs[:, rank * num_local : (rank + 1) * num_local].contiguous()
    rows = int(local_map.sum())
    expert_output = torch.randn(rows, h, generator=generator, device=device).to(torch.bfloat16)
    return expert_output, local_map, local_probs


@torch.no_grad()
def solution(hidden_states: torch.Tensor, local_map: torch.Tensor, local_probs: torch.Tensor):
    world_size = dist.get_world_size()
    num_global_tokens = local_map.shape[0]
    # rows are local-expert-major with global tokens ascending: the order of local_map.T's nonzeros
    flat_sorted = local_map.T.contiguous().reshape(-1).argsort(descending=True, stable=True)
    flat_sorted = flat_sorted[: hidden_states.shape[0]]
    permuted_probs = local_probs.T.contiguous().masked_select(local_map.T.contiguous())
    weighted = hidden_states.float() * permuted_probs.unsqueeze(-1)
    unpermuted = torch.zeros(num_global_tokens, hidden_states.shape[1], dtype=torch.float32,
                             device=hidden_states.device)
    unpermuted.index_add_(0, flat_sorted % num_global_tokens, weighted)
    unpermuted = unpermuted.to(hidden_states.dtype)
    out = hidden_states.new_empty(num_global_tokens // world_size, hidden_states.shape[1])
    dist.reduce_scatter_tensor(out, unpermuted)
    return out


def oracle(shape, world_size, inputs_by_rank):
    t, h = shape["tokens"], shape["hidden"]
    total = torch.zeros(world_size * t, h, dtype=torch.float64)
    for expert_output, local_map, local_probs in inputs_by_rank:
        row = 0
        for le in range(local_map.shape[1]):
            for tok in range(local_map.shape[0]):
                if bool(local_map[tok, le]):
                    total[tok] += float(local_probs[tok, le]) * expert_output[row].double()
                    row += 1
    return [c.to(torch.bfloat16) for c in total.chunk(world_size)]


def traffic(shape, world_size):
    """A rank's partial sums matter only for tokens routed to its experts: per (token, owner rank) pair
    one bf16 row goes to the owner. The reference reduce-scatters the dense [W * tokens, hidden] buffer,
    zero rows included. Averaged over 8 routing draws distributed like make_inputs'."""
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    gen = torch.Generator().manual_seed(0)
    draws, hits = 8, 0.0
    for _ in range(draws):
        bias = -ZIPF * torch.log1p(torch.randperm(e, generator=gen).float())
        idx = (torch.randn(t, e, generator=gen) + bias).topk(k, dim=-1).indices
        hit = torch.zeros(t, world_size, dtype=torch.bool).scatter_(1, idx // (e // world_size), True)
        hits += hit.sum().item() / world_size / draws  # tokens of one rank that reach a given rank
    moved = (world_size - 1) * hits * h * 2
    return {"send_bytes": moved, "recv_bytes": moved}
