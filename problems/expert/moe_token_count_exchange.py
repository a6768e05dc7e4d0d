"""Megatron's all-to-all dispatcher preprocess: exchange per-expert token counts across the EP group."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-5x the mean load

PROBLEM = {
    "name": "moe_token_count_exchange",
    "category": "expert",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/transformer/moe/token_dispatcher.py",
        "symbol": "MoEAlltoAllTokenDispatcher.preprocess",
    },
    "summary": (
        "Before every MoE all-to-all, each expert-parallel rank counts how many of its tokens go to each "
        "global expert (routing_map[tokens, experts].sum(0)) and the ranks exchange these counts, so that "
        "every rank knows its all-to-all send/receive splits and how many tokens each of its local experts "
        "will get from each source rank. Megatron does it with an all-gather of the int64 count vector over "
        "the EP group followed by slicing its local experts' columns; the minimum is an all-to-all of the "
        "[W, local_experts] blocks. Outputs: num_tokens_per_local_expert [local_experts], "
        "num_global_tokens_per_local_expert [W, local_experts] (row = source rank), input_splits [W] and "
        "output_splits [W]. Routing is top-k of skewed logits (a shared Zipf-like expert preference). "
        "The exchange itself is a few KiB (latency bound, a few microseconds on NVLink): the workload is "
        "small by nature and sits on the critical path of every MoE layer."
    ),
    "dtype": "int64",
    "shapes": {
        "default": {"tokens": 4096, "experts": 256, "topk": 8},  # DeepSeek-V3 training micro-batch
        "decode": {"tokens": 128, "experts": 256, "topk": 8},
        "small": {"tokens": 16, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "experts": 8, "topk": 2},
        "default": {"tokens": 3072, "experts": 256, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, e, k = shape["tokens"], shape["experts"], shape["topk"]
    # The expert preference is a property of the model, the same on every rank.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    logits = torch.randn(t, e, generator=generator, device=device) + bias
    topk_idx = logits.topk(k, dim=-1).indices
    routing_map = torch.zeros(t, e, dtype=torch.bool, device=device).scatter_(1, topk_idx, True)
    return (routing_map,)


@torch.no_grad()
def solution(routing_map: torch.Tensor):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    num_experts = routing_map.shape[1]
    num_local = num_experts // world_size
    num_local_tokens_per_expert = routing_map.sum(dim=0).long()
    input_splits = num_local_tokens_per_expert.reshape(world_size, num_local).sum(dim=1)
    gathered = torch.empty(world_size * num_experts, dtype=torch.long, device=routing_map.device)
    dist.all_gather_into_tensor(gathered, num_local_tokens_per_expert)
    num_global_tokens_per_local_expert = gathered.view(world_size, num_experts)[
        :, rank * num_local : (rank + 1) * num_local
    ].contiguous()
    output_splits = num_global_tokens_per_local_expert.sum(dim=1)
    num_tokens_per_local_expert = num_global_tokens_per_local_expert.sum(dim=0)
    return num_tokens_per_local_expert, num_global_tokens_per_local_expert, input_splits, output_splits


def oracle(shape, world_size, inputs_by_rank):
    e = shape["experts"]
    num_local = e // world_size
    # counts[src, expert] from the (token, expert) pairs, not from a column sum.
    counts = torch.stack(
        [torch.bincount(inp[0].nonzero()[:, 1], minlength=e) for inp in inputs_by_rank]
    ).long()
    outs = []
    for r in range(world_size):
        mine = counts[:, r * num_local : (r + 1) * num_local].clone()
        sent = torch.tensor(
            [int(counts[r, d * num_local : (d + 1) * num_local].sum()) for d in range(world_size)]
        )
        outs.append((mine.sum(0), mine, sent, mine.sum(1)))
    return outs


def traffic(shape, world_size):
    """Each rank needs the other ranks' counts for its own experts only; the reference all-gathers every
    expert's count."""
    moved = (world_size - 1) * (shape["experts"] // world_size) * 8  # int64
    return {"send_bytes": moved, "recv_bytes": moved}
