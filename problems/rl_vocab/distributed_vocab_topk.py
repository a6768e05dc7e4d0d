"""NeMo-RL's distributed_vocab_topk: global top-k (values, token ids) over vocab-sharded fp32 logits."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "distributed_vocab_topk",
    "category": "rl_vocab",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/distributed/model_utils.py",
        "symbol": "distributed_vocab_topk",
    },
    "summary": (
        "Teacher top-k extraction for knowledge distillation (distillation.topk_logits_k = 64): each "
        "tensor-parallel rank holds fp32 logits [batch, seq, vocab/W] for the slice [vocab_start_index, "
        "vocab_end_index). Each rank takes its local top-k, shifts the indices to global token ids, "
        "all-gathers the candidate values and ids ([batch, seq, k] each) and takes the top-k of the W*k "
        "candidates, so every rank returns the same fp32 values [batch, seq, k] (descending) and int64 "
        "global ids. Every row of the global logits holds distinct values, so the answer is unique."
    ),
    "dtype": "float32",
    "shapes": {
        "default": {"batch": 2, "seq": 2048, "vocab": 152064, "k": 64},
        "small": {"batch": 2, "seq": 4, "vocab": 64, "k": 4},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-6, "rtol": 1e-6},  # values are copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 2, "seq": 6, "vocab": 96, "k": 4},
        "default": {"batch": 2, "seq": 1536, "vocab": 114048, "k": 64},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    batch, seq, vocab = shape["batch"], shape["seq"], shape["vocab"]
    part = vocab // world_size
    # Ties would make the top-k order ambiguous. Rank r gets the ranks {p * W + r} for a random local
    # permutation p, so each global row is a permutation of 0..vocab-1; a monotone map turns ranks into
    # distinct, roughly normal logits (std 3).
    perm = torch.rand(batch, seq, part, generator=generator, device=device).argsort(dim=-1)
    u = ((perm * world_size + rank).double() + 0.5) / vocab
    logits = (3.0 * math.sqrt(2.0)) * torch.erfinv(2.0 * u - 1.0)
    return logits.float(), shape["k"], rank * part, (rank + 1) * part


@torch.no_grad()
def solution(
    vocab_parallel_logits: torch.Tensor, k: int, vocab_start_index: int, vocab_end_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    world_size = dist.get_world_size()
    logits = vocab_parallel_logits.float()
    local_vals, local_idx = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
    local_idx = local_idx + vocab_start_index

    gathered_vals = [torch.empty_like(local_vals) for _ in range(world_size)]
    gathered_idx = [torch.empty_like(local_idx) for _ in range(world_size)]
    dist.all_gather(gathered_vals, local_vals)
    dist.all_gather(gathered_idx, local_idx)
    all_vals = torch.cat(gathered_vals, dim=-1)
    all_idx = torch.cat(gathered_idx, dim=-1)

    top_vals, top_pos = torch.topk(all_vals, k, dim=-1)
    return top_vals, all_idx.gather(-1, top_pos)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1).double()
    k = inputs_by_rank[0][1]
    values, indices = torch.topk(full, k, dim=-1, sorted=True)
    return [(values.float(), indices) for _ in range(world_size)]
