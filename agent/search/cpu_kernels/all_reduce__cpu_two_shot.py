"""CPU two-shot all-reduce: every rank copies its input into its slot of a shared mapping; after a barrier,
rank r sums shard r over the W slots (rank order) into the reduced region; after a second barrier every
rank copies the W reduced shards out. Two barriers, but each rank sums only 1/W of the elements."""

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
    shard = (n + world - 1) // world
    per_parity = (world + 1) * world * shard  # W input slots, then the reduced shards
    ws = _workspace(2 * per_parity * x.element_size())
    rank = ws["rank"]
    parity = (ws["epoch"] // 2) % 2  # two barriers per call
    region = ws["raw"][:2 * per_parity * x.element_size()].view(x.dtype).view(2, world + 1, world * shard)
    flat = x.reshape(-1)
    mine = region[parity, rank]
    for i in range(0, n, CHUNK):
        mine[i:min(i + CHUNK, n)].copy_(flat[i:i + CHUNK])
    _arrive_and_wait(ws)
    lo, hi = rank * shard, min(n, (rank + 1) * shard)
    reduced = region[parity, world]
    for i in range(lo, hi, SUM_CHUNK):
        j = min(i + SUM_CHUNK, hi)
        acc = region[parity, 0, i:j].float()
        for s in range(1, world):
            acc += region[parity, s, i:j].float()
        reduced[i:j] = acc.to(x.dtype)
    _arrive_and_wait(ws)
    out = torch.empty(n, dtype=x.dtype)
    for i in range(0, n, CHUNK):
        out[i:i + CHUNK].copy_(reduced[i:min(i + CHUNK, n)])
    return out.view_as(x)
