"""The handle `rendezvous` returns: the attributes and methods of torch's `_SymmetricMemory` that
candidates use, over the emulation's own mapped allocations.

Everything is per handle: this rank's index in the group, every rank's buffer and signal-pad address as
seen from this process (a peer on the same GPU is mapped through CUDA IPC), the same addresses as
device arrays for kernels, and the device-side barrier and signals of harness.emulation.signals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from harness.emulation import memory, signals
from harness.emulation.errors import NotAvailableInEmulation


class EmulatedSymmetricMemory:
    """Stands in for torch._C._distributed_c10d._SymmetricMemory (the object rendezvous returns)."""

    def __init__(self, *, rank: int, world_size: int, device: torch.device, group_name: str,
                 buffer_ptrs: Sequence[int], signal_pad_ptrs: Sequence[int], buffer_size: int,
                 signal_pad_size: int, offset: int = 0,
                 multicast: Callable[[EmulatedSymmetricMemory], int] | None = None) -> None:
        if len(buffer_ptrs) != world_size or len(signal_pad_ptrs) != world_size:
            raise ValueError(f"{world_size} ranks need {world_size} buffer and signal-pad pointers")
        self._rank = rank
        self._world_size = world_size
        self._device = device
        self._group_name = group_name
        self._buffer_ptrs = [int(p) for p in buffer_ptrs]
        self._signal_pad_ptrs = [int(p) for p in signal_pad_ptrs]
        self._buffer_size = buffer_size
        self._signal_pad_size = signal_pad_size
        self._offset = offset
        self._multicast = multicast  # the process's windows (harness.emulation.multicast_windows), or refused
        # Device arrays of the W addresses, uploaded once and kept alive with the handle.
        self._buffer_table = torch.tensor(self._buffer_ptrs, dtype=torch.int64, device=device)
        self._pad_table = torch.tensor(self._signal_pad_ptrs, dtype=torch.int64, device=device)

    # -- what torch's handle exposes --------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def buffer_ptrs(self) -> list[int]:
        return list(self._buffer_ptrs)

    @property
    def buffer_ptrs_dev(self) -> int:
        return int(self._buffer_table.data_ptr())

    @property
    def signal_pad_ptrs(self) -> list[int]:
        return list(self._signal_pad_ptrs)

    @property
    def signal_pad_ptrs_dev(self) -> int:
        return int(self._pad_table.data_ptr())

    @property
    def buffer_size(self) -> int:
        return self._buffer_size

    @property
    def signal_pad_size(self) -> int:
        return self._signal_pad_size

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def multicast_ptr(self) -> int:
        """A reserved, unmapped window over every rank's buffer: only kernels whose multimem instructions
        the emulation rewrote can use it (docs/emulation.md, "Multicast")."""
        if self._multicast is None:
            raise NotAvailableInEmulation("multicast", "handle.multicast_ptr",
                                          "NVLink multicast (NVLS) has no single-GPU emulation")
        return self._multicast(self)

    def boxed(self) -> object:
        raise NotAvailableInEmulation("symm_mem_op", "handle.boxed",
                                      "torch's symm_mem operators need torch's own handle")

    def get_buffer(self, rank: int, sizes: Sequence[int] | torch.Size, dtype: torch.dtype,
                   storage_offset: int = 0) -> torch.Tensor:
        self._check_rank(rank, "get_buffer")
        return memory.typed_view(self._buffer_ptrs[rank], self._buffer_size, tuple(sizes), dtype, storage_offset,
                                 self._device, "get_buffer")

    def get_remote_tensor(self, peer: int, sizes: Sequence[int] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return self.get_buffer(peer, sizes, dtype)

    def get_signal_pad(self, rank: int, sizes: Sequence[int] | torch.Size = (), dtype: torch.dtype | None = None,
                       storage_offset: int = 0) -> torch.Tensor:
        self._check_rank(rank, "get_signal_pad")
        dtype = torch.uint32 if dtype is None else dtype
        if len(tuple(sizes)) == 0:  # torch: no sizes means the whole pad
            element = torch.empty(0, dtype=dtype).element_size()
            sizes = ((self._signal_pad_size // element) - storage_offset,)
        return memory.typed_view(self._signal_pad_ptrs[rank], self._signal_pad_size, tuple(sizes), dtype,
                                 storage_offset, self._device, "get_signal_pad")

    def barrier(self, channel: int = 0, timeout_ms: int = 0) -> None:
        self._check_channel(channel)
        signals.barrier(self._ordinal(), self._stream(), self.signal_pad_ptrs_dev, channel, self._rank,
                        self._world_size, timeout_ms)

    def put_signal(self, dst_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        self._check_channel(channel)
        self._check_rank(dst_rank, "put_signal")
        signals.put_signal(self._ordinal(), self._stream(), self.signal_pad_ptrs_dev, dst_rank, channel,
                           self._rank, self._world_size, timeout_ms)

    def wait_signal(self, src_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        self._check_channel(channel)
        self._check_rank(src_rank, "wait_signal")
        signals.wait_signal(self._ordinal(), self._stream(), self.signal_pad_ptrs_dev, src_rank, channel,
                            self._rank, self._world_size, timeout_ms)

    # -- checks with torch's wording --------------------------------------------------------------
    def _check_rank(self, rank: int, what: str) -> None:
        if not 0 <= rank < self._world_size:
            raise RuntimeError(f"{what}: rank {rank} is out of range for world size {self._world_size}")

    def _check_channel(self, channel: int) -> None:
        if channel < 0:
            raise RuntimeError(f"channel for barrier(), put_signal() and wait_signal() must be non-negative "
                               f"(got {channel})")
        channels = self._signal_pad_size // (4 * self._world_size)
        if channel >= channels:
            raise RuntimeError(f"The maximum supported channel for barrier(), put_signal() and wait_signal() is "
                               f"{channels - 1} (got {channel})")

    def _ordinal(self) -> int:
        if self._device.type != "cuda":
            raise RuntimeError("the symmetric-memory barrier and signals run on a CUDA device")
        return self._device.index if self._device.index is not None else torch.cuda.current_device()

    def _stream(self) -> int:
        return int(torch.cuda.current_stream(self._device).cuda_stream)

    def __repr__(self) -> str:
        return (f"EmulatedSymmetricMemory(rank={self._rank}, world_size={self._world_size}, device={self._device}, "
                f"buffer_size={self._buffer_size}, group={self._group_name!r})")


def handle_for(allocation: memory.Allocation, *, rank: int, world_size: int, group_name: str,
               buffer_ptrs: Sequence[int], signal_pad_ptrs: Sequence[int], offset: int,
               multicast: Callable[[EmulatedSymmetricMemory], int] | None = None) -> EmulatedSymmetricMemory:
    return EmulatedSymmetricMemory(rank=rank, world_size=world_size, device=allocation.device,
                                   group_name=group_name, buffer_ptrs=buffer_ptrs,
                                   signal_pad_ptrs=signal_pad_ptrs, buffer_size=allocation.data_bytes - offset,
                                   signal_pad_size=allocation.pad_bytes, offset=offset, multicast=multicast)
