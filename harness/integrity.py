"""Integrity: the checks that make a score survive a hostile candidate. Worker-safe: torch + stdlib.

A candidate runs inside the rank worker, so it can do anything that process can: patch functions,
write to its file descriptors, inspect frames. This module holds what the harness does about that
(tests/exploits/README.md says what each measure does and does not stop):

- the reply channel and process hygiene live in harness.channel and harness.pool (every rank pool
  is sealed: signed JSON replies);
- the guard: identity (and code) of the callables the worker relies on, captured before the candidate
  is imported and verified after every request; timing binds its clocks at import;
- the collective monitor: torch.distributed calls and process-group sequence numbers inside candidate
  calls (flag `uses_nccl`: correct, never counted as fast);
- output rules: plain tensors only, snapshots taken on the caller's stream the moment a call returns,
  reference outputs poisoned before they are freed (the `torch.empty` trick reads NaN);
- extra trials: stress (one rank late), a precision probe (inputs whose low bits matter), the audit
  (inputs drawn before the candidate loads, judged in the harness process, see evaluate.py);
- static findings on the source (flags only: runtime checks decide);
- plausibility of timings in the parent (positive, fresh inputs as fast as rotated ones, the roofline).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from harness.compare import flatten
from harness.flags import (  # noqa: F401 - the flags' names, re-exported (harness.flags has no torch)
    AUDIT_FAILED,
    IMPOSSIBLE,
    INPUT_CACHING,
    LAZY_OUTPUT,
    MUTATES_INPUTS,
    OUTPUT_REUSED,
    RACE,
    REDUCED_PRECISION,
    SPAWNED_THREADS,
    SPEEDUP_DISQUALIFIERS,
    STALE_OUTPUT,
    TAMPERING,
    TIMED_OUTPUT_WRONG,
    TIMING_IMPLAUSIBLE,
    UNSYNCHRONIZED_WORK,
    USES_NCCL,
)

# Bound at import, before any candidate exists, so a candidate cannot replace what the checks call.
_cuda_sleep = torch.cuda._sleep
_cuda_synchronize = torch.cuda.synchronize
_sleep = time.sleep

# Trial indices of the extra correctness trials: far from the T ordinary ones and from timing's sets.
STRESS_TRIAL_BASE = 500_000
PROBE_TRIAL = 600_000
AUDIT_TRIAL = 700_000
COMPLETION_TRIAL_OFFSET = 500_000  # added to timing's trial base for the completion-probe calls


@dataclass
class IntegrityConfig:
    """Knobs of the integrity checks; `for_device` gives the defaults. Plain data: it travels to ranks."""

    audit: bool = True  # one trial drawn before the candidate loads, compared in the harness process
    stress_trials: int = 2  # correctness trials with one rank late (trial i delays rank i % W)
    stress_delay_s: float = 0.05  # how late: host sleep on CPU, device spin on GPU
    precision_probe: bool = True  # a trial whose inputs make reduced precision exceed the tolerance
    lazy_delay_s: float = 0.05  # pause before re-reading an output to see whether it still changes
    fresh_iters: int = 5  # timed calls on never-seen inputs, compared with the rotated-input median
    completion_probes: int = 2  # untimed calls after timing, outputs snapshotted at return
    busy_bytes: int = 256 << 20  # GPU: low-priority work kept running around a completion probe
    guard: bool = True  # verify harness and runtime callables after every request
    caching_ratio: float = 1.5  # fresh median above ratio * median + margin reads as input caching
    caching_margin_ms: float = 10.0
    impossible_slack: float = 0.9  # median below slack * roofline bound reads as impossible

    @classmethod
    def for_device(cls, device: str) -> IntegrityConfig:
        if device == "cuda":
            # busy: ~1 ms of short low-priority blocks around a completion probe (fill + multiply, 4 TB/s).
            return cls(stress_delay_s=0.002, lazy_delay_s=0.01, caching_margin_ms=0.02, busy_bytes=1 << 30)
        return cls()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> IntegrityConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})

    @classmethod
    def coerce(cls, value: Any, device: str) -> IntegrityConfig:
        """Accept an IntegrityConfig, a dict or a pydantic model with the same fields, or None."""
        if value is None:
            return cls.for_device(device)
        if isinstance(value, cls):
            return value
        if hasattr(value, "model_dump"):
            value = value.model_dump()
        return cls.from_dict({**cls.for_device(device).to_dict(), **dict(value)})


# -- seeds and the correctness schedule --------------------------------------------------------------
def mixed_seed(seed: int, salt: int) -> int:
    """The run's seed mixed with the evaluation's secret salt: inputs cannot be predicted at import."""
    if not salt:
        return seed
    return int.from_bytes(hashlib.sha256(f"pkb-salt:{seed}:{salt}".encode()).digest()[:6], "little")


class Trial(NamedTuple):
    index: int  # the trial number inputs are drawn from
    kind: str  # "normal", "stress" or "probe"
    late_rank: int = -1  # stress: the rank that starts late


def check_schedule(trials: int, config: IntegrityConfig, world_size: int) -> list[Trial]:
    """Every rank runs exactly this list of calls, pass or fail, so collectives always match."""
    schedule = [Trial(t, "normal") for t in range(trials)]
    schedule += [Trial(STRESS_TRIAL_BASE + i, "stress", i % world_size) for i in range(config.stress_trials)]
    if config.precision_probe:
        schedule.append(Trial(PROBE_TRIAL, "probe"))
    return schedule


def skew(rank: int, trial: Trial, config: IntegrityConfig, device: torch.device, seed: int) -> None:
    """Delay this rank before a stress call: the late rank by the full delay, the others by a little
    jitter. A candidate that reads a peer's buffer before the peer wrote it then reads stale data."""
    jitter = random.Random(f"{seed}:{trial.index}:{rank}").uniform(0.0, 0.1)
    delay = config.stress_delay_s * (1.0 if rank == trial.late_rank else jitter)
    if device.type == "cuda":
        # A device-side spin: this rank's kernels start late although its host is on time.
        _cuda_sleep(int(delay * 1.98e9))
    else:
        _sleep(delay)


# -- outputs ----------------------------------------------------------------------------------------
def output_issue(value: Any) -> str | None:
    """Why an output is not plain data the harness can read now, or None."""
    for where, leaf in flatten(value):
        if isinstance(leaf, torch.Tensor):
            if type(leaf) is not torch.Tensor:  # noqa: E721 - a subclass can compute when it is read
                return f"{where} is a {type(leaf).__module__}.{type(leaf).__name__}, not a plain torch.Tensor"
            if leaf.layout != torch.strided or leaf.device.type not in ("cpu", "cuda"):
                return f"{where} has layout {leaf.layout} on device {leaf.device}: not readable data"
    return None


def snapshot(value: Any) -> Any:
    """A private copy of an output, queued on the current stream (so it sees the output as the caller's
    stream sees it at this moment, not after other streams finish)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(snapshot(v) for v in value)
    return value


@torch.no_grad()
def poison_(value: Any) -> None:
    """Overwrite a reference output before it is freed, with values that never pass a comparison, so a
    candidate that returns uninitialized memory (`torch.empty_like`) cannot find the answer in it."""
    done: set[tuple[int, int]] = set()  # an output listed twice must not be flipped back
    for _, leaf in flatten(value):
        if not isinstance(leaf, torch.Tensor) or leaf.numel() == 0 or (leaf.data_ptr(), leaf.numel()) in done:
            continue
        done.add((leaf.data_ptr(), leaf.numel()))
        if leaf.is_floating_point() or leaf.is_complex():
            leaf.fill_(float("nan"))
        elif leaf.dtype == torch.bool:
            leaf.logical_not_()
        else:
            leaf.bitwise_not_()  # differs from the original in every element


def fingerprint(value: Any, chunk: int = 1 << 24) -> torch.Tensor | None:
    """Two position-weighted sums of every tensor's bytes, on its device: a cheap test that inputs did
    not change without keeping a copy of them (timing's input sets can fill a quarter of the GPU)."""
    parts: list[torch.Tensor] = []
    for _, leaf in flatten(value):
        if not isinstance(leaf, torch.Tensor) or leaf.numel() == 0:
            continue
        raw = leaf.detach().contiguous().reshape(-1).view(torch.uint8)
        for start in range(0, raw.numel(), chunk):
            words = raw[start:start + chunk].to(torch.int64)
            weights = torch.arange(start + 1, start + 1 + words.numel(), device=raw.device) % 1_000_003
            parts += [words.sum(), (words * weights).sum()]
    return torch.stack(parts) if parts else None


def same_fingerprint(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.equal(a, b))


def call_with_snapshots(call: Callable[..., Any], args: tuple, device: torch.device,
                        config: IntegrityConfig) -> tuple[Any, Any, Any]:
    """One call whose outputs are copied on the caller's stream the moment it returns, and again once all
    work on the device is done (GPU) or after a pause (CPU). Returns (live, at_return, later).

    On a GPU the call runs on a high-priority stream while a low-priority stream keeps the SMs busy with
    short blocks: work the candidate left on another stream (low priority by default) waits behind
    them, while the copy queued on the caller's stream is scheduled first, so an output that is not
    complete on the caller's stream at return shows as such, whatever the candidate's kernel durations.
    The candidate's own work on the caller's stream is high priority too and is never starved.
    """
    if device.type != "cuda":
        live = call(*args)
        at_return = snapshot(live) if output_issue(live) is None else None
        _sleep(config.lazy_delay_s)
        return live, at_return, snapshot(live) if at_return is not None else None
    _cuda_synchronize(device)
    caller = torch.cuda.current_stream(device)
    high = torch.cuda.Stream(device=device, priority=-1)
    low = torch.cuda.Stream(device=device, priority=0)
    busy = torch.empty(max(1, config.busy_bytes // 4), dtype=torch.float32, device=device)
    high.wait_stream(caller)
    with torch.cuda.stream(low):
        busy.fill_(1.0)
        busy.mul_(1.0001)  # many short blocks: a steady queue ahead of any other low-priority work
    with torch.cuda.stream(high):
        live = call(*args)
        at_return = snapshot(live) if output_issue(live) is None else None
    _cuda_synchronize(device)
    del busy
    return live, at_return, snapshot(live) if at_return is not None else None


# -- the precision probe ----------------------------------------------------------------------------
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 23}


def precision_probe_inputs(inputs: tuple, dtype: torch.dtype, generator: torch.Generator) -> tuple:
    """The inputs with every tensor of the problem's dtype replaced by values whose low bits matter:
    1 + k * 2^-m (m the dtype's mantissa bits, exact in the dtype), and one element in eight scaled by
    64. An 8-bit path (fp8, or int8 with per-block scales: a block's outlier sets the step) rounds the
    small values by more than any tolerance; the dtype itself represents every one of them exactly.
    All values are positive, so sums do not cancel and a different summation order stays close."""
    bits = _MANTISSA_BITS.get(dtype)
    if bits is None:
        return inputs

    def replace(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == dtype and value.numel() > 0:
            steps = torch.randint(0, 1 << bits, value.shape, generator=generator, device=value.device)
            probe = 1.0 + steps.to(torch.float64) * 2.0 ** -bits
            large = torch.rand(value.shape, generator=generator, device=value.device) < 0.125
            return torch.where(large, probe * 64.0, probe).to(dtype)
        if isinstance(value, (tuple, list)):
            return type(value)(replace(v) for v in value)
        return value

    return tuple(replace(v) for v in inputs)


# -- collectives inside candidate calls -------------------------------------------------------------
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

    def __init__(self) -> None:
        self.active = False
        self.calls: Counter[str] = Counter()
        self.sequence = 0

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
            return fn(*args, **kwargs)

        counted.__name__ = counted.__qualname__ = name
        counted.__doc__ = fn.__doc__
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
                total += int(group._get_sequence_number_for_group())
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
                monitor.sequence += max(0, monitor.sequence_total() - before)

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
    "hmac": None,
    "harness.compare": None,
    "harness.timing": None,
    "harness.integrity": None,
    "harness.flags": None,
    "harness.channel": None,
    "harness.candidate": None,
    "harness.problem": None,
    "harness.seeds": None,
    "harness.failures": None,
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


# -- static findings --------------------------------------------------------------------------------
_INTROSPECTION = {"_getframe", "_current_frames", "f_back", "f_locals", "f_globals", "currentframe",
                  "get_objects", "get_referrers", "get_referents", "settrace", "setprofile", "getouterframes"}
_PATCH_ROOTS = {"time", "builtins", "harness", "json", "hmac", "multiprocessing", "sys", "gc", "importlib"}
_PATCH_WORDS = {"Event", "Stream", "synchronize", "elapsed_time", "record", "perf_counter", "monotonic",
                "Tensor", "distributed", "all_reduce", "all_gather", "barrier", "solution", "compare"}
_FD_CALLS = {"write", "dup", "dup2", "fdopen", "writev", "pwrite", "sendfile"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def static_scan(source: str) -> list[dict[str, Any]]:
    """Suspicious constructs in a candidate's source, as {"flag", "line", "what"}. Flags, not verdicts:
    a determined candidate hides any of these from an AST (exec, getattr with built strings), and the
    runtime checks are what decide. An unparsable file yields nothing (compile reports it)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    aliases: dict[str, str] = {}  # local name -> module path
    findings: list[dict[str, Any]] = []

    def add(flag: str, node: ast.AST, what: str) -> None:
        findings.append({"flag": f"static:{flag}", "line": getattr(node, "lineno", 0), "what": what})

    def harness_module(name: str) -> bool:
        parts = name.split(".")
        if parts[0] in ("harness", "tests", "agent", "tools"):
            return True
        # A problem module is the reference itself; problems._symm is shared plumbing for solutions.
        return parts[0] == "problems" and len(parts) > 1 and not parts[1].startswith("_")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if harness_module(a.name):
                    add("harness_access", node, f"import {a.name}")
                if a.name.startswith("multiprocessing.connection"):
                    add("fd_access", node, f"import {a.name}")
                if a.name == "ctypes":
                    add("ctypes", node, "import ctypes")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if harness_module(node.module):
                add("harness_access", node, f"from {node.module} import ...")
            if node.module.startswith("multiprocessing.connection"):
                add("fd_access", node, f"from {node.module} import ...")
            if node.module == "ctypes":
                add("ctypes", node, "from ctypes import ...")
        elif isinstance(node, ast.Attribute) and node.attr in _INTROSPECTION:
            add("introspection", node, f".{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if "/proc/" in text and ("/fd" in text or "/mem" in text):
                add("fd_access", node, repr(text[:60]))
            if text.startswith(("harness.", "__main__")) or text in ("harness", "__main__"):
                add("harness_access", node, repr(text[:60]))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    name = _dotted(target)
                    root = aliases.get(name.split(".")[0], name.split(".")[0]).split(".")[0]
                    words = set(name.split("."))
                    if name.startswith("torch.backends") or not name:
                        continue
                    if root in _PATCH_ROOTS or (root in ("torch", "dist") and words & _PATCH_WORDS):
                        add("monkeypatch", node, f"assigns {name}")
        elif isinstance(node, ast.Call):
            func = _dotted(node.func)
            if func in ("setattr", "delattr") and node.args:
                target = _dotted(node.args[0])
                root = aliases.get(target.split(".")[0], target.split(".")[0]).split(".")[0] if target else ""
                if root in _PATCH_ROOTS or root in ("torch", "dist"):
                    add("monkeypatch", node, f"{func}({target}, ...)")
            module, _, attr = func.rpartition(".")
            if aliases.get(module, module) == "os" and attr in _FD_CALLS:
                add("fd_access", node, f"os.{attr}()")
            if attr in ("Thread", "Process") or func in ("threading.Thread", "os.fork"):
                add("threads", node, f"{func}()")
    return findings


# -- plausibility, in the parent ------------------------------------------------------------------
def timing_problems(times_ms: Iterable[float]) -> list[str]:
    """What is impossible about a list of measured times (a clock cannot run backwards or stop)."""
    values = list(times_ms)
    if not values:
        return ["no timed iterations"]
    if any(not math.isfinite(v) for v in values):
        return ["non-finite times"]
    if min(values) <= 0:
        return [f"non-positive time {min(values):.3g} ms"]
    if len(values) >= 10 and max(values) == min(values):
        # A coefficient of variation of exactly zero: no clock measures 10 calls identically.
        return [f"all {len(values)} iterations took exactly {values[0]:.6g} ms"]
    return []


def caching_suspected(rotated_ms: float, fresh_median_ms: float | None, config: IntegrityConfig) -> bool:
    """True when calls on never-seen inputs are much slower than their neighbouring calls on rotated
    input sets: the rotated calls were answered from a cache keyed on inputs the candidate had seen."""
    if fresh_median_ms is None or not math.isfinite(fresh_median_ms):
        return False
    return fresh_median_ms > config.caching_ratio * rotated_ms + config.caching_margin_ms


def roofline_bound_ms(problem: Any, shape: str, world_size: int, device: str) -> float | None:
    """The roofline lower bound of one call, from harness.roofline.lower_bound_ms (GPU runs only; it
    traces the reference once in a clean pool of its own, then reads a cache); None where the module or
    a bound is missing, or on any error: a missing bound must never fail an evaluation."""
    try:
        module = importlib.import_module("harness.roofline")
    except ImportError:
        return None
    fn = getattr(module, "lower_bound_ms", None)
    if not callable(fn):
        return None
    try:
        value = fn(problem, shape, world_size, device)
    except Exception:
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None

