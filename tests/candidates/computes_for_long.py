"""Every rank computes for 200 s (a Python loop of small tensor operations) before it would communicate:
nobody waits on anybody, so the verdict is `timeout` (too slow), not `deadlock`, with every rank's stack."""

import time

import torch
import torch.distributed as dist


def _grind(x: torch.Tensor, seconds: float) -> torch.Tensor:
    acc = x.float()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        acc = torch.sin(acc) * 1.0001 + 0.5
    return acc


def solution(x):
    _grind(x, 200.0)
    out = x.clone()
    dist.all_reduce(out)
    return out
