"""Expert solution: two-shot all-reduce, data moved by the copy engines, reduction on the SMs.

1. push: chunk q of the input goes to slot `rank` of peer q's buffer (copy engine over NVLink);
2. barrier; each rank sums its own chunk with the W-1 received slots (one local SM kernel, fp32
   accumulation in source-rank order) into its buffer's "reduced" region;
3. barrier; each rank pulls the other reduced chunks from their owners (copy engine over NVLink)
   while a side stream copies its own reduced chunk into its output (local, overlapped).
Regions are double-buffered by call parity, so the next call needs no trailing barrier.
"""

import torch
import torch.distributed as dist

from problems._symm import Workspace, compile_kernels, i32, i64, launch, ptr

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(512)
sum_slots(const uint4* __restrict__ own, const u64* srcs, uint4* __restrict__ reduced, int rank, int world,
          long long n16) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) {
        uint4 v[8];
        #pragma unroll
        for (int s = 0; s < 8; ++s)
            if (s < world) v[s] = s == rank ? own[i] : reinterpret_cast<const uint4*>(srcs[s])[i];
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        #pragma unroll
        for (int s = 0; s < 8; ++s)
            if (s < world) add8(acc, v[s]);
        reduced[i] = pack8(acc);
    }
}
"""

_workspace = Workspace()
_pointer_tables: dict[tuple, torch.Tensor] = {}
_side_streams: dict[int, torch.cuda.Stream] = {}


@torch.no_grad()
def solution(x):
    world, rank = dist.get_world_size(), dist.get_rank()
    assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.numel() % (8 * world) == 0
    chunk = x.numel() // world
    cbytes = chunk * 2
    region = (world + 1) * cbytes  # W receive slots + the reduced chunk, per parity
    ws = _workspace.ensure(2 * region, x.device)
    parity = ws.next_parity()
    base = parity * region
    flat = x.view(-1)
    out = torch.empty_like(x)
    out_flat = out.view(-1)
    for step in range(1, world):
        q = (rank + step) % world
        ws.peer_view(q, chunk, x.dtype, base + rank * cbytes).copy_(flat[q * chunk:(q + 1) * chunk])
    ws.handle.barrier(channel=0)

    # Receive-slot addresses per (workspace, parity, size); the input is a kernel argument, so a new
    # input never costs a host-to-device copy of a table inside the call.
    key = (ws.buffer.data_ptr(), parity, chunk)
    table = _pointer_tables.get(key)
    if table is None:
        mine = ws.handle.buffer_ptrs[rank]
        table = torch.tensor([mine + base + s * cbytes for s in range(world)], dtype=torch.int64, device=x.device)
        if len(_pointer_tables) > 64:  # sizes come and go; keep the cache bounded
            _pointer_tables.clear()
        _pointer_tables[key] = table
    kernel = compile_kernels(SOURCE, ("sum_slots",))["sum_slots"]
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    launch(kernel, 2 * sms, 512, (ptr(flat.data_ptr() + rank * cbytes), ptr(table.data_ptr()),
                                  ptr(ws.handle.buffer_ptrs[rank] + base + world * cbytes), i32(rank), i32(world),
                                  i64(chunk // 8)))
    main = torch.cuda.current_stream()
    side = _side_streams.setdefault(x.device.index, torch.cuda.Stream(device=x.device))
    side.wait_stream(main)
    with torch.cuda.stream(side):
        out_flat[rank * chunk:(rank + 1) * chunk].copy_(ws.peer_view(rank, chunk, x.dtype, base + world * cbytes))
    ws.handle.barrier(channel=1)
    for q in range(world):
        if q != rank:
            out_flat[q * chunk:(q + 1) * chunk].copy_(ws.peer_view(q, chunk, x.dtype, base + world * cbytes))
    main.wait_stream(side)  # the call ends on the caller's stream with the whole output written
    out.record_stream(side)
    return out
