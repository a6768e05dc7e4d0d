"""GNN feature fetch: each rank requests remote node features, owners answer via all-to-all."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "gnn_feature_all_to_all",
    "category": "other",
    "source": {
        "codebase": "DGL (GraphBolt cooperative minibatching)",
        "path": "python/dgl/graphbolt/impl/cooperative_conv.py",
        "symbol": "CooperativeConvFunction.forward (after SubgraphSampler._seeds_cooperative_exchange_1..4)",
    },
    "summary": (
        "Multi-GPU GNN minibatching with node features partitioned across GPUs: rank r owns the features "
        "of global nodes r*N..(r+1)*N-1 ([N, F]). A sampled minibatch needs the features of a list of "
        "input nodes spread over all partitions. As in DGL GraphBolt's cooperative minibatching, the "
        "requester sorts its ids by owner, the ranks exchange request counts (all-to-all), then the ids "
        "(all_to_all_single with those splits); each owner gathers the rows it was asked for and sends "
        "them back (all_to_all_single with the reverse splits), and the requester restores its request "
        "order. Inputs: this rank's feature partition [N, F] and its requested global ids (int64, "
        "distinct, random order; the count is random per rank). Output: the requested rows [R, F] in "
        "request order. Default: 1M nodes x 128 features (bf16) per rank, 128K-256K requests (an "
        "ogbn-papers100M-like 3-layer sampled minibatch)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"nodes": 1 << 20, "features": 128, "max_requests": 1 << 18},
        "small": {"nodes": 64, "features": 16, "max_requests": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"nodes": 96, "features": 24, "max_requests": 32},
        "default": {"nodes": 786432, "features": 96, "max_requests": 262144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    n, m = shape["nodes"], shape["max_requests"]
    features = torch.randn(n, shape["features"], generator=generator, device=device).to(torch.bfloat16)
    count = int(torch.randint(m // 2, m + 1, (1,), generator=generator, device=device))
    requested = torch.randperm(world_size * n, generator=generator, device=device)[:count]
    return features, requested


@torch.no_grad()
def solution(features: torch.Tensor, requested: torch.Tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    n = features.shape[0]
    owner = requested // n
    order = torch.argsort(owner, stable=True)
    send_ids = requested[order]
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    asked = torch.empty(sum(recv_splits), dtype=requested.dtype, device=requested.device)
    dist.all_to_all_single(asked, send_ids, recv_splits, send_splits)
    answer = features[asked - rank * n]
    fetched = features.new_empty((requested.numel(), features.shape[1]))
    dist.all_to_all_single(fetched, answer, send_splits, recv_splits)
    out = torch.empty_like(fetched)
    out[order] = fetched
    return out


def oracle(shape, world_size, inputs_by_rank):
    table = torch.cat([inp[0] for inp in inputs_by_rank])
    return [table[requested].clone() for _, requested in inputs_by_rank]


def traffic(shape, world_size):
    """HBM: only the requested rows of the feature table are read, not the whole table. A rank requests
    3/4 max_requests ids on average (uniform on max/2..max) and, the ids being uniform over all nodes,
    answers as many: its ids and the ids it is asked (int64), the rows it answers and the rows it gets."""
    requests = 3 * shape["max_requests"] / 4
    return {"hbm_bytes": requests * (8 + 8 + 4 * shape["features"])}  # two bf16 rows per request
