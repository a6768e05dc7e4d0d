"""CPU all-gather, gathering by concatenation: every rank copies its slice into its slot of a shared mapping
(CHUNK elements at a time), meets the others at one epoch barrier, then concatenates views of the W slots
into a fresh output with one torch.cat."""

import os
import secrets
import time

import torch
import torch.distributed as dist

CHUNK = 8  # tunable: 8, 16, 32, 64, 128, 256, 512, 1024
POLL_S = 0.001  # tunable: 0.003, 0.001, 0.0003, 0.0001, 3e-05, 1e-05, 0.0

_state: dict[str, dict] = {}


def _workspace(nbytes):
    """The shared mapping (data, then one 64-byte flag line per rank), made on the first call."""
    ws = _state.get("ws")
    if ws is not None:
        return ws
    rank, world = dist.get_rank(), dist.get_world_size()
    name = [f"pkb-cpu-symm-{secrets.token_hex(8)}" if rank == 0 else None]
    dist.broadcast_object_list(name, src=0)
    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", str(name[0]))
    try:
        raw = torch.from_file(path, shared=True, size=nbytes + 64 * world, dtype=torch.uint8)
        dist.barrier()
    finally:
        if rank == 0 and os.path.exists(path):
            os.unlink(path)  # mapped by every rank now: nothing is left behind
    raw[nbytes + 64 * rank:nbytes + 64 * (rank + 1)].zero_()
    dist.barrier()
    ws = {"raw": raw, "flags": raw[nbytes:].view(torch.int64)[::8], "epoch": 0, "rank": rank, "world": world}
    _state["ws"] = ws
    return ws


def _arrive_and_wait(ws):
    ws["epoch"] += 1
    ws["flags"][ws["rank"]] = ws["epoch"]
    while int(ws["flags"].min()) < ws["epoch"]:
        if POLL_S:
            time.sleep(POLL_S)


@torch.no_grad()
def solution(x):
    world = dist.get_world_size()
    n = x.numel()
    ws = _workspace(2 * world * n * x.element_size())
    parity = ws["epoch"] % 2
    slots = ws["raw"][:2 * world * n * x.element_size()].view(x.dtype).view(2, world, n)
    flat = x.reshape(-1)
    mine = slots[parity, ws["rank"]]
    for i in range(0, n, CHUNK):
        mine[i:i + CHUNK].copy_(flat[i:i + CHUNK])
    _arrive_and_wait(ws)
    parts = [slots[parity, s].view_as(x) for s in range(world)]
    return torch.cat(parts, dim=0)
