"""Ring shift on symmetric memory: every rank returns the tensor of its left neighbour, rank (r - 1) % W.

The reference this replaces:

    @torch.no_grad()
    def solution(x):
        rank, world = dist.get_rank(), dist.get_world_size()
        out = torch.empty_like(x)
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        return out

How this candidate works: one kernel per call. Block b of rank r stores its share of x straight into the
right neighbour's symmetric staging buffer (posted stores over NVLink), meets block b of every rank at a
barrier made of signal-pad flags (release on the store, acquire on the load, system scope), then copies
its share of its own staging buffer (written by the left neighbour) into a fresh output. The staging
buffer has two halves used on alternate calls, so one barrier per call is enough: a rank writes a half
again only two calls later, after a barrier every peer reaches only once it has finished reading it.
Setup (allocation, rendezvous, kernel compilation) happens on the first call only.
"""

import cupy
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

CUDA_SRC = r"""
typedef unsigned long long u64;

// Flags between GPUs. Release: every write this thread has observed (the whole block's, after
// __syncthreads) is visible to the other GPU before the flag. Acquire: the peer's writes are visible
// after the flag is read. The peer is another GPU, so the scope must be .sys.
__device__ __forceinline__ void flag_release(unsigned int* flag, unsigned int value) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(flag), "r"(value) : "memory");
}
__device__ __forceinline__ unsigned int flag_acquire(const unsigned int* flag) {
    unsigned int value;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
    return value;
}

// Block b of every rank meets here. Word (b * world + q) of rank p's pad holds the last epoch rank q
// signalled to p for block b. Epochs only grow, so no flag is ever reset.
__device__ void meet_all_ranks(const u64* pads, int rank, int world, unsigned int epoch) {
    __syncthreads();
    if (threadIdx.x < world) {
        const int peer = threadIdx.x;
        unsigned int* to_peer = reinterpret_cast<unsigned int*>(pads[peer]) + blockIdx.x * world + rank;
        const unsigned int* from_peer = reinterpret_cast<const unsigned int*>(pads[rank]) + blockIdx.x * world + peer;
        flag_release(to_peer, epoch);
        while ((int)(flag_acquire(from_peer) - epoch) < 0) { }
    }
    __syncthreads();
}

// src, dst: this rank's input and output; staging[q]: rank q's staging buffer; half: byte offset of the
// half used by this call. A grid-stride loop gives vector i to the same block on every rank (same grid,
// same block size), so block b only ever reads what block b of the left neighbour wrote.
extern "C" __global__ void ring_shift(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                      const u64* staging, const u64* pads, int rank, int world,
                                      long long nbytes, long long half, unsigned int epoch) {
    unsigned char* remote = reinterpret_cast<unsigned char*>(staging[(rank + 1) % world]) + half;
    const unsigned char* local = reinterpret_cast<const unsigned char*>(staging[rank]) + half;
    const long long vectors = nbytes / 16;                   // 16-byte vectors, then a byte tail
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool owns_tail = blockIdx.x == 0;

    for (long long v = first; v < vectors; v += stride)
        reinterpret_cast<uint4*>(remote)[v] = reinterpret_cast<const uint4*>(src)[v];
    if (owns_tail)
        for (long long b = vectors * 16 + threadIdx.x; b < nbytes; b += blockDim.x) remote[b] = src[b];

    meet_all_ranks(pads, rank, world, epoch);

    for (long long v = first; v < vectors; v += stride)
        reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(local)[v];
    if (owns_tail)
        for (long long b = vectors * 16 + threadIdx.x; b < nbytes; b += blockDim.x) dst[b] = local[b];
}
"""

_KERNEL = cupy.RawKernel(CUDA_SRC, "ring_shift", options=("-std=c++17",))  # NVRTC; built per device on first use
THREADS = 512


class _State:
    """What survives between calls: the symmetric staging buffer, its handle and the call counter."""

    def __init__(self) -> None:
        self.half_bytes = 0
        self.buffer = None
        self.handle = None
        self.epoch = 0
        self.retired = []  # earlier buffers stay alive: freeing symmetric memory is not worth the risk

    def ensure(self, nbytes: int, device: torch.device) -> None:
        """Grow the staging buffer. Every rank calls this with the same size at the same call, so the
        rendezvous (a collective) matches up; it never runs once the size is settled."""
        need = (nbytes + 15) // 16 * 16  # halves start 16-byte aligned
        if need <= self.half_bytes:
            return
        if self.buffer is not None:
            self.retired.append((self.buffer, self.handle))
        self.buffer = symm_mem.empty(2 * need, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, dist.group.WORLD)
        self.half_bytes = need
        self.epoch = 0  # epochs restart with the new signal pads: zero ours, then wait until all are zeroed
        with cupy.cuda.Device(device.index):
            cupy.cuda.runtime.memset(self.handle.signal_pad_ptrs[self.handle.rank], 0, _signal_pad_bytes())
        torch.cuda.synchronize(device)
        dist.barrier()  # setup only: no rank signals into a pad that is not zeroed yet


_state = _State()


def _signal_pad_bytes() -> int:
    size_of = getattr(symm_mem, "get_signal_pad_size", lambda: 2048)  # older torch: a fixed 2048 bytes
    return int(size_of())


def _grid(nbytes: int, world: int, device: torch.device) -> int:
    """Blocks per launch: identical on every rank (it depends only on sizes), no more than the SMs so all
    blocks are resident while they wait for each other, and within the signal pad (world words a block)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    pad_words = _signal_pad_bytes() // 4
    wanted = max(1, nbytes // (THREADS * 16 * 4))
    return max(1, min(wanted, sms, pad_words // world))


@torch.no_grad()
def solution(x):
    src = x.contiguous()
    if src.data_ptr() % 16:
        src = src.clone()  # 16-byte vector accesses need an aligned start
    out = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()
    if nbytes == 0:
        return out
    _state.ensure(nbytes, src.device)
    hdl = _state.handle
    _state.epoch += 1
    half = (_state.epoch & 1) * _state.half_bytes  # alternate halves call by call
    grid = _grid(nbytes, hdl.world_size, src.device)
    args = (np.uint64(src.data_ptr()), np.uint64(out.data_ptr()), np.uint64(hdl.buffer_ptrs_dev),
            np.uint64(hdl.signal_pad_ptrs_dev), np.int32(hdl.rank), np.int32(hdl.world_size),
            np.int64(nbytes), np.int64(half), np.uint32(_state.epoch))
    with cupy.cuda.Device(src.device.index):
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(src.device).cuda_stream)
        _KERNEL((grid,), (THREADS,), args, stream=stream)  # torch's current stream: ordered with its work
    return out
