from torch.distributed import all_reduce_fast_path  # no such name


def solution(x):
    return all_reduce_fast_path(x)
