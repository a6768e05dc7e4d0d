"""Host collectives: a torch.distributed backend of the project's own, for ranks that share a GPU (NCCL
refuses them) and for CPU runs (where gloo lacks shapes NCCL accepts). docs/emulation.md, "Collectives".

    from harness.emulation import collectives
    dist.init_process_group(collectives.register(), init_method=..., rank=..., world_size=...)

Every group made afterwards (new_group, new_subgroups, PKB's input generators) is one of these too.
Data moves over loopback sockets between the ranks (links.py says why), CUDA tensors staged through host
memory; the operations, their shapes and their refusals are NCCL's. One job a module:

    group.py       the ProcessGroup torch sees: its identity and the table of operations
    reductions.py  all_reduce, reduce, reduce_scatter        movement.py  broadcast, gathers, all_to_all, barrier
    p2p.py         send, recv                                rules.py     NCCL's dtypes, reductions, the fold
    exchange.py    one group's tensor messages and checks    work.py      the Work objects handed back
    links.py       mailboxes over the connections            frames.py    a frame's bytes, written and read
    mesh.py        the loopback connections' set-up
"""

from __future__ import annotations

import torch.distributed as dist

from harness.emulation.collectives.group import BACKEND, HostProcessGroup, create

__all__ = ["BACKEND", "HostProcessGroup", "register"]


def register() -> str:
    """Make the backend known to torch.distributed (once per process) and return its name. It claims no
    device's default: only a group asked for by this name, or made under a default group of it, uses it."""
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, create, devices=["cpu", "cuda"])
    return BACKEND
