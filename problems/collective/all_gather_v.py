"""All-gather with uneven per-rank token counts (all-gather-v) held on the device."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "all_gather_v",
    "category": "collective",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/distributed/device_communicators/cuda_communicator.py",
        "symbol": "CudaCommunicator.all_gatherv",
    },
    "summary": (
        "Data-parallel ranks hold different numbers of tokens; every rank needs all ranks' valid rows "
        "concatenated in rank order. This is vLLM's all_gatherv (used by the all-gather/reduce-scatter "
        "MoE dispatch under DP attention + expert parallelism), which pynccl runs as one grouped "
        "broadcast per source rank. Inputs: x [max_tokens, hidden] whose first counts[rank] rows are "
        "valid (the rest is garbage), and counts, an int64 [W] device tensor equal on every rank. "
        "Output: [sum(counts), hidden]. The output size depends on device-resident counts. A pure copy: "
        "bit-exact."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"max_tokens": 2048, "hidden": 7168},  # prefill chunk per DP rank, DeepSeek-V3 hidden
        "decode": {"max_tokens": 64, "hidden": 7168},
        "small": {"max_tokens": 16, "hidden": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"max_tokens": 24, "hidden": 96},
        "default": {"max_tokens": 1536, "hidden": 5376},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["max_tokens"], shape["hidden"], generator=generator, device=device)
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank)  # the same counts on every rank
    counts = torch.randint(0, shape["max_tokens"] + 1, (world_size,), generator=shared, device=device)
    return x.to(torch.bfloat16), counts


@torch.no_grad()
def solution(x, counts):
    sizes = counts.tolist()
    rank = dist.get_rank()
    out = x.new_empty(sum(sizes), *x.shape[1:])
    blocks = out.split(sizes)
    blocks[rank].copy_(x[: sizes[rank]])
    for src, block in enumerate(blocks):
        if block.numel():  # every rank skips the same empty blocks
            dist.broadcast(block, src=src)
    return out


def oracle(shape, world_size, inputs_by_rank):
    counts = inputs_by_rank[0][1].tolist()
    full = torch.cat([inputs_by_rank[r][0][: counts[r]] for r in range(world_size)], dim=0)
    return [full.clone() for _ in range(world_size)]


def traffic(shape, world_size):
    """All-gather-v sent directly: each rank sends its valid rows to every peer and receives every peer's.
    counts[r] is uniform on 0..max_tokens, so a rank holds max_tokens / 2 valid rows on average (this is the
    expectation over the metadata). The reference's per-source broadcasts model more than that; HBM: the
    valid rows read once and the whole output written once."""
    row = shape["hidden"] * 2  # bf16
    rows = shape["max_tokens"] / 2
    moved = (world_size - 1) * rows * row
    return {"send_bytes": moved, "recv_bytes": moved, "hbm_bytes": (1 + world_size) * rows * row}
