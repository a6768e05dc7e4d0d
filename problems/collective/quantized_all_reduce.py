"""Two-shot fp8 all-reduce of a bf16 activation with per-group scales (TensorRT-LLM low precision)."""

import torch
import torch.distributed as dist

GROUP = 128  # elements per scale, contiguous along hidden
FP8_MAX = 448.0  # float8_e4m3fn

PROBLEM = {
    "name": "quantized_all_reduce",
    "category": "collective",
    "source": {
        "codebase": "TensorRT-LLM",
        "path": "cpp/tensorrt_llm/kernels/communicationKernels/customLowPrecisionAllReduceKernels.cu",
        "symbol": "lowPrecisionTwoShotAllReduceKernel",
    },
    "summary": (
        "The tensor-parallel sum-all-reduce after a row-parallel layer, with the payload cut to fp8 to "
        "halve the bytes on the wire, as TensorRT-LLM's LOWPRECISION all-reduce strategy does. Two shots: "
        "(1) each rank quantizes its [tokens, hidden] bf16 input to float8_e4m3fn with one fp32 scale "
        "per group of 128 contiguous elements (scale = 448 / group amax, q = fp8(x * scale), "
        "round-to-nearest-even) and sends row chunk j to rank j; rank j dequantizes (q / scale), sums "
        "over ranks in fp32 and re-quantizes its reduced chunk the same way; (2) the quantized chunks "
        "are all-gathered and every rank dequantizes them to bf16. TensorRT-LLM scales per warp of 496 "
        "elements; 128 is used here. The oracle is the exact sum; the tolerance admits the two fp8 "
        "roundings (a kernel that skips quantization also passes, but moves twice the bytes)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192},  # 64 MiB bf16, 32 MiB fp8: prefill
        "small": {"tokens": 8, "hidden": 256},
    },
    "world_sizes": [2, 4, 8],
    # fp8 e4m3 keeps 3 mantissa bits: each rounding errs by up to 1/16 of the value, on every rank's
    # input and on the sum, so the error grows with sum(|x_r|), not with |sum|. This admits the exact sum
    # and other group sizes at W=8 (worst seen: 0.65 of the limit); dropping a rank fails ~30% of elements.
    "tolerance": {"atol": 1.0, "rtol": 0.125},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 384},
        "default": {"tokens": 3072, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["tokens"], shape["hidden"], generator=generator, device=device)
    return (x.to(torch.bfloat16),)


def _quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [rows, hidden] -> (fp8 payload as uint8 [rows, hidden], fp32 scales [rows, hidden // GROUP])."""
    groups = t.view(t.shape[0], -1, GROUP)
    amax = groups.abs().amax(dim=-1)
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax))  # an all-zero group stays zero
    q = (groups * scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).view(t.shape), scale


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    groups = q.view(torch.float8_e4m3fn).float().view(q.shape[0], -1, GROUP)
    return (groups / scale.unsqueeze(-1)).view(q.shape)


@torch.no_grad()
def solution(x):
    world = dist.get_world_size()
    rows = x.shape[0] // world
    # Shot 1: reduce-scatter of the quantized payload; gloo has no fp8, so it travels as uint8.
    q, scale = _quantize(x.float())
    q_in, scale_in = torch.empty_like(q), torch.empty_like(scale)
    dist.all_to_all_single(q_in, q)
    dist.all_to_all_single(scale_in, scale)
    partial = _dequantize(q_in, scale_in).view(world, rows, -1).sum(dim=0)
    # Shot 2: all-gather of the re-quantized reduced chunks.
    q2, scale2 = _quantize(partial)
    q_all = q2.new_empty(world * rows, q2.shape[1])
    scale_all = scale2.new_empty(world * rows, scale2.shape[1])
    dist.all_gather_into_tensor(q_all, q2)
    dist.all_gather_into_tensor(scale_all, scale2)
    return _dequantize(q_all, scale_all).to(torch.bfloat16)


def oracle(shape, world_size, inputs_by_rank):
    total = sum(inputs[0].double() for inputs in inputs_by_rank).to(torch.bfloat16)
    return [total.clone() for _ in range(world_size)]
