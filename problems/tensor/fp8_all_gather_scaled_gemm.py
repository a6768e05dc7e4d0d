"""All-gather of an fp8 (e4m3) activation shard with row-wise scales, then a row-wise scaled GEMM."""

import math

import torch
import torch.distributed as dist

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

PROBLEM = {
    "name": "fp8_all_gather_scaled_gemm",
    "category": "tensor",
    "source": {
        "codebase": "torchao",
        "path": "torchao/float8/float8_tensor_parallel.py",
        "symbol": "Float8ColwiseParallel",
    },
    "summary": (
        "Float8 tensor-parallel column-parallel linear with the all-gather done in float8 (torchao's "
        "Float8ColwiseParallel: 'all-gather in float8 with rowwise scales'; the fused form is PyTorch's "
        "symm_mem fused_all_gather_scaled_matmul in torch/distributed/_symmetric_memory/__init__.py, "
        "and Transformer Engine's gather_along_first_dim does the same for Float8Tensor). Each rank "
        "holds its sequence shard of the activation already quantized to float8_e4m3fn [tokens/W, "
        "hidden] (exchanged as uint8) with one float32 dequantization scale per row, and a row-wise "
        "quantized fp8 weight shard [out/W, hidden] with per-row scales. The ranks all-gather data and "
        "scales, then compute out = (x * x_scale) @ (w * w_scale)^T with fp32 accumulation, in bf16: "
        "what torch._scaled_mm does on the GPU. The reference dequantizes to bf16 (exact for e4m3) and "
        "applies the scales to the GEMM result, since _scaled_mm does not run on CPU. Shapes: Llama-70B "
        "MLP up-projection, 4096 tokens."
    ),
    "dtype": "float8_e4m3fn",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192, "out_features": 28672},
        "small": {"tokens": 16, "hidden": 32, "out_features": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "out_features": 64},
        "default": {"tokens": 3072, "hidden": 6144, "out_features": 28672},
    },
}


def _quantize_rowwise(t):
    scale = (t.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    q = (t / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(torch.uint8), scale.float()


def make_inputs(shape, rank, world_size, generator, device):
    h = shape["hidden"]
    x = torch.randn(shape["tokens"] // world_size, h, generator=generator, device=device)
    w = torch.randn(shape["out_features"] // world_size, h, generator=generator, device=device) / math.sqrt(h)
    x_q, x_scale = _quantize_rowwise(x)
    w_q, w_scale = _quantize_rowwise(w)
    return x_q, x_scale, w_q, w_scale  # uint8 [t/W, h], f32 [t/W, 1], uint8 [n/W, h], f32 [n/W, 1]


@torch.no_grad()
def solution(x_q, x_scale, w_q, w_scale):
    world_size = dist.get_world_size()
    x_all = x_q.new_empty(x_q.shape[0] * world_size, x_q.shape[1])
    s_all = x_scale.new_empty(x_scale.shape[0] * world_size, 1)
    dist.all_gather_into_tensor(x_all, x_q.contiguous())
    dist.all_gather_into_tensor(s_all, x_scale.contiguous())
    acc = x_all.view(FP8).to(torch.bfloat16) @ w_q.view(FP8).to(torch.bfloat16).t()
    return (acc.float() * s_all * w_scale.t()).to(torch.bfloat16)


def oracle(shape, world_size, inputs_by_rank):
    x = torch.cat([xq.view(FP8).double() * xs.double() for xq, xs, _, _ in inputs_by_rank], dim=0)
    outs = []
    for _, _, wq, ws in inputs_by_rank:
        outs.append((x @ (wq.view(FP8).double() * ws.double()).t()).to(torch.bfloat16))
    return outs


def traffic(shape, world_size):
    """FLOPs in bf16 terms: the GEMM's operands are fp8, and fp8 tensor cores run at twice the bf16 rate
    the roofline divides by (the reference upcasts to bf16 only because that runs everywhere)."""
    return {"flops": shape["tokens"] * shape["hidden"] * (shape["out_features"] // world_size)}
