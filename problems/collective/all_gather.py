"""All-gather of a bf16 activation along dim 0: the sequence-parallel gather before a column-parallel GEMM."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_gather",
    "category": "collective",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/mappings.py",
        "symbol": "_gather_along_first_dim",
    },
    "summary": (
        "Every rank holds a [tokens, hidden] slice of the sequence; each needs the full [W*tokens, hidden] "
        "activation, the rank slices concatenated along dim 0 in rank order. This is Megatron's "
        "sequence-parallel all-gather (_gather_along_first_dim), issued before every column-parallel "
        "linear layer. The default is a prefill slice (bandwidth bound); decode is a few tokens per rank "
        "(latency bound). A pure copy: the output must be bit-exact."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 1024, "hidden": 8192},  # 16 MiB per rank in, W*16 MiB out
        "decode": {"tokens": 8, "hidden": 8192},  # 128 KiB per rank
        "small": {"tokens": 8, "hidden": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 12, "hidden": 96},
        "default": {"tokens": 768, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["tokens"], shape["hidden"], generator=generator, device=device)
    return (x.to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    out = x.new_empty(dist.get_world_size() * x.shape[0], *x.shape[1:])
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=0)
    return [full.clone() for _ in range(world_size)]
