"""NeMo-RL context-parallel token log-probs: shift targets across CP shards, score local logits, gather
the log-probs back into natural order."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "nemo_rl_cp_gather_shift",
    "category": "sequence",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/distributed/model_utils.py",
        "symbol": (
            "from_parallel_logits_to_logprobs (_get_tokens_on_this_cp_rank, allgather_cp_sharded_tensor)"
        ),
    },
    "summary": (
        "Policy log-probs in NeMo-RL (GRPO/DPO) with Megatron context parallelism and TP=1: each rank holds "
        "the logits [batch, seq/W, vocab] and input ids [batch, seq/W] of its load-balanced CP shard (chunks "
        "r and 2W-1-r of 2W). Next-token targets cross shard boundaries, so the ids are all-gathered and "
        "un-permuted, rolled left by one, and re-sharded (_get_tokens_on_this_cp_rank); each rank computes "
        "fp32 log_softmax of its logits at the target ids; the per-token log-probs are all-gathered, the "
        "load-balancing permutation undone (AllGatherCPTensor) and the last position dropped. Output: "
        "[batch, seq-1] float32 on every rank. NeMo-RL receives the ids unsharded; here they arrive sharded "
        "like the logits (as Megatron's get_batch_on_this_cp_rank leaves them), which adds one small "
        "all-gather. The TP all-reduces of DistributedLogprob vanish at TP=1."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 1, "seq": 8192, "vocab": 151936},  # Qwen vocab: 1.2 GiB of logits/rank at W=2
        "small": {"batch": 2, "seq": 32, "vocab": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-3, "rtol": 1e-3},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 2, "seq": 48, "vocab": 96},
        "default": {"batch": 1, "seq": 6144, "vocab": 113952},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    b, s_local = shape["batch"], shape["seq"] // world_size
    logits = 3.0 * torch.randn(b, s_local, shape["vocab"], generator=generator, device=device)
    ids = torch.randint(0, shape["vocab"], (b, s_local), generator=generator, device=device)
    return logits.to(torch.bfloat16), ids


def _gather_natural(t: torch.Tensor, world: int) -> torch.Tensor:
    """All-gather a [b, s/W] load-balanced shard along dim 1 and undo the chunk permutation."""
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    halves = [h for p in parts for h in torch.chunk(p, 2, dim=1)]  # chunk ids r, 2W-1-r per rank
    ids = [i for r in range(world) for i in (r, 2 * world - 1 - r)]
    by_id = dict(zip(ids, halves, strict=True))
    return torch.cat([by_id[i] for i in range(2 * world)], dim=1)


@torch.no_grad()
def solution(logits, input_ids):
    world, rank = dist.get_world_size(), dist.get_rank()
    target = _gather_natural(input_ids, world).roll(shifts=-1, dims=-1)
    chunks = torch.chunk(target, 2 * world, dim=1)
    target = torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=1)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    logprobs = torch.gather(logprobs, -1, target.unsqueeze(-1)).squeeze(-1)  # [b, s/W] fp32
    return _gather_natural(logprobs, world)[:, :-1].contiguous()


def oracle(shape, world_size, inputs_by_rank):
    w, s = world_size, shape["seq"]
    c = s // (2 * w)
    logits = torch.empty(shape["batch"], s, shape["vocab"], dtype=torch.float64)
    ids = torch.empty(shape["batch"], s, dtype=torch.long)
    for r, (lg, tk) in enumerate(inputs_by_rank):
        for j, pos in enumerate((r, 2 * w - 1 - r)):
            logits[:, pos * c:(pos + 1) * c] = lg[:, j * c:(j + 1) * c].double()
            ids[:, pos * c:(pos + 1) * c] = tk[:, j * c:(j + 1) * c]
    lp = logits[:, :-1] - torch.logsumexp(logits[:, :-1], dim=-1, keepdim=True)
    out = lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).float()
    return [out.clone() for _ in range(w)]


def traffic(shape, world_size):
    """The shifted targets need one id from the next chunk for each of a rank's two chunks (the first id
    of chunk p+1), not the whole gathered id sequence; the fp32 log-probs are all-gathered, as the output
    is replicated."""
    moved = (world_size - 1) * shape["batch"] * (shape["seq"] // world_size) * 4 + 2 * 8 * shape["batch"]
    return {"send_bytes": moved, "recv_bytes": moved}
