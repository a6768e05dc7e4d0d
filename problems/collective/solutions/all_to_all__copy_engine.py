"""Expert solution: all-to-all with the copy engines over NVLink, ordered by symmetric-memory barriers.

Each rank pushes chunk q of its input straight into slot `rank` of peer q's symmetric buffer with a
device-to-device copy (the copy engine, not the SMs), keeps its own chunk locally, meets its peers at
a barrier, then copies the received slots into its output. Slots are double-buffered by call parity,
so no barrier is needed before the next call pushes again.
"""

import torch
import torch.distributed as dist

from problems._symm import Workspace

_workspace = Workspace()


@torch.no_grad()
def solution(x):
    world, rank = dist.get_world_size(), dist.get_rank()
    assert x.is_contiguous() and x.shape[0] % world == 0
    chunk = x.numel() // world
    nbytes = chunk * x.element_size()
    ws = _workspace.ensure(2 * world * nbytes, x.device)
    parity = ws.next_parity()
    flat = x.view(-1)
    out = torch.empty_like(x)
    out_flat = out.view(-1)
    for step in range(1, world):
        q = (rank + step) % world
        slot = (parity * world + rank) * nbytes
        ws.peer_view(q, chunk, x.dtype, slot).copy_(flat[q * chunk:(q + 1) * chunk])
    out_flat[rank * chunk:(rank + 1) * chunk].copy_(flat[rank * chunk:(rank + 1) * chunk])
    ws.handle.barrier(channel=0)
    for q in range(world):
        if q != rank:
            out_flat[q * chunk:(q + 1) * chunk].copy_(ws.peer_view(rank, chunk, x.dtype, (parity * world + q) * nbytes))
    return out
