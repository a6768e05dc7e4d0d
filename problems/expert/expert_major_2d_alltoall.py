"""Tutel's 2DH (hierarchical) all-to-all for expert parallelism: inter-node phase, then intra-node phase."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "expert_major_2d_alltoall",
    "category": "expert",
    "source": {
        "codebase": "Tutel",
        "path": "tutel/impls/communicate.py",
        "symbol": "PrimAllToAll2D.forward (all_to_all(..., use_2dh=True))",
    },
    "summary": (
        "Tutel's two-dimensional hierarchical all-to-all (2DH) of the expert-major dispatch buffer "
        "[experts, capacity, hidden] bf16 (experts split evenly over ranks; block j goes to rank j). "
        "Ranks form nodes of local_size consecutive ranks (global rank = node * local_size + local). "
        "Phase 1 is an all-to-all between the ranks with the same local index across nodes, each "
        "sending the blocks bound for a whole node in one message; phase 2 an all-to-all inside the "
        "node; a local transpose then restores source-rank order. The result equals a flat "
        "all_to_all_single: [experts, capacity, hidden] with block s = what rank s sent to this rank. "
        "Few large inter-node messages instead of many small ones is the point at scale; here local_size "
        "= W/2 (two 'nodes'). The reference builds the sub-groups once, lazily, in a module-level cache "
        "keyed by (world size, local_size): every rank calls new_group for every group, intra-node "
        "groups first, then cross-node groups, in the same order (new_group is collective)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"experts": 64, "capacity": 128, "hidden": 4096},  # 64 MiB per rank
        "small": {"experts": 8, "capacity": 4, "hidden": 32},
    },
    "world_sizes": [4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"experts": 8, "capacity": 6, "hidden": 48},
        "default": {"experts": 64, "capacity": 96, "hidden": 3072},
    },
}

_GROUPS: dict = {}


def _groups(world_size: int, local_size: int):
    """(intra-node group, cross-node group) of this rank, created once per layout on every rank."""
    key = (world_size, local_size)
    if key not in _GROUPS:
        num_nodes = world_size // local_size
        intra = [dist.new_group(list(range(n * local_size, (n + 1) * local_size))) for n in range(num_nodes)]
        inter = [dist.new_group(list(range(lr, world_size, local_size))) for lr in range(local_size)]
        rank = dist.get_rank()
        _GROUPS[key] = (intra[rank // local_size], inter[rank % local_size])
    return _GROUPS[key]


def make_inputs(shape, rank, world_size, generator, device):
    x = torch.randn(shape["experts"], shape["capacity"], shape["hidden"], generator=generator, device=device)
    return x.to(torch.bfloat16), world_size // 2


@torch.no_grad()
def solution(x: torch.Tensor, local_size: int):
    world_size = dist.get_world_size()
    num_nodes = world_size // local_size
    intra_group, inter_group = _groups(world_size, local_size)
    blocks = x.reshape(num_nodes, local_size, -1)  # [dest node, dest local, block]
    # phase 1, across nodes: to the peer with my local index on node n, everything bound for node n
    y = torch.empty_like(blocks)
    dist.all_to_all_single(y, blocks.contiguous(), group=inter_group)  # [src node, dest local, block]
    # phase 2, inside the node: to local peer l, everything bound for it from every node
    y = y.transpose(0, 1).contiguous()  # [dest local, src node, block]
    z = torch.empty_like(y)
    dist.all_to_all_single(z, y, group=intra_group)  # [src local, src node, block]
    return z.transpose(0, 1).reshape(x.shape)  # source rank = src node * local_size + src local


def oracle(shape, world_size, inputs_by_rank):
    chunks = [inp[0].chunk(world_size) for inp in inputs_by_rank]
    return [torch.cat([chunks[s][r] for s in range(world_size)]) for r in range(world_size)]


def traffic(shape, world_size):
    """A flat all-to-all moves (W-1)/W of the buffer per rank; the reference's two hops (across nodes,
    then within a node) carry some blocks twice."""
    moved = (world_size - 1) * shape["experts"] * shape["capacity"] * shape["hidden"] * 2 / world_size
    return {"send_bytes": moved, "recv_bytes": moved}
