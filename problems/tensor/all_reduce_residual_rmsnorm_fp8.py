"""All-reduce + residual add + RMSNorm + static fp8 quantization of the normed output."""

import torch
import torch.distributed as dist

EPS = 1e-6
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

PROBLEM = {
    "name": "all_reduce_residual_rmsnorm_fp8",
    "category": "tensor",
    "source": {
        "codebase": "TensorRT-LLM",
        "path": "tensorrt_llm/_torch/distributed/ops.py",
        "symbol": "AllReduce.forward (AllReduceFusionOp.RESIDUAL_RMS_NORM_QUANT_FP8)",
    },
    "summary": (
        "TensorRT-LLM's all-reduce fusion RESIDUAL_RMS_NORM_QUANT_FP8 (AllReduceFusionOp, "
        "tensorrt_llm/functional.py), used after a row-parallel layer when the next GEMM runs in fp8: "
        "each rank holds a partial activation x [tokens, hidden]; the ranks sum it, add the residual "
        "stream (identical on all ranks), return the new residual in bf16, RMSNorm it (fp32 statistics, "
        "eps 1e-6, times the norm weight) and quantize the result to float8_e4m3fn with a static "
        "per-tensor scale (a float32 input): q = saturate(normed / scale). Returns (q as a "
        "float8_e4m3fn tensor, residual_out). The fp8 output is compared by value, not bitwise: a "
        "correct kernel may round an element that sits on a rounding boundary to the neighbouring fp8 "
        "value, one e4m3 step (at most 1/8 of the value), so rtol is 0.13 for both outputs. Default is "
        "a small batch (128 tokens), where the fusion matters most; prefill is 4096 tokens."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 128, "hidden": 8192},
        "prefill": {"tokens": 4096, "hidden": 8192},
        "small": {"tokens": 16, "hidden": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 0.13},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 96},
        "default": {"tokens": 96, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h = shape["tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) / world_size**0.5
    # residual, norm weight and the static fp8 scale are replicated across TP ranks.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    residual = torch.randn(t, h, generator=shared, device=device)
    weight = 1.0 + 0.25 * torch.randn(h, generator=shared, device=device)
    # The static scale is drawn in [1, 2), near TensorRT-LLM's own test (scale 1.0): fp8 units then match
    # the normed units, so one atol means the same for both outputs. A calibrated amax/448 would magnify
    # the bf16 all-reduce's rounding in the reference by ~100x in fp8 units.
    scale = 1.0 + torch.rand(1, generator=shared, device=device)
    return x.to(torch.bfloat16), residual.to(torch.bfloat16), weight.to(torch.bfloat16), scale.float()


@torch.no_grad()
def solution(x, residual, weight, scale):
    reduced = x.clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    residual_out = reduced + residual
    h = residual_out.float()
    normed = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()
    q = (normed / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, residual_out


def oracle(shape, world_size, inputs_by_rank):
    _, residual, weight, scale = inputs_by_rank[0]
    total = sum(inp[0].double() for inp in inputs_by_rank) + residual.double()
    rms = total.square().mean(dim=-1, keepdim=True).add(EPS).sqrt()
    q = (total / rms * weight.double() / scale.double()).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return [(q, total.to(torch.bfloat16)) for _ in range(world_size)]
