"""Expert solution: one-shot all-reduce on symmetric memory (for small, latency-bound sizes).

Each rank pushes its input into a slot of every peer's symmetric buffer (posted stores over NVLink),
meets its peers at one per-block barrier, then sums the W slots of its own buffer locally. Slots are
double-buffered by call parity, so no second barrier is needed before the next call overwrites them.
One hop of latency; W-1 times the bytes of a ring, which is cheap at these sizes.
"""

import torch

from problems._symm import Workspace, compile_kernels, grid_for, i32, i64, launch, ptr

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(512)
one_shot_all_reduce(const uint4* __restrict__ x, uint4* __restrict__ out, const u64* bufs, const u64* pads,
                    unsigned int* counters, int rank, int world, long long n16, int parity) {
    unsigned int epoch = block_epoch_begin(counters);
    // Block b owns the same slice on every rank, so a per-block barrier is enough.
    long long per = (n16 + gridDim.x - 1) / gridDim.x;
    long long lo = (long long)blockIdx.x * per, hi = min(n16, lo + per);
    long long my_slot = ((long long)parity * world + rank) * n16;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        uint4 v = x[i];
        for (int step = 0; step < world; ++step) {
            int q = (rank + step) % world;            // stagger destinations across ranks
            reinterpret_cast<uint4*>(bufs[q])[my_slot + i] = v;
        }
    }
    block_barrier(pads, rank, world, blockIdx.x, epoch);
    const uint4* mine = reinterpret_cast<const uint4*>(bufs[rank]) + (long long)parity * world * n16;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        uint4 v[8];
        #pragma unroll
        for (int s = 0; s < 8; ++s)
            if (s < world) v[s] = mine[(long long)s * n16 + i];
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        #pragma unroll
        for (int s = 0; s < 8; ++s)   // source-rank order: every rank computes bitwise the same sum
            if (s < world) add8(acc, v[s]);
        out[i] = pack8(acc);
    }
    block_epoch_end(counters, epoch);
}
"""

_workspace = Workspace()


@torch.no_grad()
def solution(x):
    assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.numel() % 8 == 0
    world = torch.distributed.get_world_size()
    assert world <= 8
    ws = _workspace.ensure(2 * world * x.numel() * 2, x.device)
    kernel = compile_kernels(SOURCE, ("one_shot_all_reduce",))["one_shot_all_reduce"]
    out = torch.empty_like(x)
    n16 = x.numel() // 8
    grid = grid_for(ws, channels=1, want=max(1, min(n16 // 256, 132)))
    launch(kernel, grid, 512, (ptr(x.data_ptr()), ptr(out.data_ptr()), ws.buffers, ws.pads, ws.counters_ptr,
                               i32(ws.rank), i32(ws.world_size), i64(n16), i32(ws.next_parity())))
    return out
