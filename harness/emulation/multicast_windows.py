"""This process's emulated multicast windows: what `handle.multicast_ptr` returns, and the device table
the rewritten kernels read (layout: harness.emulation.multicast_layout).

A window is a reserved range of device addresses (cuMemAddressReserve), never mapped: no multicast object
is created and nothing can be read or written there. Kernels built from a rewritten source translate an
address in it to every rank's buffer through the table; each built module is pointed at the table once,
through the `pkb_mc_bind` the rewrite injects (harness.emulation.build_hook calls `bind`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from harness.emulation import driver
from harness.emulation import multicast_layout as layout
from harness.emulation.errors import NotAvailableInEmulation
from harness.emulation.multimem_rewrite import BIND_SYMBOL

if TYPE_CHECKING:  # handle imports this module's owner; the name is for annotations only
    from harness.emulation.handle import EmulatedSymmetricMemory

Reserve = Callable[[int, int], int]  # (bytes, device ordinal) -> base address of an unmapped range


def reserve_on_device(nbytes: int, ordinal: int) -> int:
    return driver.reserve_address(ordinal, nbytes, layout.GRANULE)


def _signed(word: int) -> int:
    return word - (1 << 64) if word >= 1 << 63 else word


class MulticastWindows:
    """The windows of one process, keyed by the handle's group and this rank's buffer."""

    def __init__(self, reserve: Reserve = reserve_on_device) -> None:
        self._reserve = reserve
        self._lock = threading.Lock()
        self._windows: list[layout.Window] = []
        self._bases: dict[tuple[str, int], int] = {}
        self._table: torch.Tensor | None = None

    @property
    def windows(self) -> list[layout.Window]:
        return list(self._windows)

    def base_for(self, handle: EmulatedSymmetricMemory) -> int:
        """The handle's multicast address: a window over its buffer on every rank, made at first use."""
        key = (handle.group_name, handle.buffer_ptrs[handle.rank])
        with self._lock:
            if key in self._bases:
                return self._bases[key]
            if len(self._windows) >= layout.MAX_WINDOWS:
                raise NotAvailableInEmulation("multicast", "handle.multicast_ptr",
                                              f"more than {layout.MAX_WINDOWS} multicast windows in one process")
            if handle.world_size > layout.MAX_RANKS:
                raise NotAvailableInEmulation("multicast", "handle.multicast_ptr",
                                              f"more than {layout.MAX_RANKS} ranks share a multicast window")
            base = self._reserve(layout.reserved_bytes(handle.buffer_size), _ordinal(handle.device))
            self._windows.append(layout.Window(base, handle.buffer_size, tuple(handle.buffer_ptrs)))
            self._bases[key] = base
            self._write(handle.device)
            return base

    def table(self, device: torch.device) -> torch.Tensor:
        """The device table (allocated at first use, rewritten whenever a window is added)."""
        with self._lock:
            if self._table is None:
                self._write(device)
            assert self._table is not None  # written just above
            return self._table

    def _write(self, device: torch.device) -> None:
        words = torch.tensor([_signed(w) for w in layout.table_words(self._windows)], dtype=torch.int64)
        if self._table is None:
            self._table = torch.zeros(layout.TABLE_WORDS, dtype=torch.int64, device=device)
        self._table.copy_(words)
        if self._table.device.type == "cuda":
            # Kernels on any stream may read it next: the new window is in place before this returns.
            torch.cuda.synchronize(self._table.device)

    def bind(self, library: str) -> None:
        """Point the module built at `library` (a rewritten source) at this process's table."""
        device = torch.device("cuda", torch.cuda.current_device())
        address = int(self.table(device).data_ptr())
        try:
            binder = getattr(ctypes.CDLL(library), BIND_SYMBOL)
        except (OSError, AttributeError) as exc:
            raise NotAvailableInEmulation("multicast", BIND_SYMBOL,
                                          f"the rewritten extension has no table binder ({exc})") from None
        binder.argtypes = [ctypes.c_uint64]
        binder.restype = ctypes.c_int
        status = binder(address)
        if status != 0:
            raise NotAvailableInEmulation("multicast", BIND_SYMBOL, f"binding the window table failed (CUDA error "
                                          f"{status})")


def _ordinal(device: torch.device) -> int:
    if device.type != "cuda":
        return -1  # a test's handle on the CPU: its reserve function is a stand-in
    return device.index if device.index is not None else torch.cuda.current_device()
