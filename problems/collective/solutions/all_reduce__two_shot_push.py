"""Expert solution: two-shot all-reduce, reduce-scatter by copy engine, all-gather by SM stores.

1. push: chunk q of the input goes to slot `rank` of peer q's receive region (copy engine, NVLink);
2. barrier; one SM kernel sums this rank's chunk (its own input plus the W-1 received slots, fp32 in
   source-rank order) and stores the result twice at once: into this rank's output and, over NVLink,
   into slot `rank` of every peer's gather region. The reduction hides under the remote stores, so
   the link carries the second half of the data without a separate pull phase;
3. barrier; each rank copies the W-1 gathered chunks from its own gather region into its output
   (local HBM copies).
The all_reduce__two_shot_copy_engine variant pulls the reduced chunks after a local-only reduction;
this one trades that phase for posted remote stores. Regions are double-buffered by call parity.
"""

import torch
import torch.distributed as dist

from problems._symm import Workspace, compile_kernels, i32, i64, launch, ptr

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(512)
sum_and_scatter(const uint4* __restrict__ own, const u64* srcs, const u64* dsts, uint4* __restrict__ out,
                int rank, int world, long long n16) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) {
        uint4 v[8];
        #pragma unroll
        for (int s = 0; s < 8; ++s)
            if (s < world) v[s] = s == rank ? own[i] : reinterpret_cast<const uint4*>(srcs[s])[i];
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        #pragma unroll
        for (int s = 0; s < 8; ++s)
            if (s < world) add8(acc, v[s]);
        uint4 r = pack8(acc);
        #pragma unroll
        for (int d = 0; d < 8; ++d)
            if (d < world && d != rank) reinterpret_cast<uint4*>(dsts[d])[i] = r;
        out[i] = r;
    }
}
"""

_workspace = Workspace()
_pointer_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _tables(ws: Workspace, rank: int, world: int, base: int, cbytes: int,
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Device arrays of the workspace addresses the kernel reads and writes, per (workspace, parity,
    size). Nothing per input or output goes in them: those are kernel arguments, so a call never
    waits on a host-to-device copy of a new table."""
    key = (ws.buffer.data_ptr(), base, cbytes)
    cached = _pointer_tables.get(key)
    if cached is None:
        ptrs = ws.handle.buffer_ptrs
        srcs = [ptrs[rank] + base + s * cbytes for s in range(world)]  # entry `rank` unused: own input
        gather = base + world * cbytes + rank * cbytes  # slot `rank` of each peer's gather region
        dsts = [ptrs[d] + gather for d in range(world)]  # entry `rank` unused: own result goes to `out`
        cached = (torch.tensor(srcs, dtype=torch.int64, device=device),
                  torch.tensor(dsts, dtype=torch.int64, device=device))
        if len(_pointer_tables) > 64:  # sizes come and go; keep the cache bounded
            _pointer_tables.clear()
        _pointer_tables[key] = cached
    return cached


@torch.no_grad()
def solution(x):
    world, rank = dist.get_world_size(), dist.get_rank()
    assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.numel() % (8 * world) == 0
    chunk = x.numel() // world
    cbytes = chunk * 2
    region = 2 * world * cbytes  # W receive slots + W gather slots, per parity
    ws = _workspace.ensure(2 * region, x.device)
    base = ws.next_parity() * region
    flat = x.view(-1)
    out = torch.empty_like(x)
    out_flat = out.view(-1)
    for step in range(1, world):
        q = (rank + step) % world
        ws.peer_view(q, chunk, x.dtype, base + rank * cbytes).copy_(flat[q * chunk:(q + 1) * chunk])
    ws.handle.barrier(channel=0)

    srcs, dsts = _tables(ws, rank, world, base, cbytes, x.device)
    kernel = compile_kernels(SOURCE, ("sum_and_scatter",))["sum_and_scatter"]
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    launch(kernel, 2 * sms, 512, (ptr(x.data_ptr() + rank * cbytes), ptr(srcs.data_ptr()), ptr(dsts.data_ptr()),
                                   ptr(out.data_ptr() + rank * cbytes), i32(rank), i32(world), i64(chunk // 8)))
    ws.handle.barrier(channel=1)
    for q in range(world):
        if q != rank:
            out_flat[q * chunk:(q + 1) * chunk].copy_(
                ws.peer_view(rank, chunk, x.dtype, base + world * cbytes + q * cbytes))
    return out
