"""Host collectives: a torch.distributed backend of the project's own, for ranks that share a GPU (NCCL
refuses them) and for CPU runs (where gloo lacks shapes NCCL accepts). docs/emulation.md, "Collectives".

    from harness.emulation import collectives
    dist.init_process_group(collectives.register(), init_method=..., rank=..., world_size=...)

Every group made afterwards (new_group, new_subgroups, PKB's input generators) is one of these too.
Data moves over loopback sockets between the ranks (links.py says why), CUDA tensors staged through host
memory; the operations, their shapes and their refusals are NCCL's (group.py, rules.py).
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
