"""One timed call at a time, for the reference and the candidate alike. Rank side; torch + stdlib.

The harness drives timing one iteration per request (harness.judge.timing), so it can time every
iteration with its own clock and tell a rank, only after a call has returned, that its output is judged.
Per iteration, in a request of its own before the call's (`prepare`): the previous call's output copy is
handed over if the harness judges it, and the call's inputs are drawn anew from the request's recipe and
copied into the set's buffers (harness.rank.refill: no call sees contents an earlier call saw); the reply says
how (`REFILLED`), and a call without its prepare is refused. Then, in
the call's request, on a GPU: flush L2 (write a buffer twice its size), a device-side spin long enough
for the host to enqueue the whole iteration before the GPU reaches it (the harness sets its length from
the warm-up's enqueue times), a cross-rank device barrier, start event, one call, end event, then
(outside the timed window) a copy of the output, taken before any other harness code touches it
(harness.rank.pristine), kept until the next request says whether to hand it over. Without the spin,
small calls measure Python launch latency, not the GPU. On CPU the same steps run with host clocks and a
gloo barrier: the numbers only prove the plumbing.

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

from harness.common import messages
from harness.common.spin import cycles as spin_cycles
from harness.rank import refill, transport
from harness.rank.calls import clone_tree, fingerprint, same_bytes, snapshot

_clock = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_cuda_synchronize = torch.cuda.synchronize
_cuda_sleep: Callable[[int], None] = torch.cuda._sleep  # torch leaves _sleep(cycles) unannotated
_all_reduce = dist.all_reduce
_barrier = dist.barrier

KINDS = ("warmup", "timed", "host", "fresh")
# How a call's inputs were made, one character per iteration in the judge's record (harness.judge.timing):
# refilled in place from the call's recipe, the recipe's draw itself (its structure differs from the set's),
# a fresh draw (a never-seen call), or a rotated set as given (the plan does not refill: inputs holding
# process groups or modules). The judge writes "-" where a rank did not report one of these.
IN_PLACE, DRAWN, FRESH, ROTATED = "i", "d", "f", "r"
REFILLED = {IN_PLACE: "refilled in place", DRAWN: "drawn (structure differs)", FRESH: "fresh draw",
            ROTATED: "rotated, as given"}


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
                 device: torch.device, plain: Callable[[Any], str | None], clone: bool = False,
                 draw: refill.Draw | None = None) -> None:
        """`clone`: give every call a fresh copy of its input set (made before the flush, outside the timed
        window), for problems whose reference modifies its inputs: without it each call would see the
        previous call's leftovers, and no output could be checked. `draw`: how this rank draws a call's
        inputs from the recipe its request brings (harness.rank.refill); None where the inputs cannot be
        drawn in a rank (they hold process groups or modules): then the sets are used as given."""
        self.fn = fn
        self.clone = clone
        self.sets = sets
        self.fresh = fresh
        self.device = device
        self.plain = plain  # why an output is not plain data, or None
        self.draw = draw
        self.cuda = device.type == "cuda"
        l2_bytes, _ = l2_and_free(device)
        self.flush = torch.empty(2 * l2_bytes // 4 + 1, dtype=torch.int32, device=device) if self.cuda else None
        self.token = torch.zeros(1, device=device)
        self.kept: Any = None
        self.kept_issue: str | None = None
        self.kept_args: Any = None  # the previous call's inputs and a pristine copy, to check them if it is judged
        self.kept_pristine: Any = None
        self.next: tuple[str, tuple[Any, ...]] | None = None  # what `prepare` drew for the coming call

    def _hand_over(self, req: messages.TimePrepare | messages.TimeCall | messages.TimeEnd) -> dict[str, Any]:
        """Write the previous call's output copy where the harness asked (it chose after that call had
        returned), and if asked whether that call's inputs are still as drawn (bit for bit against the draw
        they were copied from), then forget both."""
        kept, issue, args, pristine = self.kept, self.kept_issue, self.kept_args, self.kept_pristine
        self.kept, self.kept_issue, self.kept_args, self.kept_pristine = None, None, None, None
        path = req.keep_previous
        done: dict[str, Any] = {"kept_bytes": 0}
        if not path:
            return done
        if issue is not None:
            Path(path).with_suffix(".issue").write_text(issue)
        else:
            done["kept_bytes"] = transport.write_tree(Path(path), kept)
        if req.check_previous and args is not None and pristine is not None:
            done["kept_intact"] = same_bytes(args, pristine)
        return done

    def _inputs(self, kind: str, index: int, fill: dict[str, Any] | None) -> tuple[tuple[Any, ...], Any, str]:
        """The call's inputs, a pristine copy of them (None without a recipe) and how they were made
        (`REFILLED`). With a recipe: a rotated set refilled in place with a fresh draw (the draw is the copy),
        or replaced by the draw where its structure differs, or for a fresh call the draw itself, never seen
        before. Without one: the set as given. A recipe this session cannot draw is refused, never rotated."""
        if fill is not None:
            if self.draw is None:
                raise RuntimeError("a timed call's recipe came to a session that cannot draw inputs: "
                                   "its inputs would not be refilled")
            drawn = self.draw(fill)
            if kind == "fresh":
                return drawn, clone_tree(drawn), FRESH
            if not 0 <= index < len(self.sets):
                raise IndexError(f"no input set {index}")
            args, in_place = refill.refill(self.sets[index], drawn)
            self.sets[index] = args
            return (args, drawn, IN_PLACE) if in_place else (args, clone_tree(drawn), DRAWN)
        group = self.fresh if kind == "fresh" else self.sets
        if not 0 <= index < len(group):
            raise IndexError(f"no {kind} input set {index}")
        return group[index], None, ROTATED

    def prepare(self, req: messages.TimePrepare | messages.TimeCall) -> dict[str, Any]:
        """The request before each timed call: hand over the previous call's output if it is judged, then draw
        this call's inputs into its buffers and wait for the device to finish drawing. Apart from the call's
        own request, so that the harness's clock around the call sees neither (the drawing and the writing
        of an output vary far more on a busy machine than the call's protocol does)."""
        kind, index = req.kind, req.set
        if kind not in KINDS:
            raise ValueError(f"unknown timing call kind {kind!r}")
        reply: dict[str, Any] = {"ok": True, **self._hand_over(req)}
        began = _clock()
        if self.cuda:
            r0, r1 = _Event(enable_timing=True), _Event(enable_timing=True)
            _record(r0)
        args, pristine, how = self._inputs(kind, index, dict(req.fill) if req.fill is not None else None)
        if self.clone:
            args = clone_tree(args)
        self.kept_args, self.kept_pristine = args, pristine
        self.next = (kind, args)
        reply["refilled"] = how
        if self.cuda:
            _record(r1)
            _cuda_synchronize(self.device)  # the drawing never runs beside a timed call (ranks may share a GPU)
            reply["refill_ms"] = _elapsed_time(r0, r1)
        reply["refill_host_ms"] = (_clock() - began) * 1e3
        reply.setdefault("refill_ms", reply["refill_host_ms"])
        return reply

    def call(self, req: messages.TimeCall) -> dict[str, Any]:
        """One timed call on the inputs the last `prepare` drew. A call without its prepare is refused: it
        would run on the set as the previous call left it (unchanged inputs: a memo's hit), and the
        previous call's output would never be handed over."""
        if self.next is None:
            raise RuntimeError("a timed call without its prepare: its inputs were not refilled")
        (kind, args), self.next = self.next, None
        reply: dict[str, Any] = {"ok": True}
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
            _cuda_sleep(spin_cycles(float(req.spin_us)))
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
        """A copy of the output, taken after the clock stopped and before anything else touches it, with
        torch's modes off and functions bound before the candidate existed (harness.rank.pristine)."""
        issue = self.plain(out)
        self.kept, self.kept_issue = (snapshot(out), None) if issue is None else (None, issue)

    def finish(self, req: messages.TimeEnd) -> dict[str, Any]:
        """Hand over the last kept output if asked; without recipes, fingerprints of every input set as timing
        left them (with recipes every call had new contents: judged calls' inputs were fingerprinted one by one)."""
        reply: dict[str, Any] = {"ok": True, **self._hand_over(req)}
        if self.cuda:
            _cuda_synchronize(self.device)
        prints = [] if self.draw is not None else [fingerprint(s) for s in [*self.sets, *self.fresh]]
        self.sets, self.fresh, self.flush = [], [], None
        reply["fingerprints"] = prints
        return reply
