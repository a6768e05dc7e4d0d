"""The host collectives' process group: every torch.distributed operation NCCL serves, with NCCL's
shapes and refusals, for ranks that share a GPU (or run on CPU). Rank side; torch and the standard library.

A Python subclass of torch.distributed.ProcessGroup, as torch's own test suite makes one
(test_c10d_pypg.py): the registered creator returns it and torch uses it as the group itself, so both
torch.distributed's Python functions and the C++ paths that reach a group through its virtual methods
(functional collectives) land here. CUDA tensors are staged through host memory: read on the current
stream (the host waits for it, where NCCL's stream would), moved over links.Links, reduced on the host in
rank order, and written back on the current stream. Exact, and the same code runs on CPU tensors.

Semantics kept from NCCL (and checked against gloo on CPU in tests/harness/emulation/test_host_collectives.py):
- all_gather's list form accepts outputs of different sizes (each the size of that rank's input), the
  tensor form any output shape of W times the input's elements (stacked or concatenated);
- reduce_scatter's list form accepts uneven inputs, the tensor form W times the output's elements;
- all_to_all_single takes dim-0 splits (empty: equal, and dim 0 must divide), all_to_all any sizes;
- reduce writes the root's tensor only; gather and scatter move data to and from the root only;
- send and recv match in order per pair of ranks (tags are ignored, as NCCL ignores them), irecv and
  batch_isend_irecv never block before wait();
- a collective returns once its outputs are written (async_op=True gets a completed Work), which is
  what NCCL's stream order guarantees to any code that uses the outputs after wait();
- errors NCCL raises (dtype, contiguity, sizes, bitwise reductions on CUDA) are raised here too; ranks
  that call different collectives, or the same one with different sizes, get an error naming both.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.emulation.collectives import rules
from harness.emulation.collectives.links import COLLECTIVE, P2P, Frame, Links
from harness.emulation.collectives.work import PendingReceive, completed

BACKEND = "pkbhost"
# torch's stubs give ProcessGroup's methods their Python-facing overloads; a subclass implements the
# methods torch's C++ side calls (allreduce(tensors, opts), ...), so the base is typed as Any here.
_ProcessGroup: Any = dist.ProcessGroup


def _host(t: torch.Tensor) -> torch.Tensor:
    """A flat host copy of `t` (for a CUDA tensor: read on the current stream, the host waits for it)."""
    flat = t.detach().reshape(-1)
    return flat.cpu() if flat.device.type != "cpu" else flat.clone()


def _payload(h: torch.Tensor) -> memoryview:
    if h.numel() == 0:
        return memoryview(b"")
    return memoryview(h.contiguous().view(torch.uint8).numpy())  # type: ignore[arg-type]  # numpy arrays are buffers


def _meta(op: str, h: torch.Tensor) -> dict[str, Any]:
    return {"op": op, "dtype": str(h.dtype), "numel": h.numel()}


def _write(dest: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():
        dest.view(-1).copy_(src)


class HostProcessGroup(_ProcessGroup):  # type: ignore[misc]  # a base typed Any (above)
    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._me, self._size = rank, size
        self._links = Links(store, rank, size, timeout)
        self._lock = threading.Lock()
        self._seq = 0  # collectives issued (the key every rank files a collective's frames under)
        self._ops = 0  # collectives and point-to-point operations: the group's sequence number
        self._sent: Counter[int] = Counter()
        self._posted: Counter[int] = Counter()
        self._name = ""
        self._desc = ""

    # -- identity --------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def _get_sequence_number_for_group(self) -> int:
        """Every operation this group ran here (the harness's collective monitor reads it)."""
        return self._ops

    @property
    def bytes_sent(self) -> int:
        return self._links.bytes_sent

    def abort(self) -> None:
        self._links.close()

    def shutdown(self) -> None:
        self._links.close()

    # -- plumbing ----------------------------------------------------------------------------------
    def _next(self) -> int:
        with self._lock:
            self._seq += 1
            self._ops += 1
            return self._seq

    def _peers(self) -> list[int]:
        return [r for r in range(self._size) if r != self._me]

    def _rank_arg(self, rank: int, what: str) -> int:
        if not 0 <= int(rank) < self._size:
            raise ValueError(f"{what}: rank {rank} is not in a group of {self._size}")
        return int(rank)

    def _send(self, peer: int, seq: int, op: str, h: torch.Tensor) -> None:
        self._links.send(peer, COLLECTIVE, seq, _meta(op, h), _payload(h))

    def _frame(self, peer: int, kind: int, key: int, op: str) -> Frame:
        frame = self._links.take(peer, kind, key, op)
        if frame.meta.get("op") != op:
            raise RuntimeError(f"{op}: rank {peer} called {frame.meta.get('op')} where rank {self._me} called {op} "
                               f"(every rank must call the same collectives in the same order)")
        return frame

    def _tensor(self, frame: Frame, peer: int, op: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A peer's contribution as a flat host tensor, checked against what this rank expects."""
        if frame.meta.get("dtype") != str(dtype):
            raise TypeError(f"{op}: rank {peer} sent {frame.meta.get('dtype')} where rank {self._me} has {dtype}")
        if frame.meta.get("numel") != numel:
            raise ValueError(f"{op}: rank {peer} sent {frame.meta.get('numel')} elements where rank {self._me} "
                             f"expects {numel}")
        if numel == 0:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(frame.payload, dtype=torch.uint8).view(dtype)

    def _receive(self, peer: int, seq: int, op: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        return self._tensor(self._frame(peer, COLLECTIVE, seq, op), peer, op, dtype, numel)

    @staticmethod
    def _same_dtype(op: str, dtype: torch.dtype, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if t.dtype != dtype:
                raise TypeError(f"{op}: output tensor must have the same type as input tensor ({t.dtype} vs {dtype})")

    def _check(self, op: str, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            rules.check_tensor(t, op)

    def _list(self, op: str, tensors: list[torch.Tensor], what: str) -> None:
        if len(tensors) != self._size:
            raise ValueError(f"{op}: {what} must hold one tensor per rank ({self._size}), got {len(tensors)}")

    # -- reductions --------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = rules.op_name(reduce_op)
        self._check("allreduce", tensors)
        for t in tensors:
            rules.check_reduction(name, t.dtype, t.device.type)
        for t in tensors:
            seq = self._next()
            mine = _host(t)
            for peer in self._peers():
                self._send(peer, seq, "allreduce", mine)
            parts = [mine if r == self._me else self._receive(r, seq, "allreduce", t.dtype, t.numel())
                     for r in range(self._size)]
            _write(t, rules.combine(parts, name, reduce_op))
        return completed(list(tensors))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        root = self._rank_arg(opts.rootRank, "reduce")
        name = rules.op_name(opts.reduceOp)
        t = tensors[opts.rootTensor] if len(tensors) > 1 else tensors[0]
        self._check("reduce", [t])
        rules.check_reduction(name, t.dtype, t.device.type)
        seq = self._next()
        mine = _host(t)
        if self._me != root:
            self._send(root, seq, "reduce", mine)
        else:
            parts = [mine if r == self._me else self._receive(r, seq, "reduce", t.dtype, t.numel())
                     for r in range(self._size)]
            _write(t, rules.combine(parts, name, opts.reduceOp))
        return completed([t])

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = rules.op_name(reduce_op)
        for out, inputs in zip(outputs, input_lists):
            self._list("reduce_scatter", inputs, "the input list")
            self._check("reduce_scatter", [out, *inputs])
            self._same_dtype("reduce_scatter", out.dtype, inputs)
            rules.check_reduction(name, out.dtype, out.device.type)
            if inputs[self._me].numel() != out.numel():
                raise ValueError(f"reduce_scatter: rank {self._me}'s input has {inputs[self._me].numel()} elements, "
                                 f"its output {out.numel()}")
            seq = self._next()
            for peer in self._peers():
                self._send(peer, seq, "reduce_scatter", _host(inputs[peer]))
            parts = [_host(inputs[r]) if r == self._me else self._receive(r, seq, "reduce_scatter", out.dtype,
                                                                          out.numel())
                     for r in range(self._size)]
            _write(out, rules.combine(parts, name, reduce_op))
        return completed(list(outputs))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = rules.op_name(reduce_op)
        self._check("reduce_scatter_tensor", [output, input])
        self._same_dtype("reduce_scatter_tensor", input.dtype, [output])
        rules.check_reduction(name, output.dtype, output.device.type)
        n = output.numel()
        if input.numel() != n * self._size:
            raise ValueError(f"reduce_scatter_tensor: input tensor must be the same size as output size times world "
                             f"size ({input.numel()} vs {n} x {self._size})")
        seq = self._next()
        flat = _host(input)
        for peer in self._peers():
            self._send(peer, seq, "reduce_scatter_tensor", flat[peer * n:(peer + 1) * n])
        parts = [flat[r * n:(r + 1) * n] if r == self._me else
                 self._receive(r, seq, "reduce_scatter_tensor", output.dtype, n) for r in range(self._size)]
        _write(output, rules.combine(parts, name, reduce_op))
        return completed([output])

    _reduce_scatter_base = reduce_scatter_single  # the name before torch 2.13

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        for output, input in zip(outputs, inputs):
            self.reduce_scatter_single(output, input, opts)
        return completed(list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- data movement -----------------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        root = self._rank_arg(opts.rootRank, "broadcast")
        t = tensors[opts.rootTensor] if len(tensors) > 1 else tensors[0]
        self._check("broadcast", [t])
        seq = self._next()
        if self._me == root:
            mine = _host(t)
            for peer in self._peers():
                self._send(peer, seq, "broadcast", mine)
        else:
            _write(t, self._receive(root, seq, "broadcast", t.dtype, t.numel()))
        return completed([t])

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        for outputs, input in zip(output_lists, inputs):
            self._list("allgather", outputs, "the output list")
            self._check("allgather", [input, *outputs])
            self._same_dtype("allgather", input.dtype, outputs)
            if outputs[self._me].numel() != input.numel():
                raise ValueError(f"allgather: rank {self._me}'s output slot has {outputs[self._me].numel()} elements, "
                                 f"its input {input.numel()}")
            seq = self._next()
            mine = _host(input)
            for peer in self._peers():
                self._send(peer, seq, "allgather", mine)
            for r in range(self._size):
                src = mine if r == self._me else self._receive(r, seq, "allgather", input.dtype, outputs[r].numel())
                _write(outputs[r], src)
        return completed([t for outputs in output_lists for t in outputs])

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> dist.Work:
        return self.allgather(output_lists, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        self._check("all_gather_into_tensor", [output, input])
        self._same_dtype("all_gather_into_tensor", input.dtype, [output])
        n = input.numel()
        if output.numel() != n * self._size:
            raise ValueError(f"all_gather_into_tensor: output tensor size must be equal to world_size times input "
                             f"tensor size ({output.numel()} vs {self._size} x {n})")
        seq = self._next()
        mine = _host(input)
        for peer in self._peers():
            self._send(peer, seq, "all_gather_into_tensor", mine)
        flat = output.view(-1)
        for r in range(self._size):
            src = mine if r == self._me else self._receive(r, seq, "all_gather_into_tensor", input.dtype, n)
            _write(flat[r * n:(r + 1) * n], src)
        return completed([output])

    _allgather_base = all_gather_single  # the name before torch 2.13

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        for output, input in zip(outputs, inputs):
            self.all_gather_single(output, input, opts)
        return completed(list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._list("all_to_all", outputs, "the output list")
        self._list("all_to_all", inputs, "the input list")
        self._check("all_to_all", [*outputs, *inputs])
        for out, inp in zip(outputs, inputs):
            self._same_dtype("all_to_all", inp.dtype, [out])
        if outputs[self._me].numel() != inputs[self._me].numel():
            raise ValueError(f"all_to_all: rank {self._me} sends itself {inputs[self._me].numel()} elements into a "
                             f"slot of {outputs[self._me].numel()}")
        seq = self._next()
        for peer in self._peers():
            self._send(peer, seq, "all_to_all", _host(inputs[peer]))
        for r in range(self._size):
            src = _host(inputs[r]) if r == self._me else self._receive(r, seq, "all_to_all", outputs[r].dtype,
                                                                       outputs[r].numel())
            _write(outputs[r], src)
        return completed(list(outputs))

    def _splits(self, t: torch.Tensor, given: list[int], what: str) -> list[int]:
        if t.dim() == 0:
            raise ValueError(f"all_to_all_single: the {what} tensor needs at least one dimension")
        if not given:
            if t.size(0) % self._size:
                raise ValueError(f"all_to_all_single: Tensor's dim 0 ({t.size(0)}) does not divide equally across "
                                 f"group size {self._size}")
            return [t.size(0) // self._size] * self._size
        if len(given) != self._size:
            raise ValueError(f"all_to_all_single: {len(given)} {what} split sizes for a group of {self._size}")
        if sum(given) != t.size(0) or min(given) < 0:
            raise ValueError(f"all_to_all_single: Split sizes doesn't match total dim 0 size ({list(given)} for "
                             f"{t.size(0)})")
        return [int(s) for s in given]

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> dist.Work:
        self._check("all_to_all_single", [output, input])
        self._same_dtype("all_to_all_single", input.dtype, [output])
        ins = self._splits(input, list(input_splits), "input")
        outs = self._splits(output, list(output_splits), "output")
        row_in, row_out = math.prod(input.shape[1:]), math.prod(output.shape[1:])
        if ins[self._me] * row_in != outs[self._me] * row_out:
            raise ValueError(f"all_to_all_single: rank {self._me} sends itself {ins[self._me] * row_in} elements into "
                             f"a slot of {outs[self._me] * row_out}")
        seq = self._next()
        flat = _host(input)
        starts = [sum(ins[:j]) * row_in for j in range(self._size)]
        for peer in self._peers():
            self._send(peer, seq, "all_to_all_single", flat[starts[peer]:starts[peer] + ins[peer] * row_in])
        out_flat = output.view(-1)
        at = 0
        for r in range(self._size):
            n = outs[r] * row_out
            src = flat[starts[r]:starts[r] + n] if r == self._me else \
                self._receive(r, seq, "all_to_all_single", output.dtype, n)
            _write(out_flat[at:at + n], src)
            at += n
        return completed([output])

    alltoall_base = all_to_all_single  # the name before torch 2.13

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        root = self._rank_arg(opts.rootRank, "gather")
        input = inputs[0]
        self._check("gather", [input])
        seq = self._next()
        mine = _host(input)
        if self._me != root:
            if output_lists and output_lists[0]:
                raise ValueError("gather: a rank other than the destination must not pass a gather list")
            self._send(root, seq, "gather", mine)
            return completed([])
        if not output_lists:
            raise ValueError("gather: the destination rank needs a gather list")
        outputs = output_lists[0]
        self._list("gather", outputs, "the gather list")
        self._check("gather", outputs)
        self._same_dtype("gather", input.dtype, outputs)
        for r in range(self._size):
            if r == self._me:
                if outputs[r].numel() != input.numel():
                    raise ValueError(f"gather: the destination's own slot has {outputs[r].numel()} elements, its "
                                     f"input {input.numel()}")
                _write(outputs[r], mine)
            else:
                _write(outputs[r], self._receive(r, seq, "gather", input.dtype, outputs[r].numel()))
        return completed(list(outputs))

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        root = self._rank_arg(opts.rootRank, "scatter")
        output = outputs[0]
        self._check("scatter", [output])
        seq = self._next()
        if self._me == root:
            if not input_lists:
                raise ValueError("scatter: the source rank needs a scatter list")
            inputs = input_lists[0]
            self._list("scatter", inputs, "the scatter list")
            self._check("scatter", inputs)
            self._same_dtype("scatter", output.dtype, inputs)
            for peer in self._peers():
                self._send(peer, seq, "scatter", _host(inputs[peer]))
            if inputs[self._me].numel() != output.numel():
                raise ValueError(f"scatter: the source's own slice has {inputs[self._me].numel()} elements, its output "
                                 f"{output.numel()}")
            _write(output, _host(inputs[self._me]))
        else:
            if input_lists and input_lists[0]:
                raise ValueError("scatter: a rank other than the source must not pass a scatter list")
            _write(output, self._receive(root, seq, "scatter", output.dtype, output.numel()))
        return completed([output])

    def barrier(self, opts: Any = None) -> dist.Work:
        # NCCL's barrier is an all-reduce the host then waits for: work queued before it has finished.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()
        seq = self._next()
        empty = torch.empty(0, dtype=torch.uint8)
        for peer in self._peers():
            self._send(peer, seq, "barrier", empty)
        for peer in self._peers():
            self._frame(peer, COLLECTIVE, seq, "barrier")
        return completed([])

    # -- point to point ----------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        dst = self._rank_arg(dst, "send")
        if dst == self._me:
            raise ValueError("send: a rank cannot send to itself")
        t = tensors[0]
        self._check("send", [t])
        with self._lock:
            self._sent[dst] += 1
            self._ops += 1
            key = self._sent[dst]
        h = _host(t)
        self._links.send(dst, P2P, key, _meta("p2p", h), _payload(h))
        return completed([t])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        src = self._rank_arg(src, "recv")
        if src == self._me:
            raise ValueError("recv: a rank cannot receive from itself")
        t = tensors[0]
        self._check("recv", [t])
        with self._lock:
            self._posted[src] += 1
            self._ops += 1
            key = self._posted[src]

        def finish() -> None:
            frame = self._frame(src, P2P, key, "p2p")
            _write(t, self._tensor(frame, src, "recv", t.dtype, t.numel()))

        return PendingReceive(finish, [t])

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        raise RuntimeError("recv without a source rank is not supported (NCCL has no receive from any source)")


# Every collective shows in a profile as a named range ("pkbhost:allgather"): torch's profiler records no
# c10d operator for a backend written in Python, and harness.measure.profiling finds communication by these names.
_ENTRIES = ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_single",
             "reduce_scatter_single_coalesced", "broadcast", "allgather", "allgather_coalesced", "all_gather_single",
             "all_gather_single_coalesced", "alltoall", "all_to_all_single", "gather", "scatter", "barrier", "send",
             "recv", "recv_anysource")


def _entry(name: str, method: Any) -> Any:
    """An operation as torch calls it: named in profiles, its host work on one torch thread.

    Why one thread: the staging copies and reductions are small, and torch's intra-op pool (as many threads
    as cores, in every rank) oversubscribes the cores the ranks share. Measured on the 2-core CPU machine
    (benchmarks/host_collectives.py): all_reduce of 256 KiB took 29 ms with the default pool and 0.8 ms on
    one thread. The caller's setting is put back before the operation returns."""
    @functools.wraps(method)
    def call(self: HostProcessGroup, *args: Any, **kwargs: Any) -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.profiler.record_function(f"{BACKEND}:{name}"):
                return method(self, *args, **kwargs)
        finally:
            torch.set_num_threads(threads)
    return call


for _name in _ENTRIES:
    setattr(HostProcessGroup, _name, _entry(_name, getattr(HostProcessGroup, _name)))


def create(store: Any, rank: int, size: int, timeout: timedelta) -> HostProcessGroup:
    """torch.distributed's creator for the backend (Backend.register_backend)."""
    return HostProcessGroup(store, rank, size, timeout)
