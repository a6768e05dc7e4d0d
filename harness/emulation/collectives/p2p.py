"""Point-to-point operations of the host collectives: send, recv (posted, finished on wait), and the
refused receive from any source. Rank side; torch and the standard library.

Messages between two ranks match in order, one count per direction (tags are ignored, as NCCL ignores
them). A send returns once the kernel holds its bytes (the peer's draining thread takes them whatever the
peer does); a receive never blocks before wait(), so batch_isend_irecv's posting order cannot deadlock.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.emulation.collectives.exchange import Exchange, Staged, write
from harness.emulation.collectives.links import P2P
from harness.emulation.collectives.work import PendingReceive, completed


def send(x: Exchange, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
    dst = x.rank_arg(dst, "send")
    if dst == x.me:
        raise ValueError("send: a rank cannot send to itself")
    t = tensors[0]
    x.check("send", [t])
    x.send(dst, x.p2p_key(dst, sending=True), "p2p", Staged(t).host, kind=P2P)
    return completed([t])


def recv(x: Exchange, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
    src = x.rank_arg(src, "recv")
    if src == x.me:
        raise ValueError("recv: a rank cannot receive from itself")
    t = tensors[0]
    x.check("recv", [t])
    key = x.p2p_key(src, sending=False)

    def finish() -> None:
        frame = x.frame(src, P2P, key, "p2p")
        write(t, x.tensor(frame, src, "recv", t.dtype, t.numel()))

    return PendingReceive(finish, [t])


def recv_anysource(x: Exchange, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
    raise RuntimeError("recv without a source rank is not supported (NCCL has no receive from any source)")
