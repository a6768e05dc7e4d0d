"""The data-moving operations of the host collectives: broadcast, all_gather (list and tensor forms),
all_to_all (list and single-tensor forms), gather, scatter, barrier. Rank side; torch and the standard library.

A CPU input is sent from its own memory; where an output shares memory with the input (in-place forms),
the input is copied first, so what is sent and kept is the input as it was when the call began.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from harness.emulation.collectives.exchange import Exchange, Staged, write
from harness.emulation.collectives.links import COLLECTIVE
from harness.emulation.collectives.work import completed


def _source(t: torch.Tensor, outputs: list[torch.Tensor]) -> torch.Tensor:
    """`t`'s flat host side, copied where an output shares its memory (the outputs are written while it
    is still read)."""
    host = Staged(t).host
    if t.device.type == "cpu" and host.numel() and any(
            o.numel() and o.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for o in outputs):
        return host.clone()
    return host


def broadcast(x: Exchange, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
    root = x.rank_arg(opts.rootRank, "broadcast")
    t = tensors[opts.rootTensor] if len(tensors) > 1 else tensors[0]
    x.check("broadcast", [t])
    seq = x.next()
    if x.me == root:
        mine = Staged(t).host
        for peer in x.peers():
            x.send(peer, seq, "broadcast", mine)
    else:
        write(t, x.receive(root, seq, "broadcast", t.dtype, t.numel()))
    return completed([t])


def allgather(x: Exchange, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
              opts: Any = None) -> dist.Work:
    for outputs, input in zip(output_lists, inputs):
        x.per_rank("allgather", outputs, "the output list")
        x.check("allgather", [input, *outputs])
        x.same_dtype("allgather", input.dtype, outputs)
        if outputs[x.me].numel() != input.numel():
            raise ValueError(f"allgather: rank {x.me}'s output slot has {outputs[x.me].numel()} elements, "
                             f"its input {input.numel()}")
        seq = x.next()
        mine = _source(input, outputs)
        for peer in x.peers():
            x.send(peer, seq, "allgather", mine)
        for r in range(x.size):
            write(outputs[r], mine if r == x.me else x.receive(r, seq, "allgather", input.dtype, outputs[r].numel()))
    return completed([t for outputs in output_lists for t in outputs])


def all_gather_single(x: Exchange, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
    x.check("all_gather_into_tensor", [output, input])
    x.same_dtype("all_gather_into_tensor", input.dtype, [output])
    n = input.numel()
    if output.numel() != n * x.size:
        raise ValueError(f"all_gather_into_tensor: output tensor size must be equal to world_size times input "
                         f"tensor size ({output.numel()} vs {x.size} x {n})")
    seq = x.next()
    mine = _source(input, [output])
    for peer in x.peers():
        x.send(peer, seq, "all_gather_into_tensor", mine)
    flat = output.view(-1)
    for r in range(x.size):
        src = mine if r == x.me else x.receive(r, seq, "all_gather_into_tensor", input.dtype, n)
        write(flat[r * n:(r + 1) * n], src)
    return completed([output])


def all_gather_single_coalesced(x: Exchange, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                opts: Any = None) -> dist.Work:
    for output, input in zip(outputs, inputs):
        all_gather_single(x, output, input, opts)
    return completed(list(outputs))


def alltoall(x: Exchange, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
    x.per_rank("all_to_all", outputs, "the output list")
    x.per_rank("all_to_all", inputs, "the input list")
    x.check("all_to_all", [*outputs, *inputs])
    for out, inp in zip(outputs, inputs):
        x.same_dtype("all_to_all", inp.dtype, [out])
    if outputs[x.me].numel() != inputs[x.me].numel():
        raise ValueError(f"all_to_all: rank {x.me} sends itself {inputs[x.me].numel()} elements into a "
                         f"slot of {outputs[x.me].numel()}")
    seq = x.next()
    for peer in x.peers():
        x.send(peer, seq, "all_to_all", Staged(inputs[peer]).host)
    mine = _source(inputs[x.me], outputs)
    for r in range(x.size):
        src = mine if r == x.me else x.receive(r, seq, "all_to_all", outputs[r].dtype, outputs[r].numel())
        write(outputs[r], src)
    return completed(list(outputs))


def _splits(x: Exchange, t: torch.Tensor, given: list[int], what: str) -> list[int]:
    if t.dim() == 0:
        raise ValueError(f"all_to_all_single: the {what} tensor needs at least one dimension")
    if not given:
        if t.size(0) % x.size:
            raise ValueError(f"all_to_all_single: Tensor's dim 0 ({t.size(0)}) does not divide equally across "
                             f"group size {x.size}")
        return [t.size(0) // x.size] * x.size
    if len(given) != x.size:
        raise ValueError(f"all_to_all_single: {len(given)} {what} split sizes for a group of {x.size}")
    if sum(given) != t.size(0) or min(given) < 0:
        raise ValueError(f"all_to_all_single: Split sizes doesn't match total dim 0 size ({list(given)} for "
                         f"{t.size(0)})")
    return [int(s) for s in given]


def all_to_all_single(x: Exchange, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                      input_splits: list[int], opts: Any = None) -> dist.Work:
    x.check("all_to_all_single", [output, input])
    x.same_dtype("all_to_all_single", input.dtype, [output])
    ins = _splits(x, input, list(input_splits), "input")
    outs = _splits(x, output, list(output_splits), "output")
    row_in, row_out = math.prod(input.shape[1:]), math.prod(output.shape[1:])
    if ins[x.me] * row_in != outs[x.me] * row_out:
        raise ValueError(f"all_to_all_single: rank {x.me} sends itself {ins[x.me] * row_in} elements into "
                         f"a slot of {outs[x.me] * row_out}")
    seq = x.next()
    flat = _source(input, [output])
    starts = [sum(ins[:j]) * row_in for j in range(x.size)]
    for peer in x.peers():
        x.send(peer, seq, "all_to_all_single", flat[starts[peer]:starts[peer] + ins[peer] * row_in])
    out_flat = output.view(-1)
    at = 0
    for r in range(x.size):
        n = outs[r] * row_out
        src = flat[starts[r]:starts[r] + n] if r == x.me else x.receive(r, seq, "all_to_all_single", output.dtype, n)
        write(out_flat[at:at + n], src)
        at += n
    return completed([output])


def gather(x: Exchange, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
    root = x.rank_arg(opts.rootRank, "gather")
    input = inputs[0]
    x.check("gather", [input])
    seq = x.next()
    if x.me != root:
        if output_lists and output_lists[0]:
            raise ValueError("gather: a rank other than the destination must not pass a gather list")
        x.send(root, seq, "gather", Staged(input).host)
        return completed([])
    if not output_lists:
        raise ValueError("gather: the destination rank needs a gather list")
    outputs = output_lists[0]
    x.per_rank("gather", outputs, "the gather list")
    x.check("gather", outputs)
    x.same_dtype("gather", input.dtype, outputs)
    mine = _source(input, outputs)
    for r in range(x.size):
        if r == x.me:
            if outputs[r].numel() != input.numel():
                raise ValueError(f"gather: the destination's own slot has {outputs[r].numel()} elements, its "
                                 f"input {input.numel()}")
            write(outputs[r], mine)
        else:
            write(outputs[r], x.receive(r, seq, "gather", input.dtype, outputs[r].numel()))
    return completed(list(outputs))


def scatter(x: Exchange, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> dist.Work:
    root = x.rank_arg(opts.rootRank, "scatter")
    output = outputs[0]
    x.check("scatter", [output])
    seq = x.next()
    if x.me == root:
        if not input_lists:
            raise ValueError("scatter: the source rank needs a scatter list")
        inputs = input_lists[0]
        x.per_rank("scatter", inputs, "the scatter list")
        x.check("scatter", inputs)
        x.same_dtype("scatter", output.dtype, inputs)
        for peer in x.peers():
            x.send(peer, seq, "scatter", Staged(inputs[peer]).host)
        if inputs[x.me].numel() != output.numel():
            raise ValueError(f"scatter: the source's own slice has {inputs[x.me].numel()} elements, its output "
                             f"{output.numel()}")
        write(output, Staged(inputs[x.me]).host)
    else:
        if input_lists and input_lists[0]:
            raise ValueError("scatter: a rank other than the source must not pass a scatter list")
        write(output, x.receive(root, seq, "scatter", output.dtype, output.numel()))
    return completed([output])


def barrier(x: Exchange, opts: Any = None) -> dist.Work:
    # NCCL's barrier is an all-reduce the host then waits for: work queued before it has finished.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()
    seq = x.next()
    empty = torch.empty(0, dtype=torch.uint8)
    for peer in x.peers():
        x.send(peer, seq, "barrier", empty)
    for peer in x.peers():
        x.frame(peer, COLLECTIVE, seq, "barrier")
    return completed([])
