"""Sum-all-reduce of a bf16 activation, the tensor-parallel reduction after a row-parallel layer."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_reduce",
    "category": "collective",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/mappings.py",
        "symbol": "_reduce",
    },
    "summary": (
        "Every rank holds a partial activation of the same shape; each needs the element-wise sum over "
        "ranks. This is Megatron's tensor-parallel all-reduce (_reduce), issued after every "
        "row-parallel linear layer in the forward pass. Sizes span decode (a few tokens: latency bound) "
        "to prefill (thousands of tokens: bandwidth bound)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192},  # 64 MiB: prefill
        "decode": {"tokens": 32, "hidden": 8192},  # 512 KiB: decode step
        "1mib": {"tokens": 64, "hidden": 8192},  # 1 MiB: the top of the latency-bound range
        "large": {"tokens": 16384, "hidden": 8192},  # 256 MiB: bandwidth bound (gradient-bucket sized)
        "1gib": {"tokens": 65536, "hidden": 8192},  # 1 GiB: the roofline calibration point (docs/design.md)
        "small": {"tokens": 8, "hidden": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 12, "hidden": 96},
        "default": {"tokens": 3072, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    # Partial sums scaled so the total is O(1) at any W, like a row-parallel layer's partials; bf16
    # rounding of the sum then stays well inside the tolerance at W = 8.
    x = torch.randn(shape["tokens"], shape["hidden"], generator=generator, device=device) / world_size**0.5
    return (x.to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def oracle(shape, world_size, inputs_by_rank):
    total = sum(inputs[0].double() for inputs in inputs_by_rank)
    return [total.to(torch.bfloat16) for _ in range(world_size)]
