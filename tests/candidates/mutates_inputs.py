import torch.distributed as dist


def solution(x):
    dist.all_reduce(x)  # in place on the caller's tensor
    return x.clone()
