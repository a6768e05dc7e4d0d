"""An evaluation's sandbox budget, from its problem and shape: harness.launch.sandbox.limits.SandboxLimits
for W ranks given the bytes of one rank's inputs and outputs. Trusted side only (it imports the problem's
module and torch, which the sandbox's other modules do not).

One rank's inputs are made once, at the shape's sizes, on the meta device (a dispatch mode sends every factory
to it, its generator dropped: no memory is taken, no number drawn); a problem whose make_inputs depends on its
data (a nonzero, an .item()) is made for real on the CPU instead, this suite's problems only (their shapes are
declared sizes). A PKB problem whose inputs the meta device cannot make (its inputs come from PKB's own
helpers, and one allocates 14 GB a rank) gets the integrity settings alone, capped by the host. Outputs are
taken as W times the inputs (an all-gather's), so io = (1 + W) x the inputs' bytes. A problem whose reference
needs more declares, in its module, `RANK_BUDGET = {"memory": BYTES, "shm": BYTES, "tmp": BYTES, "scratch":
BYTES}` (any of them): per-rank floors over the derived budget (the settings still cap them).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from harness.common.integrity import IntegrityConfig
from harness.launch.sandbox.limits import SandboxLimits
from harness.records.cache_dir import keep_inductor_cache_here

if TYPE_CHECKING:
    from harness.problems.problem import Problem

BUDGET_KEYS = ("memory", "shm", "tmp", "scratch")
# (problem, shape, W) -> the inputs' bytes: the executor and the evaluation ask alike, once.
_MEASURED: dict[tuple[str, str, int], int | None] = {}
_LOCK = threading.Lock()


def _tensor_bytes(values: Any) -> int:
    import torch

    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, dict):
        return sum(_tensor_bytes(v) for v in values.values())
    if isinstance(values, (list, tuple)):
        return sum(_tensor_bytes(v) for v in values)
    return 0


def _inputs_bytes(problem: Problem, shape: str, world_size: int) -> int | None:
    key = (problem.loader_spec, shape, world_size)
    with _LOCK:
        if key not in _MEASURED:
            _MEASURED[key] = _measure_inputs(problem, shape, world_size)
        return _MEASURED[key]


def _meta_mode() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    keep_inductor_cache_here()  # entering a dispatch mode imports torch._dynamo

    class OnMeta(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = torch.device("meta")
            if "generator" in kwargs:
                kwargs["generator"] = None
            return func(*args, **kwargs)

    mode: Any = OnMeta  # torch's TorchDispatchMode is untyped
    return mode()


def _measure_inputs(problem: Problem, shape: str, world_size: int) -> int | None:
    import torch

    params = problem.shape(shape)
    try:
        with _meta_mode():
            return _tensor_bytes(problem.make_inputs(params, 0, world_size, torch.Generator().manual_seed(0), "cpu"))
    except Exception:  # data-dependent inputs: made for real below, where that is safe
        pass
    if problem.origin != "pkb-agent":
        return None
    try:
        return _tensor_bytes(problem.make_inputs(params, 0, world_size, torch.Generator().manual_seed(0), "cpu"))
    except Exception:
        return None


def rank_io_bytes(problem: Problem, shape: str, world_size: int) -> int | None:
    """One rank's inputs and (estimated) outputs, in bytes; None where the inputs cannot be made here."""
    inputs = _inputs_bytes(problem, shape, world_size)
    return None if inputs is None else inputs * (1 + world_size)


def problem_floor(problem: Problem) -> dict[str, int]:
    """The problem's RANK_BUDGET, checked: known keys, positive integers."""
    declared = getattr(problem.module, "RANK_BUDGET", None) or {}
    if not isinstance(declared, dict) or any(k not in BUDGET_KEYS or not isinstance(v, int) or v <= 0
                                             for k, v in declared.items()):
        raise ValueError(f"{problem.name}: RANK_BUDGET must map some of {BUDGET_KEYS} to positive byte counts")
    return dict(declared)


def evaluation_limits(problem: Problem, shape: str, world_size: int, device: str,
                      checks: IntegrityConfig | None = None) -> SandboxLimits:
    """The sandbox limits of W ranks evaluating a candidate for `problem` at `shape`."""
    return SandboxLimits.for_ranks(world_size, checks, io_bytes=rank_io_bytes(problem, shape, world_size),
                                   device=device, floor=problem_floor(problem))
