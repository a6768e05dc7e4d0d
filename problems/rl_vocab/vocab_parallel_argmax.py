"""vLLM's vocab-parallel greedy argmax: global argmax token ids from vocab-sharded logits, no gather."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "vocab_parallel_argmax",
    "category": "rl_vocab",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/model_executor/layers/logits_processor.py",
        "symbol": "LogitsProcessor.get_top_tokens",
    },
    "summary": (
        "Greedy decoding with a tensor-parallel LM head: each rank holds bf16 logits [tokens, vocab/W] "
        "for its contiguous vocab slice. Instead of all-gathering the logits, each rank takes its local "
        "max and argmax, turns the argmax into a global token id, all-gathers the (value, id) pairs as "
        "fp32 [tokens, 2] and picks the pair with the largest value, so every rank returns the same int64 "
        "[tokens] token ids (NeMo-RL's vocab_parallel_argmax does the same through a distributed top-1). "
        "bf16 logits tie often over a 152k vocabulary: ties go to the lowest global id (first index "
        "within a rank, lowest rank across ranks). The default shape is a large rollout batch or a "
        "training-side argmax over a 4096-token micro-batch; 'decode' is a 128-sequence decode step."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "vocab": 152064},
        "decode": {"tokens": 128, "vocab": 152064},
        "small": {"tokens": 8, "vocab": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # integer output, compared exactly
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
    # argmax returns the first maximal index, which makes the tie-break deterministic.
    local_idx = logits.argmax(dim=-1)
    local_val = logits.gather(-1, local_idx.unsqueeze(-1)).squeeze(-1)
    global_idx = local_idx + dist.get_rank() * local_vocab

    # fp32 holds every token id of a 152k vocabulary exactly.
    pair = torch.stack([local_val.float(), global_idx.float()], dim=-1)  # [tokens, 2]
    gathered = torch.empty((world_size * tokens, 2), dtype=pair.dtype, device=pair.device)
    dist.all_gather_into_tensor(gathered, pair)
    gathered = gathered.view(world_size, tokens, 2)
    best_rank = gathered[:, :, 0].argmax(dim=0, keepdim=True)  # [1, tokens]
    return gathered[:, :, 1].gather(0, best_rank).squeeze(0).to(torch.int64)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inputs[0] for inputs in inputs_by_rank], dim=-1).double()
    top = full.max(dim=-1, keepdim=True).values
    # The lowest global id among the maximal entries.
    ids = torch.arange(full.shape[-1], device=full.device).expand_as(full)
    best = torch.where(full == top, ids, full.shape[-1]).min(dim=-1).values
    return [best for _ in range(world_size)]
