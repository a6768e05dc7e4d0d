"""Correct, and on CPU faster than the reference's gloo all-reduce: the quickstart's fast sample (README).

The ranks share one file in /dev/shm that each maps (torch.from_file, MAP_SHARED) on the first call and that
rank 0 unlinks once all have it: the CPU stand-in for symmetric memory. Each call, a rank copies its input into
its slot (two sets of slots, by call parity, so a fast rank never overwrites what a slow one still reads), raises
its epoch flag, waits for every peer's, and sums the W slots in rank order: every rank gets bitwise the same
sum. After the first call no torch.distributed call is made, so its speedup counts; on CPU that speedup proves
the plumbing, not what a GPU kernel would do. (agent/search/cpu_kernels/ holds the search's slower first drafts
of the same idea, with tunables.)
"""

import os
import secrets
import time

import torch
import torch.distributed as dist

POLL_S = 1e-05  # how long a rank waiting for its peers sleeps between looks at their flags
_mapped: dict[str, object] = {}


def _mapping(nbytes):
    """(data bytes, one int64 flag per rank on its own 64-byte line), made on the first call."""
    if not _mapped:
        rank, world = dist.get_rank(), dist.get_world_size()
        name = [f"pkb-quickstart-{secrets.token_hex(8)}" if rank == 0 else None]
        dist.broadcast_object_list(name, src=0)
        path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", str(name[0]))
        raw = torch.from_file(path, shared=True, size=nbytes + 64 * world, dtype=torch.uint8)
        dist.barrier()  # every rank has it mapped: the name can go
        if rank == 0:
            os.unlink(path)
        raw[nbytes + 64 * rank:nbytes + 64 * (rank + 1)].zero_()
        dist.barrier()
        _mapped.update(data=raw[:nbytes], flags=raw[nbytes:].view(torch.int64)[::8], epoch=0)
    return _mapped


@torch.no_grad()
def solution(x):
    rank, world, n = dist.get_rank(), dist.get_world_size(), x.numel()
    shared = _mapping(2 * world * n * x.element_size())
    shared["epoch"] += 1
    epoch = shared["epoch"]
    slots = shared["data"].view(x.dtype).view(2, world, n)[epoch % 2]
    slots[rank].copy_(x.reshape(-1))
    flags = shared["flags"]
    flags[rank] = epoch
    while int(flags.min()) < epoch:
        time.sleep(POLL_S)
    return slots.float().sum(dim=0).to(x.dtype).view_as(x)
