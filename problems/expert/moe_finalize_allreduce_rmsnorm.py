"""TensorRT-LLM MoE finalize (top-k un-permute + shared expert) fused with all-reduce, residual, RMSNorm."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference
EPS = 1e-6

PROBLEM = {
    "name": "moe_finalize_allreduce_rmsnorm",
    "category": "expert",
    "source": {
        "codebase": "TensorRT-LLM",
        "path": "tensorrt_llm/_torch/distributed/ops.py",
        "symbol": "MoEAllReduce.forward (torch.ops.trtllm.moe_finalize_allreduce, "
                  "AllReduceFusionOp.MOE_FINALIZE_ALLREDUCE_RESIDUAL_RMS_NORM)",
    },
    "summary": (
        "The end of a tensor-parallel MoE layer in TensorRT-LLM (DeepSeek-V3 decode with TP=W: every "
        "rank runs all 256 experts on a 1/W slice of the intermediate dim, top-8, hidden 7168, up to 128 "
        "tokens: the fused kernel's one-shot limit). Each rank holds its partial second-GEMM output in "
        "expert-permuted order [tokens*k, hidden] bf16, the map expanded_idx_to_permuted_idx [tokens, k] "
        "int32 (row of (token, j) in that buffer), the routing weights expert_scale_factor [tokens, k] "
        "fp32, and its partial shared-expert output [tokens, hidden] bf16. The finalize "
        "sum_j scale[t, j] * fc2[map[t, j]] + shared[t] is computed in fp32, cast to bf16, all-reduced "
        "(sum) over the TP group; then the residual [tokens, hidden] bf16 (identical on all ranks) is "
        "added, giving residual_out, and RMSNorm (fp32 statistics, eps 1e-6) times norm_weight gives "
        "the next layer's input. Outputs: (norm_out, residual_out), both [tokens, hidden] bf16. The "
        "fused kernel does the gather-reduce, the one-shot all-reduce, the add and the norm in one pass."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 128, "hidden": 7168, "experts": 256, "topk": 8},
        "decode": {"tokens": 16, "hidden": 7168, "experts": 256, "topk": 8},
        "small": {"tokens": 16, "hidden": 64, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 3e-2, "rtol": 3e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 96, "experts": 8, "topk": 2},
        "default": {"tokens": 96, "hidden": 5376, "experts": 256, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    # Routing, residual and norm weight are replicated over the TP group: draw them from the shared stream.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    top_logits, topk_idx = (torch.randn(t, e, generator=shared, device=device) + bias).topk(k, dim=-1)
    expert_scale_factor = top_logits.softmax(dim=-1)
    # the MoE runner permutes (token, j) pairs by expert, stable in token order
    order = topk_idx.reshape(-1).argsort(stable=True)
    expanded_idx_to_permuted_idx = torch.empty_like(order)
    expanded_idx_to_permuted_idx[order] = torch.arange(order.numel(), device=device)
    expanded_idx_to_permuted_idx = expanded_idx_to_permuted_idx.view(t, k).int()
    residual = torch.randn(t, h, generator=shared, device=device).to(torch.bfloat16)
    norm_weight = (1.0 + 0.25 * torch.randn(h, generator=shared, device=device)).to(torch.bfloat16)
    # row-parallel partials; the MoE output is smaller than the residual stream, whatever W
    part = 0.5 / world_size**0.5
    fc2_output = (part * torch.randn(t * k, h, generator=generator, device=device)).to(torch.bfloat16)
    shared_output = (part * torch.randn(t, h, generator=generator, device=device)).to(torch.bfloat16)
    return (fc2_output, expanded_idx_to_permuted_idx, expert_scale_factor, shared_output, residual,
            norm_weight, EPS)


@torch.no_grad()
def solution(
    fc2_output: torch.Tensor,
    expanded_idx_to_permuted_idx: torch.Tensor,
    expert_scale_factor: torch.Tensor,
    shared_expert_output: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
):
    gathered = fc2_output[expanded_idx_to_permuted_idx.long()].float()  # [tokens, k, hidden]
    finalized = (gathered * expert_scale_factor.unsqueeze(-1)).sum(dim=1) + shared_expert_output.float()
    reduced = finalized.to(fc2_output.dtype)
    dist.all_reduce(reduced)
    residual_out = (reduced.float() + residual.float()).to(residual.dtype)
    h = residual_out.float()
    normed = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * norm_weight.float()
    return normed.to(residual.dtype), residual_out


def oracle(shape, world_size, inputs_by_rank):
    t, h, k = shape["tokens"], shape["hidden"], shape["topk"]
    total = torch.zeros(t, h, dtype=torch.float64)
    for fc2, idx, scale, shared_out, _, _, _ in inputs_by_rank:
        total += shared_out.double()
        for tok in range(t):
            for j in range(k):
                total[tok] += float(scale[tok, j]) * fc2[int(idx[tok, j])].double()
    _, _, _, _, residual, weight, eps = inputs_by_rank[0]
    total += residual.double()
    rms = total.square().mean(dim=-1, keepdim=True).add(eps).sqrt()
    normed = (total / rms * weight.double()).to(torch.bfloat16)
    return [(normed, total.to(torch.bfloat16)) for _ in range(world_size)]
