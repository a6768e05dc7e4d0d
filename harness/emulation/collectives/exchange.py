"""One group's messages of host tensors: sequence numbers, frames checked against what this rank expects,
and the argument checks every operation shares. Rank side; torch and the standard library.

The operations (reductions.py, movement.py, p2p.py) are written against an Exchange; the group
(group.py) hands them its own. Host staging: a CPU tensor is sent from its own memory and reduced into in
place; a CUDA tensor is read on the current stream (the host waits for it, where NCCL's stream would) into
host memory, and its result is written back on that stream (`Staged`).
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import torch

from harness.emulation.collectives import rules
from harness.emulation.collectives.frames import Frame
from harness.emulation.collectives.links import COLLECTIVE, Links


def _alloc(n: int) -> memoryview:
    """A payload's buffer: uninitialised memory (a bytearray would be zero-filled first, a whole extra
    pass over a 16 MiB message)."""
    return memoryview(torch.empty(n, dtype=torch.uint8).numpy())  # type: ignore[arg-type]  # numpy arrays are buffers


def payload(h: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor, without a copy."""
    if h.numel() == 0:
        return memoryview(b"")
    return memoryview(h.view(torch.uint8).numpy())  # type: ignore[arg-type]  # numpy arrays are buffers


class Staged:
    """A tensor's flat host side. On CPU it is the tensor itself (reads and writes go straight to it); on CUDA a
    host copy (`read=True`: of the tensor's current contents) that `commit` writes back on the current stream."""

    def __init__(self, t: torch.Tensor, read: bool = True) -> None:
        self._t = t
        flat = t if t.dim() == 1 else t.reshape(-1)
        if flat.requires_grad:  # detached only where it matters: detach() is a tenth of a small call's host time
            flat = flat.detach()
        if flat.device.type == "cpu":
            self.host = flat
        else:
            self.host = flat.cpu() if read else torch.empty(flat.numel(), dtype=flat.dtype)

    def commit(self) -> None:
        if self._t.device.type != "cpu":
            with torch.no_grad():
                self._t.view(-1).copy_(self.host)


def write(dest: torch.Tensor, src: torch.Tensor) -> None:
    flat = dest if dest.dim() == 1 else dest.view(-1)
    if flat.requires_grad or src.requires_grad:  # no autograd record; no_grad only where one could be made
        with torch.no_grad():
            flat.copy_(src)
    else:
        flat.copy_(src)


class Exchange:
    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        self.me, self.size = rank, size
        self.links = Links(store, rank, size, timeout, alloc=_alloc)
        self._lock = threading.Lock()
        self._seq = 0  # collectives issued (the key every rank files a collective's frames under)
        self.ops = 0  # collectives and point-to-point operations: the group's sequence number
        self._sent: Counter[int] = Counter()
        self._posted: Counter[int] = Counter()

    def next(self) -> int:
        """A new collective's key."""
        with self._lock:
            self._seq += 1
            self.ops += 1
            return self._seq

    def p2p_key(self, peer: int, sending: bool) -> int:
        """The count of point-to-point messages to (or from) `peer` so far, this one included."""
        with self._lock:
            counter = self._sent if sending else self._posted
            counter[peer] += 1
            self.ops += 1
            return counter[peer]

    def peers(self) -> list[int]:
        return [r for r in range(self.size) if r != self.me]

    def rank_arg(self, rank: int, what: str) -> int:
        if not 0 <= int(rank) < self.size:
            raise ValueError(f"{what}: rank {rank} is not in a group of {self.size}")
        return int(rank)

    # -- messages --------------------------------------------------------------------------------------
    def send(self, peer: int, seq: int, op: str, h: torch.Tensor, kind: int = COLLECTIVE,
             numel: int | None = None) -> None:
        """`h` to `peer`, labelled with the operation, the dtype and an element count: h's own, or `numel`
        where `h` is a piece of a larger call (the count every rank must agree on)."""
        count = h.numel() if numel is None else numel
        self.links.send(peer, kind, seq, {"op": op, "dtype": str(h.dtype), "numel": count}, payload(h))

    def frame(self, peer: int, kind: int, key: int, op: str) -> Frame:
        frame = self.links.take(peer, kind, key, op)
        if frame.meta.get("op") != op:
            raise RuntimeError(f"{op}: rank {peer} called {frame.meta.get('op')} where rank {self.me} called {op} "
                               f"(every rank must call the same collectives in the same order)")
        return frame

    def tensor(self, frame: Frame, peer: int, op: str, dtype: torch.dtype, numel: int,
               piece: int | None = None) -> torch.Tensor:
        """A peer's contribution as a flat host tensor (no copy: a view of the frame's payload), checked
        against what this rank expects: the call's element count `numel`, and `piece` elements of payload
        where the frame carries a piece of the call."""
        if frame.meta.get("dtype") != str(dtype):
            raise TypeError(f"{op}: rank {peer} sent {frame.meta.get('dtype')} where rank {self.me} has {dtype}")
        if frame.meta.get("numel") != numel:
            raise ValueError(f"{op}: rank {peer} sent {frame.meta.get('numel')} elements where rank {self.me} "
                             f"expects {numel}")
        count = numel if piece is None else piece
        if frame.payload.nbytes != count * dtype.itemsize:
            raise ValueError(f"{op}: rank {peer} sent {frame.payload.nbytes} bytes where rank {self.me} expects "
                             f"{count} elements of {dtype}")
        if count == 0:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(frame.payload, dtype=torch.uint8).view(dtype)

    def receive(self, peer: int, seq: int, op: str, dtype: torch.dtype, numel: int, kind: int = COLLECTIVE,
                piece: int | None = None) -> torch.Tensor:
        return self.tensor(self.frame(peer, kind, seq, op), peer, op, dtype, numel, piece)

    # -- argument checks -------------------------------------------------------------------------------
    @staticmethod
    def same_dtype(op: str, dtype: torch.dtype, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if t.dtype != dtype:
                raise TypeError(f"{op}: output tensor must have the same type as input tensor ({t.dtype} vs {dtype})")

    @staticmethod
    def check(op: str, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            rules.check_tensor(t, op)

    def per_rank(self, op: str, tensors: list[torch.Tensor], what: str) -> None:
        if len(tensors) != self.size:
            raise ValueError(f"{op}: {what} must hold one tensor per rank ({self.size}), got {len(tensors)}")
