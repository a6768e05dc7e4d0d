"""NeMo-RL's all_to_all_vp2sq: vocab-sharded logits [tokens, vocab/W] -> token-sharded [tokens/W, vocab]."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "vocab_seq_all_to_all",
    "category": "rl_vocab",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/distributed/model_utils.py",
        "symbol": "all_to_all_vp2sq",
    },
    "summary": (
        "Re-layout before sequence-local top-k/top-p filtering in NeMo-RL's log-prob path "
        "(DistributedLogprobWithSampling): each tensor-parallel rank holds logits [batch*seq, vocab/W] "
        "for its contiguous vocab slice, and afterwards rank r holds all the vocabulary for its block of "
        "batch*seq/W tokens, [batch*seq/W, vocab]. The reference is one all_to_all_single of the "
        "flattened shard (the block of tokens bound for rank j is contiguous in the [tokens, vocab/W] "
        "layout) followed by a local reorder of the received [W, tokens/W, vocab/W] pieces into "
        "[tokens/W, W * vocab/W]. Pure data movement, (W-1)/W of the shard crosses the interconnect."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "vocab": 152064},
        "small": {"tokens": 8, "vocab": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "vocab": 96},
        "default": {"tokens": 3072, "vocab": 114048},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    tokens, vocab = shape["tokens"], shape["vocab"]
    logits = 2.0 * torch.randn(tokens, vocab // world_size, generator=generator, device=device)
    return (logits.to(torch.bfloat16),)


@torch.no_grad()
def solution(vocab_parallel_logits: torch.Tensor) -> torch.Tensor:
    world_size = dist.get_world_size()
    tokens, local_vocab = vocab_parallel_logits.shape
    local_tokens = tokens // world_size
    received = torch.empty_like(vocab_parallel_logits.reshape(-1))
    dist.all_to_all_single(received, vocab_parallel_logits.contiguous().reshape(-1))
    # "(w t v) -> t (w v)": rank j's vocab slice lands at columns [j * v, (j + 1) * v).
    received = received.view(world_size, local_tokens, local_vocab).permute(1, 0, 2)
    return received.reshape(local_tokens, world_size * local_vocab)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1)  # [tokens, vocab]
    return list(full.chunk(world_size, dim=0))
