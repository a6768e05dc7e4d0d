"""What the reference moves and computes: its torch.distributed calls and its FLOPs. Worker-safe.

`trace_in_worker` (op "trace") runs the problem's reference once after a warm-up call, with the
collective functions of torch.distributed wrapped so each call records its kind, payload size and group,
and under PyTorch's FLOP counter. Per-rank interconnect bytes follow the bandwidth-optimal rules of docs/design.md,
with S the payload size defined per kind and W the group size (a rank outside a group records nothing):

    all_reduce                  send = recv = 2(W-1)/W * S                 S = the tensor
    all_gather (any form)       send = (W-1) * own part, recv = S - own    S = the gathered output
    reduce_scatter (any form)   send = S - own part, recv = (W-1) * own    S = the input before scattering
    all_to_all (any form)       send = input minus own chunk, recv = output minus own chunk (exact splits)
    broadcast                   root: send S; others: recv S, send (W-2)/(W-1) * S
    reduce                      root: recv S; others: send S, recv (W-2)/(W-1) * S
    gather                      root: recv every other part; others: send their part
    scatter                     root: send every other part; others: recv their part
    send / isend / recv / irecv the sender sends S, the receiver receives S (nothing to or from itself)

Even parts make the gather, reduce-scatter and all-to-all rows (W-1)/W * S. Broadcast is scatter then
all-gather (the root sends each of the W-1 others a 1/(W-1) piece, and they exchange pieces), so no rank
moves more than S; reduce is its mirror image (reduce-scatter among the non-roots, then each sends its
reduced piece to the root). Totals balance: what all ranks send equals what all ranks receive. Object
collectives (all_gather_object, broadcast_object_list, ...) are counted through the tensor collectives
they make inside. torch's functional collectives and DTensor are not traced: such problems declare
`traffic()`.

HBM bytes are the reference's input plus output bytes: a lower bound for any implementation that reads
its inputs and writes its outputs once (problems whose inputs need not be read whole declare `traffic()`).
FLOPs are torch.utils.flop_counter's count: matrix products, convolutions and attention (the work a
matrix engine does), not elementwise work.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from harness.common import failures
from harness.common.messages import Trace
from harness.rank.candidate import trimmed_traceback

MAX_RECORDS = 64  # collectives listed one by one in a reply; the per-kind totals always cover all of them


# -- the byte rules (pure) ----------------------------------------------------------------------------


def all_reduce_bytes(size: int, world: int) -> tuple[int, int]:
    """(send, recv) of one rank in a bandwidth-optimal all-reduce of `size` bytes over `world` ranks."""
    moved = 2 * (world - 1) * size // world if world > 1 else 0
    return moved, moved


def all_gather_bytes(parts: list[int], me: int) -> tuple[int, int]:
    """Every rank ends with every part; rank `me` contributes parts[me] (parts may be uneven)."""
    return (len(parts) - 1) * parts[me], sum(parts) - parts[me]


def reduce_scatter_bytes(parts: list[int], me: int) -> tuple[int, int]:
    """Rank j ends with the reduction of everyone's parts[j]; rank `me` sends its other parts."""
    return sum(parts) - parts[me], (len(parts) - 1) * parts[me]


def all_to_all_bytes(send_parts: list[int], recv_parts: list[int], me: int) -> tuple[int, int]:
    """Chunk j of the input goes to rank j; the own chunk never leaves the GPU."""
    return sum(send_parts) - send_parts[me], sum(recv_parts) - recv_parts[me]


def broadcast_bytes(size: int, world: int, is_root: bool) -> tuple[int, int]:
    if world < 2:
        return 0, 0
    if is_root:
        return size, 0
    return (world - 2) * size // (world - 1), size


def reduce_bytes(size: int, world: int, is_root: bool) -> tuple[int, int]:
    send, recv = broadcast_bytes(size, world, is_root)
    return recv, send  # the mirror image of a broadcast


def gather_bytes(parts: list[int], me: int, root: int) -> tuple[int, int]:
    if me == root:
        return 0, sum(parts) - parts[me]
    return parts[me], 0


def scatter_bytes(parts: list[int], me: int, root: int) -> tuple[int, int]:
    if me == root:
        return sum(parts) - parts[me], 0
    return 0, parts[me]


# -- one recorded call ---------------------------------------------------------------------------------


@dataclass
class Collective:
    kind: str  # the function called, e.g. all_gather_into_tensor, isend
    bytes: int  # S as defined for the kind in the module docstring
    group_size: int
    send_bytes: int
    recv_bytes: int
    root: bool | None = None  # for rooted kinds: is this rank the root
    via: str | None = None  # the object collective that made this call, if any


def _nbytes(value: Any) -> int:
    """Dense bytes of the tensors in a value and its tuples and lists: the HBM bytes of a trace. Not
    harness.rank.transport.tree_nbytes (what an output file holds: dicts and sparse parts counted), so that
    the roofline's bounds stay what they were when its traces were cached."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def _group_size_and_rank(group: Any) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _as_group_rank(group: Any, global_rank: int | None, group_rank: int | None) -> int | None:
    """A root or peer given as a global rank (src=, dst=) or as a group rank (group_src=, ...)."""
    if group_rank is not None:
        return int(group_rank)
    if global_rank is None:
        return None
    if group is None or group is dist.group.WORLD:
        return int(global_rank)
    return int(dist.get_group_rank(group, int(global_rank)))


def _even_parts(total: int, world: int) -> list[int]:
    base = total // world
    return [base] * world


def _split_parts(t: torch.Tensor, splits: list[int] | None, world: int) -> list[int]:
    """Bytes of each chunk of an all_to_all_single buffer (split along dim 0, or evenly)."""
    if not splits:
        return _even_parts(_nbytes(t), world)
    rows = t.shape[0] if t.dim() > 0 else 0
    row_bytes = _nbytes(t) // rows if rows else 0
    return [int(s) * row_bytes for s in splits]


# Each handler turns the bound arguments of one call into records (a rank outside the group: none).
Handler = Callable[[dict[str, Any]], list[Collective]]


def _in_group(args: dict[str, Any]) -> tuple[int, int] | None:
    world, me = _group_size_and_rank(args.get("group"))
    return None if me < 0 else (world, me)


def _all_reduce(kind: str) -> Handler:
    def handle(args: dict[str, Any]) -> list[Collective]:
        if (g := _in_group(args)) is None:
            return []
        world, _ = g
        tensors = args.get("tensor", args.get("tensors"))
        size = _nbytes(tensors)
        return [Collective(kind, size, world, *all_reduce_bytes(size, world))]
    return handle


def _all_gather_list(args: dict[str, Any]) -> list[Collective]:
    if (g := _in_group(args)) is None:
        return []
    world, me = g
    parts = [_nbytes(t) for t in args["tensor_list"]]
    _, recv = all_gather_bytes(parts, me)
    return [Collective("all_gather", sum(parts), world, (world - 1) * _nbytes(args["tensor"]), recv)]


def _all_gather_single(kind: str) -> Handler:
    def handle(args: dict[str, Any]) -> list[Collective]:
        if (g := _in_group(args)) is None:
            return []
        world, _ = g
        out, mine = _nbytes(args["output_tensor"]), _nbytes(args["input_tensor"])
        return [Collective(kind, out, world, (world - 1) * mine, out - mine)]
    return handle


def _all_gather_coalesced(args: dict[str, Any]) -> list[Collective]:
    if (g := _in_group(args)) is None:
        return []
    world, me = g
    send = recv = total = 0
    for outs in args["output_tensor_lists"]:
        parts = [_nbytes(t) for t in outs]
        s, r = all_gather_bytes(parts, me)
        send, recv, total = send + s, recv + r, total + sum(parts)
    return [Collective("all_gather_coalesced", total, world, send, recv)]


def _reduce_scatter_list(args: dict[str, Any]) -> list[Collective]:
    if (g := _in_group(args)) is None:
        return []
    world, me = g
    parts = [_nbytes(t) for t in args["input_list"]]
    send, _ = reduce_scatter_bytes(parts, me)
    return [Collective("reduce_scatter", sum(parts), world, send, (world - 1) * _nbytes(args["output"]))]


def _reduce_scatter_single(kind: str) -> Handler:
    def handle(args: dict[str, Any]) -> list[Collective]:
        if (g := _in_group(args)) is None:
            return []
        world, _ = g
        total, mine = _nbytes(args["input"]), _nbytes(args["output"])
        return [Collective(kind, total, world, total - mine, (world - 1) * mine)]
    return handle


def _all_to_all_single(args: dict[str, Any]) -> list[Collective]:
    if (g := _in_group(args)) is None:
        return []
    world, me = g
    sends = _split_parts(args["input"], args.get("input_split_sizes"), world)
    recvs = _split_parts(args["output"], args.get("output_split_sizes"), world)
    send, recv = all_to_all_bytes(sends, recvs, me)
    return [Collective("all_to_all_single", _nbytes(args["input"]), world, send, recv)]


def _all_to_all_list(args: dict[str, Any]) -> list[Collective]:
    if (g := _in_group(args)) is None:
        return []
    world, me = g
    sends = [_nbytes(t) for t in args["input_tensor_list"]]
    recvs = [_nbytes(t) for t in args["output_tensor_list"]]
    send, recv = all_to_all_bytes(sends, recvs, me)
    return [Collective("all_to_all", sum(sends), world, send, recv)]


def _rooted(kind: str, rule: Callable[[int, int, bool], tuple[int, int]], root_key: str) -> Handler:
    def handle(args: dict[str, Any]) -> list[Collective]:
        if (g := _in_group(args)) is None:
            return []
        world, me = g
        group = args.get("group")
        root = _as_group_rank(group, args.get(root_key), args.get(f"group_{root_key}"))
        size = _nbytes(args["tensor"])
        is_root = root == me
        return [Collective(kind, size, world, *rule(size, world, is_root), root=is_root)]
    return handle


def _rooted_parts(kind: str, root_key: str, list_key: str,
                  rule: Callable[[list[int], int, int], tuple[int, int]]) -> Handler:
    """gather and scatter: one part per rank, to or from a root; the root's list gives uneven parts."""

    def handle(args: dict[str, Any]) -> list[Collective]:
        if (g := _in_group(args)) is None:
            return []
        world, me = g
        root = _as_group_rank(args.get("group"), args.get(root_key), args.get(f"group_{root_key}"))
        mine = _nbytes(args["tensor"])
        listed = args.get(list_key)
        parts = [_nbytes(t) for t in listed] if listed else [mine] * world
        parts[me] = mine
        send, recv = rule(parts, me, root if root is not None else 0)
        return [Collective(kind, sum(parts), world, send, recv, root=me == root)]
    return handle


_gather = _rooted_parts("gather", "dst", "gather_list", gather_bytes)
_scatter = _rooted_parts("scatter", "src", "scatter_list", scatter_bytes)


def _p2p(kind: str, sending: bool) -> Handler:
    peer_key = "dst" if sending else "src"

    def handle(args: dict[str, Any]) -> list[Collective]:
        if (g := _in_group(args)) is None:
            return []
        world, me = g
        peer = _as_group_rank(args.get("group"), args.get(peer_key), args.get(f"group_{peer_key}"))
        size = 0 if peer == me else _nbytes(args["tensor"])
        return [Collective(kind, size, world, size if sending else 0, 0 if sending else size)]
    return handle


def _barrier(args: dict[str, Any]) -> list[Collective]:
    if (g := _in_group(args)) is None:
        return []
    return [Collective("barrier", 0, g[0], 0, 0)]


HANDLERS: dict[str, Handler] = {
    "all_reduce": _all_reduce("all_reduce"),
    "all_reduce_coalesced": _all_reduce("all_reduce_coalesced"),
    "all_gather": _all_gather_list,
    "all_gather_into_tensor": _all_gather_single("all_gather_into_tensor"),
    "all_gather_single": _all_gather_single("all_gather_single"),
    "_all_gather_base": _all_gather_single("_all_gather_base"),
    "all_gather_coalesced": _all_gather_coalesced,
    "reduce_scatter": _reduce_scatter_list,
    "reduce_scatter_tensor": _reduce_scatter_single("reduce_scatter_tensor"),
    "reduce_scatter_single": _reduce_scatter_single("reduce_scatter_single"),
    "_reduce_scatter_base": _reduce_scatter_single("_reduce_scatter_base"),
    "all_to_all_single": _all_to_all_single,
    "all_to_all": _all_to_all_list,
    "broadcast": _rooted("broadcast", broadcast_bytes, "src"),
    "reduce": _rooted("reduce", reduce_bytes, "dst"),
    "gather": _gather,
    "scatter": _scatter,
    "send": _p2p("send", True),
    "isend": _p2p("isend", True),
    "recv": _p2p("recv", False),
    "irecv": _p2p("irecv", False),
    "barrier": _barrier,
    "monitored_barrier": _barrier,
}
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                      "send_object_list", "recv_object_list")


# -- recording ------------------------------------------------------------------------------------------


class _Wrapped:
    """Stands in for a torch.distributed function while recording; compares equal to the original, so
    torch's own checks (P2POp's `op in [isend, irecv]`) accept either."""

    def __init__(self, name: str, original: Callable[..., Any], recorder: CollectiveRecorder) -> None:
        self.name = name
        self.original = original
        self.recorder = recorder
        self.signature = inspect.signature(original)
        self.__wrapped__ = original
        self.__name__ = getattr(original, "__name__", name)
        self.__doc__ = getattr(original, "__doc__", None)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.original

    def __hash__(self) -> int:
        return hash(self.original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec = self.recorder
        if self.name in OBJECT_COLLECTIVES:
            rec.via.append(self.name)  # the tensor collectives it makes inside are the ones recorded
            try:
                return self.original(*args, **kwargs)
            finally:
                rec.via.pop()
        if rec.depth > 0:  # a collective called by another one (e.g. all_gather_into_tensor -> _single)
            return self.original(*args, **kwargs)
        rec.depth += 1
        try:
            if self.name == "batch_isend_irecv":
                return rec.batch(self.original, *args, **kwargs)
            try:
                bound = self.signature.bind(*args, **kwargs)
                bound.apply_defaults()
                rec.add(HANDLERS[self.name](dict(bound.arguments)))
            except Exception as exc:  # an unreadable call is noted, never allowed to break the reference
                rec.errors.append(f"{self.name}: {type(exc).__name__}: {exc}")
            return self.original(*args, **kwargs)
        finally:
            rec.depth -= 1


class CollectiveRecorder:
    """Context manager: while active, every call of a torch.distributed collective is recorded."""

    def __init__(self) -> None:
        self.records: list[Collective] = []
        self.errors: list[str] = []
        self.depth = 0
        self.via: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []
        self._wrapped: dict[str, _Wrapped] = {}

    def add(self, records: list[Collective]) -> None:
        for r in records:
            r.via = self.via[-1] if self.via else None
        self.records.extend(records)

    def batch(self, original: Callable[..., Any], p2p_op_list: list[Any], *args: Any, **kwargs: Any) -> Any:
        """batch_isend_irecv: one record per op. torch picks each op's direction by identity with its
        module's isend, so the ops are handed over with the function it currently holds."""
        ops = []
        for op in p2p_op_list:
            sending = op.op == self._wrapped["isend"]
            name = "isend" if sending else "irecv"
            args_ = {"tensor": op.tensor, "group": op.group, "dst" if sending else "src": op.peer,
                     "group_dst" if sending else "group_src": getattr(op, "group_peer", None)}
            try:
                self.add(HANDLERS[name](args_))
            except Exception as exc:
                self.errors.append(f"batch_isend_irecv: {type(exc).__name__}: {exc}")
            same = object.__new__(type(op))
            same.__dict__.update(op.__dict__)
            same.op = getattr(c10d, name)
            ops.append(same)
        return original(ops, *args, **kwargs)

    def __enter__(self) -> CollectiveRecorder:
        for name in (*HANDLERS, "batch_isend_irecv", *OBJECT_COLLECTIVES):
            original = getattr(c10d, name, None)
            if original is None:  # not in this torch version
                continue
            wrapped = _Wrapped(name, original, self)
            self._wrapped[name] = wrapped
            for module in (c10d, dist):
                if getattr(module, name, None) is original:
                    self._saved.append((module, name, original))
                    setattr(module, name, wrapped)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()


# -- summaries ------------------------------------------------------------------------------------------


def summarize(records: list[Collective]) -> dict[str, dict[str, int]]:
    """Per kind: calls, payload bytes, bytes sent and received by this rank, the largest group."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        s = out.setdefault(r.kind, {"count": 0, "bytes": 0, "send_bytes": 0, "recv_bytes": 0, "group_size": 0})
        s["count"] += 1
        s["bytes"] += r.bytes
        s["send_bytes"] += r.send_bytes
        s["recv_bytes"] += r.recv_bytes
        s["group_size"] = max(s["group_size"], r.group_size)
    return out


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value


@contextmanager
def keep_torch_namespace() -> Iterator[None]:
    """Put back any torch / torch.cuda function or class that torch's own lazy imports rebind meanwhile
    (importing torch._dynamo, as the profiler and the FLOP counter do, wraps torch.manual_seed): the
    harness's tools must leave the worker as they found it, or its integrity guard reads them as
    tampering. Plain state (flags, caches) is left alone: torch may legitimately change it."""
    spaces = [torch, torch.cuda]
    saved = [{k: v for k, v in vars(space).items() if callable(v)} for space in spaces]
    try:
        yield
    finally:
        for space, before in zip(spaces, saved):
            for name, value in before.items():
                if vars(space).get(name, value) is not value:
                    setattr(space, name, value)


class _NoFlops:
    def get_flop_counts(self) -> dict[str, Any]:
        return {}

    def get_total_flops(self) -> int:
        return 0


@contextmanager
def _flop_counter(enabled: bool) -> Iterator[Any]:
    if not enabled:  # importing the counter costs seconds per process (it pulls in torch._dynamo)
        yield _NoFlops()
        return
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        yield counter


def trace_call(fn: Callable[..., Any], inputs: tuple[Any, ...], sync: Callable[[], None],
               count_flops: bool = True) -> dict[str, Any]:
    """One recorded call of `fn` on copies of `inputs` (the caller has already warmed it up)."""
    with keep_torch_namespace(), CollectiveRecorder() as rec, _flop_counter(count_flops) as flops:
        started = time.perf_counter()
        out = fn(*_clone(inputs))
        sync()
        seconds = time.perf_counter() - started
    by_op = {str(op): int(n) for op, n in flops.get_flop_counts().get("Global", {}).items()}
    input_bytes, output_bytes = _nbytes(inputs), _nbytes(out)
    return {
        "collectives": [asdict(r) for r in rec.records[:MAX_RECORDS]],
        "collective_count": len(rec.records),
        "by_kind": summarize(rec.records),
        "send_bytes": sum(r.send_bytes for r in rec.records),
        "recv_bytes": sum(r.recv_bytes for r in rec.records),
        "flops": int(flops.get_total_flops()),
        "flops_by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:8]),
        "input_bytes": input_bytes,
        "output_bytes": output_bytes,
        "hbm_bytes": input_bytes + output_bytes,
        "trace_errors": rec.errors[:8],
        "traced_call_s": seconds,
    }


def trace_in_worker(worker: Any, req: Trace) -> dict[str, Any]:
    """Op "trace": the reference at req.shape on the inputs of (seed, trial); warm-up call first.
    req.flops = False skips the FLOP counter."""
    problem = worker.problem(req.problem)
    shape = problem.shape(req.shape)
    inputs = worker.inputs(problem, shape, req.seed, req.trial)
    try:
        problem.solution(*_clone(inputs))  # lazy set-up (groups, communicators) stays out of the trace
        worker.sync()
        traced = trace_call(problem.solution, inputs, worker.sync, req.flops)
    except Exception as exc:
        return {"ok": False, "verdict": failures.INFRA_ERROR,
                "message": f"rank {worker.rank}: the reference raised {type(exc).__name__} while traced: {exc}"[:600],
                "evidence": trimmed_traceback(exc)}
    return {"ok": True, **traced}
