"""SGLang TP-MoE tail: weighted top-k reduction plus shared expert, then reduce-scatter over tokens."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference
ROUTED_SCALING_FACTOR = 2.5  # DeepSeek-V3

PROBLEM = {
    "name": "topk_reduce_shared_expert_reduce_scatter",
    "category": "expert",
    "source": {
        "codebase": "SGLang",
        "path": "python/sglang/srt/models/deepseek_v2.py",
        "symbol": "DeepseekV2MoE.forward_normal (use_reduce_scatter) + "
                  "LayerCommunicator.postprocess_layer (dp_reduce_scatter_tensor)",
    },
    "summary": (
        "The tail of a tensor-parallel DeepSeek MoE layer in SGLang with DP attention and max-len "
        "padding (use_reduce_scatter): every TP rank has run all routed experts on a 1/W slice of the "
        "intermediate dim for all gathered tokens, producing the per-(token, slot) down-projection "
        "partials [tokens, k, hidden] bf16 (fused_moe's intermediate_cache3), plus its partial "
        "shared-expert output [tokens, hidden] bf16. The routed output is the top-k reduction "
        "sum_j topk_weights[t, j] * partial[t, j] in fp32 (moe_sum_reduce; the weights are identical "
        "on all ranks and already include the routed scaling factor 2.5), cast to bf16 and added to "
        "the shared-expert partial; instead of an all-reduce, the result is reduce-scattered over the "
        "token dim so each rank keeps the summed rows of its own DP slice [tokens/W, hidden] bf16. "
        "A fused kernel reduces each rank's slice of tokens straight from the peers' partials."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 2048, "hidden": 7168, "experts": 256, "topk": 8},  # gathered prefill chunk
        "decode": {"tokens": 256, "hidden": 7168, "experts": 256, "topk": 8},
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 3e-2, "rtol": 3e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "topk": 2},
        "default": {"tokens": 1536, "hidden": 5376, "experts": 256, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    # The router runs on the gathered tokens on every TP rank: weights are replicated (shared stream).
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    top_logits = (torch.randn(t, e, generator=shared, device=device) + bias).topk(k, dim=-1).values
    topk_weights = top_logits.softmax(dim=-1) * ROUTED_SCALING_FACTOR
    # row-parallel partials, scaled so the reduced output has the same spread for any W
    part = 0.5 / world_size**0.5
    expert_out = (part * torch.randn(t, k, h, generator=generator, device=device)).to(torch.bfloat16)
    shared_output = (part * torch.randn(t, h, generator=generator, device=device)).to(torch.bfloat16)
    return expert_out, topk_weights, shared_output


@torch.no_grad()
def solution(expert_out: torch.Tensor, topk_weights: torch.Tensor, shared_output: torch.Tensor):
    world_size = dist.get_world_size()
    routed = (expert_out.float() * topk_weights.unsqueeze(-1)).sum(dim=1).to(expert_out.dtype)
    final_hidden_states = routed + shared_output
    tokens, hidden = final_hidden_states.shape
    out = final_hidden_states.new_empty(tokens // world_size, hidden)
    dist.reduce_scatter_tensor(out, final_hidden_states)
    return out


def oracle(shape, world_size, inputs_by_rank):
    t, h, k = shape["tokens"], shape["hidden"], shape["topk"]
    total = torch.zeros(t, h, dtype=torch.float64)
    for expert_out, topk_weights, shared_output in inputs_by_rank:
        total += shared_output.double()
        for j in range(k):
            total += topk_weights[:, j : j + 1].double() * expert_out[:, j].double()
    return [c.to(torch.bfloat16) for c in total.chunk(world_size)]
