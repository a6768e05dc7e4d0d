"""DeepSpeed GShard top-2 gating with capacity: dispatch mask, einsum dispatch, all-to-all to experts."""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ZIPF = 0.15  # skew of the per-expert routing preference: ~7% of the (token, choice) pairs overflow

PROBLEM = {
    "name": "gshard_capacity_alltoall",
    "category": "expert",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/moe/sharded_moe.py",
        "symbol": "top2gating + MOELayer.forward (einsum 'sec,sm->ecm', _AllToAll)",
    },
    "summary": (
        "DeepSpeed-MoE's GShard path (drop_tokens=True, top2_2nd_expert_sampling=False): from the gate "
        "logits [tokens, experts] fp32, top2gating takes each token's best expert and second-best "
        "expert, gives every (token, choice) a slot in its expert's buffer by a cumulative count in "
        "token order (second choices after all first choices), and drops those at or beyond the "
        "capacity ceil(tokens / experts * 2 * capacity_factor) (at least min_capacity). The dispatch "
        "mask [tokens, experts, capacity] routes the bf16 tokens [tokens, hidden] into "
        "[experts, capacity, hidden] (einsum 'sec,sm->ecm'; empty slots are zero), and an all_to_all_single "
        "over dim 0 hands each rank the [W, local_experts, capacity, hidden] buffers of its experts "
        "(chunk w from rank w). capacity_factor 1.25 (1.0 in the small shape) with skewed routing, so "
        "about 7% of the (token, choice) pairs are dropped at the default size. Output: the received "
        "buffer [W, local_experts, capacity, hidden] bf16."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {
            "tokens": 4096, "hidden": 4096, "experts": 64, "capacity_factor": 1.25, "min_capacity": 4,
        },
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "capacity_factor": 1.0, "min_capacity": 4},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # each slot holds one token or zero: copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "capacity_factor": 1.0, "min_capacity": 4},
        "default": {"tokens": 3072, "hidden": 3072, "experts": 64, "capacity_factor": 1.25, "min_capacity": 4},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e = shape["tokens"], shape["hidden"], shape["experts"]
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    logits = torch.randn(t, e, generator=generator, device=device) + bias
    x = torch.randn(t, h, generator=generator, device=device).to(torch.bfloat16)
    return x, logits, shape["capacity_factor"], shape["min_capacity"]


def _top2_dispatch_mask(logits: torch.Tensor, capacity_factor: float, min_capacity: int) -> torch.Tensor:
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    mask1 = F.one_hot(torch.argmax(gates, dim=1), num_classes=num_experts)
    logits_except1 = logits.masked_fill(mask1.bool(), float("-inf"))
    mask2 = F.one_hot(torch.argmax(logits_except1, dim=1), num_classes=num_experts)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1
    locations2 += torch.sum(mask1, dim=0, keepdim=True)
    capacity = max(math.ceil((num_tokens / num_experts) * (capacity_factor * 2)), min_capacity)  # _capacity
    mask1 = mask1 * torch.lt(locations1, capacity)
    mask2 = mask2 * torch.lt(locations2, capacity)
    locations1_s = torch.sum(locations1 * mask1, dim=1)
    locations2_s = torch.sum(locations2 * mask2, dim=1)
    mask1_float, mask2_float = mask1.float(), mask2.float()
    gates1_s = torch.einsum("se,se->s", gates, mask1_float)
    gates2_s = torch.einsum("se,se->s", gates, mask2_float)
    denom_s = torch.clamp(gates1_s + gates2_s, min=torch.finfo(gates.dtype).eps)
    gates1 = torch.einsum("s,se->se", gates1_s / denom_s, mask1_float)
    gates2 = torch.einsum("s,se->se", gates2_s / denom_s, mask2_float)
    locations1_sc = F.one_hot(locations1_s, num_classes=capacity).float()
    locations2_sc = F.one_hot(locations2_s, num_classes=capacity).float()
    combine_weights = torch.einsum("se,sc->sec", gates1, locations1_sc) + torch.einsum(
        "se,sc->sec", gates2, locations2_sc
    )
    return combine_weights.bool()


@torch.no_grad()
def solution(x: torch.Tensor, logits: torch.Tensor, capacity_factor: float, min_capacity: int):
    world_size = dist.get_world_size()
    dispatch_mask = _top2_dispatch_mask(logits, capacity_factor, min_capacity)
    dispatched = torch.einsum("sec,sm->ecm", dispatch_mask.type_as(x), x).contiguous()
    output = torch.empty_like(dispatched)
    dist.all_to_all_single(output, dispatched)
    num_experts, capacity, hidden = dispatched.shape
    return output.reshape(world_size, num_experts // world_size, capacity, hidden)


def oracle(shape, world_size, inputs_by_rank):
    t, h, e = shape["tokens"], shape["hidden"], shape["experts"]
    num_local = e // world_size
    capacity = max(math.ceil(t / e * shape["capacity_factor"] * 2), shape["min_capacity"])
    buffers = []
    for x, logits, _, _ in inputs_by_rank:
        buf = torch.zeros(e, capacity, h, dtype=torch.bfloat16)
        order = logits.argsort(dim=1, descending=True)
        first, second = order[:, 0].tolist(), order[:, 1].tolist()
        fill = [0] * e
        for tok in range(t):  # first choices claim slots in token order
            if fill[first[tok]] < capacity:
                buf[first[tok], fill[first[tok]]] = x[tok]
            fill[first[tok]] += 1  # a dropped first choice still counts ahead of the second choices
        for tok in range(t):
            if fill[second[tok]] < capacity:
                buf[second[tok], fill[second[tok]]] = x[tok]
            fill[second[tok]] += 1
        buffers.append(buf)
    return [
        torch.stack([buffers[s][r * num_local : (r + 1) * num_local] for s in range(world_size)])
        for r in range(world_size)
    ]


def traffic(shape, world_size):
    """Only filled capacity slots need to travel, plus one bit per slot saying which; the empty slots are
    zeros the receiver can write itself. Filled slots of an expert = min(tokens with it in their top 2,
    capacity), averaged over 8 routing draws distributed like make_inputs'. The dispatch is a copy: no
    matrix FLOPs (the reference's one-hot einsum counts as a matmul)."""
    t, h, e = shape["tokens"], shape["hidden"], shape["experts"]
    capacity = max(math.ceil((t / e) * (shape["capacity_factor"] * 2)), shape["min_capacity"])
    gen = torch.Generator().manual_seed(0)
    draws, filled = 8, 0.0
    for _ in range(draws):
        bias = -ZIPF * torch.log1p(torch.randperm(e, generator=gen).float())
        top2 = (torch.randn(t, e, generator=gen) + bias).topk(2, dim=-1).indices
        filled += torch.bincount(top2.reshape(-1), minlength=e).clamp(max=capacity).sum().item() / draws
    moved = (world_size - 1) / world_size * (filled * h * 2 + e * capacity / 8)
    return {"send_bytes": moved, "recv_bytes": moved, "flops": 0}
