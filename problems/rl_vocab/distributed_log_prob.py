"""NeMo-RL's DistributedLogprob forward: log-probability of each target token from vocab-sharded logits."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "distributed_log_prob",
    "category": "rl_vocab",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/distributed/model_utils.py",
        "symbol": "DistributedLogprob.forward",
    },
    "summary": (
        "The policy/reference log-prob step of RL training (GRPO, PPO, DPO) with a tensor-parallel LM "
        "head: each rank holds bf16 logits [batch, seq, vocab/W] for the vocab slice "
        "[vocab_start_index, vocab_end_index), the target ids [batch, seq] are replicated. Each rank casts "
        "to fp32 and computes a distributed log-softmax (MAX-all-reduce of the row max, SUM-all-reduce of "
        "the sum of exp), gathers log p(target) where the target lies in its slice (zero elsewhere) and "
        "SUM-all-reduces the result, so every rank returns the same fp32 [batch, seq] log-probs."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 2, "seq": 2048, "vocab": 152064},
        "small": {"batch": 2, "seq": 4, "vocab": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-3, "rtol": 1e-3},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 2, "seq": 6, "vocab": 96},
        "default": {"batch": 2, "seq": 1536, "vocab": 114048},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    batch, seq, vocab = shape["batch"], shape["seq"], shape["vocab"]
    part = vocab // world_size
    logits = 2.0 * torch.randn(batch, seq, part, generator=generator, device=device)
    shared = torch.Generator(device=device)  # targets are the same on every rank
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    target = torch.randint(0, vocab, (batch, seq), generator=shared, device=device)
    return logits.to(torch.bfloat16), target, rank * part, (rank + 1) * part


@torch.no_grad()
def solution(
    vocab_parallel_logits: torch.Tensor, target: torch.Tensor, vocab_start_index: int, vocab_end_index: int
) -> torch.Tensor:
    target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
    masked_target = (target - vocab_start_index).masked_fill(target_mask, 0)

    logits = vocab_parallel_logits.float()
    logits_max = logits.amax(dim=-1, keepdim=True)
    dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
    logits = logits - logits_max
    sum_exp_logits = logits.exp().sum(dim=-1, keepdim=True)
    dist.all_reduce(sum_exp_logits, op=dist.ReduceOp.SUM)
    log_probs = logits - sum_exp_logits.log()

    log_probs = log_probs.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1)
    log_probs.masked_fill_(target_mask, 0.0)
    dist.all_reduce(log_probs, op=dist.ReduceOp.SUM)
    return log_probs


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1).double()
    target = inputs_by_rank[0][1]
    log_probs = torch.log_softmax(full, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return [log_probs.float() for _ in range(world_size)]


def traffic(shape, world_size):
    """Per token: one all-reduce of the (max, sum of exp) pair (8 bytes; the online-softmax merge is
    associative) and the target's logit, which has one owner (an all-gather, 4 bytes). The reference
    all-reduces all three."""
    tokens = shape["batch"] * shape["seq"]
    moved = tokens * (2 * (world_size - 1) / world_size * 8 + (world_size - 1) / world_size * 4)
    return {"send_bytes": moved, "recv_bytes": moved}
