"""The functions of torch.distributed._symmetric_memory, emulated: what `install` puts in place of
torch's. Signatures follow torch 2.11-2.13.

State lives in one `Emulation` object per process (its allocations, peer mappings, the store and the
signal-pad size); `install` creates it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from harness.emulation import driver, memory, rendezvous
from harness.emulation.errors import NotAvailableInEmulation
from harness.emulation.handle import EmulatedSymmetricMemory, handle_for
from harness.emulation.multicast_windows import MulticastWindows

if TYPE_CHECKING:  # a NewType of str, needed for annotations only
    from torch.distributed.distributed_c10d import GroupName


class Emulation:
    """This process's symmetric memory. `store`: where ranks exchange IPC handles (None: the default
    process group's store, looked up at the first rendezvous)."""

    def __init__(self, store: Any = None) -> None:
        self._store = store
        self.registry = memory.Registry()
        self.mappings = rendezvous.PeerMappings()
        self.signal_pad_size = memory.DEFAULT_SIGNAL_PAD_BYTES
        self._lock = threading.Lock()
        self._sequence: dict[str, int] = {}  # group name -> rendezvous calls so far (keys of the exchange)
        self._workspaces: dict[str, tuple[torch.Tensor, EmulatedSymmetricMemory]] = {}
        self.multicast = MulticastWindows()

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = dist.distributed_c10d._get_default_store()
        return self._store

    # -- torch.distributed._symmetric_memory ------------------------------------------------------
    def empty(self, *size: Any, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
        if len(size) == 1 and isinstance(size[0], Sequence):
            size = tuple(size[0])
        shape = tuple(int(s) for s in size)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        device = torch.get_default_device() if device is None else torch.device(device)
        if device.type != "cuda":
            raise RuntimeError(f"symm_mem.empty: symmetric memory lives on a CUDA device, not {device}")
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        allocation = memory.allocate(nbytes, device, self.signal_pad_size)
        self.registry.add(allocation)
        raw = memory.tensor_at(allocation.data_ptr, max(nbytes, 1), allocation.device)
        return raw[:nbytes].view(dtype).view(shape)

    def rendezvous(self, tensor: torch.Tensor, group: Any) -> EmulatedSymmetricMemory:
        from torch._C._distributed_c10d import _resolve_process_group  # dist.distributed_c10d's, the same object

        group_name = _group_name(group)
        # GroupName is a NewType of str: at run time a group's name is the plain string.
        pg = _resolve_process_group(cast("GroupName", group_name))
        allocation = self.registry.find(tensor.data_ptr())
        if allocation is None:
            raise RuntimeError("rendezvous: the tensor was not allocated with symm_mem.empty")
        if group_name in allocation.handles:
            return allocation.handles[group_name]
        rank, world_size = dist.get_rank(pg), dist.get_world_size(pg)
        with self._lock:
            sequence = self._sequence.get(group_name, 0)
            self._sequence[group_name] = sequence + 1
        ordinal = allocation.device.index
        assert ordinal is not None
        offset = tensor.data_ptr() - allocation.data_ptr
        mine = rendezvous.PeerRecord(rank=rank, pid=os.getpid(), device_uuid=driver.device_uuid(ordinal),
                                     ipc_handle=allocation.ipc_handle.hex(), pad_bytes=allocation.pad_bytes,
                                     data_offset=allocation.data_offset, data_bytes=allocation.data_bytes,
                                     tensor_offset=offset)
        prefix = f"{rendezvous.KEY_ROOT}/{group_name}/{sequence}"
        records = rendezvous.exchange(self.store, prefix, mine, world_size)
        rendezvous.validate(records)
        bases = [self.mappings.base_of(r, ordinal, allocation.base if r.rank == rank else None) for r in records]
        handle = handle_for(allocation, rank=rank, world_size=world_size, group_name=group_name,
                            buffer_ptrs=[b + r.data_offset + r.tensor_offset for b, r in zip(bases, records)],
                            signal_pad_ptrs=bases, offset=offset, multicast=self.multicast.base_for)
        allocation.handles[group_name] = handle
        return handle

    def is_symm_mem_tensor(self, tensor: torch.Tensor) -> bool:
        return self.registry.find(tensor.data_ptr()) is not None

    def get_symm_mem_workspace(self, group_name: str, min_size: int) -> EmulatedSymmetricMemory:
        """A per-group workspace of at least `min_size` bytes, grown collectively (torch's helper)."""
        held = self._workspaces.get(group_name)
        if held is None or held[1].buffer_size < min_size:
            device = torch.device("cuda", torch.cuda.current_device())
            buffer = self.empty(min_size, dtype=torch.uint8, device=device)
            held = (buffer, self.rendezvous(buffer, group_name))
            self._workspaces[group_name] = held
        return held[1]

    def set_signal_pad_size(self, size: int) -> None:
        if len(self.registry):
            raise RuntimeError("set_signal_pad_size: symmetric memory was already allocated; set the size first")
        if size <= 0 or size % 4:
            raise RuntimeError(f"set_signal_pad_size: {size} is not a positive multiple of 4 bytes")
        self.signal_pad_size = int(size)

    def get_signal_pad_size(self) -> int:
        return self.signal_pad_size


def _group_name(group: Any) -> str:
    from torch._C._distributed_c10d import ProcessGroup

    if isinstance(group, str):
        return group
    if isinstance(group, ProcessGroup):
        return str(group.group_name)
    raise TypeError(f"rendezvous: unsupported group type: {type(group)}")


# -- what the emulation answers for the rest of the module ----------------------------------------
def set_backend(name: str) -> None:
    if name != "CUDA":
        raise NotAvailableInEmulation("symm_mem_api", f"set_backend({name!r})",
                                      "only the CUDA backend (peer pointers) is emulated")


def get_backend(device: Any) -> str | None:
    return "CUDA" if torch.device(device).type == "cuda" else None


def is_nvshmem_available() -> bool:
    return False


def enable_symm_mem_for_group(group_name: str) -> None:
    """Older torch needed this before a rendezvous; the emulation needs nothing."""


def is_symm_mem_enabled_for_group(group_name: str) -> bool:
    return True


def refusing(kind: str, api: str, why: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise NotAvailableInEmulation(kind, api, why)

    refused.__name__ = refused.__qualname__ = api.rsplit(".", 1)[-1]
    refused.__pkb_emulation_refusal__ = True  # type: ignore[attr-defined]
    return refused
