"""One call of a solution, observed: copies of its output taken at return and later, fingerprints of its
inputs, delays that put one rank late. Rank side; torch + stdlib.

These produce data for the judge (harness.judge.trials), which decides what the data means; a rank
that lies here only changes evidence about itself, and the copy of its output it hands over is judged
against a reference it never saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.common.spin import SM_CYCLES_PER_S
from harness.rank import pristine

# Bound at import, before any candidate exists.
_cuda_sleep: Callable[[int], None] = torch.cuda._sleep  # torch leaves _sleep(cycles) unannotated
_cuda_synchronize = torch.cuda.synchronize
_sleep = time.sleep


def leaves(value: Any) -> Iterator[Any]:
    """Every leaf of a value: items of lists and tuples, dict values in key order, modules' tensors."""
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from leaves(v)
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from leaves(value[key])
    elif isinstance(value, torch.nn.Module):
        for _, t in sorted(value.state_dict(keep_vars=True).items()):
            yield t
    else:
        yield value


def clone_tree(value: Any) -> Any:
    """A copy a solution may modify freely: tensors cloned, containers rebuilt, modules deep-copied."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(clone_tree(v) for v in value)
    if isinstance(value, list):
        return [clone_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: clone_tree(v) for k, v in value.items()}
    if isinstance(value, torch.nn.Module):
        import copy

        return copy.deepcopy(value)
    return value


def _copy(value: Any) -> Any:
    """Tensors cloned; lists and tuples (of any subclass) rebuilt as plain ones; dicts as plain dicts."""
    if pristine.builtin_isinstance(value, pristine.Tensor):
        return pristine.clone(pristine.detach(value))
    if pristine.builtin_isinstance(value, tuple):
        return pristine.builtin_tuple([_copy(v) for v in pristine.items(value)])
    if pristine.builtin_isinstance(value, list):
        return [_copy(v) for v in pristine.items(value)]
    if pristine.builtin_isinstance(value, dict):
        return {k: _copy(v) for k, v in pristine.dict_items(value)}
    return value


def snapshot(value: Any) -> Any:
    """A private copy of an output, queued on the current stream, so it sees the output as the caller's
    stream sees it at this moment, not after other streams finish. Made with torch's modes off and the
    functions bound in harness.rank.pristine: nothing the candidate left in the process runs here."""
    with pristine.quiet():
        return _copy(value)


def _raw(t: torch.Tensor) -> torch.Tensor:
    if pristine.layout_of(t) == pristine.sparse_coo:
        t = pristine.coalesce(pristine.detach(t))
        return pristine.cat([_raw(pristine.indices(t)), _raw(pristine.values(t))])
    return pristine.view(pristine.reshape(pristine.contiguous(pristine.detach(t)), -1), pristine.uint8)


def same_bytes(a: Any, b: Any) -> bool:
    """Bitwise equality of two values' leaves (NaN-safe); False when their structure differs."""
    with pristine.quiet():
        xs, ys = list(leaves(a)), list(leaves(b))
        if len(xs) != len(ys):
            return False
        for x, y in zip(xs, ys):
            if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
                return False
            if isinstance(x, torch.Tensor):
                if (pristine.shape_of(x) != pristine.shape_of(y) or pristine.dtype_of(x) != pristine.dtype_of(y)
                        or pristine.layout_of(x) != pristine.layout_of(y)):
                    return False
                if not pristine.equal(_raw(x), pristine.to(_raw(y), pristine.device_of(x))):
                    return False
            elif x != y and x == x:  # x != x only for NaN
                return False
        return True


# Bytes of a leaf summed at once: on the host, small enough that the chunk's int64 copies stay in the caches
# (a 16 MiB chunk made eight 128 MiB passes through memory: 2.6 s for a 128 MiB input on the 2-core machine,
# 0.5 s in 64 KiB chunks); on a GPU, large enough that the kernel launches do not add up.
HOST_FINGERPRINT_CHUNK = 1 << 16
DEVICE_FINGERPRINT_CHUNK = 1 << 24


def fingerprint(value: Any, chunk: int | None = None) -> list[int]:
    """Exact integer sums of every tensor leaf's bytes (plain and position-weighted), two per leaf, computed
    on the tensor's device. Integer arithmetic (modulo 2^64) gives the same numbers on any device, in any
    order and for any `chunk` (bytes summed at once; by default by device), so the reference pool's
    fingerprint of pristine inputs and a candidate rank's fingerprint after its call can be compared by the
    judge without moving the inputs."""
    parts: list[torch.Tensor] = []
    with pristine.quiet():
        for leaf in leaves(value):
            if not isinstance(leaf, torch.Tensor) or pristine.numel(leaf) == 0:
                continue
            raw = _raw(leaf)
            device = pristine.device_of(raw)
            step = chunk or (HOST_FINGERPRINT_CHUNK if device.type == "cpu" else DEVICE_FINGERPRINT_CHUNK)
            total = pristine.numel(raw)
            sums: list[torch.Tensor] = []
            weighted: list[torch.Tensor] = []
            for start in range(0, total, step):
                count = min(step, total - start)
                words = pristine.to(pristine.narrow(raw, 0, start, count), pristine.int64)
                weights = pristine.remainder(pristine.arange(start + 1, start + 1 + count, device=device), 1_000_003)
                sums.append(pristine.tensor_sum(words))
                weighted.append(pristine.tensor_sum(pristine.mul(words, weights)))
            parts += [pristine.tensor_sum(pristine.stack(sums)), pristine.tensor_sum(pristine.stack(weighted))]
        return [int(v) for v in pristine.tolist(pristine.stack(parts))] if parts else []


def delay(seconds: float, device: torch.device) -> None:
    """Start this rank's next call `seconds` late: a device-side spin on a GPU (its kernels start late
    although its host is on time), a host sleep on the CPU."""
    if seconds <= 0:
        return
    if device.type == "cuda":
        _cuda_sleep(int(seconds * SM_CYCLES_PER_S))
    else:
        _sleep(seconds)


def call_with_snapshots(call: Callable[..., Any], args: tuple[Any, ...], device: torch.device, lazy_delay_s: float,
                        busy_bytes: int, plain: Callable[[Any], bool]) -> tuple[Any, Any, Any]:
    """One call whose outputs are copied on the caller's stream the moment it returns, and again once all
    work on the device is done (GPU) or after a pause (CPU). Returns (live, at_return, later); the copies
    are None when `plain(live)` says the output is not plain data.

    On a GPU the call runs on a high-priority stream while a low-priority stream keeps the SMs busy with
    short blocks: work the candidate left on another (default, low-priority) stream waits behind them,
    while the copy queued on the caller's stream is scheduled first, so an output that is not complete on
    the caller's stream at return shows as such, whatever the candidate's kernel durations.
    """
    if device.type != "cuda":
        live = call(*args)
        at_return = snapshot(live) if plain(live) else None
        _sleep(lazy_delay_s)
        return live, at_return, snapshot(live) if at_return is not None else None
    _cuda_synchronize(device)
    caller = torch.cuda.current_stream(device)
    high = torch.cuda.Stream(device=device, priority=-1)
    low = torch.cuda.Stream(device=device, priority=0)
    busy = torch.empty(max(1, busy_bytes // 4), dtype=torch.float32, device=device)
    high.wait_stream(caller)
    with torch.cuda.stream(low):
        busy.fill_(1.0)
        busy.mul_(1.0001)  # many short blocks: a steady queue ahead of any other low-priority work
    with torch.cuda.stream(high):
        live = call(*args)
        at_return = snapshot(live) if plain(live) else None
    _cuda_synchronize(device)
    del busy
    _sleep(lazy_delay_s)
    return live, at_return, snapshot(live) if at_return is not None else None
