"""Hands out devices to concurrent evaluations so that two candidates are never run on the same GPUs at once.

Samples run in threads; every evaluation that touches a device (a check, a benchmark, a profile, the
final scoring) first takes a lease. On CUDA the visible GPUs are cut into fixed groups of W (0-1, 2-3,
... for W=2; leftovers stay idle) and a lease holds one whole group, so a timing never shares a GPU or
its links with another candidate; fixed groups also keep every candidate of a run on the same GPU
pairs. On CPU a lease is a slot of a bounded semaphore, so a 2-core machine does not run five rank
groups at once and time them all badly. With `ranks_per_gpu` N > 1 (emulation, harness.emulation) a group
is ceil(W / N) GPUs and the lease names every rank's GPU, N ranks on each (0, 0, 1, 1 for W=4, N=2).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from harness import cancel
from harness.emulation import layout

CANCEL_POLL_S = 0.5  # how often a wait for a lease looks whether the process was interrupted


class SchedulerError(RuntimeError):
    """The devices cannot serve the requested world size; one line."""


@dataclass
class Lease:
    gpus: list[int] | None  # physical GPU indices, one per rank (repeated when ranks share one); None on CPU
    ranks: int  # the world size the lease serves
    started: float = field(default_factory=time.perf_counter)
    held_s: float = 0.0  # set when the lease is returned


def visible_gpus(env: dict[str, str] | None = None, count: int | None = None) -> list[int]:
    """Physical indices of the GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else 0..count-1."""
    env = dict(os.environ) if env is None else env
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is not None and text.strip():
        try:
            return [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise SchedulerError(f"CUDA_VISIBLE_DEVICES={text!r}: give GPU indices, not UUIDs") from None
    if count is None:
        import torch

        count = torch.cuda.device_count()
    return list(range(count))


class DeviceScheduler:
    """Leases of W devices. `lease()` blocks until one is free; use it as a context manager."""

    def __init__(self, device: str, world_size: int, *, gpus: list[int] | None = None,
                 cpu_slots: int | None = None, ranks_per_gpu: int = 1) -> None:
        if world_size < 1:
            raise SchedulerError(f"world size must be at least 1, got {world_size}")
        if ranks_per_gpu < 1:
            raise SchedulerError(f"ranks per GPU must be at least 1, got {ranks_per_gpu}")
        self.device = device
        self.world_size = world_size
        self.ranks_per_gpu = ranks_per_gpu
        self._lock = threading.Condition()
        if device == "cuda":
            gpus = visible_gpus() if gpus is None else list(gpus)
            size = layout.gpus_needed(world_size, ranks_per_gpu)
            if len(gpus) < size:
                shared = f" at {ranks_per_gpu} ranks per GPU" if ranks_per_gpu > 1 else ""
                raise SchedulerError(f"world size {world_size}{shared} needs {size} GPUs; {len(gpus)} visible")
            self.groups = [layout.rank_gpus(world_size, ranks_per_gpu, gpus[i:i + size])
                           for i in range(0, len(gpus) - size + 1, size)]
        else:
            slots = cpu_slots if cpu_slots is not None else max(1, (os.cpu_count() or 1) // world_size)
            if slots < 1:
                raise SchedulerError(f"cpu_slots must be at least 1, got {slots}")
            self.groups = [None] * slots  # type: ignore[list-item]
        self._free = list(range(len(self.groups)))
        self.in_use: dict[int, list[int] | None] = {}  # group index -> gpus, for tests and the event log

    @property
    def capacity(self) -> int:
        """How many evaluations can run at once."""
        return len(self.groups)

    @contextmanager
    def lease(self) -> Iterator[Lease]:
        with self._lock:
            while not self._free:
                cancel.check()  # Ctrl-C: a sample waiting for devices never gets them
                self._lock.wait(timeout=CANCEL_POLL_S)
            index = self._free.pop(0)
            self.in_use[index] = self.groups[index]
        lease = Lease(gpus=None if self.groups[index] is None else list(self.groups[index]), ranks=self.world_size)
        try:
            yield lease
        finally:
            lease.held_s = time.perf_counter() - lease.started
            with self._lock:
                del self.in_use[index]
                self._free.append(index)
                self._free.sort()
                self._lock.notify()
