"""Megatron's all-to-all token dispatch: permute by expert, all_to_all_single, sort chunks by local expert."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-5x the mean load

PROBLEM = {
    "name": "moe_alltoall_dispatch",
    "category": "expert",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/transformer/moe/token_dispatcher.py",
        "symbol": "MoEAlltoAllTokenDispatcher.token_permutation",
    },
    "summary": (
        "The dispatch half of Megatron's MoEAlltoAllTokenDispatcher (EP only, dropless): preprocess "
        "all-gathers the per-expert token counts to get the all-to-all splits; permute "
        "(moe_utils.permute) copies every (token, selected expert) pair into an expert-major buffer "
        "(experts in order, tokens ascending within an expert) together with its router prob; "
        "all_to_all_single sends each rank the rows of its experts (variable splits); "
        "sort_chunks_by_idxs reorders the received [source rank, local expert] chunks into "
        "[local expert, source rank] order, the layout the grouped GEMM consumes. Outputs: the received "
        "tokens [sum, hidden] bf16, tokens per local expert [local_experts] int64, and the received "
        "probs [sum] fp32. Routing is top-k of skewed logits (shared Zipf-like expert preference), "
        "probs are the softmax over the top-k logits. A fused kernel writes each token straight into "
        "its destination rank's expert slot."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 7168, "experts": 256, "topk": 8},  # DeepSeek-V3 training
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
    probs = torch.zeros(t, e, device=device).scatter_(1, topk_idx, top_logits.softmax(dim=-1))
    routing_map = torch.zeros(t, e, dtype=torch.bool, device=device).scatter_(1, topk_idx, True)
    hidden = torch.randn(t, h, generator=generator, device=device).to(torch.bfloat16)
    return hidden, probs, routing_map


@torch.no_grad()
def solution(hidden_states: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    num_tokens, num_experts = routing_map.shape
    num_local = num_experts // world_size

    # preprocess: split sizes from the gathered per-expert counts
    num_local_tokens_per_expert = routing_map.sum(dim=0).long()
    input_splits = num_local_tokens_per_expert.reshape(world_size, num_local).sum(dim=1)
    gathered = torch.empty(world_size * num_experts, dtype=torch.long, device=routing_map.device)
    dist.all_gather_into_tensor(gathered, num_local_tokens_per_expert)
    num_global_tokens_per_local_expert = gathered.view(world_size, num_experts)[
        :, rank * num_local : (rank + 1) * num_local
    ]
    output_splits = num_global_tokens_per_local_expert.sum(dim=1)
    tokens_per_expert = num_global_tokens_per_local_expert.sum(dim=0)

    # permute 1: expert-major, tokens ascending within an expert (stable argsort of the mask)
    num_out = int(num_local_tokens_per_expert.sum())
    flat_sorted = routing_map.T.contiguous().reshape(-1).argsort(descending=True, stable=True)[:num_out]
    permuted_tokens = hidden_states.index_select(0, flat_sorted % num_tokens)
    permuted_probs = probs.T.contiguous().reshape(-1)[flat_sorted]

    out_sizes, in_sizes = output_splits.tolist(), input_splits.tolist()
    received = hidden_states.new_empty(sum(out_sizes), hidden_states.shape[1])
    dist.all_to_all_single(received, permuted_tokens, out_sizes, in_sizes)
    received_probs = probs.new_empty(sum(out_sizes))
    dist.all_to_all_single(received_probs, permuted_probs, out_sizes, in_sizes)

    # permute 2: chunks arrive as [source rank, local expert]; the experts want [local expert, source rank]
    if num_local > 1:
        sizes = num_global_tokens_per_local_expert.reshape(-1).tolist()
        order = torch.arange(world_size * num_local).view(world_size, num_local).T.reshape(-1).tolist()
        chunks, prob_chunks = received.split(sizes), received_probs.split(sizes)
        received = torch.cat([chunks[i] for i in order])
        received_probs = torch.cat([prob_chunks[i] for i in order])
    return received, tokens_per_expert, received_probs


def oracle(shape, world_size, inputs_by_rank):
    e = shape["experts"]
    num_local = e // world_size
    outs = []
    for r in range(world_size):
        rows, row_probs, counts = [], [], []
        for le in range(num_local):
            g = r * num_local + le
            n = 0
            for hidden, probs, routing_map in inputs_by_rank:
                for t in range(routing_map.shape[0]):
                    if bool(routing_map[t, g]):
                        rows.append(hidden[t])
                        row_probs.append(probs[t, g])
                        n += 1
            counts.append(n)
        h = inputs_by_rank[0][0].shape[1]
        tokens = torch.stack(rows) if rows else torch.empty(0, h, dtype=torch.bfloat16)
        p = torch.stack(row_probs) if row_probs else torch.empty(0)
        outs.append((tokens, torch.tensor(counts, dtype=torch.long), p))
    return outs


def traffic(shape, world_size):
    """A token needs to reach a rank once, however many of its experts live there: per (token, remote
    rank) one bf16 row, plus the fp32 prob of each (token, expert) pair and the routing bits of the
    destination's experts (the receiver copies rows per expert itself). The reference sends one row per
    (token, expert) pair. Averaged over 8 routing draws distributed like make_inputs'."""
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    gen = torch.Generator().manual_seed(0)
    draws, hits = 8, 0.0
    for _ in range(draws):
        bias = -ZIPF * torch.log1p(torch.randperm(e, generator=gen).float())
        idx = (torch.randn(t, e, generator=gen) + bias).topk(k, dim=-1).indices
        hit = torch.zeros(t, world_size, dtype=torch.bool).scatter_(1, idx // (e // world_size), True)
        hits += hit.sum().item() / world_size / draws  # tokens of one rank that reach a given rank
    per_peer = hits * h * 2 + t * k / world_size * 4 + -(-t * (e // world_size) // 8)
    moved = (world_size - 1) * per_peer
    return {"send_bytes": moved, "recv_bytes": moved}
