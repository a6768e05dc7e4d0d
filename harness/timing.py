"""Timing one function on every rank with the protocol of docs/design.md (step 4). Worker-safe.

Per iteration on a GPU: flush L2 (write a buffer twice its size), queue a short device-side spin so the
host has enqueued the whole iteration before the GPU reaches it, a cross-rank device barrier, then
start event, one call, end event. Without the spin, small calls measure Python launch latency, not the
GPU. Inputs rotate over enough distinct sets to exceed 3x L2. The host-inclusive latency (launch
overhead included) is a second loop, reported apart. The parent takes the max over ranks per iteration.
On CPU the same loop runs with host clocks and a gloo barrier: the numbers only prove the plumbing.

Integrity hooks (harness.worker uses them; both run outside the timed window): `prepare` sees every
input set before the first call, `on_output` sees every call's output. `fresh_iters` adds iterations,
with the same protocol, on sets never used before, each next to an iteration on a rotated set: a
candidate that caches answers by input is fast on the rotated sets only. Clocks, events and
collectives are bound when this module is imported, before any candidate exists, so replacing
time.perf_counter or torch.cuda.Event later changes nothing here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_clock = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_cuda_synchronize = torch.cuda.synchronize
_cuda_sleep: Callable[[int], None] = torch.cuda._sleep  # torch leaves it unannotated: (cycles) -> None
_all_reduce = dist.all_reduce
_barrier = dist.barrier

Prepare = Callable[[list[tuple[Any, ...]], list[tuple[Any, ...]]], None]
OnOutput = Callable[[str, int, Any], None]  # (loop: warmup|timed|host|fresh, set index, output)


def tree_nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tree_nbytes(v) for v in value)
    return 0


def input_sets_needed(set_bytes: int, l2_bytes: int, config: dict[str, Any], free_bytes: int) -> int:
    """Enough distinct input sets that one pass over them is more than 3x the L2 size."""
    want = max(int(config.get("min_input_sets", 2)), math.ceil(3 * l2_bytes / max(set_bytes, 1)) + 1)
    affordable = max(1, int(config.get("input_memory_fraction", 0.25) * free_bytes) // max(set_bytes, 1))
    return max(1, min(want, int(config.get("max_input_sets", 64)), affordable))


def _device_barrier(device: torch.device, token: torch.Tensor) -> None:
    if device.type == "cuda":
        _all_reduce(token)  # a tiny NCCL all-reduce on the current stream: a device-side barrier
    else:
        _barrier()


def _agree_min(value: int, device: torch.device) -> int:
    """The smallest `value` over ranks: free memory differs per GPU, the set count must not (the hooks
    may run collectives per set)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    _all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def time_function(
    fn: Callable[..., Any],
    make_set: Callable[[int], tuple[Any, ...]],
    device: torch.device,
    config: dict[str, Any],
    *,
    prepare: Prepare | None = None,
    on_output: OnOutput | None = None,
) -> dict[str, Any]:
    warmup = int(config.get("warmup", 10))
    iters = int(config.get("iters", 50))
    host_iters = int(config.get("host_iters", max(5, iters // 5)))
    fresh_iters = int(config.get("fresh_iters", 0))
    cuda = device.type == "cuda"
    seen = on_output or (lambda loop, index, out: None)

    first = make_set(0)
    set_bytes = tree_nbytes(first)
    if cuda:
        props = torch.cuda.get_device_properties(device)
        l2_bytes = int(props.L2_cache_size)
        free_bytes, _ = torch.cuda.mem_get_info(device)
    else:
        l2_bytes, free_bytes = 0, 1 << 40
    n_sets = input_sets_needed(set_bytes, l2_bytes, config, free_bytes) if cuda else config.get("min_input_sets", 2)
    n_sets = _agree_min(n_sets, device)
    sets = [first] + [make_set(i) for i in range(1, n_sets)]
    fresh = [make_set(n_sets + j) for j in range(fresh_iters)]
    if prepare is not None:
        prepare(sets, fresh)
    token = torch.zeros(1, device=device)

    # Warm-up: compile, JIT, allocator and communicator set-up stay out of the numbers. It also gives
    # the host enqueue time of one call, which sizes the spin.
    enqueue, barrier_enqueue = [], []
    for i in range(max(warmup, 1)):
        t0 = _clock()
        _device_barrier(device, token)
        t1 = _clock()
        out = fn(*sets[i % n_sets])
        enqueue.append(_clock() - t1)
        barrier_enqueue.append(t1 - t0)
        seen("warmup", i % n_sets, out)
        del out
        if cuda:
            _cuda_synchronize(device)
    # The first call may compile or allocate: the median is the steady-state enqueue cost.
    enqueue_s = sorted(enqueue)[len(enqueue) // 2]
    barrier_s = sorted(barrier_enqueue)[len(barrier_enqueue) // 2]

    spin_us = 0.0
    if cuda:
        flush = torch.empty(2 * l2_bytes // 4 + 1, dtype=torch.int32, device=device)
        # The spin must outlast the host's enqueue of barrier, start event and call, or the GPU would
        # reach the start event early and time the host. Generous margin: it costs nothing timed.
        # ~1.98 GHz SM clock under load.
        wanted = 4e6 * (enqueue_s + barrier_s) + 30.0
        spin_us = min(config.get("max_spin_us", 2000.0), max(config.get("min_spin_us", 20.0), wanted))
        spin_cycles = int(spin_us * 1980)

        def timed_loop(plan: list[tuple[str, int, tuple[Any, ...]]]) -> list[float]:
            starts = [_Event(enable_timing=True) for _ in plan]
            ends = [_Event(enable_timing=True) for _ in plan]
            for it, (loop, index, s) in enumerate(plan):
                flush.zero_()
                _cuda_sleep(spin_cycles)
                _device_barrier(device, token)
                _record(starts[it])
                out = fn(*s)
                _record(ends[it])
                seen(loop, index, out)
                del out
            _cuda_synchronize(device)
            return [_elapsed_time(a, b) for a, b in zip(starts, ends)]
    else:

        def timed_loop(plan: list[tuple[str, int, tuple[Any, ...]]]) -> list[float]:
            times = []
            for loop, index, s in plan:
                _barrier()
                t0 = _clock()
                out = fn(*s)
                times.append((_clock() - t0) * 1e3)
                seen(loop, index, out)
                del out
            return times

    times_ms = timed_loop([("timed", it % n_sets, sets[it % n_sets]) for it in range(iters)])

    host_ms: list[float] = []
    for it in range(host_iters):
        s = sets[it % n_sets]
        _device_barrier(device, token)
        if cuda:
            _cuda_synchronize(device)
        t0 = _clock()
        out = fn(*s)
        if cuda:
            _cuda_synchronize(device)
        host_ms.append((_clock() - t0) * 1e3)
        seen("host", it % n_sets, out)
        del out

    # Each fresh set is used exactly once, after the candidate has seen every rotated set many times,
    # alternating with rotated sets so each fresh time has a neighbour measured under the same load.
    plan = []
    for j, s in enumerate(fresh):
        plan += [("timed", j % n_sets, sets[j % n_sets]), ("fresh", j, s)]
    paired = timed_loop(plan) if plan else []
    fresh_ms, fresh_pair_ms = paired[1::2], paired[0::2]

    return {
        "times_ms": times_ms,
        "host_ms": host_ms,
        "fresh_ms": fresh_ms,
        "fresh_pair_ms": fresh_pair_ms,
        "input_sets": n_sets,
        "set_bytes": set_bytes,
        "l2_bytes": l2_bytes,
        "spin_us": spin_us,
        "enqueue_us": enqueue_s * 1e6,
        "barrier_enqueue_us": barrier_s * 1e6,
    }
