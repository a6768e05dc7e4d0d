"""All-to-all with uneven splits from a device-resident [W, W] split matrix: MoE token dispatch."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_to_all_v",
    "category": "collective",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/mappings.py",
        "symbol": "all_to_all",
    },
    "summary": (
        "Expert-parallel token dispatch: each rank holds [tokens, hidden] routed token copies already "
        "grouped by destination rank, and splits[src, dst] (an int64 [W, W] device tensor, equal on every "
        "rank, each row summing to tokens) says how many rows src sends to dst. Rank r's output is the "
        "rows it receives, grouped by source rank: [sum(splits[:, r]), hidden]. This is Megatron's "
        "all_to_all with input/output split sizes (dist.all_to_all_single), called by "
        "MoEAlltoAllTokenDispatcher; the splits come from a random, uneven routing. The output size "
        "depends on device-resident metadata. A pure copy: bit-exact."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 8192, "hidden": 4096},  # 4096 tokens x top-2, Mixtral-sized hidden
        "decode": {"tokens": 1024, "hidden": 7168},  # 128 tokens x top-8, DeepSeek-V3 hidden
        "small": {"tokens": 32, "hidden": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 48, "hidden": 96},
        "default": {"tokens": 6144, "hidden": 3072},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["tokens"], shape["hidden"], generator=generator, device=device)
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank)  # the same split matrix on every rank
    rows = []
    for _ in range(world_size):
        # Uneven expert load: each source routes its tokens with its own random destination weights.
        weights = torch.rand(world_size, generator=shared, device=device) + 0.05
        dest = torch.multinomial(weights, shape["tokens"], replacement=True, generator=shared)
        rows.append(torch.bincount(dest, minlength=world_size))
    return x.to(torch.bfloat16), torch.stack(rows).to(torch.int64)


@torch.no_grad()
def solution(x, splits):
    matrix = splits.tolist()
    rank = dist.get_rank()
    send = matrix[rank]
    recv = [row[rank] for row in matrix]
    out = x.new_empty(sum(recv), *x.shape[1:])
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
    return out


def oracle(shape, world_size, inputs_by_rank):
    matrix = inputs_by_rank[0][1].tolist()
    sent = [inputs_by_rank[src][0].split(matrix[src]) for src in range(world_size)]  # sent[src][dst]
    return [torch.cat([sent[src][dst] for src in range(world_size)], dim=0) for dst in range(world_size)]
