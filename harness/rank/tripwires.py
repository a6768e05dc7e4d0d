"""Tripwires inside a rank: what a rank can report against itself. Rank side; torch + stdlib.

A candidate runs in this process and can undo anything done here, so nothing in this module can clear
a candidate: the verdict, the times and the flags that matter are decided by the judge, outside. What
these do is catch the careless or the lazy cheat cheaply and name what it did:

- the collective monitor: torch.distributed's functions wrapped before any candidate is imported, and
  every process group's sequence number read around each candidate call; each collective is written
  to the harness's events pipe the moment it is seen (winding a counter back later changes nothing;
  closing the pipe stops further reports, which the out-of-process counters still see).
- the guard: identity (and code) of the callables the worker relies on (ctypes among them), captured
  before the candidate is imported and verified after every request. It cannot see changes made in C.
- the mode check (`active_modes`): a TorchFunctionMode or TorchDispatchMode left active after a request
  (torch's own default-device context excepted). The harness's reads of outputs run with modes off
  (harness.rank.pristine), so a mode gains nothing there; one left active is still worth naming.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch.distributed as dist

from harness.rank.pristine import active_modes

_write = os.write  # bound before any candidate exists

__all__ = ["COLLECTIVES", "CollectiveMonitor", "Guard", "active_modes"]

COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "_all_gather_base",
    "all_gather_coalesced", "all_gather_object", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
    "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv", "isend",
    "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list", "barrier", "monitored_barrier",
)


class CollectiveMonitor:
    """Counts torch.distributed traffic inside candidate calls.

    Two independent signals: wrappers around the torch.distributed functions (they name the call), and
    the sequence numbers of every process group (they count any collective, whatever the API:
    functional collectives, ProcessGroup methods, torch.ops). A candidate's first call on a rank is
    set-up (rendezvous of symmetric memory, for instance) and not counted.
    """

    def __init__(self, events_fd: int | None = None) -> None:
        self.active = False
        self.calls: Counter[str] = Counter()
        self.sequence = 0
        self.events_fd = events_fd

    def report(self, name: str) -> None:
        """Send one event to the harness now: a counter the candidate winds back later changes nothing."""
        if self.events_fd is not None:
            try:
                _write(self.events_fd, name.encode() + b"\n")
            except OSError:
                self.events_fd = None

    def install(self) -> None:
        """Wrap the module-level functions, once, before any candidate is imported."""
        from torch.distributed import distributed_c10d as c10d

        wrapped: dict[int, Callable[..., Any]] = {}
        for namespace in (dist, c10d):
            for name in COLLECTIVES:
                fn = getattr(namespace, name, None)
                if not callable(fn) or getattr(fn, "__pkb_monitor__", False):
                    continue
                if id(fn) not in wrapped:
                    wrapped[id(fn)] = self._wrap(name, fn)
                setattr(namespace, name, wrapped[id(fn)])

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        monitor = self

        def counted(*args: Any, **kwargs: Any) -> Any:
            if monitor.active:
                monitor.calls[name] += 1
                monitor.report(name)
            return fn(*args, **kwargs)

        counted.__name__ = counted.__qualname__ = name
        counted.__doc__ = fn.__doc__
        # Markers on the function object (functools.wraps sets __wrapped__ the same way); a function's type
        # declares neither.
        counted.__wrapped__ = fn  # type: ignore[attr-defined]
        counted.__pkb_monitor__ = True  # type: ignore[attr-defined]
        return counted

    @staticmethod
    def sequence_total() -> int:
        try:
            from torch.distributed import distributed_c10d as c10d

            groups = list(c10d._world.pg_map)
        except Exception:  # private API: the wrappers still count
            return 0
        total = 0
        for group in groups:
            try:
                # torch's stub (_C/_distributed_c10d.pyi) lists only the setter; the getter exists at runtime.
                total += int(group._get_sequence_number_for_group())  # type: ignore[attr-defined]
            except Exception:
                continue
        return total

    def watch(self, fn: Callable[..., Any], counted: Callable[[], bool]) -> Callable[..., Any]:
        """`fn` with its collectives counted when `counted()` says so at call time."""
        monitor = self

        def call(*args: Any) -> Any:
            if not counted():
                return fn(*args)
            before = monitor.sequence_total()
            monitor.active = True
            try:
                return fn(*args)
            finally:
                monitor.active = False
                delta = max(0, monitor.sequence_total() - before)
                monitor.sequence += delta
                for _ in range(min(delta, 1000)):
                    monitor.report("sequence")

        return call

    def state(self) -> tuple[Counter[str], int]:
        return self.calls.copy(), self.sequence

    def since(self, state: tuple[Counter[str], int]) -> dict[str, Any]:
        calls, sequence = state
        names = {k: v - calls.get(k, 0) for k, v in self.calls.items() if v - calls.get(k, 0) > 0}
        seq = self.sequence - sequence
        return {"calls": names, "sequence": seq} if names or seq else {}



# -- the guard --------------------------------------------------------------------------------------
_MISSING = object()

_WATCHED: dict[str, tuple[str, ...] | None] = {
    # None: every value in the namespace; a tuple: those names (third-party namespaces change lazily).
    "time": ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "sleep"),
    "builtins": ("isinstance", "len", "max", "min", "abs", "float", "int", "sum", "getattr", "setattr",
                 "type", "range", "zip", "sorted", "any", "all", "hasattr", "callable", "id", "repr", "str"),
    "torch": ("equal", "isnan", "isinf", "isfinite", "where", "zeros", "zeros_like", "empty", "empty_like",
              "arange", "stack", "frombuffer", "randn", "rand", "randint", "Generator", "manual_seed",
              "no_grad", "tensor", "full", "Tensor", "float64", "bfloat16"),
    "torch.cuda": ("synchronize", "Event", "Stream", "current_stream", "_sleep", "stream", "set_device",
                   "mem_get_info", "get_device_properties", "empty_cache", "device_count"),
    "torch.distributed": COLLECTIVES + ("get_rank", "get_world_size", "is_initialized", "new_group"),
    "torch.distributed.distributed_c10d": COLLECTIVES + ("get_rank", "get_world_size", "_get_default_group"),
    "json": None,
    "json.encoder": None,
    # What reads and writes a candidate's outputs binds these at import (harness.rank.pristine); a candidate
    # that rebinds them anyway (ctypes.string_at, memmove) is named here, as a second line.
    "ctypes": None,
    "os": ("open", "write", "close", "replace", "read", "fstat"),
    "hmac": None,
    "harness.rank.timed": None,
    "harness.rank.calls": None,
    "harness.rank.transport": None,
    "harness.rank.tripwires": None,
    "harness.rank.pristine": None,
    "harness.rank.refill": None,
    "harness.common.integrity": None,
    "harness.common.flags": None,
    "harness.common.channel": None,
    "harness.rank.candidate": None,
    "harness.problems.problem": None,
    "harness.common.seeds": None,
    "harness.common.failures": None,
    "harness.common.spin": None,
}

_WATCHED_CLASSES: dict[str, tuple[str, ...]] = {
    "torch.Tensor": ("clone", "copy_", "detach", "to", "cpu", "contiguous", "view", "reshape", "fill_",
                     "sum", "any", "all", "abs", "float", "double", "numel", "element_size", "flatten",
                     "nonzero", "item", "tolist", "numpy", "is_floating_point", "is_complex", "argmax",
                     "max", "__eq__", "__ne__", "__gt__", "__le__", "__sub__", "__add__", "__mul__",
                     "__or__", "__xor__", "__and__", "__invert__", "bitwise_not_", "logical_not_", "data_ptr",
                     "equal", "view_as", "__getitem__", "__setitem__", "shape", "dtype", "device"),
    "torch.cuda.Event": ("record", "elapsed_time", "synchronize", "query", "wait", "__init__", "__new__"),
    "torch.cuda.Stream": ("wait_stream", "wait_event", "record_event", "synchronize", "query", "__new__"),
    "torch.distributed.ProcessGroup": ("allreduce", "allgather", "_allgather_base", "reduce_scatter",
                                       "_reduce_scatter_base", "alltoall", "alltoall_base", "broadcast",
                                       "reduce", "gather", "scatter", "send", "recv", "barrier",
                                       "_get_sequence_number_for_group", "rank", "size"),
    "json.JSONEncoder": ("__init__", "encode", "iterencode", "default"),
    "multiprocessing.connection.Connection": ("send", "send_bytes", "recv", "recv_bytes", "_send",
                                              "_send_bytes", "_recv", "_recv_bytes", "_write", "_read",
                                              "fileno", "poll", "close"),
}


def _resolve(path: str) -> Any:
    """A module or class from its dotted path, importing nothing new."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            value: Any = module
            for attr in parts[cut:]:
                value = getattr(value, attr, None)
            return value
    return None


def _lookup(owner: Any, name: str) -> Any:
    """The raw value behind owner.name: a class's MRO dicts (so shadowing in a subclass shows), or a
    module's dict. No descriptor runs and nothing the candidate defines is called."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            found = klass.__dict__.get(name, _MISSING)
            if found is not _MISSING:
                return found
        return _MISSING
    return owner.__dict__.get(name, _MISSING)


class Guard:
    """What the worker relies on, captured before any candidate code runs, verified after each request.

    Catches a candidate that replaced a function or class (time.perf_counter, torch.cuda.Event,
    dist.all_reduce, the harness's own comparison, the reply connection) or swapped a Python function's
    code object or defaults in place, or left a trace/profile hook. It cannot see C-level patching.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any, str, Any, Any, Any]] = []
        self.captured = False

    def capture(self, extra: Iterable[tuple[str, Any]] = ()) -> None:
        self.entries = []
        for path, names in _WATCHED.items():
            self._watch(path, _resolve(path), names)
        for path, names in _WATCHED_CLASSES.items():
            self._watch(path, _resolve(path), names)
        for label, owner in extra:
            self._watch(label, owner, None)
        self.captured = True

    def _watch(self, label: str, owner: Any, names: tuple[str, ...] | None) -> None:
        if owner is None:
            return
        if names is None:
            names = tuple(k for k in owner.__dict__ if not (k.startswith("__") and k.endswith("__")))
        for name in names:
            value = _lookup(owner, name)
            if value is _MISSING:
                continue
            code = getattr(value, "__code__", None) if callable(value) else None
            defaults = getattr(value, "__defaults__", None) if code is not None else None
            self.entries.append((f"{label}.{name}", owner, name, value, code, defaults))

    def violations(self) -> list[str]:
        """Names whose value, code or defaults changed since capture, and installed trace hooks."""
        changed = []
        for label, owner, name, value, code, defaults in self.entries:
            now = _lookup(owner, name)
            if now is not value:
                changed.append(label)
            elif code is not None and (value.__code__ is not code or value.__defaults__ is not defaults):
                changed.append(f"{label} (code)")
        if sys.gettrace() is not None:
            changed.append("sys.settrace hook")
        if sys.getprofile() is not None:
            changed.append("sys.setprofile hook")
        return changed


