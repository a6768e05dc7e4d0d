"""Disaggregated prefill -> decode: move a request's KV pages between two paged caches by block ids."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "paged_kv_transfer",
    "category": "pipeline",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/distributed/kv_transfer/kv_connector/v1/p2p/p2p_nccl_connector.py",
        "symbol": "P2pNcclConnector.save_kv_layer / start_load_kv (extract_kv_from_layer, inject_kv_into_layer)",
    },
    "summary": (
        "Prefill/decode disaggregation: after a prefill instance has computed a prompt's KV cache, the "
        "pages of one attention layer move to the decode instance. Ranks 0..W/2-1 are prefill workers and "
        "rank p sends to decode rank p + W/2 (the peer with the same TP rank). Every rank holds a paged "
        "KV cache layer in FlashAttention layout [2, num_blocks, block_size, kv_heads, head_dim]; a prefill "
        "rank gathers the request's pages by its block ids (layer[:, block_ids]), sends them, and the "
        "decode rank writes them into its own cache at its own block ids (layer[:, block_ids] = kv). "
        "The number of transferred blocks is random per trial and the same for every pair; block ids "
        "are random and distinct within a rank. Decode ranks return their updated cache (a copy: inputs "
        "stay unchanged); prefill ranks return an empty tensor. Default: one Llama-3-70B layer at TP 1 "
        "(8 KV heads, head dim 128), block size 16: 256-512 blocks (up to 8192 tokens, 32 MiB) moved "
        "into a 1024-block (64 MiB) cache."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"num_blocks": 1024, "block_size": 16, "kv_heads": 8, "head_dim": 128, "max_transfer": 512},
        "small": {"num_blocks": 16, "block_size": 4, "kv_heads": 2, "head_dim": 8, "max_transfer": 8},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"num_blocks": 24, "block_size": 4, "kv_heads": 2, "head_dim": 8, "max_transfer": 8},
        "default": {"num_blocks": 768, "block_size": 16, "kv_heads": 8, "head_dim": 128, "max_transfer": 512},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))  # the bare trial seed is rank 0's own
    m = shape["max_transfer"]
    n = int(torch.randint(m // 2, m + 1, (1,), generator=shared, device=device))
    size = (2, shape["num_blocks"], shape["block_size"], shape["kv_heads"], shape["head_dim"])
    kv_cache = torch.randn(size, generator=generator, device=device).to(torch.bfloat16)
    block_ids = torch.randperm(shape["num_blocks"], generator=generator, device=device)[:n]
    return kv_cache, block_ids


@torch.no_grad()
def solution(kv_cache: torch.Tensor, block_ids: torch.Tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    half = world // 2
    if rank < half:
        pages = kv_cache[:, block_ids].contiguous()
        dist.send(pages, rank + half)
        return kv_cache.new_empty(0)
    pages = kv_cache.new_empty((2, block_ids.numel(), *kv_cache.shape[2:]))
    dist.recv(pages, rank - half)
    out = kv_cache.clone()
    out[:, block_ids] = pages
    return out


def oracle(shape, world_size, inputs_by_rank):
    half = world_size // 2
    out = [inputs_by_rank[r][0].new_empty(0) for r in range(half)]
    for r in range(half, world_size):
        cache, dst_ids = inputs_by_rank[r]
        src_cache, src_ids = inputs_by_rank[r - half]
        expected = cache.clone()
        for src, dst in zip(src_ids.tolist(), dst_ids.tolist()):
            expected[:, dst] = src_cache[:, src]
        out.append(expected)
    return out
