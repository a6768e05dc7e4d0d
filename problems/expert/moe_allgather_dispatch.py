"""Megatron's all-gather token dispatch: gather tokens and routing over EP, keep the local experts' rows."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-3x the mean load

PROBLEM = {
    "name": "moe_allgather_dispatch",
    "category": "expert",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/transformer/moe/token_dispatcher.py",
        "symbol": "MoEAllGatherTokenDispatcher.token_permutation",
    },
    "summary": (
        "Megatron's MoEAllGatherTokenDispatcher (the dispatcher for TP-style MoE and small EP groups): "
        "every rank all-gathers the hidden states [tokens, hidden] bf16, the routing_map "
        "[tokens, experts] bool and the router probs [tokens, experts] fp32 of the whole EP group, keeps "
        "the columns of its own experts (experts are split evenly and contiguously over ranks), and "
        "permutes the gathered tokens expert-major (local expert, then global token index ascending, "
        "moe_utils.permute). Outputs: permuted tokens [rows, hidden], tokens per local expert "
        "[local_experts] int64, and the permuted probs [rows] fp32 (probs.T.masked_select(map.T)). "
        "Qwen-MoE/Mixtral-like sizes: 64 experts, top-8, hidden 4096. A fused kernel pulls only the "
        "tokens its experts need from the peers instead of gathering everything."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 2048, "hidden": 4096, "experts": 64, "topk": 8},
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "topk": 2},
        "default": {"tokens": 1536, "hidden": 3072, "experts": 64, "topk": 8},
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


def _gather(x: torch.Tensor, world_size: int) -> torch.Tensor:
    out = x.new_empty(world_size * x.shape[0], *x.shape[1:])
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


@torch.no_grad()
def solution(hidden_states: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    num_local = routing_map.shape[1] // world_size
    routing_map = _gather(routing_map, world_size)
    probs = _gather(probs, world_size)
    hidden_states = _gather(hidden_states, world_size)

    local_map = routing_map[:, rank * num_local : (rank + 1) * num_local].contiguous()
    local_probs = probs[:, rank * num_local : (rank + 1) * num_local].contiguous()
    tokens_per_expert = local_map.sum(dim=0).long()

    num_tokens = local_map.shape[0]
    num_out = int(tokens_per_expert.sum())
    flat_sorted = local_map.T.contiguous().reshape(-1).argsort(descending=True, stable=True)[:num_out]
    permuted = hidden_states.index_select(0, flat_sorted % num_tokens)
    permuted_probs = local_probs.T.contiguous().masked_select(local_map.T.contiguous())
    return permuted, tokens_per_expert, permuted_probs


def oracle(shape, world_size, inputs_by_rank):
    e = shape["experts"]
    num_local = e // world_size
    hidden = torch.cat([inp[0] for inp in inputs_by_rank])
    probs = torch.cat([inp[1] for inp in inputs_by_rank])
    routing_map = torch.cat([inp[2] for inp in inputs_by_rank])
    outs = []
    for r in range(world_size):
        rows, row_probs, counts = [], [], []
        for le in range(num_local):
            g = r * num_local + le
            toks = [t for t in range(routing_map.shape[0]) if bool(routing_map[t, g])]
            counts.append(len(toks))
            rows += [hidden[t] for t in toks]
            row_probs += [probs[t, g] for t in toks]
        tokens = torch.stack(rows) if rows else hidden.new_empty(0, hidden.shape[1])
        p = torch.stack(row_probs) if row_probs else probs.new_empty(0)
        outs.append((tokens, torch.tensor(counts, dtype=torch.long), p))
    return outs


def traffic(shape, world_size):
    """Each rank needs only the tokens routed to its experts: per (token, destination rank) one bf16 row,
    the fp32 prob of each (token, local expert) pair, and the routing bits of the destination's experts.
    The reference gathers every row, prob and routing bit to every rank. Tokens reaching a rank are
    averaged over 8 routing draws distributed like make_inputs'."""
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
