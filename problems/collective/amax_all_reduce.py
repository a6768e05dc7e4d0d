"""Global fp8 amax reduction: abs-max of an activation plus an amax buffer, max-all-reduced over ranks."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "amax_all_reduce",
    "category": "collective",
    "source": {
        "codebase": "TransformerEngine",
        "path": "transformer_engine/pytorch/fp8.py",
        "symbol": "FP8GlobalStateManager.reduce_and_update_fp8_tensors",
    },
    "summary": (
        "FP8 training needs the same scaling factor on every rank of the amax reduction group, so the "
        "amaxes are max-all-reduced. Transformer Engine's reduce_and_update_fp8_tensors concatenates "
        "every FP8 module's current amaxes into one contiguous fp32 buffer and all-reduces it with "
        "ReduceOp.MAX (reduce_tensor_across_group_op_max). Here the buffer also carries the amax of one "
        "bf16 activation computed on the spot, as TE's current-scaling quantizer does before its own MAX "
        "all-reduce. Inputs: x [tokens, hidden] bf16 and amax, fp32 [num_amax] (positive). Output: fp32 "
        "[1 + num_amax] = max over ranks of cat(max|x|, amax), identical on every rank; exact. The "
        "exchange is 4 KiB and latency-bound; reading x (64 MiB) is HBM-bound."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192, "num_amax": 1023},  # ~80 layers x 4 GEMMs x 3 tensors
        "small": {"tokens": 8, "hidden": 64, "num_amax": 15},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 12, "hidden": 96, "num_amax": 15},
        "default": {"tokens": 3072, "hidden": 6144, "num_amax": 1023},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["tokens"], shape["hidden"], generator=generator, device=device)
    amax = torch.rand(shape["num_amax"], generator=generator, device=device) * 8.0
    return x.to(torch.bfloat16), amax


@torch.no_grad()
def solution(x, amax):
    buf = torch.cat([x.abs().amax().float().view(1), amax.float()])
    dist.all_reduce(buf, op=dist.ReduceOp.MAX)
    return buf


def oracle(shape, world_size, inputs_by_rank):
    x_amax = max(float(inputs[0].float().abs().max()) for inputs in inputs_by_rank)
    buf_amax = torch.stack([inputs[1] for inputs in inputs_by_rank]).amax(dim=0)
    result = torch.cat([torch.tensor([x_amax], dtype=torch.float32), buf_amax.float()])
    return [result.clone() for _ in range(world_size)]
