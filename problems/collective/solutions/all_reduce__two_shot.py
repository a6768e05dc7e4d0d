"""Expert solution: two-shot all-reduce on symmetric memory (for large, bandwidth-bound sizes).

Reduce-scatter then all-gather, both by loads over NVLink: rank r sums chunk r of every rank's staged
input, publishes it, then copies the other reduced chunks from their owners. Each rank moves
2(W-1)/W of the data over the interconnect, as a ring does, but in two hops instead of 2(W-1).
"""

import torch

from problems._symm import Workspace, compile_kernels, grid_for, i32, i64, launch, ptr

SOURCE = r"""
#define UNROLL 4     // gather phase
#define UNROLL_R 2   // reduce phase: W loads in flight per step already
extern "C" __global__ void __launch_bounds__(256)
two_shot_all_reduce(const uint4* __restrict__ x, uint4* __restrict__ out, const u64* bufs, const u64* pads, unsigned int* counters,
                    int rank, int world, long long n16, long long chunk) {
    unsigned int epoch = block_epoch_begin(counters);
    // Buffer layout per rank: [staged input: world*chunk][reduced chunk: chunk] (uint4 units).
    long long per = (chunk + gridDim.x - 1) / gridDim.x;
    long long lo = (long long)blockIdx.x * per, hi = min(chunk, lo + per);
    uint4* mine = reinterpret_cast<uint4*>(bufs[rank]);
    for (int c = 0; c < world; ++c)
        for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            long long idx = c * chunk + i;
            if (idx < n16) mine[idx] = x[idx];
        }
    block_barrier(pads, rank, world, blockIdx.x, epoch);
    // Reduce-scatter: my chunk, summed over every rank's staged input.
    long long base = (long long)rank * chunk;
    for (long long i0 = lo + threadIdx.x; i0 < hi; i0 += (long long)blockDim.x * UNROLL_R) {
        uint4 v[UNROLL_R][8];
        #pragma unroll
        for (int u = 0; u < UNROLL_R; ++u) {
            long long i = i0 + (long long)u * blockDim.x;
            #pragma unroll
            for (int q = 0; q < 8; ++q)
                if (q < world && i < hi && base + i < n16) v[u][q] = reinterpret_cast<const uint4*>(bufs[q])[base + i];
        }
        #pragma unroll
        for (int u = 0; u < UNROLL_R; ++u) {
            long long i = i0 + (long long)u * blockDim.x;
            if (i >= hi || base + i >= n16) continue;
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            #pragma unroll
            for (int q = 0; q < 8; ++q)
                if (q < world) add8(acc, v[u][q]);
            uint4 r = pack8(acc);
            mine[(long long)world * chunk + i] = r;
            out[base + i] = r;
        }
    }
    block_barrier(pads, rank, world, gridDim.x + blockIdx.x, epoch);
    // All-gather: every other chunk from its owner's reduced region.
    for (int step = 1; step < world; ++step) {
        int q = (rank + step) % world;   // stagger peers so they are not all read at once
        const uint4* theirs = reinterpret_cast<const uint4*>(bufs[q]) + (long long)world * chunk;
        long long qbase = (long long)q * chunk;
        for (long long i0 = lo + threadIdx.x; i0 < hi; i0 += (long long)blockDim.x * UNROLL) {
            uint4 v[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                long long i = i0 + (long long)u * blockDim.x;
                if (i < hi && qbase + i < n16) v[u] = theirs[i];
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                long long i = i0 + (long long)u * blockDim.x;
                if (i < hi && qbase + i < n16) out[qbase + i] = v[u];
            }
        }
    }
    block_barrier(pads, rank, world, 2 * gridDim.x + blockIdx.x, epoch);
    block_epoch_end(counters, epoch);
}
"""

_workspace = Workspace()


@torch.no_grad()
def solution(x):
    assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.numel() % 8 == 0
    n16 = x.numel() // 8
    world = torch.distributed.get_world_size()
    chunk = (n16 + world - 1) // world
    ws = _workspace.ensure((world + 1) * chunk * 16, x.device)
    kernel = compile_kernels(SOURCE, ("two_shot_all_reduce",))["two_shot_all_reduce"]
    out = torch.empty_like(x)
    grid = grid_for(ws, channels=3, want=max(1, min(chunk // 256, 132)))
    launch(kernel, grid, 256, (ptr(x.data_ptr()), ptr(out.data_ptr()), ws.buffers, ws.pads, ws.counters_ptr,
                               i32(ws.rank), i32(ws.world_size), i64(n16), i64(chunk)))
    return out
