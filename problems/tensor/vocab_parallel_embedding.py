"""Vocab-parallel embedding lookup: mask ids outside this rank's vocab range, look up, all-reduce."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

PROBLEM = {
    "name": "vocab_parallel_embedding",
    "category": "tensor",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/layers.py",
        "symbol": "VocabParallelEmbedding.forward",
    },
    "summary": (
        "Megatron's VocabParallelEmbedding, the input embedding of a tensor-parallel LLM: the table is "
        "sharded along the vocabulary, rank r holding rows [r*V/W, (r+1)*V/W). Every rank sees the same "
        "global token ids; it looks up the ids in its range, zeroes the rows of the others, and an "
        "all-reduce sums the W partial tables so every rank has the full [tokens, hidden] embedding. Each "
        "output row has exactly one non-zero contributor, so a kernel only has to move each row from its "
        "owner, half an all-reduce's traffic. Default: Llama-3 vocabulary (128256), hidden 8192, 4096 tokens."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "vocab": 128256, "hidden": 8192},
        "decode": {"tokens": 64, "vocab": 128256, "hidden": 8192},
        "small": {"tokens": 16, "vocab": 64, "hidden": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-2, "rtol": 1e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "vocab": 64, "hidden": 48},
        "default": {"tokens": 3072, "vocab": 128256, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    # Token ids are the same global ids on every rank: drawn from the shared seed.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    ids = torch.randint(0, shape["vocab"], (shape["tokens"],), generator=shared, device=device)
    weight = torch.randn(shape["vocab"] // world_size, shape["hidden"], generator=generator, device=device)
    return ids, weight.to(torch.bfloat16)


@torch.no_grad()
def solution(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    per_rank = weight.shape[0]
    start = dist.get_rank() * per_rank
    outside = (ids < start) | (ids >= start + per_rank)
    local_ids = (ids - start).masked_fill(outside, 0)
    out = F.embedding(local_ids, weight)
    out[outside, :] = 0
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def oracle(shape, world_size, inputs_by_rank):
    table = torch.cat([inp[1] for inp in inputs_by_rank], dim=0)
    out = table[inputs_by_rank[0][0]]
    return [out.clone() for _ in range(world_size)]


def traffic(shape, world_size):
    # Each row needs only to travel from its owner: about (W-1)/W of the output arrives at every rank.
    t, h = shape["tokens"], shape["hidden"]
    row_bytes = t * h * 2
    moved = row_bytes * (world_size - 1) // world_size
    return {
        "send_bytes": moved,
        "recv_bytes": moved,
        "hbm_bytes": t * 8 + row_bytes // world_size + row_bytes,
        "flops": 0,
    }
