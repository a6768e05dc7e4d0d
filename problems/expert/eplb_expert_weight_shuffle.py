"""vLLM EPLB rebalancing: move expert weights between ranks from an old to a new physical placement."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "eplb_expert_weight_shuffle",
    "category": "expert",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/distributed/eplb/rebalance_execute.py",
        "symbol": "rearrange_expert_weights_inplace (move_to_buffer + move_from_buffer)",
    },
    "summary": (
        "Expert-parallel load balancing (EPLB) in vLLM: after the balancer picks a new "
        "physical-to-logical expert placement (with redundant replicas of hot experts), every rank must "
        "hold the weights of its new local slots. Inputs: this rank's expert weights [local_slots, "
        "hidden, inter] bf16 for the OLD placement (replicas of a logical expert are identical), and the "
        "old and new placements [W * local_slots] int64 (physical slot -> logical expert; slot p lives "
        "on rank p // local_slots), identical on all ranks. As in vLLM: unchanged slots stay; a slot "
        "whose expert this rank already holds is copied locally; every other expert is received once "
        "per rank from a holder chosen by vLLM's rule (holders and receivers in rank order, receivers "
        "dealt out to holders in contiguous runs, the remainder one each) with batched point-to-point "
        "sends/receives in ascending expert order, then copied to any duplicate slots. Output: the new "
        "local weights [local_slots, hidden, inter] bf16. Default: DeepSeek-V3-like layer with 256 "
        "logical experts at W=8 (288 physical slots: 36 per rank, 4 redundant), one [7168, 2048] "
        "weight per expert, about 1 GiB per rank; the placements are random permutations."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"local_slots": 36, "redundant_per_rank": 4, "hidden": 7168, "inter": 2048},
        "small": {"local_slots": 3, "redundant_per_rank": 1, "hidden": 16, "inter": 8},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"local_slots": 9, "redundant_per_rank": 1, "hidden": 24, "inter": 8},
        "default": {"local_slots": 27, "redundant_per_rank": 4, "hidden": 5376, "inter": 2048},
    },
}


def _placement(num_logical: int, num_physical: int, gen: torch.Generator, device) -> torch.Tensor:
    """Every logical expert at least once, the extra slots replicas of random experts, slots shuffled."""
    extra = torch.randint(0, num_logical, (num_physical - num_logical,), generator=gen, device=device)
    slots = torch.cat([torch.arange(num_logical, device=device), extra])
    return slots[torch.randperm(num_physical, generator=gen, device=device)]


def make_inputs(shape, rank, world_size, generator, device):
    s, h, i = shape["local_slots"], shape["hidden"], shape["inter"]
    num_physical = world_size * s
    num_logical = world_size * (s - shape["redundant_per_rank"])
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    old = _placement(num_logical, num_physical, shared, device)
    new = _placement(num_logical, num_physical, shared, device)
    # a logical expert's weights are the same on every rank that holds it: one stream per logical expert
    weights = torch.empty(s, h, i, dtype=torch.bfloat16, device=device)
    expert_gen = torch.Generator(device=device)
    for slot, logical in enumerate(old[rank * s : (rank + 1) * s].tolist()):
        expert_gen.manual_seed(generator.initial_seed() - rank + (1 << 40) + logical)
        weights[slot] = torch.randn(h, i, generator=expert_gen, device=device).to(torch.bfloat16)
    return weights, old, new


def _holders_and_receivers(expert: int, old: list, new: list, slots: int):
    holders = sorted({p // slots for p, e in enumerate(old) if e == expert})
    receivers = sorted({p // slots for p, e in enumerate(new) if e == expert} - set(holders))
    return holders, receivers


@torch.no_grad()
def solution(expert_weights: torch.Tensor, old_indices: torch.Tensor, new_indices: torch.Tensor):
    rank = dist.get_rank()
    slots = expert_weights.shape[0]
    old, new = old_indices.tolist(), new_indices.tolist()
    old_local, new_local = old[rank * slots : (rank + 1) * slots], new[rank * slots : (rank + 1) * slots]
    out = torch.empty_like(expert_weights)

    ops, received = [], {}
    # sends: each distinct expert held here, to the receivers dealt to this holder
    for expert in sorted(set(old_local)):
        holders, receivers = _holders_and_receivers(expert, old, new, slots)
        if not receivers:
            continue
        per_holder = len(receivers) // len(holders)
        pos = holders.index(rank)
        dsts = receivers[pos * per_holder : (pos + 1) * per_holder]
        if len(holders) * per_holder + pos < len(receivers):
            dsts.append(receivers[len(holders) * per_holder + pos])
        src_row = old_local.index(expert)
        ops += [dist.P2POp(dist.isend, expert_weights[src_row], dst) for dst in dsts]
    # receives: each distinct expert needed here and not held here, from the holder dealt to this rank
    for expert in sorted(set(new_local) - set(old_local)):
        holders, receivers = _holders_and_receivers(expert, old, new, slots)
        per_holder = len(receivers) // len(holders)
        pos = receivers.index(rank)
        start = len(holders) * per_holder
        src = holders[pos // per_holder] if pos < start else holders[pos - start]
        received[expert] = torch.empty_like(expert_weights[0])
        ops.append(dist.P2POp(dist.irecv, received[expert], src))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    for row, expert in enumerate(new_local):
        if expert in old_local:
            out[row] = expert_weights[old_local.index(expert)]
        else:
            out[row] = received[expert]
    return out


def oracle(shape, world_size, inputs_by_rank):
    s = shape["local_slots"]
    old, new = inputs_by_rank[0][1].tolist(), inputs_by_rank[0][2].tolist()
    # any physical copy of a logical expert will do: replicas are identical
    copy_of = {}
    for p, logical in enumerate(old):
        copy_of.setdefault(logical, inputs_by_rank[p // s][0][p % s])
    return [torch.stack([copy_of[new[r * s + j]] for j in range(s)]) for r in range(world_size)]
