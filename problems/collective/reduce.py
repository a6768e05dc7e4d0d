"""Sum-reduce of a bf16 gradient slice to rank 0: ZeRO-2 sends each gradient partition to its owner."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "reduce",
    "category": "collective",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/runtime/zero/stage_1_and_2.py",
        "symbol": "DeepSpeedZeroOptimizer.average_tensor",
    },
    "summary": (
        "Every rank holds a gradient slice of the same shape; rank 0 (the owner of this partition) needs "
        "the element-wise sum over ranks. This is DeepSpeed ZeRO stage 1/2 gradient reduction "
        "(average_tensor), which reduces each slice of a gradient bucket to the rank owning that "
        "partition with dist.reduce. Output: rank 0 returns the sum; every other rank returns its input "
        "unchanged (what an NCCL reduce leaves in a non-root buffer). Bandwidth bound."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"rows": 4096, "cols": 8192},  # 64 MiB slice
        "small": {"rows": 8, "cols": 64},
    },
    "world_sizes": [2, 4, 8],
    # NCCL rings and gloo accumulate bf16 partial sums: at W=8 that errs by several bf16 ulps of the
    # partial sums (up to ~0.06 on 32M elements), well below the O(1) error of a wrong kernel.
    "tolerance": {"atol": 1e-1, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"rows": 12, "cols": 96},
        "default": {"rows": 3072, "cols": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    g = torch.randn(shape["rows"], shape["cols"], generator=generator, device=device)
    return (g.to(torch.bfloat16),)


@torch.no_grad()
def solution(g):
    out = g.clone()
    dist.reduce(out, dst=0, op=dist.ReduceOp.SUM)
    if dist.get_rank() != 0:
        # gloo uses the non-root buffer as scratch; the specified non-root output is the untouched input.
        return g.clone()
    return out


def oracle(shape, world_size, inputs_by_rank):
    total = sum(inputs[0].double() for inputs in inputs_by_rank).to(torch.bfloat16)
    return [total] + [inputs_by_rank[r][0].clone() for r in range(1, world_size)]
