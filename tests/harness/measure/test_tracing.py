"""Traced interconnect bytes of every collective kind, against hand computation, at W = 2, 4 and 8.

One gloo pool per world size serves every case: a "zoo" problem (written to a temporary folder) whose
shapes each select one collective, traced with the worker's op "trace". Expected bytes are written out
from the bandwidth-optimal rules of docs/design.md, not from harness.rank.tracing's own functions.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.launch.pool import RankPool
from harness.problems.problem import load_problem
from harness.rank import tracing

WORLD_SIZES = (2, 4, 8)
COLS = 4  # fp32 columns: a row is 16 bytes
ROW = COLS * 4

ZOO = textwrap.dedent('''
    """Every collective kind, one per shape; x is [2W, 4] fp32 on every rank."""

    import torch
    import torch.distributed as dist

    KINDS = ["all_reduce", "async_all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
             "reduce_scatter", "all_to_all_single", "all_to_all_single_uneven", "all_to_all", "broadcast",
             "reduce", "gather", "scatter", "send_recv", "batch_isend_irecv", "all_gather_object", "barrier",
             "subgroup_all_reduce", "matmul"]
    PROBLEM = {
        "name": "zoo",
        "category": "collective",
        "source": {"codebase": "tests", "path": "tests/harness/measure/test_tracing.py", "symbol": "ZOO"},
        "summary": "One torch.distributed collective per shape, for the tracing tests.",
        "dtype": "float32",
        "shapes": {**{k: {"kind": k} for k in KINDS}, "default": {"kind": "all_reduce"},
                   "small": {"kind": "all_reduce"}},
        "world_sizes": [2, 4, 8],
        "tolerance": {"atol": 0.0, "rtol": 0.0},
    }
    _GROUPS = {}


    def make_inputs(shape, rank, world_size, generator, device):
        return torch.randn(2 * world_size, 4, generator=generator, device=device), shape["kind"]


    def _even_group():
        if "even" not in _GROUPS:
            _GROUPS["even"] = dist.new_group(list(range(0, dist.get_world_size(), 2)))
        return _GROUPS["even"]


    def solution(x, kind):
        w, r = dist.get_world_size(), dist.get_rank()
        x = x.clone()
        if kind == "all_reduce":
            dist.all_reduce(x)
        elif kind == "async_all_reduce":
            dist.all_reduce(x, async_op=True).wait()
        elif kind == "all_gather_into_tensor":
            out = x.new_empty(w * x.shape[0], x.shape[1])
            dist.all_gather_into_tensor(out, x)
            x = out
        elif kind == "all_gather":
            parts = [torch.empty_like(x) for _ in range(w)]
            dist.all_gather(parts, x)
            x = torch.cat(parts)
        elif kind == "reduce_scatter_tensor":
            out = x.new_empty(x.shape[0] // w, x.shape[1])
            dist.reduce_scatter_tensor(out, x)
            x = out
        elif kind == "reduce_scatter":
            out = x.new_empty(x.shape[0] // w, x.shape[1])
            dist.reduce_scatter(out, list(x.chunk(w)))
            x = out
        elif kind == "all_to_all_single":
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x)
            x = out
        elif kind == "all_to_all_single_uneven":  # rank r sends r*W + j + 1 rows to rank j
            send = [r * w + j + 1 for j in range(w)]
            recv = [s * w + r + 1 for s in range(w)]
            src = x.new_ones(sum(send), x.shape[1])
            x = x.new_empty(sum(recv), x.shape[1])
            dist.all_to_all_single(x, src, recv, send)
        elif kind == "all_to_all":  # list form (gloo wants equal parts): 2 rows to every rank
            ins = [c.contiguous() for c in x.chunk(w)]
            outs = [torch.empty_like(c) for c in ins]
            dist.all_to_all(outs, ins)
            x = torch.cat(outs)
        elif kind == "broadcast":
            dist.broadcast(x, src=1)
        elif kind == "reduce":
            dist.reduce(x, dst=1)
        elif kind == "gather":
            parts = [torch.empty_like(x) for _ in range(w)] if r == 1 else None
            dist.gather(x, gather_list=parts, dst=1)
        elif kind == "scatter":
            parts = [c.contiguous() for c in x.chunk(w)] if r == 1 else None
            out = x.new_empty(x.shape[0] // w, x.shape[1])
            dist.scatter(out, scatter_list=parts, src=1)
            x = out
        elif kind == "send_recv":  # a ring, even ranks send first
            got = torch.empty_like(x)
            if r % 2 == 0:
                dist.send(x, (r + 1) % w)
                dist.recv(got, (r - 1) % w)
            else:
                dist.recv(got, (r - 1) % w)
                dist.send(x, (r + 1) % w)
            x = got
        elif kind == "batch_isend_irecv":  # a ring
            got = torch.empty_like(x)
            ops = [dist.P2POp(dist.isend, x, (r + 1) % w), dist.P2POp(dist.irecv, got, (r - 1) % w)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            x = got
        elif kind == "all_gather_object":
            objs = [None] * w
            dist.all_gather_object(objs, {"rank": r})
        elif kind == "barrier":
            dist.barrier()
        elif kind == "subgroup_all_reduce":
            group = _even_group()
            if r % 2 == 0:
                dist.all_reduce(x, group=group)
        elif kind == "matmul":
            x = x @ x.new_ones(x.shape[1], 8)
        return x


    def oracle(shape, world_size, inputs_by_rank):
        raise NotImplementedError("traced only")
''')


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("zoo") / "collective" / "zoo.py"
    path.parent.mkdir()
    path.write_text(ZOO)
    load_problem(path)  # the file itself meets the problem contract
    return path


@pytest.fixture(scope="module")
def pools():
    started: dict[int, RankPool] = {}

    def pool(world_size: int) -> RankPool:
        if world_size not in started:
            started[world_size] = RankPool(world_size, "cpu").start()
        return started[world_size]

    yield pool
    for p in started.values():
        p.close()


def trace(pools, zoo: Path, world_size: int, kind: str) -> list[dict]:
    # FLOPs only where a case checks them: the counter's import costs seconds in every rank process.
    replies = pools(world_size).request({"op": "trace", "problem": str(zoo), "shape": kind, "seed": 0, "trial": 0,
                                         "flops": kind == "matmul"}, timeout=120)
    assert all(r["ok"] for r in replies), [r.get("message") for r in replies]
    assert all(not r["trace_errors"] for r in replies), [r["trace_errors"] for r in replies]
    return replies


def sent(replies: list[dict]) -> list[int]:
    return [r["send_bytes"] for r in replies]


def received(replies: list[dict]) -> list[int]:
    return [r["recv_bytes"] for r in replies]


def expected(world_size: int, kind: str) -> tuple[list[int], list[int], str]:
    """(send per rank, recv per rank, recorded kind) by hand, from the bandwidth-optimal rules of docs/design.md."""
    w = world_size
    x = 2 * w * ROW  # bytes of x: 2W rows
    ranks = range(w)
    if kind in ("all_reduce", "async_all_reduce"):
        moved = 2 * (w - 1) * x // w
        return [moved] * w, [moved] * w, "all_reduce"
    if kind in ("all_gather_into_tensor", "all_gather"):  # S = W * x; each sends its x to W-1 peers
        return [(w - 1) * x] * w, [(w - 1) * x] * w, kind
    if kind in ("reduce_scatter_tensor", "reduce_scatter"):  # S = x; each keeps x/W
        return [x - x // w] * w, [(w - 1) * (x // w)] * w, kind
    if kind == "all_to_all_single":
        return [x - x // w] * w, [x - x // w] * w, kind
    if kind == "all_to_all_single_uneven":
        send = [sum(r * w + j + 1 for j in ranks if j != r) * ROW for r in ranks]
        recv = [sum(s * w + r + 1 for s in ranks if s != r) * ROW for r in ranks]
        return send, recv, "all_to_all_single"
    if kind == "all_to_all":
        return [x - x // w] * w, [x - x // w] * w, kind
    if kind == "broadcast":  # root 1 sends x once; the others receive x and pass on their 1/(W-1) piece
        return ([x if r == 1 else (w - 2) * x // (w - 1) for r in ranks],
                [0 if r == 1 else x for r in ranks], kind)
    if kind == "reduce":
        return ([0 if r == 1 else x for r in ranks],
                [x if r == 1 else (w - 2) * x // (w - 1) for r in ranks], kind)
    if kind == "gather":
        return [0 if r == 1 else x for r in ranks], [(w - 1) * x if r == 1 else 0 for r in ranks], kind
    if kind == "scatter":
        return [(w - 1) * (x // w) if r == 1 else 0 for r in ranks], [0 if r == 1 else x // w for r in ranks], kind
    if kind in ("send_recv", "batch_isend_irecv"):
        return [x] * w, [x] * w, "send" if kind == "send_recv" else "isend"
    if kind == "barrier":
        return [0] * w, [0] * w, kind
    if kind == "subgroup_all_reduce":
        g = w // 2  # ranks 0, 2, 4, ...: the odd ranks are outside the group and record nothing
        moved = 2 * (g - 1) * x // g if g > 1 else 0
        return [moved if r % 2 == 0 else 0 for r in ranks], [moved if r % 2 == 0 else 0 for r in ranks], "all_reduce"
    raise AssertionError(kind)


CASES = ["all_reduce", "async_all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
         "reduce_scatter", "all_to_all_single", "all_to_all_single_uneven", "all_to_all", "broadcast", "reduce",
         "gather", "scatter", "send_recv", "batch_isend_irecv", "barrier", "subgroup_all_reduce"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("kind", CASES)
def test_traced_bytes_match_hand_computation(pools, zoo, world_size, kind):
    replies = trace(pools, zoo, world_size, kind)
    send, recv, recorded = expected(world_size, kind)
    assert sent(replies) == send
    assert received(replies) == recv
    # What the ranks send is what they receive: the rules balance (up to rounding down to whole bytes).
    assert abs(sum(sent(replies)) - sum(received(replies))) < world_size
    kinds = {k for r in replies for k in r["by_kind"]}
    assert recorded in kinds, kinds
    if kind == "subgroup_all_reduce":
        assert [r["by_kind"].get("all_reduce", {}).get("group_size") for r in replies] == [
            world_size // 2 if r % 2 == 0 else None for r in range(world_size)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_p2p_records_name_each_side(pools, zoo, world_size):
    replies = trace(pools, zoo, world_size, "batch_isend_irecv")
    for r in replies:
        assert {c["kind"] for c in r["collectives"]} == {"isend", "irecv"}
        assert r["collective_count"] == 2
        out = next(c for c in r["collectives"] if c["kind"] == "isend")
        assert out["send_bytes"] == out["bytes"] == 2 * world_size * ROW and out["recv_bytes"] == 0


def test_object_collectives_are_counted_through_their_tensor_calls(pools, zoo):
    replies = trace(pools, zoo, 4, "all_gather_object")
    for r in replies:
        assert r["collectives"], "all_gather_object moved nothing?"
        assert all(c["via"] == "all_gather_object" for c in r["collectives"])
        assert r["send_bytes"] > 0 and r["recv_bytes"] > 0
    assert sum(sent(replies)) == sum(received(replies))


def test_flops_and_hbm_bytes(pools, zoo):
    replies = trace(pools, zoo, 2, "matmul")
    rows = 2 * 2
    for r in replies:
        assert r["flops"] == 2 * rows * COLS * 8  # [4, 4] @ [4, 8]
        assert r["send_bytes"] == r["recv_bytes"] == 0
        assert r["input_bytes"] == rows * ROW  # the kind string is not a tensor
        assert r["output_bytes"] == rows * 8 * 4
        assert r["hbm_bytes"] == r["input_bytes"] + r["output_bytes"]


def test_the_recorder_leaves_torch_distributed_as_it_was():
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    before = {name: (getattr(dist, name, None), getattr(c10d, name, None)) for name in tracing.HANDLERS}
    with tracing.CollectiveRecorder():
        assert dist.all_reduce is not before["all_reduce"][0]
        assert dist.all_reduce == before["all_reduce"][0]  # compares equal: torch's own identity checks pass
        assert dist.isend is c10d.isend
    assert {name: (getattr(dist, name, None), getattr(c10d, name, None)) for name in tracing.HANDLERS} == before


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rooted_rules_balance_and_never_exceed_the_payload(world_size):
    size = 3 * 1024 * 7
    for rule in (tracing.broadcast_bytes, tracing.reduce_bytes):
        moves = [rule(size, world_size, r == 0) for r in range(world_size)]
        assert abs(sum(s for s, _ in moves) - sum(r for _, r in moves)) < world_size  # floor rounding only
        assert max(max(s, r) for s, r in moves) == size  # no rank moves more than S
    parts = [100 * (r + 1) for r in range(world_size)]
    assert tracing.gather_bytes(parts, 0, 0) == (0, sum(parts) - parts[0])
    assert tracing.scatter_bytes(parts, 1, 0) == (0, parts[1])
    assert tracing.scatter_bytes(parts, 0, 0) == (sum(parts) - parts[0], 0)
