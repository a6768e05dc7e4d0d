"""NeMo-RL's gather_logits_at_global_indices: student logits at teacher top-k token ids, vocab-sharded."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "gather_logits_at_indices",
    "category": "rl_vocab",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/distributed/model_utils.py",
        "symbol": "gather_logits_at_global_indices",
    },
    "summary": (
        "Top-k distillation loss input (get_distillation_topk_logprobs_from_logits): the student's logits "
        "are tensor-parallel over the vocabulary, bf16 [batch, seq, vocab/W] on each rank for the slice "
        "[vocab_start_index, vocab_end_index), and the teacher's top-k token ids [batch, seq, k] (global "
        "ids, k = 64) are replicated. Each rank maps the ids into its slice (clamped), gathers the fp32 "
        "logits there, zeroes the ids it does not own and SUM-all-reduces, so every rank returns the same "
        "fp32 [batch, seq, k] student logits at the teacher's ids. Reads k of vocab/W values per row: the "
        "all-reduce of [batch, seq, k] dominates."
    ),
    "dtype": "bfloat16",
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
    batch, seq, vocab, k = shape["batch"], shape["seq"], shape["vocab"], shape["k"]
    part = vocab // world_size
    logits = 2.0 * torch.randn(batch, seq, part, generator=generator, device=device)
    shared = torch.Generator(device=device)  # the teacher's ids are the same on every rank
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    global_indices = torch.randint(0, vocab, (batch, seq, k), generator=shared, device=device)
    return logits.to(torch.bfloat16), global_indices, rank * part, (rank + 1) * part


@torch.no_grad()
def solution(
    vocab_parallel_logits: torch.Tensor,
    global_indices: torch.Tensor,
    vocab_start_index: int,
    vocab_end_index: int,
) -> torch.Tensor:
    local_vocab = vocab_parallel_logits.shape[-1]
    logits = vocab_parallel_logits.float()
    in_range = (global_indices >= vocab_start_index) & (global_indices < vocab_end_index)
    local_indices = (global_indices - vocab_start_index).clamp(min=0, max=local_vocab - 1)
    local_vals = logits.gather(-1, local_indices) * in_range.to(logits.dtype)
    dist.all_reduce(local_vals, op=dist.ReduceOp.SUM)
    return local_vals


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1).double()
    indices = inputs_by_rank[0][1]
    values = full.gather(-1, indices).float()
    return [values for _ in range(world_size)]


def traffic(shape, world_size):
    """Every gathered logit has one owner (the rank holding its vocab slice), so each rank needs only the
    other owners' values: an all-gather, not an all-reduce. Indices are uniform, so a rank owns 1/W of
    them on average. HBM: the indices, the owned logits (not the whole vocab slice) and the output."""
    n = shape["batch"] * shape["seq"] * shape["k"]
    moved = (world_size - 1) / world_size * n * 4  # fp32 values
    return {"send_bytes": moved, "recv_bytes": moved, "hbm_bytes": n * 8 + n / world_size * 2 + n * 4}
