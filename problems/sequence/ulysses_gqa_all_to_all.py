"""Ulysses (DeepSpeed ALST) q/k/v all-to-all for GQA models, replicating KV heads when there are fewer
KV heads than ranks."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "ulysses_gqa_all_to_all",
    "category": "sequence",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/runtime/sequence_parallel/ulysses_sp.py",
        "symbol": "UlyssesSPAttentionHF._combine_local_sequences",
    },
    "summary": (
        "Arctic Long Sequence Training's Ulysses layer for Hugging Face GQA models: q [seq/W, batch, heads, "
        "head_dim] and k, v [seq/W, batch, kv_heads, head_dim] are made head-sharded over the full sequence "
        "by a dim-0 all-to-all each. When kv_heads < W, every KV head is first repeat_interleave'd "
        "W/kv_heads times so each rank receives exactly the one KV head its query heads use (e.g. Qwen3 "
        "with 4 KV heads at SP=8). Outputs q [seq, batch, heads/W, head_dim] and k, v [seq, batch, "
        "max(1, kv_heads/W), head_dim]. A kernel can send each KV head to its W/kv_heads consumers without "
        "materializing the replicas."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"seq": 32768, "batch": 1, "heads": 32, "kv_heads": 4, "head_dim": 128},  # Qwen3-30B-A3B
        "small": {"seq": 32, "batch": 2, "heads": 8, "kv_heads": 2, "head_dim": 16},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # a permutation: bit-exact
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"seq": 48, "batch": 2, "heads": 8, "kv_heads": 2, "head_dim": 16},
        "default": {"seq": 24576, "batch": 1, "heads": 32, "kv_heads": 4, "head_dim": 128},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    s, b, d = shape["seq"] // world_size, shape["batch"], shape["head_dim"]
    q = torch.randn(s, b, shape["heads"], d, generator=generator, device=device)
    k = torch.randn(s, b, shape["kv_heads"], d, generator=generator, device=device)
    v = torch.randn(s, b, shape["kv_heads"], d, generator=generator, device=device)
    return tuple(t.to(torch.bfloat16) for t in (q, k, v))


def _combine(x: torch.Tensor, world: int, local_heads: int) -> torch.Tensor:
    s_local, b, _, d = x.shape
    # [s/W, b, W*hl, d] -> [W, s/W, b, hl, d]; slot i goes to rank i
    send = x.reshape(s_local, b, world, local_heads, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.reshape(world * s_local, b, local_heads, d)


@torch.no_grad()
def solution(q, k, v):
    world = dist.get_world_size()
    kv_heads = k.shape[2]
    replication = world // kv_heads
    if replication > 1:
        k, v = k.repeat_interleave(replication, dim=2), v.repeat_interleave(replication, dim=2)
        local_kv = 1
    else:
        local_kv = kv_heads // world
    return _combine(q, world, q.shape[2] // world), _combine(k, world, local_kv), _combine(v, world, local_kv)


def oracle(shape, world_size, inputs_by_rank):
    w, h, hkv = world_size, shape["heads"], shape["kv_heads"]
    q, k, v = (torch.cat([inputs[i] for inputs in inputs_by_rank], dim=0) for i in range(3))
    outs = []
    for r in range(w):
        qr = q[:, :, r * h // w:(r + 1) * h // w]
        # the KV heads used by query heads r*h/W .. (r+1)*h/W - 1
        first, last = (r * h // w) // (h // hkv), ((r + 1) * h // w - 1) // (h // hkv)
        kv = slice(first, last + 1)
        outs.append((qr.clone(), k[:, :, kv].clone(), v[:, :, kv].clone()))
    return outs
