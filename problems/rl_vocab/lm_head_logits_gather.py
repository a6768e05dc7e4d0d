"""vLLM's LogitsProcessor._gather_logits: all-gather vocab-sharded logits into the full [tokens, vocab]."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "lm_head_logits_gather",
    "category": "rl_vocab",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/model_executor/layers/logits_processor.py",
        "symbol": "LogitsProcessor._gather_logits",
    },
    "summary": (
        "After vLLM's tensor-parallel LM head (VocabParallelEmbedding), each rank holds bf16 logits "
        "[tokens, vocab/W] for its contiguous vocab slice; the sampler needs the full [tokens, vocab]. "
        "vLLM V1 takes the all-gather path (Platform.use_all_gather() is true under V1; the gather-to-"
        "rank-0 path is the V0 fallback): tensor_model_parallel_all_gather(logits, dim=-1), which "
        "all-gathers the shards concatenated along dim 0 into [W * tokens, vocab/W] and reorders them to "
        "[tokens, W * vocab/W]. Every rank returns the full logits. Pure data movement: tokens x vocab x "
        "(W-1)/W x 2 bytes received per rank, plus the reorder. Default: a 4096-row batch (a large "
        "rollout step or prompt-logprob pass); 'decode': 256 sequences."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "vocab": 152064},
        "decode": {"tokens": 256, "vocab": 152064},
        "small": {"tokens": 8, "vocab": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 12, "vocab": 96},
        "default": {"tokens": 3072, "vocab": 114048},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    tokens, vocab = shape["tokens"], shape["vocab"]
    logits = 2.0 * torch.randn(tokens, vocab // world_size, generator=generator, device=device)
    return (logits.to(torch.bfloat16),)


@torch.no_grad()
def solution(logits: torch.Tensor) -> torch.Tensor:
    world_size = dist.get_world_size()
    tokens, local_vocab = logits.shape
    gathered = torch.empty((world_size * tokens, local_vocab), dtype=logits.dtype, device=logits.device)
    dist.all_gather_into_tensor(gathered, logits.contiguous())
    # [W, tokens, vocab/W] -> [tokens, W, vocab/W] -> [tokens, vocab]
    gathered = gathered.view(world_size, tokens, local_vocab).movedim(0, 1)
    return gathered.reshape(tokens, world_size * local_vocab)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1)
    return [full for _ in range(world_size)]
