"""Distributed sample sort (PSRS): regular samples, shared splitters, all-to-all of buckets, local merge."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "distributed_sample_sort",
    "category": "other",
    "source": {
        "codebase": "Heat (helmholtz-analytics/heat, PyTorch + MPI)",
        "path": "heat/core/manipulations.py",
        "symbol": "sort (distributed branch: local pivots, global_pivots, Alltoallv)",
    },
    "summary": (
        "Sorting a float32 key array sharded over W ranks (n keys each) with sample sort by regular "
        "sampling, as Heat's ht.sort does for a split axis: sort locally; take W regular samples at "
        "positions x*n//(W+1), x = 1..W; gather all W*W samples (Heat: Gatherv to rank 0 and Bcast; here "
        "all_gather), sort them and take the W-1 splitters at positions W, 2W, ..., (W-1)W; key v goes to "
        "bucket b = #{splitters <= v} (equal keys go up); exchange bucket sizes (all-to-all of counts), "
        "then the keys (all_to_all_single with those splits); merge the W received sorted runs. Output: "
        "rank b's bucket, sorted, of data-dependent length (Heat additionally rebalances to equal "
        "lengths; that step is left out). Keys are randn with a random per-rank scale and shift, so "
        "buckets are uneven. Default: 16M keys (64 MiB) per rank."
    ),
    "dtype": "float32",
    "shapes": {
        "default": {"keys": 1 << 24},
        "small": {"keys": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"keys": 96},
        "default": {"keys": 12582912},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    scale, shift = (torch.rand(2, generator=generator, device=device) * 2).tolist()
    return (torch.randn(shape["keys"], generator=generator, device=device) * (0.5 + scale) + shift,)


@torch.no_grad()
def solution(keys: torch.Tensor):
    world = dist.get_world_size()
    n = keys.numel()
    local = keys.sort().values
    positions = torch.arange(1, world + 1, device=keys.device) * n // (world + 1)
    samples = torch.empty(world * world, dtype=keys.dtype, device=keys.device)
    dist.all_gather_into_tensor(samples, local[positions].contiguous())
    splitters = samples.sort().values[world : world * world : world]
    bucket = torch.searchsorted(splitters, local, right=True)
    send_counts = torch.bincount(bucket, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    recv = torch.empty(int(recv_counts.sum()), dtype=keys.dtype, device=keys.device)
    dist.all_to_all_single(recv, local, recv_counts.tolist(), send_counts.tolist())
    return recv.sort().values


def oracle(shape, world_size, inputs_by_rank):
    samples = []
    for (keys,) in inputs_by_rank:
        ordered = sorted(keys.tolist())
        n = len(ordered)
        samples += [ordered[x * n // (world_size + 1)] for x in range(1, world_size + 1)]
    samples.sort()
    splitters = torch.tensor([samples[x * world_size] for x in range(1, world_size)], dtype=torch.float32)
    everything = torch.cat([inp[0] for inp in inputs_by_rank]).sort().values
    # bucket b = [splitter b-1, splitter b): bounds are the first positions >= each splitter
    bounds = [0, *torch.searchsorted(everything, splitters).tolist(), everything.numel()]
    return [everything[bounds[b] : bounds[b + 1]].clone() for b in range(world_size)]
