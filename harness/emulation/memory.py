"""Symmetric allocations: one device allocation per `empty` call, laid out [signal pad | data], exported
with CUDA IPC so every rank can map it. Torch tensors over raw device memory, without copies.

The signal pad sits in front of the data, as in torch's CUDA backend, and is zeroed (and waited for)
before the allocation is returned, so it is zero before any peer can see it. Allocations are never
freed: a peer may map one until its process ends, and rank processes end with their evaluation.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from harness.emulation import driver

if TYPE_CHECKING:  # handle imports this module: the name is for annotations only
    from harness.emulation.handle import EmulatedSymmetricMemory

DEFAULT_SIGNAL_PAD_BYTES = 2048  # torch's default (CUDASymmetricMemory's signal_pad_size)
DATA_ALIGNMENT = 4096  # the data starts page-aligned after the pad, like torch's layout


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def tensor_at(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor viewing `nbytes` at `ptr` on `device`. Non-owning: the memory outlives it."""
    storage = torch._C._construct_storage_from_data_pointer(ptr, device, nbytes)
    out = torch.empty(0, dtype=torch.uint8, device=device)
    out.set_(storage, 0, (nbytes,), (1,))
    return out


def typed_view(ptr: int, capacity_bytes: int, sizes: tuple[int, ...], dtype: torch.dtype, storage_offset: int,
               device: torch.device, what: str) -> torch.Tensor:
    """`sizes` elements of `dtype` starting `storage_offset` elements into the region at `ptr`, with
    torch's bounds rule (the view must fit in the region)."""
    element = torch.empty(0, dtype=dtype).element_size()
    numel = 1
    for s in sizes:
        if s < 0:
            raise RuntimeError(f"{what}: negative size in {list(sizes)}")
        numel *= s
    if storage_offset < 0:
        raise RuntimeError(f"{what}: negative storage_offset {storage_offset}")
    needed = (storage_offset + numel) * element
    if needed > capacity_bytes:
        raise RuntimeError(f"{what}: the requested size ({needed} bytes, offset included) exceeds the "
                           f"allocated size ({capacity_bytes} bytes)")
    raw = tensor_at(ptr + storage_offset * element, max(numel * element, 1), device)
    return raw[: numel * element].view(dtype).view(sizes)


@dataclass
class Allocation:
    """One rank's symmetric allocation on its own device."""

    device: torch.device
    base: int
    pad_bytes: int
    data_offset: int
    data_bytes: int
    ipc_handle: bytes
    # group name -> handle (rendezvous is cached)
    handles: dict[str, EmulatedSymmetricMemory] = field(default_factory=dict)

    @property
    def data_ptr(self) -> int:
        return self.base + self.data_offset

    def contains(self, ptr: int) -> bool:
        return self.data_ptr <= ptr < self.data_ptr + max(self.data_bytes, 1)


class Registry:
    """Every allocation of this process, found by any data pointer inside it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._allocations: list[Allocation] = []

    def add(self, allocation: Allocation) -> None:
        with self._lock:
            at = bisect.bisect(self._starts, allocation.data_ptr)
            self._starts.insert(at, allocation.data_ptr)
            self._allocations.insert(at, allocation)

    def find(self, ptr: int) -> Allocation | None:
        with self._lock:
            at = bisect.bisect(self._starts, ptr) - 1
            if at >= 0 and self._allocations[at].contains(ptr):
                return self._allocations[at]
            return None

    def __len__(self) -> int:
        return len(self._allocations)


def allocate(nbytes: int, device: torch.device, pad_bytes: int) -> Allocation:
    """A zero-padded, IPC-exportable allocation of `nbytes` data bytes on CUDA `device`."""
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", ordinal)
    torch.cuda.init()  # the primary context must exist (torch's) before the driver calls use it
    data_offset = round_up(pad_bytes, DATA_ALIGNMENT)
    total = data_offset + round_up(max(nbytes, 1), 16)
    base = driver.alloc(ordinal, total)
    driver.memset_zero(ordinal, base, data_offset)
    return Allocation(device=device, base=base, pad_bytes=pad_bytes, data_offset=data_offset, data_bytes=nbytes,
                      ipc_handle=driver.ipc_export(ordinal, base))
