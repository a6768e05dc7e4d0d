"""Timing one function on every rank with the protocol of DESIGN.md step 4. Worker-safe.

Per iteration on a GPU: flush L2 (write a buffer twice its size), queue a short device-side spin so the
host has enqueued the whole iteration before the GPU reaches it, a cross-rank device barrier, then
start event, one call, end event. Without the spin, small calls measure Python launch latency, not the
GPU. Inputs rotate over enough distinct sets to exceed 3x L2. The host-inclusive latency (launch
overhead included) is a second loop, reported apart. The parent takes the max over ranks per iteration.
On CPU the same loop runs with host clocks and a gloo barrier: the numbers only prove the plumbing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def tree_nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tree_nbytes(v) for v in value)
    return 0


def input_sets_needed(set_bytes: int, l2_bytes: int, config: dict[str, Any], free_bytes: int) -> int:
    """Enough distinct input sets that one pass over them is more than 3x the L2 size."""
    want = max(config.get("min_input_sets", 2), math.ceil(3 * l2_bytes / max(set_bytes, 1)) + 1)
    affordable = max(1, int(config.get("input_memory_fraction", 0.25) * free_bytes) // max(set_bytes, 1))
    return max(1, min(want, config.get("max_input_sets", 64), affordable))


def _device_barrier(device: torch.device, token: torch.Tensor) -> None:
    if device.type == "cuda":
        dist.all_reduce(token)  # a tiny NCCL all-reduce on the current stream: a device-side barrier
    else:
        dist.barrier()


def time_function(
    fn: Callable[..., Any],
    make_set: Callable[[int], tuple],
    device: torch.device,
    config: dict[str, Any],
) -> dict[str, Any]:
    warmup = int(config.get("warmup", 10))
    iters = int(config.get("iters", 50))
    host_iters = int(config.get("host_iters", max(5, iters // 5)))
    cuda = device.type == "cuda"

    first = make_set(0)
    set_bytes = tree_nbytes(first)
    if cuda:
        props = torch.cuda.get_device_properties(device)
        l2_bytes = int(props.L2_cache_size)
        free_bytes, _ = torch.cuda.mem_get_info(device)
    else:
        l2_bytes, free_bytes = 0, 1 << 40
    n_sets = input_sets_needed(set_bytes, l2_bytes, config, free_bytes) if cuda else config.get("min_input_sets", 2)
    sets = [first] + [make_set(i) for i in range(1, n_sets)]
    token = torch.zeros(1, device=device)

    # Warm-up: compile, JIT, allocator and communicator set-up stay out of the numbers. It also gives
    # the host enqueue time of one call, which sizes the spin.
    enqueue, barrier_enqueue = [], []
    for i in range(max(warmup, 1)):
        t0 = time.perf_counter()
        _device_barrier(device, token)
        t1 = time.perf_counter()
        fn(*sets[i % n_sets])
        enqueue.append(time.perf_counter() - t1)
        barrier_enqueue.append(t1 - t0)
        if cuda:
            torch.cuda.synchronize(device)
    # The first call may compile or allocate: the median is the steady-state enqueue cost.
    enqueue_s = sorted(enqueue)[len(enqueue) // 2]
    barrier_s = sorted(barrier_enqueue)[len(barrier_enqueue) // 2]

    times_ms: list[float] = []
    spin_us = 0.0
    if cuda:
        flush = torch.empty(2 * l2_bytes // 4 + 1, dtype=torch.int32, device=device)
        # The spin must outlast the host's enqueue of barrier, start event and call, or the GPU would
        # reach the start event early and time the host. Generous margin: it costs nothing timed.
        # ~1.98 GHz SM clock under load.
        wanted = 4e6 * (enqueue_s + barrier_s) + 30.0
        spin_us = min(config.get("max_spin_us", 2000.0), max(config.get("min_spin_us", 20.0), wanted))
        spin_cycles = int(spin_us * 1980)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for it in range(iters):
            s = sets[it % n_sets]
            flush.zero_()
            torch.cuda._sleep(spin_cycles)
            _device_barrier(device, token)
            starts[it].record()
            fn(*s)
            ends[it].record()
        torch.cuda.synchronize(device)
        times_ms = [a.elapsed_time(b) for a, b in zip(starts, ends)]
    else:
        for it in range(iters):
            s = sets[it % n_sets]
            dist.barrier()
            t0 = time.perf_counter()
            fn(*s)
            times_ms.append((time.perf_counter() - t0) * 1e3)

    host_ms: list[float] = []
    for it in range(host_iters):
        s = sets[it % n_sets]
        _device_barrier(device, token)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn(*s)
        if cuda:
            torch.cuda.synchronize(device)
        host_ms.append((time.perf_counter() - t0) * 1e3)

    return {
        "times_ms": times_ms,
        "host_ms": host_ms,
        "input_sets": n_sets,
        "set_bytes": set_bytes,
        "l2_bytes": l2_bytes,
        "spin_us": spin_us,
        "enqueue_us": enqueue_s * 1e6,
        "barrier_enqueue_us": barrier_s * 1e6,
    }
