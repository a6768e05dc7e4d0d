import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    if dist.get_rank() == 1:
        out[0, 0] += 3.0
    return out
