"""KV-cache re-layout from a TP=W prefill (heads split) to DP-attention decode (requests split)."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "kv_split_concat_tp_layout",
    "category": "pipeline",
    "source": {
        "codebase": "SGLang",
        "path": "python/sglang/srt/disaggregation/mooncake/conn.py",
        "symbol": "MooncakeKVManager.send_kvcache_slice",
    },
    "summary": (
        "Prefill/decode disaggregation with different parallel layouts. The prefill instance runs "
        "attention with TP = W, so rank i holds KV heads [i*H/W, (i+1)*H/W) of every page of the batch; "
        "the decode instance runs data-parallel attention (attention TP = 1), so decode rank j serves "
        "the requests whose pages are [j*P/W, (j+1)*P/W) and needs all H heads of them. This is SGLang's "
        "send_kvcache_slice in the prefill_tp > decode_tp case: each prefill rank writes its head slice "
        "into the destination pages at head offset i*H/W. Here the W GPUs play both roles, so the "
        "transfer is one all-to-all: split the local pages by destination, concatenate the received "
        "head groups. Input: kv [2, P, page_size, H/W, head_dim] (K and V of one layer). Output: "
        "[2, P/W, page_size, H, head_dim]. Default: one Llama-3-70B layer (8 KV heads, head dim 128), "
        "2048 pages of 16 tokens (32k tokens) across the batch."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"pages": 2048, "page_size": 16, "kv_heads": 8, "head_dim": 128},
        "small": {"pages": 16, "page_size": 4, "kv_heads": 8, "head_dim": 8},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"pages": 24, "page_size": 4, "kv_heads": 8, "head_dim": 8},
        "default": {"pages": 1536, "page_size": 16, "kv_heads": 8, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    size = (2, shape["pages"], shape["page_size"], shape["kv_heads"] // world_size, shape["head_dim"])
    return (torch.randn(size, generator=generator, device=device).to(torch.bfloat16),)


@torch.no_grad()
def solution(kv: torch.Tensor):
    world = dist.get_world_size()
    two, pages, page_size, heads, dim = kv.shape
    send = kv.reshape(two, world, pages // world, page_size, heads, dim).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)  # [source rank = head group, 2, pages/W, page_size, heads, dim]
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 3, 0, 4, 5).reshape(two, pages // world, page_size, world * heads, dim)


def oracle(shape, world_size, inputs_by_rank):
    full = torch.cat([inp[0] for inp in inputs_by_rank], dim=3)  # [2, P, page_size, H, head_dim]
    return [chunk.clone() for chunk in full.chunk(world_size, dim=1)]
