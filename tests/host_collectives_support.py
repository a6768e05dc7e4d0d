"""One rank of tests/harness/emulation/test_host_collectives.py: every collective of the host backend on CPU,
each compared with an oracle computed in this process from every rank's inputs, and with gloo wherever gloo serves the
same call. Run as `python -m tests.host_collectives_support RANK WORLD INIT_FILE OUT_JSON`.

Inputs are drawn from a generator seeded by (case, rank), so every rank can draw every other rank's
inputs and compute the expected result itself.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.emulation import collectives

FLOAT_TOL = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@dataclass
class Ctx:
    rank: int
    world: int
    ours: Any  # the default group: the host backend
    gloo: Any  # a gloo group over the same ranks


@dataclass
class Outcome:
    ours: list[torch.Tensor]
    oracle: list[torch.Tensor]
    gloo: list[torch.Tensor] | str | None = None  # None: gloo not tried; str: gloo refused the call


def draw(tag: str, rank: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{tag}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if not dtype.is_floating_point:
        return torch.randint(-40, 40, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def with_gloo(fn: Callable[[Any], list[torch.Tensor]], group: Any) -> list[torch.Tensor] | str:
    try:
        return fn(group)
    except Exception as err:  # gloo's gaps are data for the report, not failures of the backend
        return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"


CASES: dict[str, Callable[[Ctx], Outcome]] = {}


def case(name: str) -> Callable[[Callable[[Ctx], Outcome]], Callable[[Ctx], Outcome]]:
    def register(fn: Callable[[Ctx], Outcome]) -> Callable[[Ctx], Outcome]:
        CASES[name] = fn
        return fn
    return register


def _fold(parts: list[torch.Tensor], name: str) -> torch.Tensor:
    acc = parts[0].double() if parts[0].is_floating_point() else parts[0].clone()
    for p in parts[1:]:
        q = p.double() if p.is_floating_point() else p
        acc = {"SUM": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b, "MIN": torch.minimum,
               "MAX": torch.maximum, "BAND": lambda a, b: a & b, "BOR": lambda a, b: a | b,
               "BXOR": lambda a, b: a ^ b}[name](acc, q)
    return acc


def _all_reduce_case(name: str, dtype: torch.dtype, use_gloo: bool) -> Callable[[Ctx], Outcome]:
    tag = f"all_reduce/{name}/{dtype}"

    def run(c: Ctx) -> Outcome:
        def go(group: Any) -> list[torch.Tensor]:
            t = draw(tag, c.rank, (5, 7), dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name), group=group)
            return [t]

        parts = [draw(tag, r, (5, 7), dtype) for r in range(c.world)]
        if dtype == torch.bool:
            stacked = torch.stack(parts)
            expected = stacked.any(0) if name in ("SUM", "MAX") else stacked.all(0)
        else:
            expected = _fold(parts, name).to(dtype)
        return Outcome(go(c.ours), [expected], with_gloo(go, c.gloo) if use_gloo else None)

    return run


for _name in ("SUM", "PRODUCT", "MIN", "MAX"):
    for _dtype in (torch.float32, torch.bfloat16, torch.int32, torch.int64):
        CASES[f"all_reduce_{_name.lower()}_{str(_dtype)[6:]}"] = _all_reduce_case(_name, _dtype, True)
for _name in ("BAND", "BOR", "BXOR"):
    CASES[f"all_reduce_{_name.lower()}_int32"] = _all_reduce_case(_name, torch.int32, True)
for _name in ("SUM", "MAX", "MIN"):
    CASES[f"all_reduce_{_name.lower()}_bool"] = _all_reduce_case(_name, torch.bool, False)


def _total(parts: Iterable[torch.Tensor]) -> torch.Tensor:
    """The sum of tensors (typed: builtin sum starts from the int 0)."""
    return functools.reduce(torch.add, parts)


@case("all_reduce_avg_float32")
def _avg(c: Ctx) -> Outcome:
    t = draw("avg", c.rank, (6,))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return Outcome([t], [_total(draw("avg", r, (6,)).double() for r in range(c.world)).float() / c.world])


@case("all_reduce_avg_int64")
def _avg_int(c: Ctx) -> Outcome:
    t = draw("avgi", c.rank, (9,), torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    total = _total(draw("avgi", r, (9,), torch.int64) for r in range(c.world))
    return Outcome([t], [torch.div(total, c.world, rounding_mode="trunc")])


@case("all_reduce_premul_sum")
def _premul(c: Ctx) -> Outcome:
    t = draw("premul", c.rank, (6,))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))  # type: ignore[attr-defined]  # private, NCCL's own
    return Outcome([t], [_total(draw("premul", r, (6,)).double() * 0.5 for r in range(c.world)).float()])


@case("all_reduce_async_op")
def _async(c: Ctx) -> Outcome:
    t = draw("async", c.rank, (4,))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    return Outcome([t], [_fold([draw("async", r, (4,)) for r in range(c.world)], "SUM").float()])


@case("reduce_to_last")
def _reduce(c: Ctx) -> Outcome:
    dst = c.world - 1

    def go(group: Any) -> list[torch.Tensor]:
        t = draw("reduce", c.rank, (3, 4))
        dist.reduce(t, dst=dst, group=group)
        return [t] if c.rank == dst else []

    expected = [_fold([draw("reduce", r, (3, 4)) for r in range(c.world)], "SUM").float()] if c.rank == dst else []
    return Outcome(go(c.ours), expected, with_gloo(go, c.gloo))


@case("broadcast_from_last")
def _broadcast(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        t = draw("bcast", c.rank, (4, 3), torch.bfloat16)
        dist.broadcast(t, src=c.world - 1, group=group)
        return [t]

    return Outcome(go(c.ours), [draw("bcast", c.world - 1, (4, 3), torch.bfloat16)], with_gloo(go, c.gloo))


@case("all_gather_list_even")
def _ag_even(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = [torch.empty(2, 3) for _ in range(c.world)]
        dist.all_gather(out, draw("age", c.rank, (2, 3)), group=group)
        return out

    return Outcome(go(c.ours), [draw("age", r, (2, 3)) for r in range(c.world)], with_gloo(go, c.gloo))


@case("all_gather_list_uneven")
def _ag_uneven(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = [torch.empty(r + 1, 3) for r in range(c.world)]
        dist.all_gather(out, draw("agu", c.rank, (c.rank + 1, 3)), group=group)
        return out

    return Outcome(go(c.ours), [draw("agu", r, (r + 1, 3)) for r in range(c.world)], with_gloo(go, c.gloo))


@case("all_gather_into_tensor_concatenated")
def _agt_cat(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = torch.empty(2 * c.world, 3, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, draw("agc", c.rank, (2, 3), torch.bfloat16), group=group)
        return [out]

    expected = torch.cat([draw("agc", r, (2, 3), torch.bfloat16) for r in range(c.world)])
    return Outcome(go(c.ours), [expected], with_gloo(go, c.gloo))


@case("all_gather_into_tensor_stacked")
def _agt_stack(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = torch.empty(c.world, 2, 3)
        dist.all_gather_into_tensor(out, draw("ags", c.rank, (2, 3)), group=group)
        return [out]

    return Outcome(go(c.ours), [torch.stack([draw("ags", r, (2, 3)) for r in range(c.world)])],
                   with_gloo(go, c.gloo))


@case("all_gather_in_place_view")
def _ag_in_place(c: Ctx) -> Outcome:
    out = torch.zeros(c.world * 4)
    mine = out[c.rank * 4:(c.rank + 1) * 4]
    mine.copy_(draw("agi", c.rank, (4,)))
    dist.all_gather_into_tensor(out, mine)
    return Outcome([out], [torch.cat([draw("agi", r, (4,)) for r in range(c.world)])])


@case("reduce_scatter_list_even")
def _rs_even(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = torch.empty(3, 2)
        dist.reduce_scatter(out, [draw(f"rse{j}", c.rank, (3, 2)) for j in range(c.world)], group=group)
        return [out]

    expected = _fold([draw(f"rse{c.rank}", r, (3, 2)) for r in range(c.world)], "SUM").float()
    return Outcome(go(c.ours), [expected], with_gloo(go, c.gloo))


@case("reduce_scatter_list_uneven")
def _rs_uneven(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = torch.empty(c.rank + 1, 2)
        dist.reduce_scatter(out, [draw(f"rsu{j}", c.rank, (j + 1, 2)) for j in range(c.world)], group=group)
        return [out]

    expected = _fold([draw(f"rsu{c.rank}", r, (c.rank + 1, 2)) for r in range(c.world)], "SUM").float()
    return Outcome(go(c.ours), [expected], with_gloo(go, c.gloo))


@case("reduce_scatter_tensor_max")
def _rst(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = torch.empty(4, dtype=torch.int32)
        dist.reduce_scatter_tensor(out, draw("rst", c.rank, (4 * c.world,), torch.int32), op=dist.ReduceOp.MAX,
                                   group=group)
        return [out]

    full = _fold([draw("rst", r, (4 * c.world,), torch.int32) for r in range(c.world)], "MAX")
    return Outcome(go(c.ours), [full[c.rank * 4:(c.rank + 1) * 4]], with_gloo(go, c.gloo))


@case("all_to_all_list_even")
def _a2a_even(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = [torch.empty(2, 2) for _ in range(c.world)]
        dist.all_to_all(out, [draw(f"a2e{j}", c.rank, (2, 2)) for j in range(c.world)], group=group)
        return out

    return Outcome(go(c.ours), [draw(f"a2e{c.rank}", r, (2, 2)) for r in range(c.world)], with_gloo(go, c.gloo))


@case("all_to_all_list_uneven")
def _a2a_uneven(c: Ctx) -> Outcome:
    size = lambda src, dst: (src + 2 * dst) % 3 + 1  # noqa: E731  # rows rank src sends rank dst

    def go(group: Any) -> list[torch.Tensor]:
        out = [torch.empty(size(r, c.rank), 2) for r in range(c.world)]
        dist.all_to_all(out, [draw(f"a2u{j}", c.rank, (size(c.rank, j), 2)) for j in range(c.world)], group=group)
        return out

    return Outcome(go(c.ours), [draw(f"a2u{c.rank}", r, (size(r, c.rank), 2)) for r in range(c.world)],
                   with_gloo(go, c.gloo))


@case("all_to_all_single_even")
def _a2as_even(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = torch.empty(2 * c.world, 3, dtype=torch.bfloat16)
        dist.all_to_all_single(out, draw("a2s", c.rank, (2 * c.world, 3), torch.bfloat16), group=group)
        return [out]

    expected = torch.cat([draw("a2s", r, (2 * c.world, 3), torch.bfloat16)[2 * c.rank:2 * c.rank + 2]
                          for r in range(c.world)])
    return Outcome(go(c.ours), [expected], with_gloo(go, c.gloo))


@case("all_to_all_single_uneven")
def _a2as_uneven(c: Ctx) -> Outcome:
    rows = lambda src, dst: (3 * src + dst) % 4  # noqa: E731  # zero rows included

    def go(group: Any) -> list[torch.Tensor]:
        ins = [rows(c.rank, j) for j in range(c.world)]
        outs = [rows(r, c.rank) for r in range(c.world)]
        out = torch.empty(sum(outs), 2)
        dist.all_to_all_single(out, draw("a2su", c.rank, (sum(ins), 2)), outs, ins, group=group)
        return [out]

    pieces = []
    for r in range(c.world):
        ins = [rows(r, j) for j in range(c.world)]
        start = sum(ins[:c.rank])
        pieces.append(draw("a2su", r, (sum(ins), 2))[start:start + ins[c.rank]])
    return Outcome(go(c.ours), [torch.cat(pieces)], with_gloo(go, c.gloo))


@case("gather_to_first")
def _gather(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        out = [torch.empty(3) for _ in range(c.world)] if c.rank == 0 else None
        dist.gather(draw("gather", c.rank, (3,)), out, dst=0, group=group)
        return out or []

    expected = [draw("gather", r, (3,)) for r in range(c.world)] if c.rank == 0 else []
    return Outcome(go(c.ours), expected, with_gloo(go, c.gloo))


@case("scatter_from_last")
def _scatter(c: Ctx) -> Outcome:
    src = c.world - 1

    def go(group: Any) -> list[torch.Tensor]:
        out = torch.empty(2, 2)
        pieces = [draw(f"scatter{j}", src, (2, 2)) for j in range(c.world)] if c.rank == src else None
        dist.scatter(out, pieces, src=src, group=group)
        return [out]

    return Outcome(go(c.ours), [draw(f"scatter{c.rank}", src, (2, 2))], with_gloo(go, c.gloo))


@case("send_recv_ring")
def _ring(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        got = torch.empty(5)
        # Blocking calls in an order gloo cannot deadlock in (its send waits for the receiver).
        if c.rank % 2 == 0:
            dist.send(draw("ring", c.rank, (5,)), dst=(c.rank + 1) % c.world, group=group)
            dist.recv(got, src=(c.rank - 1) % c.world, group=group)
        else:
            dist.recv(got, src=(c.rank - 1) % c.world, group=group)
            dist.send(draw("ring", c.rank, (5,)), dst=(c.rank + 1) % c.world, group=group)
        return [got]

    return Outcome(go(c.ours), [draw("ring", (c.rank - 1) % c.world, (5,))], with_gloo(go, c.gloo))


@case("irecv_before_isend_large")
def _irecv_first(c: Ctx) -> Outcome:
    # Every rank posts its receive first and sends 8 MB: a backend whose send blocked would deadlock.
    n = 1 << 21
    got = torch.empty(n)
    recv = dist.irecv(got, src=(c.rank - 1) % c.world)
    send = dist.isend(draw("big", c.rank, (n,)), dst=(c.rank + 1) % c.world)
    assert recv is not None and send is not None  # None only for ranks outside the group
    recv.wait()
    send.wait()
    return Outcome([got], [draw("big", (c.rank - 1) % c.world, (n,))])


@case("batch_isend_irecv_both_ways")
def _batch(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        left, right = (c.rank - 1) % c.world, (c.rank + 1) % c.world
        from_left, from_right = torch.empty(4, dtype=torch.bfloat16), torch.empty(4, dtype=torch.bfloat16)
        ops = [dist.P2POp(dist.irecv, from_left, left, group), dist.P2POp(dist.irecv, from_right, right, group),
               dist.P2POp(dist.isend, draw("bl", c.rank, (4,), torch.bfloat16), left, group),
               dist.P2POp(dist.isend, draw("br", c.rank, (4,), torch.bfloat16), right, group)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        return [from_left, from_right]

    left, right = (c.rank - 1) % c.world, (c.rank + 1) % c.world
    expected = [draw("br", left, (4,), torch.bfloat16), draw("bl", right, (4,), torch.bfloat16)]
    if c.world == 2:  # left and right are one peer: messages of a pair match in the order they were posted
        expected = [draw("bl", left, (4,), torch.bfloat16), draw("br", left, (4,), torch.bfloat16)]
    return Outcome(go(c.ours), expected, with_gloo(go, c.gloo))


@case("barrier")
def _barrier(c: Ctx) -> Outcome:
    dist.barrier()
    return Outcome([], [])


@case("subgroup_first_and_last")
def _subgroup(c: Ctx) -> Outcome:
    members = [0, c.world - 1]
    group = dist.new_group(members)
    if c.rank not in members:
        return Outcome([], [])
    t = draw("sub", c.rank, (3,))
    dist.all_reduce(t, group=group)
    out = [torch.empty(3) for _ in members]
    dist.all_gather(out, draw("sub2", c.rank, (3,)), group=group)
    return Outcome([t, *out], [_fold([draw("sub", r, (3,)) for r in members], "SUM").float(),
                               *[draw("sub2", r, (3,)) for r in members]])


@case("new_subgroups_by_enumeration")
def _subgroups(c: Ctx) -> Outcome:
    evens, odds = list(range(0, c.world, 2)), list(range(1, c.world, 2))
    mine, _ = dist.new_subgroups_by_enumeration([evens, odds])
    members = evens if c.rank % 2 == 0 else odds
    t = torch.full((2,), float(c.rank + 1))
    dist.all_reduce(t, group=mine)
    return Outcome([t], [torch.full((2,), float(sum(r + 1 for r in members)))])


@case("functional_collectives")
def _functional(c: Ctx) -> Outcome:
    import torch.distributed._functional_collectives as fc

    world = dist.group.WORLD
    assert world is not None
    x = draw("fc", c.rank, (2 * c.world, 2))
    summed = fc.all_reduce(x, "sum", world)
    gathered = fc.all_gather_tensor(x, 0, world)
    scattered = fc.reduce_scatter_tensor(x, "sum", 0, world)
    exchanged = fc.all_to_all_single(x, None, None, world)
    parts = [draw("fc", r, (2 * c.world, 2)) for r in range(c.world)]
    total = _fold(parts, "SUM").float()
    return Outcome([summed, gathered, scattered, exchanged],
                   [total, torch.cat(parts), total[2 * c.rank:2 * c.rank + 2],
                    torch.cat([p[2 * c.rank:2 * c.rank + 2] for p in parts])])


@case("object_collectives")
def _objects(c: Ctx) -> Outcome:
    gathered: list[Any] = [None] * c.world
    dist.all_gather_object(gathered, {"rank": c.rank, "shape": [c.rank, 2]})
    sent = [{"from": 0, "x": list(range(5))}] if c.rank == 0 else [None]
    dist.broadcast_object_list(sent, src=0)
    ok = (gathered == [{"rank": r, "shape": [r, 2]} for r in range(c.world)]
          and sent == [{"from": 0, "x": [0, 1, 2, 3, 4]}])
    return Outcome([torch.tensor(ok)], [torch.tensor(True)])


# Calls NCCL refuses: every rank must get the error, and the group must stay usable afterwards.
# Large enough for the reduce-scatter + all-gather form (reductions.SPLIT_BYTES), and not a multiple of W.
LARGE = 40_001


def _large_all_reduce_case(name: str, dtype: torch.dtype) -> Callable[[Ctx], Outcome]:
    tag = f"all_reduce_large/{name}/{dtype}"

    def run(c: Ctx) -> Outcome:
        from harness.emulation.collectives import reductions, rules

        assert LARGE * dtype.itemsize >= reductions.SPLIT_BYTES
        t = draw(tag, c.rank, (LARGE,), dtype)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        parts = [draw(tag, r, (LARGE,), dtype) for r in range(c.world)]
        folded = rules.combine(parts, name)  # the direct form's rank-order fold: the same bits on every rank
        if not torch.equal(t, folded):
            raise AssertionError(f"the split all_reduce differs from the rank-order fold in "
                                 f"{int((t != folded).sum())} elements")
        return Outcome([t], [_fold(parts, name).to(dtype)])

    return run


for _name, _dtype in (("SUM", torch.bfloat16), ("SUM", torch.float32), ("MIN", torch.float32),
                      ("PRODUCT", torch.int64)):
    CASES[f"all_reduce_large_{_name.lower()}_{str(_dtype)[6:]}"] = _large_all_reduce_case(_name, _dtype)


@case("all_reduce_large_avg_float32")
def _large_avg(c: Ctx) -> Outcome:
    t = draw("lavg", c.rank, (LARGE,))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return Outcome([t], [_total(draw("lavg", r, (LARGE,)).double() for r in range(c.world)).float() / c.world])


@case("all_reduce_large_matches_gloo")
def _large_gloo(c: Ctx) -> Outcome:
    def go(group: Any) -> list[torch.Tensor]:
        t = draw("lgloo", c.rank, (LARGE,))
        dist.all_reduce(t, group=group)
        return [t]

    return Outcome(go(c.ours), [_fold([draw("lgloo", r, (LARGE,)) for r in range(c.world)], "SUM").float()],
                   with_gloo(go, c.gloo))


@case("reduce_scatter_tensor_in_place")
def _rs_in_place(c: Ctx) -> Outcome:
    # The output is this rank's own chunk of the input (a common in-place form), and, in a second call,
    # the first chunk on every rank: another rank's chunk, read for sending while it is written.
    n = 5
    t = draw("rsip", c.rank, (n * c.world,))
    dist.reduce_scatter_tensor(t[c.rank * n:(c.rank + 1) * n], t)
    u = draw("rsip", c.rank, (n * c.world,))
    dist.reduce_scatter_tensor(u[:n], u)
    total = _total(draw("rsip", r, (n * c.world,)).double() for r in range(c.world)).float()
    mine = total[c.rank * n:(c.rank + 1) * n]
    return Outcome([t[c.rank * n:(c.rank + 1) * n], u[:n]], [mine, mine])


@case("all_gather_into_tensor_in_place")
def _agt_in_place(c: Ctx) -> Outcome:
    n = 6
    out = torch.zeros(n * c.world)
    out[c.rank * n:(c.rank + 1) * n] = draw("agip", c.rank, (n,))
    dist.all_gather_into_tensor(out, out[c.rank * n:(c.rank + 1) * n])
    return Outcome([out], [torch.cat([draw("agip", r, (n,)) for r in range(c.world)])])


@case("all_to_all_single_in_place")
def _a2a_in_place(c: Ctx) -> Outcome:
    t = draw("a2aip", c.rank, (3 * c.world,))
    dist.all_to_all_single(t, t)
    expected = torch.cat([draw("a2aip", r, (3 * c.world,))[3 * c.rank:3 * (c.rank + 1)] for r in range(c.world)])
    return Outcome([t], [expected])


@case("all_to_all_single_large")
def _a2a_large(c: Ctx) -> Outcome:
    n = 100_003 * c.world  # a payload larger than a read's staging buffer, read in pieces
    t = draw("a2al", c.rank, (n,))
    out = torch.empty(n)
    dist.all_to_all_single(out, t)
    share = n // c.world
    expected = torch.cat([draw("a2al", r, (n,))[share * c.rank:share * (c.rank + 1)] for r in range(c.world)])
    return Outcome([out], [expected])


REFUSALS: dict[str, tuple[type[BaseException], str, Callable[[Ctx], None]]] = {
    "wrong_output_size": (ValueError, "world_size times input", lambda c: dist.all_gather_into_tensor(
        torch.empty(3 * c.world + 1), torch.empty(3))),
    "non_contiguous": (ValueError, "contiguous", lambda c: dist.all_reduce(torch.empty(4, 4).t())),
    "bitwise_on_floats": (ValueError, "non-integral", lambda c: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)),
    "uneven_without_splits": (ValueError, "divide equally", lambda c: dist.all_to_all_single(
        torch.empty(c.world + 1), torch.empty(c.world + 1))),
    "splits_do_not_add_up": (ValueError, "Split sizes", lambda c: dist.all_to_all_single(
        torch.empty(c.world), torch.empty(c.world), [1] * c.world, [2] * c.world)),
    "different_collectives": (RuntimeError, "every rank must call the same collectives", lambda c: (
        dist.all_reduce(torch.ones(2)) if c.rank == 0 else dist.all_gather_into_tensor(torch.empty(c.world * 2),
                                                                                       torch.ones(2)))),
    "different_sizes": (ValueError, "elements where rank", lambda c: dist.all_reduce(torch.ones(2 + c.rank))),
    "different_sizes_large": (ValueError, "elements where rank", lambda c: dist.all_reduce(
        torch.ones(LARGE + c.rank))),
}


def _same(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    if a.is_floating_point():
        tol = FLOAT_TOL.get(a.dtype, 1e-5)
        if not torch.allclose(a.double(), b.double(), atol=tol, rtol=tol):
            return f"max difference {(a.double() - b.double()).abs().max().item():.3g}"
        return None
    return None if torch.equal(a, b) else "values differ"


def _compare(got: list[torch.Tensor], want: list[torch.Tensor]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} tensors vs {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        why = _same(a, b)
        if why:
            return f"tensor {i}: {why}"
    return None


def _threads_seen(c: Ctx) -> dict[str, int]:
    """torch's thread count inside an operation's reduction and after it, with the caller at 3 threads."""
    from harness.emulation.collectives import rules  # group.py calls rules.combine through the module

    seen: dict[str, int] = {}
    combine = rules.combine

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen["during"] = torch.get_num_threads()
        return combine(*args, **kwargs)

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    rules.combine = spy
    try:
        dist.all_reduce(torch.ones(8), group=c.ours)
    finally:
        rules.combine = combine
    seen["after"] = torch.get_num_threads()
    torch.set_num_threads(before)
    return seen


def main(argv: list[str]) -> None:
    rank, world, init, out = int(argv[0]), int(argv[1]), argv[2], argv[3]
    warnings.simplefilter("ignore")
    dist.init_process_group(collectives.register(), init_method=f"file://{init}", rank=rank, world_size=world)
    ctx = Ctx(rank, world, dist.group.WORLD, dist.new_group(backend="gloo"))
    report: dict[str, Any] = {"backend": dist.get_backend(), "cases": {}, "refusals": {}}
    for name, fn in CASES.items():
        try:
            outcome = fn(ctx)
        except Exception:
            report["cases"][name] = {"ok": False, "why": traceback.format_exc()[-1500:]}
            continue
        why = _compare(outcome.ours, outcome.oracle)
        entry: dict[str, Any] = {"ok": why is None, "why": why}
        if isinstance(outcome.gloo, str):
            entry["gloo"] = f"refused: {outcome.gloo}"
        elif outcome.gloo is not None:
            differs = _compare(outcome.ours, outcome.gloo)
            entry["gloo"] = "same" if differs is None else f"differs: {differs}"
        report["cases"][name] = entry
    for name, (kind, fragment, call) in REFUSALS.items():
        try:
            call(ctx)
            report["refusals"][name] = "no error"
        except Exception as err:
            right = isinstance(err, kind) and fragment in str(err)
            report["refusals"][name] = "ok" if right else f"{type(err).__name__}: {err}"
        dist.barrier(group=ctx.ours)  # the group still works after a refused call
    t = torch.ones(1)
    dist.all_reduce(t)
    report["after_refusals"] = t.item()
    report["sequence"] = ctx.ours._get_sequence_number_for_group()
    report["threads"] = _threads_seen(ctx)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    dist.destroy_process_group()


def _sockets() -> int:
    """Sockets this process has open (the listing's own descriptor is gone by the time it is read)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue
    return count


def failure_main(argv: list[str]) -> None:
    """A peer that dies (`peer_dies`: rank 1 exits mid-run) or never calls (`peer_silent`: rank 1 sleeps past
    the group's 3 s timeout): rank 0's next all_reduce must raise a clear error, and once the group is
    destroyed no socket of it may be left open. Rank 0 writes what it saw to OUT_JSON."""
    scenario, rank, world, init, out = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    warnings.simplefilter("ignore")
    before = _sockets()
    dist.init_process_group(collectives.register(), init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=3))
    dist.barrier()
    if rank == 1:
        if scenario == "peer_dies":
            os._exit(3)
        time.sleep(12)
        os._exit(0)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(LARGE))
        error = "no error"
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    seen = {"error": error, "seconds": time.monotonic() - started}
    dist.destroy_process_group()
    seen["sockets_left"] = _sockets() - before
    with open(out, "w") as f:
        json.dump(seen, f)


def _cuda_calls(world: int, rank: int, device: torch.device) -> dict[str, list[torch.Tensor]]:
    """The operations a one-GPU emulation's references call, on tensors on `device` (results moved to CPU)."""
    big, small = LARGE * world, 6 * world
    got: dict[str, list[torch.Tensor]] = {}
    for label, n in (("small", small), ("large", big)):
        t = draw(f"cuda/{label}", rank, (n,), torch.bfloat16).to(device)
        dist.all_reduce(t)
        got[f"all_reduce_{label}"] = [t]
        out = torch.empty(n // world, dtype=torch.bfloat16, device=device)
        dist.reduce_scatter_tensor(out, draw(f"cuda/rs{label}", rank, (n,), torch.bfloat16).to(device))
        got[f"reduce_scatter_tensor_{label}"] = [out]
        gathered = torch.empty(n * world, device=device)
        dist.all_gather_into_tensor(gathered, draw(f"cuda/ag{label}", rank, (n,)).to(device))
        got[f"all_gather_into_tensor_{label}"] = [gathered]
        swapped = torch.empty(n, device=device)
        dist.all_to_all_single(swapped, draw(f"cuda/a2a{label}", rank, (n,)).to(device))
        got[f"all_to_all_single_{label}"] = [swapped]
        b = draw(f"cuda/bc{label}", rank, (n,)).to(device)
        dist.broadcast(b, src=world - 1)
        got[f"broadcast_{label}"] = [b]
        r = draw(f"cuda/red{label}", rank, (n,)).to(device)
        dist.reduce(r, dst=0)
        got[f"reduce_{label}"] = [r] if rank == 0 else []
    return {name: [t.cpu() for t in ts] for name, ts in got.items()}


def cuda_main(argv: list[str]) -> None:
    """Every rank on GPU 0 (the one-GPU emulation's layout): each operation on CUDA tensors must give the
    same bits as on CPU tensors in the same group. Rank 0 writes the names that differ to OUT_JSON."""
    rank, world, init, out = int(argv[0]), int(argv[1]), argv[2], argv[3]
    warnings.simplefilter("ignore")
    torch.cuda.set_device(0)
    dist.init_process_group(collectives.register(), init_method=f"file://{init}", rank=rank, world_size=world)
    on_gpu = _cuda_calls(world, rank, torch.device("cuda", 0))
    on_cpu = _cuda_calls(world, rank, torch.device("cpu"))
    differ = [name for name in on_cpu if len(on_cpu[name]) != len(on_gpu[name])
              or not all(torch.equal(a, b) for a, b in zip(on_cpu[name], on_gpu[name]))]
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"compared": sorted(on_cpu), "differ": differ}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "--cuda":
        cuda_main(sys.argv[2:])
    elif sys.argv[1] == "--failure":
        failure_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
