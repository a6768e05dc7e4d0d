"""DeepSeek-V3 aux-loss-free balancing: all-reduce per-expert token counts, then sign-step the expert bias."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference, different for every layer
UPDATE_RATE = 1e-3  # moe_router_bias_update_rate

PROBLEM = {
    "name": "expert_bias_count_all_reduce",
    "category": "expert",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/transformer/moe/moe_utils.py",
        "symbol": "get_updated_expert_bias (called by _update_router_expert_bias in "
                  "megatron/core/distributed/finalize_model_grads.py)",
    },
    "summary": (
        "Once per global batch Megatron updates the router expert bias of DeepSeek-V3's auxiliary-loss-"
        "free load balancing: the local_tokens_per_expert buffers of all MoE layers, stacked "
        "[layers, experts] fp32 (integer counts of (token, expert) assignments this rank routed), are "
        "summed over the TPxCPxDP group with one all-reduce, and each layer's bias moves by "
        "update_rate * sign(mean count - count) (the mean over that layer's experts). Outputs: the "
        "updated bias [layers, experts] fp32 and the global counts [layers, experts] fp32 (the all-reduce "
        "is in place on the count buffer). The counts come from real routing: top-k of "
        "sigmoid(skewed logits) + current bias per layer. DeepSeek-V3 sizes: 58 MoE layers x 256 experts "
        "= 58 KiB, so the all-reduce is latency bound (tens of microseconds at most): small by nature, "
        "once per optimizer step."
    ),
    "dtype": "float32",
    "shapes": {
        "default": {"layers": 58, "experts": 256, "topk": 8, "tokens": 4096},
        "small": {"layers": 4, "experts": 8, "topk": 2, "tokens": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-6, "rtol": 1e-6},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"layers": 4, "experts": 8, "topk": 2, "tokens": 24},
        "default": {"layers": 58, "experts": 256, "topk": 8, "tokens": 3072},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    n_layers, e, k, t = shape["layers"], shape["experts"], shape["topk"], shape["tokens"]
    # the bias is a replicated parameter, and each layer's expert preference is a model property: shared
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    expert_bias = 1e-2 * torch.randn(n_layers, e, generator=shared, device=device)
    counts = torch.empty(n_layers, e, device=device)
    for layer in range(n_layers):
        preference = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
        scores = torch.sigmoid(torch.randn(t, e, generator=generator, device=device) + preference)
        topk_idx = (scores + expert_bias[layer]).topk(k, dim=-1).indices
        counts[layer] = torch.bincount(topk_idx.reshape(-1), minlength=e).float()
    return counts, expert_bias, UPDATE_RATE


@torch.no_grad()
def solution(tokens_per_expert: torch.Tensor, expert_bias: torch.Tensor, expert_bias_update_rate: float):
    tokens_per_expert = tokens_per_expert.clone()
    dist.all_reduce(tokens_per_expert)
    average_tokens = tokens_per_expert.sum(dim=-1, keepdim=True) / tokens_per_expert.shape[-1]
    offset = average_tokens - tokens_per_expert
    updated_expert_bias = expert_bias + torch.sign(offset) * expert_bias_update_rate
    return updated_expert_bias, tokens_per_expert


def oracle(shape, world_size, inputs_by_rank):
    counts = sum(inp[0].double() for inp in inputs_by_rank)
    bias, rate = inputs_by_rank[0][1].double(), inputs_by_rank[0][2]
    n_layers, e = counts.shape
    updated = bias.clone()
    for layer in range(n_layers):
        mean = counts[layer].sum() / e
        for x in range(e):
            c = counts[layer, x]
            updated[layer, x] += rate if c < mean else (-rate if c > mean else 0.0)
    return [(updated.float(), counts.float()) for _ in range(world_size)]
