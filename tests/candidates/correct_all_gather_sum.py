"""Correct, PyTorch-only alternative: all-gather every rank's tensor, then sum in fp32."""

import torch
import torch.distributed as dist


def solution(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.stack([p.float() for p in parts]).sum(0).to(x.dtype)
