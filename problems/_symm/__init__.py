"""Shared plumbing for our expert solutions (problems/<category>/solutions/): symmetric-memory
workspaces, NVRTC compilation through CuPy and a cross-GPU barrier, written once.

Expert solutions calibrate the harness and test its GPU path end to end. They are never shown to a
model. Kernels compile with NVRTC (about a second) instead of nvcc through load_inline (tens of
seconds), which matters on a leased GPU machine that keeps nothing between sessions.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

# bf16 conversions by bit manipulation, so the kernels need no CUDA headers under NVRTC.
CUDA_PRELUDE = r"""
typedef unsigned short bf16_t;
typedef unsigned long long u64;

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)0x7fc0u;   // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                              // round to nearest even
    return (bf16_t)(u >> 16);
}
__device__ __forceinline__ void add8(float* acc, const uint4& v) {
    const bf16_t* h = reinterpret_cast<const bf16_t*>(&v);
    #pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += bf2f(h[i]);
}
__device__ __forceinline__ uint4 pack8(const float* acc) {
    uint4 v; bf16_t* h = reinterpret_cast<bf16_t*>(&v);
    #pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = f2bf(acc[i]);
    return v;
}
// Epoch signals: a slot holds the epoch of the last signal sent to it, and epochs only grow, so no
// slot is ever reset. st.release.sys publishes the block's writes (observed by this thread through
// bar.sync) before the flag; ld.acquire.sys makes the peer's writes visible after it. The remote
// operation is one posted store, not a round-trip atomic.
__device__ __forceinline__ void st_release_sys(unsigned int* addr, unsigned int value) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(addr), "r"(value) : "memory");
}
__device__ __forceinline__ unsigned int ld_acquire_sys(const unsigned int* addr) {
    unsigned int value;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(addr) : "memory");
    return value;
}
// This call's epoch for this block: one more than the last (counters live in ordinary device memory).
__device__ __forceinline__ unsigned int block_epoch_begin(unsigned int* counters) {
    __shared__ unsigned int s_epoch;
    if (threadIdx.x == 0) s_epoch = counters[blockIdx.x] + 1u;
    __syncthreads();
    return s_epoch;
}
__device__ __forceinline__ void block_epoch_end(unsigned int* counters, unsigned int epoch) {
    if (threadIdx.x == 0) counters[blockIdx.x] = epoch;
}
// Barrier between the blocks with this block index on every rank, on signal slot `slot`.
__device__ __forceinline__ void block_barrier(const u64* pads, int rank, int world, int slot, unsigned int epoch) {
    __syncthreads();
    if (threadIdx.x < world) {
        int peer = threadIdx.x;
        unsigned int* remote = reinterpret_cast<unsigned int*>(pads[peer]) + (size_t)slot * world + rank;
        const unsigned int* local = reinterpret_cast<const unsigned int*>(pads[rank]) + (size_t)slot * world + peer;
        st_release_sys(remote, epoch);
        while ((int)(ld_acquire_sys(local) - epoch) < 0) {}
    }
    __syncthreads();
}
"""


@functools.cache
def compile_kernels(source: str, names: tuple[str, ...]) -> dict[str, Any]:
    """Compile CUDA source with NVRTC (CuPy) for this GPU; returns {name: kernel}."""
    import cupy

    major, minor = torch.cuda.get_device_capability()
    module = cupy.RawModule(code=CUDA_PRELUDE + source,
                            options=("-std=c++17", f"--gpu-architecture=sm_{major}{minor}"))
    return {name: module.get_function(name) for name in names}


def launch(kernel: Any, grid: int, block: int, args: tuple, shared_mem: int = 0) -> None:
    """Launch on torch's current stream, so kernels order with the caller's other work."""
    import cupy

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    kernel((grid,), (block,), args, stream=stream, shared_mem=shared_mem)


def ptr(value: int) -> Any:
    import numpy

    return numpy.uint64(value)


class Workspace:
    """A symmetric buffer of at least `nbytes` on every rank, and the pointers kernels need.

    Grows (collectively: every rank calls with the same size, as solution() calls do) and is kept
    across calls, so rendezvous stays out of the timed call after the first.
    """

    def __init__(self) -> None:
        self.nbytes = 0
        self.buffer: torch.Tensor | None = None
        self.handle: Any = None
        self.counters: torch.Tensor | None = None  # per-block barrier epochs (see block_epoch_begin)
        self.calls = 0  # host-side call count: the parity of double-buffered workspaces

    def ensure(self, nbytes: int, device: torch.device) -> Workspace:
        if nbytes <= self.nbytes:
            return self
        import torch.distributed._symmetric_memory as symm_mem

        self.buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        world = dist.group.WORLD
        assert world is not None  # the ranks' process group is up before any workspace is made
        self.handle = symm_mem.rendezvous(self.buffer, group=world)
        # A new allocation brings fresh (zeroed) signal pads, so the epochs restart too.
        self.counters = torch.zeros(1024, dtype=torch.int32, device=device)
        self.nbytes = nbytes
        return self

    def next_parity(self) -> int:
        """0, 1, 0, ... per call: alternate halves so a call never overwrites what a peer may still
        read from the previous one (it passed that call's barrier, so it finished the one before)."""
        self.calls += 1
        return self.calls & 1

    def peer_view(self, rank: int, numel: int, dtype: torch.dtype, offset_bytes: int) -> torch.Tensor:
        """A tensor over `rank`'s symmetric buffer (for copy-engine transfers)."""
        assert offset_bytes % torch.empty(0, dtype=dtype).element_size() == 0
        return self.handle.get_buffer(rank, (numel,), dtype, offset_bytes // torch.empty(0, dtype=dtype).element_size())

    @property
    def counters_ptr(self) -> Any:
        assert self.counters is not None
        return ptr(self.counters.data_ptr())

    @property
    def rank(self) -> int:
        return int(self.handle.rank)

    @property
    def world_size(self) -> int:
        return int(self.handle.world_size)

    @property
    def buffers(self) -> Any:
        """Device pointer to the array of every rank's buffer address."""
        return ptr(self.handle.buffer_ptrs_dev)

    @property
    def pads(self) -> Any:
        return ptr(self.handle.signal_pad_ptrs_dev)

    def slots(self) -> int:
        """Signal slots (uint32) per rank: the barrier's capacity of blocks x channels x peers."""
        import torch.distributed._symmetric_memory as symm_mem

        getter = getattr(symm_mem, "get_signal_pad_size", None)
        return int(getter() if getter else 2048) // 4


def grid_for(workspace: Workspace, channels: int, want: int) -> int:
    """Blocks per launch: as many as wanted, within the signal pad (one slot per block, channel,
    peer) and no more than the GPU's SMs, so every block of every rank is resident at once and the
    per-block barriers cannot wait on a block that was never scheduled."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    capacity = workspace.slots() // (channels * workspace.world_size)
    return max(1, min(want, capacity, sms))


def i32(value: int) -> Any:
    import numpy

    return numpy.int32(value)


def i64(value: int) -> Any:
    import numpy

    return numpy.int64(value)


def f32(value: float) -> Any:
    import numpy

    return numpy.float32(value)
