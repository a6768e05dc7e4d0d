"""The reducing operations of the host collectives: all_reduce, reduce, reduce_scatter (list and tensor
forms). Rank side; torch and the standard library.

Every reduction folds the ranks' contributions in rank order 0..W-1 (rules.combine, into the output's
host memory), so every rank gets the same bits. A large all_reduce is a reduce-scatter then an all-gather:
rank r folds the r-th of W chunks and sends it to the others, so each rank moves 2(W-1)/W of the tensor
instead of W-1 times it and the fold's work is shared; a chunk's fold is the same elementwise fold, so
the bits are the same as the direct form's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from harness.emulation.collectives import rules
from harness.emulation.collectives.exchange import Exchange, Staged
from harness.emulation.collectives.links import COLLECTIVE_SECOND
from harness.emulation.collectives.work import completed

# From this many bytes an all_reduce is a reduce-scatter and an all-gather; below, one round trip of the
# whole tensor costs less than two. Chosen, not tuned: on the loaded 2-core machine medians at 64 KiB
# swung more between runs than any threshold would move them (docs/performance.md).
SPLIT_BYTES = 64 << 10


def _reduce_op(opts: Any) -> Any:
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def chunks(n: int, world: int) -> list[tuple[int, int]]:
    """[start, end) of each rank's share of n elements: as even as can be, the first ranks one larger."""
    base, extra = divmod(n, world)
    bounds, at = [], 0
    for r in range(world):
        size = base + (1 if r < extra else 0)
        bounds.append((at, at + size))
        at += size
    return bounds


def allreduce(x: Exchange, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
    reduce_op = _reduce_op(opts)
    name = rules.op_name(reduce_op)
    x.check("allreduce", tensors)
    for t in tensors:
        rules.check_reduction(name, t.dtype, t.device.type)
    for t in tensors:
        seq = x.next()
        staged = Staged(t)
        if t.numel() * t.element_size() >= SPLIT_BYTES:
            _allreduce_split(x, seq, staged.host, name, reduce_op)
        else:
            for peer in x.peers():
                x.send(peer, seq, "allreduce", staged.host)
            parts = [staged.host if r == x.me else x.receive(r, seq, "allreduce", t.dtype, t.numel())
                     for r in range(x.size)]
            rules.combine(parts, name, reduce_op, out=staged.host)
        staged.commit()
    return completed(list(tensors))


def _allreduce_split(x: Exchange, seq: int, flat: torch.Tensor, name: str, reduce_op: Any) -> None:
    """Reduce-scatter then all-gather, in place in `flat`. Every frame is labelled with the whole tensor's
    element count, so ranks that disagree on the size are told so, as in the direct form."""
    n, dtype = flat.numel(), flat.dtype
    bounds = chunks(n, x.size)
    lo, hi = bounds[x.me]
    for peer in x.peers():
        a, b = bounds[peer]
        x.send(peer, seq, "allreduce", flat[a:b], numel=n)
    parts = [flat[lo:hi] if r == x.me else x.receive(r, seq, "allreduce", dtype, n, piece=hi - lo)
             for r in range(x.size)]
    rules.combine(parts, name, reduce_op, out=flat[lo:hi])
    for peer in x.peers():
        x.send(peer, seq, "allreduce", flat[lo:hi], kind=COLLECTIVE_SECOND, numel=n)
    for r in x.peers():
        a, b = bounds[r]
        flat[a:b].copy_(x.receive(r, seq, "allreduce", dtype, n, kind=COLLECTIVE_SECOND, piece=b - a))


def reduce(x: Exchange, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
    root = x.rank_arg(opts.rootRank, "reduce")
    name = rules.op_name(opts.reduceOp)
    t = tensors[opts.rootTensor] if len(tensors) > 1 else tensors[0]
    x.check("reduce", [t])
    rules.check_reduction(name, t.dtype, t.device.type)
    seq = x.next()
    staged = Staged(t)
    if x.me != root:
        x.send(root, seq, "reduce", staged.host)
    else:
        parts = [staged.host if r == x.me else x.receive(r, seq, "reduce", t.dtype, t.numel())
                 for r in range(x.size)]
        rules.combine(parts, name, opts.reduceOp, out=staged.host)
        staged.commit()
    return completed([t])


def reduce_scatter(x: Exchange, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                   opts: Any = None) -> dist.Work:
    reduce_op = _reduce_op(opts)
    name = rules.op_name(reduce_op)
    for out, inputs in zip(outputs, input_lists):
        x.per_rank("reduce_scatter", inputs, "the input list")
        x.check("reduce_scatter", [out, *inputs])
        x.same_dtype("reduce_scatter", out.dtype, inputs)
        rules.check_reduction(name, out.dtype, out.device.type)
        if inputs[x.me].numel() != out.numel():
            raise ValueError(f"reduce_scatter: rank {x.me}'s input has {inputs[x.me].numel()} elements, "
                             f"its output {out.numel()}")
        seq = x.next()
        for peer in x.peers():
            x.send(peer, seq, "reduce_scatter", Staged(inputs[peer]).host)
        parts = [Staged(inputs[r]).host if r == x.me else x.receive(r, seq, "reduce_scatter", out.dtype, out.numel())
                 for r in range(x.size)]
        _combine_into(out, parts, name, reduce_op)
    return completed(list(outputs))


def _combine_into(out: torch.Tensor, parts: list[torch.Tensor], name: str, reduce_op: Any) -> None:
    """Fold `parts` into `out` (a CPU output directly). An output that overlaps an input otherwise than as
    the very same elements (an in-place reduce_scatter over a shifted view) gets the fold through a copy."""
    staged = Staged(out, read=False)
    if any(_partly_same(staged.host, p) for p in parts):
        staged.host.copy_(rules.combine(parts, name, reduce_op))
    else:
        rules.combine(parts, name, reduce_op, out=staged.host)
    staged.commit()


def _partly_same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    return a.data_ptr() != b.data_ptr()


def reduce_scatter_single(x: Exchange, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
    reduce_op = _reduce_op(opts)
    name = rules.op_name(reduce_op)
    x.check("reduce_scatter_tensor", [output, input])
    x.same_dtype("reduce_scatter_tensor", input.dtype, [output])
    rules.check_reduction(name, output.dtype, output.device.type)
    n = output.numel()
    if input.numel() != n * x.size:
        raise ValueError(f"reduce_scatter_tensor: input tensor must be the same size as output size times world "
                         f"size ({input.numel()} vs {n} x {x.size})")
    seq = x.next()
    flat = Staged(input).host
    for peer in x.peers():
        x.send(peer, seq, "reduce_scatter_tensor", flat[peer * n:(peer + 1) * n])
    parts = [flat[r * n:(r + 1) * n] if r == x.me else x.receive(r, seq, "reduce_scatter_tensor", output.dtype, n)
             for r in range(x.size)]
    _combine_into(output, parts, name, reduce_op)
    return completed([output])


def reduce_scatter_single_coalesced(x: Exchange, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
    for output, input in zip(outputs, inputs):
        reduce_scatter_single(x, output, input, opts)
    return completed(list(outputs))
