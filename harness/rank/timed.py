"""One timed call at a time, for the reference and the candidate alike. Rank side; torch + stdlib.

The harness drives timing one iteration per request (harness.judge.timing), so it can time every
iteration with its own clock and decide, only after a call has returned, whether that call's output is
kept and judged. Per iteration on a GPU: flush L2 (write a buffer twice its size), a device-side spin
long enough for the host to enqueue the whole iteration before the GPU reaches it (the harness sets its
length from the warm-up's enqueue times), a cross-rank device barrier, start event, one call, end event,
then (outside the timed window) a copy of the output kept until the next request says whether to hand
it over. Without the spin, small calls measure Python launch latency, not the GPU. On CPU the same
steps run with host clocks and a gloo barrier: the numbers only prove the plumbing.

Clocks, events and collectives are bound when this module is imported, before any candidate exists;
a candidate can still rebind them (it runs in this process), which is why the judge treats every number
this module reports as a claim and reconciles it with what it observed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.rank import transport
from harness.rank.calls import SM_CYCLES_PER_S, clone_tree, fingerprint, snapshot

_clock = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_cuda_synchronize = torch.cuda.synchronize
_cuda_sleep: Callable[[int], None] = torch.cuda._sleep  # torch leaves _sleep(cycles) unannotated
_all_reduce = dist.all_reduce
_barrier = dist.barrier

KINDS = ("warmup", "timed", "host", "fresh")


def input_sets_needed(set_bytes: int, l2_bytes: int, config: dict[str, Any], free_bytes: int) -> int:
    """Enough distinct input sets that one pass over them is more than 3x the L2 size."""
    want = max(int(config.get("min_input_sets", 2)), math.ceil(3 * l2_bytes / max(set_bytes, 1)) + 1)
    affordable = max(1, int(config.get("input_memory_fraction", 0.25) * free_bytes) // max(set_bytes, 1))
    return max(1, min(want, int(config.get("max_input_sets", 64)), affordable))


def device_barrier(device: torch.device, token: torch.Tensor) -> None:
    """A barrier on the device where the backend has one (NCCL: a one-element all-reduce on the current
    stream), else gloo's host barrier."""
    if device.type == "cuda" and dist.get_backend() == "nccl":
        _all_reduce(token)
    else:
        _barrier()


def agree_min(value: int, device: torch.device) -> int:
    """The smallest `value` over ranks (free memory differs per GPU; the set count must not)."""
    if not dist.is_initialized():
        return value
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.int64, device=on)
    _all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def l2_and_free(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":
        return 0, 1 << 40
    props = torch.cuda.get_device_properties(device)
    free, _ = torch.cuda.mem_get_info(device)
    return int(props.L2_cache_size), int(free)


class TimedSession:
    """The input sets of one timing phase on this rank and the call under test."""

    def __init__(self, fn: Callable[..., Any], sets: list[tuple[Any, ...]], fresh: list[tuple[Any, ...]],
                 device: torch.device, plain: Callable[[Any], str | None], clone: bool = False) -> None:
        """`clone`: give every call a fresh copy of its input set (made before the flush, outside the timed
        window), for problems whose reference modifies its inputs: without it each call would see the
        previous call's leftovers, and no output could be checked."""
        self.fn = fn
        self.clone = clone
        self.sets = sets
        self.fresh = fresh
        self.device = device
        self.plain = plain  # why an output is not plain data, or None
        self.cuda = device.type == "cuda"
        l2_bytes, _ = l2_and_free(device)
        self.flush = torch.empty(2 * l2_bytes // 4 + 1, dtype=torch.int32, device=device) if self.cuda else None
        self.token = torch.zeros(1, device=device)
        self.kept: Any = None
        self.kept_issue: str | None = None

    def _hand_over(self, path: str | None) -> int:
        """Write the previous call's output copy where the harness asked (it chose after that call had
        returned), then forget it. Returns the bytes written."""
        kept, issue, self.kept, self.kept_issue = self.kept, self.kept_issue, None, None
        if not path:
            return 0
        if issue is not None:
            Path(path).with_suffix(".issue").write_text(issue)
            return 0
        return transport.write_tree(Path(path), kept)

    def _inputs(self, kind: str, index: int) -> tuple[Any, ...]:
        group = self.fresh if kind == "fresh" else self.sets
        if not 0 <= index < len(group):
            raise IndexError(f"no {kind} input set {index}")
        return group[index]

    def call(self, req: dict[str, Any]) -> dict[str, Any]:
        kind, index = req["kind"], int(req["set"])
        if kind not in KINDS:
            raise ValueError(f"unknown timing call kind {kind!r}")
        written = self._hand_over(req.get("keep_previous"))
        args = self._inputs(kind, index)
        if self.clone:
            args = clone_tree(args)
        reply: dict[str, Any] = {"ok": True, "kept_bytes": written}
        if kind == "host":
            device_barrier(self.device, self.token)
            if self.cuda:
                _cuda_synchronize(self.device)
            t0 = _clock()
            out = self.fn(*args)
            if self.cuda:
                _cuda_synchronize(self.device)
            reply["ms"] = (_clock() - t0) * 1e3
        elif self.cuda:
            assert self.flush is not None
            self.flush.zero_()
            _cuda_sleep(int(float(req.get("spin_us", 0.0)) * SM_CYCLES_PER_S / 1e6))
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            t0 = _clock()
            device_barrier(self.device, self.token)
            t1 = _clock()
            _record(start)
            out = self.fn(*args)
            _record(end)
            t2 = _clock()
            self._keep(out)
            del out
            _cuda_synchronize(self.device)
            reply.update(ms=_elapsed_time(start, end), enqueue_us=(t2 - t1) * 1e6, barrier_enqueue_us=(t1 - t0) * 1e6)
            return reply
        else:
            device_barrier(self.device, self.token)
            t0 = _clock()
            out = self.fn(*args)
            reply["ms"] = (_clock() - t0) * 1e3
        self._keep(out)
        del out
        return reply

    def _keep(self, out: Any) -> None:
        issue = self.plain(out)
        self.kept, self.kept_issue = (snapshot(out), None) if issue is None else (None, issue)

    def finish(self, req: dict[str, Any]) -> dict[str, Any]:
        """Hand over the last kept output if asked; fingerprints of every input set as timing left them."""
        written = self._hand_over(req.get("keep_previous"))
        if self.cuda:
            _cuda_synchronize(self.device)
        prints = [fingerprint(s) for s in self.sets] + [fingerprint(s) for s in self.fresh]
        self.sets, self.fresh, self.flush = [], [], None
        return {"ok": True, "kept_bytes": written, "fingerprints": prints}
