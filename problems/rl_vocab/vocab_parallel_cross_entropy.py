"""Megatron's vocab-parallel cross-entropy forward: per-token loss from vocab-sharded bf16 logits."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "vocab_parallel_cross_entropy",
    "category": "rl_vocab",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/tensor_parallel/cross_entropy.py",
        "symbol": "_VocabParallelCrossEntropy.forward",
    },
    "summary": (
        "The LM loss of a tensor-parallel model: the output layer is column-parallel over the vocabulary, "
        "so each rank holds logits [seq, batch, vocab/W] for its contiguous vocab slice, and the targets "
        "(the same on every rank) are global token ids. Each rank upcasts its shard to fp32, all-reduces "
        "(MAX) the per-token row max, picks the target logit where the target falls in its slice (zero "
        "elsewhere) and sums exp(logit - max) over its slice; both are SUM-all-reduced, and the fp32 loss "
        "log(sum_exp) - target_logit is the same on every rank. Three small all-reduces of [tokens] around "
        "a full read of the logits shard; no label smoothing."
    ),
    "dtype": "bfloat16",
    "shapes": {
        # Qwen2.5 vocabulary (152064, divisible by 8), 4096 tokens per micro-batch.
        "default": {"seq": 4096, "batch": 1, "vocab": 152064},
        "small": {"seq": 4, "batch": 2, "vocab": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-3, "rtol": 1e-3},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"seq": 6, "batch": 2, "vocab": 96},
        "default": {"seq": 3072, "batch": 1, "vocab": 114048},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    seq, batch, vocab = shape["seq"], shape["batch"], shape["vocab"]
    logits = 2.0 * torch.randn(seq, batch, vocab // world_size, generator=generator, device=device)
    # Targets are replicated across the tensor-parallel group: draw them from a generator all ranks share.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    target = torch.randint(0, vocab, (seq, batch), generator=shared, device=device)
    return logits.to(torch.bfloat16), target


@torch.no_grad()
def solution(vocab_parallel_logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    logits = vocab_parallel_logits.float()  # a new fp32 tensor: the in-place ops below leave the input alone
    logits_max = logits.max(dim=-1)[0]
    dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)

    partition = logits.shape[-1]
    vocab_start = dist.get_rank() * partition
    vocab_end = vocab_start + partition

    logits.sub_(logits_max.unsqueeze(-1))
    target_mask = (target < vocab_start) | (target >= vocab_end)
    masked_target = (target - vocab_start).masked_fill(target_mask, 0)
    predicted_logits = logits.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1)
    predicted_logits.masked_fill_(target_mask, 0.0)
    sum_exp_logits = logits.exp_().sum(dim=-1)

    dist.all_reduce(predicted_logits, op=dist.ReduceOp.SUM)
    dist.all_reduce(sum_exp_logits, op=dist.ReduceOp.SUM)
    return torch.log(sum_exp_logits) - predicted_logits


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1).double()
    target = inputs_by_rank[0][1]
    loss = torch.logsumexp(full, dim=-1) - full.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return [loss.float() for _ in range(world_size)]


def traffic(shape, world_size):
    """Per token: one all-reduce of the (max, sum of exp) pair (8 bytes; the online-softmax merge is
    associative) and the target's logit, which has one owner (an all-gather, 4 bytes). The reference
    all-reduces all three."""
    tokens = shape["seq"] * shape["batch"]
    moved = tokens * (2 * (world_size - 1) / world_size * 8 + (world_size - 1) / world_size * 4)
    return {"send_bytes": moved, "recv_bytes": moved}
