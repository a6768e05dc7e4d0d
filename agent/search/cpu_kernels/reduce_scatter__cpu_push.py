"""CPU reduce-scatter, pushing: rank r copies row block q of its input into inbox q (slot r) of a shared
mapping, so each inbox holds exactly what its owner sums; after one epoch barrier every rank sums the W
entries of its own inbox in rank order."""

import os
import secrets
import time

import torch
import torch.distributed as dist

CHUNK = 8  # tunable: 8, 16, 32, 64, 128, 256, 512, 1024
SUM_CHUNK = 8  # tunable: 8, 16, 32, 64, 128, 256, 512, 1024
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
    shard = n // world
    ws = _workspace(2 * world * n * x.element_size())
    rank = ws["rank"]
    parity = ws["epoch"] % 2
    inbox = ws["raw"][:2 * world * n * x.element_size()].view(x.dtype).view(2, world, world, shard)
    flat = x.reshape(world, shard)
    for q in range(world):
        for i in range(0, shard, CHUNK):
            inbox[parity, q, rank, i:i + CHUNK].copy_(flat[q, i:i + CHUNK])
    _arrive_and_wait(ws)
    out = torch.empty(shard, dtype=x.dtype)
    for i in range(0, shard, SUM_CHUNK):
        acc = inbox[parity, rank, 0, i:i + SUM_CHUNK].float()
        for s in range(1, world):
            acc += inbox[parity, rank, s, i:i + SUM_CHUNK].float()
        out[i:i + SUM_CHUNK] = acc.to(x.dtype)
    return out.view(x.shape[0] // world, *x.shape[1:])
