"""NeMo-RL weight refit: rank 0 packs mixed-dtype parameters into one uint8 buffer and broadcasts it."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "weight_refit_packed_broadcast",
    "category": "rl_vocab",
    "source": {
        "codebase": "NeMo-RL",
        "path": "nemo_rl/utils/packed_tensor.py",
        "symbol": "packed_broadcast_producer / packed_broadcast_consumer",
    },
    "summary": (
        "Refit of the rollout engine's weights after a training step (NeMo-RL, non-colocated trainer and "
        "vLLM). The trainer rank (rank 0) views each parameter as bytes and concatenates them into one "
        "uint8 bucket (up to ~2% of GPU memory, so this whole list is one bucket), broadcasts it, and "
        "every other rank, which knows the names, shapes and dtypes in advance, receives the bucket into "
        "a buffer of the same size, splits it by byte size and views each piece back as its dtype and "
        "shape. The parameters are those of decoder layers of a Qwen2.5-7B-shaped model: bf16 "
        "projection weights and biases plus fp32 norm weights. Inputs on rank 0 are the new weights; on "
        "other ranks, the stale copies that share their metadata. Every rank returns the received "
        "tensors, equal to rank 0's inputs."
    ),
    "dtype": "bfloat16",
    "shapes": {
        # Qwen2.5-7B decoder layers: hidden 3584, 4 KV heads of 128, FFN 18944; ~466 MB per layer.
        "default": {"layers": 2, "hidden": 3584, "kv": 512, "ffn": 18944},
        "small": {"layers": 2, "hidden": 16, "kv": 8, "ffn": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied bytes, compared exactly
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"layers": 3, "hidden": 24, "kv": 8, "ffn": 32},
        "default": {"layers": 3, "hidden": 5376, "kv": 512, "ffn": 18944},
    },
}


def _layer_params(shape):
    h, kv, f = shape["hidden"], shape["kv"], shape["ffn"]
    bf16, fp32 = torch.bfloat16, torch.float32
    return [
        ((h,), fp32),  # input_layernorm.weight
        ((h, h), bf16),  # q_proj.weight
        ((h,), bf16),  # q_proj.bias
        ((kv, h), bf16),  # k_proj.weight
        ((kv,), bf16),  # k_proj.bias
        ((kv, h), bf16),  # v_proj.weight
        ((kv,), bf16),  # v_proj.bias
        ((h, h), bf16),  # o_proj.weight
        ((h,), fp32),  # post_attention_layernorm.weight
        ((f, h), bf16),  # gate_proj.weight
        ((f, h), bf16),  # up_proj.weight
        ((h, f), bf16),  # down_proj.weight
    ]


def make_inputs(shape, rank, world_size, generator, device):
    params = []
    for _ in range(shape["layers"]):
        for dims, dtype in _layer_params(shape):
            params.append((0.02 * torch.randn(*dims, generator=generator, device=device)).to(dtype))
    return tuple(params)


@torch.no_grad()
def solution(*params: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # Both sides know every parameter's shape and dtype, hence its byte size and offset in the bucket.
    sizes = [p.numel() * p.element_size() for p in params]
    if dist.get_rank() == 0:
        packed = torch.cat([p.contiguous().view(torch.uint8).view(-1) for p in params])
    else:
        packed = torch.empty(sum(sizes), dtype=torch.uint8, device=params[0].device)
    dist.broadcast(packed, src=0)
    # The consumer's post-unpack step copies each piece into its parameter: fresh tensors, not views.
    return tuple(
        piece.view(p.dtype).view(p.shape).clone()
        for piece, p in zip(packed.split(sizes), params, strict=True)
    )


def oracle(shape, world_size, inputs_by_rank):
    source = tuple(p.clone() for p in inputs_by_rank[0])
    return [source for _ in range(world_size)]
