"""Hands out devices to concurrent evaluations so that two candidates are never run on the same GPUs at once.

Samples run in threads; every evaluation that touches a device (a check, a benchmark, a profile, the
final scoring) first takes a lease. On CUDA the visible GPUs are cut into fixed groups of W (0-1, 2-3,
... for W=2; leftovers stay idle) and a lease holds one whole group, so a timing never shares a GPU or
its links with another candidate; fixed groups also keep every candidate of a run on the same GPU
pairs. On CPU a lease is a slot of a bounded semaphore, so a 2-core machine does not run five rank
groups at once and time them all badly. With `ranks_per_gpu` N > 1 (emulation, harness.emulation) a group
is ceil(W / N) GPUs and the lease names every rank's GPU, N ranks on each (0, 0, 1, 1 for W=4, N=2).

Leases are handed out first come, first served: a long run's last samples are not starved by the ones that
keep asking. With `shared_evaluations` K > 1 (CUDA, runs without timing only), up to K *shared* leases hold
the same group at once: an untimed evaluation mostly starts processes while it holds its GPUs (one H200,
2026-12-02: the lease held for nearly all of a 25-minute replay, the GPU idle at most samples), and a
neighbour cannot change a verdict that it could not have caused (agent.executors.local judges the others
again alone). An exclusive lease (a re-judge, a profile) waits until its group is empty; which request goes
next is agent.lease_order's policy (exclusive ones first, shared ones beside a lease held for long). A lease
says whether another evaluation held its GPUs at any moment while it did (`overlapped`).

Memory is admitted apart from devices (`MemoryGate`, one per process, shared by every scheduler and executor
of it): an evaluation waits until the sum of the memory budgets of the evaluations running fits the host's
available memory (MemAvailable in /proc/meminfo, read when the gate is made), so concurrent evaluations
never ask the node for more than it has. An evaluation's budget is its candidate sandbox's memory limit
(harness.launch.sandbox.budget) and as much again for its reference pool. One larger than the whole
capacity runs alone. The gate is taken before the devices, always in that order.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agent import lease_order
from harness import cancel
from harness.emulation import layout
from harness.launch.sandbox.limits import HOST_RESERVE, meminfo

CANCEL_POLL_S = 0.5  # how often a wait for a lease looks whether the process was interrupted


class SchedulerError(RuntimeError):
    """The devices cannot serve the requested world size; one line."""


@dataclass
class Lease:
    gpus: list[int] | None  # physical GPU indices, one per rank (repeated when ranks share one); None on CPU
    ranks: int  # the world size the lease serves
    started: float = field(default_factory=time.perf_counter)
    held_s: float = 0.0  # set when the lease is returned
    waited_s: float = 0.0  # how long the request queued before the lease was granted
    shared: bool = False  # granted as a shared lease (other untimed evaluations may hold the same group)
    overlapped: bool = False  # another evaluation held the same group at some moment of this lease


# A listener hears every grant and return: (event name, fields); the runner writes them to events.jsonl, so a
# run stopped mid-way still says which evaluations queued and which held the devices.
LeaseListener = Callable[[str, dict[str, object]], None]


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


class MemoryGate:
    """Admits evaluations while the sum of their memory budgets fits `capacity` bytes (see the module)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0  # bytes of the evaluations admitted now
        self.running = 0
        self.peak = 0  # the most bytes held at once (for tests and the event log)
        self._lock = threading.Condition()

    @classmethod
    def measured(cls, meminfo_path: Path = Path("/proc/meminfo")) -> MemoryGate:
        """The host's available memory less HOST_RESERVE; where /proc/meminfo cannot be read, 0: evaluations
        then run one at a time (fail closed: nothing assumed)."""
        available = meminfo("MemAvailable", meminfo_path)
        return cls(max(0, (available or 0) - HOST_RESERVE))

    @contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        with self._lock:
            while self.running and self.held + nbytes > self.capacity:
                cancel.check()
                self._lock.wait(timeout=CANCEL_POLL_S)
            self.held += nbytes
            self.running += 1
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._lock:
                self.held -= nbytes
                self.running -= 1
                self._lock.notify_all()


_GATE: MemoryGate | None = None
_GATE_LOCK = threading.Lock()


def memory_gate() -> MemoryGate:
    """This process's gate, measured on first use."""
    global _GATE
    with _GATE_LOCK:
        if _GATE is None:
            _GATE = MemoryGate.measured()
        return _GATE


class DeviceScheduler:
    """Leases of W devices. `lease()` blocks until one is free; use it as a context manager."""

    def __init__(self, device: str, world_size: int, *, gpus: list[int] | None = None,
                 cpu_slots: int | None = None, ranks_per_gpu: int = 1, shared_evaluations: int = 1,
                 long_hold_s: float = lease_order.LONG_HOLD_S, listener: LeaseListener | None = None,
                 memory: MemoryGate | None = None) -> None:
        if world_size < 1:
            raise SchedulerError(f"world size must be at least 1, got {world_size}")
        if ranks_per_gpu < 1:
            raise SchedulerError(f"ranks per GPU must be at least 1, got {ranks_per_gpu}")
        if shared_evaluations < 1:
            raise SchedulerError(f"evaluations per GPU must be at least 1, got {shared_evaluations}")
        if shared_evaluations > 1 and device != "cuda":
            raise SchedulerError("evaluations share GPUs only on CUDA; on CPU the rank slots are the concurrency")
        self.device = device
        self.world_size = world_size
        self.ranks_per_gpu = ranks_per_gpu
        self.shared_evaluations = shared_evaluations
        self.long_hold_s = long_hold_s
        self.listener = listener
        self.memory = memory or memory_gate()  # evaluations' memory, admitted before their devices
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
        self._holders: list[list[Lease]] = [[] for _ in self.groups]  # live leases per group
        self._exclusive: set[int] = set()  # groups held by an exclusive lease
        self._queue: list[lease_order.Request] = []  # waiting requests, oldest first
        self._tickets = itertools.count()
        self.in_use: dict[int, list[int] | None] = {}  # group index -> gpus, for tests and the event log

    @property
    def shares(self) -> bool:
        """Whether untimed evaluations may hold a group together."""
        return self.shared_evaluations > 1

    @property
    def capacity(self) -> int:
        """How many evaluations can run at once (shared leases counted: a run that shares times nothing)."""
        return len(self.groups) * self.shared_evaluations

    def _next_grant(self) -> tuple[int, int] | None:
        """(ticket, group) of the request served now, by agent.lease_order's policy."""
        groups = [lease_order.Group(started=tuple(lease.started for lease in held), exclusive=i in self._exclusive)
                  for i, held in enumerate(self._holders)]
        return lease_order.next_grant(self._queue, groups, room=self.shared_evaluations, now=time.perf_counter(),
                                      long_hold_s=self.long_hold_s)

    def _tell(self, event: str, fields: dict[str, object]) -> None:
        if self.listener is not None:
            try:
                self.listener(event, fields)
            except Exception:  # a log that cannot be written never takes the devices down with it
                pass

    @contextmanager
    def lease(self, *, shared: bool = False, label: str = "") -> Iterator[Lease]:
        """A lease of one group, first come first served. `shared`: the evaluation is untimed and may hold the
        group beside others (only when the scheduler shares); `label` names it to the listener."""
        shared = shared and self.shares
        asked = time.perf_counter()
        with self._lock:
            request = lease_order.Request(ticket=next(self._tickets), shared=shared)
            self._queue.append(request)
            ahead = sum(1 for other in self._queue[:-1] if shared or not other.shared)  # served before it
        self._tell("lease_asked", {"label": label, "shared": shared, "ahead": ahead})
        with self._lock:
            try:
                # the wait times out so a Ctrl-C is seen, and so a hold turning long (lease_order) is noticed
                while (grant := self._next_grant()) is None or grant[0] != request.ticket:
                    cancel.check()  # Ctrl-C: a sample waiting for devices never gets them
                    self._lock.wait(timeout=CANCEL_POLL_S)
            finally:
                self._queue.remove(request)
                self._lock.notify_all()  # the next in line looks again
            index = grant[1]
            # granted while an exclusive request waits: beside a lease held for long (lease_order)
            beside_long_hold = shared and any(not other.shared for other in self._queue)
            lease = Lease(gpus=None if self.groups[index] is None else list(self.groups[index]),
                          ranks=self.world_size, waited_s=time.perf_counter() - asked, shared=shared)
            neighbours = self._holders[index]
            for other in neighbours:
                other.overlapped = True
            lease.overlapped = bool(neighbours)
            neighbours.append(lease)
            if not shared:
                self._exclusive.add(index)
            self.in_use[index] = self.groups[index]
            waiting = len(self._queue)
        self._tell("lease_granted", {"label": label, "gpus": lease.gpus, "shared": shared,
                                     "waited_s": round(lease.waited_s, 3), "holders": len(neighbours),
                                     "waiting": waiting, "beside_long_hold": beside_long_hold})
        try:
            yield lease
        finally:
            lease.held_s = time.perf_counter() - lease.started
            with self._lock:
                self._holders[index].remove(lease)
                self._exclusive.discard(index)
                if not self._holders[index]:
                    del self.in_use[index]
                self._lock.notify_all()
            self._tell("lease_returned", {"label": label, "gpus": lease.gpus, "shared": shared,
                                          "held_s": round(lease.held_s, 3), "overlapped": lease.overlapped})
