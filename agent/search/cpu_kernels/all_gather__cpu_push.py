"""CPU all-gather: every rank copies its slice into its slot of a shared mapping, meets the others at one
epoch barrier, then copies the W slots into its output in rank order, CHUNK elements at a time."""

import os
import secrets
import time

import torch
import torch.distributed as dist

CHUNK = 8  # tunable: 8, 16, 32, 64, 128, 256, 512, 1024
COPY_CHUNK = 8  # tunable: 8, 16, 32, 64, 128, 256, 512, 1024
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
    out = x.new_empty(world * x.shape[0], *x.shape[1:])
    out_flat = out.view(world, n)
    for s in range(world):
        for i in range(0, n, COPY_CHUNK):
            out_flat[s, i:i + COPY_CHUNK].copy_(slots[parity, s, i:i + COPY_CHUNK])
    return out
