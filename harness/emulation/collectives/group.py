"""The host collectives' process group: every torch.distributed operation NCCL serves, with NCCL's
shapes and refusals, for ranks that share a GPU (or run on CPU). Rank side; torch and the standard library.

A Python subclass of torch.distributed.ProcessGroup, as torch's own test suite makes one
(test_c10d_pypg.py): the registered creator returns it and torch uses it as the group itself, so both
torch.distributed's Python functions and the C++ paths that reach a group through its virtual methods
(functional collectives) land here. This class is the group's identity and a table: each operation torch
calls is a function of reductions.py, movement.py or p2p.py over the group's exchange.Exchange (its
links, sequence numbers and checks). CUDA tensors are staged through host memory: read on the current
stream (the host waits for it, where NCCL's stream would), moved over links.Links, reduced on the host in
rank order, and written back on the current stream. Exact, and the same code runs on CPU tensors.

Semantics kept from NCCL (and checked against gloo on CPU in tests/harness/emulation/test_host_collectives.py):
- all_gather's list form accepts outputs of different sizes (each the size of that rank's input), the
  tensor form any output shape of W times the input's elements (stacked or concatenated);
- reduce_scatter's list form accepts uneven inputs, the tensor form W times the output's elements;
- all_to_all_single takes dim-0 splits (empty: equal, and dim 0 must divide), all_to_all any sizes;
- reduce writes the root's tensor only; gather and scatter move data to and from the root only;
- send and recv match in order per pair of ranks (tags are ignored, as NCCL ignores them), irecv and
  batch_isend_irecv never block before wait();
- a collective returns once its outputs are written (async_op=True gets a completed Work), which is
  what NCCL's stream order guarantees to any code that uses the outputs after wait();
- errors NCCL raises (dtype, contiguity, sizes, bitwise reductions on CUDA) are raised here too; ranks
  that call different collectives, or the same one with different sizes, get an error naming both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.emulation.collectives import movement, p2p, reductions
from harness.emulation.collectives.exchange import Exchange

BACKEND = "pkbhost"
_profiler_enabled: Callable[[], bool] = torch._C._autograd._profiler_enabled  # whether a torch profiler records
# torch's stubs give ProcessGroup's methods their Python-facing overloads; a subclass implements the
# methods torch's C++ side calls (allreduce(tensors, opts), ...), so the base is typed as Any here.
_ProcessGroup: Any = dist.ProcessGroup

# What torch calls -> the function that serves it. Names from torch 2.11 (`_allgather_base`,
# `_reduce_scatter_base`, `alltoall_base`) and 2.13 both; every call shows in a profile under its
# function's name ("pkbhost:allgather"): torch's profiler records no c10d operator for a backend written
# in Python, and harness.measure.profiling finds communication by these names.
OPERATIONS: dict[str, Callable[..., Any]] = {
    "allreduce": reductions.allreduce,
    "allreduce_coalesced": reductions.allreduce,
    "reduce": reductions.reduce,
    "reduce_scatter": reductions.reduce_scatter,
    "reduce_scatter_single": reductions.reduce_scatter_single,
    "_reduce_scatter_base": reductions.reduce_scatter_single,
    "reduce_scatter_single_coalesced": reductions.reduce_scatter_single_coalesced,
    "reduce_scatter_tensor_coalesced": reductions.reduce_scatter_single_coalesced,
    "broadcast": movement.broadcast,
    "allgather": movement.allgather,
    "allgather_coalesced": movement.allgather,
    "all_gather_single": movement.all_gather_single,
    "_allgather_base": movement.all_gather_single,
    "all_gather_single_coalesced": movement.all_gather_single_coalesced,
    "allgather_into_tensor_coalesced": movement.all_gather_single_coalesced,
    "alltoall": movement.alltoall,
    "all_to_all_single": movement.all_to_all_single,
    "alltoall_base": movement.all_to_all_single,
    "gather": movement.gather,
    "scatter": movement.scatter,
    "barrier": movement.barrier,
    "send": p2p.send,
    "recv": p2p.recv,
    "recv_anysource": p2p.recv_anysource,
}


class HostProcessGroup(_ProcessGroup):  # type: ignore[misc]  # a base typed Any (above)
    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._x = Exchange(store, rank, size, timeout)
        self._name = ""
        self._desc = ""

    def getBackendName(self) -> str:
        return BACKEND

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def _get_sequence_number_for_group(self) -> int:
        """Every operation this group ran here (the harness's collective monitor reads it)."""
        return self._x.ops

    @property
    def bytes_sent(self) -> int:
        return self._x.links.bytes_sent

    def abort(self) -> None:
        self._x.links.close()

    def shutdown(self) -> None:
        self._x.links.close()


def _entry(name: str, fn: Callable[..., Any]) -> Any:
    """An operation as torch calls it: named in profiles, its host work on one torch thread.

    Why one thread: the staging copies and reductions are small, and torch's intra-op pool (as many threads
    as cores, in every rank) oversubscribes the cores the ranks share. Measured on the 2-core CPU machine
    (benchmarks/host_collectives.py): all_reduce of 256 KiB took 29 ms with the default pool and 0.8 ms on
    one thread. The caller's setting is put back before the operation returns."""
    label = f"{BACKEND}:{fn.__name__}"

    @functools.wraps(fn)
    def call(self: HostProcessGroup, *args: Any, **kwargs: Any) -> Any:
        threads = torch.get_num_threads()
        if threads != 1:
            torch.set_num_threads(1)
        try:
            with self._x.links.owned():  # this thread reads the connections until it returns (links.py)
                if not _profiler_enabled():  # the label costs about a sixth of a small call: only for a profile
                    return fn(self._x, *args, **kwargs)
                with torch.profiler.record_function(label):
                    return fn(self._x, *args, **kwargs)
        finally:
            if threads != 1:
                torch.set_num_threads(threads)
    call.__name__ = name
    return call


for _name, _fn in OPERATIONS.items():
    setattr(HostProcessGroup, _name, _entry(_name, _fn))


def create(store: Any, rank: int, size: int, timeout: timedelta) -> HostProcessGroup:
    """torch.distributed's creator for the backend (Backend.register_backend)."""
    return HostProcessGroup(store, rank, size, timeout)
