import torch.distributed as dist


def solution(x):
    if dist.get_rank() == 1:
        raise ValueError("rank one lost its buffer")
    out = x.clone()
    dist.all_reduce(out)
    return out
