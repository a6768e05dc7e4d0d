"""NeMo-RL's ChunkedDistributedLogprob forward: target log-probs from vocab-sharded logits, seq-chunked."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "chunked_log_prob",
    "category": "rl_vocab",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/distributed/model_utils.py",
        "symbol": "ChunkedDistributedLogprob.forward",
    },
    "summary": (
        "The memory-bounded variant of NeMo-RL's vocab-parallel log-prob (policy.logprob_chunk_size): "
        "each rank holds bf16 logits [batch, seq, vocab/W] for the slice [vocab_start_index, "
        "vocab_end_index) and replicated target ids [batch, seq]. The sequence is cut into chunks of "
        "chunk_size positions (the last one shorter); each chunk is cast to fp32 on its own, gets a "
        "distributed log-softmax (MAX- then SUM-all-reduce over the group), the in-slice target log-probs "
        "are gathered and SUM-all-reduced. The result is the same fp32 [batch, seq] on every rank; a fused "
        "kernel need not chunk, only give the same log-probs."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 2, "seq": 2048, "vocab": 152064, "chunk_size": 512},
        "small": {"batch": 2, "seq": 4, "vocab": 64, "chunk_size": 3},  # chunks of 3 and 1
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-3, "rtol": 1e-3},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 2, "seq": 6, "vocab": 96, "chunk_size": 3},
        "default": {"batch": 2, "seq": 1536, "vocab": 114048, "chunk_size": 512},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    batch, seq, vocab = shape["batch"], shape["seq"], shape["vocab"]
    part = vocab // world_size
    logits = 2.0 * torch.randn(batch, seq, part, generator=generator, device=device)
    shared = torch.Generator(device=device)  # targets are the same on every rank
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    target = torch.randint(0, vocab, (batch, seq), generator=shared, device=device)
    return logits.to(torch.bfloat16), target, rank * part, (rank + 1) * part, shape["chunk_size"]


@torch.no_grad()
def solution(
    vocab_parallel_logits: torch.Tensor,
    target: torch.Tensor,
    vocab_start_index: int,
    vocab_end_index: int,
    chunk_size: int,
) -> torch.Tensor:
    target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
    masked_target = (target - vocab_start_index).masked_fill(target_mask, 0)

    seq = vocab_parallel_logits.shape[1]
    chunks = []
    for start in range(0, seq, chunk_size):
        end = min(seq, start + chunk_size)
        # The fp32 copy is made per chunk, so the whole fp32 logits tensor never exists at once.
        logits = vocab_parallel_logits[:, start:end, :].float()
        logits_max = logits.amax(dim=-1, keepdim=True)
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
        logits = logits - logits_max
        sum_exp_logits = logits.exp().sum(dim=-1, keepdim=True)
        dist.all_reduce(sum_exp_logits, op=dist.ReduceOp.SUM)
        log_probs = logits - sum_exp_logits.log()

        log_probs = log_probs.gather(-1, masked_target[:, start:end].unsqueeze(-1)).squeeze(-1)
        log_probs.masked_fill_(target_mask[:, start:end], 0.0)
        dist.all_reduce(log_probs, op=dist.ReduceOp.SUM)
        chunks.append(log_probs)
    return torch.cat(chunks, dim=1)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1).double()
    target = inputs_by_rank[0][1]
    target_logit = full.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    log_probs = target_logit - torch.logsumexp(full, dim=-1)
    return [log_probs.float() for _ in range(world_size)]


def traffic(shape, world_size):
    """Per token: one all-reduce of the (max, sum of exp) pair (8 bytes; the online-softmax merge is
    associative) and the target's logit, which has one owner (an all-gather, 4 bytes). The reference
    all-reduces all three."""
    tokens = shape["batch"] * shape["seq"]
    moved = tokens * (2 * (world_size - 1) / world_size * 8 + (world_size - 1) / world_size * 4)
    return {"send_bytes": moved, "recv_bytes": moved}
