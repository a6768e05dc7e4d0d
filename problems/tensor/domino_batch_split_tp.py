"""DeepSpeed Domino: the batch split in two, each half's row-parallel GEMM all-reduced behind the other."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "domino_batch_split_tp",
    "category": "tensor",
    "source": {
        "codebase": "DeepSpeed",
        "path": "deepspeed/runtime/domino/transformer.py",
        "symbol": "DominoTransformerLayer.forward",
    },
    "summary": (
        "DeepSpeed Domino hides tensor-parallel communication by splitting the batch into two "
        "independent halves that flow through the layer as separate tensors: in the MLP of "
        "DominoTransformerLayer, half 0's row-parallel output GEMM (output0 @ weight_r^T) is "
        "all-reduced asynchronously while half 1's GEMM runs, then half 1 is all-reduced and both are "
        "waited on. Each TP rank holds the two MLP intermediates [seq, batch/2, ffn/W] (Megatron's "
        "[s, b, h] layout) and its weight shard [hidden, ffn/W]; it returns the two all-reduced halves "
        "(out0, out1), each [seq, batch/2, hidden], as the layer does. Shapes: Llama-70B MLP "
        "down-projection, 2048 x 4 tokens."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"seq": 2048, "batch": 4, "hidden": 8192, "ffn": 28672},
        "small": {"seq": 8, "batch": 2, "hidden": 32, "ffn": 64},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"seq": 12, "batch": 2, "hidden": 48, "ffn": 64},
        "default": {"seq": 1536, "batch": 4, "hidden": 6144, "ffn": 28672},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    k, half = shape["ffn"] // world_size, shape["batch"] // 2
    x0 = torch.randn(shape["seq"], half, k, generator=generator, device=device)
    x1 = torch.randn(shape["seq"], half, k, generator=generator, device=device)
    w = torch.randn(shape["hidden"], k, generator=generator, device=device) / math.sqrt(shape["ffn"])
    return x0.to(torch.bfloat16), x1.to(torch.bfloat16), w.to(torch.bfloat16)


@torch.no_grad()
def solution(x0, x1, w):
    out0 = torch.matmul(x0, w.t())
    handle0 = dist.all_reduce(out0, op=dist.ReduceOp.SUM, async_op=True)
    out1 = torch.matmul(x1, w.t())
    dist.all_reduce(out1, op=dist.ReduceOp.SUM)
    handle0.wait()
    return out0, out1


def oracle(shape, world_size, inputs_by_rank):
    w_full = torch.cat([inp[2].double() for inp in inputs_by_rank], dim=-1)  # [hidden, ffn]
    outs = []
    for i in range(2):
        x_full = torch.cat([inp[i].double() for inp in inputs_by_rank], dim=-1)  # [seq, batch/2, ffn]
        outs.append(torch.einsum("sbf,hf->sbh", x_full, w_full).to(torch.bfloat16))
    return [tuple(outs) for _ in range(world_size)]
