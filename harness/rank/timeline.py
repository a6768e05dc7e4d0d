"""Where a candidate's time goes, the rank side: a kernel timeline from the PyTorch profiler, summarised here.

In each rank worker (op "profile", worker-safe: torch and the standard library) the candidate (or the
reference) runs a few warm-up calls, then `iters` profiled calls. Each profiled iteration is aligned like
a timed one: a host barrier through the process group's store (it launches no kernel), then on GPUs a
short device spin (`torch.cuda._sleep`, kernel "spin_kernel") and a one-element NCCL all-reduce as a
device barrier, then the call inside record_function("pkb::call"). The Chrome trace is summarised in the
worker and only the summary travels back.

Windows: on a GPU an iteration's window opens when the device barrier (the first NCCL kernel after the
iteration's spin) ends and closes at the end of the last kernel that starts before the next spin; on a
CPU it is the "pkb::call" range. Inside a window:
- kernels (GPU: kernels, memcpys, memsets on any stream; CPU: top-level operators of each thread, and
  gloo's own work ranges) with their time and launch count;
- communication vs compute, by name: NCCL kernels, torch symmetric-memory kernels, peer-to-peer copies
  (Memcpy PtoP) and any kernel whose name says all_reduce, all_gather, reduce_scatter, all_to_all,
  broadcast, send/recv, p2p, peer, push, pull, barrier, signal, multimem, nvshmem, dispatch or combine
  count as communication; everything else as compute (so a fused kernel counts by its name);
- overlap: time when communication and compute both run; idle: time when nothing runs, and its gaps.
Across ranks: each rank's call time (window length), the slowest rank and the skew (max - min) / max.

The parent side (harness.measure.profiling) starts the ranks and merges these summaries.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.common import failures
from harness.common.kernel_names import short_name
from harness.common.messages import Profile
from harness.common.seeds import TIMING_TRIAL_BASE
from harness.common.spin import cycles as spin_cycles
from harness.common.spin import spin_us
from harness.rank.candidate import trimmed_traceback
from harness.rank.tracing import keep_torch_namespace

CALL_RANGE = "pkb::call"
SPIN_MARKER = "spin_kernel"  # torch.cuda._sleep's kernel
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
COMM_WORDS = ("nccl", "symm", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
              "reducescatter", "all_to_all", "alltoall", "broadcast", "sendrecv", "send_recv", "p2p", "peer",
              "ptop", "push", "pull", "barrier", "signal", "multimem", "nvshmem", "dispatch", "combine",
              "c10d::", "gloo:", "pkbhost:")
GAP_US = 1.0  # idle stretches shorter than this are launch jitter, not gaps worth reporting
TOP_KERNELS = 12


# -- events and windows (pure) ---------------------------------------------------------------------------


@dataclass
class Event:
    name: str
    start: float  # microseconds, the trace's clock
    end: float
    lane: str  # stream (GPU) or thread (CPU)
    kind: str  # "comm" or "compute"


def classify(name: str) -> str:
    low = name.lower()
    return "comm" if any(word in low for word in COMM_WORDS) else "compute"


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Overlap of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def idle_gaps(busy: list[tuple[float, float]], start: float, end: float) -> list[float]:
    gaps, cursor = [], start
    for s, e in busy:
        if s > cursor:
            gaps.append(s - cursor)
        cursor = max(cursor, e)
    if end > cursor:
        gaps.append(end - cursor)
    return gaps


def device_events(trace: list[dict[str, Any]]) -> list[Event]:
    out = []
    for e in trace:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATEGORIES:
            continue
        start = float(e["ts"])
        name = str(e.get("name", "?"))
        args = e.get("args") or {}
        out.append(Event(name, start, start + float(e.get("dur", 0.0)), f"stream {args.get('stream', e.get('tid'))}",
                         classify(name)))
    return sorted(out, key=lambda ev: ev.start)


def cpu_events(trace: list[dict[str, Any]]) -> tuple[list[Event], list[tuple[float, float]]]:
    """Top-level operators of every thread plus gloo's work ranges, and the "pkb::call" windows."""
    windows, raw = [], []
    for e in trace:
        if e.get("ph") != "X":
            continue
        start = float(e["ts"])
        span = (start, start + float(e.get("dur", 0.0)))
        name = str(e.get("name", "?"))
        if e.get("cat") == "user_annotation" and name == CALL_RANGE:
            windows.append(span)
        elif e.get("cat") == "cpu_op" or (e.get("cat") == "user_annotation" and classify(name) == "comm"):
            raw.append(Event(name, *span, f"thread {e.get('tid')}", classify(name)))
    top: list[Event] = []
    ends: dict[str, float] = {}
    for ev in sorted(raw, key=lambda ev: (ev.lane, ev.start, -ev.end)):
        if ev.start < ends.get(ev.lane, float("-inf")):
            continue  # nested inside an operator already counted
        top.append(ev)
        ends[ev.lane] = ev.end
    return sorted(top, key=lambda ev: ev.start), sorted(windows)


def device_windows(events: list[Event]) -> tuple[list[tuple[float, float]], list[Event], str]:
    """Iteration windows from the spin markers (see the module docstring) and the events in them."""
    spins = [ev for ev in events if SPIN_MARKER in ev.name]
    if not spins:
        if not events:
            return [], [], "no device events"
        return [(events[0].start, max(ev.end for ev in events))], events, "whole profile (no spin markers)"
    windows: list[tuple[float, float]] = []
    inside: list[Event] = []
    for i, spin in enumerate(spins):
        limit = spins[i + 1].start if i + 1 < len(spins) else float("inf")
        after = [ev for ev in events if spin.end - 0.5 <= ev.start < limit and ev is not spin]
        barrier = next((ev for ev in after if "nccl" in ev.name.lower()), None)
        opened = barrier.end if barrier is not None else spin.end
        mine = [ev for ev in after if ev is not barrier and ev.start >= opened - 0.5]
        closed = max((ev.end for ev in mine), default=opened)
        windows.append((opened, closed))
        inside.extend(mine)
    return windows, inside, "spin markers"


def summarize(events: list[Event], windows: list[tuple[float, float]]) -> dict[str, Any]:
    """Per-iteration means over the windows: call time, communication, compute, overlap, idle, gaps, and
    the kernels that ran (time and launches per iteration)."""
    iters = max(len(windows), 1)
    calls, comm, compute, overlap, idle, busy_total, gap_counts, largest = [], 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0
    kernels: dict[str, dict[str, Any]] = {}
    lanes: set[str] = set()
    for w0, w1 in windows:
        evs = [ev for ev in events if w0 - 0.5 <= ev.start <= w1 and ev.end <= w1 + 0.5]
        clipped = [(max(ev.start, w0), min(ev.end, w1)) for ev in evs]
        busy = union(clipped)
        c = union(span for span, ev in zip(clipped, evs) if ev.kind == "comm")
        k = union(span for span, ev in zip(clipped, evs) if ev.kind == "compute")
        gaps = [g for g in idle_gaps(busy, w0, w1) if g >= GAP_US]
        calls.append(w1 - w0)
        comm, compute, overlap = comm + length(c), compute + length(k), overlap + intersection_length(c, k)
        busy_total += length(busy)
        idle += (w1 - w0) - length(busy)
        gap_counts += len(gaps)
        largest = max([largest, *gaps])
        for ev in evs:
            lanes.add(ev.lane)
            s = kernels.setdefault(short_name(ev.name), {"kind": ev.kind, "us": 0.0, "launches": 0})
            s["us"] += ev.end - ev.start
            s["launches"] += 1
    top = sorted(kernels.items(), key=lambda kv: -kv[1]["us"])
    return {
        "iterations": len(windows),
        "call_us": sum(calls) / iters,
        "call_median_us": statistics.median(calls) if calls else 0.0,
        "comm_us": comm / iters,
        "compute_us": compute / iters,
        "overlap_us": overlap / iters,
        "busy_us": busy_total / iters,
        "idle_us": idle / iters,
        "gaps_per_iter": gap_counts / iters,
        "largest_gap_us": largest,
        "lanes": len(lanes),
        "kernel_count": len(kernels),
        "kernels": [{"name": name, "kind": s["kind"], "us_per_iter": s["us"] / iters,
                     "launches_per_iter": s["launches"] / iters} for name, s in top[:TOP_KERNELS]],
    }


def summarize_trace(trace: list[dict[str, Any]], device: str) -> dict[str, Any]:
    if device == "cuda":
        windows, inside, source = device_windows(device_events(trace))
        return {**summarize(inside, windows), "window_source": source}
    events, windows = cpu_events(trace)
    return {**summarize(events, windows), "window_source": "pkb::call ranges (CPU operators)"}


# -- in the rank worker ----------------------------------------------------------------------------------


class StoreBarrier:
    """A host barrier through the process group's key-value store: unlike dist.barrier it launches no
    kernel, so nothing of the harness lands in a profiled window."""

    def __init__(self, world_size: int, tag: str) -> None:
        from torch.distributed.distributed_c10d import _get_default_store

        self.store = _get_default_store()
        self.world_size = world_size
        self.tag = tag
        self.count = 0

    def wait(self, timeout_s: float = 600.0) -> None:
        self.count += 1
        key = f"pkb/profile/{self.tag}/{self.count}"
        self.store.add(key, 1)
        deadline = time.monotonic() + timeout_s
        while self.store.add(key, 0) < self.world_size:
            if time.monotonic() > deadline:
                raise TimeoutError(f"host barrier {key} timed out")
            time.sleep(0.0002)


def profile_in_worker(worker: Any, req: Profile) -> dict[str, Any]:
    """Op "profile": mode "timeline" (torch.profiler, summarised here) or "ncu" (plain iterations between
    cudaProfilerStart/Stop, for an Nsight Compute process wrapped around one rank)."""
    problem = worker.problem(req.problem)
    shape = problem.shape(req.shape)
    fn = problem.solution if req.candidate is None else worker.candidates[req.candidate].solution
    warmup, iters, mode = req.warmup, req.iters, req.mode
    cuda = worker.device.type == "cuda"
    sets = [worker.inputs(problem, shape, req.seed, TIMING_TRIAL_BASE + i) for i in range(2)]
    try:
        barrier = StoreBarrier(worker.world_size, req.tag)
        enqueue = []
        for i in range(warmup):
            barrier.wait()
            t0 = time.perf_counter()
            fn(*sets[i % 2])
            enqueue.append(time.perf_counter() - t0)
            worker.sync()
        if mode in ("ncu", "nsys"):  # Nsight Compute brackets each call; Nsight Systems takes one range
            return _ncu_iterations(worker, fn, sets, iters, barrier, per_call=mode == "ncu")
        token = torch.zeros(1, device=worker.device)
        # The spin outlasts the host's enqueue of the device barrier and the call, as in a timed call.
        cycles = spin_cycles(spin_us(sorted(enqueue)[len(enqueue) // 2] * 1e6 if enqueue else 0.0))
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with keep_torch_namespace(), torch.profiler.profile(activities=activities) as prof:
            for i in range(iters):
                barrier.wait()
                if cuda:
                    torch.cuda._sleep(cycles)
                    dist.all_reduce(token)  # device barrier: every rank's call starts together
                else:
                    dist.barrier()
                with torch.profiler.record_function(CALL_RANGE):
                    fn(*sets[i % 2])
                worker.sync()
        with tempfile.TemporaryDirectory(prefix="pkb-profile-") as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            trace = json.loads(Path(path).read_text()).get("traceEvents", [])
    except Exception as exc:
        return {"ok": False, "verdict": failures.RUNTIME_ERROR,
                "message": f"rank {worker.rank} raised {type(exc).__name__} while profiled: {exc}"[:600],
                "evidence": trimmed_traceback(exc)}
    summary = summarize_trace(trace, "cuda" if cuda else "cpu")
    summary["thread"] = threading.get_native_id()
    return {"ok": True, "mode": "timeline", **summary}


def _ncu_iterations(worker: Any, fn: Any, sets: list[tuple[Any, ...]], iters: int,
                    barrier: StoreBarrier, per_call: bool = True) -> dict[str, Any]:
    """The calls between cudaProfilerStart/Stop: each call in a range of its own (`ncu --profile-from-start
    off` profiles only those), or all of them in one range (`nsys --capture-range=cudaProfilerApi` records
    the first range only)."""
    cuda = worker.device.type == "cuda"
    if cuda and not per_call:
        torch.cuda.profiler.start()
    for i in range(iters):
        barrier.wait()
        if cuda:
            if per_call:
                torch.cuda.profiler.start()
            torch.cuda.nvtx.range_push("pkb_call")
        fn(*sets[i % 2])
        worker.sync()
        if cuda:
            torch.cuda.nvtx.range_pop()
            if per_call:
                torch.cuda.profiler.stop()
    if cuda and not per_call:
        torch.cuda.profiler.stop()
    return {"ok": True, "mode": "ncu" if per_call else "nsys", "iterations": iters}
